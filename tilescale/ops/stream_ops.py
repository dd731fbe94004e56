"""Programs of stream operations issued by one call of the runtime shim (``ts_stream_ops`` in
``tilescale/csrc/ts_runtime.cu``): an op's host steps that enqueue many small things (stream writes and waits
on flags, copies, NVSHMEM gets and signals, events) cost one ctypes call per program instead of one Python
call per operation. A program is built once (the addresses of an op's buffers and flags do not change); a call
changes only what changes per call (the current stream: ``streams[0]``; an argument's address: one op's field).

The ops are issued in array order, each on its stream (an index into the program's streams), exactly as the
same Python calls would be: the order of a protocol is the order of its program.

Every stream wait is bounded: a ``WAIT_GEQ`` carries a label (op, flag, peer), and a sealed program gives each wait
a slot of :mod:`tilescale.runtime.stream_waits` (in the op's `n` field, which a wait does not use otherwise; none when
``TILESCALE_WAIT_TIMEOUT_S`` is 0), where the shim counts the calls it issues and the GPU the calls that passed the
wait. The runtime's watchdog names a wait that did not pass within the bound and stops the job.

A program may carry marks between its ops (:meth:`Program.mark`): what a profiled call records there. Issued through
:func:`in_pieces`, a program runs as the same ops in the same order, in one shim call per stretch between marks, with
each mark handed to the caller in between (an op's profiled call records CUDA events on its copy streams there)."""
import ctypes

from ..runtime import stream_waits

WRITE, WAIT_GEQ, COPY, GET, SIGNAL_ADD, EVENT_RECORD, EVENT_WAIT, ZERO = range(1, 9)
KIND_NAMES = {WRITE: "stream write", WAIT_GEQ: "stream wait (>=)", COPY: "copy", GET: "NVSHMEM get",
              SIGNAL_ADD: "NVSHMEM signal add", EVENT_RECORD: "event record", EVENT_WAIT: "event wait",
              ZERO: "zero fill"}


class StreamOp(ctypes.Structure):
    """One operation (``ts_stream_op`` in the shim, 40 bytes): `a` address / destination / event, `b` value /
    source, `n` bytes, `kind`, `stream` (index into the program's streams), `pe` (NVSHMEM's PE)."""

    _fields_ = [("a", ctypes.c_ulonglong), ("b", ctypes.c_ulonglong), ("n", ctypes.c_ulonglong),
                ("kind", ctypes.c_int), ("stream", ctypes.c_int), ("pe", ctypes.c_int), ("pad", ctypes.c_int)]



