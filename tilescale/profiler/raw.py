"""The raw records of a profiling session (``Session.raw``): what the hot path appends, and its clock.

A record is a tuple of ints, strings and dicts, made without a Python call beyond the append; the session turns
them into the profiler's events when it flushes (:meth:`tilescale.profiler.session.Session.flush`).
"""
import time

from .events import EventType

KERNEL, COPY, TILES = int(EventType.KERNEL), int(EventType.COPY), int(EventType.WAIT | EventType.TILE)
LAUNCH, COLL, FUSED = int(EventType.LAUNCH), int(EventType.COLL), int(EventType.FUSED)
TYPES = {int(t): t for t in EventType}   # bit -> EventType, when raw records become descriptors
now = time.perf_counter_ns                # the hot path's clock (mapped to time.time_ns in flush)
NO_ARGS: dict = {}
# raw records (Session.raw), one tuple per profiler call, built on the hot path:
#   (START, id, type bit, name, parent id | None, track, perf_counter_ns, args)    a host event starts now
#   (START_AT, id, type bit, name, parent id | None, track, time_ns, args)          an event that started at
#   (STOP, id, perf_counter_ns)       (STOP_AT, id, time_ns)                       it ended now / at
#   (STATE, id, EventState, args)
# and, for an op call and its LAUNCH (OpCall: one append at its start, one at its end):
#   (START2, call id, type bit, name, parent id | None, perf_counter_ns, args, launch id, launch name, perf_ns)
#   (STOP2, launch id, perf_counter_ns, call id, perf_counter_ns)
# and, for a whole op call and its LAUNCH, four ints (not a tuple) extended when the call ends (a session that is
# ``quick_coll``; see the module docstring):
#   record (an index into session._CALL_RECORDS: call_record), parent group id | 0, perf_counter_ns, perf_counter_ns
# (no handle: nothing else refers to the call; the LAUNCH spans the call when the mask has LAUNCH); the runtime shim's
# timed calls make the same four ints in C (ShimCalls)
START, START_AT, START2, STOP, STOP_AT, STOP2, STATE = range(7)
