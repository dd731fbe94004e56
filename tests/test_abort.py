"""Job-wide abort and bounded barriers on CPU: a rank's failure is published once in the job's store and
every other rank's watchdog stops its process naming that rank and error; a rank reporting its own error is
left to do so; barriers are tilescale's bounded ones. (On GPUs: tests/test_gpu_teardown.py, test_faults.)"""
import os
import threading
import time
import types

import pytest
import torch

from tilescale import diagnostics


class FakeStore:
    def __init__(self):
        self.kv = {}
        self.lock = threading.Lock()

    def set(self, k, v):
        with self.lock:
            self.kv[k] = v.encode() if isinstance(v, str) else v

    def check(self, keys):
        with self.lock:
            return all(k in self.kv for k in keys)

    def get(self, k):
        with self.lock:
            return self.kv[k]


GEN = 1                           # the runtime generation of fake_rt
KEY = diagnostics.failure_key(GEN)


def fake_rt(rank):
    info = types.SimpleNamespace(rank=rank, world_size=2)
    return types.SimpleNamespace(info=info, wait_diag=torch.zeros(128, dtype=torch.uint8), watchdog=None,
                                 generation=GEN, init_timeout_s=300.0)


@pytest.fixture
def exits(monkeypatch):
    calls = []
    monkeypatch.setattr(diagnostics.os, "_exit", lambda code: calls.append(code))
    monkeypatch.setattr(diagnostics.time, "sleep", lambda s: None)
    diagnostics.failing.clear()
    yield calls
    diagnostics.failing.clear()


def start_dog(rt, store):
    dog = diagnostics.Watchdog(rt, interval_s=0.01)
    dog.store = store
    rt.watchdog = dog
    dog.start()
    return dog


def test_a_failure_stops_the_other_ranks(exits, capsys):
    store = FakeStore()
    failed, other = fake_rt(1), fake_rt(0)
    failed.watchdog = types.SimpleNamespace(store=store, reported=False)
    dog = start_dog(other, store)
    diagnostics.publish_failure(failed, "RuntimeError: boom on rank 1")
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    dog.stop.set()
    dog.join(5)
    assert exits and exits[0] == 1, "the other rank's watchdog did not stop its process"
    err = capsys.readouterr().err
    assert "rank 0 stops: rank 1 failed: RuntimeError: boom on rank 1" in err, err


def test_the_first_failure_is_the_one_reported():
    store = FakeStore()
    a, b = fake_rt(0), fake_rt(1)
    a.watchdog = types.SimpleNamespace(store=store, reported=False)
    b.watchdog = types.SimpleNamespace(store=store, reported=False)
    diagnostics.publish_failure(b, "ValueError: first")
    diagnostics.publish_failure(a, "ValueError: second")
    assert store.get(KEY).decode() == "1|ValueError: first"
    assert a.watchdog.reported and b.watchdog.reported       # neither watchdog reports a second time


def test_a_wait_that_gave_up_gives_its_rank_time_to_report_before_the_others_stop(monkeypatch, capsys):
    """A wait record published by rank 1's watchdog: rank 0 says it stops, then waits STOP_GRACE_S (rank 1
    raises WaitTimeoutError and reports it meanwhile) before it exits; an error (traceback already printed)
    stops it after half a second."""
    slept, calls = [], []
    monkeypatch.setattr(diagnostics.os, "_exit", lambda code: calls.append(code))
    monkeypatch.setattr(diagnostics.time, "sleep", slept.append)
    diagnostics.failing.clear()
    for value, grace in (("1|wait|rank 1, block 0, thread 0: T.wait_until at x.py:3 gave up", diagnostics.STOP_GRACE_S),
                         ("1|RuntimeError: boom", 0.5)):
        store = FakeStore()
        store.set(KEY, value)
        dog = start_dog(fake_rt(0), store)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.perf_counter()
        dog.stop.set()
        dog.join(5)
        assert calls == [1] and slept[-1] == grace, (value, calls, slept)
        calls.clear()
    assert diagnostics.STOP_GRACE_S >= 3
    err = capsys.readouterr().err
    assert "rank 0 stops: rank 1 failed: rank 1, block 0, thread 0: T.wait_until at x.py:3 gave up" in err, err
    assert "wait|" not in err


