"""Chrome trace event format (JSON; loads in Perfetto and chrome://tracing): one file per rank, merged.

Layout: one process per rank (``pid`` = rank, named "rank R"); threads (``tid``) are tracks:
0 = "host" (calls and launches), 100 + N = "stream N" (kernels, copy-engine chunks), 1000 + 8 * n + lane
= "SM n" (waits and tiles; a second lane only if two blocks overlapped on that SM; a ninth and later
lane, when that many overlapped, from 10,000,000 up). Every event is a
complete event (``ph: "X"``, ``ts``/``dur`` in microseconds) whose args carry ``id``, ``parent`` (an id
of the same trace, or null) and ``type``; state changes with a time (a signal observed) are instant
events (``ph: "i"``) whose parent is their event. Metadata events (``ph: "M"``) name processes and
threads. Per-rank files keep absolute times (``time.time_ns`` / 1000); the merged file starts at 0
(``otherData.tilescale.time_origin_us`` holds the origin).

    python -m tilescale.profiler.chrome_trace DIR [--world-size N]   # merge DIR/trace_rank*.json
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import time

log = logging.getLogger("tilescale")

HOST_TID = 0
STREAM_TID = 100
OTHER_TID = 10
SM_TID = 1000
SM_LANES = 8
EXTRA_SM_TID = 10_000_000

_STREAM = re.compile(r"^stream (\d+)$")
_SM = re.compile(r"^SM (\d+)$")


def rank_path(out_dir, rank: int) -> str:
    return os.path.join(os.fspath(out_dir), f"trace_rank{rank}.json")


def _json_value(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if hasattr(v, "item"):
        try:
            return _json_value(v.item())
        except Exception:  # noqa: BLE001
            pass
    return str(v)


def _us(ns) -> float:
    """Nanoseconds -> microseconds, correctly rounded: ``ns / 1000.0`` would first make the integer a float,
    which at today's ``time.time_ns()`` (~1.8e18) has a step of 256 ns, so an event's end and the next
    event's start, equal in nanoseconds, could land 0.1 us apart and overlap in the trace."""
    return ns / 1000 if isinstance(ns, int) else float(ns) / 1000.0


class _Tracks:
    """Track name -> tid, with lanes for SM tracks whose events overlap."""

    def __init__(self):
        self.names: dict[int, str] = {HOST_TID: "host"}
        self.others: dict[str, int] = {}
        self.lanes: dict[int, list[int]] = {}   # sm -> end time of each lane
        self.extra: dict[tuple[int, int], int] = {}   # (sm, lane >= SM_LANES) -> tid

    def tid(self, track: str, start: int, end: int) -> int:
        if track == "host":
            return HOST_TID
        m = _STREAM.match(track)
        if m:
            t = STREAM_TID + int(m.group(1))
            self.names[t] = track
            return t
        m = _SM.match(track)
        if m:
            sm = int(m.group(1))
            ends = self.lanes.setdefault(sm, [])
            lane = next((i for i, e in enumerate(ends) if e <= start), None)
            if lane is None:
                lane = len(ends)
                ends.append(end)
            else:
                ends[lane] = end
            if lane < SM_LANES:
                t = SM_TID + SM_LANES * sm + lane
            else:   # more blocks at once on one SM than SM_LANES: lanes of their own, past every SM's
                t = self.extra.setdefault((sm, lane), EXTRA_SM_TID + len(self.extra))
            self.names[t] = track if lane == 0 else f"{track} ({lane + 1})"
            return t
        t = self.others.get(track)
        if t is None:
            t = self.others[track] = OTHER_TID + len(self.others)
            self.names[t] = track
        return t


