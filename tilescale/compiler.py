"""``@tilescale.jit`` and ``tilescale.compile``: tilelang's, plus the distributed build path.

``tilescale.jit`` has ``tilelang.jit``'s signature (bare ``@tilescale.jit`` and configured
``@tilescale.jit(out_idx=..., ...)``) and adds keyword-only options:

* ``build_mode``: ``"auto"`` (default) or a mode of :mod:`tilescale.build_modes` (``"inlined"``, ``"rdc"``) for
  distributed kernels;
* ``wait_timeout_s``: bound of device-side waits in this kernel (default: ``TILESCALE_WAIT_TIMEOUT_S``);
* ``check_symmetric``: check at launch that remote operands live on the symmetric heap.

The backend is resolved per kernel from its IR (:mod:`tilescale.backend`): kernels without distributed
ops are compiled by tilelang unchanged and returned as tilelang's own kernel objects.

The pieces live beside this file, each named after what it holds: :mod:`tilescale.arch` (targets and the
GPU check), :mod:`tilescale.kernel_build` (tilelang's build of a kernel), :mod:`tilescale.distributed_kernel`
(the compiled distributed kernel), :mod:`tilescale.build_only` (source and library without a GPU); their
public names are importable from here too.
"""
from __future__ import annotations
import __future__

import inspect
import logging
from dataclasses import dataclass

from . import build_modes, compat
from .compilation.analysis import param_names, symmetric_params
from .compilation.arch import check_target_arch, code_runs_on, default_target, device_arch, target_codes
from .compilation.build_only import BuildResult, build, lower_source
from .compilation.kernel_build import compile_kernel, func_name, key_flags
from .env import settings
from .errors import ArchMismatchError, BackendError, LanguageError
from .runtime.barrier_kernel import barrier_module
from .runtime.distributed_kernel import DistributedKernel
from .runtime.team import Team

__all__ = ["jit", "compile", "build", "lower_source", "barrier_jit", "TileScaleJITImpl", "DistributedKernel",
           "BuildResult", "WORLD_SIZE_PARAMS", "default_target", "target_codes", "code_runs_on", "device_arch",
           "check_target_arch", "key_flags", "ArchMismatchError"]

log = logging.getLogger("tilescale")

WORLD_SIZE_PARAMS = ("world_size", "num_ranks", "nranks")


def compile(func=None, out_idx=None, execution_backend=None, target=None, target_host=None,  # noqa: A001
            verbose=None, pass_configs=None, compile_flags=None, *, build_mode: str | None = None,
            world_size: int | None = None, wait_timeout_s: float | None = None, check_symmetric: bool | None = None,
            team=None):
    """``tilelang.compile`` with tilescale's backend resolution (same positional signature). `world_size`: the ranks
    the kernel was written for, checked at its first launch: the job's world size, or with `team` (the group's ranks
    it runs among, tilescale.runtime.team.Team) the group's size, the job then any that holds the team's ranks."""
    if not isinstance(func, compat.prim_func_class()):
        raise TypeError(f"func: got {type(func).__name__}, expected a tilelang PrimFunc")
    if team is not None and not isinstance(team, Team):
        raise TypeError(f"tilescale.compile: team: got {type(team).__name__}, expected None (the whole world) or a "
                        "tilescale.runtime.team.Team (the group's ranks the kernel runs among)")
    if settings.compile_only:   # built, not loaded: a script's compile-only run (tilescale/compilation/compile_only.py)
        from .compilation.compile_only import BuiltKernel

        return BuiltKernel(func, build(func, target, pass_configs, compile_flags, build_mode=build_mode,
                                       wait_timeout_s=wait_timeout_s), out_idx)
    kernel, spec = compile_kernel(func, out_idx, execution_backend, target, target_host, verbose, pass_configs,
                                  compile_flags, build_mode=build_mode, wait_timeout_s=wait_timeout_s)
    if not spec.distributed:
        return kernel
    check = settings.check_symmetric if check_symmetric is None else check_symmetric
    return DistributedKernel(kernel, spec, func_name(func), param_names(func), symmetric_params(func), world_size,
                             check, team=team)