def test_a_wait_record_is_published_with_its_kind_once(monkeypatch):
    import struct

    store = FakeStore()
    rt = fake_rt(1)
    raw = struct.pack(diagnostics._FMT, 1, 1, 0, 0, 0, 0, 64, 0, 0, 0x10, 5, 4, int(3e9))
    rt.wait_diag[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dog = start_dog(rt, store)
    deadline = time.monotonic() + 10
    while not store.check([KEY]) and time.monotonic() < deadline:
        time.sleep(0.01)
    dog.stop.set()
    dog.join(5)
    who, msg, wait = diagnostics.parse_failure(store.get(KEY).decode())
    assert (who, wait) == (1, True) and msg.startswith("rank 1, block 0, thread 0:") and "gave up" in msg
    assert diagnostics.parse_failure("1|ValueError: a|b") == (1, "ValueError: a|b", False)


def test_an_error_left_by_a_wait_that_gave_up_is_reported_as_that_wait(capsys):
    """A rank whose wait gave up raises CUDA's launch failure at its next synchronize, maybe before its
    watchdog polled: its own report says and publishes the wait's record, not the bare CUDA error; without a
    record, the error itself."""
    import struct

    store = FakeStore()
    rt = fake_rt(1)
    rt.watchdog = types.SimpleNamespace(store=store, reported=False)
    raw = struct.pack(diagnostics._FMT, 1, 1, 0, 0, 0, 0, 64, 0, 0, 0x10, 5, 4, int(5e9))
    rt.wait_diag[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    diagnostics.report_own_failure(rt, RuntimeError("CUDA error: unspecified launch failure"))
    who, msg, wait = diagnostics.parse_failure(store.get(KEY).decode())
    assert (who, wait) == (1, True) and "gave up after 5.0 s" in msg, msg
    assert "tilescale: rank 1: rank 1, block 0, thread 0: T.wait_until" in capsys.readouterr().err
    half = fake_rt(1)      # a record claimed (flag 2) but the kernel stopped before it was written
    half.watchdog = types.SimpleNamespace(store=(store3 := FakeStore()), reported=False)
    raw = struct.pack(diagnostics._FMT, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    half.wait_diag[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    diagnostics.report_own_failure(half, RuntimeError("CUDA error: unspecified launch failure"))
    who, msg, wait = diagnostics.parse_failure(store3.get(KEY).decode())
    assert (who, wait) == (1, True) and "gave up" in msg and "before its record was complete" in msg, msg
    assert "tilescale: rank 1: a T.wait_until gave up" in capsys.readouterr().err
    plain = fake_rt(0)
    plain.watchdog = types.SimpleNamespace(store=(store2 := FakeStore()), reported=False)
    diagnostics.report_own_failure(plain, ValueError("bad input\nsecond line"))
    assert store2.get(KEY).decode() == "0|ValueError: bad input"
    assert capsys.readouterr().err == ""


def test_a_rank_reporting_its_own_error_is_not_stopped_first(exits):
    store = FakeStore()
    store.set(KEY, "1|RuntimeError: boom")
    diagnostics.failing.set()
    dog = start_dog(fake_rt(0), store)
    time.sleep(0.2)
    dog.stop.set()
    dog.join(5)
    assert exits == []


def test_own_report_does_not_stop_itself(exits):
    store = FakeStore()
    store.set(KEY, "0|RuntimeError: mine")
    dog = start_dog(fake_rt(0), store)
    time.sleep(0.2)
    dog.stop.set()
    dog.join(5)
    assert exits == []


def test_waits_are_bounded_by_default(monkeypatch):
    from tilescale.env import settings

    monkeypatch.delenv("TILESCALE_WAIT_TIMEOUT_S", raising=False)
    assert settings.wait_timeout_s == 100.0


def test_barriers_are_tilescales_bounded_ones():
    """T.barrier_all / T.sync_all emit tilescale's barrier (a bounded wait per peer), not NVSHMEM's own,
    and the barrier names itself in a timeout record."""
    from tilescale.language import distributed as D

    assert all(v is None or v.startswith("tilescale::") for v in (*D._BARRIER_SCOPES.values(),
                                                                   *D._SYNC_SCOPES.values()))
    rec = dict(rank=0, block=0, thread=0, site=D.BARRIER_SITE, cmp=3, bits=64, addr=0x10, expected=5, observed=4,
               elapsed_ns=int(3e9))
    assert "a barrier of all ranks" in diagnostics.describe(rec)
    from pathlib import Path

    ops = (Path(D.__file__).resolve().parents[1] / "include" / "tilescale" / "ops.cuh").read_text()
    end = ops.index("template <int G>\n__device__ __forceinline__ void barrier_all")
    body = ops[ops.index("void barrier_one_thread"):end]
    assert "wait_until<unsigned long long>" in body and "kBarrierSite" in body


def test_barrier_module_builds_with_its_host_entry(tmp_path):
    """The module behind tilescale.barrier() compiles and links for sm_90a and exports the host function the
    runtime calls; its kernel uses the bounded barrier."""
    import subprocess

    from tilescale import compiler

    r = compiler.barrier_jit().build(2)
    assert "tilescale::barrier_all<1>" in r.source
    syms = subprocess.run(["nm", "-D", "--defined-only", r.library], stdout=subprocess.PIPE, text=True).stdout
    assert "tilescale_module_barrier" in syms and "tilescale_module_init" in syms, syms[-2000:]


# ------------------------------------------------------------- finalize: a collective teardown, bounded
def test_late_ranks_is_a_bounded_barrier_in_the_store():
    import torch.distributed as dist

    store = dist.HashStore()
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, diagnostics.late_ranks(store, "k", r, 3, 10)))
               for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == {0: [], 1: [], 2: []}
    t0 = time.monotonic()
    assert diagnostics.late_ranks(store, "k2", 2, 3, 0.2) == [0, 1]      # alone: gives up, names the others
    assert 0.2 <= time.monotonic() - t0 < 5


def test_finalize_alone_gives_up_within_the_bound_and_tells_the_others(monkeypatch):
    """A rank that calls finalize() while the others still run collectives (an error it caught, then a normal
    exit): instead of waiting forever in NVSHMEM's collective free, it gives up after the wait bound, tells the
    other ranks (their watchdogs stop them naming it) and raises WaitTimeoutError."""
    import torch.distributed as dist

    from tilescale import runtime
    from tilescale.env import settings
    from tilescale.errors import WaitTimeoutError

    store = dist.HashStore()
    rt = fake_rt(1)
    rt.watchdog = types.SimpleNamespace(store=store, reported=False, stop=threading.Event())
    rt.closed, rt.generation = False, 7
    rt.mpg_lock_holder = True    # shared-GPU mode: this rank holds the host lock through the teardown...
    monkeypatch.setattr(runtime, "_mpg_lock", runtime.HostLock(f"tilescale-test-{os.getpid()}-{time.time_ns()}"))
    monkeypatch.setattr(runtime, "_RT", rt)
    seen, late = [], runtime._late_to_finalize
    monkeypatch.setattr(runtime, "_late_to_finalize", lambda r: seen.append(runtime._mpg_lock.held) or late(r))
    t0 = time.monotonic()
    with settings.scope(wait_timeout_s=0.3), pytest.raises(WaitTimeoutError) as ei:
        runtime.finalize()
    assert seen == [True] and not runtime._mpg_lock.held   # ...and gives it back however the teardown ends
    assert 0.3 <= time.monotonic() - t0 < 10
    msg = str(ei.value)
    assert "rank 1: tilescale.finalize() gave up after 0.3 s" in msg and "rank(s) 0 to call it too" in msg, msg
    who, told, wait = diagnostics.parse_failure(store.get(diagnostics.failure_key(7)).decode())
    assert (who, wait) == (1, False) and told.startswith("WaitTimeoutError: rank 1: tilescale.finalize() gave up")
    assert rt.closed and runtime._RT is None and rt.watchdog.stop.is_set()


def test_finalize_waits_for_the_host_lock_as_long_as_init_did(monkeypatch):
    """The shared-GPU mode's host lock at finalize() is waited for as long as init_distributed(timeout_s=...) waited
    for it (before: 300 s whatever the job chose)."""
    from tilescale import runtime

    rt = fake_rt(0)
    rt.watchdog = types.SimpleNamespace(store=FakeStore(), reported=False, stop=threading.Event())
    rt.closed, rt.generation, rt.mpg_lock_holder, rt.init_timeout_s = False, 3, True, 42.0
    waits = []

    def acquire(timeout_s, what):
        waits.append((timeout_s, what))
        raise RuntimeError("stop here")

    monkeypatch.setattr(runtime, "_RT", rt)
    monkeypatch.setattr(runtime, "_mpg_lock", types.SimpleNamespace(acquire=acquire, release=lambda: None))
    with pytest.raises(RuntimeError, match="stop here"):
        runtime.finalize()
    assert waits == [(42.0, "rank 0: tilescale.finalize()")]


def test_finalize_after_a_trapped_kernel_only_closes(monkeypatch):
    """A wait record means a kernel trapped and the CUDA context is gone: finalize() closes the runtime (watchdog
    stopped) without its collective teardown, without the agreement and without the host lock."""
    import struct

    from tilescale import runtime

    rt = fake_rt(0)
    rt.watchdog = types.SimpleNamespace(store=FakeStore(), reported=True, stop=threading.Event())
    rt.closed, rt.generation, rt.mpg_lock_holder = False, 3, True
    raw = struct.pack(diagnostics._FMT, 1, 0, 0, 0, 0, 0, 64, 0, 0, 0x10, 5, 4, int(5e9))
    rt.wait_diag[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    monkeypatch.setattr(runtime, "_RT", rt)
    monkeypatch.setattr(runtime, "_late_to_finalize", lambda r: pytest.fail("no agreement after a trap"))
    monkeypatch.setattr(runtime, "_mpg_lock", types.SimpleNamespace(
        acquire=lambda *a: pytest.fail("no host lock after a trap"), release=lambda: None))
    runtime.finalize()
    assert rt.closed and runtime._RT is None and rt.watchdog.stop.is_set()


def test_call_number_stops_a_kernel_without_printf_and_says_why():
    """T.call_number's check (a block with no counter) writes a wait record of its own site, said by the host, and
    calls no printf: a call anywhere in a kernel makes ptxas serialise its wgmma pipeline (C7510), which cost the
    GEMM+RS GEMM (it counts its calls) 0.85-0.91 of cuBLAS on one H200."""
    import re
    from pathlib import Path

    from tilescale.language import distributed as D

    ops = (Path(D.__file__).resolve().parents[1] / "include" / "tilescale" / "ops.cuh").read_text()
    def body(fn):
        b = ops[ops.index(f"__device__ __forceinline__ uint64_t {fn}("):]
        return b[:b.index("\n}\n")]

    for fn in ("call_number", "call_number_warp"):            # both scopes count through count_call
        assert "count_call(counters, n)" in body(fn) and "printf" not in body(fn)
    assert "printf" not in body("count_call") and "wait_timed_out(" in body("count_call")
    assert "kCallNumberSite" in body("count_call")
    assert int(re.search(r"constexpr int kCallNumberSite = (-?\d+);", ops).group(1)) == D.CALL_NUMBER_SITE
    rec = dict(rank=1, block=7, thread=0, site=D.CALL_NUMBER_SITE, cmp=3, bits=64, addr=0x20, expected=6, observed=7,
               elapsed_ns=0)
    msg = diagnostics.describe(rec)
    assert "T.call_number: block 7 of the grid has no counter" in msg and "holds 6" in msg


# ------------------------------------------------------------- a runtime generation's failures are its own
def test_a_failure_caught_in_one_runtime_does_not_stop_the_next_one(exits):
    """A job that caught a failure (a wait that gave up, an error it handled), finalized and started tilescale again:
    the failure stays in the job's store, but it was its previous runtime's; the new runtime's watchdogs leave
    their ranks be. A failure of the new runtime still stops them."""
    store = FakeStore()
    old = fake_rt(1)
    old.watchdog = types.SimpleNamespace(store=store, reported=False)
    diagnostics.publish_failure(old, "ValueError: caught and handled by the job")
    new = fake_rt(0)
    new.generation = GEN + 1
    dog = start_dog(new, store)
    threading.Event().wait(0.5)       # (time.sleep is stubbed out here): many polls of the watchdog
    assert exits == [], "the new runtime's watchdog stopped its rank for the previous runtime's failure"
    failed = fake_rt(1)
    failed.generation = GEN + 1
    failed.watchdog = types.SimpleNamespace(store=store, reported=False)
    diagnostics.publish_failure(failed, "RuntimeError: a failure of the new runtime")
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    dog.stop.set()
    dog.join(5)
    # os._exit is recorded, not done: the watchdog may poll (and stop) again before it is told to end
    assert exits and set(exits) == {1}, exits


# ------------------------------------------------------------- finalize's errors are said, not hidden
def test_finalize_at_exit_says_its_errors_on_stderr(monkeypatch, capsys):
    """At exit finalize() must not raise into a clean exit, but its errors (a host lock that timed out, a module
    that did not finalize) are said on stderr, not logged at debug level where nobody sees them."""
    from tilescale import runtime
    from tilescale.errors import TileScaleError

    def fail():
        raise TileScaleError("rank 0: tilescale.finalize(): waited 300 s for the host lock")

    monkeypatch.setattr(runtime, "finalize", fail)
    runtime._finalize_at_exit()
    err = capsys.readouterr().err
    assert "tilescale.finalize() at exit failed: TileScaleError: rank 0: tilescale.finalize(): waited 300 s" in err, err


class _ModuleFinalize:
    restype = None

    def __init__(self, rc):
        self.rc, self.calls = rc, 0

    def __call__(self):
        self.calls += 1
        return self.rc


def test_finalize_checks_each_modules_finalize_and_ends_the_teardown(monkeypatch):
    """nvshmemx_cumodule_finalize's return code is checked: every module is finalized, NVSHMEM is shut down and the
    runtime closed, then finalize() raises naming the kernel whose module failed and its code."""
    from tilescale import heap, runtime
    from tilescale.errors import TileScaleError

    rt = fake_rt(0)
    rt.info.world_size = 1
    rt.info.shared_gpu = False
    good, bad = _ModuleFinalize(0), _ModuleFinalize(-2)
    rt.modules = {1: types.SimpleNamespace(tilescale_module_finalize=good),
                  2: types.SimpleNamespace(tilescale_module_finalize=bad)}
    rt.module_names = {1: "ring", 2: "gemm_rs_push"}
    shut = []
    rt.shim = types.SimpleNamespace(ts_finalize=lambda: shut.append(True))
    rt.closed, rt.created_pg, rt.mpg_lock_holder, rt.device = False, False, False, None
    monkeypatch.setattr(runtime, "_RT", rt)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(heap, "free_all", lambda r: None)
    with pytest.raises(TileScaleError) as e:
        runtime.finalize()
    assert "kernel 'gemm_rs_push' (rc -2)" in str(e.value) and "ring" not in str(e.value), str(e.value)
    assert good.calls == bad.calls == 1 and shut == [True]
    assert rt.closed and runtime._RT is None
