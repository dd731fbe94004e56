"""``@tilescale.jit`` and ``tilescale.compile``: tilelang's, plus the distributed build path.

``tilescale.jit`` has ``tilelang.jit``'s signature (bare ``@tilescale.jit`` and configured
``@tilescale.jit(out_idx=..., ...)``) and adds keyword-only options:

* ``build_mode``: ``"auto"`` (default), ``"inlined"`` or ``"rdc"`` for distributed kernels;
* ``wait_timeout_s``: bound of device-side waits in this kernel (default: ``TILESCALE_WAIT_TIMEOUT_S``);
* ``check_symmetric``: check at launch that remote operands live on the symmetric heap.

The backend is resolved per kernel from its IR (:mod:`tilescale.backend`): kernels without distributed
ops are compiled by tilelang unchanged and returned as tilelang's own kernel objects.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilelang.jit import JITImpl
from tilelang.jit import compile as _tl_compile
from tilelang.language.eager import PrimFunc, prim_func

from .backend import BackendSpec, nvshmem_compile_flags, resolve_backend, split_pass_configs
from .env import settings
from .errors import ArchMismatchError, BuildError, TileScaleError, WorldSizeMismatchError

log = logging.getLogger("tilescale")

WORLD_SIZE_PARAMS = ("world_size", "num_ranks", "nranks")


def default_target(target=None):
    """`target` if given; tilelang's auto-detection when a GPU is visible; else a dict target for the
    TILESCALE_TARGET arch (default sm_90a), so kernels compile on GPU-less machines."""
    if target not in (None, "auto"):
        return target
    try:
        import torch

        if torch.cuda.is_available():
            return target
    except Exception:  # noqa: BLE001
        pass
    arch = settings.target or "sm_90a"
    if not arch.startswith("sm_"):
        raise TileScaleError(f"TILESCALE_TARGET={arch!r}: expected an arch such as sm_90a")
    return {"kind": "cuda", "arch": arch}


_SM = re.compile(r"sm_(\d+?)(\d)([af]?)")


def target_codes(target) -> list[str]:
    """The GPU codes (``sm_XY[a|f]``) that a CUDA `target` compiles to, e.g. ``['sm_90a']``; [] when the
    target names none (None / "auto": tilelang picks the visible GPU's) or is not a CUDA target."""
    if target in (None, "auto"):
        return []
    try:
        from tilelang.backend.target import determine_target

        t = determine_target(target, return_object=True)
    except Exception:  # noqa: BLE001  (tilelang reports invalid targets itself, when it compiles)
        return []
    if t.kind.name != "cuda":
        return []
    if "code" in t.attrs:
        return [str(c) for c in t.attrs["code"]]
    return [str(t.attrs["arch"])] if "arch" in t.attrs else []


def code_runs_on(code: str, capability: tuple[int, int]) -> bool:
    """Whether GPU code `code` (tilelang embeds machine code only, no PTX) runs on a GPU of compute
    capability `capability`: ``sm_XYa`` only on X.Y; ``sm_XY`` and ``sm_XYf`` on X.Z for Z >= Y."""
    m = _SM.fullmatch(code)
    if m is None:
        return True  # not a form tilescale knows: let the driver decide
    major, minor, variant = int(m.group(1)), int(m.group(2)), m.group(3)
    if variant == "a":
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


def device_arch(capability: tuple[int, int]) -> str:
    """The code tilelang compiles for a GPU of this compute capability (sm_90a for 9.0, sm_80 for 8.0)."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _current_device():
    """(index, name, compute capability) of this process's CUDA device; None without a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        i = torch.cuda.current_device()
        return i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i))
    except Exception:  # noqa: BLE001
        return None