def rank_trace(events: list[dict], rank: int, world_size: int = 1, *, name: str = "tilescale",
               clock: dict | None = None) -> dict:
    """The Chrome trace of one rank's events (dicts as :meth:`RecordingProfiler.events` gives them)."""
    tracks = _Tracks()
    out = []
    # Times are kept from a whole second before the first event (time_origin_us): microseconds since 1970 as
    # floats would step by 0.25 us.
    stamps = [e["start_ns"] for e in events] + [a["ts_ns"] for e in events for _, a in e.get("states") or []
                                                 if "ts_ns" in a]
    origin_ns = int(min(stamps)) // 10**9 * 10**9 if stamps else 0
    # SM lanes are assigned in time order; everything else keeps the order of the events
    order = sorted(range(len(events)), key=lambda i: (not _SM.match(events[i]["track"]), events[i]["start_ns"]))
    tids = {}
    for i in order:
        e = events[i]
        end = e["end_ns"] if e["end_ns"] is not None else e["start_ns"]
        tids[i] = tracks.tid(e["track"], e["start_ns"], end)
    for i, e in enumerate(events):
        eid = f"r{rank}.{e['id']}"
        parent = None if e["parent"] is None else f"r{rank}.{e['parent']}"
        start = e["start_ns"]
        end = e["end_ns"]
        args = {**_json_value(dict(e["args"])), "id": eid, "parent": parent, "type": e["type"]}
        if end is None:
            args["open"] = True   # never stopped: shown with zero length
            end = start
        out.append({"name": e["name"], "cat": e["type"].lower(), "ph": "X", "ts": _us(start - origin_ns),
                    "dur": _us(max(0, end - start)), "pid": rank, "tid": tids[i], "args": args})
        for k, (state, sargs) in enumerate(e.get("states") or []):
            if "ts_ns" not in sargs:
                continue
            extra = _json_value({a: v for a, v in sargs.items() if a != "ts_ns"})
            out.append({"name": state.replace("_", " "), "cat": "state", "ph": "i", "s": "t",
                        "ts": _us(sargs["ts_ns"] - origin_ns), "pid": rank, "tid": tids[i],
                        "args": {**extra, "id": f"{eid}.s{k}", "parent": eid, "type": "STATE"}})
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}]
    for tid, tname in sorted(tracks.names.items()):
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": tname}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ns",
            "otherData": {"tilescale": {"name": name, "ranks": [rank], "world_size": world_size,
                                        "clocks": {str(rank): clock},
                                        "time_origin_us": float(origin_ns // 1000)}}}


def write(trace: dict, path) -> str:
    """Write atomically (a reader polling for the file never sees half of it)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f, allow_nan=False, separators=(",", ":"))
    os.replace(tmp, path)
    return path


def merge(traces: list[dict]) -> dict:
    """One trace of several ranks' traces; times shifted so that the earliest event is at 0."""
    ranks: list[int] = []
    for t in traces:
        ranks += t["otherData"]["tilescale"]["ranks"]
    dup = sorted({r for r in ranks if ranks.count(r) > 1})
    if dup:
        raise ValueError(f"traces: rank(s) {dup} appear in more than one trace")
    # In steps that keep nanoseconds: first onto the earliest origin (origins are whole microseconds, so the
    # shifts are exact), then the earliest event to 0 (small numbers from there on).
    bases = [float(t["otherData"]["tilescale"].get("time_origin_us", 0.0)) for t in traces]
    origin = min((b for b, t in zip(bases, traces, strict=True) if any(e.get("ph") != "M" for e in t["traceEvents"])),
                 default=0.0)   # a rank without events (origin 0) must not pull the others' times up to ~1e15 us
    events = []
    for t, base in zip(traces, bases, strict=True):
        for e in t["traceEvents"]:
            e = dict(e)
            if e.get("ph") != "M":
                e["ts"] = round(e["ts"] + (base - origin), 3)
            events.append(e)
    earliest = min((e["ts"] for e in events if e.get("ph") != "M"), default=0.0)
    for e in events:
        if e.get("ph") != "M":
            e["ts"] = round(e["ts"] - earliest, 3)
    origin += earliest
    clocks = {}
    for t in traces:
        clocks.update(t["otherData"]["tilescale"].get("clocks") or {})
    first = traces[0]["otherData"]["tilescale"] if traces else {}
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tilescale": {"name": first.get("name", "tilescale"), "ranks": sorted(ranks),
                                        "world_size": max([first.get("world_size", 1), len(ranks)]),
                                        "clocks": clocks, "time_origin_us": origin}}}


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def merge_dir(out_dir, world_size: int | None = None, *, timeout_s: float = 30.0) -> str | None:
    """Merge ``out_dir/trace_rank*.json`` into ``out_dir/trace.json``; with `world_size`, wait up to
    `timeout_s` for every rank's file first (ranks finish at different times). Returns the path."""
    out_dir = os.fspath(out_dir)
    if world_size:
        want = [rank_path(out_dir, r) for r in range(world_size)]
        deadline = time.monotonic() + timeout_s
        while not all(os.path.exists(p) for p in want) and time.monotonic() < deadline:
            time.sleep(0.05)
        missing = [p for p in want if not os.path.exists(p)]
        if missing:
            log.warning("tilescale profiler: no trace from %s after %.0f s; merging the others", missing, timeout_s)
        paths = [p for p in want if os.path.exists(p)]
    else:
        paths = sorted(glob.glob(os.path.join(out_dir, "trace_rank*.json")),
                       key=lambda p: int(re.search(r"trace_rank(\d+)\.json$", p).group(1)))
    if not paths:
        return None
    return write(merge([load(p) for p in paths]), os.path.join(out_dir, "trace.json"))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tilescale.profiler.chrome_trace",
                                 description="merge DIR/trace_rank*.json into DIR/trace.json")
    ap.add_argument("dir")
    ap.add_argument("--world-size", type=int, default=None, help="wait for this many rank files")
    ap.add_argument("--timeout", type=float, default=0.0, help="seconds to wait for them")
    a = ap.parse_args(argv)
    path = merge_dir(a.dir, a.world_size, timeout_s=a.timeout)
    if path is None:
        print(f"no trace_rank*.json in {a.dir}")
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
