"""The CUDA driver's files that NVSHMEM's multi-process-per-GPU mode leaves in /dev/shm, and their removal.

In the shared-GPU mode NVSHMEM creates an inter-process CUDA event on every rank and never destroys it; the
driver backs it with ``/dev/shm/cuda.shm.<n>.<pid in hex>.<n>`` (80 KiB, mode 0600), which outlives the
process (RESULTS.md run 12: one per rank of every job). Removing the name is safe once NVSHMEM has started
everywhere: the peers opened the event at start, and an open mapping outlives its name.

* each rank removes its own files after NVSHMEM's shutdown (``tilescale.finalize()``, shared-GPU mode);
* ``launch.sh`` removes, when a shared-GPU job ends, those of this user's processes that are gone (ranks
  killed with -9 never reach finalize): ``python -m tilescale.shm_leftovers``.

Only regular files owned by this user, named by the driver's pattern, are touched; a file whose process
still runs is kept.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

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


def remove_dead(root: Path = SHM) -> int:
    """Remove this user's files whose process is gone."""
    return remove([p for p, pid in _ours(root) if not _alive(pid)])


if __name__ == "__main__":
    n = remove_dead()
    if n and "--quiet" not in sys.argv[1:]:
        print(f"tilescale: removed {n} file(s) of ended ranks from {SHM} (CUDA inter-process events)")
