"""Execution backends and NVSHMEM build modes, resolved once per kernel from its IR.

A kernel that uses distributed ops (remote put/get, signals, waits, barriers, fences: anything that
lowers to an ``nvshmem*`` or ``tilescale::`` device call) is built by tilelang's ``cython`` backend with
nvcc and linked with NVSHMEM; every other kernel keeps tilelang's default (``tvm_ffi``). Distributed
kernels have build modes: the table in :mod:`tilescale.build_modes` (what each is, its flags, what picks it).

Pass-config keys of the seed: ``tl.disable_rdc`` (True: inlined, False: rdc) and ``tl.use_distributed``
(True: build on the distributed path even without distributed ops; False: refuse distributed ops).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import build_modes, compat
from ..env import check_seconds, settings
from ..errors import BackendError
from ..version import __version__
from . import discovery, toolchain

PASS_DISABLE_RDC = build_modes.PASS_CONFIG
PASS_USE_DISTRIBUTED = "tl.use_distributed"
OUR_PASS_CONFIGS = (PASS_DISABLE_RDC, PASS_USE_DISTRIBUTED)

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"
HEADERS = tuple(sorted((INCLUDE_DIR / "tilescale").glob("*.cuh")))


@dataclass(frozen=True)
class BackendSpec:
    """How one kernel is built: the tilelang execution backend, and for distributed kernels the
    NVSHMEM build mode. Frozen: resolved once, then carried by the compiled kernel."""

    name: str                 # tilelang execution backend: "cython", "tvm_ffi", ...
    distributed: bool         # linked with NVSHMEM through tilescale
    build_mode: str | None    # "inlined" | "rdc" for distributed kernels, else None
    reason: str               # one line: why this choice

    @property
    def execution_backend(self) -> str:
        return self.name


def split_pass_configs(pass_configs: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(pass configs for tilelang, tilescale's own keys). tilelang's PassContext rejects unknown keys."""
    if not pass_configs:
        return pass_configs, {}
    ours = {k: v for k, v in pass_configs.items() if k in OUR_PASS_CONFIGS}
    rest = {k: v for k, v in pass_configs.items() if k not in OUR_PASS_CONFIGS}
    return (rest or None), ours


def _as_bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("0", "1", "true", "false"):
        return v.lower() in ("1", "true")
    raise BackendError(f"pass_configs[{key!r}]: got {v!r}, expected True or False")


def resolve_build_mode(build_mode: str | None = None, ours: dict[str, Any] | None = None,
                       inlined_supported: bool | None = None) -> str:
    """Explicit ``build_mode`` > ``tl.disable_rdc`` > ``TILESCALE_BUILD_MODE`` > auto (inlined if supported)."""
    ours = ours or {}
    check_build_mode(build_mode)
    mode = build_mode if build_mode not in (None, "auto") else None
    if mode is None and PASS_DISABLE_RDC in ours:
        mode = build_modes.by_disable_rdc(_as_bool(PASS_DISABLE_RDC, ours[PASS_DISABLE_RDC])).name
    if mode is None and settings.build_mode != "auto":
        mode = settings.build_mode
    preferred, fallback = build_modes.INLINED, build_modes.RDC
    if mode is None:
        if inlined_supported is None:
            inlined_supported = preferred.supported_by(discovery.find_nvshmem())
        mode = (preferred if inlined_supported else fallback).name
    if mode == preferred.name and inlined_supported is False:
        raise BackendError(f"build_mode '{preferred.name}' needs {preferred.needs}; this install has none: use "
                           f"build_mode='{fallback.name}' or upgrade NVSHMEM")
    return mode


def check_build_mode(build_mode: str | None) -> None:
    """Raise BackendError unless `build_mode` is None, 'auto' or a mode of the table."""
    choices = ("auto", *build_modes.NAMES)
    if build_mode is not None and build_mode not in choices:
        raise BackendError(f"build_mode: got {build_mode!r}, expected one of {', '.join(map(repr, choices))}")


def known_backends() -> tuple[str, ...]:
    """tilelang's execution backends, "auto" first (read from tilelang: :mod:`tilescale.compat`)."""
    return compat.tilelang_execution_backends()


