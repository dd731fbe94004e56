"""nvcc, the stub libcuda of GPU-less build machines, and safe builds into the cache directory.

Every artefact tilescale builds itself (the runtime shim, the stub) goes through :func:`build_once`:
one process builds under an exclusive file lock, writes to a temporary name and renames it into
place; every other process waits on the lock and then finds the finished file. Next to each artefact
a record ``<name>.sha256`` (size and SHA-256, written after the build) lets every later use verify the
file: a truncated, overwritten or half-published artefact is rebuilt, with a warning, instead of being
loaded. (Kernels compiled through tilelang live in tilelang's own cache, which keeps a manifest of
sizes and hashes per entry and recompiles an entry that fails it: tests/test_cache.py covers both.)
"""
from __future__ import annotations

import contextlib
import ctypes.util
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .env import settings
from .errors import TileScaleError

log = logging.getLogger("tilescale")


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


RECORD_SUFFIX = ".sha256"


def record_path(target: Path) -> Path:
    """The record of `target`: its size and SHA-256, written once `target` is built."""
    return target.with_name(target.name + RECORD_SUFFIX)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def why_invalid(target: Path) -> str | None:
    """None if `target` exists and matches its record; else what is wrong ("missing" if not built)."""
    try:
        actual = target.stat().st_size
    except FileNotFoundError:
        return "missing"
    try:
        fields = record_path(target).read_text().split()
    except FileNotFoundError:
        return "it has no record of a finished build (a build that was interrupted, or an older tilescale)"
    except OSError as e:
        return f"its record is unreadable ({e})"
    if len(fields) != 2 or not fields[0].isdigit():
        return f"its record {record_path(target).name} is corrupt"
    size, digest = int(fields[0]), fields[1]
    if actual != size:
        return f"its size is {actual} bytes, the build wrote {size} (truncated or overwritten)"
    if _sha256(target) != digest:
        return "its content differs from what the build wrote (corrupted or overwritten)"
    return None


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it with ``build(tmp_path)`` first if it does not exist yet or fails its
    record (see the module docstring). Safe against concurrent callers (one builds, the others wait)
    and against torn files: the artefact, then its record, are renamed into place after the build."""
    if why_invalid(target) is None:
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        why = why_invalid(target)  # another process may have built it while this one waited
        if why is None:
            return target
        if why != "missing":
            log.warning("tilescale: cached %s is invalid: %s; rebuilding it", target, why)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        rec_tmp = Path(tmp + RECORD_SUFFIX)
        try:
            build(Path(tmp))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            _write_durably(rec_tmp, f"{os.path.getsize(tmp)} {_sha256(Path(tmp))}\n".encode())
            os.replace(tmp, target)
            os.replace(rec_tmp, record_path(target))
            with contextlib.suppress(OSError):
                dfd = os.open(target.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        finally:
            for t in (tmp, rec_tmp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(t)
        why = why_invalid(target)
        if why is not None:
            raise TileScaleError(f"building {target} did not give a valid file: {why}")
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
