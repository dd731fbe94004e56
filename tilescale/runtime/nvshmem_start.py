"""NVSHMEM's start on every rank of a job, bounded and watched (``tilescale.init_distributed``'s step).

NVSHMEM's start is collective and cannot be interrupted: ``nvshmemx_init_attr`` waits in its bootstrap for
every rank, with no bound of its own. A rank that fails before or during it (an error it raises, a kill)
would leave the others waiting there forever, and in the shared-GPU mode the lowest rank of each host waits
while holding the host lock (tilescale/runtime/mpg_lock.py), which stalls every other such job of the host. So the
start runs under a :class:`StartGuard`, a thread that begins before it:

* a rank whose start raises publishes its error in the job's store (the failure key of this runtime
  generation, :func:`tilescale.diagnostics.failure_key`) before it raises;
* every rank's guard watches that key and stops its process (``os._exit(1)``) with a message naming the rank
  that failed and its error, as the runtime's watchdog does once the runtime exists;
* a start that has not finished within its bound (init_distributed's ``timeout_s``; twice that in the
  shared-GPU mode, whose lowest rank of a host may first wait up to ``timeout_s`` for the host lock) is
  reported, published and ends its process: a rank that died during the start, under a launcher that does
  not end the job, no longer hangs its peers, and a holder of the host lock gives it back (the kernel drops
  it with the process).
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time

from ..errors import TileScaleError
from . import diagnostics

log = logging.getLogger("tilescale")


class StartGuard(threading.Thread):
    """Watches the job's `store` (failure key `key`) while this rank (`rank`) runs `what`, and ends the process
    when another rank published a failure, or when `what` has not finished within `bound_s` seconds (0: no
    bound). ``stop`` (an Event) ends the watch."""

    def __init__(self, store, key: str, rank: int, bound_s: float, what: str, interval_s: float = 0.2):
        super().__init__(name="tilescale-start-guard", daemon=True)
        self.store, self.key, self.rank, self.bound_s, self.what = store, key, rank, bound_s, what
        self.interval = interval_s
        self.stop = threading.Event()
        self.deadline = time.monotonic() + bound_s if bound_s > 0 else None

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            if self.store is not None:
                diagnostics.stop_if_failed(self.store, self.key, self.rank)
            if self.deadline is not None and time.monotonic() > self.deadline and not self.stop.is_set():
                msg = (f"rank {self.rank}: {self.what} did not finish within {self.bound_s:g} s: a rank that never "
                       "started it, or stopped or died during it, keeps every rank waiting in it (NVSHMEM's start "
                       "has no bound of its own); this rank stops")
                print(f"tilescale: {msg}", file=sys.stderr, flush=True)
                diagnostics.publish(self.store, self.key, self.rank, f"TileScaleError: {msg}")
                os._exit(1)


def start(shim, install, rank: int, world: int, ctrl, *, timeout_s: float, generation: int, shared: bool = False,
          holder: bool = False, lock=None, store=None) -> None:
    """Start NVSHMEM on this rank (rank 0's unique id broadcast over the gloo group `ctrl`, then
    ``nvshmemx_init_attr``) under a :class:`StartGuard` (module docstring), bounded by `timeout_s` (twice that
    when `shared`: the shared-GPU mode, where a host's lowest rank may wait for the host lock first). `holder`:
    this rank takes the host `lock` first and gives it back once its own start returned (tilescale/runtime/mpg_lock.py).
    `store`: the job's store (default: torch.distributed's); `generation`: the runtime generation it begins."""
    if store is None:
        with contextlib.suppress(Exception):   # no store: the guard still bounds the start
            store = diagnostics.default_store()
    key = diagnostics.failure_key(generation)
    bound = 2 * timeout_s if shared else timeout_s
    what = (f"NVSHMEM's start (tilescale.init_distributed(timeout_s={timeout_s:g})"
            + (", twice that for the host lock and the start" if shared else "") + ")")
    guard = StartGuard(store, key, rank, bound, what)
    guard.start()
    try:
        if holder:   # before the unique id goes out: no rank of this host starts NVSHMEM first
            lock.acquire(timeout_s, f"rank {rank}: tilescale.init_distributed()")
        try:
            _start(shim, install, rank, world, ctrl)
        finally:
            if holder:
                lock.release()   # every PE of this host has opened NVSHMEM's per-GPU slab (runtime/mpg_lock.py)
    except BaseException as e:
        guard.stop.set()
        diagnostics.publish(store, key, rank, f"{type(e).__name__}: {e}".splitlines()[0][:500])
        raise
    finally:
        guard.stop.set()


def _start(shim, install, rank: int, world: int, ctrl) -> None:
    """NVSHMEM's start on this rank: rank 0's unique id, broadcast over `ctrl`, then ``nvshmemx_init_attr``."""
    import torch.distributed as dist

    n = shim.ts_uid_size()
    obj = [None]
    if rank == 0:
        buf = ctypes.create_string_buffer(n)
        rc = shim.ts_get_uid(buf)
        if rc != 0:
            raise TileScaleError(f"nvshmemx_get_uniqueid failed (rc={rc})")
        obj = [buf.raw]
    dist.broadcast_object_list(obj, src=0, group=ctrl)
    uid = ctypes.create_string_buffer(obj[0], n)
    t0 = time.time()
    rc = shim.ts_init_uid(rank, world, uid)
    if rc != 0:
        raise TileScaleError(f"NVSHMEM initialisation failed on rank {rank} (rc={rc}); NVSHMEM {install.version} "
                             f"from {install.root}. Set NVSHMEM_DEBUG=INFO for details; "
                             "`python -m tilescale doctor` checks the setup")
    if shim.ts_n_pes() != world or shim.ts_my_pe() != rank:
        raise TileScaleError(f"NVSHMEM reports PE {shim.ts_my_pe()} of {shim.ts_n_pes()}, expected {rank} of "
                             f"{world}")
    log.info("NVSHMEM %s initialised on rank %d/%d in %.2f s", install.version, rank, world, time.time() - t0)
