"""What tilescale can make of a kernel without a GPU: its CUDA source (:func:`lower_source`) and its linked
library (:func:`build`, ``tilescale.build``), neither loaded. The path for build machines without a driver,
where tilelang's load step (cudaFuncSetAttribute) cannot run."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import compat, logs
from ..env import settings
from ..version import __version__
from . import codegen
from .arch import default_target
from .backend import BackendSpec, resolve_backend, split_pass_configs
from .cache_files import build_once, private_dir, record_path, why_invalid, write_atomically
from .kernel_build import (
    as_flag_list,
    explain_build_errors,
    failed_compile_files,
    func_name,
    prepare_distributed,
    with_stub_libcuda,
)
from .toolchain import bounded_nvcc, nvcc_version_tag


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build` produced without loading it (GPU-less machines)."""

    spec: BackendSpec
    source: str          # the device source, as compiled
    library: str         # path of the built .so
    flags: tuple


def build(func, target=None, pass_configs=None, compile_flags=None, *, build_mode: str | None = None,
          wait_timeout_s: float | None = None, verbose: bool = False) -> BuildResult:
    """Lower, generate and link a distributed kernel into a .so without loading it: the path for build
    machines without a driver, where tilelang's load step (cudaFuncSetAttribute) cannot run.

    Built once: the library, the source tilelang compiled (``kernel_lib.cu`` beside it) and the device
    source are kept in ``TILESCALE_CACHE_DIR/kernels/<key>/`` (the key: the IR, target, pass configs, flags
    (NVSHMEM, header and codegen digests, build mode, timeout), nvcc build, tilelang and tilescale), and a
    later build of the same kernel returns them without lowering or running nvcc. Nothing is left in TMPDIR."""
    from tvm.target import Target

    logs.apply()
    tl_pc, _ = split_pass_configs(pass_configs)
    spec = resolve_backend(func, "auto", pass_configs, build_mode)
    tgt = Target(default_target(target) or {"kind": "cuda", "arch": "sm_90a"}, "c")
    if spec.distributed:
        flags = prepare_distributed(func, spec, compile_flags, wait_timeout_s)
    else:  # tilelang's library build links -lcuda: on a GPU-less machine, against the stub
        flags = as_flag_list(with_stub_libcuda(compile_flags))
        flags.append(f"-DTILESCALE_NVCC={nvcc_version_tag()}")
    cfg = dict(tl_pc or {})
    key = _build_key(func, tgt, cfg, flags, spec)
    entry = private_dir(settings.cache_dir / "kernels" / key)
    lib, host_src, dev_src = entry / "kernel_lib.so", entry / "kernel_lib.cu", entry / "device_kernel.cu"

    def make(tmp: Path) -> None:
        source, host = _build_library(func, spec, tgt, cfg, flags, verbose, tmp)
        write_atomically(host_src, host.encode())      # before the library is published: a valid library has both
        write_atomically(dev_src, source.encode())

    if why_invalid(lib) is None and not (host_src.is_file() and dev_src.is_file()):
        record_path(lib).unlink(missing_ok=True)   # companions lost: rebuild the entry
    build_once(lib, make)
    return BuildResult(spec=spec, source=dev_src.read_text(), library=str(lib), flags=tuple(flags))


def _build_key(func, tgt, cfg: dict, flags: list, spec: BackendSpec) -> str:
    try:
        base = compat.tilelang_cache_base_key()   # tilelang's version and a hash of its native libraries
    except Exception:  # noqa: BLE001
        import tilelang

        base = {"version": tilelang.__version__}
    data = {"func": hashlib.sha256(func.script(show_meta=True).encode()).hexdigest(), "target": str(tgt),
            "pass_configs": cfg, "flags": list(flags), "backend": spec.name, "build_mode": spec.build_mode,
            "nvcc": nvcc_version_tag(), "tilescale": __version__, "tilelang": base}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def _build_library(func, spec: BackendSpec, tgt, cfg: dict, flags: list, verbose: bool, out: Path):
    """Lower `func`, generate its library source and compile it with tilelang's nvcc command into `out`;
    returns (device source, library source). tilelang's temporaries in TMPDIR are removed."""
    from tilelang import tvm

    wrapper_class, generator_class = compat.library_builders()
    with codegen.distributed_build(spec.build_mode or "inlined") if spec.distributed else contextlib.nullcontext():
        with tvm.transform.PassContext(opt_level=3, config=cfg), tgt:
            art = compat.lower(func, tgt)
        w = wrapper_class(tgt)
        w.assign_optimized_module(tvm.IRModule({"main": func}))
        w.assign_pass_configs(cfg)
        w.assign_host_module(art.host_mod)
        w.assign_device_module(art.device_mod)
        g = generator_class(tgt, verbose=verbose)
        g.assign_pass_configs(cfg)
        g.assign_compile_flags(flags)
        g.update_lib_code(w.wrap(art.kernel_source))
        with explain_build_errors(func_name(func), spec), bounded_nvcc(f"kernel '{func_name(func)}'"):
            made: set[str] = set()
            try:
                g.compile_lib()
                shutil.copyfile(g.libpath, out)
            except RuntimeError as e:
                made |= failed_compile_files(str(e))
                raise
            finally:
                for f in {x for x in (g.srcpath, g.libpath, *made) if x}:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f)
    return art.kernel_source, g.lib_code


def lower_source(func, target=None, build_mode: str = "inlined") -> str:
    """The CUDA source tilescale generates for `func`, without running nvcc (fast; for inspection and
    golden tests)."""
    from tilelang import tvm
    from tvm.target import Target

    spec = resolve_backend(func, "auto", None, None)
    tgt = Target(default_target(target) or {"kind": "cuda", "arch": "sm_90a"})
    ctx = codegen.distributed_build(build_mode) if spec.distributed else contextlib.nullcontext()
    with ctx, tvm.transform.PassContext(opt_level=3), tgt:
        return compat.lower(func, tgt).kernel_source
