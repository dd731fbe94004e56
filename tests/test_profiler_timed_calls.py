"""The runtime shim's timed calls (issue 15: the profiler's record of an AllGather call made in C, not Python): the shim
(nvcc against the stub libcuda, with NVSHMEM's host library) is loaded in a subprocess that runs this file as a script
(the pattern of tests/test_ag_gemm_host_cpu.py's shim test: no shim in the pytest process) and makes AllGather calls
without a GPU: an op made by ``object.__new__`` whose C entry point is a ctypes callback (a real C function pointer
that the shim calls; it notes its arguments and the time). Each test reads one scenario of its report.

    python tests/test_profiler_timed_calls.py      # the report (JSON on the line starting with RESULT)
"""
import ctypes
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VP = ctypes.c_void_p
# the kernel's `call` as tilelang writes it: pointers, `int n`, the stream (the shim passes 6 words: the int is the
# low half of its register)
ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, VP, VP, VP, VP, ctypes.c_int, VP)
PTRS, STREAM, N = (0x7F0000100000, 0x7F0000200000, 0x7F0000300000), 7, 512 * 1024


# ------------------------------------------------------------------------------------- source and signatures
def test_the_shim_declares_its_timed_calls():
    """The C signatures, the ctypes ones (runtime._SIGS) and the ts_timed_fn that session.timed_call makes (entry,
    record, 6 arguments, the 2 indices of those given per call) agree; the built shim exports the functions and the two
    counters the session reads."""
    from tilescale import runtime

    src = runtime.SHIM_SOURCE.read_text()
    assert "int ts_timed_call(const ts_timed_fn* call, uintptr_t a, uintptr_t b)" in src
    assert "long long ts_timed_take(void* out, long long limit)" in src
    assert "void ts_timed_group(long long group)" in src and "void ts_timed_reset()" in src
    assert "int (*fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);\n  long long record;" in src
    assert "uintptr_t args[6];" in src and "int vary[2];" in src and "sizeof(ts_timed_fn) == 72" in src
    assert "std::atomic<long long> ts_timed_pending{0}, ts_timed_lost{0};" in src
    assert "clock_gettime(CLOCK_MONOTONIC, &t);" in src
    sigs = runtime._SIGS
    assert sigs["ts_timed_call"] == ([VP] * 3, ctypes.c_int)
    assert sigs["ts_timed_take"] == ([VP, ctypes.c_longlong], ctypes.c_longlong)
    assert sigs["ts_timed_group"] == ([ctypes.c_longlong], None) and sigs["ts_timed_reset"] == ([], None)
    from tilescale.profiler import session

    at = session.timed_call(0x1234, 5, (0, 11, 12, 13, 14, 0), (0, 5))
    assert ctypes.sizeof(session.TimedFn) == 72
    assert list((ctypes.c_uint64 * 8).from_address(at)) == [0x1234, 5, 0, 11, 12, 13, 14, 0]
    assert list((ctypes.c_int32 * 2).from_address(at + 64)) == [0, 5]
    for args, vary in (((0,) * 5, (0, 5)), ((0,) * 6, (0, 0)), ((0,) * 6, (0, 6))):
        with pytest.raises(ValueError, match="timed_call"):
            session.timed_call(0x1234, 5, args, vary)
    try:
        from tilescale import discovery

        so = runtime._shim_path(discovery.find_nvshmem())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no NVSHMEM or nvcc: {e}")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], stdout=subprocess.PIPE, text=True).stdout
    for name in ("ts_timed_call", "ts_timed_take", "ts_timed_group", "ts_timed_reset"):
        assert re.search(rf"\bT {name}\b", syms), name
    for name in ("ts_timed_pending", "ts_timed_lost"):
        assert re.search(rf"\b[BD] {name}\b", syms), name


# ------------------------------------------------------------------------------------------- the scenarios
@pytest.fixture(scope="module")
def report():
    """The scenarios below, run with the real shim in a subprocess."""
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, __file__], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600, cwd=REPO)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None and ("NO SHIM" in r.stdout or "libcuda" in r.stdout):
        pytest.skip(f"the shim cannot be loaded here: {r.stdout[-300:]}")
    assert r.returncode == 0 and line is not None, r.stdout[-4000:]
    return json.loads(line[len("RESULT "):])


def shape(events):
    return [(e["id"], e["parent"], e["type"], e["name"], e["track"], e["args"], e["states"]) for e in events]


