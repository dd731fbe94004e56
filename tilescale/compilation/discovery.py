"""Finding NVSHMEM: headers, host library, device library, bootstrap plugin, version.

Order (first hit wins):
  1. ``$NVSHMEM_HOME`` (``include/`` and ``lib/`` below it);
  2. ``3rdparty/nvshmem_src/build`` of this checkout (a source build; see 3rdparty/README.md);
  3. the pip wheel ``nvidia-nvshmem-cu13`` or ``nvidia-nvshmem-cu12`` (package ``nvidia.nvshmem``).

    >>> from tilescale.discovery import find_nvshmem
    >>> nv = find_nvshmem()
    >>> nv.version, nv.include_dir, nv.host_library
"""
from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from ..env import settings
from ..errors import NvshmemNotFoundError

REPO_ROOT = Path(__file__).resolve().parents[2]
THIRDPARTY_BUILD = REPO_ROOT / "3rdparty" / "nvshmem_src" / "build"

PIP_HINT = ("pip install nvidia-nvshmem-cu13   (CUDA 13; or nvidia-nvshmem-cu12 for CUDA 12: the one your torch "
            "requires), or point NVSHMEM_HOME at an NVSHMEM install")


@dataclass(frozen=True)
class NvshmemInstall:
    """One NVSHMEM installation, as found by :func:`find_nvshmem`."""

    source: str            # "NVSHMEM_HOME", "3rdparty", "pip:nvidia-nvshmem"
    root: Path
    include_dir: Path
    lib_dir: Path
    host_library: Path     # libnvshmem_host.so.3 (or .so)
    device_library: Path | None  # libnvshmem_device.a (needed by the RDC build mode)
    bootstrap_uid: Path | None   # nvshmem_bootstrap_uid.so.3 (unique-id bootstrap plugin)
    version: str           # "3.4.5", read from the headers

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        return tuple(int(x) for x in self.version.split("."))  # type: ignore[return-value]

    @property
    def supports_inlined(self) -> bool:
        """NVSHMEM's non-RDC inlined mode (NVSHMEM_ENABLE_ALL_DEVICE_INLINING) is in the headers."""
        opts = self.include_dir / "non_abi" / "nvshmem_build_options.h"
        common = self.include_dir / "non_abi" / "device" / "common" / "nvshmemi_common_device.cuh"
        for f in (opts, common):
            try:
                if "NVSHMEM_ENABLE_ALL_DEVICE_INLINING" in f.read_text(errors="replace"):
                    return True
            except OSError:
                pass
        return False

    @property
    def collectives_separable(self) -> bool:
        """The headers have the layout that tilescale/module.cuh relies on to build a kernel without NVSHMEM's
        collective API (codegen.py): the include guards it defines, the barrier templates it includes, and
        nvshmem_barrier_all / nvshmem_sync_all defined on them as module.cuh defines them then. Any other layout
        (another NVSHMEM release) builds every kernel with the whole API."""
        return _collectives_separable(self.include_dir)

    @property
    def host_library_link_flag(self) -> str:
        """-l flag that links the host library by file name (wheels ship no unversioned .so)."""
        return f"-l:{self.host_library.name}"


_VERSION_RE = {k: re.compile(rf"#define\s+NVSHMEM_VENDOR_{k}_VERSION\s+(\d+)") for k in ("MAJOR", "MINOR", "PATCH")}


def read_version(include_dir: Path) -> str:
    """NVSHMEM version from ``include/non_abi/nvshmem_version.h`` (or ``nvshmem_version.h``)."""
    for cand in (include_dir / "non_abi" / "nvshmem_version.h", include_dir / "nvshmem_version.h"):
        if cand.is_file():
            text = cand.read_text(errors="replace")
            parts = []
            for k in ("MAJOR", "MINOR", "PATCH"):
                m = _VERSION_RE[k].search(text)
                if m is None:
                    break
                parts.append(m.group(1))
            if len(parts) == 3:
                return ".".join(parts)
    raise NvshmemNotFoundError(f"NVSHMEM headers in {include_dir} carry no version "
                               "(non_abi/nvshmem_version.h missing or unreadable)")


def _probe(source: str, root: Path, include_dir: Path, lib_dir: Path) -> tuple[NvshmemInstall | None, str]:
    """An install at these directories, or (None, why not)."""
    if not (include_dir / "nvshmem.h").is_file():
        return None, f"no {include_dir / 'nvshmem.h'}"
    host = None
    for name in ("libnvshmem_host.so.3", "libnvshmem_host.so"):
        if (lib_dir / name).exists():
            host = lib_dir / name
            break
    if host is None:
        return None, f"no libnvshmem_host.so.3 in {lib_dir}"
    dev = lib_dir / "libnvshmem_device.a"
    uid = lib_dir / "nvshmem_bootstrap_uid.so.3"
    if not uid.exists():
        uid = lib_dir / "nvshmem_bootstrap_uid.so"
    return NvshmemInstall(source=source, root=root, include_dir=include_dir, lib_dir=lib_dir, host_library=host,
                          device_library=dev if dev.exists() else None,
                          bootstrap_uid=uid if uid.exists() else None,
                          version=read_version(include_dir)), ""


