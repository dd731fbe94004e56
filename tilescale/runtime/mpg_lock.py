"""The host lock around NVSHMEM's start and shutdown in the shared-GPU mode.

When a GPU runs more than one PE, NVSHMEM (3.x, ``nvshmemi_setup_limited_mpg_support``) keeps per-GPU
state in a POSIX shared-memory slab named after the GPU's first PE only: ``/dev/shm/mps_shm_<pe>``, the
same name for every job on the host. Its first PE unlinks any slab of that name and creates a new one;
the GPU's other PEs open it after a bootstrap barrier; every PE unlinks it again in ``nvshmem_finalize``.
Two jobs that share GPUs on one host at the same time (parallel test runs, two users' experiments) can
therefore unlink each other's slab between its creation and its opening: seen as
``nvshmemi_setup_limited_mpg_support: Failed to open shared memory slab`` and the job's exit.

tilescale orders those steps across jobs: the lowest rank of each host (:func:`first_on_host`) holds this
lock while the host's ranks start NVSHMEM (it takes the lock before the unique id goes out, so no rank of
the host can start first, and gives it back once its own start returned: by then every PE has opened its
slab), and while they shut it down (taken before the ranks agree to finalize). The lock is an abstract
Unix socket: it leaves no file behind and the kernel releases it when its holder dies. It is host-wide: one
name per host and network namespace, shared by every user and container of that namespace, since the slab
names are too. So any local process can hold it (another user's job, or one that merely binds the name) and
make this host's shared-GPU jobs wait: the wait is bounded, and its error names the holder (pid and uid, which
the kernel records when the holder listens on the socket: :func:`holder`). The NVSHMEM start that a holder runs
under it is bounded too (tilescale/runtime/nvshmem_start.py), so a tilescale job never holds it for longer than its
start's bound.
"""
from __future__ import annotations

import errno
import socket
import struct
import time

from ..env import check_seconds
from ..errors import TileScaleError

NAME = "tilescale-nvshmem-mpg"


class HostLock:
    """An exclusive lock named `name` on this host (Linux abstract socket): ``acquire(timeout_s, what)``,
    ``release()``, ``held``."""

    def __init__(self, name: str = NAME):
        self.name = name
        self._sock: socket.socket | None = None

    @property
    def held(self) -> bool:
        return self._sock is not None

    def acquire(self, timeout_s: float, what: str) -> None:
        """Take the lock, waiting up to `timeout_s` seconds (0: no bound); `what` names the step in the error."""
        if self._sock is not None:
            return
        check_seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        delay = 0.01
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind("\0" + self.name)
                s.listen(64)     # records this process's pid and uid for the error of a waiter (holder())
            except OSError as e:
                s.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                if deadline is not None and time.monotonic() > deadline:
                    who = describe_holder(self.name)
                    raise TileScaleError(
                        f"{what}: waited {timeout_s:g} s for the host lock '@{self.name}', {who}. "
                        "tilescale's jobs that share GPUs take it while NVSHMEM starts or stops (NVSHMEM's "
                        "multi-process-per-GPU mode names its shared-memory slab per host, so such jobs start and stop "
                        "one at a time); the lock is host-wide, shared by every user of this host: if the holder is "
                        "not such a job, or is stuck, end it (or ask its owner to)") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            self._sock = s
            return

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def holder(name: str = NAME) -> tuple[int, int] | None:
    """(pid, uid) of the process holding the lock `name`, as the kernel recorded them when it listened on the
    socket (SO_PEERCRED: the holder cannot forge them); None when it is free or its holder does not listen (a
    process that is not tilescale's merely bound the name)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect("\0" + name)
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid, uid
    except OSError:
        return None
    finally:
        s.close()


def describe_holder(name: str = NAME) -> str:
    """Who holds the lock `name`, for an error: "held by pid 123 (uid 1000, alice)", or what can be said."""
    who = holder(name)
    if who is None:
        return (f"held by a process that does not say who it is (not a tilescale job; `ss -xlp | grep {name}` "
                "shows it to its owner and to root)")
    pid, uid = who
    try:
        import pwd

        user = f", {pwd.getpwuid(uid).pw_name}"
    except (KeyError, ImportError):
        user = ""
    return f"held by pid {pid} (uid {uid}{user})"


def first_on_host(rank: int, group) -> bool:
    """Whether `rank` is the lowest rank of `group` (all ranks of the job) on this host, the one that holds the
    lock for the host's ranks (one per host, also when a host runs several "nodes" of one job). Collective."""
    import torch.distributed as dist

    hosts = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return rank == min(r for r, h in enumerate(hosts) if h == hosts[rank])
