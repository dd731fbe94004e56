"""Bounded stream-memory waits on CPU (tilescale/runtime/stream_waits.py): a stream wait that a peer never releases is
named by the watchdog (the op, the flag, the rank that sets it), published as a wait that gave up, and its rank
stops; the other ranks stop as for any failure; finalize() never waits forever for this rank's GPU. No GPU: the
shim's part of a watched wait (ts_runtime.cu's watch_wait: count the call, note its time) is done here as it does
it, and a GPU that never passes the wait never writes its ``done`` word. (On GPUs: tests/test_gpu_teardown.py.)"""
import ctypes
import re
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from test_abort import FakeStore, fake_rt, start_dog

from tilescale.env import settings
from tilescale.ops import stream_ops as so
from tilescale.runtime import diagnostics, stream_waits


@pytest.fixture
def exits(monkeypatch):
    calls = []
    monkeypatch.setattr(diagnostics.os, "_exit", lambda code: calls.append(code))
    monkeypatch.setattr(diagnostics.time, "sleep", lambda s: None)
    diagnostics.failing.clear()
    yield calls
    diagnostics.failing.clear()


def program(bound_s, label=("AGGemm", "ready[1]", 1), flag=0x7f0010):
    """A program of one labelled stream wait (>= 1 on `flag`), sealed under a wait bound of `bound_s`."""
    with settings.scope(wait_timeout_s=bound_s):
        p = so.Program([0x61])
        p.add(so.WAIT_GEQ, flag, 1, stream=1, label=label)
        p.add(so.WRITE, flag, 0, stream=1)
        return p.seal()


def issue(streams_at, ops_at, n, failed_at):
    """``ts_stream_ops`` as the shim runs it for the watched waits, on a GPU that never passes them."""
    ops = ctypes.cast(ops_at, ctypes.POINTER(so.StreamOp))
    for i in range(n):
        if ops[i].kind == so.WAIT_GEQ and ops[i].n:
            slot = (ctypes.c_uint64 * 4).from_address(ops[i].n)     # done, issued, issued_ns, bound_ns
            slot[2] = time.monotonic_ns()
            slot[1] += 1
    return 0


def passed(p):
    """The GPU passed every wait of `p` issued so far (its write of the call's number into ``done``)."""
    for addr in p.watches.values():
        slot = (ctypes.c_uint64 * 4).from_address(addr)
        slot[0] = slot[1]


def until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        threading.Event().wait(0.01)      # (time.sleep is stubbed out by `exits`)
    return cond()


# ------------------------------------------------------------------------------------------ the monitor
def test_a_wait_is_overdue_once_its_call_is_older_than_the_bound_and_not_passed():
    """Overdue: issued after done, for longer than the bound, seen so at two polls in a row for the same call (the
    host's words are read settled). Not before the bound, not once passed, never with no bound (no slot at all)."""
    p = program(0.5)
    at = p.watches[("AGGemm", "ready[1]", 1)]
    slot = (ctypes.c_uint64 * 4).from_address(at)
    assert list(slot) == [0, 0, 0, 500_000_000]
    m = stream_waits.Monitor()
    p.run(issue, 0x5000)
    t = slot[2]
    assert m.poll(t + 400_000_000) is None and m.poll(t + 450_000_000) is None    # within the bound
    assert m.poll(t + 600_000_000) is None            # overdue once: seen again at the next poll...
    late = m.poll(t + 800_000_000)                    # ...then said
    assert late is not None and late.issued == 1 and late.done == 0 and abs(late.waited_s - 0.8) < 1e-6
    assert late.wait == stream_waits.Wait("AGGemm", "ready[1]", 1, 0x7f0010, 1)
    p.run(issue, 0x5000)                              # another call of the wait: its own look twice
    t2 = slot[2]
    assert m.poll(t2 + 600_000_000) is None and m.poll(t2 + 700_000_000).issued == 2
    passed(p)
    assert m.poll(t2 + 900_000_000) is None and m.poll(t2 + 10**10) is None
    unbounded = program(0)
    assert unbounded.table is None and unbounded.watches == {("AGGemm", "ready[1]", 1): 0}
    assert unbounded.array[0].n == 0                  # the shim queues nothing for the bound


def test_a_stream_wait_needs_a_label_naming_op_flag_and_peer():
    p = so.Program([0x61])
    with pytest.raises(ValueError, match=r"a stream wait needs its label \(op, flag, peer\)"):
        p.add(so.WAIT_GEQ, 0x10, 1)
    with pytest.raises(ValueError, match="other kinds take none"):
        p.add(so.WRITE, 0x10, 1, label=("Op", "f", 1))
    with pytest.raises(ValueError, match=r"label \('Op', 'f'\): expected \(op, flag, peer\)"):
        p.add(so.WAIT_GEQ, 0x10, 1, label=("Op", "f"))


