"""nvcc, the stub libcuda of GPU-less build machines, and safe builds into the cache directory.

Every artefact tilescale builds itself (the runtime shim, the stub) goes through :func:`build_once`, and
every file of its caches through :func:`write_once` (plan files too):
one process builds under an exclusive file lock, writes to a temporary name and renames it into
place; every other process waits on the lock and then finds the finished file. Next to each artefact
a record ``<name>.sha256`` (size and SHA-256, written after the build) lets every later use verify the
file: a truncated, overwritten or half-published artefact is rebuilt, with a warning, instead of being
loaded. (Kernels compiled through tilelang live in tilelang's own cache, which keeps a manifest of
sizes and hashes per entry and recompiles an entry that fails it: tests/test_cache.py covers both.)

A record beside a file proves nothing against someone who can write the directory (they rewrite both),
so every cache directory tilescale uses (its own, the plan cache, and tilelang's kernel cache, from its
root down) must be owned by the current user and writable by nobody else: :func:`private_dir` creates
missing ones mode 0700 and refuses, with :class:`UnsafeCacheDirError`, to load from or write into one
that is not. Files are created 0600 (libraries 0700).

nvcc runs bounded by ``TILESCALE_NVCC_TIMEOUT_S`` (:func:`run_bounded`; tilelang's nvcc runs too, while
tilescale builds a kernel: :func:`bounded_nvcc`), in its own process group, killed whole on expiry.
"""
from __future__ import annotations

import contextlib
import ctypes.util
import fcntl
import functools
import hashlib
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import compat
from .env import settings
from .errors import BuildError, TileScaleError

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


_PKG = Path(__file__).resolve().parent


def source_digest() -> str:
    """Hash of the tilescale code that shapes a distributed kernel's binary beyond the IR and the flags:
    the source rewriting (codegen.py) and every header under tilescale/include (recursively)."""
    files = [_PKG / "codegen.py", *sorted(p for p in (_PKG / "include").rglob("*") if p.is_file())]
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(_PKG)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- private cache directories


class UnsafeCacheDirError(TileScaleError):
    """A cache directory that someone other than the current user could write."""


def _cache_roots() -> list[tuple[Path, str]]:
    """(root, the variable that chooses it) of every cache tilescale loads from or writes into."""
    roots = []
    for var, get in (("TILESCALE_CACHE_DIR", lambda: settings.cache_dir),
                     ("TILESCALE_PLAN_DIR", lambda: settings.plan_dir),
                     ("TILELANG_CACHE_DIR", tilelang_cache_dir)):
        with contextlib.suppress(Exception):
            roots.append((Path(os.path.abspath(get())), var))
    return roots


def tilelang_cache_dir() -> Path:
    """The root of tilelang's kernel cache (TILELANG_CACHE_DIR), as tilelang resolves it."""
    try:
        return Path(compat.tilelang_cache_root()).expanduser()
    except Exception:  # noqa: BLE001
        return Path(os.environ.get("TILELANG_CACHE_DIR") or "~/.tilelang/cache").expanduser()


def _root_of(path: Path) -> tuple[Path, str | None]:
    best: tuple[Path, str | None] = (path, None)
    for root, var in _cache_roots():
        if (path == root or root in path.parents) and (best[1] is None or len(root.parts) > len(best[0].parts)):
            best = (root, var)
    return best


def _unsafe(d: Path, st: os.stat_result, var: str | None) -> UnsafeCacheDirError:
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        problem, fix = "it is not a directory", "remove it, or choose another directory"
    elif st.st_uid != uid:
        problem = f"it is owned by {_user(st.st_uid)}, not by the current user ({_user(uid)})"
        fix = "choose a directory of your own"
    else:
        who = " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("all users", stat.S_IWOTH))
                           if st.st_mode & bit)
        problem = f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_mode & stat.S_ISVTX:   # /tmp and the like: shared on purpose, never chmod them
            fix = "it is a shared directory (sticky bit): choose a directory of your own below it"
        else:
            fix = (f"if nothing in it comes from someone else: chmod 700 {shlex.quote(str(d))}; "
                   "or choose another directory")
    example = "~/.cache/tilelang" if (var or "").startswith("TILELANG") else "~/.cache/tilescale"
    choose = (f"export {var}=<a directory of yours, e.g. {example}>" if var
              else "set TILESCALE_CACHE_DIR / TILELANG_CACHE_DIR to a directory of yours")
    return UnsafeCacheDirError(
        f"refusing to use the cache directory {d}: {problem}. Whoever can write it can replace the libraries "
        f"tilescale loads from it (a record of their hash beside them is no defence). Fix: {fix} ({choose}).")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _check_dir(d: Path, var: str | None) -> None:
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _unsafe(d, st, var)