def check_target_arch(target, kernel: str, device=None) -> None:
    """Raise :class:`ArchMismatchError` if `target` compiles `kernel` for GPU code that cannot run on
    `device` ((index, name, capability); default: this process's GPU). Nothing to check without a GPU
    or when the target is left to tilelang (None / "auto")."""
    if target in (None, "auto"):
        return
    device = device or _current_device()
    if device is None:
        return
    codes = target_codes(target)
    if not codes:
        return
    index, name, cap = device
    if any(code_runs_on(c, cap) for c in codes):
        return
    here = device_arch(cap)
    raise ArchMismatchError(
        f"kernel '{kernel}': target={target!r} compiles it for {', '.join(codes)}, but this process's GPU "
        f"{index} ({name}) has compute capability {cap[0]}.{cap[1]} ({here}): code built for "
        f"{codes[0]} cannot run there (CUDA would fail with 'no kernel image is available'). Compile it for "
        f"this GPU: leave target unset (or 'auto'), or pass target={{'kind': 'cuda', 'arch': '{here}'}}. "
        f"To build for {codes[0]} without loading it, use tilescale.build(..., target=...) or compile on a "
        f"machine without a GPU with TILESCALE_TARGET={codes[0]}.")


class DistributedKernel:
    """A compiled distributed kernel: tilelang's JITKernel (cython backend, linked with NVSHMEM) plus
    the per-module NVSHMEM state, launch-time checks and what tilescale knows about it."""

    def __init__(self, kernel, spec: BackendSpec, name: str, params: list[str], symmetric: list[str],
                 world_size: int | None, check_symmetric: bool):
        self._kernel = kernel
        self.spec = spec
        self.name = name
        self.param_names = params
        self.symmetric_params = symmetric
        self.world_size = world_size
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
        return self._kernel.adapter.lib

    def get_kernel_source(self, *a, **kw) -> str:
        return self._kernel.get_kernel_source(*a, **kw)

    def prepare(self) -> "DistributedKernel":
        """Initialise this kernel's module now (NVSHMEM state, eager load of all its kernels) instead of at
        the first launch: do it before launching anything that spins waiting for this kernel."""
        if not self._ready:
            self._prepare()
        return self

    def _prepare(self) -> None:
        from . import runtime

        rt = runtime.current()
        if self.world_size is not None and self.world_size != rt.info.world_size:
            raise WorldSizeMismatchError(f"kernel '{self.name}' was compiled for world_size={self.world_size} but "
                                         f"this job has {rt.info.world_size} ranks: compile it with "
                                         f"world_size={rt.info.world_size}")
        runtime.init_module(self._kernel.adapter.lib, self.name)
        self._ready = True

    def check_args(self, args) -> None:
        """Raise NotSymmetricError unless every remote operand lies in a live symmetric allocation. Operands
        found once are not looked up again until an allocation is freed (symm.free, finalize)."""
        from .symm import registry_epoch, require_symmetric

        epoch = registry_epoch()
        if epoch != self._symmetric_epoch:
            self._symmetric_seen.clear()   # a freed allocation must not keep passing
            self._symmetric_epoch = epoch
        for i in self._symm_idx:
            if i < len(args) and hasattr(args[i], "data_ptr"):
                t = args[i]
                seen = (t.data_ptr(), t.numel() * t.element_size() if hasattr(t, "numel") else 0)
                if seen not in self._symmetric_seen:
                    require_symmetric(t, f"{self.name}({self.param_names[i]}=...)")
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


def _func_name(func) -> str:
    try:
        return str(func.attrs["global_symbol"])
    except Exception:  # noqa: BLE001
        return "kernel"


def key_flags() -> list[str]:
    """-D tokens that put into the kernel cache key (tilelang's key holds the compile flags) what changes a
    distributed kernel's binary but is invisible to tilelang: the nvcc build, and the content of tilescale's
    source rewriting (codegen.py) and headers. (The NVSHMEM version and paths, header digest, build mode,
    wait timeout are in nvshmem_compile_flags; the arch is in tilelang's key.)"""
    from .toolchain import nvcc_version_tag, source_digest

    return [f"-DTILESCALE_NVCC={nvcc_version_tag()}", f"-DTILESCALE_SRC={source_digest()}"]


def _prepare_distributed(func, spec: BackendSpec, compile_flags, wait_timeout_s):
    from .discovery import find_nvshmem
    from .runtime import load_host_library
    from .toolchain import check_no_whitespace

    install = find_nvshmem()
    ours = nvshmem_compile_flags(spec, install, wait_timeout_s) + key_flags()
    check_no_whitespace(ours, f" (NVSHMEM {install.version} from {install.root})")
    load_host_library(install)  # kernel modules' NEEDED libnvshmem_host resolves to this copy
    flags = [compile_flags] if isinstance(compile_flags, str) else list(compile_flags or [])
    return flags + ours