def test_a_timed_call_is_one_coll_call_and_launch(report):
    """A call in a session of host events goes through the shim (its record waits in the shim, none in Python's raw
    list), and becomes a COLL call with its LAUNCH, at the top level."""
    r = report["one"]
    assert r["timed"] and r["raw_after_call"] == 0 and r["pending_after_call"] == 1
    assert [(e["type"], e["name"]) for e in r["events"]] == [("COLL", "AllGather"), ("LAUNCH", "allgather")]
    coll, launch = r["events"]
    assert coll["parent"] is None and launch["parent"] == coll["id"] and coll["args"] == {"bytes": 2 * N}
    assert (launch["start_ns"], launch["end_ns"]) == (coll["start_ns"], coll["end_ns"])
    assert r["t_before"] <= coll["start_ns"] <= coll["end_ns"] <= r["t_after"]   # on the wall clock


def test_the_shim_calls_the_entry_with_the_calls_arguments_between_its_clock_reads(report):
    """Each call reaches the op's C entry once with (x, out, arrived, counters, n, stream), `n` read as the C int it
    is; the entry ran between the record's two times, on perf_counter's clock (CLOCK_MONOTONIC)."""
    r = report["order"]
    assert r["entry_args"] == [[report["x_at"], *PTRS, N, STREAM]] * 6
    quick = r["quick"]
    assert len(quick) == 6
    for (_, _, t0, t1), t in zip(quick, r["entry_times"], strict=True):
        assert t0 <= t <= t1, (t0, t, t1)


def test_timed_calls_keep_their_place_among_the_sessions_records(report):
    """Calls timed by the shim, Python-side records (another op's OpCall, a call recorded in Python) and groups, in
    one sequence: the same events, ids, parents (the group open at each call) and order as when Python records every
    call (the shim's records are moved in before each record of the session's own)."""
    r = report["order"]
    assert r["timed"] and not report["order_python"]["timed"]
    assert shape(r["events"]) == shape(report["order_python"]["events"])
    byid = {e["id"]: e for e in r["events"]}
    assert [(e["name"], byid[e["parent"]]["name"] if e["parent"] else None) for e in r["events"]
            if e["type"] == "COLL"] == [("AllGather", None), ("AllGather", "step"), ("Other", "step"),
                                        ("AllGather", "step"), ("AllGather", "step"), ("AllGather", "inner"),
                                        ("AllGather", "step"), ("AllGather", None)]
    for e in r["events"]:
        parent = byid.get(e["parent"])
        if parent is not None:
            assert parent["start_ns"] <= e["start_ns"] <= e["end_ns"] <= parent["end_ns"], (parent, e)
    starts = [e["start_ns"] for e in r["events"] if e["type"] in ("COLL", "GROUP")]
    assert starts == sorted(starts)


def test_a_failed_launch_through_the_shim_raises_and_leaves_no_record(report):
    """A nonzero return of the entry raises the op's launch error (the kernel library's last error), counts no call
    and records nothing; the next call records as usual."""
    r = report["failure"]
    assert r["error"] == "RuntimeError: allgather kernel launch failed: boom (injected)"
    c = r["calls"][0]
    assert r["calls"] == [c, c, c + 1] and r["pending"] == [0, 0, 1] and r["entry_calls"] == 2
    assert [e["type"] for e in r["events"]] == ["COLL", "LAUNCH"]


def test_calls_without_a_c_entry_or_without_the_shims_timed_calls_are_recorded_in_python(report):
    """The tilelang launch path (no C entry point) in a session with the shim, and a session whose shim lacks the
    timed calls: the call is recorded by Python (four ints in raw, nothing in the shim), with the same events."""
    for key in ("tilelang_path", "no_timed_calls"):
        r = report[key]
        assert r["raw_after_call"] == 4 and r["pending_after_call"] == 0 and r["launches"] == 1, (key, r)
        assert [(e["type"], e["name"]) for e in r["events"]] == [("COLL", "AllGather"), ("LAUNCH", "allgather")], key
    assert report["tilelang_path"]["timed"] and not report["no_timed_calls"]["timed"]


def test_many_calls_all_arrive_in_order(report):
    """More calls than one take moves (timed_calls.TIMED_CHUNK): every one becomes its events, in the order made."""
    r = report["many"]
    assert r["calls"] > r["chunk"] and r["colls"] == r["calls"] and r["launches"] == r["calls"]
    assert r["in_order"] and r["lost"] == 0


