"""The CUDA driver's files that NVSHMEM's multi-process-per-GPU mode leaves in /dev/shm, and their removal.

In the shared-GPU mode NVSHMEM creates an inter-process CUDA event on every rank and never destroys it; the
driver backs it with ``/dev/shm/cuda.shm.<n>.<pid in hex>.<n>`` (80 KiB, mode 0600), which outlives the
process (one per rank of every job). Removing the name is safe once NVSHMEM has started
everywhere: the peers opened the event at start, and an open mapping outlives its name.

* each rank removes its own files after NVSHMEM's shutdown (``tilescale.finalize()``, shared-GPU mode);
* ranks killed with -9 never reach finalize: each rank of a job started by ``launch.sh`` records its pid
  before NVSHMEM starts (:func:`record_rank`, in the launch's private directory ``TILESCALE_JOB_DIR``), and
  launch.sh removes, when the job ends, the files of those of its ranks that are gone:
  ``python -m tilescale.shm_leftovers --job-dir DIR``.

Only regular files owned by this user, named by the driver's pattern, of a pid that this job's ranks
recorded and whose process is gone, are touched. A file of any other process is kept, also one whose process
this host cannot see: /dev/shm may be shared with other containers, whose live ranks have pids of their own.
"""
from __future__ import annotations

import logging
import os
import re
import stat
import sys
from pathlib import Path

log = logging.getLogger("tilescale")

SHM = Path("/dev/shm")
_NAME = re.compile(r"^cuda\.shm\.\d+\.([0-9a-f]+)\.\d+$")


def _ours(root: Path):
    """(path, pid) of every driver file in `root` owned by this user."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    uid = os.getuid()
    for name in names:
        m = _NAME.match(name)
        if m is None:
            continue
        p = root / name
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
            yield p, int(m.group(1), 16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def files_of(pids, root: Path = SHM) -> list[Path]:
    """This user's driver files of the processes `pids`."""
    want = set(pids)
    return [p for p, pid in _ours(root) if pid in want]


def remove(paths) -> int:
    """Unlink `paths` (one already gone counts as removed); how many were removed."""
    n = 0
    for p in paths:
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            n += 1
        except OSError:
            pass
    return n


def remove_own(root: Path = SHM) -> int:
    """Remove this process's files (after NVSHMEM's shutdown)."""
    return remove(files_of([os.getpid()], root))


def record_rank(job_dir: Path | None = None) -> None:
    """Record this process's pid in the launch's directory `job_dir` (default ``TILESCALE_JOB_DIR``, set by
    launch.sh; nothing without one), for :func:`remove_ended`. A rank whose pid cannot be recorded runs on: only
    the removal of its files after a kill is lost (said in a warning)."""
    if job_dir is None:
        from .env import settings

        job_dir = settings.job_dir
        if job_dir is None:
            return
    try:
        _check_private(job_dir)
        fd = os.open(job_dir / str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError as e:
        log.warning("tilescale: could not record rank pid %d in %s (%s): launch.sh will not remove its /dev/shm "
                    "files if it is killed", os.getpid(), job_dir, e)


def recorded_pids(job_dir: Path) -> list[int]:
    """The pids recorded in `job_dir` by :func:`record_rank` (its entries named by a number)."""
    _check_private(job_dir)
    return sorted(int(n) for n in os.listdir(job_dir) if n.isdigit())


def _check_private(d: Path) -> None:
    """OSError unless `d` is a directory of this user that nobody else can write (launch.sh's mktemp -d): the
    pids read from it decide which files are removed."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{d} is not a directory of this user that only it can write "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid})")


def remove_ended(job_dir: Path, root: Path = SHM) -> int:
    """Remove the files of the ranks recorded in `job_dir` whose process is gone; how many."""
    pids = [p for p in recorded_pids(job_dir) if not _alive(p)]
    return remove(files_of(pids, root))


def main(argv: list[str]) -> int:
    if "--job-dir" not in argv or argv.index("--job-dir") + 1 >= len(argv):
        print("usage: python -m tilescale.shm_leftovers --job-dir DIR [--quiet]  (removes the /dev/shm files of the "
              "ranks recorded in DIR that have ended)", file=sys.stderr)
        return 2
    job_dir = Path(argv[argv.index("--job-dir") + 1])
    try:
        n = remove_ended(job_dir)
    except OSError as e:
        print(f"tilescale: not removing /dev/shm files of ended ranks: {e}", file=sys.stderr)
        return 1
    if n and "--quiet" not in argv:
        print(f"tilescale: removed {n} file(s) of ended ranks of this job from {SHM} (CUDA inter-process events)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
