"""In-kernel timestamps: the records instrumented kernels write, and the GPU clock mapped onto the host's.

Tile records (uint64 words, ``TILE_WORDS`` per tile of the grid; the block of grid position (bx, by)
after tilelang's swizzle writes slot ``by * tiles_n + bx``; the buffer is zeroed before the launch,
so a slot whose ``t_start`` is 0 was never written):

=========  =========================================================================================
t_start    %globaltimer when the block began the tile, before waiting for its chunk (thread 0)
t_ready    when the awaited chunk's signal was observed (thread 0, right after its wait; tiles of
           this rank's own rows do not wait, so t_ready is t_start plus a few ns)
t_end      after the tile's result was stored (the consumer thread that issues the TMA store, after
           the store has read shared memory)
sm         %smid of the block
src        the rank whose rows the tile reads
chunk      the chunk of those rows the tile waited for
row_tile   the tile's row block (rows row_tile * block_m ...) and column block col_tile
=========  =========================================================================================

GPU clock -> host clock (:class:`ClockSync`, measured by :func:`measure_clock`):

1. host and %globaltimer: ``samples`` times, synchronise, ``h0 = time.time_ns()``, launch a one-thread
   kernel that writes %globaltimer (``g``), synchronise, ``h1 = time.time_ns()``. The stamp was taken
   between h0 and h1, so ``offset = (h0 + h1) / 2 - g`` with an error of at most ``(h1 - h0) / 2``;
   the tightest sample is kept. The session repeats this when it ends, and the offset is interpolated
   linearly between the two (drift of the two clocks).
2. CUDA events and %globaltimer (copy chunks and kernel spans are timed with CUDA events): record
   event A, the same stamp kernel, event B, on one stream. The stamp lies between A and B, so A is at
   ``g - elapsed(A, B) / 2`` (error at most half that); any event E is at ``A + elapsed(A, E)``.

Relative times of device events (tiles, waits, chunks on one GPU) are exact to the timer's resolution;
only their placement against host events carries the (reported) error of step 1.
"""
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

TILE_FIELDS = ("t_start", "t_ready", "t_end", "sm", "src", "chunk", "row_tile", "col_tile")
TILE_WORDS = len(TILE_FIELDS)
I64 = "int64"


class Tile(NamedTuple):
    slot: int
    t_start: int
    t_ready: int
    t_end: int
    sm: int
    src: int
    chunk: int
    row_tile: int
    col_tile: int


