"""Inductor's micro-pipeline TP pass on tilescale: :func:`use_for_inductor_async_tp`.

With ``torch._inductor.config._micro_pipeline_tp`` on, Inductor rewrites an all-gather followed by matmuls, and a
matmul followed by a reduce-scatter (``torch.distributed._functional_collectives``, which DTensor's tensor and
sequence parallelism use), into calls of ``torch.ops.symm_mem.fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``; the compiled code calls those ops through torch's dispatcher. The switch registers
tilescale's drop-ins (:mod:`.async_tp`) as the CUDA kernels of these two ops, with ``torch.library`` (a
``Library("symm_mem", "IMPL")``, torch's public way to override an operator's kernel for a device; torch's own
kernels of these ops are Python functions it registered, which the override replaces: ``compat.override_kernel``),
so the rewritten graph runs tilescale's fused kernels, and removes them again (the dispatcher then runs torch's
kernels, as before)::

    tilescale.init_distributed()
    with tilescale.pytorch.use_for_inductor_async_tp():      # or: handle = ...(); later handle.remove()
        y = torch.compile(tp_block)(x)                        # fused_* calls run tilescale's AG+GEMM / GEMM+RS

What the switch sets while installed, and puts back: the two kernels; ``torch._inductor.config._micro_pipeline_tp``
(on; Inductor reads it when it compiles a graph, so graphs compiled inside keep their fused calls). What it leaves:
the world group (and the ``groups`` given) marked for symmetric memory (``enable_symm_mem_for_group``: the pass fuses
only marked groups; torch has no unmarking). The kernels are read when a compiled graph runs: a graph compiled with
the pass runs tilescale's kernels while the switch is installed and torch's after. Unchanged: the ops' meta kernels
(torch's: Inductor plans with their shapes and strides, and asserts them on the outputs, which tilescale's drop-ins
match), their schemas, and the fp8 variants (``fused_all_gather_scaled_matmul``,
``fused_scaled_matmul_reduce_scatter``).

A call tilescale does not serve (a group whose ranks are not evenly spaced, a reduce_op or a dtype it does not take:
:mod:`.async_tp`) runs torch's own kernel (the Python function torch registered, called directly:
``tilescale.compat.symm_mem_kernel``), with a debug line (``TILESCALE_DIST_DEBUG=1``).
"""
from __future__ import annotations

from collections.abc import Sequence

from .. import compat
from . import async_tp

OPS = (async_tp.AG, async_tp.RS)      # the symm_mem ops whose kernels the switch replaces
_installed: InductorAsyncTP | None = None


def _count(key: str) -> None:
    if _installed is not None:
        _installed.calls[key] += 1


def _torchs_kernel(op: str):
    """What a call tilescale does not serve runs: torch's own kernel of `op` (counted)."""
    _count(f"{op} (torch)")
    return compat.symm_mem_kernel(op)


def _fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    """The kernel of ``symm_mem::fused_all_gather_matmul`` while the switch is installed."""
    _count(async_tp.AG)
    return async_tp.all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A, _torchs_kernel)


def _fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    """The kernel of ``symm_mem::fused_matmul_reduce_scatter`` while the switch is installed."""
    _count(async_tp.RS)
    return async_tp.matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, _torchs_kernel)


KERNELS = {async_tp.AG: _fused_all_gather_matmul, async_tp.RS: _fused_matmul_reduce_scatter}


class InductorAsyncTP:
    """What :func:`use_for_inductor_async_tp` installed: :meth:`remove` (or the end of a ``with`` block) puts
    torch's kernels and the pass's setting back. ``calls``: how many calls of each op its kernels took, and how many
    of them went on to torch's kernel (``"<op> (torch)"``); replays of a CUDA graph are not counted."""

    def __init__(self, device_types: tuple[str, ...], enable_pass: bool, groups: tuple = ()):
        import collections

        import torch

        self.device_types = device_types
        self.calls: collections.Counter = collections.Counter()
        compat.symm_mem_module()                       # torch.ops.symm_mem.* registered (their kernels: torch's)
        if enable_pass:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise RuntimeError("use_for_inductor_async_tp: torch.distributed is not initialised: call "
                                   "tilescale.init_distributed() first (the pass fuses the collectives of groups "
                                   "marked for symmetric memory; the switch marks the whole world's)")
            from .torch_ops import group_name

            for name in (dist.group.WORLD.group_name, *(group_name(g) for g in groups)):
                compat.mark_group_for_symm_mem(name)
        # The kernels live as long as this Library (torch.library's lifetime rule): remove() drops the one reference
        # to it, and its finalizer takes them out of the dispatcher, whose kernels are torch's again.
        self._lib = torch.library.Library("symm_mem", "IMPL")
        try:
            for op, kernel in KERNELS.items():
                for device_type in device_types:
                    compat.override_kernel(self._lib, op, device_type, kernel)
        except BaseException:
            self._lib = None                           # none of the kernels stays
            raise
        self._pass_before = compat.set_micro_pipeline_tp(True) if enable_pass else None

    @property
    def installed(self) -> bool:
        return self._lib is not None

    def remove(self) -> None:
        """Torch's kernels again, and the pass's setting as it was before (a second call does nothing)."""
        global _installed
        if self._lib is None:
            return
        self._lib = None
        if self._pass_before is not None:
            compat.set_micro_pipeline_tp(self._pass_before)
        if _installed is self:
            _installed = None

    def __enter__(self) -> InductorAsyncTP:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"InductorAsyncTP({'installed' if self.installed else 'removed'}, device_types={self.device_types})"


def use_for_inductor_async_tp(*, enable_pass: bool = True, device_types: Sequence[str] = ("cuda",),
                              groups: Sequence = ()) -> InductorAsyncTP:
    """Have ``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` (what Inductor's
    micro-pipeline TP pass rewrites a TP graph into) run tilescale's drop-ins, until the returned handle's
    ``remove()`` or the end of its ``with`` block (module docstring).

    Args:
        enable_pass: also turn the pass on (``torch._inductor.config._micro_pipeline_tp``, put back by remove())
            and mark the whole world's group for symmetric memory (the pass fuses only marked groups): needs
            torch.distributed initialised (``tilescale.init_distributed()``). False: the kernels only.
        groups: the TP groups (ProcessGroups, their names, 1-D DeviceMeshes) whose collectives the pass should fuse
            too: marked for symmetric memory with the world's (tilescale serves groups of evenly spaced ranks;
            :mod:`.async_tp`).
        device_types: the device types whose kernels are replaced (one, or a sequence): ``("cuda",)``; the CPU
            tests add ``"cpu"`` (torch has no CPU kernel of these ops) to run them in a simulated world.

    Raises:
        RuntimeError: already installed (one at a time: remove the other first), or torch.distributed not
            initialised with `enable_pass`.
        TypeError: `device_types` neither a device type nor a non-empty sequence of them.
    """
    global _installed
    types = (device_types,) if isinstance(device_types, str) else tuple(device_types)
    if not types or not all(isinstance(t, str) and t for t in types):
        raise TypeError(f"use_for_inductor_async_tp: device_types: got {device_types!r}, expected a device type or "
                        "a non-empty sequence of them, such as ('cuda',)")
    if _installed is not None:
        raise RuntimeError(f"use_for_inductor_async_tp: already installed ({_installed!r}): remove() it first")
    _installed = InductorAsyncTP(types, enable_pass, tuple(groups))
    return _installed


def installed() -> InductorAsyncTP | None:
    """The handle of the switch while it is installed, else None."""
    return _installed
