"""tilescale's profiler: an event hierarchy from API call to in-kernel tile steps, as a Chrome/Perfetto
trace. The interface is modelled on NCCL's profiler plugin API (init / start_event / stop_event /
record_event_state / finalize, an activation mask, events naming their parent).

    import tilescale.profiler as tp

    with tp.profile("prof"):                 # or TILESCALE_PROFILE=1 for the whole run
        with tp.group("step"):
            c = op(a, b)                     # FUSED -> LAUNCH -> KERNEL -> WAIT / TILE, COPY
    # prof/trace_rank<R>.json per rank, prof/trace.json (all ranks) on rank 0: open it in Perfetto

Your own profiler: subclass :class:`Profiler` and ``register_profiler(MyProfiler)``. In-kernel
timestamps (per-tile WAIT / TILE events) need ops built with them: ``AGGemm(..., profile=True)`` or
``TILESCALE_PROFILE_DEVICE=1``; without, the kernels are unchanged.

Modules: :mod:`.events` (types, descriptors, the Profiler base class), :mod:`.session` (the running
session, registry, what ops call), :mod:`.default` (the recorder), :mod:`.chrome_trace` (export and
merge), :mod:`.device_timeline` (tile records, GPU clock -> host clock).
"""
from .events import EventDescr, EventState, EventType, Profiler, ProfilerContext
from .session import Session, get_profiler, group, profile, register_profiler, reset, shutdown


def active() -> bool:
    """Whether a profiling session is recording now."""
    from . import session

    return isinstance(session.current, Session)


__all__ = ["EventDescr", "EventState", "EventType", "Profiler", "ProfilerContext", "Session", "active",
           "get_profiler", "group", "profile", "register_profiler", "reset", "shutdown"]