def resolve_backend(func, requested: str | None = "auto", pass_configs: dict[str, Any] | None = None,
                    build_mode: str | None = None) -> BackendSpec:
    """Decide how to build `func` (a tilelang PrimFunc) from its IR and the request."""
    from .analysis import describe_distributed_calls

    requested = requested or "auto"
    known = known_backends()
    if requested not in known:
        raise BackendError(f"execution_backend: got {requested!r}, expected one of {', '.join(known)}")
    _, ours = split_pass_configs(pass_configs)
    calls = describe_distributed_calls(func)
    forced = None
    if PASS_USE_DISTRIBUTED in ours:
        forced = _as_bool(PASS_USE_DISTRIBUTED, ours[PASS_USE_DISTRIBUTED])
    name = _func_name(func)
    if forced is False and calls:
        raise BackendError(f"kernel '{name}' uses distributed ops ({', '.join(calls[:3])}) but "
                           f"pass_configs['{PASS_USE_DISTRIBUTED}'] is False: remove that key or the ops")
    distributed = bool(calls) or forced is True or (forced is None and settings.use_distributed)
    if not distributed:
        if build_mode not in (None, "auto"):
            raise BackendError(f"build_mode={build_mode!r} applies to distributed kernels only; kernel '{name}' "
                               "uses no distributed op")
        return BackendSpec(name=requested if requested != "auto" else "tvm_ffi", distributed=False,
                           build_mode=None, reason="no distributed ops: tilelang's default backend"
                           if requested == "auto" else f"execution_backend={requested!r} requested")
    backend = build_modes.DISTRIBUTED_BACKEND
    if requested not in ("auto", backend):
        what = ", ".join(calls[:3]) if calls else "TILESCALE_USE_DISTRIBUTED / tl.use_distributed"
        raise BackendError(f"execution_backend: got {requested!r} for kernel '{name}', which uses distributed ops "
                           f"({what}); expected '{backend}' or 'auto': only the {backend} backend links NVSHMEM")
    mode = resolve_build_mode(build_mode, ours)
    why = f"distributed ops ({', '.join(calls[:3])})" if calls else "distributed build forced"
    return BackendSpec(name=backend, distributed=True, build_mode=mode, reason=f"{why}: {backend} + NVSHMEM, {mode}")


def resolve_execution_backend(kernel_or_func, requested: str = "auto", *, pass_configs=None) -> str:
    """The tilelang execution backend tilescale uses for a kernel.

    `kernel_or_func`: a compiled kernel (returns the backend it was built with), a tilelang PrimFunc,
    or a ``@tilescale.jit`` function of no arguments.
    """
    be = getattr(kernel_or_func, "execution_backend", None)
    if isinstance(be, str) and hasattr(kernel_or_func, "get_kernel_source"):
        return be
    prim_func = compat.prim_func_class()
    func = kernel_or_func
    if not isinstance(func, prim_func) and hasattr(func, "get_tir"):
        func = func.get_tir()
    if not isinstance(func, prim_func):
        raise BackendError(f"kernel_or_func: got {type(kernel_or_func).__name__}, expected a compiled kernel, "
                           "a tilelang PrimFunc or a @tilescale.jit function")
    return resolve_backend(func, requested, pass_configs).name


def _func_name(func) -> str:
    try:
        return str(func.attrs["global_symbol"])
    except Exception:  # noqa: BLE001
        return getattr(func, "__name__", "kernel")


def header_digest() -> str:
    return toolchain.file_digest(*HEADERS)


def nvshmem_compile_flags(spec: BackendSpec, install, wait_timeout_s: float | None = None) -> list[str]:
    """nvcc flags of a distributed kernel. Single-token forms only (tilelang splits flags on spaces and
    drops tokens already on its command line). The -D tokens put everything that changes the binary
    but is invisible to tilelang's cache key (NVSHMEM version, header contents, mode, timeout, the ranks per
    node of TILESCALE_NODE_SIZE: ops.cuh's peer_ptr_or_null) into it."""
    if not spec.distributed:
        return []
    timeout = settings.wait_timeout_s if wait_timeout_s is None else check_seconds("wait_timeout_s", wait_timeout_s)
    flags = [
        f"-I{INCLUDE_DIR}",
        f"-I{install.include_dir}",
        "-diag-suppress=20013",
        f"-L{install.lib_dir}",
        install.host_library_link_flag,
        f"--linker-options=-rpath,{install.lib_dir}",
        f"-DTILESCALE_VERSION={__version__}",
        f"-DTILESCALE_NVSHMEM={install.version}",
        f"-DTILESCALE_HDR={header_digest()}",
        f"-DTILESCALE_WAIT_TIMEOUT_NS={int(timeout * 1e9)}ull",
        f"-DTILESCALE_NODE_SIZE={settings.node_size}",   # tilescale.topology: 0 = the real topology
        # nvcc runs its host and device passes' preprocessors side by side (for one architecture, nothing else): about
        # 0.4 s less per kernel where a core is free; the same binary
        "--threads=2",
    ]
    mode = build_modes.get(spec.build_mode)
    if mode.link_libraries and not mode.supported_by(install):
        raise BackendError(f"build_mode '{mode.name}' needs {mode.needs}, not found in {install.lib_dir}")
    flags += mode.nvcc_flags
    stub = toolchain.stub_libcuda_dir()
    if stub is not None:
        flags.append(f"-L{stub}")
    return flags