@dataclass
class TileScaleJITImpl(compat.jit_impl_base()):
    """tilelang's JITImpl with tilescale's compile step (backend resolution, NVSHMEM build)."""

    build_mode: str | None = None
    wait_timeout_s: float | None = None
    check_symmetric: bool | None = None

    def _peers(self, args, kwargs) -> dict:
        """compile's `world_size` and `team` for a kernel compiled with these arguments: its world-size parameter,
        and its `team` argument where it runs among a group's ranks (tilescale.runtime.team.Team)."""
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
        except TypeError:
            return {"world_size": None, "team": None}
        team = bound.arguments.get("team")
        team = team if isinstance(team, Team) else None
        sizes = (bound.arguments.get(n) for n in WORLD_SIZE_PARAMS)
        world = next((v for v in sizes if isinstance(v, int) and not isinstance(v, bool)), None)
        return {"world_size": world, "team": team}

    def get_tir(self, *args, **kwargs):
        try:
            return super().get_tir(*args, **kwargs)
        except NameError as e:
            fn = getattr(self.func, "orig_func", self.func)
            if not _stringized_annotations(fn):
                raise
            raise _stringized_annotations_error(fn, e) from e

    def __post_init__(self):
        super().__post_init__()
        self._compiled: dict[tuple, object] = {}   # compile_tir's kernels, by memo_key

    def memo_key(self, args, kwargs) -> tuple | None:
        """What identifies one compiled kernel of this function in this process: its arguments (as bound to the
        signature, defaults applied) and the settings read when it is compiled that shape it; None when an
        argument cannot be a key (then nothing is remembered)."""
        try:
            bound = self.signature.bind(*args, **(kwargs or {}))
            bound.apply_defaults()
            key = (tuple(bound.arguments.items()), settings.wait_timeout_s, settings.node_size, settings.build_mode,
                   settings.use_distributed, settings.check_symmetric, settings.target)
            hash(key)
        except (TypeError, ValueError):
            return None
        return key

    def compile(self, *args, **kwargs):
        """``fn(*args)``'s compile (tilelang calls it on a miss of its own per-function cache): a kernel that
        compile_tir made for the same arguments (a batch of builds, tilescale.batch) is returned as it is, not
        compiled a second time through tilelang's cache."""
        key = self.memo_key(args, kwargs)
        done = self._compiled.get(key) if key is not None else None
        return done if done is not None else self.compile_tir(self.get_tir(*args, **kwargs), args, kwargs)

    def compile_tir(self, pf, args=(), kwargs=None):
        """Compile an already elaborated PrimFunc of this function (elaborate in one thread, compile in
        many: see tilescale.batch); remembered for ``fn(*args, **kwargs)`` when `args` / `kwargs` are given."""
        if settings.compile_only:   # built, not loaded: a script's compile-only run (compilation/compile_only.py)
            from .compilation.compile_only import BuiltKernel

            return BuiltKernel(pf, self.build_tir(pf), self.out_idx, name=getattr(self.func, "__name__", None))
        k = compile(pf, out_idx=self.out_idx, execution_backend=self.execution_backend, target=self.target,
                    target_host=self.target_host, verbose=self.verbose, pass_configs=self.pass_configs,
                    compile_flags=self.compile_flags, build_mode=self.build_mode,
                    **self._peers(args, kwargs or {}), wait_timeout_s=self.wait_timeout_s,
                    check_symmetric=self.check_symmetric)
        if self.debug_root_path:
            import os

            os.makedirs(self.debug_root_path, exist_ok=True)
            name = getattr(self.func, "__name__", "jit_kernel")
            with open(os.path.join(self.debug_root_path, f"tilescale_jit_kernel_{name}.cu"), "w") as f:
                f.write(k.get_kernel_source())
        if args or kwargs:
            key = self.memo_key(args, kwargs)
            if key is not None:
                self._compiled[key] = k
        return k

    def par_compile(self, configs, num_workers: int | None = None, ignore_error: bool = False):
        """tilelang's par_compile, as one batch of tilescale.batch (threads up to TILESCALE_BUILD_JOBS, one
        progress line on rank 0): the kernel of each config (a dict of keyword arguments or a tuple of positional
        ones), None for a failed one when `ignore_error`."""
        from .compilation import batch

        configs = list(configs)
        jobs = [(self, (), c) if isinstance(c, dict) else (self, tuple(c)) for c in configs]
        out = []
        for cfg, r in zip(configs, batch.run(jobs, batch.compile_job, workers=num_workers, lookup=batch.compiled),
                          strict=True):
            if isinstance(r, BaseException):
                if not ignore_error:
                    raise r
                log.warning("compiling %r failed", cfg, exc_info=r)
                r = None
            out.append(r)
        return out

    def build(self, *args, target=None, **kwargs) -> BuildResult:
        """Compile and link without loading (GPU-less machines); see :func:`tilescale.compiler.build`."""
        return self.build_tir(self.get_tir(*args, **kwargs), target=target)

    def build_tir(self, pf, target=None) -> BuildResult:
        """:meth:`build` of an already elaborated PrimFunc of this function (as :meth:`compile_tir`)."""
        return build(pf, target=target or self.target, pass_configs=self.pass_configs,
                     compile_flags=self.compile_flags, build_mode=self.build_mode, wait_timeout_s=self.wait_timeout_s)


