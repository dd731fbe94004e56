"""Programs of stream operations issued by one call of the runtime shim (``ts_stream_ops`` in
``tilescale/csrc/ts_runtime.cu``): an op's host steps that enqueue many small things (stream writes and waits
on flags, copies, NVSHMEM gets and signals, events) cost one ctypes call per program instead of one Python
call per operation. A program is built once (the addresses of an op's buffers and flags do not change); a call
changes only what changes per call (the current stream: ``streams[0]``; an argument's address: one op's field).

The ops are issued in array order, each on its stream (an index into the program's streams), exactly as the
same Python calls would be: the order of a protocol is the order of its program."""
import ctypes

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
    :class:`StreamOp`: a field set there is what the next run issues)."""

    def __init__(self, streams=()):
        self.ops: list[tuple] = []
        self.streams = (ctypes.c_void_p * (1 + len(streams)))(0, *streams)
        self.array = None
        self.n = 0
        self.failed = ctypes.c_int(-1)

    def add(self, kind: int, a: int, b: int = 0, n: int = 0, *, stream: int = 0, pe: int = 0) -> int:
        if kind not in KIND_NAMES:
            raise ValueError(f"stream op kind {kind}: expected one of {sorted(KIND_NAMES)}")
        if not 0 <= stream < len(self.streams):
            raise ValueError(f"stream index {stream}: this program has {len(self.streams)} streams")
        self.ops.append((a, b, n, kind, stream, pe, 0))
        return len(self.ops) - 1

    def seal(self) -> "Program":
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
        desc = "?" if op is None else (f"{KIND_NAMES.get(op.kind, op.kind)} on stream {op.stream} "
                                       f"(a=0x{op.a:x}, b=0x{op.b:x}, n={op.n}, pe={op.pe})")
        cause = {-1: "a CUDA driver entry point is missing", -2: "unknown op kind"}.get(rc, f"CUresult {rc}")
        return RuntimeError(f"{what}: op {i} of {self.n} failed: {desc}: {cause}")
