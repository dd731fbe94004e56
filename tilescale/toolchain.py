"""nvcc, the stub libcuda of GPU-less build machines, and safe builds into the cache directory.

Every artefact tilescale builds itself (the runtime shim, the stub) goes through :func:`build_once`:
one process builds under an exclusive file lock, writes to a temporary name and renames it into
place; every other process waits on the lock and then finds the finished file.
"""
from __future__ import annotations

import contextlib
import ctypes.util
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .env import settings
from .errors import TileScaleError


def nvcc_path() -> str:
    """The nvcc tilelang uses (CUDA_HOME/bin, then PATH)."""
    try:
        from tilelang.contrib.nvcc import get_nvcc_compiler

        p = get_nvcc_compiler()
        if p and os.path.exists(p):
            return p
    except Exception:  # noqa: BLE001  (tilelang raises various errors when CUDA is absent)
        pass
    p = shutil.which("nvcc")
    if p is None:
        raise TileScaleError("nvcc not found: install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, "
                             "or set CUDA_HOME")
    return p


def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=60).stdout
    for line in out.splitlines():
        if "release" in line:
            return line.split("release")[-1].split(",")[0].strip()
    return "unknown"


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive advisory lock on `path` (created if needed); waits up to `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TileScaleError(f"timed out after {timeout_s:.0f} s waiting for the lock {path} "
                                         "(another process is building; remove the file if none is)") from None
                time.sleep(0.05)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it with ``build(tmp_path)`` first if it does not exist yet.
    Safe against concurrent callers (one builds, the others wait) and against torn files."""
    if target.exists():
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            build(Path(tmp))
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return target


def run_nvcc(args: list[str], what: str) -> None:
    cmd = [nvcc_path(), *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise TileScaleError(f"building {what} failed (exit {r.returncode}):\n  {' '.join(cmd)}\n{r.stdout[-4000:]}")


def _libcuda_visible() -> bool:
    if ctypes.util.find_library("cuda"):
        return True
    try:
        from tilelang.contrib.nvcc import get_cuda_library_dirs

        dirs = get_cuda_library_dirs()
    except Exception:  # noqa: BLE001
        dirs = []
    return any((Path(d) / "libcuda.so").exists() for d in dirs)


def stub_libcuda_dir() -> Path | None:
    """On a machine without the CUDA driver, a directory holding an empty ``libcuda.so`` so that
    tilelang's ``-lcuda`` links (the stub never becomes a run-time dependency); None elsewhere."""
    if _libcuda_visible():
        return None
    d = settings.cache_dir / "stubs"
    d.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise TileScaleError("no C compiler (gcc) to build the stub libcuda.so for this GPU-less machine")
        subprocess.run([cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(tmp), "-Wl,-soname,libcuda.so.1"],
                       input=b"", check=True)

    build_once(d / "libcuda.so", build)
    return d


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
