"""tilescale's own profiler: records every event in memory and, when its session ends, writes this
rank's Chrome trace (``<out_dir>/trace_rank<R>.json``, see :mod:`tilescale.profiler.chrome_trace`)."""
from __future__ import annotations

import contextlib
import os
import time

from .events import EventDescr, EventState, Profiler, ProfilerContext

# fields of a handle (a list: cheap to create and update on the hot path)
ID, PARENT, TYPE, NAME, TRACK, START, END, ARGS, STATES = range(9)


class RecordingProfiler(Profiler):
    """Keeps events as lists ``[id, parent id, type, name, track, start_ns, end_ns, args, states]``;
    :meth:`events` gives them as dicts."""

    name = "tilescale"

    def __init__(self) -> None:
        self.context: ProfilerContext | None = None
        self.rank, self.world_size = 0, 1
        self._events: list[list] = []
        self.path: str | None = None

    def init(self, context, rank, world_size, mask):
        self.context, self.rank, self.world_size = context, rank, world_size
        self._events = []
        self.path = None
        if context.out_dir:  # a file of an earlier run must not be merged as this run's
            from . import chrome_trace

            with contextlib.suppress(FileNotFoundError):
                os.remove(chrome_trace.rank_path(context.out_dir, rank))
        return None

    def start_event(self, d: EventDescr):
        h = [len(self._events) + 1, d.parent[ID] if d.parent is not None else None, d.type, d.name, d.track,
             d.start_ns if d.start_ns is not None else time.time_ns(), None, d.args, None]
        self._events.append(h)
        return h

    def stop_event(self, h) -> None:
        if h[END] is None:
            h[END] = time.time_ns()

    def record_event_state(self, h, state, args) -> None:
        if state is EventState.END:
            h[END] = int(args["end_ns"])
            return
        if h[STATES] is None:
            h[STATES] = []
        h[STATES].append((state.value, dict(args)))

    def events(self) -> list[dict]:
        """Every event of the session: id, parent (id or None), type (name), name, track, start_ns, end_ns
        (None while open), args, states [(state, args)]. The session's records so far are delivered first."""
        flush = self.context.flush if self.context is not None else None
        if flush is not None:
            flush()
        return [{"id": h[ID], "parent": h[PARENT], "type": h[TYPE].name, "name": h[NAME], "track": h[TRACK],
                 "start_ns": h[START], "end_ns": h[END], "args": h[ARGS], "states": h[STATES] or []}
                for h in self._events]

    def finalize(self) -> None:
        ctx = self.context
        if ctx is None or not ctx.out_dir:
            return
        from . import chrome_trace

        clock = ctx.clock.describe() if ctx.clock is not None and hasattr(ctx.clock, "describe") else None
        trace = chrome_trace.rank_trace(self.events(), self.rank, self.world_size, name=ctx.name, clock=clock)
        self.path = chrome_trace.write(trace, chrome_trace.rank_path(ctx.out_dir, self.rank))