class Program:
    """A list of ops to issue with one shim call: ``add(...)`` while building (returns the op's index), then
    ``seal()``; ``run(fn, main)`` issues them with `main` (a raw stream handle) as stream 0. `streams`: the raw
    handles of streams 1, 2, ... (the op's own streams). After ``seal``, ``array[i]`` is op i (a
    :class:`StreamOp`: a field set there is what the next run issues), ``watches`` maps each wait's label to
    its slot (0: not watched), and ``marks`` maps a position (the number of ops before it) to the marks made
    there."""

    def __init__(self, streams=()):
        self.ops: list[tuple] = []
        self.labels: dict[int, tuple] = {}      # op index -> label (the waits')
        self.streams = (ctypes.c_void_p * (1 + len(streams)))(0, *streams)
        self.array = None
        self.n = 0
        self.failed = ctypes.c_int(-1)
        self.watches: dict[tuple, int] = {}
        self.table = None
        self.marks: dict[int, list[tuple]] = {}  # position -> [what]

    def add(self, kind: int, a: int, b: int = 0, n: int = 0, *, stream: int = 0, pe: int = 0,
            label: tuple | None = None) -> int:
        """Append an op; a ``WAIT_GEQ`` needs its `label` (op, flag, peer), which no other kind takes."""
        if kind not in KIND_NAMES:
            raise ValueError(f"stream op kind {kind}: expected one of {sorted(KIND_NAMES)}")
        if not 0 <= stream < len(self.streams):
            raise ValueError(f"stream index {stream}: this program has {len(self.streams)} streams")
        if (kind == WAIT_GEQ) != (label is not None):
            raise ValueError(f"{KIND_NAMES[kind]}: label {label!r}: a stream wait needs its label (op, flag, peer), "
                             "which names it when it does not end within TILESCALE_WAIT_TIMEOUT_S; other kinds take "
                             "none")
        if label is not None:
            self.labels[len(self.ops)] = stream_waits.check_label(label)
        self.ops.append((a, b, n, kind, stream, pe, 0))
        return len(self.ops) - 1

    def mark(self, *what) -> None:
        """Mark this point of the program, after the ops added so far, with `what` (:func:`in_pieces` hands it
        on; a program run in one shim call issues nothing for it)."""
        self.marks.setdefault(len(self.ops), []).append(what)

    def seal(self) -> "Program":
        """Pack the ops; give each wait its slot, bounded by ``TILESCALE_WAIT_TIMEOUT_S`` as it is now."""
        from ..env import settings

        bound = settings.wait_timeout_s
        at = sorted(self.labels)
        if at and bound > 0:
            self.table = stream_waits.Table(
                [stream_waits.Wait(*self.labels[i], self.ops[i][0], self.ops[i][1]) for i in at], bound)
            for j, i in enumerate(at):
                a, b, _, *rest = self.ops[i]
                self.ops[i] = (a, b, self.table.address(j), *rest)
        self.watches = {self.labels[i]: self.ops[i][2] for i in at}
        self.array = (StreamOp * len(self.ops))(*self.ops)
        self.n = len(self.ops)
        # the shim's arguments after the streams: the addresses of the ops and of the failed op's index
        self.args = (ctypes.addressof(self.array), self.n, ctypes.addressof(self.failed))
        self.streams_at = ctypes.addressof(self.streams)
        return self

    def __len__(self) -> int:
        return len(self.ops)

    def run(self, fn, main: int, what: str = "stream operations") -> None:
        """Issue the program with `main` as stream 0 (`fn`: the shim's ``ts_stream_ops``); RuntimeError naming the
        failed op (the ops before it were issued)."""
        if self.n:
            self.streams[0] = main
            rc = fn(self.streams_at, *self.args)
            if rc:
                raise self.error(rc, what)

    def error(self, rc: int, what: str) -> RuntimeError:
        i = self.failed.value
        op = self.array[i] if 0 <= i < self.n else None
        desc = "?" if op is None else describe(op.kind, f"stream {op.stream}", op.a, op.b, op.n, op.pe,
                                               self.labels.get(i))
        return RuntimeError(f"{what}: op {i} of {self.n} failed: {desc}: {cause(rc)}")


def in_pieces(fn, programs, on_mark):
    """A stand-in for the shim's ``ts_stream_ops`` (`fn`) that :meth:`Program.run` of any of `programs` takes: it
    issues the program's ops through `fn` in their order, one shim call per stretch between the program's marks,
    and calls ``on_mark(*what)`` for each mark where it stands. A failed op is reported as by one call (its index
    in the whole program)."""
    by_array = {p.args[0]: p for p in programs}
    size = ctypes.sizeof(StreamOp)

    def run(streams_at, ops_at, n, failed_at):
        marks, done = by_array[ops_at].marks, 0
        for at in sorted({*marks, n}):
            if at > done:
                rc = fn(streams_at, ops_at + done * size, at - done, failed_at)
                if rc:
                    ctypes.c_int.from_address(failed_at).value += done
                    return rc
                done = at
            for what in marks.get(at, ()):
                on_mark(*what)
        return 0

    return run


def wait_label(op: str, flag: str, q: int) -> tuple:
    """The label of a stream wait of `op` for its flag `flag` of rank `q`, which rank q sets: what the record of a
    wait that did not end within TILESCALE_WAIT_TIMEOUT_S names (tilescale/runtime/stream_waits.py)."""
    return (op, f"{flag}[{q}]", q)


def describe(kind: int, stream: str, a: int, b: int = 0, n: int = 0, pe: int = 0, label: tuple | None = None) -> str:
    """An op as its error names it (`label`: a wait's)."""
    what = KIND_NAMES.get(kind, kind)
    if label is not None:
        what = f"{what} for {label[0]}'s flag {label[1]} (set by rank {label[2]})"
    return f"{what} on {stream} (a=0x{a:x}, b=0x{b:x}, n={n}, pe={pe})"


def cause(rc: int) -> str:
    """What the shim's status `rc` (a CUresult, or the shim's own -1 / -2) means."""
    return {-1: "a CUDA driver entry point is missing", -2: "unknown op kind"}.get(rc, f"CUresult {rc}")
