"""tilescale.profiler: event hierarchy, activation mask, user profilers, TILESCALE_PROFILE, the Chrome trace
(schema, merge of ranks), in-kernel timestamp records and clocks, the timer ops (T.timestamp / T.smid),
and the AG+GEMM kernel with and without timestamps. CPU tier, except the last test (2 GPUs).

The GPU is stood in for by a fake clock: CUDA events are objects with ``elapsed_time`` and instrumented
kernels are objects that write tile records into the buffer they are given, exactly where the real
ones would; everything between (the session, the op-side helpers, decoding, the trace) is the real code.
"""
import importlib.util
import json
import math
import os
import re
import time
from pathlib import Path

import pytest

import tilescale
import tilescale.language as T
import tilescale.profiler as tp
from tilescale import testing
from tilescale.profiler import chrome_trace, records
from tilescale.profiler import session as profiling
from tilescale.profiler.default import RecordingProfiler
from tilescale.profiler.device_timeline import (
    TILE_FIELDS,
    TILE_WORDS,
    ClockSync,
    Tile,
    best_point,
    check_tiles,
    decode_tiles,
    timer_resolution_ns,
)
from tilescale.profiler.events import PARENT_TYPES, EventState, EventType

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "profiler" / "ag_gemm_profile_off.cu"
BENCH = REPO / "benchmarks" / "profile_ag_gemm.py"
SM90 = {"kind": "cuda", "arch": "sm_90a"}
AG_ARGS = (1024, 512, 2, 4, "bfloat16", 128, 256, 64, 3, 256)   # the snapshot's kernel (explicit config)
I64, U64 = "int64", "uint64"


# ------------------------------------------------------------------------------ a validator
_NUM = (int, float)
_REQUIRED = {
    "X": {"name": str, "ts": _NUM, "dur": _NUM, "pid": int, "tid": int},
    "B": {"name": str, "ts": _NUM, "pid": int, "tid": int},
    "E": {"ts": _NUM, "pid": int, "tid": int},
    "i": {"name": str, "ts": _NUM, "pid": int, "tid": int, "s": str},
    "M": {"name": str, "pid": int, "args": dict},
}


def validate_chrome_trace(trace) -> dict:
    """Check `trace` against the Chrome trace event format as tilescale writes it; returns id -> event.

    Per event: the keys its phase requires, with their types; finite numbers; dur >= 0; instant scope
    g/p/t; metadata names. Every process and thread used is named by a metadata event. Every X/i event
    has a unique args.id, and a parent that is null or the id of an event of the same process, whose
    type may be its parent's (events.PARENT_TYPES)."""
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list), "no traceEvents list"
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN / Infinity
    ids, procs, threads, used = {}, set(), set(), set()
    for n, e in enumerate(trace["traceEvents"]):
        where = f"event {n} {e!r:.200}"
        assert isinstance(e, dict) and e.get("ph") in _REQUIRED, f"{where}: unknown ph"
        for key, typ in _REQUIRED[e["ph"]].items():
            assert key in e, f"{where}: missing {key!r}"
            v = e[key]
            assert isinstance(v, typ) and not isinstance(v, bool), f"{where}: {key!r} is {type(v).__name__}"
            if typ is _NUM:
                assert math.isfinite(v), f"{where}: {key!r} not finite"
        ph = e["ph"]
        if ph == "X":
            assert e["dur"] >= 0, f"{where}: negative dur"
        if ph == "i":
            assert e["s"] in ("g", "p", "t"), f"{where}: scope {e['s']!r}"
        if ph == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), where
            if e["name"].startswith("thread"):
                assert isinstance(e.get("tid"), int), f"{where}: thread metadata without tid"
            if e["name"].endswith("_name"):
                assert isinstance(e["args"].get("name"), str), f"{where}: no name"
                (threads if e["name"] == "thread_name" else procs).add((e["pid"], e.get("tid")) if
                                                                       e["name"] == "thread_name" else e["pid"])
            else:
                assert isinstance(e["args"].get("sort_index"), int), f"{where}: no sort_index"
            continue
        used.add((e["pid"], e["tid"]))
        args = e.get("args")
        assert isinstance(args, dict), f"{where}: no args"
        assert isinstance(args.get("id"), str), f"{where}: no args.id"
        assert "parent" in args and (args["parent"] is None or isinstance(args["parent"], str)), f"{where}: parent"
        assert isinstance(args.get("type"), str), f"{where}: no args.type"
        assert args["id"] not in ids, f"{where}: duplicate id {args['id']}"
        ids[args["id"]] = e
    for eid, e in ids.items():
        p = e["args"]["parent"]
        if p is None:
            assert e["args"]["type"] in ("GROUP", "COLL", "FUSED"), f"{eid}: a {e['args']['type']} without parent"
            continue
        assert p in ids, f"{eid}: parent {p} is not in the trace"
        assert ids[p]["pid"] == e["pid"], f"{eid}: parent {p} is in another process"
        t, pt = e["args"]["type"], ids[p]["args"]["type"]
        if t != "STATE":
            assert EventType[pt] & PARENT_TYPES[EventType[t]], f"{eid}: a {t} may not have a {pt} parent"
    assert {pid for pid, _ in used} <= procs, f"unnamed processes: {sorted({p for p, _ in used} - procs)}"
    assert used <= threads, f"unnamed threads: {sorted(used - threads)}"
    return ids


def assert_tracks_nest(trace) -> None:
    """On every track, two complete events are disjoint or one contains the other (what trace viewers
    need to draw them as a stack)."""
    tracks = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], -e["dur"], e["name"]))
    for key, evs in tracks.items():
        stack = []
        for ts, neg, name in sorted(evs):
            end = ts - neg
            while stack and stack[-1][0] <= ts + 1e-9:
                stack.pop()
            assert not stack or end <= stack[-1][0] + 1e-9, f"track {key}: {name} overlaps {stack[-1][1]}"
            stack.append((end, name))


# ------------------------------------------------------------------------------- a fake GPU
class FakeEvent:
    """A completed CUDA event at GPU time `t` (ns)."""

    def __init__(self, t: int):
        self.t = t

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) / 1e6


class FakeStream:
    def __init__(self, handle: int):
        self.cuda_stream = handle


class FakeGPU:
    """A GPU clock that advances 1 us per recorded event; the clock's offset to the host is known. It starts
    where the host's clock is now (as a real GPU's maps onto the host's present): a trace then keeps the host's
    events near its origin, where float microseconds still resolve nanoseconds (events far from the origin, at
    ~1.8e15 us, would step by 0.25 us, and a LAUNCH issued 100 ns after its call could seem to end after it)."""

    OFFSET = 7_000_000
    START = time.time_ns() - OFFSET   # one start for every instance: two fresh fake GPUs give the same times

    def __init__(self):
        self.t = self.START

    def event(self, stream=None) -> FakeEvent:
        self.t += 1000
        return FakeEvent(self.t)

    def clock(self) -> ClockSync:
        return ClockSync(points=[(self.t, self.OFFSET, 250)], anchor_event=FakeEvent(self.t), anchor_gpu_ns=self.t)