def test_a_new_session_starts_with_an_empty_shim(report):
    """Records left in the shim (a timed call made outside any session) are not a new session's: it starts empty, at
    the top level."""
    r = report["reset"]
    assert r["pending_before"] == 1 and r["pending_at_start"] == 0
    assert [(e["type"], e["parent"]) for e in r["events"]] == [("COLL", None), ("LAUNCH", 1)]


def test_the_cpu_harness_times_a_profiled_call_through_the_shim():
    """benchmarks/host_cpu.py's profiled AllGather row: one call outside Python per call, the shim's timed entry (not
    the kernel's entry called from Python), and the profiler's cost below it; with --no-shim, Python's record."""
    pytest.importorskip("torch")
    rows = {}
    for flag in ("", "--no-shim"):
        cmd = [sys.executable, str(REPO / "benchmarks" / "host_cpu.py"), "--calls", "200", "--world", "1", flag]
        r = subprocess.run([c for c in cmd if c], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600, cwd=REPO)
        assert r.returncode == 0, r.stdout[-3000:]
        if "the runtime shim is not loaded here" in r.stdout:
            pytest.skip(r.stdout[-300:])
        lines = r.stdout.splitlines()
        rows[flag] = next(x for x in lines if x.startswith("AllGather ag(x), profiled (mask host)"))
        assert any(x.startswith("  the profiler: profiled - unprofiled") for x in lines), r.stdout
    assert rows[""].endswith("1: shim ts_timed_call x1"), rows
    assert rows["--no-shim"].endswith("1: kernel direct launch x1"), rows


