"""What a profiled op call records: the call and its launches (:class:`OpCall`), and what the GPU did, read
when the session ends (:class:`DeviceRecord`: a kernel's span and tiles; :class:`CopyRecord`: copy-engine chunks)."""
from __future__ import annotations

from .events import EventType
from .raw import COPY, KERNEL, LAUNCH, START, START2, STOP, STOP2, TILES, now


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

    def __init__(self, s, name: str, bit: int, args: dict, launch: str | None = None):   # s: the Session
        # the hot path of every profiled op call: one raw append for the call and its LAUNCH
        self.s = s
        g = s.groups
        parent = g[-1] if g else None
        self.call = c = s.next_id()
        self.copies: list[CopyStream] = []
        self.open_launch = h = None
        if launch is not None and s.bits & LAUNCH:   # the call and its LAUNCH, from now until end()
            h = -c   # the LAUNCH's handle: ids are positive
            s.raw.append((START2, c, bit, name, parent, now(), args, h, launch, now()))
        else:
            s.raw.append((START, c, bit, name, parent, "host", now(), args))
        if launch is not None:   # an op that launches one kernel: its KERNEL event is timed by CUDA events
            st = ev0 = None
            if s.bits & KERNEL:
                st = current_stream()
                ev0 = record_event(st)
            self.open_launch = (h, launch, st, ev0)
        if s.live:
            s.flush()

    # copy-engine chunks (COPY events), stream by stream
    def copies_begin(self, stream, src: int, direction: str = "from") -> None:
        """Before the first chunk enqueued on `stream` (pulled from rank `src`; `direction` "to": pushed to it)."""
        s = self.s
        if not s.bits & COPY:
            return
        self._copies_enqueued()
        launch = s.start(EventType.LAUNCH, f"copies {direction} rank {src}", self.call, src=src)
        cs = CopyStream(stream, src, launch, s.track_of(stream))
        cs.marks.append((record_event(stream), None))
        self.copies.append(cs)

    def copy_done(self, stream, src: int, chunk: int, nbytes: int = 0) -> None:
        """After chunk `chunk` (and its signal) were enqueued on `stream`."""
        if not self.copies:
            return
        cs = next((c for c in reversed(self.copies) if c.stream is stream), None)
        if cs is not None:
            cs.marks.append((record_event(stream), (chunk, nbytes)))

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
            dev = instrumented is not None and s.bits & TILES
            timed = s.bits & KERNEL
            st = None
            if timed or dev:
                st = stream or current_stream()
            ev0 = record_event(st) if timed else None
            if dev:
                import torch

                from .device_timeline import TILE_WORDS

                buf = torch.zeros(tiles * TILE_WORDS, dtype=torch.int64, device=args[0].device).view(torch.uint64)
                instrumented.launch(*args, buf)
            else:
                buf = None
                kernel.launch(*args)
            ev1 = record_event(st) if timed else None
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
                s.pending.append(DeviceRecord(h, name, s.track_of(st), ev0, record_event(st), None))
            self.open_launch = None
        if self.copies:
            for cs in self.copies:
                s.pending.append(CopyRecord(cs))
            self.copies = []
        if h is None:
            s.raw.append((STOP, self.call, now()))
        else:   # the LAUNCH, then the call
            s.raw.append((STOP2, h, now(), self.call, now()))
        self.call = None
        if s.live:
            s.flush()


def current_stream():
    import torch

    return torch.cuda.current_stream()


def record_event(stream):
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

    def report(self, s) -> None:   # s: the Session
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

    def report(self, s) -> None:   # s: the Session
        cs, clock = self.cs, s.clock
        prev = clock.event_to_host(cs.marks[0][0])
        for ev, info in cs.marks[1:]:
            t = clock.event_to_host(ev)
            chunk, nbytes = info
            s.span(EventType.COPY, f"chunk {chunk} from rank {cs.src}", cs.launch, cs.track, prev, max(t, prev),
                   src=cs.src, chunk=chunk, bytes=nbytes)
            prev = max(t, prev)
