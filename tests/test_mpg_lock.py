"""The host lock around NVSHMEM's start and stop in the shared-GPU mode (tilescale/runtime/mpg_lock.py); the jobs
that need it run in tests/test_gpu_teardown.py::test_jobs_sharing_a_gpu_start_and_stop_side_by_side."""
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tilescale import mpg_lock
from tilescale.errors import TileScaleError


def _name():
    return f"tilescale-test-{uuid.uuid4().hex}"


def test_one_holder_at_a_time_and_a_bounded_wait_that_names_the_step():
    name = _name()
    a, b = mpg_lock.HostLock(name), mpg_lock.HostLock(name)
    a.acquire(1, "a")
    assert a.held
    t0 = time.monotonic()
    with pytest.raises(TileScaleError) as e:
        b.acquire(0.3, "rank 3: tilescale.init_distributed()")
    assert 0.3 <= time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "rank 3: tilescale.init_distributed()" in msg and name in msg and "0.3 s" in msg, msg
    assert not b.held
    a.release()
    assert not a.held
    b.acquire(1, "b")          # free again once released
    assert b.held
    b.release()


def test_a_waiter_gets_the_lock_when_the_holder_releases_it():
    name = _name()
    a, b = mpg_lock.HostLock(name), mpg_lock.HostLock(name)
    a.acquire(1, "a")
    import threading

    threading.Timer(0.3, a.release).start()
    t0 = time.monotonic()
    b.acquire(10, "b")
    assert 0.2 < time.monotonic() - t0 < 5
    b.release()


def test_the_lock_goes_with_a_killed_holder_and_leaves_no_file(tmp_path):
    """Another process holds it (and sees our attempt fail); once it is killed with -9 the lock is free: the
    kernel drops the abstract socket, nothing is left on disk."""
    name = _name()
    code = (f"import sys, time; from tilescale.mpg_lock import HostLock; l = HostLock({name!r}); l.acquire(5, 'x'); "
            "print('HELD', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert p.stdout.readline().strip() == "HELD"
        with pytest.raises(TileScaleError) as e:
            mpg_lock.HostLock(name).acquire(0.2, "while held elsewhere")
        assert f"held by pid {p.pid} (uid {os.getuid()}" in str(e.value), str(e.value)   # who holds it
        assert "host-wide" in str(e.value), str(e.value)
        assert mpg_lock.holder(name) == (p.pid, os.getuid())
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        lock = mpg_lock.HostLock(name)
        lock.acquire(5, "after the holder died")
        lock.release()
    finally:
        p.kill()
        p.wait(10)
    assert list(tmp_path.iterdir()) == []
    with open("/proc/net/unix") as f:   # and the name is gone from the host once released
        assert name not in f.read()


@pytest.mark.parametrize("hosts, holders", [
    (["a", "a", "a", "a"], [0]),
    (["a", "b", "a", "b"], [0, 1]),          # two hosts, ranks interleaved
    (["b", "a", "a", "b"], [0, 1]),
])
def test_the_lowest_rank_of_each_host_holds_it(monkeypatch, hosts, holders):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: len(hosts))
    for rank in range(len(hosts)):
        def gather(out, obj, group=None, _r=rank):
            assert obj == "me"
            out[:] = hosts
        monkeypatch.setattr(dist, "all_gather_object", gather)
        monkeypatch.setattr(mpg_lock.socket, "gethostname", lambda: "me")
        got = mpg_lock.first_on_host(rank, group=None)
        assert got == (rank in holders), (rank, hosts)


def test_a_name_bound_by_a_process_that_is_not_tilescales_is_reported_as_such():
    """Anyone on the host can bind the abstract name (it is host-wide): the wait still ends at its bound, and the
    error says that the holder does not say who it is, instead of naming a wrong one."""
    name = _name()
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind("\0" + name)          # bound, never listening: no credentials to read
    try:
        assert mpg_lock.holder(name) is None
        t0 = time.monotonic()
        with pytest.raises(TileScaleError) as e:
            mpg_lock.HostLock(name).acquire(0.2, "rank 0: tilescale.init_distributed()")
        assert time.monotonic() - t0 < 5
        assert "held by a process that does not say who it is" in str(e.value), str(e.value)
    finally:
        squatter.close()
    assert mpg_lock.holder(name) is None      # free: nobody to name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_wait_that_could_not_end_is_refused(bad):
    """nan never passes a deadline and inf overflows it: a SettingError naming the argument, not a wait forever.
    (The attempt runs in a thread: without the check it would wait for ever, and the test ends at its own bound.)"""
    import threading

    from tilescale.errors import SettingError

    name = _name()
    a = mpg_lock.HostLock(name)
    a.acquire(1, "a")
    out = {}

    def attempt():
        try:
            mpg_lock.HostLock(name).acquire(bad, "b")
            out["error"] = None
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    try:
        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(30)
        assert "error" in out, f"acquire(timeout_s={bad}) was still waiting after 30 s"
        assert isinstance(out["error"], SettingError) and str(out["error"]).startswith("timeout_s="), out["error"]
    finally:
        a.release()