# ------------------------------------------------------------------------------ the subprocess (the scenarios)
def _main() -> None:
    import torch

    import tilescale.profiler as tp
    from tilescale import discovery, runtime
    from tilescale.ops import allgather, base, checks
    from tilescale.profiler import session as profiling
    from tilescale.profiler import timed_calls
    from tilescale.profiler.default import RecordingProfiler

    try:
        lib = runtime.load_shim(discovery.find_nvshmem())
    except Exception as e:  # noqa: BLE001
        print(f"NO SHIM: {type(e).__name__}: {e}")
        raise SystemExit(0) from e
    base._capturing = bool   # (no CUDA: not capturing)
    entry_log, rc = [], [0]

    def entry(*args):
        entry_log.append(([a or 0 for a in args], time.perf_counter_ns()))
        return rc[0]

    c_entry = ENTRY(entry)
    x = torch.zeros(512, 1024, dtype=torch.bfloat16)

    def make_op(c: bool = True):
        """An AllGather of (512, 1024) bf16 shards without GPU pieces: its C entry the callback (`c`), else tilelang's
        launch path (a kernel object that notes its launches)."""
        ag = object.__new__(allgather.AllGather)
        ag.device, ag.captured = torch.device("cpu"), False
        ag._check = checks.CallCheck("AllGather")
        ag._agreed = ag._check.agreed
        ag._stream = STREAM.__index__
        ag._order = checks.StreamOrder(ag.device)
        ag._order.handle = STREAM
        ag.shape, ag.dtype, ag.n, ag.calls = (512, 1024), torch.bfloat16, N, 0
        ag.buffers = (torch.zeros(512, 1024, dtype=torch.bfloat16), torch.zeros(512, 1024, dtype=torch.bfloat16))
        ag._ptrs = PTRS
        if c:
            ag._direct = (c_entry, lambda: b"boom (injected)")
            ag._entry = ctypes.cast(c_entry, VP).value
        else:
            ag._direct, ag.launches = None, []
            ag.kernel = type("K", (), {"launch": lambda self, *a: ag.launches.append(a)})()
            ag._out3d, ag.arrived, ag.counters = None, None, None
        return ag

    def use(shim):
        profiling._runtime_shim = lambda: shim

    def events(s):
        return s.profiler.events()

    out = {"x_at": x.data_ptr()}

    # one call
    use(lib)
    ag = make_op()
    ag(x)    # the checks' first call (not profiled)
    entry_log.clear()
    t_before = time.time_ns()
    with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
        ag(x)
        one = dict(timed=s.timed is not None, raw_after_call=len(s.raw), pending_after_call=s.shim.pending.value)
    one.update(events=events(s), t_before=t_before, t_after=time.time_ns())
    out["one"] = one

    # a sequence with groups and Python-side records, with the shim's timed calls and without
    def sequence(shim):
        use(shim)
        entry_log.clear()
        ag, other = make_op(), make_op(c=False)
        ag(x)     # the checks' first calls (not profiled)
        other(x)
        entry_log.clear()
        with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
            ag(x)
            with tp.group("step", i=3):
                ag(x)
                rec = profiling.call("Other", launch="other", bytes=1)   # another op's record (OpCall)
                rec.end()
                ag(x)
                other(x)                                            # a call recorded in Python
                with tp.group("inner"):
                    ag(x)
                ag(x)
            ag(x)
            quick = []
            if s.shim is not None:   # the records in raw, in place: the quick records' perf_counter times
                s.shim.drain(s.raw)
                it = iter(s.raw)
                quick = [[r, next(it), next(it), next(it)] for r in it if type(r) is int]
                quick = [q for q in quick if q[0] == ag._record]   # (not the other op's, recorded in Python)
            timed = s.timed is not None
        return dict(timed=timed, events=events(s), quick=quick, entry_args=[a for a, _ in entry_log],
                    entry_times=[t for _, t in entry_log])

    out["order"] = sequence(lib)
    out["order_python"] = sequence(None)

    # a failed launch
    use(lib)
    ag = make_op()
    ag(x)
    entry_log.clear()
    r = dict(calls=[], pending=[])
    with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
        r["calls"].append(ag.calls)
        r["pending"].append(s.shim.pending.value)
        rc[0] = 7
        try:
            ag(x)
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {e}"
        finally:
            rc[0] = 0
        r["calls"].append(ag.calls)
        r["pending"].append(s.shim.pending.value)
        ag(x)
        r["calls"].append(ag.calls)
        r["pending"].append(s.shim.pending.value)
    r.update(entry_calls=len(entry_log), events=events(s))
    out["failure"] = r

    # the Python record: tilelang's launch path with the shim; a shim without the timed calls
    for key, shim, c in (("tilelang_path", lib, False), ("no_timed_calls", type("Shim", (), {})(), True)):
        use(shim)
        ag = make_op(c)
        ag(x)
        entry_log.clear()
        n0 = len(getattr(ag, "launches", ()))
        with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
            ag(x)
            r = dict(timed=s.timed is not None, raw_after_call=len(s.raw),
                     pending_after_call=ctypes.c_longlong.in_dll(lib, "ts_timed_pending").value,
                     launches=len(ag.launches) - n0 if not c else len(entry_log))
        r["events"] = events(s)
        out[key] = r

    # many calls: several takes
    use(lib)
    ag = make_op()
    ag(x)
    calls = 3 * timed_calls.TIMED_CHUNK + 5
    with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
        for _ in range(calls):
            ag(x)
        s.shim.drain(s.raw)
        t = s.raw[2::4]
        in_order = len(s.raw) == 4 * calls and all(a <= b for a, b in zip(t, t[1:], strict=False))
        lost = s.shim.lost.value
    ev = events(s)
    out["many"] = dict(calls=calls, chunk=timed_calls.TIMED_CHUNK, colls=sum(e["type"] == "COLL" for e in ev),
                       launches=sum(e["type"] == "LAUNCH" for e in ev), in_order=in_order, lost=lost)

    # a record left in the shim outside any session; then a session
    pending = ctypes.c_longlong.in_dll(lib, "ts_timed_pending")
    lib.ts_timed_group(5)
    lib.ts_timed_call(profiling.timed_call(ctypes.cast(c_entry, VP).value, 0, (0, *PTRS, N, 0), (0, 5)), x.data_ptr(),
                      STREAM)
    r = dict(pending_before=pending.value)
    with tp.profile(None, mask="host", profiler=RecordingProfiler(), merge=False) as s:
        r["pending_at_start"] = pending.value
        ag(x)
    r["events"] = events(s)
    out["reset"] = r

    def plain(v):   # JSON: events' types as names
        if isinstance(v, dict):
            return {k: plain(w) for k, w in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(w) for w in v]
        return v.name if hasattr(v, "name") and not isinstance(v, (int, str)) else v
    print("RESULT " + json.dumps(plain(out)))


if __name__ == "__main__":
    _main()
