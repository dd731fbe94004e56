"""nvcc (found, versioned, bounded in time), the stub libcuda of GPU-less build machines, and the digests of
tilescale's own sources that go into kernel cache keys.

nvcc runs bounded by ``TILESCALE_NVCC_TIMEOUT_S`` (:func:`run_bounded`; tilelang's nvcc runs too, while
tilescale builds a kernel: :func:`bounded_nvcc`), in its own process group, killed whole on expiry.
Artefacts are written into the cache through :mod:`tilescale.cache_files` (:func:`write_once`,
:func:`build_once`, :func:`private_dir`: importable from here too).
"""
from __future__ import annotations

import contextlib
import ctypes.util
import functools
import hashlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .. import compat
from ..env import settings
from ..errors import BuildError, TileScaleError
from .cache_files import RECORD_SUFFIX as RECORD_SUFFIX
from .cache_files import UnsafeCacheDirError as UnsafeCacheDirError
from .cache_files import build_once as build_once
from .cache_files import check_private_file as check_private_file
from .cache_files import file_lock as file_lock
from .cache_files import private_dir as private_dir
from .cache_files import record_path as record_path
from .cache_files import tilelang_cache_dir as tilelang_cache_dir
from .cache_files import why_invalid as why_invalid
from .cache_files import write_atomically as write_atomically
from .cache_files import write_once as write_once

log = logging.getLogger("tilescale")


def nvcc_path() -> str:
    """The nvcc tilelang uses (CUDA_HOME/bin, then PATH)."""
    try:
        p = compat.nvcc_compiler()
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
    """The release of the nvcc tilelang uses, e.g. ``13.0``."""
    out = _nvcc_version_output(nvcc_path())
    for line in out.splitlines():
        if "release" in line:
            return line.split("release")[-1].split(",")[0].strip()
    return "unknown"


def nvcc_version_tag() -> str:
    """What identifies the nvcc in use for the kernel caches' keys: its full build (``V13.0.88``) and a hash
    of its whole ``--version`` output (two builds of one release differ there), e.g. ``13.0.88-1a2b3c4d``."""
    try:
        out = _nvcc_version_output(nvcc_path())
    except (TileScaleError, OSError, subprocess.SubprocessError):
        return "no-nvcc"
    build = next((w[1:].rstrip(",") for ln in out.splitlines() if "release" in ln for w in ln.split()
                  if w.startswith("V") and w[1:2].isdigit()), "unknown")
    return f"{build}-{hashlib.sha256(out.encode()).hexdigest()[:8]}"


@functools.lru_cache(maxsize=8)
def _nvcc_version_output_cached(path: str, mtime_ns: int) -> str:
    r = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return r.stdout


def _nvcc_version_output(path: str) -> str:
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        mtime = 0
    return _nvcc_version_output_cached(path, mtime)


_PKG = Path(__file__).resolve().parent.parent   # the tilescale package


def source_digest() -> str:
    """Hash of the tilescale code that shapes a distributed kernel's binary beyond the IR and the flags:
    the source rewriting (compilation/codegen.py) and every header under tilescale/include (recursively)."""
    files = [_PKG / "compilation" / "codegen.py", *sorted(p for p in (_PKG / "include").rglob("*") if p.is_file())]
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(_PKG)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def check_no_whitespace(flags, what: str = "") -> None:
    """tilelang splits compile flags on whitespace: refuse a flag whose path has any, clearly, instead of
    letting it become several nvcc arguments."""
    for f in flags:
        if any(c.isspace() for c in str(f)):
            raise TileScaleError(
                f"cannot pass the nvcc flag {f!r}{what}: the path in it contains whitespace, and tilelang splits "
                "compile flags on whitespace (it would reach nvcc as several arguments). Use paths without "
                "spaces: e.g. a symlink without spaces to the NVSHMEM install (`ln -s '<path>' ~/nvshmem`) "
                "set as NVSHMEM_HOME, or TILESCALE_CACHE_DIR without spaces")


class NvccTimeoutError(BuildError):
    """nvcc ran longer than TILESCALE_NVCC_TIMEOUT_S and was stopped."""