@pytest.fixture
def gpu(monkeypatch):
    g = FakeGPU()
    monkeypatch.setattr(records, "record_event", lambda stream: g.event(stream))
    monkeypatch.setattr(records, "current_stream", lambda: FakeStream(7))
    return g


@pytest.fixture(autouse=True)
def clean_profiling(monkeypatch):
    for v in ("TILESCALE_PROFILE", "TILESCALE_PROFILE_MASK", "TILESCALE_PROFILE_DIR", "TILESCALE_PROFILE_DEVICE",
              "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    profiling.reset()
    tp.register_profiler(None)
    yield
    profiling.reset()
    tp.register_profiler(None)


def tile_words(rank: int, base: int, tiles_m: int = 2, tiles_n: int = 2, world: int = 2) -> list[int]:
    """Records as the instrumented AG+GEMM kernel writes them: rows of other ranks wait 300 ns."""
    words = []
    for by in range(tiles_m):
        for bx in range(tiles_n):
            rb = (by + rank * (tiles_m // world)) % tiles_m
            src = rb // (tiles_m // world)
            t0 = base + 100 * (by * tiles_n + bx)
            ready = t0 + (300 if src != rank else 4)
            words += [t0, ready, ready + 1000, (by * tiles_n + bx) % 3, src, 0, rb, bx]
    return words


class FakeKernel:
    """A kernel object as ops hold them (name, launch); the instrumented one writes tile records into its
    last argument as the GPU would."""

    def __init__(self, name: str, gpu: FakeGPU | None = None, rank: int = 0):
        self.name, self.gpu, self.rank, self.launches = name, gpu, rank, []

    def launch(self, *args):
        self.launches.append(args)
        if self.gpu is not None:
            import torch

            buf = args[-1].view(torch.int64)
            words = tile_words(self.rank, self.gpu.t + 50)
            buf[:len(words)] = torch.tensor(words, dtype=torch.int64)


def fused_call(kernel, instrumented, rank: int = 0, world: int = 2, chunks: int = 2):
    """The profiling calls of AGGemm.__call__, in its order (copies on one stream per peer, then the GEMM)."""
    import torch

    rec = profiling.call("AGGemm", "fused", M=256, N=512, K=64) if profiling.current is not None else None
    for j in range(1, world):
        src, s = (rank + j) % world, FakeStream(100 + j)
        if rec is not None:
            rec.copies_begin(s, src)
        for ch in range(chunks):
            if rec is not None:
                rec.copy_done(s, src, ch, 4096)
    a = torch.zeros(4)
    if rec is None:
        kernel.launch(a, 1)
    else:
        rec.launcher(kernel, instrumented=instrumented, tiles=4, end=True)(a, 1)


AG_LAUNCHES: list = []   # the arguments of every launch of the AllGather of coll_call


def fake_allgather():
    """An AllGather of (512, 1024) bf16 shards (1 MiB) without GPU pieces (object.__new__, as
    tests/test_graphs_cpu.py makes them): its real __call__, a direct launch that records its arguments."""
    import torch

    from tilescale.ops import allgather, checks

    ag = object.__new__(allgather.AllGather)
    ag.device, ag.captured = torch.device("cpu"), False
    ag._check = checks.CallCheck("AllGather")
    ag._agreed = ag._check.agreed
    ag._stream = (7).__index__      # the current stream's handle, as torch's raw query gives it
    ag._order = checks.StreamOrder(ag.device)
    ag._order.handle = 7
    ag.shape, ag.dtype, ag.n, ag.calls = (512, 1024), torch.bfloat16, 512 * 1024, 0
    ag.buffers = (torch.zeros(512, 1024, dtype=torch.bfloat16), torch.zeros(512, 1024, dtype=torch.bfloat16))
    ag._ptrs = (1 << 20, 2 << 20, 3 << 20)
    ag._direct = (lambda *a: AG_LAUNCHES.append(a) or 0, None)
    return ag


_AG: list = []


def coll_call():
    """One call of AllGather.__call__ (the real one, on one op object made once: its signature agreed after the
    first call, as in a run), not capturing."""
    import torch

    from tilescale.ops import base

    if not _AG:
        _AG.extend([fake_allgather(), torch.zeros(512, 1024, dtype=torch.bfloat16)])
    ag, x = _AG
    capturing, base._capturing = base._capturing, bool   # (no CUDA here: bool() is False)
    try:
        ag(x)
    finally:
        base._capturing = capturing


def by_type(events):
    out = {}
    for e in events:
        out.setdefault(e["type"], []).append(e)
    return out


# ------------------------------------------------------------------------------------ event types
def test_mask_parse_and_parents():
    assert EventType.parse("coll,launch") == EventType.COLL | EventType.LAUNCH
    assert EventType.parse("Tile | wait") == EventType.TILE | EventType.WAIT
    assert EventType.parse("0x3") == EventType.GROUP | EventType.COLL
    assert EventType.parse("all") == EventType.ALL and EventType.parse("") == EventType.NONE
    assert EventType.parse("host") == EventType.GROUP | EventType.COLL | EventType.FUSED | EventType.LAUNCH
    with pytest.raises(ValueError, match=r"TILESCALE_PROFILE_MASK='coll,tiles'.*'tiles'.*tile"):
        EventType.parse("coll,tiles", "TILESCALE_PROFILE_MASK")
    with pytest.raises(ValueError, match="bits outside"):
        EventType.parse(str(1 << 20))
    assert EventType.TILE.with_parents() == (EventType.TILE | EventType.KERNEL | EventType.LAUNCH | EventType.COLL
                                             | EventType.FUSED | EventType.GROUP)
    copy = EventType.COPY.with_parents()
    assert copy & EventType.LAUNCH and copy & EventType.FUSED and not copy & (EventType.KERNEL | EventType.TILE)
    assert EventType.GROUP.with_parents() == EventType.GROUP
    # every type's parents are above it: with_parents of a type includes the types its parent may have
    for t, parents in PARENT_TYPES.items():
        assert (t.with_parents() & parents) == parents


# -------------------------------------------------------------------------------------- hierarchy
def test_hierarchy_from_group_to_tiles(gpu):
    with tp.profile(None, clock=gpu.clock(), rank=0, world_size=2, merge=False) as s:
        with tp.group("step 1"):
            fused_call(FakeKernel("ag_gemm"), FakeKernel("ag_gemm", gpu, rank=0))
            coll_call()
        assert not {"TILE", "COPY"} & {e["type"] for e in s.profiler.events()}   # device events: at the end
    events = s.profiler.events()
    byid = {e["id"]: e for e in events}
    t = by_type(events)
    assert [len(t[k]) for k in ("GROUP", "FUSED", "COLL", "COPY", "WAIT", "TILE")] == [1, 1, 1, 2, 2, 4]
    assert len(t["KERNEL"]) == 2 and len(t["LAUNCH"]) == 3  # GEMM + allgather; copies, GEMM, allgather

    def chain(e):
        out = [e["type"]]
        while e["parent"] is not None:
            e = byid[e["parent"]]
            out.append(e["type"])
        return out

    for e in t["TILE"] + t["WAIT"]:
        assert chain(e) == [e["type"], "KERNEL", "LAUNCH", "FUSED", "GROUP"]
    for e in t["COPY"]:
        assert chain(e) == ["COPY", "LAUNCH", "FUSED", "GROUP"]
        assert byid[e["parent"]]["name"] == "copies from rank 1"
    assert chain(t["COLL"][0]) == ["COLL", "GROUP"]
    ag_kernel = next(k for k in t["KERNEL"] if k["name"] == "allgather")
    assert chain(ag_kernel) == ["KERNEL", "LAUNCH", "COLL", "GROUP"]
    for e in events:  # every event ended, none before it started; parents are reported before children
        assert e["end_ns"] is not None and e["end_ns"] >= e["start_ns"], e
        assert e["parent"] is None or e["parent"] < e["id"]
    # device times are the GPU's plus the clock offset; waits only for the rows of the other rank
    words = tile_words(0, 0)
    for tile in t["TILE"]:
        slot = 2 * tile["args"]["row_tile"] + tile["args"]["col_tile"]
        rec = words[slot * TILE_WORDS:(slot + 1) * TILE_WORDS]
        assert tile["end_ns"] - tile["start_ns"] == rec[2] - rec[1] == 1000
        assert tile["track"] == f"SM {rec[3]}"
    for w in t["WAIT"]:
        assert w["args"]["src"] == 1 and w["end_ns"] - w["start_ns"] == 300
        (state, args), = w["states"]
        assert state == "signal_observed" and args["ts_ns"] == w["end_ns"] and args["chunk"] == 0
    gemm = next(k for k in t["KERNEL"] if k["name"] == "ag_gemm")
    tiles_start = min(x["start_ns"] for x in t["TILE"] + t["WAIT"])
    assert gemm["start_ns"] < tiles_start and gemm["track"] == "stream 0"
    chunks = sorted(t["COPY"], key=lambda e: e["start_ns"])
    assert chunks[0]["end_ns"] == chunks[1]["start_ns"] and chunks[0]["args"]["bytes"] == 4096
    assert chunks[0]["track"] == "stream 1"  # a stream of its own, not the GEMM's


def test_instrumented_kernel_used_only_when_tiles_are_recorded(gpu):
    plain, timed = FakeKernel("ag_gemm"), FakeKernel("ag_gemm", gpu)
    with tp.profile(None, mask="fused,launch", clock=gpu.clock(), merge=False) as s:
        fused_call(plain, timed)
    assert len(plain.launches) == 1 and not timed.launches
    assert {e["type"] for e in s.profiler.events()} == {"FUSED", "LAUNCH"}
    with tp.profile(None, mask="tile", clock=gpu.clock(), merge=False) as s:
        fused_call(plain, timed)
    assert len(timed.launches) == 1 and timed.launches[0][-1].numel() == 4 * TILE_WORDS
    assert len(by_type(s.profiler.events())["TILE"]) == 4
    # no clock (no GPU): device types are dropped from the mask, the plain kernel runs
    with tp.profile(None, mask="all", clock=None, merge=False) as s:
        fused_call(plain, timed)
    assert not s.mask & (EventType.DEVICE | EventType.COPY) and len(plain.launches) == 2


# ---------------------------------------------------------------------------------- mask filtering
class CountingProfiler(tp.Profiler):
    name = "counting"

    def __init__(self, wanted=None):
        self.calls, self.wanted = [], wanted

    def init(self, context, rank, world_size, mask):
        self.calls.append(("init", rank, world_size, mask))
        return self.wanted

    def start_event(self, descr):
        h = ("h", len(self.calls), descr.type, descr.name)
        self.calls.append(("start", descr.type, descr.name, descr.parent, h))
        return h

    def stop_event(self, handle):
        self.calls.append(("stop", handle))

    def record_event_state(self, handle, state, args):
        self.calls.append(("state", handle, state, dict(args)))

    def finalize(self):
        self.calls.append(("finalize",))


def test_mask_filtering(gpu):
    p = CountingProfiler()
    with tp.profile(None, mask="coll", profiler=p, clock=gpu.clock(), merge=False) as s:
        with tp.group("g"):
            coll_call()
            fused_call(FakeKernel("k"), FakeKernel("k", gpu))
    assert s.mask == EventType.COLL | EventType.GROUP
    started = [c[1] for c in p.calls if c[0] == "start"]
    assert started == [EventType.GROUP, EventType.COLL]
    # a user profiler may narrow the mask in init; parents of what it keeps stay on
    p = CountingProfiler(wanted=EventType.TILE)
    with tp.profile(None, mask="all", profiler=p, clock=gpu.clock(), merge=False) as s:
        fused_call(FakeKernel("k"), FakeKernel("k", gpu))
        coll_call()
    assert s.mask == EventType.TILE.with_parents()
    types = {c[1] for c in p.calls if c[0] == "start"}
    assert types == {EventType.FUSED, EventType.COLL, EventType.LAUNCH, EventType.KERNEL, EventType.TILE}


def test_masked_off_types_produce_nothing_and_cost_nothing():
    p = CountingProfiler()
    n = 20000
    with tp.profile(None, mask="group", profiler=p, merge=False):
        t = time.perf_counter()
        for _ in range(n):
            rec = profiling.call("AllGather", launch="allgather", bytes=1) if profiling.current is not None else None
        per_call = (time.perf_counter() - t) / n
    assert rec is None
    assert [c[0] for c in p.calls] == ["init", "finalize"]
    assert per_call < 5e-6, f"{per_call * 1e6:.2f} us per masked-off call"
    # profiling off: the ops' guard is false and nothing is called
    profiling.reset()
    assert profiling.call("AllGather") is None and profiling.current is None


class LiveRecorder(RecordingProfiler):
    live = True   # delivered as events happen: the reference the raw records must reproduce


def _session_events(gpu, profiler):
    with tp.profile(None, clock=gpu.clock(), profiler=profiler, rank=0, world_size=2, merge=False) as s:
        with tp.group("step", i=3):
            fused_call(FakeKernel("ag_gemm"), FakeKernel("ag_gemm", gpu, rank=0))
            for _ in range(2):
                coll_call()
        with tp.group("after"):
            pass
    return s.profiler.events()


def test_raw_records_become_the_events_a_live_profiler_gets(monkeypatch):
    """The hot path appends tuples (perf_counter_ns) and the recorder builds its events at the end: the same
    events, names, parents, tracks, args and states as a profiler called as the events happen, with times
    on the wall clock."""
    def fresh():
        g = FakeGPU()
        monkeypatch.setattr(records, "record_event", lambda stream: g.event(stream))
        monkeypatch.setattr(records, "current_stream", lambda: FakeStream(7))
        return g

    t0 = time.time_ns()
    deferred = _session_events(fresh(), RecordingProfiler())
    live = _session_events(fresh(), LiveRecorder())
    t1 = time.time_ns()

    def shape(events):
        return [(e["id"], e["parent"], e["type"], e["name"], e["track"], e["args"], e["states"]) for e in events]

    assert len(deferred) == 20 and shape(deferred) == shape(live)
    for e in deferred:
        assert e["end_ns"] >= e["start_ns"], e
        if e["track"] == "host":   # host events: perf_counter_ns mapped onto time.time_ns
            assert t0 <= e["start_ns"] <= e["end_ns"] <= t1, e
    byid = {e["id"]: e for e in deferred}
    for e in deferred:   # strictly inside the parent on the host (the call contains its LAUNCH)
        p = byid.get(e["parent"])
        if p is not None and e["track"] == p["track"] == "host":
            assert p["start_ns"] < e["start_ns"] and e["end_ns"] < p["end_ns"], (p, e)


def test_hot_path_only_appends(gpu, monkeypatch):
    """While a session records, op calls reach no profiler method; everything arrives, in order, when the
    session ends (RecordingProfiler.events() flushes first). An AllGather call in a session of host events is
    one extend of four ints after its launch (no OpCall, no profiler call, no object for the garbage collector)."""
    def no_op_call(*a, **k):
        raise AssertionError("OpCall made: the AllGather call did not take its one-append path")

    monkeypatch.setattr(profiling, "OpCall", no_op_call)
    p = CountingProfiler()
    with tp.profile(None, mask="host", profiler=p, merge=False) as s:
        for _ in range(3):
            n = len(AG_LAUNCHES)
            coll_call()
            assert len(AG_LAUNCHES) == n + 1, "the call launched once"
        assert [c[0] for c in p.calls] == ["init"] and len(s.raw) == 3 * 4
        assert all(type(r) is int for r in s.raw) and s.raw[1::4] == [0, 0, 0]      # no group: parent 0
        assert all(t0 <= t1 for t0, t1 in zip(s.raw[2::4], s.raw[3::4], strict=True))
    kinds = [c[0] for c in p.calls]
    assert kinds == ["init"] + ["start", "start", "state", "stop", "state", "stop"] * 3 + ["finalize"]
    rec = RecordingProfiler()
    with tp.profile(None, mask="host", profiler=rec, merge=False) as s:
        coll_call()
        assert len(s.raw) == 4
        assert [e["type"] for e in rec.events()] == ["COLL", "LAUNCH"] and not s.raw   # read: flushed


def test_quick_call_records_become_the_events_a_live_profiler_gets(monkeypatch):
    """AllGather's quick records (a session of host events: four ints) give the events that its general path (OpCall)
    gives a live profiler: the same ids, parents (groups), types, names, tracks, args and states; the call spans its
    LAUNCH (the same host times: the two clock reads around the launch), within its group, on the wall clock."""
    def events(profiler, quick):
        with tp.profile(None, mask="host", profiler=profiler, rank=0, world_size=2, merge=False) as s:
            assert s.quick_coll is quick
            with tp.group("step", i=3):
                coll_call()
                with tp.group("inner"):
                    coll_call()
                coll_call()
            coll_call()
        return s.profiler.events()

    t0 = time.time_ns()
    quick = events(RecordingProfiler(), True)
    live = events(LiveRecorder(), False)
    t1 = time.time_ns()

    def shape(evs):
        return [(e["id"], e["parent"], e["type"], e["name"], e["track"], e["args"], e["states"]) for e in evs]

    assert len(quick) == 10 and shape(quick) == shape(live)
    byid = {e["id"]: e for e in quick}
    assert [byid[e["parent"]]["name"] if e["parent"] else None for e in quick if e["type"] == "COLL"] == [
        "step", "inner", "step", None]
    assert all(e["args"] == {"bytes": 1 << 20} for e in quick if e["type"] == "COLL")
    for e in quick:
        assert t0 <= e["start_ns"] <= e["end_ns"] <= t1, e
        parent = byid.get(e["parent"])
        if parent is not None:
            assert parent["start_ns"] <= e["start_ns"] and e["end_ns"] <= parent["end_ns"], (parent, e)
        if e["type"] == "LAUNCH":
            assert (e["start_ns"], e["end_ns"]) == (parent["start_ns"], parent["end_ns"]), (parent, e)


def test_allgather_takes_the_general_path_when_more_is_recorded(gpu, monkeypatch):
    """Not one append: a session timing kernels with CUDA events (KERNEL: around the launch), a live profiler, the
    first call of a run (TILESCALE_PROFILE not read yet); a session without COLL records nothing of it."""
    with tp.profile(None, mask="coll,launch,kernel", clock=gpu.clock(), merge=False) as s:
        assert not s.quick_coll
        coll_call()
        assert all(type(r) is tuple for r in s.raw) and len(s.pending) == 1   # OpCall's records; CUDA events
    assert [e["type"] for e in s.profiler.events()] == ["COLL", "LAUNCH", "KERNEL"]
    with tp.profile(None, mask="fused,group", merge=False) as s:
        assert not s.quick_coll
        n = len(AG_LAUNCHES)
        coll_call()
        assert len(AG_LAUNCHES) == n + 1 and not s.raw
    assert s.profiler.events() == []


# ----------------------------------------------------------------------------- user profilers
def test_user_profiler_registration_receives_calls_in_order(gpu, tmp_path):
    p = CountingProfiler()
    tp.register_profiler(p)
    assert tp.get_profiler() is p
    with tp.profile(tmp_path, clock=gpu.clock(), rank=1, world_size=2, merge=False):
        with tp.group("g"):
            fused_call(FakeKernel("k"), FakeKernel("k", gpu, rank=1), rank=1)
    kinds = [c[0] for c in p.calls]
    assert kinds[0] == "init" and kinds[-1] == "finalize" and kinds.count("init") == kinds.count("finalize") == 1
    assert p.calls[0][1:3] == (1, 2) and p.calls[0][3] == EventType.ALL
    handles = [c[4] for c in p.calls if c[0] == "start"]
    pos = {c[4]: i for i, c in enumerate(p.calls) if c[0] == "start"}
    stops = {c[1]: i for i, c in enumerate(p.calls) if c[0] == "stop"}
    assert set(stops) == set(handles) and kinds.count("stop") == len(handles), "every event is stopped once"
    for c in p.calls:
        if c[0] == "start" and c[3] is not None:
            assert c[3] in pos and pos[c[3]] < pos[c[4]], "a parent is one of this profiler's handles, started first"
        if c[0] == "state":
            assert pos[c[1]] < p.calls.index(c) < stops[c[1]], "states come between start and stop"
    states = [c for c in p.calls if c[0] == "state"]
    assert any(s[2] is EventState.SIGNAL_OBSERVED for s in states)
    assert all(s[2] in (EventState.SIGNAL_OBSERVED, EventState.END) for s in states)
    assert not list(tmp_path.iterdir()), "a user profiler writes nothing of tilescale's"
    # a class is instantiated per session; None restores the default recorder
    tp.register_profiler(CountingProfiler)
    with tp.profile(None, merge=False) as s:
        pass
    assert type(s.profiler) is CountingProfiler and s.profiler is not p
    tp.register_profiler(None)
    assert tp.get_profiler() is RecordingProfiler
    with pytest.raises(TypeError, match="profiler: got int"):
        tp.register_profiler(3)
    tp.register_profiler(lambda: object())
    with pytest.raises(TypeError, match="expected a tilescale.profiler.Profiler"):
        with tp.profile(None, merge=False):
            pass


def test_user_profiler_with_out_dir_does_not_wait_for_trace_files(tmp_path):
    t = time.monotonic()
    with tp.profile(tmp_path, profiler=CountingProfiler(), rank=0, world_size=2, merge_timeout_s=120):
        coll_call()
    assert time.monotonic() - t < 60 and not (tmp_path / "trace.json").exists()   # (a slow machine: far from 120)


def test_no_gpu_clock_turns_device_events_off(monkeypatch):
    from tilescale.profiler import device_timeline

    def broken():
        raise RuntimeError("no stamp kernel")

    monkeypatch.setattr(profiling, "_cuda_ready", lambda: True)
    monkeypatch.setattr(device_timeline, "measure_clock", broken)
    with pytest.warns(RuntimeWarning, match="no stamp kernel.*GPU-side events"):
        with tp.profile(None, merge=False) as s:
            coll_call()
    assert s.clock is None and not s.mask & (EventType.DEVICE | EventType.COPY)
    assert {e["type"] for e in s.profiler.events()} == {"COLL", "LAUNCH"}


# ------------------------------------------------------------------ activation: env and context
def test_env_activation_records_the_run(gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("TILESCALE_PROFILE", "1")
    monkeypatch.setenv("TILESCALE_PROFILE_MASK", "coll,launch")
    monkeypatch.setenv("TILESCALE_PROFILE_DIR", str(tmp_path / "prof"))
    assert profiling.current is not None  # undecided: the first op call reads the environment
    coll_call()
    assert isinstance(profiling.current, tp.Session) and tp.active()
    assert profiling.current.mask == EventType.COLL | EventType.LAUNCH | EventType.FUSED | EventType.GROUP
    coll_call()
    merged = profiling.shutdown(merge_timeout_s=5)
    assert profiling.current is None and not tp.active()
    assert merged == str(tmp_path / "prof" / "trace.json")
    ids = validate_chrome_trace(chrome_trace.load(merged))
    assert sorted(e["args"]["type"] for e in ids.values()) == ["COLL", "COLL", "LAUNCH", "LAUNCH"]
    assert (tmp_path / "prof" / "trace_rank0.json").exists()


def test_env_off_and_bad_mask(monkeypatch):
    coll_call()
    assert profiling.current is None
    profiling.reset()
    monkeypatch.setenv("TILESCALE_PROFILE", "1")
    monkeypatch.setenv("TILESCALE_PROFILE_MASK", "coll,kernels")
    with pytest.raises(ValueError, match="TILESCALE_PROFILE_MASK='coll,kernels'"):
        coll_call()
    monkeypatch.setenv("TILESCALE_PROFILE", "maybe")
    profiling.reset()
    with pytest.raises(ValueError, match="TILESCALE_PROFILE='maybe'"):
        coll_call()


def test_env_settings_are_typed(monkeypatch):
    from tilescale.env import describe, settings

    assert (settings.profile, settings.profile_mask, settings.profile_device) == (False, "all", False)
    monkeypatch.setenv("TILESCALE_PROFILE_DIR", "~/p")
    monkeypatch.setenv("TILESCALE_PROFILE_DEVICE", "yes")
    assert settings.profile_dir == Path("~/p").expanduser() and settings.profile_device is True
    names = {n for n, _, _ in describe()}
    assert {"TILESCALE_PROFILE", "TILESCALE_PROFILE_MASK", "TILESCALE_PROFILE_DIR",
            "TILESCALE_PROFILE_DEVICE"} <= names


def test_context_manager(gpu):
    assert not tp.active()
    with tp.group("outside"):  # no session: nothing, no error
        pass
    with tp.profile(None, mask="host", merge=False) as s:
        assert profiling.current is s and tp.active()
        with pytest.raises(RuntimeError, match="already active"):
            with tp.profile(None, merge=False):
                pass
        with tp.group("outer"):
            with tp.group("inner"):
                coll_call()
    assert not tp.active() and s.closed
    ev = {e["name"]: e for e in s.profiler.events()}
    assert ev["inner"]["parent"] == ev["outer"]["id"] and ev["AllGather"]["parent"] == ev["inner"]["id"]
    with pytest.raises(TypeError, match="mask: got float"):
        with tp.profile(None, mask=1.5):
            pass
    # an exception inside the block still ends the session (profiler finalized)
    p = CountingProfiler()
    with pytest.raises(KeyError):
        with tp.profile(None, profiler=p, merge=False):
            raise KeyError("x")
    assert p.calls[-1] == ("finalize",) and not tp.active()


# ------------------------------------------------------------------------------ Chrome trace
def _two_rank_traces(gpu, out):
    for rank in (1, 0):   # rank 0 last: it merges, waiting for rank 1's file
        with tp.profile(out, clock=gpu.clock(), rank=rank, world_size=2, merge=True, merge_timeout_s=5,
                        name="test run"):
            with tp.group("iteration 0"):
                fused_call(FakeKernel("ag_gemm"), FakeKernel("ag_gemm", gpu, rank=rank), rank=rank)
                coll_call()


def test_trace_schema_and_merge_of_two_ranks(gpu, tmp_path):
    _two_rank_traces(gpu, tmp_path)
    for r in (0, 1):
        validate_chrome_trace(chrome_trace.load(chrome_trace.rank_path(tmp_path, r)))
    merged = chrome_trace.load(tmp_path / "trace.json")
    ids = validate_chrome_trace(merged)
    assert_tracks_nest(merged)
    ev = merged["traceEvents"]
    assert {e["pid"] for e in ev} == {0, 1}
    assert min(e["ts"] for e in ev if e["ph"] != "M") == 0.0
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"host", "stream 0", "stream 1", "SM 0", "SM 1", "SM 2"} <= threads
    for r in (0, 1):
        mine = [e for e in ids.values() if e["pid"] == r]
        assert sum(e["args"]["type"] == "TILE" for e in mine) == 4
        assert sum(e["ph"] == "i" and e["name"] == "signal observed" for e in mine) == 2
        sm_tids = {e["tid"] for e in mine if e["args"]["type"] in ("TILE", "WAIT")}
        assert all(t >= chrome_trace.SM_TID for t in sm_tids)
    info = merged["otherData"]["tilescale"]
    assert info["ranks"] == [0, 1] and info["name"] == "test run" and set(info["clocks"]) == {"0", "1"}
    with pytest.raises(ValueError, match=r"rank\(s\) \[0\]"):
        chrome_trace.merge([chrome_trace.load(chrome_trace.rank_path(tmp_path, 0))] * 2)


def test_merge_cli_and_missing_rank(gpu, tmp_path, capsys):
    _two_rank_traces(gpu, tmp_path)
    os.remove(tmp_path / "trace.json")
    assert chrome_trace.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "trace.json")
    validate_chrome_trace(chrome_trace.load(tmp_path / "trace.json"))
    os.remove(chrome_trace.rank_path(tmp_path, 1))
    path = chrome_trace.merge_dir(tmp_path, 2, timeout_s=0.2)   # merges what exists, after waiting
    assert {e["pid"] for e in chrome_trace.load(path)["traceEvents"]} == {0}
    # a new session of rank 0 removes its file of the earlier run first
    with tp.profile(tmp_path, mask="host", rank=0, world_size=2, merge=False):
        assert not os.path.exists(chrome_trace.rank_path(tmp_path, 0))
    assert os.path.exists(chrome_trace.rank_path(tmp_path, 0))
    assert chrome_trace.main([str(tmp_path / "nothing")]) == 1


def test_validator_rejects_broken_traces(gpu, tmp_path):
    _two_rank_traces(gpu, tmp_path)
    good = chrome_trace.load(tmp_path / "trace.json")

    def broken(mutate):
        t = json.loads(json.dumps(good))
        mutate(t["traceEvents"])
        with pytest.raises(AssertionError):
            validate_chrome_trace(t)

    def first(evs, pred):
        return next(e for e in evs if pred(e))

    broken(lambda evs: first(evs, lambda e: e["ph"] == "X" and e["args"]["parent"]).update(
        args={**first(evs, lambda e: e["ph"] == "X" and e["args"]["parent"])["args"], "parent": "r9.9"}))
    broken(lambda evs: first(evs, lambda e: e["ph"] == "X").pop("dur"))
    broken(lambda evs: first(evs, lambda e: e["ph"] == "X").update(ts="12"))
    broken(lambda evs: evs.remove(first(evs, lambda e: e["ph"] == "M" and e["name"] == "thread_name")))
    broken(lambda evs: first(evs, lambda e: e["ph"] == "X" and e["args"]["type"] == "TILE")["args"].update(
        parent=first(evs, lambda e: e["ph"] == "X" and e["args"]["type"] == "FUSED")["args"]["id"]))


def test_overlapping_blocks_on_one_sm_get_lanes():
    ev = [{"id": 1, "parent": None, "type": "FUSED", "name": "c", "track": "host", "start_ns": 0, "end_ns": 100,
           "args": {}, "states": []}]
    for i, (a, b) in enumerate([(10, 50), (20, 60), (50, 70), (65, 80)]):
        ev.append({"id": i + 2, "parent": 1, "type": "TILE", "name": f"t{i}", "track": "SM 3", "start_ns": a,
                   "end_ns": b, "args": {}, "states": []})
    trace = chrome_trace.rank_trace(ev, 0)
    tids = {e["name"]: e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    base = chrome_trace.SM_TID + chrome_trace.SM_LANES * 3
    assert tids == {"c": 0, "t0": base, "t1": base + 1, "t2": base, "t3": base + 1}
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[base] == "SM 3" and names[base + 1] == "SM 3 (2)"


@pytest.mark.parametrize("seed", range(4))
def test_sm_lanes_never_overlap_however_many_blocks_share_an_sm(seed):
    """Random blocks (wait then tile, or a tile alone) on two SMs, up to 40 at once: every track nests,
    also past SM_LANES lanes, and each track's events stay on their SM."""
    import random

    rng = random.Random(seed)
    ev = [{"id": 1, "parent": None, "type": "KERNEL", "name": "k", "track": "stream 0", "start_ns": 0,
           "end_ns": 10**6, "args": {}, "states": []}]
    for b in range(rng.randint(20, 40)):
        sm = rng.choice((3, 4))
        s = rng.randint(0, 20)   # crowded: more than SM_LANES blocks at once on an SM
        r = s + rng.choice((0, rng.randint(0, 30)))
        e = r + rng.choice((0, rng.randint(0, 30)))
        if rng.random() < 0.6:
            ev.append({"id": len(ev) + 1, "parent": 1, "type": "WAIT", "name": f"w{b}", "track": f"SM {sm}",
                       "start_ns": s * 1000, "end_ns": r * 1000, "args": {"sm": sm}, "states": []})
        ev.append({"id": len(ev) + 1, "parent": 1, "type": "TILE", "name": f"t{b}", "track": f"SM {sm}",
                   "start_ns": r * 1000, "end_ns": e * 1000, "args": {"sm": sm}, "states": []})
    trace = chrome_trace.rank_trace(ev, 0)
    assert_tracks_nest(trace)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["args"]["type"] in ("WAIT", "TILE"):
            assert names[e["tid"]].split(" (")[0] == f"SM {e['args']['sm']}"


def test_device_times_keep_every_nanosecond_at_todays_clock():
    """Host times are ~1.8e18 ns, where a float steps by 256 ns: the GPU -> host mapping and the trace's
    microseconds keep integer precision, so a wait that ends when its tile starts nests with it (run on an H100:
    they overlapped by 96 ns when times went through floats)."""
    g0, now = 10**12 + 123, 1_764_000_000_123_456_789
    clock = ClockSync(points=[(g0, now - g0, 10)])
    assert clock.to_host(g0 + 1) - clock.to_host(g0) == 1
    start, ready, end = (clock.to_host(g0 + d) for d in (0, 4_001, 14_753))
    assert (ready - start, end - ready) == (4_001, 10_752)
    ev = [{"id": 1, "parent": None, "type": "WAIT", "name": "wait", "track": "SM 92", "start_ns": start,
           "end_ns": ready, "args": {}, "states": [("signal_observed", {"ts_ns": ready})]},
          {"id": 2, "parent": None, "type": "TILE", "name": "tile", "track": "SM 92", "start_ns": ready,
           "end_ns": end, "args": {}, "states": []}]
    trace = chrome_trace.rank_trace(ev, 0)
    x = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert x["wait"]["tid"] == x["tile"]["tid"]          # one block: one lane
    assert x["wait"]["ts"] + x["wait"]["dur"] == x["tile"]["ts"] and x["wait"]["dur"] == 4.001
    assert_tracks_nest(trace)
    merged = chrome_trace.merge([trace, chrome_trace.rank_trace([], 1)])   # a rank without events, too
    assert_tracks_nest(merged)
    w, t = (next(e for e in merged["traceEvents"] if e.get("name") == n and e["ph"] == "X") for n in ("wait", "tile"))
    assert (w["ts"], w["dur"], t["ts"], t["dur"]) == (0.0, 4.001, 4.001, 10.752)


# --------------------------------------------------------------------------- device timeline
def test_decode_tile_records():
    words = tile_words(1, 5000, tiles_m=4, tiles_n=2)
    words[3 * TILE_WORDS:4 * TILE_WORDS] = [0] * TILE_WORDS   # a tile that never wrote
    tiles = decode_tiles(words)
    assert len(tiles) == 7 and all(isinstance(t, Tile) for t in tiles)
    assert [t.t_start for t in tiles] == sorted(t.t_start for t in tiles)
    assert next(t for t in tiles if t.slot == 0) == Tile(0, 5000, 5004, 6004, 0, 1, 0, 2, 0)   # own rows
    assert next(t for t in tiles if t.slot == 4) == Tile(4, 5400, 5700, 6700, 1, 0, 0, 0, 0)   # waited 300 ns
    assert {t.src for t in tiles} == {0, 1} and 3 not in {t.slot for t in tiles}
    assert check_tiles(tiles, expected=8) == ["1 of 8 tiles wrote no record"]
    bad = tiles[0]._replace(t_end=tiles[0].t_start - 1)
    assert "out of order" in check_tiles([bad])[0]
    assert timer_resolution_ns(tiles) == 4
    assert len(TILE_FIELDS) == TILE_WORDS == 8
    with pytest.raises(ValueError, match="multiple of TILE_WORDS"):
        decode_tiles(words[:-1])


def test_clock_sync():
    # (host before, gpu, host after): the tightest bracket wins; offset is its midpoint minus gpu
    g, off, err = best_point([(1000, 10, 1400), (2000, 1100, 2100), (3000, 2000, 3300)])
    assert (g, off, err) == (1100, 950, 50)
    c = ClockSync(points=[(0, 1000, 5), (1_000_000_000, 3000, 5)], anchor_event=FakeEvent(500),
                  anchor_gpu_ns=500)
    assert c.to_host(0) == 1000 and c.to_host(500_000_000) == 500_002_000 and c.to_host(1_000_000_000) == 1_000_003_000
    assert c.event_to_host(FakeEvent(1500)) == 1500 + 1000   # anchor + 1 us elapsed, offset at ~0
    assert c.describe()["drift_ns_per_s"] == pytest.approx(2000.0)
    c.sampler = lambda: (2_000_000_000, 5000, 5)
    c.resample()
    assert c.to_host(2_000_000_000) == 2_000_005_000
    with pytest.raises(ValueError, match="no anchor event"):
        ClockSync(points=[(0, 0, 0)]).event_to_host(FakeEvent(1))
    with pytest.raises(ValueError, match="samples"):
        best_point([])


# ----------------------------------------------------------------- timer ops and their kernels
@tilescale.jit
def timer_only(n: int = 64):
    @T.prim_func
    def timer_only_kernel(out: T.Tensor((n,), I64)):
        with T.Kernel(2, threads=64) as bx:
            if T.get_thread_binding() == 0:
                out[bx * 2] = T.cast(T.timestamp(), "int64")
                out[bx * 2 + 1] = T.cast(T.smid(), "int64")

    return timer_only_kernel


@tilescale.jit
def timer_and_wait(n: int = 64):
    @T.prim_func
    def timer_and_wait_kernel(out: T.Tensor((n,), U64), sig: T.Tensor((1,), U64)):
        with T.Kernel(1, threads=32):
            out[0] = T.timestamp()
            T.wait_until(sig[0], cmp="ge", value=1)
            out[1] = T.timestamp()

    return timer_and_wait_kernel


@pytest.fixture
def build_env(monkeypatch):
    from tilescale import discovery

    for name in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM",
                 "TILESCALE_USE_DISTRIBUTED", "TILELANG_USE_DISTRIBUTED", "TILESCALE_WAIT_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    discovery.clear_cache()
    yield
    discovery.clear_cache()


def test_timer_ops_are_not_distributed(build_env):
    from tilescale.analysis import describe_distributed_calls, uses_distributed
    from tilescale.compiler import lower_source
    from tilescale.language.profile import device_source

    f = timer_only.get_tir()
    assert not uses_distributed(f) and describe_distributed_calls(f) == []
    assert tilescale.resolve_backend(f).name == "tvm_ffi"
    src = lower_source(f, target=SM90)
    # tilelang builds it without tilescale's headers: the device functions are pasted in, once
    assert "#include <tilescale/tilescale.cuh>" not in src
    assert src.count("#define TILESCALE_PROFILE_CUH_") == 1 and device_source() in src
    assert "tilescale_profile_timestamp()" in src and "tilescale_profile_smid()" in src
    g = timer_and_wait.get_tir()
    assert describe_distributed_calls(g) == ["tilescale::wait_until"]   # only the wait makes it distributed
    dsrc = lower_source(g, target=SM90)
    assert dsrc.startswith("#define TILESCALE_NVSHMEM_NO_COLLECTIVES\n#include <tilescale/tilescale.cuh>\n")
    header = (REPO / "tilescale" / "include" / "tilescale" / "tilescale.cuh").read_text()
    assert "#include <tilescale/profile.cuh>" in header   # the guard then drops the pasted copy


def test_timer_kernel_compiles_with_nvcc(build_env):
    from tilescale.toolchain import stub_libcuda_dir

    d = stub_libcuda_dir()
    r = tilescale.build(timer_only.get_tir(), target=SM90, compile_flags=[f"-L{d}"] if d else [])
    assert not r.spec.distributed and Path(r.library).is_file()
    assert re.search(r"=\s*\(\(int64_t\)tilescale_profile_timestamp\(\)\)", r.source), r.source[-1500:]


def _normalised(src: str) -> str:
    from tilescale.language.distributed import WAIT_SITES

    # wait-site ids hash the kernel's file:line, which moves with any edit above the wait
    for site, loc in WAIT_SITES.items():
        if os.path.basename(loc.rpartition(":")[0]) == "ag_gemm_kernel.py":
            src = re.sub(rf"\b{site}\b", "<site>", src)
    return src


def test_ag_gemm_without_timestamps_is_unchanged(build_env):
    """profile=False generates, character for character, the source of the kernel before the option
    existed (tests/golden/profiler/ag_gemm_profile_off.cu; UPDATE_GOLDEN=1 rewrites it)."""
    from tilescale.compiler import lower_source
    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    got = _normalised(lower_source(ag_gemm_kernel.get_tir(*AG_ARGS), target=SM90, build_mode="inlined"))
    assert got == _normalised(lower_source(ag_gemm_kernel.get_tir(*AG_ARGS, profile=False), target=SM90,
                                           build_mode="inlined"))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    if got != want:
        import difflib

        pytest.fail("ag_gemm_kernel(profile=False) differs from its snapshot:\n" + "".join(difflib.unified_diff(
            want.splitlines(True), got.splitlines(True), "golden", "generated")))
    assert "tilescale_profile" not in got and "globaltimer" not in got


def test_ag_gemm_with_timestamps_compiles(build_env, tmp_path, monkeypatch):
    import tempfile

    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = ag_gemm_kernel.build(*AG_ARGS, profile=True, target=SM90)
    assert r.spec.distributed and Path(r.library).is_file()
    src = r.source
    kernel = src[src.index('extern "C" __global__ void __launch_bounds__'):]
    assert "uint64_t* prof" in kernel.split("{", 1)[0]
    assert kernel.count("tilescale_profile_timestamp()") == 3 and kernel.count("tilescale_profile_smid()") == 1
    # the record layout the decoder reads: words 0..7 of slot (by * tiles_n + bx) * TILE_WORDS
    for w in range(TILE_WORDS):
        field = f"+ (int64_t){w})]" if w else "* (int64_t)8))]"     # (64-bit: the grid's rows are a run-time size)
        assert field in kernel, (TILE_FIELDS[w], kernel[:3000])
    # the GEMM itself is the uninstrumented one: every line of that kernel's body is still there
    off = GOLDEN.read_text()
    body = off[off.index('extern "C" __global__ void __launch_bounds__'):].split("{", 1)[1].split("\n#else\n")[0]
    def temps(text):   # the numbering of TVM's temporaries (the row arithmetic of the run-time rows): dropped
        return re.sub(r"\b(rmod|rdiv)_\d+\b", r"\1", text)
    missing = [ln for ln in temps(body).splitlines() if ln.strip() and "<site>" not in ln and ln not in temps(kernel)]
    assert not missing, missing[:5]


def test_ag_gemm_timestamps_stay_out_of_the_mainloop(build_env):
    """What the instrumented GEMM adds is what costs nothing in its pipeline (profile_ag_gemm's timestamp
    overhead): three %globaltimer reads and the record stores, each by one thread (thread 0 before and after
    the chunk wait, the first consumer thread after the TMA store), none in a K loop, and no call, atomic or
    fence."""
    from tilescale.compiler import lower_source
    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    src = lower_source(ag_gemm_kernel.get_tir(*AG_ARGS, profile=True), target=SM90, build_mode="inlined")
    body = src[src.index('extern "C" __global__ void __launch_bounds__'):]
    lines = body.splitlines()
    stamps = [i for i, ln in enumerate(lines) if "tilescale_profile_timestamp()" in ln or "prof[" in ln]
    assert len(stamps) == 8 and sum("tilescale_profile_timestamp()" in lines[i] for i in stamps) == 3
    for i in stamps:
        depth, guard = 0, None   # walk out of the enclosing blocks: the innermost `if` and any loop
        for j in range(i - 1, -1, -1):
            ln = lines[j]
            depth += ln.count("}") - ln.count("{")
            if depth < 0:
                if guard is None and "< prof_words)" not in ln:   # (a record's bounds check: a run-time size)
                    guard = ln.strip()
                assert not ln.strip().startswith(("for ", "while ")), f"stamp in a loop: {lines[i]}"
                depth = 0
        assert re.fullmatch(r"if \(\(\(int\)threadIdx\.x\) == (0|128)\) \{", guard), (guard, lines[i])
    assert "atomic" not in "\n".join(lines[i] for i in stamps)
    # the profile.cuh functions are inlined asm (no call: ptxas would serialise wgmma, C7510)
    from tilescale.language.profile import device_source

    assert device_source().count("__device__ __forceinline__") == 2 and "noinline" not in device_source()


# ---------------------------------------------------------------------- the picture (benchmark)
def _bench():
    spec = importlib.util.spec_from_file_location("profile_ag_gemm_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("W", [1, 2, 4])
def test_bench_prebuilds_both_gemms_plain_and_stamped(W):
    """profile_ag_gemm's prebuild list: each of AG+GEMM's GEMMs (own rows; the others' when W > 1), plain and with
    timestamps (the `profile` argument), then the AllGather and the clock stamp kernel."""
    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    jobs, _ = _bench()._jobs(4096, 1024, 2048, W)
    gemms = [args for fn, args in jobs if fn is ag_gemm_kernel]
    own = [True, True, False, False][:2 if W == 1 else 4]
    # args end with (profile, own, sms)
    assert [a[-2] for a in gemms] == own and [a[-3] for a in gemms] == [False, True] * (len(own) // 2)


def test_summary_and_timeline_png_from_a_trace(gpu, tmp_path):
    bench = _bench()
    _two_rank_traces(gpu, tmp_path)
    trace = chrome_trace.load(tmp_path / "trace.json")
    s = bench.summarize_call(trace, 0)
    assert (s["tiles"], s["tiles_waited"], s["sms"]) == (4, 2, 3)
    assert s["wait_us_total"] == pytest.approx(0.6) and s["tile_us_mean"] == pytest.approx(1.0)
    assert 0 < s["wait_share"] < 1 and s["copy_us"] == pytest.approx(2.0) and "copy_under_kernel" in s
    ev = bench.call_events(trace, 1)
    assert len(ev["TILE"]) == 4 and len(ev["COPY"]) == 2 and len(ev["STATE"]) == 2
    pytest.importorskip("matplotlib")
    png = bench.plot_timeline(trace, str(tmp_path / "timeline.png"))
    data = Path(png).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ------------------------------------------------------------------------------------- 2 GPUs
@pytest.mark.multigpu
def test_profile_ag_gemm_on_gpus(tmp_path):
    testing.skip_unless_ranks(2)
    out = tmp_path / "prof"
    proc = testing.launch(BENCH, 2, "--out", str(out), "--shape", "2048,1024,1024", "--calls", "2",
                          "--rounds", "2", timeout=480)
    testing.assert_all_ranks_ok(proc, 2)
    result = json.loads((out / "profile_ag_gemm.json").read_text())
    trace = chrome_trace.load(out / "trace.json")
    try:
        ids = validate_chrome_trace(trace)
        assert_tracks_nest(trace)
    except AssertionError:   # keep the traces beside the job's log (the GPU tier's record) to read later
        if os.environ.get("TILESCALE_TEST_LOG_DIR"):
            import shutil
            shutil.copytree(out, Path(os.environ["TILESCALE_TEST_LOG_DIR"]) / "profile_ag_gemm_traces",
                            dirs_exist_ok=True)
        raise
    for r in (0, 1):
        tiles = [e for e in ids.values() if e["pid"] == r and e["args"]["type"] == "TILE"]
        assert len(tiles) == 2 * result["tiles_per_call"], len(tiles)   # every tile of both calls wrote
        assert all(e["dur"] > 0 for e in tiles)
        assert any(e["pid"] == r and e["args"]["type"] == "COPY" for e in ids.values())
        assert any(e["pid"] == r and e["args"]["type"] == "WAIT" for e in ids.values())
    for key in ("allgather_1MiB_host_events", "ag_gemm_kernel_timestamps", "ag_gemm_op_everything"):
        o = result["overheads"][key]
        assert o["off_us"] > 0 and o["on_us"] > 0 and math.isfinite(o["overhead"])
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib missing: the trace validated, timeline.png was not drawn")
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
