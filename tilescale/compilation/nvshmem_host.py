"""NVSHMEM's host library in this process: loaded once, RTLD_GLOBAL, and asked its version."""
from __future__ import annotations

import ctypes
import os

_handles: dict[str, ctypes.CDLL] = {}


def load_host_library(install) -> ctypes.CDLL:
    """dlopen NVSHMEM's host library with RTLD_GLOBAL (once), so every kernel module's
    ``NEEDED libnvshmem_host.so.3`` resolves to this one copy; point NVSHMEM at its bootstrap plugin."""
    key = str(install.host_library)
    if key not in _handles:
        if install.bootstrap_uid is not None:
            os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_PLUGIN", str(install.bootstrap_uid))
        _handles[key] = ctypes.CDLL(key, mode=ctypes.RTLD_GLOBAL)
    return _handles[key]


def host_library_version(install) -> str:
    """NVSHMEM version ("3.4.5") reported by the host library itself: dlopen it (nothing is built
    or initialised) and call ``nvshmemx_vendor_get_version_info``. (``nvshmem_info_get_version``
    reports the OpenSHMEM specification version, 1.3, not NVSHMEM's.)"""
    key = "NVSHMEM_BOOTSTRAP_UID_PLUGIN"
    before = os.environ.get(key)
    try:
        lib = load_host_library(install)
    finally:  # load_host_library points NVSHMEM at the plugin for a run; the doctor starts none
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    fn = getattr(lib, "nvshmemx_vendor_get_version_info", None)
    if fn is None:
        raise OSError(f"{install.host_library} exports no nvshmemx_vendor_get_version_info "
                      "(not an NVSHMEM >= 2 host library?)")
    fn.restype = None
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3
    a, b, c = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(-1)
    fn(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return f"{a.value}.{b.value}.{c.value}"