def jit(func=None, *, out_idx=None, target=None, target_host=None, execution_backend=None, verbose=None,
        pass_configs=None, debug_root_path=None, compile_flags=None, build_mode: str | None = None,
        wait_timeout_s: float | None = None, check_symmetric: bool | None = None):
    """``tilelang.jit`` with tilescale's distributed build path. See the module docstring."""
    choices = ("auto", *build_modes.NAMES)
    if build_mode not in (None, *choices):
        raise BackendError(f"build_mode: got {build_mode!r}, expected {', '.join(map(repr, choices[:-1]))} or "
                           f"{choices[-1]!r}")
    compile_args = dict(out_idx=out_idx, execution_backend=execution_backend, target=target, target_host=target_host,
                        verbose=verbose, pass_configs=pass_configs, debug_root_path=debug_root_path,
                        compile_flags=compile_flags)

    def decorator(f):
        pf = compat.eager_prim_func(f)
        return TileScaleJITImpl(func=pf, **compile_args, func_source=inspect.getsource(pf.orig_func),
                                signature=inspect.signature(pf.orig_func), mode="auto", build_mode=build_mode,
                                wait_timeout_s=wait_timeout_s, check_symmetric=check_symmetric)

    return decorator(func) if func is not None else decorator


def _stringized_annotations(fn) -> bool:
    """Whether `fn`'s module was compiled with ``from __future__ import annotations`` (PEP 563)."""
    code = getattr(fn, "__code__", None)
    return code is not None and bool(code.co_flags & __future__.annotations.compiler_flag)


def _stringized_annotations_error(fn, e: NameError) -> LanguageError:
    """The error of a kernel whose annotations are strings: tilelang evaluates a prim_func's annotations
    (``T.Tensor((n,), ...)``) when it elaborates the kernel, with the module's globals only, so the names of the
    enclosing function (the kernel's sizes) are not defined there."""
    where = inspect.getsourcefile(fn) or fn.__code__.co_filename
    return LanguageError(
        f"{fn.__name__}: its kernel's annotations cannot be evaluated ({type(e).__name__}: {e}) because {where} "
        "has `from __future__ import annotations`, which turns annotations such as `T.Tensor((n,), ...)` into "
        "strings that tilelang evaluates later, without the names of the enclosing function. Remove that import "
        f"from {where}, or define the kernel in a module without it.")


_BARRIER_JIT = None


def barrier_jit():
    """The barrier module (tilescale/runtime/barrier_kernel.py) as a ``@tilescale.jit`` function of the world size:
    what prebuild compiles ahead (the runtime builds the same PrimFunc itself, at its first barrier)."""
    global _BARRIER_JIT
    if _BARRIER_JIT is None:
        _BARRIER_JIT = jit(barrier_module)
    return _BARRIER_JIT