def _private_tilelang_cache() -> None:
    """tilelang's kernel cache, where tilescale.compile's kernels are loaded from: refuse it (root, namespace,
    kernels and staging directories) if others could write it; create missing parts 0700 before tilelang
    does (it would make them 0755)."""
    from tilelang import env as tl_env

    from .toolchain import private_dir, tilelang_cache_dir

    try:
        if not tl_env.is_cache_enabled():
            return
    except Exception:  # noqa: BLE001
        pass
    root = tilelang_cache_dir()
    dirs = [root]
    try:
        from tilelang.cache.kernel_cache import KernelCache

        dirs += [Path(KernelCache._get_cache_root()), Path(KernelCache._get_staging_root())]
    except Exception:  # noqa: BLE001  (another tilelang layout: the root alone)
        pass
    for d in dirs:
        private_dir(d, root=root)


def compile(func: PrimFunc = None, out_idx=None, execution_backend=None, target=None, target_host=None,  # noqa: A001
            verbose=None, pass_configs=None, compile_flags=None, *, build_mode: str | None = None,
            world_size: int | None = None, wait_timeout_s: float | None = None, check_symmetric: bool | None = None):
    """``tilelang.compile`` with tilescale's backend resolution (same positional signature)."""
    from . import codegen
    from .analysis import param_names, symmetric_params

    if not isinstance(func, PrimFunc):
        raise TypeError(f"func: got {type(func).__name__}, expected a tilelang PrimFunc")
    tl_pc, _ = split_pass_configs(pass_configs)
    spec = resolve_backend(func, execution_backend, pass_configs, build_mode)
    target = default_target(target)
    check_target_arch(target, _func_name(func))  # before tilelang loads the kernel
    _private_tilelang_cache()
    if not spec.distributed:
        if spec.name == "cython":  # tilelang's cython build links -lcuda: on a GPU-less machine, the stub
            from .toolchain import check_no_whitespace, stub_libcuda_dir

            stub = stub_libcuda_dir()
            if stub is not None:
                check_no_whitespace([f"-L{stub}"])
                compile_flags = ([compile_flags] if isinstance(compile_flags, str) else list(compile_flags or [])) + \
                    [f"-L{stub}"]
        with _one_compile_at_a_time(func, target, execution_backend, compile_flags, tl_pc, out_idx):
            return _tl_compile(func, out_idx=out_idx, execution_backend=execution_backend, target=target,
                               target_host=target_host, verbose=verbose, pass_configs=tl_pc,
                               compile_flags=compile_flags)
    from .toolchain import bounded_nvcc

    flags = _prepare_distributed(func, spec, compile_flags, wait_timeout_s)
    with _one_compile_at_a_time(func, target, "cython", flags, tl_pc, out_idx), \
            codegen.distributed_build(spec.build_mode), _explain_build_errors(_func_name(func), spec), \
            bounded_nvcc(f"distributed kernel '{_func_name(func)}'"):
        k = _tl_compile(func, out_idx=out_idx, execution_backend="cython", target=target, target_host=target_host,
                        verbose=verbose, pass_configs=tl_pc, compile_flags=flags)
    check = settings.check_symmetric if check_symmetric is None else check_symmetric
    return DistributedKernel(k, spec, _func_name(func), param_names(func), symmetric_params(func), world_size, check)


@contextlib.contextmanager
def _one_compile_at_a_time(func, target, backend, flags, pass_configs, out_idx):
    """Processes that compile the same kernel at the same time (every rank of a job at its first call, the
    jobs of a test run) take turns: the first one compiles it into tilelang's kernel cache, the others then
    find it there instead of each running nvcc on the same source. Only with tilelang's disk cache on
    (without it every process compiles its own, side by side)."""
    import hashlib
    import json

    try:
        from tilelang import env as tl_env

        cached = tl_env.is_cache_enabled()
    except Exception:  # noqa: BLE001
        cached = False
    if not cached:
        yield
        return
    import tilelang

    from .toolchain import file_lock

    data = {"func": hashlib.sha256(func.script(show_meta=True).encode()).hexdigest(), "target": str(target),
            "backend": str(backend), "flags": flags if isinstance(flags, str) else list(flags or []),
            "pass_configs": pass_configs or {}, "out_idx": out_idx, "tilelang": tilelang.__version__}
    key = hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:32]
    wait = settings.nvcc_timeout_s + 600.0 if settings.nvcc_timeout_s > 0 else 7 * 24 * 3600.0
    with file_lock(settings.cache_dir / "compiling" / f"{key}.lock", timeout_s=wait):
        yield