# ------------------------------------------------------------------------------- the watchdog, the job
def test_a_wait_that_never_ends_is_said_published_and_stops_its_rank(exits, capsys):
    """A program's wait issued with a bound of 0.3 s that the GPU never passes: within about a second this rank's
    watchdog says which wait (op, flag, the rank that sets it, its address and value), publishes it as a wait that
    gave up, and ends its process (exit 1); the other rank's watchdog then stops that one, naming rank 1's wait.
    A wait that passed is never said."""
    store = FakeStore()
    ok = program(0.3, label=("AGGemm", "freed[0]", 0), flag=0x7f0020)
    ok.run(issue, 0x5000)
    passed(ok)
    stuck = program(0.3, label=("AGGemm", "ready[0]", 0))
    stuck.run(issue, 0x5000)
    t0 = time.monotonic()
    dog = start_dog(fake_rt(1), store)
    try:
        assert until(lambda: exits), "the watchdog of the rank that waits did not stop it"
    finally:
        passed(stuck)    # (no other watchdog, of this test or a later one, may find it overdue)
        dog.stop.set()
        dog.join(5)
    assert time.monotonic() - t0 < 10 and exits == [1]
    who, msg, wait = diagnostics.parse_failure(store.get(diagnostics.failure_key(1)).decode())
    assert (who, wait) == (1, True)
    assert msg.startswith("rank 1: AGGemm's stream wait for flag ready[0] (set by rank 0) gave up: call 1 of this "
                          "wait was issued "), msg
    assert "flag at 0x7f0010 did not become >= 1" in msg and "TILESCALE_WAIT_TIMEOUT_S" in msg, msg
    other = start_dog(fake_rt(0), store)          # (a rank of its own: the table above is no longer overdue)
    try:
        assert until(lambda: len(exits) >= 2)     # (os._exit is a stub: it stops it again at each poll)
    finally:
        other.stop.set()
        other.join(5)
    assert set(exits) == {1}
    err = capsys.readouterr().err
    assert f"tilescale: {msg}" in err, err
    assert f"rank 0 stops: rank 1 failed: {msg}" in err, err
    assert "freed[0]" not in err


def test_the_watchdog_leaves_waits_alone_while_their_calls_are_in_time(exits):
    store = FakeStore()
    p = program(30)
    p.run(issue, 0x5000)
    dog = start_dog(fake_rt(1), store)
    threading.Event().wait(0.5)       # many polls
    dog.stop.set()
    dog.join(5)
    passed(p)
    assert exits == [] and not store.check([diagnostics.failure_key(1)])


# --------------------------------------------------------------------------------- finalize, bounded
def test_finalize_never_waits_forever_for_this_ranks_gpu(monkeypatch):
    """finalize() after every rank got there: this rank's GPU never ends its work (a stream wait no bound covers:
    a replay of a captured call). The watchdog still runs while it synchronizes (a watched wait that gives up then
    is said and stops the job); the synchronize gives up after the bound: the other ranks are told, and finalize
    raises WaitTimeoutError naming the cause, without the collective teardown."""
    import torch.distributed as dist

    from tilescale import heap, runtime
    from tilescale.errors import WaitTimeoutError

    store = dist.HashStore()
    rt = fake_rt(1)
    rt.info.world_size, rt.info.shared_gpu = 1, False       # (no agreement of the ranks: world size 1)
    rt.watchdog = types.SimpleNamespace(store=store, reported=False, stop=threading.Event())
    rt.closed, rt.generation, rt.mpg_lock_holder, rt.device = False, 9, False, None
    rt.shim = types.SimpleNamespace(ts_finalize=lambda: pytest.fail("NVSHMEM shut down after a failed sync"))
    monkeypatch.setattr(runtime, "_RT", rt)
    monkeypatch.setattr(heap, "free_all", lambda r: pytest.fail("a collective free after a failed sync"))
    never, watched = threading.Event(), []

    def sync(device=None):
        watched.append(rt.watchdog.stop.is_set())
        never.wait(60)

    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    out = {}

    def fin():
        try:
            runtime.finalize()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t0 = time.monotonic()
    with settings.scope(wait_timeout_s=0.3):
        t = threading.Thread(target=fin, daemon=True)
        t.start()
        t.join(20)
    never.set()
    assert not t.is_alive(), "finalize() waited for the GPU beyond the bound"
    assert watched == [False], "the watchdog was stopped before the synchronize"
    assert 0.3 <= time.monotonic() - t0 < 15
    e = out.get("error")
    assert isinstance(e, WaitTimeoutError), e
    assert "rank 1: tilescale.finalize() gave up after 0.3 s" in str(e) and "GPU work to end" in str(e), e
    who, told, wait = diagnostics.parse_failure(store.get(diagnostics.failure_key(9)).decode())
    assert who == 1 and "GPU work to end" in told
    assert rt.closed and runtime._RT is None and rt.watchdog.stop.is_set()