def private_dir(path: Path | str, root: Path | str | None = None) -> Path:
    """`path`, a directory safe to load from and write into: every directory from its cache root (the
    tilescale, plan or tilelang cache that holds it; `root` if given; else `path` alone) down to it is
    owned by the current user and not writable by group or others. Missing ones are created mode 0700.
    Raises :class:`UnsafeCacheDirError` naming the directory, what is wrong and the fix."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    if root is not None:
        root, var = Path(os.path.abspath(Path(root).expanduser())), None
        for r, v in _cache_roots():
            if r == root:
                var = v
        if not (path == root or root in path.parents):
            root = path
    else:
        root, var = _root_of(path)
    parts = path.relative_to(root).parts
    chain = [root, *[root.joinpath(*parts[:i + 1]) for i in range(len(parts))]]
    for i, d in enumerate(chain):
        if not d.exists() and not d.is_symlink():
            if i == 0:
                d.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
                os.chmod(d, 0o700)  # exactly 0700, whatever the umask
        _check_dir(d, var)
    return path


def check_private_file(path: Path) -> None:
    """Raise :class:`UnsafeCacheDirError` unless `path` is owned by the current user and writable by no one
    else (a file there that is not is none of tilescale's doing)."""
    st = os.stat(path)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = (f"owned by {_user(st.st_uid)}, not by the current user" if st.st_uid != os.geteuid()
               else f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
        raise UnsafeCacheDirError(f"refusing to load {path}: it is {why}; tilescale writes its cached files 0600/0700 "
                                  f"itself. Remove it (it is rebuilt) or choose another cache directory "
                                  "(TILESCALE_CACHE_DIR / TILELANG_CACHE_DIR)")


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


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive advisory lock on `path` (created if needed); waits up to `timeout_s`."""
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` at once: written to a temporary file (0600) beside it, fsynced, renamed
    into place, so a reader sees the old file or the whole new one. No lock (see :func:`write_once`)."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)   # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _build_wait_s() -> float:
    """How long to wait for another process's build: its nvcc bound and then some (a week without one)."""
    return settings.nvcc_timeout_s + 600.0 if settings.nvcc_timeout_s > 0 else 7 * 24 * 3600.0


def write_once(target: Path, content: bytes | Callable[[Path], None], *,
               check: Callable[[Path], str | None] = why_invalid, record: bool = True,
               rewrite_because: str | None = None, lock_timeout_s: float | None = None,
               on_rewrite: Callable[[str], None] | None = None) -> bool:
    """The one writer of tilescale's caches (built libraries, plan files): write `target` unless it is valid.

    In `target`'s private directory (:func:`private_dir`) and under its exclusive lock (``<name>.lock``;
    another process may be writing it; waited for up to `lock_timeout_s`, default the nvcc bound and 10
    minutes): check the file again (`check`: None if valid, else what is wrong; "missing" if absent), unless
    `rewrite_because` says to rewrite it anyway; tell `on_rewrite` why an existing file is replaced; write
    `content` (bytes, or a builder called with a temporary path) to a temporary file beside `target`, fsync
    it, write its record (`record`: size and SHA-256 in ``<name>.sha256``, which the default `check`
    verifies), rename both into place and fsync the directory. `check` must pass then, else TileScaleError.
    A builder's file becomes 0700 (a library); bytes are written 0600. Returns whether it wrote (False:
    valid already, e.g. written by another process meanwhile)."""
    private_dir(target.parent)
    wait = _build_wait_s() if lock_timeout_s is None else lock_timeout_s
    with file_lock(target.with_name(target.name + ".lock"), timeout_s=wait):
        why = rewrite_because or check(target)
        if why is None:
            return False
        if why != "missing" and on_rewrite is not None:
            on_rewrite(why)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)   # mode 0600
        rec_tmp = Path(tmp + RECORD_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                if isinstance(content, (bytes, bytearray)):
                    f.write(content)
            if not isinstance(content, (bytes, bytearray)):
                content(Path(tmp))
                os.chmod(tmp, 0o700)  # a library (whatever mode the builder left), readable by this user only
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            if record:
                _write_durably(rec_tmp, f"{os.path.getsize(tmp)} {_sha256(Path(tmp))}\n".encode())
            os.replace(tmp, target)
            if record:
                os.replace(rec_tmp, record_path(target))
            _fsync_dir(target.parent)
        finally:
            for t in (tmp, rec_tmp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(t)
        why = check(target)
        if why is not None:
            raise TileScaleError(f"building {target} did not give a valid file: {why}")
    return True


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, building it with ``build(tmp_path)`` first if it does not exist yet or fails its
    record (see the module docstring): :func:`write_once`. Safe against concurrent callers (one builds, the
    others wait) and against torn files. Refuses (:class:`UnsafeCacheDirError`) a directory, or a file,
    that others could write."""
    private_dir(target.parent)
    if why_invalid(target) is None:
        check_private_file(target)
        return target
    wrote = write_once(target, build, on_rewrite=lambda why: log.warning(
        "tilescale: cached %s is invalid: %s; rebuilding it", target, why))
    if not wrote:   # another process built it while this one waited
        check_private_file(target)
    return target


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
