"""The running profiling session, the profiler registry, and the record helpers that ops call.

Ops guard every use with one check, so that a run without profiling pays one attribute lookup::

    from ..profiler import session as profiling
    rec = profiling.call("AllGather", "coll", bytes=n) if profiling.current is not None else None

``current`` is the active :class:`Session`, or None. Before anything decided it holds a sentinel
(not None), so the first op call lands in :func:`call`, which reads ``TILESCALE_PROFILE`` once and
either starts a session for the whole run or sets ``current = None``.

An op that launches one kernel per call and has nothing else to record (AllGather) may record its call with one
``extend`` of four ints instead (no object kept but the ints: nothing for Python's garbage collector to track)::

    s = profiling.current
    if s is not None and s.quick_coll:  # a session recording COLL calls as host events only
        t0 = profiling.now()
        <launch>
        s.raw.extend((record, s.top, t0, profiling.now()))
    else:                               # not profiling, not decided yet, or more to record: call() / OpCall

where ``record = profiling.call_record("coll", "AllGather", "allgather", bytes=n)`` is made once per op. Cheaper
still, the runtime shim makes the launch and that record in C (``s.timed``: :mod:`.timed_calls`).

The hot path appends raw tuples. A session hands out its own event handles (ints); every start, stop and
state change is one tuple appended to ``Session.raw`` (host times from ``time.perf_counter_ns``), and the
profiler receives them, in order and with their times mapped to ``time.time_ns``, when the session ends
or :meth:`Session.flush` runs (``RecordingProfiler.events()`` flushes first). A profiler whose class sets
``live = True`` is flushed after every record instead (it sees events as they happen, at the old cost).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from . import records
from .events import EventDescr, EventState, EventType, Profiler, ProfilerContext

# now and timed_call are the ops' too (profiling.now, profiling.timed_call)
from .raw import COLL, FUSED, KERNEL, LAUNCH, START, START2, START_AT, STATE, STOP, STOP2, STOP_AT, TYPES, now
from .records import OpCall
from .timed_calls import RawWithShim, ShimCalls, TimedFn, timed_call  # noqa: F401

log = logging.getLogger("tilescale")
_CALL_RECORDS: list[tuple] = []   # (type bit, name, args, launch name | None) of call_record's index


class _Unset:
    quick_coll = False   # the ops' one-append path is never taken before the decision (call() makes it)
    timed = None         # nor the shim's timed calls

    def __repr__(self) -> str:
        return "<not decided: TILESCALE_PROFILE is read at the first op call>"


_UNSET = _Unset()
current: Any = _UNSET              # Session | None | _UNSET
_registered: Any = None             # Profiler instance, class or factory; None = the default recorder
_lock = threading.Lock()


# ------------------------------------------------------------------------------------------ registry
def register_profiler(profiler: Profiler | Callable[[], Profiler] | None) -> None:
    """Use `profiler` for the sessions started from now on (NCCL: ``NCCL_PROFILER_PLUGIN``): a
    :class:`Profiler` instance (reused by every session), or a class / factory called once per session.
    None restores tilescale's default (:class:`tilescale.profiler.default.RecordingProfiler`)."""
    global _registered
    if profiler is not None and not isinstance(profiler, Profiler) and not callable(profiler):
        raise TypeError(f"profiler: got {type(profiler).__name__}, expected a tilescale.profiler.Profiler "
                        "instance, a Profiler subclass or a factory returning one, or None")
    _registered = profiler


def get_profiler() -> Profiler | Callable[[], Profiler]:
    """What sessions will use: the registered profiler (instance or factory), else the default class."""
    if _registered is not None:
        return _registered
    from .default import RecordingProfiler

    return RecordingProfiler


def _instantiate(p) -> Profiler:
    if isinstance(p, Profiler):
        return p
    inst = p()
    if not isinstance(inst, Profiler):
        raise TypeError(f"profiler factory {p!r} returned {type(inst).__name__}, expected a "
                        "tilescale.profiler.Profiler")
    return inst


