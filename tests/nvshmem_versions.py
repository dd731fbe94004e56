"""The NVSHMEM versions the tests may expect, read from what is installed (never written into a test).

``pip install -e ".[cu13,test]"`` resolves any ``nvidia-nvshmem-cu13>=3.4,<4`` (torch may pin one); .ci/run
may also unpack a second NVSHMEM wheel (the GPU machines' 3.4.5) and name it in TILESCALE_TEST_NVSHMEM_345.
Versions come from the wheels' own metadata, not from tilescale's header parsing (which the tests check).
"""
from __future__ import annotations

import importlib.metadata as md
import os
import re
from pathlib import Path

WHEELS = ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12")
EXTRA_VAR = "TILESCALE_TEST_NVSHMEM_345"


def _xyz(version: str) -> str | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return ".".join(m.groups()) if m else None


def wheel_version(site: Path | None = None) -> str | None:
    """X.Y.Z of the nvidia-nvshmem wheel installed in this environment, or unpacked in `site` (the
    directory holding its ``nvidia/`` and ``*.dist-info``); None when there is none."""
    for name in WHEELS:
        if site is None:
            try:
                return _xyz(md.version(name))
            except md.PackageNotFoundError:
                continue
        for dist in md.distributions(name=name, path=[str(site)]):
            return _xyz(dist.version)
    return None


def extra_install() -> tuple[Path, str] | None:
    """(root, X.Y.Z) of the second NVSHMEM named by TILESCALE_TEST_NVSHMEM_345 (.ci/run: an unpacked wheel,
    ``<dir>/nvidia/nvshmem``), when it is there; its version from the wheel's metadata, else its header."""
    raw = os.environ.get(EXTRA_VAR)
    if not raw:
        return None
    root = Path(raw)
    if not (root / "include" / "nvshmem.h").is_file() or not (root / "lib" / "libnvshmem_host.so.3").is_file():
        return None
    version = wheel_version(root.parent.parent)
    if version is None:
        from tilescale.discovery import read_version

        version = read_version(root / "include")
    return root, version