def _kill_group(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        p.kill()


def _built_file(cmd) -> str:
    srcs = [str(a) for a in cmd if str(a).endswith((".cu", ".cpp", ".c"))]
    return srcs[0] if srcs else shlex.join(str(a) for a in cmd)


def run_bounded(cmd: list, what: str, timeout_s: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)`` (argument list, no shell) in a process group of its own, stopped
    whole (nvcc and its cicc/ptxas/gcc) after `timeout_s` (default TILESCALE_NVCC_TIMEOUT_S; 0: no limit),
    raising :class:`NvccTimeoutError` that names `what` and the file being built."""
    timeout = settings.nvcc_timeout_s if timeout_s is None else timeout_s
    kwargs.pop("timeout", None)
    kwargs.pop("check", None)
    inp = kwargs.pop("input", None)
    if inp is not None:
        kwargs["stdin"] = subprocess.PIPE
    p = subprocess.Popen([str(a) for a in cmd], start_new_session=True, **kwargs)
    try:
        out, err = p.communicate(inp, timeout=timeout or None)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        p.communicate()
        raise NvccTimeoutError(
            f"nvcc did not finish building {what} ({_built_file(cmd)}) within {timeout:g} s and was stopped "
            f"(TILESCALE_NVCC_TIMEOUT_S={timeout:g}). A kernel that compiles this long is unusual: check the "
            "machine's load; raise TILESCALE_NVCC_TIMEOUT_S (0 = no limit) if it really needs longer") from None
    except BaseException:
        _kill_group(p)
        p.wait()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def run_nvcc(args: list[str], what: str) -> None:
    """nvcc with `args` (a list: paths with spaces stay one argument), bounded by TILESCALE_NVCC_TIMEOUT_S."""
    cmd = [nvcc_path(), *[str(a) for a in args]]
    r = run_bounded(cmd, what, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise TileScaleError(f"building {what} failed (exit {r.returncode}):\n  {shlex.join(cmd)}\n{r.stdout[-4000:]}")


# tilelang runs nvcc itself (jit/adapter/libgen.py: subprocess.run, no timeout on its cython path), and
# tilescale does not patch tilelang. Instead, while a build block is open (bounded_nvcc), a reaper thread
# stops every nvcc child of this process (and what it started: cicc, ptxas, the host compiler) that has run
# longer than TILESCALE_NVCC_TIMEOUT_S; tilelang's build then fails, and bounded_nvcc raises
# NvccTimeoutError for it.
_reaper_lock = threading.Lock()
_reaper_cv = threading.Condition(_reaper_lock)
_reaper_open = 0                              # build blocks open (any thread)
_reaper_thread: threading.Thread | None = None
_reaped: list[tuple[float, int, str]] = []    # (monotonic time, pid, command) of each nvcc stopped


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, start time in seconds since boot) of every process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        out[int(d)] = (int(f[1]), comm, int(f[19]) / tick)
    return out


def _reap_overdue(limit_s: float) -> None:
    procs = _proc_table()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    me = os.getpid()
    for pid, (ppid, comm, start) in procs.items():
        if ppid != me or not comm.startswith("nvcc") or uptime - start <= limit_s:
            continue
        family, todo = [pid], [pid]
        while todo:
            p = todo.pop()
            kids = [c for c, (pp, _, _) in procs.items() if pp == p]
            family += kids
            todo += kids
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = comm
        for p in reversed(family):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        with _reaper_lock:
            _reaped.append((time.monotonic(), pid, cmd.strip()))
        log.warning("tilescale: stopped nvcc (pid %d) after %.0f s (TILESCALE_NVCC_TIMEOUT_S): %s", pid,
                    uptime - start, cmd[:300])


def _reaper() -> None:
    while True:
        with _reaper_cv:
            while _reaper_open == 0:
                _reaper_cv.wait()
        limit = settings.nvcc_timeout_s
        if limit > 0:
            with contextlib.suppress(Exception):   # never let the reaper die
                _reap_overdue(limit)
        time.sleep(0.5)


@contextlib.contextmanager
def bounded_nvcc(what: str) -> Iterator[None]:
    """Within this block, an nvcc run by tilelang for this process is stopped after TILESCALE_NVCC_TIMEOUT_S
    (0: no limit); a build that failed because of it raises NvccTimeoutError naming `what`."""
    global _reaper_open, _reaper_thread
    t0 = time.monotonic()
    with _reaper_cv:
        _reaper_open += 1
        if _reaper_thread is None:
            _reaper_thread = threading.Thread(target=_reaper, name="tilescale-nvcc-reaper", daemon=True)
            _reaper_thread.start()
        _reaper_cv.notify_all()
    try:
        yield
    except BaseException as e:
        with _reaper_lock:
            stopped = [c for t, _, c in _reaped if t >= t0]
        if stopped:
            limit = settings.nvcc_timeout_s
            cmd = stopped[-1].split()
            tmp = os.path.realpath(tempfile.gettempdir())
            made = [a for a in cmd if a.endswith((".cu", ".cpp"))]
            made += [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "-o"]
            for f in made:   # tilelang's temporaries of the stopped run (it leaves them when nvcc fails)
                if os.path.dirname(os.path.realpath(f)) == tmp:
                    with contextlib.suppress(OSError):
                        os.unlink(f)
            raise NvccTimeoutError(
                f"nvcc did not finish building {what} ({_built_file(stopped[-1].split())}) within {limit:g} s and "
                f"was stopped (TILESCALE_NVCC_TIMEOUT_S={limit:g}). A kernel that compiles this long is "
                "unusual: check the machine's load; raise TILESCALE_NVCC_TIMEOUT_S (0 = no limit) if it really "
                "needs longer") from e
        raise
    finally:
        with _reaper_cv:
            _reaper_open -= 1


def _libcuda_visible() -> bool:
    if ctypes.util.find_library("cuda"):
        return True
    try:
        dirs = compat.cuda_library_dirs()
    except Exception:  # noqa: BLE001
        dirs = []
    return any((Path(d) / "libcuda.so").exists() for d in dirs)


def stub_libcuda_dir() -> Path | None:
    """On a machine without the CUDA driver, a directory holding an empty ``libcuda.so`` so that
    tilelang's ``-lcuda`` links (the stub never becomes a run-time dependency); None elsewhere."""
    if _libcuda_visible():
        return None
    d = private_dir(settings.cache_dir / "stubs")

    def build(tmp: Path) -> None:
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise TileScaleError("no C compiler (gcc) to build the stub libcuda.so for this GPU-less machine")
        r = run_bounded([cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(tmp), "-Wl,-soname,libcuda.so.1"],
                        "the stub libcuda.so", input=b"")
        if r.returncode != 0:
            raise TileScaleError(f"building the stub libcuda.so with {cc} failed (exit {r.returncode})")

    build_once(d / "libcuda.so", build)
    return d


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
