"""The kernel module behind ``tilescale.barrier()``: one warp that runs ``T.barrier_all``. The runtime calls
the module's host function ``tilescale_module_barrier(stream, complete_puts)`` (every distributed module has
it: ops.cuh), which launches the same bounded barrier as a one-thread kernel.

The module is built from :func:`barrier_module` by the runtime (:meth:`tilescale.runtime.Runtime.barrier`),
and as a ``@tilescale.jit`` function by :func:`tilescale.compiler.barrier_jit` (prebuild compiles it ahead):
the same PrimFunc, so the same entry in tilelang's kernel cache."""
from __future__ import annotations

from .. import language as T


def barrier_module(world_size: int):
    """The PrimFunc of the barrier module (the same for every world size)."""

    @T.prim_func
    def tilescale_barrier(flag: T.Tensor((1,), "int32")):
        with T.Kernel(1, threads=32):
            T.barrier_all(scope="warp")
            flag[0] = 1   # (a kernel needs a parameter it uses; the runtime never launches this one)

    return tilescale_barrier