def _candidates() -> list[tuple[str, Path, Path, Path]]:
    cands = []
    home = settings.nvshmem_home
    if home:
        h = Path(home).expanduser()
        cands.append(("NVSHMEM_HOME", h, h / "include", h / "lib"))
    b = THIRDPARTY_BUILD
    cands.append(("3rdparty", b, b / "src" / "include", b / "src" / "lib"))
    cands.append(("3rdparty", b, b / "include", b / "lib"))
    spec = None
    try:
        spec = importlib.util.find_spec("nvidia.nvshmem")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc)
            cands.append(("pip:nvidia-nvshmem", p, p / "include", p / "lib"))
    else:
        cands.append(("pip:nvidia-nvshmem", Path("<site-packages>/nvidia/nvshmem"),
                      Path("<site-packages>/nvidia/nvshmem/include"), Path("<site-packages>/nvidia/nvshmem/lib")))
    return cands


@functools.lru_cache(maxsize=8)
def _find_cached(key: tuple) -> NvshmemInstall:
    looked = []
    for source, root, inc, lib in _candidates():
        inst, why = _probe(source, root, inc, lib)
        if inst is not None:
            return inst
        looked.append(f"  - {source}: {why}")
    raise NvshmemNotFoundError("NVSHMEM not found. Looked in, in order:\n" + "\n".join(looked) +
                               f"\nTo fix: {PIP_HINT}")


def find_nvshmem() -> NvshmemInstall:
    """The NVSHMEM installation to use; raises :class:`NvshmemNotFoundError` listing every place looked."""
    if not settings.use_nvshmem:
        raise NvshmemNotFoundError("NVSHMEM is switched off (TILESCALE_USE_NVSHMEM=0 or TILELANG_USE_NVSHMEM=0); "
                                   "distributed kernels need it: unset the variable")
    # Key on what decides the answer, so a changed environment is seen without an import-time read.
    try:
        spec = importlib.util.find_spec("nvidia.nvshmem")
        locs = tuple(spec.submodule_search_locations or ()) if spec else ()
    except (ImportError, ValueError):
        locs = ()
    return _find_cached((settings.nvshmem_home, THIRDPARTY_BUILD.exists(), locs))


def clear_cache() -> None:
    _find_cached.cache_clear()


# What tilescale/module.cuh relies on to leave NVSHMEM's collective API out of a kernel that calls none: the include
# guard of each header it skips (defined before nvshmem.h), and the definitions it gives nvshmem_barrier_all and
# nvshmem_sync_all instead (the same as in the skipped header, on the barrier templates of coll/barrier.cuh).
COLLECTIVE_GUARDS = {"device/nvshmem_coll_defines.cuh": "_NVSHMEM_COLL_DEFINES_CUH_",
                     "device/nvshmemx_coll_defines.cuh": "_NVSHMEMX_COLL_DEFINES_CUH_",
                     "non_abi/device/coll/defines.cuh": "_NVSHMEMI_DEVICE_COLL_DEFINES_H_"}
_BARRIER_DEFINITIONS = [re.compile(r"void\s+nvshmem_barrier_all\(\)\s*\{\s*nvshmemi_barrier_threadgroup"
                                   r"<nvshmemi_threadgroup_thread>\(NVSHMEM_TEAM_WORLD\);\s*\}"),
                        re.compile(r"void\s+nvshmem_sync_all\(\)\s*\{\s*nvshmemi_sync_threadgroup"
                                   r"<nvshmemi_threadgroup_thread>\(NVSHMEM_TEAM_WORLD\);\s*\}")]


def _collectives_separable(include_dir: Path) -> bool:
    try:
        texts = {name: (include_dir / name).read_text(errors="replace")
                 for name in [*COLLECTIVE_GUARDS, "non_abi/device/coll/barrier.cuh"]}
    except OSError:
        return False
    guarded = all(re.search(rf"^#ifndef\s+{g}\s*$", texts[f], re.M) for f, g in COLLECTIVE_GUARDS.items())
    barrier = texts["non_abi/device/coll/barrier.cuh"]
    templates = all(re.search(rf"\b{t}\s*\(\s*nvshmem_team_t", barrier)
                    for t in ("nvshmemi_barrier_threadgroup", "nvshmemi_sync_threadgroup"))
    defined = all(p.search(texts["device/nvshmem_coll_defines.cuh"]) for p in _BARRIER_DEFINITIONS)
    return guarded and templates and defined
