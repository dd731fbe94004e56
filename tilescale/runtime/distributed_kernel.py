"""A compiled distributed kernel: tilelang's kernel plus its module's NVSHMEM state and launch-time checks."""
from __future__ import annotations

from typing import Any

from .. import compat, runtime
from ..compilation.backend import BackendSpec
from ..errors import WorldSizeMismatchError
from . import symm


class DistributedKernel:
    """A compiled distributed kernel: tilelang's JITKernel (cython backend, linked with NVSHMEM) plus
    the per-module NVSHMEM state, launch-time checks and what tilescale knows about it."""

    def __init__(self, kernel, spec: BackendSpec, name: str, params: list[str], symmetric: list[str],
                 world_size: int | None, check_symmetric: bool, team=None):
        self._kernel = kernel
        self.spec = spec
        self.name = name
        self.param_names = params
        self.symmetric_params = symmetric
        self.world_size = world_size   # its world-size parameter: the job's, or (with a team) the group's
        self.team = team               # the group's ranks it runs among (tilescale.runtime.team.Team), or None
        self._symm_idx = [params.index(s) for s in symmetric if s in params]
        self._check = check_symmetric
        self._symmetric_seen: set[tuple[int, int]] = set()   # (pointer, bytes) found on the heap ...
        self._symmetric_epoch = None                         # ... as of this state of the allocations
        self._ready = False

    @property
    def execution_backend(self) -> str:
        return self.spec.name

    @property
    def build_mode(self) -> str | None:
        return self.spec.build_mode

    @property
    def kernel(self):
        """tilelang's JITKernel behind this one."""
        return self._kernel

    @property
    def library(self):
        return compat.kernel_library(self._kernel)

    def get_kernel_source(self, *a, **kw) -> str:
        return self._kernel.get_kernel_source(*a, **kw)

    def prepare(self) -> DistributedKernel:
        """Initialise this kernel's module now (NVSHMEM state, eager load of all its kernels) instead of at
        the first launch: do it before launching anything that spins waiting for this kernel."""
        if not self._ready:
            self._prepare()
        return self

    def _prepare(self) -> None:
        rt = runtime.current()
        if self.team is not None:
            last = self.team.ranks[-1]
            if last >= rt.info.world_size:
                raise WorldSizeMismatchError(f"kernel '{self.name}' was compiled for the group of ranks "
                                             f"{self.team.start}, {self.team.start + self.team.stride}, ... {last} "
                                             f"but this job has {rt.info.world_size} ranks")
        elif self.world_size is not None and self.world_size != rt.info.world_size:
            raise WorldSizeMismatchError(f"kernel '{self.name}' was compiled for world_size={self.world_size} but "
                                         f"this job has {rt.info.world_size} ranks: compile it with "
                                         f"world_size={rt.info.world_size}")
        runtime.init_module(compat.kernel_library(self._kernel), self.name)
        self._ready = True

    def check_args(self, args) -> None:
        """Raise NotSymmetricError unless every remote operand lies in a live symmetric allocation. Operands
        found once are not looked up again until an allocation is freed (symm.free, finalize)."""
        epoch = symm.registry_epoch()
        if epoch != self._symmetric_epoch:
            self._symmetric_seen.clear()   # a freed allocation must not keep passing
            self._symmetric_epoch = epoch
        for i in self._symm_idx:
            if i < len(args) and hasattr(args[i], "data_ptr"):
                t = args[i]
                seen = (t.data_ptr(), t.numel() * t.element_size() if hasattr(t, "numel") else 0)
                if seen not in self._symmetric_seen:
                    symm.require_symmetric(t, f"{self.name}({self.param_names[i]}=...)")
                    self._symmetric_seen.add(seen)

    def __call__(self, *args, **kwargs):
        if not self._ready:
            self._prepare()
        if self._check:
            self.check_args(args)
        return self._kernel(*args, **kwargs)

    def launch(self, *args):
        """Launch with no argument checks (tilescale's own ops, whose arguments are built right):
        the fastest path from Python. Needs prepare() (or a first checked call) before."""
        if not self._ready:
            self._prepare()
        return self._kernel(*args, skip_tensor_validation=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)

    def __repr__(self) -> str:
        return (f"DistributedKernel({self.name!r}, backend={self.spec.name!r}, build_mode={self.spec.build_mode!r}, "
                f"symmetric={self.symmetric_params})")