_NVCC_ERROR = re.compile(r"\(\d+\): (error|catastrophic error)|fatal error|undefined reference|"
                         r"ptxas (error|fatal)|nvlink (error|fatal)|nvcc fatal")


@contextlib.contextmanager
def _explain_build_errors(name: str, spec: BackendSpec):
    """nvcc failures of distributed kernels: the compiler's error lines and the NVSHMEM in use, instead of
    tilelang's dump of the whole generated file."""
    from .toolchain import NvccTimeoutError

    try:
        yield
    except NvccTimeoutError:
        raise
    except RuntimeError as e:
        if isinstance(e.__cause__, NvccTimeoutError):   # tilelang wraps what its nvcc run raised
            raise e.__cause__ from None
        msg = str(e)
        if not msg.startswith("Compilation Failed"):
            raise
        from .discovery import find_nvshmem

        errors = [ln for ln in msg.splitlines() if _NVCC_ERROR.search(ln)]
        detail = ("\n  ".join(errors[:20]) if errors else
                  "(nvcc's own messages are on this process's stderr, above: tilelang does not capture them)")
        if spec.distributed:
            nv = find_nvshmem()
            what = f"distributed kernel '{name}' ({spec.build_mode} mode, NVSHMEM {nv.version} from {nv.root})"
        else:
            what = f"kernel '{name}' (no distributed ops: plain tilelang build)"
        raise BuildError(f"nvcc could not build {what}:\n  {detail}\n"
                         "(the full command and generated source: the chained exception)") from e


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build` produced without loading it (GPU-less machines)."""

    spec: BackendSpec
    source: str          # the device source, as compiled
    library: str         # path of the built .so
    flags: tuple


def build(func: PrimFunc, target=None, pass_configs=None, compile_flags=None, *, build_mode: str | None = None,
          wait_timeout_s: float | None = None, verbose: bool = False) -> BuildResult:
    """Lower, generate and link a distributed kernel into a .so without loading it: the path for build
    machines without a driver, where tilelang's load step (cudaFuncSetAttribute) cannot run.

    Built once: the library, the source tilelang compiled (``kernel_lib.cu`` beside it) and the device
    source are kept in ``TILESCALE_CACHE_DIR/kernels/<key>/`` (the key: the IR, target, pass configs, flags
    (NVSHMEM, header and codegen digests, build mode, timeout), nvcc build, tilelang and tilescale), and a
    later build of the same kernel returns them without lowering or running nvcc. Nothing is left in TMPDIR."""
    from tvm.target import Target

    from . import __version__
    from .toolchain import build_once, private_dir, why_invalid

    tl_pc, _ = split_pass_configs(pass_configs)
    spec = resolve_backend(func, "auto", pass_configs, build_mode)
    tgt = Target(default_target(target) or {"kind": "cuda", "arch": "sm_90a"}, "c")
    if spec.distributed:
        flags = _prepare_distributed(func, spec, compile_flags, wait_timeout_s)
    else:  # tilelang's library build links -lcuda: on a GPU-less machine, against the stub
        from .toolchain import check_no_whitespace, nvcc_version_tag, stub_libcuda_dir

        flags = [compile_flags] if isinstance(compile_flags, str) else list(compile_flags or [])
        stub = stub_libcuda_dir()
        if stub is not None:
            check_no_whitespace([f"-L{stub}"])
            flags.append(f"-L{stub}")
        flags.append(f"-DTILESCALE_NVCC={nvcc_version_tag()}")
    cfg = dict(tl_pc or {})
    key = _build_key(func, tgt, cfg, flags, spec, __version__)
    entry = private_dir(settings.cache_dir / "kernels" / key)
    lib, host_src, dev_src = entry / "kernel_lib.so", entry / "kernel_lib.cu", entry / "device_kernel.cu"

    def make(tmp: Path) -> None:
        source, host = _build_library(func, spec, tgt, cfg, flags, verbose, tmp)
        _write_private(host_src, host)      # before the library is published: a valid library has both
        _write_private(dev_src, source)

    if why_invalid(lib) is None and not (host_src.is_file() and dev_src.is_file()):
        from .toolchain import record_path

        record_path(lib).unlink(missing_ok=True)   # companions lost: rebuild the entry
    build_once(lib, make)
    return BuildResult(spec=spec, source=dev_src.read_text(), library=str(lib), flags=tuple(flags))


def _build_key(func, tgt, cfg: dict, flags: list, spec: BackendSpec, version: str) -> str:
    import hashlib
    import json

    try:
        from tilelang.cache.kernel_cache import KernelCache

        base = KernelCache._get_base_key()   # tilelang's version and a hash of its native libraries
    except Exception:  # noqa: BLE001
        import tilelang

        base = {"version": tilelang.__version__}
    from .toolchain import nvcc_version_tag

    data = {"func": hashlib.sha256(func.script(show_meta=True).encode()).hexdigest(), "target": str(tgt),
            "pass_configs": cfg, "flags": list(flags), "backend": spec.name, "build_mode": spec.build_mode,
            "nvcc": nvcc_version_tag(), "tilescale": version, "tilelang": base}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def _write_private(path: Path, text: str) -> None:
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)   # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _build_library(func, spec: BackendSpec, tgt, cfg: dict, flags: list, verbose: bool, out: Path):
    """Lower `func`, generate its library source and compile it with tilelang's nvcc command into `out`;
    returns (device source, library source). tilelang's temporaries in TMPDIR are removed."""
    import os
    import shutil

    from tilelang import tvm
    from tilelang.engine.lower import lower
    from tilelang.jit.adapter.libgen import LibraryGenerator
    from tilelang.jit.adapter.wrapper import TLWrapper

    from . import codegen
    from .toolchain import bounded_nvcc

    with codegen.distributed_build(spec.build_mode or "inlined") if spec.distributed else contextlib.nullcontext():
        with tvm.transform.PassContext(opt_level=3, config=cfg), tgt:
            art = lower(func, target=tgt)
        w = TLWrapper(tgt)
        w.assign_optimized_module(tvm.IRModule({"main": func}))
        w.assign_pass_configs(cfg)
        w.assign_host_module(art.host_mod)
        w.assign_device_module(art.device_mod)
        g = LibraryGenerator(tgt, verbose=verbose)
        g.assign_pass_configs(cfg)
        g.assign_compile_flags(flags)
        g.update_lib_code(w.wrap(art.kernel_source))
        with _explain_build_errors(_func_name(func), spec), bounded_nvcc(f"kernel '{_func_name(func)}'"):
            made: set[str] = set()
            try:
                g.compile_lib()
                shutil.copyfile(g.libpath, out)
            except RuntimeError as e:
                made |= _failed_compile_files(str(e))
                raise
            finally:
                for f in {x for x in (g.srcpath, g.libpath, *made) if x}:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f)
    return art.kernel_source, g.lib_code


def _failed_compile_files(msg: str) -> set[str]:
    """The temporaries of a failed ``LibraryGenerator.compile_lib``: it records its source and library paths
    only after a successful nvcc run, but its error ("Compilation Failed! [command]") names both. Only files
    named tmp* directly in the temporary directory (where tilelang creates them) are returned."""
    import os
    import tempfile

    first = msg.split("\n", 1)[0]
    if not first.startswith("Compilation Failed!"):
        return set()
    tmp = os.path.realpath(tempfile.gettempdir())
    return {f for f in re.findall(r"'([^']+\.(?:cu|so))'", first)
            if os.path.dirname(os.path.realpath(f)) == tmp and os.path.basename(f).startswith("tmp")}


def lower_source(func: PrimFunc, target=None, build_mode: str = "inlined") -> str:
    """The CUDA source tilescale generates for `func`, without running nvcc (fast; for inspection and
    golden tests)."""
    from tilelang import tvm
    from tilelang.engine.lower import lower
    from tvm.target import Target

    from . import codegen

    spec = resolve_backend(func, "auto", None, None)
    tgt = Target(default_target(target) or {"kind": "cuda", "arch": "sm_90a"})
    ctx = codegen.distributed_build(build_mode) if spec.distributed else contextlib.nullcontext()
    with ctx, tvm.transform.PassContext(opt_level=3), tgt:
        return lower(func, target=tgt).kernel_source


@dataclass
class TileScaleJITImpl(JITImpl):
    """tilelang's JITImpl with tilescale's compile step (backend resolution, NVSHMEM build)."""

    build_mode: str | None = None
    wait_timeout_s: float | None = None
    check_symmetric: bool | None = None

    def _world_size(self, args, kwargs) -> int | None:
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
        except TypeError:
            return None
        for n in WORLD_SIZE_PARAMS:
            v = bound.arguments.get(n)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    def compile(self, *args, **kwargs):
        return self.compile_tir(self.get_tir(*args, **kwargs), args, kwargs)

    def compile_tir(self, pf, args=(), kwargs=None):
        """Compile an already elaborated PrimFunc of this function (elaborate in one thread, compile in
        many: see tilescale.ops.prebuild)."""
        k = compile(pf, out_idx=self.out_idx, execution_backend=self.execution_backend, target=self.target,
                    target_host=self.target_host, verbose=self.verbose, pass_configs=self.pass_configs,
                    compile_flags=self.compile_flags, build_mode=self.build_mode,
                    world_size=self._world_size(args, kwargs or {}), wait_timeout_s=self.wait_timeout_s,
                    check_symmetric=self.check_symmetric)
        if self.debug_root_path:
            import os

            os.makedirs(self.debug_root_path, exist_ok=True)
            name = getattr(self.func, "__name__", "jit_kernel")
            with open(os.path.join(self.debug_root_path, f"tilescale_jit_kernel_{name}.cu"), "w") as f:
                f.write(k.get_kernel_source())
        return k

    def par_compile(self, configs, num_workers: int | None = None, ignore_error: bool = False):
        import concurrent.futures as cf

        configs = list(configs)
        tirs = [(self.get_tir(**c) if isinstance(c, dict) else self.get_tir(*c)) for c in configs]  # one thread

        def one(i):
            cfg = configs[i]
            try:
                return (self.compile_tir(tirs[i], (), cfg) if isinstance(cfg, dict)
                        else self.compile_tir(tirs[i], cfg))
            except Exception:
                if ignore_error:
                    log.warning("compiling %r failed", cfg, exc_info=True)
                    return None
                raise

        with cf.ThreadPoolExecutor(num_workers or min(len(configs), 8) or 1) as ex:
            return list(ex.map(one, range(len(configs))))

    def build(self, *args, target=None, **kwargs) -> BuildResult:
        """Compile and link without loading (GPU-less machines); see :func:`tilescale.compiler.build`."""
        pf = self.get_tir(*args, **kwargs)
        return build(pf, target=target or self.target, pass_configs=self.pass_configs,
                     compile_flags=self.compile_flags, build_mode=self.build_mode, wait_timeout_s=self.wait_timeout_s)


def jit(func=None, *, out_idx=None, target=None, target_host=None, execution_backend=None, verbose=None,
        pass_configs=None, debug_root_path=None, compile_flags=None, build_mode: str | None = None,
        wait_timeout_s: float | None = None, check_symmetric: bool | None = None):
    """``tilelang.jit`` with tilescale's distributed build path. See the module docstring."""
    if build_mode not in (None, "auto", "inlined", "rdc"):
        raise ValueError(f"build_mode: got {build_mode!r}, expected 'auto', 'inlined' or 'rdc'")
    compile_args = dict(out_idx=out_idx, execution_backend=execution_backend, target=target, target_host=target_host,
                        verbose=verbose, pass_configs=pass_configs, debug_root_path=debug_root_path,
                        compile_flags=compile_flags)

    def decorator(f):
        pf = prim_func(f, eager_jit=True)
        return TileScaleJITImpl(func=pf, **compile_args, func_source=inspect.getsource(pf.orig_func),
                                signature=inspect.signature(pf.orig_func), mode="auto", build_mode=build_mode,
                                wait_timeout_s=wait_timeout_s, check_symmetric=check_symmetric)

    return decorator(func) if func is not None else decorator
