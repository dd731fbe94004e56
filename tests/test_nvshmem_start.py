"""NVSHMEM's start, bounded and watched (tilescale.runtime.nvshmem_start), on CPU: a fake shim stands for NVSHMEM (its
start returns an error, or never returns), a HashStore for the job's store, and os._exit is recorded. A rank whose
start fails tells the others; a rank waiting in the start stops when told, or at its bound; the host lock is held
around the start of its holder only. (A real NVSHMEM start: the GPU tiers.)"""
import datetime
import os
import threading
import time
import types

import pytest
import torch.distributed as dist

from tilescale import diagnostics, mpg_lock, nvshmem_start
from tilescale.errors import TileScaleError

GEN = 5


class FakeShim:
    """NVSHMEM's start as the shim calls it: `init_rc` returned by ts_init_uid, or, with `block`, a start that
    does not return until the Event is set (a peer that never arrives)."""

    def __init__(self, init_rc=0, block=None, world=2, rank=0):
        self.init_rc, self.block, self.world, self.rank = init_rc, block, world, rank
        self.started = threading.Event()

    def ts_uid_size(self):
        return 8

    def ts_get_uid(self, buf):
        return 0

    def ts_init_uid(self, rank, world, uid):
        self.started.set()
        if self.block is not None:
            self.block.wait(60)
        return self.init_rc

    def ts_n_pes(self):
        return self.world

    def ts_my_pe(self):
        return self.rank


INSTALL = types.SimpleNamespace(version="3.x", root="/nvshmem")


@pytest.fixture
def env(monkeypatch):
    """The broadcast of the unique id (a no-op: every rank gets a uid) and a recorded os._exit, which also lets
    a blocked fake start return."""
    def broadcast(obj, src=0, group=None):
        obj[0] = obj[0] if obj[0] is not None else b"u" * 8

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    exits, release = [], threading.Event()
    monkeypatch.setattr(nvshmem_start.os, "_exit", lambda code: (exits.append(code), release.set()))
    monkeypatch.setattr(diagnostics.os, "_exit", lambda code: (exits.append(code), release.set()))
    monkeypatch.setattr(diagnostics.time, "sleep", lambda s: None)
    diagnostics.failing.clear()
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=10))   # a failure that was never published: a get fails in seconds
    return types.SimpleNamespace(exits=exits, release=release, store=store)


def _start_in_thread(shim, store, rank=0, **kw):
    out = {}

    def run():
        try:
            nvshmem_start.start(shim, INSTALL, rank, 2, None, generation=GEN, store=store, **kw)
            out["ok"] = True
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_rank_whose_start_fails_tells_the_others(env):
    with pytest.raises(TileScaleError, match="NVSHMEM initialisation failed on rank 1"):
        nvshmem_start.start(FakeShim(init_rc=7, rank=1), INSTALL, 1, 2, None, timeout_s=30, generation=GEN,
                            store=env.store)
    who, msg, wait = diagnostics.parse_failure(env.store.get(diagnostics.failure_key(GEN)).decode())
    assert (who, wait) == (1, False) and msg.startswith("TileScaleError: NVSHMEM initialisation failed on rank 1"), msg
    assert env.exits == []


def test_a_rank_waiting_in_its_start_stops_when_a_peer_failed(env, capsys):
    """Rank 0 waits in NVSHMEM's start for rank 1, which failed (and said so): rank 0 stops within a poll, naming
    rank 1 and its error, instead of waiting in the start forever."""
    shim = FakeShim(block=env.release)
    t, out = _start_in_thread(shim, env.store, timeout_s=60)
    assert shim.started.wait(10)
    diagnostics.publish(env.store, diagnostics.failure_key(GEN), 1, "TileScaleError: NVSHMEM initialisation failed")
    t.join(20)
    assert env.exits and env.exits[0] == 1, "the rank in its start was not stopped"
    err = capsys.readouterr().err
    assert "rank 0 stops: rank 1 failed: TileScaleError: NVSHMEM initialisation failed" in err, err


def test_a_failure_of_an_earlier_runtime_does_not_stop_a_start(env):
    diagnostics.publish(env.store, diagnostics.failure_key(GEN - 1), 1, "ValueError: caught by the job")
    nvshmem_start.start(FakeShim(), INSTALL, 0, 2, None, timeout_s=30, generation=GEN, store=env.store)
    assert env.exits == []


@pytest.mark.parametrize("shared", [False, True])
def test_a_start_that_never_ends_stops_at_its_bound_and_tells_the_others(env, capsys, shared):
    """A peer that died during the start under a launcher that does not end the job: this rank's start never
    returns; at init_distributed's timeout_s (twice it in the shared-GPU mode: the host lock, then the start) it says
    so, publishes it and ends its process."""
    shim = FakeShim(block=env.release)
    t0 = time.monotonic()
    t, out = _start_in_thread(shim, env.store, timeout_s=0.3, shared=shared)
    t.join(30)
    took = time.monotonic() - t0
    bound = 0.6 if shared else 0.3
    assert env.exits and set(env.exits) == {1}, "the start was not bounded"   # (os._exit recorded: may come twice)
    assert bound <= took < bound + 20, took
    err = capsys.readouterr().err
    assert "rank 0: NVSHMEM's start (tilescale.init_distributed(timeout_s=0.3" in err, err
    assert f"did not finish within {bound:g} s" in err, err
    who, msg, _ = diagnostics.parse_failure(env.store.get(diagnostics.failure_key(GEN)).decode())
    assert who == 0 and "did not finish within" in msg


def test_the_host_lock_is_held_around_its_holders_start_only(env):
    name = f"tilescale-test-{os.getpid()}-{time.time_ns()}"
    lock = mpg_lock.HostLock(name)
    seen = []

    class Watching(FakeShim):
        def ts_init_uid(self, rank, world, uid):
            seen.append(lock.held)
            return 0

    nvshmem_start.start(Watching(), INSTALL, 0, 2, None, timeout_s=30, generation=GEN, store=env.store,
                        shared=True, holder=True, lock=lock)
    nvshmem_start.start(Watching(), INSTALL, 0, 2, None, timeout_s=30, generation=GEN, store=env.store,
                        shared=True, holder=False, lock=lock)
    assert seen == [True, False] and not lock.held
    with pytest.raises(TileScaleError):     # a failed start gives the lock back too
        nvshmem_start.start(FakeShim(init_rc=1), INSTALL, 0, 2, None, timeout_s=30, generation=GEN + 1,
                            store=env.store, shared=True, holder=True, lock=lock)
    assert not lock.held
