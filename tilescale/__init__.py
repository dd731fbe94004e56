"""tilescale: a JIT compiler for distributed tile kernels on NVIDIA GPUs, built on tilelang and NVSHMEM.

    import tilescale
    import tilescale.language as T

    @tilescale.jit
    def ring_put(n: int, world_size: int):
        @T.prim_func
        def kernel(src: T.Tensor((n,), "float32"), dst: T.Tensor((n,), "float32"), sig: T.Tensor((1,), "uint64")):
            with T.Kernel(1, threads=128):
                T.put_signal_block(src, dst, sig, value=1, dst_pe=(T.get_rank() + 1) % world_size)
                ...
        return kernel

Importing tilescale is light: it imports neither tilelang, torch.distributed nor NVSHMEM; each name
below is loaded on first use.
"""
from __future__ import annotations

import importlib

from . import _moved
from .version import __version__ as __version__

_moved.install()   # the modules' old paths (tilescale.symm, tilescale.toolchain...) keep working

_LAZY = {
    # compiler
    "jit": ("tilescale.compiler", "jit"),
    "compile": ("tilescale.compiler", "compile"),
    "build": ("tilescale.compiler", "build"),
    "compile_all": ("tilescale.compilation.batch", "compile_all"),
    "build_all": ("tilescale.compilation.batch", "build_all"),
    "DistributedKernel": ("tilescale.compiler", "DistributedKernel"),
    "resolve_execution_backend": ("tilescale.compilation.backend", "resolve_execution_backend"),
    "resolve_backend": ("tilescale.compilation.backend", "resolve_backend"),
    "BackendSpec": ("tilescale.compilation.backend", "BackendSpec"),
    "find_nvshmem": ("tilescale.compilation.discovery", "find_nvshmem"),
    # runtime
    "init_distributed": ("tilescale.runtime", "init_distributed"),
    "finalize": ("tilescale.runtime", "finalize"),
    "is_initialized": ("tilescale.runtime", "is_initialized"),
    "DistInfo": ("tilescale.runtime", "DistInfo"),
    "create_symmetric_tensor": ("tilescale.symm", "create_symmetric_tensor"),
    "get_remote_ptr": ("tilescale.symm", "get_remote_ptr"),
}
_SUBMODULES = ("language", "symm", "ops", "env", "errors", "discovery", "backend", "build_modes", "runtime", "analysis",
               "codegen", "toolchain", "testing", "diagnostics", "plan", "distributed", "profiler", "compat", "batch",
               "logs", "compilation", "pytorch")


def barrier(stream=None) -> None:
    """Barrier of all ranks (NVSHMEM), ordered on `stream` (default: the current CUDA stream)."""
    from .env import settings
    from .runtime import current, is_initialized

    if settings.compile_only and not is_initialized():   # nothing ran (tilescale/compilation/compile_only.py)
        return
    current().barrier(stream)


def synchronize() -> None:
    """``torch.cuda.synchronize()`` that turns a device-side wait that gave up (debug mode) into
    :class:`tilescale.errors.WaitTimeoutError` with the wait's diagnostics."""
    from .runtime import synchronize as _sync

    _sync()


def __getattr__(name: str):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"tilescale.{name}")
    raise AttributeError(f"module 'tilescale' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
