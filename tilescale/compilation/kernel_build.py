"""How tilescale has tilelang build and load a kernel: backend resolution, the distributed build's flags,
one compile of a kernel at a time across processes, tilelang's cache kept private, nvcc bounded and its
errors explained. :func:`compile_kernel` returns tilelang's own kernel object; ``tilescale.compile`` wraps
a distributed one (:class:`tilescale.distributed_kernel.DistributedKernel`)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from .. import build_modes, compat, logs
from ..env import settings
from ..errors import BuildError
from . import codegen
from .arch import check_target_arch, default_target
from .backend import BackendSpec, nvshmem_compile_flags, resolve_backend, split_pass_configs
from .cache_files import file_lock, private_dir, tilelang_cache_dir
from .discovery import find_nvshmem
from .nvshmem_host import load_host_library
from .toolchain import (
    NvccTimeoutError,
    bounded_nvcc,
    check_no_whitespace,
    nvcc_version_tag,
    source_digest,
    stub_libcuda_dir,
)


def func_name(func) -> str:
    try:
        return str(func.attrs["global_symbol"])
    except Exception:  # noqa: BLE001
        return "kernel"


def key_flags() -> list[str]:
    """-D tokens that put into the kernel cache key (tilelang's key holds the compile flags) what changes a
    distributed kernel's binary but is invisible to tilelang: the nvcc build, and the content of tilescale's
    source rewriting (codegen.py) and headers. (The NVSHMEM version and paths, header digest, build mode,
    wait timeout are in nvshmem_compile_flags; the arch is in tilelang's key.)"""
    return [f"-DTILESCALE_NVCC={nvcc_version_tag()}", f"-DTILESCALE_SRC={source_digest()}"]


def as_flag_list(compile_flags) -> list[str]:
    return [compile_flags] if isinstance(compile_flags, str) else list(compile_flags or [])


def prepare_distributed(func, spec: BackendSpec, compile_flags, wait_timeout_s) -> list[str]:
    """The nvcc flags of a distributed kernel (the caller's, then tilescale's), with NVSHMEM's host library
    loaded: kernel modules' NEEDED libnvshmem_host resolves to this copy."""
    install = find_nvshmem()
    ours = nvshmem_compile_flags(spec, install, wait_timeout_s) + key_flags()
    check_no_whitespace(ours, f" (NVSHMEM {install.version} from {install.root})")
    load_host_library(install)
    return as_flag_list(compile_flags) + ours


def with_stub_libcuda(compile_flags) -> list[str] | str | None:
    """tilelang's cython build links -lcuda: on a GPU-less machine, `compile_flags` plus the stub's directory."""
    stub = stub_libcuda_dir()
    if stub is None:
        return compile_flags
    check_no_whitespace([f"-L{stub}"])
    return as_flag_list(compile_flags) + [f"-L{stub}"]


def private_tilelang_cache() -> None:
    """tilelang's kernel cache, where tilescale.compile's kernels are loaded from: refuse it (root, namespace,
    kernels and staging directories) if others could write it; create missing parts 0700 before tilelang
    does (it would make them 0755)."""
    try:
        if not compat.tilelang_cache_enabled():
            return
    except Exception:  # noqa: BLE001
        pass
    root = tilelang_cache_dir()
    dirs = [root]
    try:
        dirs += [Path(d) for d in compat.tilelang_cache_dirs()]
    except Exception:  # noqa: BLE001  (another tilelang layout: the root alone)
        pass
    for d in dirs:
        private_dir(d, root=root)


@contextlib.contextmanager
def one_compile_at_a_time(func, target, backend, flags, pass_configs, out_idx):
    """Processes that compile the same kernel at the same time (every rank of a job at its first call, the
    jobs of a test run) take turns: the first one compiles it into tilelang's kernel cache, the others then
    find it there instead of each running nvcc on the same source. Only with tilelang's disk cache on
    (without it every process compiles its own, side by side)."""
    try:
        cached = compat.tilelang_cache_enabled()
    except Exception:  # noqa: BLE001
        cached = False
    if not cached:
        yield
        return
    import tilelang

    data = {"func": hashlib.sha256(func.script(show_meta=True).encode()).hexdigest(), "target": str(target),
            "backend": str(backend), "flags": flags if isinstance(flags, str) else list(flags or []),
            "pass_configs": pass_configs or {}, "out_idx": out_idx, "tilelang": tilelang.__version__}
    key = hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:32]
    wait = settings.nvcc_timeout_s + 600.0 if settings.nvcc_timeout_s > 0 else 7 * 24 * 3600.0
    with file_lock(settings.cache_dir / "compiling" / f"{key}.lock", timeout_s=wait):
        yield


def remove_temporaries(files) -> None:
    """Remove those of `files` that tilelang's library builds leave in TMPDIR: named tmp* directly in the temporary
    directory (its ``tmp*.cu`` source and ``tmp*.so`` library). Anything else, a library of a cache included, is
    left alone."""
    tmp = os.path.realpath(tempfile.gettempdir())
    for f in files:
        if f and os.path.dirname(os.path.realpath(f)) == tmp and os.path.basename(f).startswith("tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)


def failed_compile_files(msg: str) -> set[str]:
    """The temporaries of a failed ``LibraryGenerator.compile_lib``: it records its source and library paths
    only after a successful nvcc run, but its error ("Compilation Failed! [command]") names both. Only files
    named tmp* directly in the temporary directory (where tilelang creates them) are returned."""
    first = msg.split("\n", 1)[0]
    if not first.startswith("Compilation Failed!"):
        return set()
    tmp = os.path.realpath(tempfile.gettempdir())
    return {f for f in re.findall(r"'([^']+\.(?:cu|so))'", first)
            if os.path.dirname(os.path.realpath(f)) == tmp and os.path.basename(f).startswith("tmp")}


_NVCC_ERROR = re.compile(r"\(\d+\): (error|catastrophic error)|fatal error|undefined reference|"
                         r"ptxas (error|fatal)|nvlink (error|fatal)|nvcc fatal")


@contextlib.contextmanager
def explain_build_errors(name: str, spec: BackendSpec):
    """nvcc failures of distributed kernels: the compiler's error lines and the NVSHMEM in use, instead of
    tilelang's dump of the whole generated file."""
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


def compile_kernel(func, out_idx=None, execution_backend=None, target=None, target_host=None, verbose=None,
                   pass_configs=None, compile_flags=None, *, build_mode: str | None = None,
                   wait_timeout_s: float | None = None):
    """(tilelang's compiled kernel, how it was built) for PrimFunc `func`: tilelang's build unchanged for a
    kernel without distributed ops, else the distributed build (cython backend, NVSHMEM, the build mode)."""
    from tilelang.jit import compile as tl_compile

    logs.apply()
    tl_pc, _ = split_pass_configs(pass_configs)
    spec = resolve_backend(func, execution_backend, pass_configs, build_mode)
    target = default_target(target)
    check_target_arch(target, func_name(func))  # before tilelang loads the kernel
    private_tilelang_cache()
    if not spec.distributed:
        if spec.name == "cython":   # tilelang's cython build links -lcuda
            compile_flags = with_stub_libcuda(compile_flags)
        with one_compile_at_a_time(func, target, execution_backend, compile_flags, tl_pc, out_idx):
            return tl_compile(func, out_idx=out_idx, execution_backend=execution_backend, target=target,
                              target_host=target_host, verbose=verbose, pass_configs=tl_pc,
                              compile_flags=compile_flags), spec
    flags = prepare_distributed(func, spec, compile_flags, wait_timeout_s)
    backend = build_modes.DISTRIBUTED_BACKEND
    with one_compile_at_a_time(func, target, backend, flags, tl_pc, out_idx), \
            codegen.distributed_build(spec.build_mode), explain_build_errors(func_name(func), spec), \
            bounded_nvcc(f"distributed kernel '{func_name(func)}'"):
        # tilelang's JIT build leaves its source and a library of a megabyte or more in TMPDIR on every build:
        # removed once the library is loaded (a mapped library outlives its name; tilelang's cache holds its copy)
        # or the build failed (its error names them). A library that fails to load after a build is left there:
        # tilelang names it nowhere then.
        try:
            kernel = tl_compile(func, out_idx=out_idx, execution_backend=backend, target=target,
                                target_host=target_host, verbose=verbose, pass_configs=tl_pc, compile_flags=flags)
        except RuntimeError as e:
            remove_temporaries(failed_compile_files(str(e)))
            raise
        adapter = getattr(kernel, "adapter", None)
        remove_temporaries([getattr(adapter, "srcpath", None), getattr(adapter, "libpath", None)])
        return kernel, spec