def decode_tiles(words: Sequence[int]) -> list[Tile]:
    """The written tile records of a buffer (a flat sequence of ints, TILE_WORDS per slot), by t_start."""
    n = len(words)
    if n % TILE_WORDS:
        raise ValueError(f"words: got {n} words, expected a multiple of TILE_WORDS = {TILE_WORDS} "
                         f"(one record of {', '.join(TILE_FIELDS)} per tile)")
    out = []
    for slot in range(n // TILE_WORDS):
        w = words[slot * TILE_WORDS:(slot + 1) * TILE_WORDS]
        if int(w[0]) == 0:
            continue
        out.append(Tile(slot, *(int(v) & 0xFFFFFFFFFFFFFFFF for v in w)))
    out.sort(key=lambda t: (t.t_start, t.slot))
    return out


def check_tiles(tiles: Sequence[Tile], expected: int | None = None) -> list[str]:
    """Problems of decoded records: missing tiles, times out of order. Empty when all is well."""
    problems = []
    if expected is not None and len(tiles) != expected:
        problems.append(f"{expected - len(tiles)} of {expected} tiles wrote no record")
    for t in tiles:
        if not t.t_start <= t.t_ready <= t.t_end:
            problems.append(f"slot {t.slot}: times out of order (start {t.t_start}, ready {t.t_ready}, end {t.t_end})")
    return problems


def timer_resolution_ns(tiles: Sequence[Tile]) -> int | None:
    """Smallest positive difference between any two stamps: an upper bound of the timer's step."""
    stamps = sorted({v for t in tiles for v in (t.t_start, t.t_ready, t.t_end)})
    diffs = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return min(diffs) if diffs else None


def report_tiles(s, kernel, tiles: Sequence[Tile], clock: "ClockSync") -> None:
    """Report decoded tiles to session `s` as children of the KERNEL handle `kernel`: per tile that read
    another rank's rows a WAIT (block start -> signal observed, with a SIGNAL_OBSERVED state), and a
    TILE (signal observed -> result stored); on track "SM <n>"."""
    from .events import EventState, EventType

    for t in tiles:
        track = f"SM {t.sm}"
        ready = clock.to_host(t.t_ready)
        if t.src != s.rank:
            h = s.start(EventType.WAIT, f"wait chunk {t.chunk} of rank {t.src}", kernel, track,
                        clock.to_host(t.t_start), src=t.src, chunk=t.chunk, row_tile=t.row_tile,
                        col_tile=t.col_tile)
            s.state(h, EventState.SIGNAL_OBSERVED, ts_ns=ready, src=t.src, chunk=t.chunk)
            s.stop(h, ready)
        s.span(EventType.TILE, f"tile {t.row_tile},{t.col_tile}", kernel, track, ready,
               max(ready, clock.to_host(t.t_end)), row_tile=t.row_tile, col_tile=t.col_tile, src=t.src,
               chunk=t.chunk, sm=t.sm)


# ----------------------------------------------------------------------------------- clocks
def best_point(samples: Sequence[tuple[int, int, int]]) -> tuple[int, int, int]:
    """(gpu_ns, offset_ns, error_ns) from (host_before, gpu, host_after) samples: the tightest one."""
    if not samples:
        raise ValueError("samples: got none, expected (host_before_ns, gpu_ns, host_after_ns) tuples")
    h0, g, h1 = min(samples, key=lambda s: s[2] - s[0])
    if h1 < h0:
        raise ValueError(f"samples: host_after {h1} < host_before {h0}")
    return g, (h0 + h1) // 2 - g, (h1 - h0 + 1) // 2


@dataclass
class ClockSync:
    """GPU %globaltimer -> host ``time.time_ns``; CUDA events -> %globaltimer (see the module doc)."""

    points: list = field(default_factory=list)     # [(gpu_ns, offset_ns, error_ns)], by gpu_ns
    anchor_event: Any = None                       # a CUDA event whose %globaltimer time is known
    anchor_gpu_ns: int = 0
    anchor_error_ns: int = 0
    sampler: Callable[[], tuple[int, int, int]] | None = None

    def offset_at(self, g: int) -> float:
        if not self.points:
            raise ValueError("ClockSync has no (gpu, host) point: measure it first")
        (g0, o0, _), (g1, o1, _) = self.points[0], self.points[-1]
        if g1 == g0:
            return float(o0)
        return o0 + (o1 - o0) * (g - g0) / (g1 - g0)

    def to_host(self, g: int) -> int:
        """Host nanoseconds of GPU timestamp `g`."""
        return g + int(round(self.offset_at(g)))   # not round(g + offset): a float of ~1.8e18 steps by 256 ns

    def event_to_host(self, ev) -> int:
        """Host nanoseconds of a completed CUDA event (recorded on the device of the anchor)."""
        if self.anchor_event is None:
            raise ValueError("ClockSync has no anchor event: CUDA events cannot be placed")
        g = self.anchor_gpu_ns + int(round(self.anchor_event.elapsed_time(ev) * 1e6))
        return self.to_host(g)

    def resample(self) -> None:
        """Measure one more point (at the end of a session): drift is then interpolated."""
        if self.sampler is not None:
            self.points.append(self.sampler())
            self.points.sort()

    def describe(self) -> dict:
        d = {"method": "bracketed %globaltimer stamp kernel, time.time_ns",
             "offset_ns": self.points[0][1] if self.points else None,
             "error_ns": max((p[2] for p in self.points), default=None),
             "event_anchor_error_ns": self.anchor_error_ns if self.anchor_event is not None else None}
        if len(self.points) > 1 and self.points[-1][0] != self.points[0][0]:
            (g0, o0, _), (g1, o1, _) = self.points[0], self.points[-1]
            d["drift_ns_per_s"] = (o1 - o0) / ((g1 - g0) / 1e9)
        return d


@functools.lru_cache(maxsize=1)
def stamp_kernel_jit():
    """The jit function of the one-thread kernel that writes %globaltimer into out[0] (int64; not
    distributed: tilelang's own backend)."""
    import tilescale
    import tilescale.language as T

    @tilescale.jit
    def clock_stamp():
        @T.prim_func
        def clock_stamp_kernel(out: T.Tensor((1,), I64)):
            with T.Kernel(1, threads=32):
                if T.get_thread_binding() == 0:
                    out[0] = T.cast(T.timestamp(), I64)   # ns since an epoch: < 2**63

        return clock_stamp_kernel

    return clock_stamp


def measure_clock(samples: int = 16) -> ClockSync:
    """Measure the GPU -> host mapping on the current device (synchronises the device)."""
    import torch

    k = stamp_kernel_jit()()
    buf = torch.zeros(1, dtype=torch.int64, device="cuda")
    k(buf)
    torch.cuda.synchronize()

    def sample() -> tuple[int, int, int]:
        rows = []
        for _ in range(samples):
            torch.cuda.synchronize()
            h0 = time.time_ns()
            k(buf)
            torch.cuda.synchronize()
            h1 = time.time_ns()
            rows.append((h0, int(buf.item()), h1))
        return best_point(rows)

    clock = ClockSync([sample()], sampler=sample)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    k(buf)
    b.record()
    b.synchronize()
    half = int(a.elapsed_time(b) * 1e6) // 2
    clock.anchor_event, clock.anchor_gpu_ns, clock.anchor_error_ns = a, int(buf.item()) - half, half
    return clock