def _rank_world() -> tuple[int, int]:
    from .. import runtime

    if runtime.is_initialized():
        info = runtime.current().info
        return info.rank, info.world_size
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _cuda_ready() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:  # noqa: BLE001
        return False


# ------------------------------------------------------------------------------------------- session
class Session:
    """One profiling session: a profiler between its ``init`` and ``finalize``, the effective mask, the
    open groups, and the device data to decode when the session ends."""

    def __init__(self, profiler: Profiler, mask: EventType, *, rank: int, world_size: int,
                 out_dir: str | None = None, name: str = "tilescale", clock=None):
        self.profiler = profiler
        self.rank, self.world_size = rank, world_size
        self.context = ProfilerContext(name=name, out_dir=out_dir)
        requested = EventType(mask).with_parents()
        gpu = requested & (EventType.DEVICE | EventType.COPY)
        if clock is None and gpu and _cuda_ready():
            from .device_timeline import measure_clock

            try:
                clock = measure_clock()
            except Exception as e:  # noqa: BLE001  (profile the host side rather than fail the run)
                warnings.warn(f"tilescale profiler: could not map the GPU clock to the host's ({type(e).__name__}: "
                              f"{e}); GPU-side events (kernel, copy, wait, tile) are off in this session",
                              RuntimeWarning, stacklevel=3)
        self.clock = self.context.clock = clock
        wanted = profiler.init(self.context, rank, world_size, requested)
        self.mask = requested if wanted is None else (requested & EventType(wanted)).with_parents()
        if self.clock is None:  # GPU-side events need the GPU clock on the host's
            self.mask &= ~(EventType.DEVICE | EventType.COPY)
        self.bits = int(self.mask)   # the hot paths test plain ints (IntFlag's & costs a microsecond)
        self.next_id = itertools.count(1).__next__   # the session's event handles
        self.live = bool(getattr(profiler, "live", False))
        self._handles: dict[int, Any] = {}   # session handle -> the profiler's handle (delivered events)
        self._clock0 = _perf_to_wall()       # (perf_counter_ns, time_ns - perf_counter_ns) at the start
        self.context.flush = self.flush
        self.groups: list = []
        self.top = 0                  # the innermost open group's handle (groups[-1]), 0 outside any group (ids >= 1)
        # quick_coll: a collective's call (COLL on) may be recorded by four ints when it ends (host events only). Not
        # when the kernel's span is timed by CUDA events (KERNEL: recorded around the launch), nor for a live
        # profiler (it sees a call start as it happens): those calls take OpCall (call())
        self.quick_coll = bool(self.bits & COLL) and not self.bits & KERNEL and not self.live
        # such a call may be timed and recorded by the runtime shim instead (ShimCalls): `timed` is its entry, or None
        self.shim = ShimCalls.of(_runtime_shim()) if self.quick_coll else None
        self.timed = self.shim.call if self.shim is not None else None
        # records not yet delivered to the profiler (see the module doc); with the shim's, in their place (_Raw)
        self.raw: list = [] if self.shim is None else RawWithShim(self.shim)
        self.pending: list = []       # DeviceRecord / CopyRecord, decoded in stop()
        self.streams: dict[int, str] = {}
        self.closed = False
        if self.mask & (EventType.KERNEL | EventType.COPY):
            self.track_of(records.current_stream())   # the stream ops launch on is "stream 0"

    # -- the profiler API, filtered by the mask; handles are the session's ints (None: type not recorded)
    def on(self, t: EventType) -> bool:
        return bool(self.bits & t._value_)

    def start(self, type: EventType, name: str, parent=None, track: str = "host", start_ns: int | None = None,
              **args):
        """Start an event if its type is active (now, or at host time `start_ns`); returns its handle, or
        None."""
        bit = type._value_
        if not self.bits & bit:
            return None
        h = self.next_id()
        if start_ns is None:
            self.raw.append((START, h, bit, name, parent, track, now(), args))
        else:
            self.raw.append((START_AT, h, bit, name, parent, track, start_ns, args))
        if self.live:
            self.flush()
        return h

    def stop(self, handle, end_ns: int | None = None) -> None:
        if handle is None:
            return
        self.raw.append((STOP, handle, now()) if end_ns is None else (STOP_AT, handle, end_ns))
        if self.live:
            self.flush()

    def state(self, handle, state: EventState, **args) -> None:
        if handle is not None:
            self.raw.append((STATE, handle, state, args))
            if self.live:
                self.flush()

    def span(self, type: EventType, name: str, parent, track: str, start_ns: int, end_ns: int, **args):
        """An event that already happened (device events): start, END state, stop. Returns the handle."""
        h = self.start(type, name, parent, track, start_ns, **args)
        self.stop(h, end_ns)
        return h

    def flush(self) -> None:
        """Deliver the raw records to the profiler, in order: ``start_event`` (with ``start_ns`` on the host
        clock), ``record_event_state``, and per stop an END state with its time, then ``stop_event``."""
        raw = self.raw
        if self.shim is not None:   # the shim's records made since the last record here
            self.shim.drain(raw)
        if not raw:
            return
        records = raw[:]
        raw.clear()
        # perf_counter_ns -> time_ns: the offsets at the session's start and now, interpolated (the wall clock
        # may be slewed while the session runs; the GPU clock is mapped to the wall clock the same way)
        (p0, o0), (p1, o1) = self._clock0, _perf_to_wall(1 if self.live else 5)
        span = max(p1 - p0, 1)

        def wall(t: int) -> int:
            return t + o0 + (o1 - o0) * (t - p0) // span

        p, hs, rank = self.profiler, self._handles, self.rank
        end = EventState.END
        it = iter(records)
        for r in it:
            if type(r) is int:   # a quick call: record index, parent group id | 0, start, end (perf_counter_ns)
                parent, t0, t1 = next(it), next(it), next(it)
                bit, name, args, launch = _CALL_RECORDS[r]
                pc = p.start_event(EventDescr(TYPES[bit], name, hs[parent] if parent else None, rank, "host",
                                              wall(t0), dict(args)))
                t1 = wall(t1)
                if launch is not None and self.bits & LAUNCH:
                    pl = p.start_event(EventDescr(EventType.LAUNCH, launch, pc, rank, "host", wall(t0), {}))
                    p.record_event_state(pl, end, {"end_ns": t1})
                    p.stop_event(pl)
                p.record_event_state(pc, end, {"end_ns": t1})
                p.stop_event(pc)
                continue
            kind = r[0]
            if kind == START or kind == START_AT:
                _, h, bit, name, parent, track, t, args = r
                hs[h] = p.start_event(EventDescr(TYPES[bit], name, None if parent is None else hs[parent], rank,
                                                 track, wall(t) if kind == START else t, args))
            elif kind == START2:
                _, c, bit, name, parent, t, args, h, launch, tl = r
                hs[c] = pc = p.start_event(EventDescr(TYPES[bit], name, None if parent is None else hs[parent], rank,
                                                      "host", wall(t), args))
                hs[h] = p.start_event(EventDescr(EventType.LAUNCH, launch, pc, rank, "host", wall(tl), {}))
            elif kind == STATE:
                p.record_event_state(hs[r[1]], r[2], r[3])
            elif kind == STOP2:
                for ph, t in ((hs[r[1]], r[2]), (hs[r[3]], r[4])):
                    p.record_event_state(ph, end, {"end_ns": wall(t)})
                    p.stop_event(ph)
            else:
                ph = hs[r[1]]
                p.record_event_state(ph, end, {"end_ns": wall(r[2]) if kind == STOP else r[2]})
                p.stop_event(ph)

    def set_top(self, group: int) -> None:
        """The innermost open group (0: none), the parent of the quick records made from now on: Python's and the
        shim's."""
        self.top = group
        if self.shim is not None:
            self.shim.group(group)

    def track_of(self, stream) -> str:
        """'stream N' for a CUDA stream (numbered in order of first use in this session)."""
        key = int(getattr(stream, "cuda_stream", 0) or 0)
        name = self.streams.get(key)
        if name is None:
            name = self.streams[key] = f"stream {len(self.streams)}"
        return name

    # -- lifecycle
    def stop_session(self) -> None:
        """Decode device data (waits for the GPU), report it, finalize the profiler. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.pending:
                if _cuda_ready():
                    import torch

                    torch.cuda.synchronize()
                    if self.clock is not None:
                        self.clock.resample()
                for p in self.pending:
                    p.report(self)
                self.pending.clear()
            self.flush()
            if self.shim is not None and self.shim.lost.value:
                warnings.warn(f"tilescale profiler: {self.shim.lost.value} op call(s) timed by the runtime shim could "
                              "not be recorded (out of memory)", RuntimeWarning, stacklevel=2)
        finally:
            self.profiler.finalize()


def _runtime_shim():
    """The runtime's loaded shim (tilescale/csrc/ts_runtime.cu), or None before ``init_distributed``: where a session
    finds the timed calls. Tests and benchmarks without a runtime put a shim they loaded in its place."""
    from .. import runtime

    return getattr(runtime.current(), "shim", None) if runtime.is_initialized() else None



# ------------------------------------------------------------------------------- what ops call
def call(name: str, kind: str = "coll", *, launch: str | None = None, **args) -> OpCall | None:
    """Start a collective (`kind="coll"`) or fused-op (`"fused"`) call event with attributes `args`;
    None when not profiling. With `launch` (a kernel name), a LAUNCH event runs from now until
    ``end()``. Ops call it only when ``current is not None``."""
    s = current
    if s is _UNSET:
        s = _from_env()
    if s is None:
        return None
    bit = FUSED if kind == "fused" else COLL
    if not s.bits & bit:
        return None
    return OpCall(s, name, bit, args, launch)


def call_record(kind: str, name: str, launch: str | None = None, **args) -> int:
    """The constant part of an op's quick call records (see the module docstring), registered for the process: a
    collective (`kind` "coll") or fused-op ("fused") call `name` with attributes `args`, and its `launch` (a kernel
    name: a LAUNCH event spanning the call) or None. Returns its index, the first of the four ints; an op makes it
    once (every session reads the same table)."""
    with _lock:
        _CALL_RECORDS.append((FUSED if kind == "fused" else COLL, name, dict(args), launch))
        return len(_CALL_RECORDS) - 1


def _from_env():
    """First op call of the process: start a session if TILESCALE_PROFILE=1, else profiling is off."""
    global current
    from ..env import settings

    with _lock:
        if current is not _UNSET:
            return current
        if not settings.profile:
            current = None
            return None
        mask = EventType.parse(settings.profile_mask, "TILESCALE_PROFILE_MASK")
        rank, ws = _rank_world()
        current = Session(_instantiate(get_profiler()), mask, rank=rank, world_size=ws,
                          out_dir=str(settings.profile_dir), name="TILESCALE_PROFILE")
        atexit.register(shutdown)
        log.info("tilescale profiler: recording %s into %s", current.mask, settings.profile_dir)
        return current


def shutdown(merge_timeout_s: float = 30.0) -> str | None:
    """End the session started by TILESCALE_PROFILE=1 (also run at exit): finalize, and on rank 0 merge
    the ranks' files into trace.json. Returns the merged file's path on rank 0."""
    global current
    s = current
    if not isinstance(s, Session):
        return None
    current = None
    s.stop_session()
    return _merge_on_rank0(s, merge_timeout_s)


def _merge_on_rank0(s: Session, timeout_s: float) -> str | None:
    out = s.context.out_dir
    if not out or s.rank != 0:
        return None
    from . import chrome_trace

    if not os.path.exists(chrome_trace.rank_path(out, 0)):   # a profiler that writes no trace files
        return None

    return chrome_trace.merge_dir(out, s.world_size, timeout_s=timeout_s)


def reset() -> None:
    """Forget the session decision (tests): the next op call reads TILESCALE_PROFILE again. An active
    session is stopped first."""
    global current
    if isinstance(current, Session):
        current.stop_session()
    current = _UNSET


@contextlib.contextmanager
def profile(out_dir: str | os.PathLike | None = None, *, mask: EventType | str | int = EventType.ALL,
            profiler: Profiler | Callable[[], Profiler] | None = None, name: str = "tilescale",
            rank: int | None = None, world_size: int | None = None, merge: bool = True,
            merge_timeout_s: float = 30.0, clock=None) -> Iterator[Session]:
    """Profile the tilescale calls made inside the block::

        with tilescale.profiler.profile("prof", mask="fused,launch,copy,tile"):
            c = op(a, b)

    Events go to `profiler` (default: the registered one, else the recorder, which writes
    ``out_dir/trace_rank<R>.json``; rank 0 then merges every rank's file into ``out_dir/trace.json``,
    waiting up to `merge_timeout_s` for them). WAIT/TILE events come from ops built with in-kernel
    timestamps (``AGGemm(..., profile=True)`` or ``TILESCALE_PROFILE_DEVICE=1``). Not re-entrant."""
    global current
    if isinstance(mask, str):
        mask = EventType.parse(mask, "mask")
    elif isinstance(mask, int) and not isinstance(mask, bool):
        mask = mask if isinstance(mask, EventType) else EventType.parse(str(mask), "mask")
    else:
        raise TypeError(f"mask: got {type(mask).__name__} {mask!r}, expected an EventType, a name list such "
                        "as 'coll,launch' or an int")
    with _lock:
        if isinstance(current, Session):
            raise RuntimeError("tilescale.profiler.profile: a profiling session is already active (nested "
                               "profile() blocks, or TILESCALE_PROFILE=1 with profile()); end it first")
        r, w = _rank_world()
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
        s = Session(_instantiate(profiler if profiler is not None else get_profiler()), mask,
                    rank=r if rank is None else rank, world_size=w if world_size is None else world_size,
                    out_dir=None if out_dir is None else os.fspath(out_dir), name=name, clock=clock)
        previous, current = current, s
    try:
        yield s
    finally:
        with _lock:
            current = previous
        s.stop_session()
        if merge:
            _merge_on_rank0(s, merge_timeout_s)


@contextlib.contextmanager
def group(name: str, **args) -> Iterator[Any]:
    """A GROUP event around the calls in the block (nested groups nest). No-op when not profiling."""
    s = current
    if not isinstance(s, Session) or not s.mask & EventType.GROUP:
        yield None
        return
    h = s.start(EventType.GROUP, name, s.top or None, **args)
    s.groups.append(h)
    s.set_top(h)
    try:
        yield h
    finally:
        s.groups.pop()
        s.set_top(s.groups[-1] if s.groups else 0)
        s.stop(h)


def _perf_to_wall(samples: int = 5) -> tuple[int, int]:
    """(perf_counter_ns, time_ns - perf_counter_ns): the wall clock read between two reads of the hot path's
    clock, the tightest of `samples`."""
    best = None
    for _ in range(samples):
        a = now()
        w = time.time_ns()
        b = now()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2, w - (a + b) // 2)
    return best[1], best[2]


def now_ns() -> int:
    """The host clock of every event: ``time.time_ns`` (one clock for every process of a node)."""
    return time.time_ns()
