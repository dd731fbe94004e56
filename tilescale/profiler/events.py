"""The profiler interface: event types (the activation mask), event descriptors, states, and the
:class:`Profiler` base class that tilescale calls. Modelled on NCCL's profiler plugin API
(``ncclProfiler_v5_t``: init / startEvent / stopEvent / recordEventState / finalize).

Event hierarchy (each event names its parent, as NCCL's ``parentObj``)::

    GROUP                          profiler.group("step 3"): a user-named span of calls
     +- COLL | FUSED               a collective (AllGather) or fused-op (AG+GEMM) call
         +- LAUNCH                 the host launching work: a kernel, or one peer's copy-engine pulls
             +- KERNEL             the kernel running on the GPU (from in-kernel timestamps)
             |   +- WAIT           a tile waiting for its chunk's signal (ends when the signal is observed)
             |   +- TILE           a GEMM tile computed (per SM)
             +- COPY               one copy-engine chunk on a copy stream (CUDA events)

A profiler receives only the types of its activation mask; asking for a type also turns on the types
above it (a TILE needs its KERNEL, LAUNCH and call), as in NCCL.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class EventType(enum.IntFlag):
    """Bits of the activation mask."""

    GROUP = 1 << 0
    COLL = 1 << 1
    FUSED = 1 << 2
    LAUNCH = 1 << 3
    KERNEL = 1 << 4
    COPY = 1 << 5
    WAIT = 1 << 6
    TILE = 1 << 7

    NONE = 0
    HOST = GROUP | COLL | FUSED | LAUNCH           # recorded by the host alone, no GPU work added
    DEVICE = KERNEL | WAIT | TILE                  # needs an instrumented kernel (in-kernel timestamps)
    ALL = HOST | COPY | DEVICE

    @classmethod
    def parse(cls, raw: str, what: str = "mask") -> EventType:
        """'all', 'host', 'coll,launch,tile' (names, any case, separated by , | + or spaces) or an
        integer (decimal or 0x...)."""
        text = str(raw).strip()
        if not text:
            return cls.NONE
        try:
            value = int(text, 0)
        except ValueError:
            value = None
        if value is not None:
            if value < 0 or value & ~int(cls.ALL):
                raise ValueError(f"{what}={raw!r}: bits outside the event types (valid bits: {int(cls.ALL):#x})")
            return cls(value)
        out = cls.NONE
        for part in text.replace("|", ",").replace("+", ",").replace(" ", ",").split(","):
            if not part:
                continue
            member = cls.__members__.get(part.upper())
            if member is None:
                names = ", ".join(n.lower() for n in cls.__members__)
                raise ValueError(f"{what}={raw!r}: unknown event type {part!r}, expected names among {names} "
                                 "or an integer bit mask")
            out |= member
        return out

    def with_parents(self) -> EventType:
        """This mask plus every type above its types in the hierarchy."""
        m = EventType(self)
        if m & (EventType.WAIT | EventType.TILE):
            m |= EventType.KERNEL
        if m & (EventType.KERNEL | EventType.COPY):
            m |= EventType.LAUNCH
        if m & EventType.LAUNCH:
            m |= EventType.COLL | EventType.FUSED
        if m & (EventType.COLL | EventType.FUSED):
            m |= EventType.GROUP
        return m


PARENT_TYPES: dict[EventType, EventType] = {
    EventType.GROUP: EventType.NONE,
    EventType.COLL: EventType.GROUP,
    EventType.FUSED: EventType.GROUP,
    EventType.LAUNCH: EventType.COLL | EventType.FUSED,
    EventType.KERNEL: EventType.LAUNCH,
    EventType.COPY: EventType.LAUNCH,
    EventType.WAIT: EventType.KERNEL,
    EventType.TILE: EventType.KERNEL,
}
"""The type(s) an event's parent may have (GROUP, COLL and FUSED may also have no parent)."""


class EventState(enum.Enum):
    """State transitions reported through :meth:`Profiler.record_event_state` (NCCL:
    ``ncclProfilerEventState_t``). Arguments are a dict; times are host-clock nanoseconds."""

    SIGNAL_OBSERVED = "signal_observed"   # WAIT: args {"ts_ns", "src", "chunk"}
    GPU_SPAN = "gpu_span"                 # KERNEL/COPY/WAIT/TILE: args {"start_ns", "end_ns"} measured on the GPU
    END = "end"                           # any event: args {"end_ns"}: the stop time, if not "now"


@dataclass(slots=True)
class EventDescr:
    """What tilescale tells a profiler about an event it starts (NCCL: ``ncclProfilerEventDescr_t``).

    `parent` is the handle that this profiler's ``start_event`` returned for the parent event (None for
    a top-level event). `start_ns` is the start time on the host clock (``time.time_ns``) when the event
    is reported after the fact (device events); None means "now". `track` names where the event
    happened: "host", "stream 0", "copy stream 1", "SM 12". `args` are type-specific attributes.
    """

    type: EventType
    name: str
    parent: Any = None
    rank: int = 0
    track: str = "host"
    start_ns: int | None = None
    args: dict = field(default_factory=dict)


class Profiler:
    """Base class of profilers; tilescale calls these methods. Register an instance or a class with
    :func:`tilescale.profiler.register_profiler`.

    Order of calls, per session: ``init`` once; then for each event ``start_event`` (parents before
    children), any number of ``record_event_state`` on its handle, and ``stop_event``; ``finalize`` once.
    Host events reach the profiler when the session ends or flushes (unless ``live``), device events (KERNEL,
    WAIT, TILE, COPY) when the session ends, after the GPU finished
    (as NCCL reports kernel events late): a handle must stay valid after its ``stop_event`` until
    ``finalize``, because later events may name it as their parent.
    """

    name = "profiler"
    live = False
    """False (default): the session records host events as raw tuples on the hot path and delivers them,
    in order, when it ends (or flushes: ``context.flush()``); each stop then comes as an END state with its
    time, then ``stop_event``. True: each event is delivered as it happens (every op call pays this
    profiler's methods)."""

    def init(self, context: ProfilerContext, rank: int, world_size: int, mask: EventType) -> EventType | None:
        """Start of a session. `mask` is what the session asks for; return the mask this profiler wants
        (or None: the same). The session delivers ``returned & mask`` (plus required parents)."""
        return None

    def start_event(self, descr: EventDescr) -> Any:
        """A new event; return its handle (any object), passed back to stop_event/record_event_state
        and as `parent` of its children."""
        raise NotImplementedError

    def stop_event(self, handle: Any) -> None:
        """The event ended (now, unless an END state gave its time)."""

    def record_event_state(self, handle: Any, state: EventState, args: dict) -> None:
        """A state transition of the event (see :class:`EventState`)."""

    def finalize(self) -> None:
        """End of the session: write results, free resources."""


@dataclass
class ProfilerContext:
    """What a session tells its profiler in ``init`` (NCCL's opaque context, made explicit).

    `out_dir`: where the session's files go (None: keep in memory). `clock`: the GPU -> host clock
    mapping when one was measured (:class:`tilescale.profiler.device_timeline.ClockSync`). `state` is
    the profiler's own slot. `flush()` delivers the events the session recorded so far (set by the session)."""

    name: str = "tilescale"
    out_dir: str | None = None
    clock: Any = None
    state: Any = None
    flush: Any = None