def test_a_device_wait_that_gave_up_names_the_stream_waits_it_may_have_waited_behind(exits, capsys):
    """A kernel's wait gave up (AG+GEMM's tile waiting for a chunk) while a stream wait of this rank issued before it
    began had not ended (the copy stream's wait for the peer's flag, which would have brought the chunk): the record
    the watchdog says and publishes names that stream wait too (op, flag, rank). A stream wait issued after the
    device wait began, or passed, is not named."""
    import struct

    before, after = program(30), program(30, label=("AGGemm", "freed[0]", 0), flag=0x7f0020)
    for p in (before, after):
        p.run(issue, 0x5000)
    slot = (ctypes.c_uint64 * 4).from_address(before.watches[("AGGemm", "ready[1]", 1)])
    slot[2] = time.monotonic_ns() - 4 * 10**9      # issued 4 s ago; the device wait began 3 s before the poll
    slot = (ctypes.c_uint64 * 4).from_address(after.watches[("AGGemm", "freed[0]", 0)])
    slot[2] = time.monotonic_ns() + 3600 * 10**9   # issued after it began, however late the watchdog polls
    store = FakeStore()
    rt = fake_rt(0)
    raw = struct.pack(diagnostics._FMT, 1, 0, 3, 0, 0, 3, 64, 0, 0, 0x10, 1, 0, int(3e9))
    rt.wait_diag[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dog = start_dog(rt, store)
    try:
        assert until(lambda: store.check([diagnostics.failure_key(1)]))
    finally:
        passed(before)
        passed(after)
        dog.stop.set()
        dog.join(5)
    who, msg, wait = diagnostics.parse_failure(store.get(diagnostics.failure_key(1)).decode())
    assert (who, wait) == (0, True) and "gave up after 3.0 s" in msg, msg
    assert re.search(r"Stream waits of this rank that had not ended since before it began: AGGemm's stream wait for "
                     r"flag ready\[1\] \(set by rank 1\), issued \d+\.\d s ago$", msg), msg
    assert "freed[0]" not in msg and exits == []
    assert msg in capsys.readouterr().err


def test_a_device_wait_that_gave_up_quotes_its_line(tmp_path):
    """The record of a kernel's wait names the signal it waited for: the wait's line of source, quoted (AG+GEMM's
    tiles: ``T.wait_until(arrived[...], ...)``), when the line can be read."""
    from tilescale.language import distributed as D

    src = tmp_path / "kernel.py"
    src.write_text("x = 1\n    T.wait_until(arrived[src * chunks + chunk], cmp='ge', value=1)\n")
    D.WAIT_SITES[424242] = f"{src}:2"
    rec = dict(rank=0, block=3, thread=0, site=424242, cmp=3, bits=64, addr=0x10, expected=1, observed=0,
               elapsed_ns=int(5e9))
    try:
        msg = diagnostics.describe(rec)
        assert msg.endswith(". The wait: T.wait_until(arrived[src * chunks + chunk], cmp='ge', value=1)"), msg
        D.WAIT_SITES[424242] = f"{tmp_path / 'gone.py'}:2"
        assert "The wait:" not in diagnostics.describe(rec)
    finally:
        del D.WAIT_SITES[424242]


def test_waits_the_driver_would_not_let_us_watch_are_said_once(exits, capsys):
    """A wait whose progress write the driver refused (the shim's ts_watch_failures) is not bounded: the op's calls
    go on, and the watchdog says so once, naming the setting it cannot honour."""
    rt = fake_rt(1)
    rt.shim = types.SimpleNamespace(ts_watch_failures=lambda: 3)
    dog = start_dog(rt, FakeStore())
    threading.Event().wait(0.3)       # many polls
    dog.stop.set()
    dog.join(5)
    err = capsys.readouterr().err
    assert err.count("could not be watched") == 1 and "TILESCALE_WAIT_TIMEOUT_S does not bound them" in err
    assert exits == []


def test_the_shim_writes_a_waits_progress_with_the_default_flags():
    """CUDA 12's stream memory operations (the _v2 entry points) refuse CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER with
    CUDA_ERROR_INVALID_VALUE, which failed every AG+GEMM call on GPUs; a refused write leaves the wait unwatched."""
    src = (Path(__file__).resolve().parent.parent / "tilescale" / "csrc" / "ts_runtime.cu").read_text()
    body = src[src.index("int watch_wait("):src.index("int watch_wait(") + 900]
    assert "NO_MEMORY_BARRIER)" not in src and "CU_STREAM_WRITE_VALUE_DEFAULT" in body
    assert "g_watch_failures" in body and "return 0;" in body
