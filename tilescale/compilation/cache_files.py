"""tilescale's cache files: private directories, exclusive locks, and :func:`write_once`, the one writer of
every file tilescale keeps (built libraries through :func:`build_once`, plan files).

One process writes under an exclusive file lock, to a temporary name beside the target, and renames it into
place; every other process waits on the lock and then finds the finished file. Next to each built artefact
a record ``<name>.sha256`` (size and SHA-256, written after the build) lets every later use verify the
file: a truncated, overwritten or half-published artefact is rebuilt, with a warning, instead of being
loaded. (Kernels compiled through tilelang live in tilelang's own cache, which keeps a manifest of
sizes and hashes per entry and recompiles an entry that fails it: tests/test_cache.py covers both.)

A record beside a file proves nothing against someone who can write the directory (they rewrite both),
so every cache directory tilescale uses (its own, the plan cache, and tilelang's kernel cache, from its
root down) must be owned by the current user and writable by nobody else: :func:`private_dir` creates
missing ones mode 0700 and refuses, with :class:`UnsafeCacheDirError`, to load from or write into one
that is not. Above a cache root, whoever can write a directory can rename the cache away and put their own
in its place between a check and a load: every directory above it must be owned by the current user or
root, and not writable by all users unless sticky (``/tmp``: others cannot rename what is ours there).
Files are created 0600 (libraries 0700).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shlex
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import compat
from ..env import settings
from ..errors import TileScaleError

log = logging.getLogger("tilescale")


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


def _check_above(root: Path, var: str | None) -> None:
    """Raise :class:`UnsafeCacheDirError` if a directory above `root` (the existing ones, symbolic links
    resolved) is owned by another user than the current one and root, or writable by all users without the
    sticky bit: its writers could replace the whole cache (module docstring)."""
    uid = os.geteuid()
    above = {a for p in (Path(os.path.abspath(root)), Path(os.path.realpath(root))) for a in p.parents}
    for d in sorted(above, key=lambda a: len(a.parts)):   # the path as given and as resolved
        try:
            st = os.stat(d)
        except OSError:
            st = None
        if st is not None:
            if st.st_uid not in (0, uid):
                problem = f"owned by {_user(st.st_uid)}"
            elif st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
                problem = f"writable by all users without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
            else:
                problem = None
            if problem:
                choose = (f"export {var}=<a directory of yours, e.g. under your home directory>" if var
                          else "set TILESCALE_CACHE_DIR / TILELANG_CACHE_DIR to a directory of yours")
                raise UnsafeCacheDirError(
                    f"refusing to use the cache directory {root}: the directory {d} above it is {problem}, so "
                    f"others can rename {root} away and put their own in its place, whose libraries tilescale would "
                    f"load. Fix: a cache whose parents only you and root can write ({choose}).")


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
    _check_above(root, var)
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
