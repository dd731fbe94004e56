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
still, when the runtime shim has it (:class:`ShimCalls`), the shim makes the launch and that record in C::

    if s.timed is not None:             # a quick_coll session with the shim's timed calls
        rc = s.timed(op_call, x, stream)    # op_call = profiling.timed_call(<C entry>, record, args, vary), once per op

(the four ints reach ``Session.raw`` in their place among the session's other records: ``_Raw``).

The hot path appends raw tuples. A session hands out its own event handles (ints); every start, stop and
state change is one tuple appended to ``Session.raw`` (host times from ``time.perf_counter_ns``), and the
profiler receives them, in order and with their times mapped to ``time.time_ns``, when the session ends
or :meth:`Session.flush` runs (``RecordingProfiler.events()`` flushes first). A profiler whose class sets
``live = True`` is flushed after every record instead (it sees events as they happen, at the old cost).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from .events import EventDescr, EventState, EventType, Profiler, ProfilerContext

log = logging.getLogger("tilescale")
_KERNEL, _COPY, _TILES = int(EventType.KERNEL), int(EventType.COPY), int(EventType.WAIT | EventType.TILE)
_LAUNCH, _COLL, _FUSED = int(EventType.LAUNCH), int(EventType.COLL), int(EventType.FUSED)
_TYPES = {int(t): t for t in EventType}   # bit -> EventType, when raw records become descriptors
_now = time.perf_counter_ns               # the hot path's clock (mapped to time.time_ns in flush)
_NO_ARGS: dict = {}
# raw records (Session.raw), one tuple per profiler call, built on the hot path:
#   (_START, id, type bit, name, parent id | None, track, perf_counter_ns, args)    a host event starts now
#   (_START_AT, id, type bit, name, parent id | None, track, time_ns, args)          an event that started at
#   (_STOP, id, perf_counter_ns)       (_STOP_AT, id, time_ns)                       it ended now / at
#   (_STATE, id, EventState, args)
# and, for an op call and its LAUNCH (OpCall: one append at its start, one at its end):
#   (_START2, call id, type bit, name, parent id | None, perf_counter_ns, args, launch id, launch name, perf_ns)
#   (_STOP2, launch id, perf_counter_ns, call id, perf_counter_ns)
# and, for a whole op call and its LAUNCH, four ints (not a tuple) extended when the call ends (a session that is
# ``quick_coll``; see the module docstring):
#   record (an index into _CALL_RECORDS: call_record), parent group id | 0, perf_counter_ns, perf_counter_ns
# (no handle: nothing else refers to the call; the LAUNCH spans the call when the mask has LAUNCH); the runtime shim's
# timed calls make the same four ints in C (ShimCalls)
_START, _START_AT, _START2, _STOP, _STOP_AT, _STOP2, _STATE = range(7)
now = _now   # for the ops' quick call records (see the module docstring)
_CALL_RECORDS: list[tuple] = []   # (type bit, name, args, launch name | None) of call_record's index
_TIMED_CALLS: list = []            # the shim's ts_timed_fn of each timed_call (TimedFn), kept for the process
_TIMED_CHUNK = 4096                # records a ShimCalls moves per ts_timed_take


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
        self.quick_coll = bool(self.bits & _COLL) and not self.bits & _KERNEL and not self.live
        # such a call may be timed and recorded by the runtime shim instead (ShimCalls): `timed` is its entry, or None
        self.shim = ShimCalls.of(_runtime_shim()) if self.quick_coll else None
        self.timed = self.shim.call if self.shim is not None else None
        # records not yet delivered to the profiler (see the module doc); with the shim's, in their place (_Raw)
        self.raw: list = [] if self.shim is None else _Raw(self.shim)
        self.pending: list = []       # DeviceRecord / CopyRecord, decoded in stop()
        self.streams: dict[int, str] = {}
        self.closed = False
        if self.mask & (EventType.KERNEL | EventType.COPY):
            self.track_of(_current_stream())   # the stream ops launch on is "stream 0"

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
            self.raw.append((_START, h, bit, name, parent, track, _now(), args))
        else:
            self.raw.append((_START_AT, h, bit, name, parent, track, start_ns, args))
        if self.live:
            self.flush()
        return h

    def stop(self, handle, end_ns: int | None = None) -> None:
        if handle is None:
            return
        self.raw.append((_STOP, handle, _now()) if end_ns is None else (_STOP_AT, handle, end_ns))
        if self.live:
            self.flush()

    def state(self, handle, state: EventState, **args) -> None:
        if handle is not None:
            self.raw.append((_STATE, handle, state, args))
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
                pc = p.start_event(EventDescr(_TYPES[bit], name, hs[parent] if parent else None, rank, "host",
                                              wall(t0), dict(args)))
                t1 = wall(t1)
                if launch is not None and self.bits & _LAUNCH:
                    pl = p.start_event(EventDescr(EventType.LAUNCH, launch, pc, rank, "host", wall(t0), {}))
                    p.record_event_state(pl, end, {"end_ns": t1})
                    p.stop_event(pl)
                p.record_event_state(pc, end, {"end_ns": t1})
                p.stop_event(pc)
                continue
            kind = r[0]
            if kind == _START or kind == _START_AT:
                _, h, bit, name, parent, track, t, args = r
                hs[h] = p.start_event(EventDescr(_TYPES[bit], name, None if parent is None else hs[parent], rank,
                                                 track, wall(t) if kind == _START else t, args))
            elif kind == _START2:
                _, c, bit, name, parent, t, args, h, launch, tl = r
                hs[c] = pc = p.start_event(EventDescr(_TYPES[bit], name, None if parent is None else hs[parent], rank,
                                                      "host", wall(t), args))
                hs[h] = p.start_event(EventDescr(EventType.LAUNCH, launch, pc, rank, "host", wall(tl), {}))
            elif kind == _STATE:
                p.record_event_state(hs[r[1]], r[2], r[3])
            elif kind == _STOP2:
                for ph, t in ((hs[r[1]], r[2]), (hs[r[3]], r[4])):
                    p.record_event_state(ph, end, {"end_ns": wall(t)})
                    p.stop_event(ph)
            else:
                ph = hs[r[1]]
                p.record_event_state(ph, end, {"end_ns": wall(r[2]) if kind == _STOP else r[2]})
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


# ------------------------------------------------------------------------------- the shim's timed calls
class ShimCalls:
    """Op calls timed and recorded by the runtime shim (``ts_timed_call``, tilescale/csrc/ts_runtime.cu) instead of
    Python (issue 15: a Python record costs more than the profiler's 2% of a 1 MiB AllGather call). A session whose
    COLL calls are quick records (``quick_coll``) makes one when the shim has them; the protocol:

    1. the session starts: the shim's buffer emptied, its group 0 (``ts_timed_reset``);
    2. an op calls ``session.timed(op_call, a, b)`` (:attr:`call`; `op_call` from :func:`timed_call`, made once per
       op; `a`, `b`: the two arguments of its C entry point that change per call): the shim reads CLOCK_MONOTONIC,
       calls the op's C entry point with its arguments, reads it again and, when it returned 0, appends the quick
       record (record, group, t0, t1) to its buffer; returns its result;
    3. a group opens or closes: the session tells the shim its innermost group (:meth:`Session.set_top`);
    4. before the session appends a record of its own (``Session.raw`` is a :class:`_Raw`), and when it flushes,
       :meth:`drain` moves the shim's records into ``raw``: each keeps its place among the session's records.

    The shim's clock is that of ``time.perf_counter_ns`` when Python's perf_counter is CLOCK_MONOTONIC (Linux); else
    there are no timed calls. One buffer for the process (one session at a time); a mutex in the shim guards it, for
    any number of threads (ctypes releases the GIL around the calls)."""

    __slots__ = ("call", "group", "_take", "_buf", "pending", "lost")

    def __init__(self, shim):
        self.call = shim.ts_timed_call
        self._take = shim.ts_timed_take
        self.group = shim.ts_timed_group   # group(top): the parent of the records made from now on (step 3)
        self.pending = ctypes.c_longlong.in_dll(shim, "ts_timed_pending")   # records waiting in the shim
        self.lost = ctypes.c_longlong.in_dll(shim, "ts_timed_lost")         # records the shim could not store
        self._buf = (ctypes.c_longlong * (4 * _TIMED_CHUNK))()
        shim.ts_timed_reset()

    @classmethod
    def of(cls, shim) -> ShimCalls | None:
        """The timed calls of the loaded runtime shim `shim` for a new session, or None: no shim, a shim without them,
        or a perf_counter that is not the shim's clock."""
        if shim is None or getattr(shim, "ts_timed_call", None) is None:
            return None
        if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            return None
        return cls(shim)

    def drain(self, raw: list) -> None:
        """Move the shim's records to the end of `raw`, oldest first (quick records: four ints each)."""
        while self.pending.value:
            n = self._take(self._buf, _TIMED_CHUNK)
            list.extend(raw, self._buf[:4 * n])


class _Raw(list):
    """``Session.raw`` of a session with the shim's timed calls: a record appended here first takes in the shim's
    records (made before it), so that the records stay in the order they were made (:class:`ShimCalls` step 4)."""

    __slots__ = ("shim",)

    def __init__(self, shim: ShimCalls):
        super().__init__()
        self.shim = shim

    def append(self, record) -> None:
        if self.shim.pending.value:
            self.shim.drain(self)
        list.append(self, record)

    def extend(self, records) -> None:
        if self.shim.pending.value:
            self.shim.drain(self)
        list.extend(self, records)


def _runtime_shim():
    """The runtime's loaded shim (tilescale/csrc/ts_runtime.cu), or None before ``init_distributed``: where a session
    finds the timed calls. Tests and benchmarks without a runtime put a shim they loaded in its place."""
    from .. import runtime

    return getattr(runtime.current(), "shim", None) if runtime.is_initialized() else None


class TimedFn(ctypes.Structure):
    """The shim's ``ts_timed_fn`` (tilescale/csrc/ts_runtime.cu): an op's C entry point (6 word-sized integer
    arguments), its :func:`call_record`, the arguments that stay the same from call to call and where the two that
    change go."""

    _fields_ = [("fn", ctypes.c_void_p), ("record", ctypes.c_longlong), ("args", ctypes.c_uint64 * 6),
                ("vary", ctypes.c_int * 2)]


def timed_call(entry: int, record: int, args: tuple, vary: tuple) -> int:
    """An op's timed call for the shim (a :class:`TimedFn`: the address of its C entry point, its
    :func:`call_record`, its 6 arguments `args` of which those at the two indices `vary` are given per call), made
    once per op and kept for the process like its record; returns its address, the first argument of
    ``Session.timed``."""
    if len(args) != 6 or len(vary) != 2 or not all(0 <= i < 6 for i in vary) or vary[0] == vary[1]:
        raise ValueError(f"timed_call: args {args!r}, vary {vary!r}: expected 6 arguments and 2 distinct indices")
    fn = TimedFn(entry, record, (ctypes.c_uint64 * 6)(*(int(a) for a in args)), (ctypes.c_int * 2)(*vary))
    with _lock:
        _TIMED_CALLS.append(fn)
    return ctypes.addressof(fn)


# -------------------------------------------------------------------------------------- op records
class CopyStream:
    """The copy-engine chunks one op call enqueued on one stream: CUDA events between chunks."""

    __slots__ = ("stream", "src", "launch", "marks", "track", "open")

    def __init__(self, stream, src, launch, track):
        self.stream, self.src, self.launch, self.track = stream, src, launch, track
        self.marks: list = []   # [(event, chunk or None)]: None = before the first chunk
        self.open = True        # its LAUNCH (the host enqueueing the chunks) not stopped yet


class OpCall:
    """What an op holds during one profiled call: the call event, its launches, its copy streams."""

    __slots__ = ("s", "call", "copies", "open_launch")

    def __init__(self, s: Session, name: str, bit: int, args: dict, launch: str | None = None):
        # the hot path of every profiled op call: one raw append for the call and its LAUNCH
        self.s = s
        g = s.groups
        parent = g[-1] if g else None
        self.call = c = s.next_id()
        self.copies: list[CopyStream] = []
        self.open_launch = h = None
        if launch is not None and s.bits & _LAUNCH:   # the call and its LAUNCH, from now until end()
            h = -c   # the LAUNCH's handle: ids are positive
            s.raw.append((_START2, c, bit, name, parent, _now(), args, h, launch, _now()))
        else:
            s.raw.append((_START, c, bit, name, parent, "host", _now(), args))
        if launch is not None:   # an op that launches one kernel: its KERNEL event is timed by CUDA events
            st = ev0 = None
            if s.bits & _KERNEL:
                st = _current_stream()
                ev0 = _record_event(st)
            self.open_launch = (h, launch, st, ev0)
        if s.live:
            s.flush()

    # copy-engine chunks (COPY events), stream by stream
    def copies_begin(self, stream, src: int, direction: str = "from") -> None:
        """Before the first chunk enqueued on `stream` (pulled from rank `src`; `direction` "to": pushed to it)."""
        s = self.s
        if not s.bits & _COPY:
            return
        self._copies_enqueued()
        launch = s.start(EventType.LAUNCH, f"copies {direction} rank {src}", self.call, src=src)
        cs = CopyStream(stream, src, launch, s.track_of(stream))
        cs.marks.append((_record_event(stream), None))
        self.copies.append(cs)

    def copy_done(self, stream, src: int, chunk: int, nbytes: int = 0) -> None:
        """After chunk `chunk` (and its signal) were enqueued on `stream`."""
        if not self.copies:
            return
        cs = next((c for c in reversed(self.copies) if c.stream is stream), None)
        if cs is not None:
            cs.marks.append((_record_event(stream), (chunk, nbytes)))

    # kernel launches (LAUNCH; KERNEL from CUDA events; WAIT/TILE from the instrumented kernel)
    def launcher(self, kernel, *, instrumented=None, tiles: int = 0, end: bool = False, stream=None):
        """A function that launches `kernel` with the arguments it is given, as a LAUNCH event; with
        `instrumented` (the same kernel built with profile=True, taking a last uint64 buffer of `tiles`
        records) and WAIT/TILE active, launches that one instead and keeps the buffer for decoding.
        `end=True`: the call ends with this launch."""
        s = self.s

        def launch(*args):
            self._copies_enqueued()
            name = getattr(kernel, "name", None) or getattr(kernel, "__name__", "kernel")
            h = s.start(EventType.LAUNCH, name, self.call)
            dev = instrumented is not None and s.bits & _TILES
            timed = s.bits & _KERNEL
            st = None
            if timed or dev:
                st = stream or _current_stream()
            ev0 = _record_event(st) if timed else None
            if dev:
                import torch

                from .device_timeline import TILE_WORDS

                buf = torch.zeros(tiles * TILE_WORDS, dtype=torch.int64, device=args[0].device).view(torch.uint64)
                instrumented.launch(*args, buf)
            else:
                buf = None
                kernel.launch(*args)
            ev1 = _record_event(st) if timed else None
            s.stop(h)
            if timed or buf is not None:
                s.pending.append(DeviceRecord(h, name, s.track_of(st), ev0, ev1, buf))
            if end:
                self.end()

        return launch

    def _copies_enqueued(self) -> None:
        """The host has moved on from the copies enqueued so far: their LAUNCH events end."""
        for cs in self.copies:
            if cs.open:
                self.s.stop(cs.launch)
                cs.open = False

    def end(self) -> None:
        s = self.s
        if self.copies:
            self._copies_enqueued()
        h = None
        if self.open_launch is not None:
            h, name, st, ev0 = self.open_launch
            if ev0 is not None:
                s.pending.append(DeviceRecord(h, name, s.track_of(st), ev0, _record_event(st), None))
            self.open_launch = None
        if self.copies:
            for cs in self.copies:
                s.pending.append(CopyRecord(cs))
            self.copies = []
        if h is None:
            s.raw.append((_STOP, self.call, _now()))
        else:   # the LAUNCH, then the call
            s.raw.append((_STOP2, h, _now(), self.call, _now()))
        self.call = None
        if s.live:
            s.flush()


def _current_stream():
    import torch

    return torch.cuda.current_stream()


def _record_event(stream):
    """A timed CUDA event recorded on `stream` (read when the session ends)."""
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record(stream)
    return ev


class DeviceRecord:
    """A launch's GPU side, decoded when the session ends: the kernel span (CUDA events, else the
    tiles' first and last stamps) and, for instrumented kernels, one WAIT and one TILE per tile."""

    __slots__ = ("launch", "name", "track", "ev0", "ev1", "buf")

    def __init__(self, launch, name, track, ev0, ev1, buf):
        self.launch, self.name, self.track, self.ev0, self.ev1, self.buf = launch, name, track, ev0, ev1, buf

    def report(self, s: Session) -> None:
        from . import device_timeline as dt

        tiles = []
        if self.buf is not None:
            words = self.buf.view(-1)
            if hasattr(words, "cpu"):
                import torch

                words = words.view(torch.int64).cpu().tolist()
            tiles = dt.decode_tiles(words)
        clock = s.clock
        if self.ev0 is not None:
            t0, t1 = clock.event_to_host(self.ev0), clock.event_to_host(self.ev1)
        elif tiles:
            t0, t1 = clock.to_host(min(t.t_start for t in tiles)), clock.to_host(max(t.t_end for t in tiles))
        else:
            return
        args = {"tiles": len(tiles)} if self.buf is not None else {}
        kern = s.span(EventType.KERNEL, self.name, self.launch, self.track, t0, t1, **args)
        dt.report_tiles(s, kern, tiles, clock)


class CopyRecord:
    """One stream's copy-engine chunks of one call: COPY events between consecutive CUDA events."""

    __slots__ = ("cs",)

    def __init__(self, cs: CopyStream):
        self.cs = cs

    def report(self, s: Session) -> None:
        cs, clock = self.cs, s.clock
        prev = clock.event_to_host(cs.marks[0][0])
        for ev, info in cs.marks[1:]:
            t = clock.event_to_host(ev)
            chunk, nbytes = info
            s.span(EventType.COPY, f"chunk {chunk} from rank {cs.src}", cs.launch, cs.track, prev, max(t, prev),
                   src=cs.src, chunk=chunk, bytes=nbytes)
            prev = max(t, prev)


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
    bit = _FUSED if kind == "fused" else _COLL
    if not s.bits & bit:
        return None
    return OpCall(s, name, bit, args, launch)


def call_record(kind: str, name: str, launch: str | None = None, **args) -> int:
    """The constant part of an op's quick call records (see the module docstring), registered for the process: a
    collective (`kind` "coll") or fused-op ("fused") call `name` with attributes `args`, and its `launch` (a kernel
    name: a LAUNCH event spanning the call) or None. Returns its index, the first of the four ints; an op makes it
    once (every session reads the same table)."""
    with _lock:
        _CALL_RECORDS.append((_FUSED if kind == "fused" else _COLL, name, dict(args), launch))
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
        a = _now()
        w = time.time_ns()
        b = _now()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2, w - (a + b) // 2)
    return best[1], best[2]


def now_ns() -> int:
    """The host clock of every event: ``time.time_ns`` (one clock for every process of a node)."""
    return time.time_ns()
