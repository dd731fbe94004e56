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
Unix socket (one name per host and network namespace, for every user, since the slab names are too): it
leaves no file behind and the kernel releases it when its holder dies.
"""
from __future__ import annotations

import errno
import socket
import time

from .errors import TileScaleError

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
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        delay = 0.01
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind("\0" + self.name)
            except OSError as e:
                s.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                if deadline is not None and time.monotonic() > deadline:
                    raise TileScaleError(
                        f"{what}: waited {timeout_s:g} s for the host lock '@{self.name}' (held by another job "
                        "that shares GPUs on this host while NVSHMEM starts or stops; `ss -xlp | grep "
                        f"{self.name}` shows the holder): NVSHMEM's multi-process-per-GPU mode names its "
                        "shared-memory slab per host, so such jobs start and stop one at a time") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            self._sock = s
            return

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def first_on_host(rank: int, group) -> bool:
    """Whether `rank` is the lowest rank of `group` (all ranks of the job) on this host, the one that holds the
    lock for the host's ranks (one per host, also when a host runs several "nodes" of one job). Collective."""
    import torch.distributed as dist

    hosts = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return rank == min(r for r, h in enumerate(hosts) if h == hosts[rank])
