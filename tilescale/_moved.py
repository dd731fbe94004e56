"""Module paths that moved into packages stay importable by their old names.

``import tilescale.symm`` (or ``from tilescale.toolchain import run_bounded``) gives the module at its new
path itself, not a copy: the same object in ``sys.modules`` under both names, so that state, ``isinstance`` and
monkeypatching agree whichever name a caller uses. New code imports the new paths. An old name loads its module
only when it is imported, so ``import tilescale`` stays light. ``python -m`` takes the new path.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys

_COMPILATION = ("analysis", "arch", "backend", "batch", "build_only", "cache_files", "codegen", "compile_only",
                "discovery", "kernel_build", "nvshmem_host", "toolchain")
_RUNTIME = ("barrier_kernel", "diagnostics", "distributed_kernel", "heap", "mpg_lock", "nvshmem_start", "placement",
            "symm", "topology")

MOVED = {
    **{f"tilescale.{m}": f"tilescale.compilation.{m}" for m in _COMPILATION},
    **{f"tilescale.{m}": f"tilescale.runtime.{m}" for m in _RUNTIME},
    "tilescale.distributed": "tilescale.pytorch.distributed",
    "tilescale.staged_collectives": "tilescale.pytorch.staged_collectives",
    "tilescale.ops.torch_ops": "tilescale.pytorch.torch_ops",
    "tilescale.ops.async_tp": "tilescale.pytorch.async_tp",
}


class _Alias:
    """Loader of an old name: puts the module of the new name in its place."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.new)


class _Finder:
    """Finds the old names only; asked first, so that no other install's copy of an old path is found instead."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        new = MOVED.get(name)
        return importlib.machinery.ModuleSpec(name, _Alias(new)) if new else None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
