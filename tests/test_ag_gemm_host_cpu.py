"""AG+GEMM's host path on CPU (issue 15): the programs of stream operations (tilescale/ops/stream_ops.py, the
shim's ``ts_stream_ops``) issue each protocol's steps in their order; a profiled call issues the same operations,
in pieces, with the profiler's records of the copies between them where the old step-by-step path made them; the
packing of the ops matches the shim's struct; the GEMM launches through its C entry point when the wrapper's
signature is ``A, B, C, arrived, stream``; the call key of ``Op.begin`` sees a changed tensor. No GPU: fake streams
and events, CPU tensors, and a recording shim."""
import contextlib
import ctypes
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from tilescale.ops import allgather_gemm as agm  # noqa: E402
from tilescale.ops import base, checks  # noqa: E402
from tilescale.ops import stream_ops as so  # noqa: E402
from tilescale.profiler import session  # noqa: E402
from tilescale.runtime.team import Team  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MAIN, PULLED0, JOIN0, START, COPIED = 0x5000, 0x7000, 0x7100, 0x7200, 0x7300


# ------------------------------------------------------------------------------------------ packing
def test_stream_op_matches_the_shim_struct():
    assert ctypes.sizeof(so.StreamOp) == 40
    assert [(n, getattr(so.StreamOp, n).offset) for n, _ in so.StreamOp._fields_] == [
        ("a", 0), ("b", 8), ("n", 16), ("kind", 24), ("stream", 28), ("pe", 32), ("pad", 36)]
    src = (REPO / "tilescale" / "csrc" / "ts_runtime.cu").read_text()
    assert "unsigned long long a, b, n;\n  int kind, stream, pe, pad;" in src
    enum = dict(re.findall(r"TS_OP_(\w+) = (\d+)", src))
    assert {k: int(v) for k, v in enum.items()} == {
        "WRITE": so.WRITE, "WAIT_GEQ": so.WAIT_GEQ, "COPY": so.COPY, "GET": so.GET, "SIGNAL_ADD": so.SIGNAL_ADD,
        "EVENT_RECORD": so.EVENT_RECORD, "EVENT_WAIT": so.EVENT_WAIT, "ZERO": so.ZERO}
    assert "int ts_stream_ops(void* const* streams, const ts_stream_op* ops, int n, int* failed)" in src
    from tilescale import runtime
    from tilescale.runtime import stream_waits

    assert runtime._SIGS["ts_stream_ops"] == ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p],
                                              ctypes.c_int)
    # every stream wait is watched through its slot (tilescale/runtime/stream_waits.py): a program's in its `n`, a wait
    # issued alone in its last argument
    assert "int ts_stream_wait_geq_u64(void* stream, void* addr, unsigned long long value, void* watch)" in src
    assert runtime._SIGS["ts_stream_wait_geq_u64"] == ([ctypes.c_void_p] * 2 + [ctypes.c_ulonglong, ctypes.c_void_p],
                                                       ctypes.c_int)
    assert "if (rc == 0 && o.n) rc = watch_wait(d, s, (ts_watch*)o.n);" in src
    assert 'static_assert(sizeof(ts_watch) == 32' in src and stream_waits.WORDS == 4


def _decode(streams_at, ops_at, n):
    ops = ctypes.cast(ops_at, ctypes.POINTER(so.StreamOp))
    return [(ops[i].kind, ops[i].stream, ops[i].a, ops[i].b, ops[i].n, ops[i].pe) for i in range(n)]


def test_program_packs_its_ops_and_runs_them_in_one_call():
    p = so.Program([0x61, 0x62])
    assert p.add(so.WAIT_GEQ, 0x1000, 1, label=("Op", "ready[1]", 1)) == 0
    p.add(so.COPY, 0x2000, 0x3000, 64, stream=2)
    p.add(so.SIGNAL_ADD, 0x4000, 1, stream=1, pe=5)
    with pytest.raises(ValueError, match="stream index 3"):
        p.add(so.WRITE, 0, stream=3)
    with pytest.raises(ValueError, match="kind 9"):
        p.add(9, 0)
    p.seal()
    watch = p.watches[("Op", "ready[1]", 1)]      # the wait's slot (tilescale/runtime/stream_waits.py), in its `n`
    assert watch and p.array[0].n == watch
    calls = []

    def shim(streams_at, ops_at, n, failed_at):
        streams = (ctypes.c_void_p * 3).from_address(streams_at)
        calls.append(([s or 0 for s in streams], _decode(streams_at, ops_at, n)))
        return 0

    p.run(shim, 0x77)
    assert calls == [([0x77, 0x61, 0x62], [(so.WAIT_GEQ, 0, 0x1000, 1, watch, 0), (so.COPY, 2, 0x2000, 0x3000, 64, 0),
                                           (so.SIGNAL_ADD, 1, 0x4000, 1, 0, 5)])]
    p.array[1].b = 0x3100                       # a per-call field: the next run issues it
    p.run(shim, 0)                              # the legacy default stream is a stream like any other
    assert calls[1][0][0] == 0 and calls[1][1][1][3] == 0x3100

    def failing(streams_at, ops_at, n, failed_at):
        ctypes.c_int.from_address(failed_at).value = 1
        return 700
    with pytest.raises(RuntimeError, match=r"AGGemm: op 1 of 3 failed: copy on stream 2 \(a=0x2000, b=0x3100, "
                                           r"n=64, pe=0\): CUresult 700"):
        p.run(failing, 0x77, "AGGemm")
    empty = so.Program().seal()
    empty.run(failing, 1)                       # nothing to issue: no call


def test_a_program_in_pieces_issues_its_ops_with_its_marks_between():
    """in_pieces: the same ops in the same order, one shim call per stretch between marks, each mark handed on where
    it stands; a failed op is named by its index in the whole program. A program run whole issues no mark."""
    p = so.Program([0x61])
    p.mark("start")
    p.add(so.WRITE, 0x10, 1)
    p.add(so.WRITE, 0x18, 1, stream=1)
    p.mark("two", 7)
    p.mark("and", 8)
    p.add(so.ZERO, 0x20, 0, 64)
    p.seal()
    log = []

    def shim(streams_at, ops_at, n, failed_at):
        ops = _decode(streams_at, ops_at, n)
        log.append([o[2] for o in ops])
        if any(o[0] == so.ZERO and o[3] for o in ops):   # (a zero fill of value b: refused)
            ctypes.c_int.from_address(failed_at).value = 0
            return 1
        return 0

    p.run(so.in_pieces(shim, [p], lambda *what: log.append(what)), 0x77)
    assert log == [("start",), [0x10, 0x18], ("two", 7), ("and", 8), [0x20]]
    log.clear()
    p.run(shim, 0x77)
    assert log == [[0x10, 0x18, 0x20]]
    p.array[2].b = 1
    with pytest.raises(RuntimeError, match=r"^t: op 2 of 3 failed: zero fill on stream 0 \(a=0x20, b=0x1, n=64"):
        p.run(so.in_pieces(shim, [p], lambda *what: None), 0x77, "t")


def test_the_runtime_shim_builds_with_ts_stream_ops():
    """The shim (nvcc, against the installed NVSHMEM) exports ts_stream_ops; loaded on this GPU-less machine, an
    op of an unknown kind is refused with its index (the ops before it were issued: none here)."""
    pytest.importorskip("tilescale.discovery")
    from tilescale import discovery, runtime

    try:
        nv = discovery.find_nvshmem()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no NVSHMEM: {e}")
    so_path = runtime._shim_path(nv)
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so_path)], stdout=subprocess.PIPE, text=True).stdout
    assert re.search(r"\bT ts_stream_ops\b", syms), syms
    code = """
import ctypes
from tilescale import runtime, discovery
from tilescale.ops import stream_ops as so
lib = runtime.load_shim(discovery.find_nvshmem())
p = so.Program([0]); p.add(so.ZERO, 0, 0, 0); p.seal()
p.array[0].kind = 42
try:
    p.run(lib.ts_stream_ops, 0, "t")
except RuntimeError as e:
    print("ERR", e)
from tilescale.runtime import stream_waits
t = stream_waits.Table([stream_waits.Wait("Op", "f[1]", 1, 0, 1)], 5)
print("WAIT", lib.ts_stream_wait_geq_u64(None, None, 1, t.address(0)), list(t.words))
"""
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120, cwd=REPO)
    if "ERR" not in r.stdout and ("libcuda" in r.stdout or "OSError" in r.stdout):
        pytest.skip(f"the shim cannot be loaded here: {r.stdout[-300:]}")
    assert "ERR t: op 0 of 1 failed: 42 on stream 0" in r.stdout and "unknown op kind" in r.stdout, r.stdout
    if "WAIT -1 " in r.stdout:   # no CUDA driver here: the wait is not queued, so its call is not counted
        assert "WAIT -1 [0, 0, 0, 5000000000]" in r.stdout, r.stdout


# ------------------------------------------------------------------------------ the fast path vs the steps
class Log:
    def __init__(self):
        self.ops, self.current, self.events = [], MAIN, {}

    def event(self, handle):
        names = {START: "start", COPIED: "copied"}
        if PULLED0 <= handle < PULLED0 + 0x100:
            return "pulled"
        return names.get(handle) or ("join" if JOIN0 <= handle < JOIN0 + 0x100 else handle)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams and events as recorders (no GPU), CPU copies and zero fills recorded as the stream
    operations they would be; profiling off."""
    log = Log()

    class Event:
        def __init__(self, *a, name=None, **k):
            self.fixed = self.name = name    # an op's event: its name; else named by where it is recorded

        def record(self, stream=None):
            s = stream.cuda_stream if stream is not None else log.current
            self.name = self.fixed or "join"
            log.ops.append((so.EVENT_RECORD, s, self.name))

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

        def wait_event(self, ev):
            log.ops.append((so.EVENT_WAIT, self.cuda_stream, ev.name))

        def wait_stream(self, s):
            ev = Event()
            ev.record(s)
            self.wait_event(ev)

        def synchronize(self):
            pass

    @contextlib.contextmanager
    def stream_ctx(s):
        prev, log.current = log.current, s.cuda_stream
        yield
        log.current = prev

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name == "copy_":
                dst, src = args[0], args[1]
                log.ops.append((so.COPY, log.current, dst.data_ptr(), src.data_ptr(), dst.nbytes, 0))
            elif name == "zero_":
                log.ops.append((so.ZERO, log.current, args[0].data_ptr(), 0, args[0].nbytes, 0))
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(MAIN))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(base, "_capturing", lambda: False)
    monkeypatch.setattr(session, "current", None)
    log.Stream, log.Mode, log.Event = Stream, Mode, Event
    return log


def _shim(log):
    def program(streams_at, ops_at, n, failed_at):
        streams = (ctypes.c_void_p * 16).from_address(streams_at)   # (only the program's own are read)
        for kind, s, a, b, nb, pe in _decode(streams_at, ops_at, n):
            h = streams[s] or 0
            if kind in (so.EVENT_RECORD, so.EVENT_WAIT):
                log.ops.append((kind, h, log.event(a)))
            else:
                log.ops.append((kind, h, a, b, nb, pe))
        return 0

    return SimpleNamespace(ts_stream_ops=program)


def _ag_gemm(log, W, rank, near, *, direct=True, gpu=(), protocol="pull", team=None):
    """An AGGemm without GPU pieces: CPU buffers, fake streams, flags at made-up addresses; peers in `near` are on
    this node (a view of their A_full), the others are reached with NVSHMEM; peers in `gpu` share this rank's GPU.
    `team`: the op's group (tilescale.runtime.team; None: the world), W and rank being its size and this rank's."""
    op = object.__new__(agm.AGGemm)
    op.device, op.world_size, op.rank, op.team = torch.device("cpu"), W, rank, team
    op._check = checks.CallCheck("AGGemm")
    op._agreed = op._check.agreed
    op._order = checks.StreamOrder(op.device)
    op._order.handle = MAIN
    op._stream = lambda: MAIN
    op.captured = False
    op.rt = SimpleNamespace(shim=_shim(log))
    rows, K, N, chunks = 8, 16, 16, 2
    op.M, op.N, op.K, op.dtype, op.rows, op.chunks = W * rows, N, K, torch.float16, rows, chunks
    op.m, op.slots, op.block_m = rows, chunks, 4      # a call's rows (the bound), 2 chunks of one row tile each
    op.a_full = torch.zeros(W * rows, K, dtype=torch.float16)
    op.arrived = torch.zeros(W * chunks, dtype=torch.int64)
    op.protocol, op.fused = protocol, True
    # pull: a copy stream per peer, the local stream; push: one copy stream
    op.streams = [log.Stream(0x6000 + j) for j in range(1 if protocol == "push" else W)]
    op._peers = [torch.zeros(W * rows, K, dtype=torch.float16) if p in near else None for p in range(W)]
    op._pull_first = [p in gpu and p != rank for p in range(W)]
    op._flag_at = {"ready": [0x100000 + 0x1000 * p + 8 * rank for p in range(W)],
                   "freed": [0x200000 + 0x1000 * p + 8 * rank for p in range(W)]}
    op._ready_here = [0x300000 + 8 * q for q in range(W)]
    op._freed_here = [0x400000 + 8 * q for q in range(W)]
    op._arrived_at = [op.arrived.data_ptr() + 8 * i for i in range(W * chunks)]
    op._arrived_on = [0x500000 + 0x1000 * p + 8 * rank * chunks for p in range(W)]
    op._slot = op.a_full[rank * rows:(rank + 1) * rows]
    op.kernels_prof, op.tiles, op._last_a = None, [1, 1], None
    # the kernels' arguments (N, K, W, chunks, dtype, block_m 4, block_n 16, ..., own, sms 0: plain grids): a
    # profiled call's blocks per GEMM are its grid's for the call's rows (kernel_plan)
    op._job_args = [(N, K, W, chunks, "float16", 4, 16, 16, 3, 128, 10, False, own, 0) for own in (True, False)]
    op._ws, op._sizes, op._tail_ptrs = [(), ()], [(), ()], [(), ()]   # plain grids (no split tail)
    op.kernel = SimpleNamespace(launch=lambda *t: log.ops.append(("GEMM", log.current, *[x.data_ptr() for x in t])))
    op.kernel_own = op.kernel

    def entry(n):   # (n pointers, the rows of the call per rank (the peers' GEMM: after the slots' rows), stream)
        def call(*args):
            assert args[n:-1] == ((op.m,) if n == 3 else (op.rows, op.m)), args
            log.ops.append(("GEMM", args[-1], *args[:n]))
            return 0
        return call
    op._direct_own, op._direct = ((entry(3), lambda: b""), (entry(4), lambda: b"")) if direct else (None, None)
    op._start, op._copied = (log.Event(name=n) for n in ("start", "copied"))
    op._joins = [log.Event(name="join") for _ in op.streams]
    op._pulled = [log.Event(name="pulled") for _ in range(W - 2)]
    op._start.cuda_event, op._joins[0].cuda_event = START, JOIN0
    op._slot_stale, op._stream_ops = False, op.rt.shim.ts_stream_ops
    if W > 1 and protocol == "push":
        op._plan_push()
    elif W > 1:
        op._plan(a_full=op.a_full.data_ptr(), row_bytes=K * 2,
                 peer_at=[None if t is None else t.data_ptr() for t in op._peers],
                 streams=[s.cuda_stream for s in op.streams], events=dict(start=START, copied=COPIED),
                 joins=[JOIN0 + j for j in range(len(op.streams))], pulled=[PULLED0 + j for j in range(W - 2)],
                 arrived=op.arrived.data_ptr(), arrived_bytes=op.arrived.nbytes)
    return op


def _args(op, contiguous=True, rows=None):
    rows = op.rows if rows is None else rows
    a = torch.ones(rows, op.K, dtype=torch.float16) if contiguous else \
        torch.ones(op.K, rows, dtype=torch.float16).t()
    return a, torch.ones(op.K, op.N, dtype=torch.float16), torch.empty(op.world_size * rows, op.N, dtype=torch.float16)


@pytest.mark.parametrize("W,rank,near", [(3, 1, {0, 1, 2}), (4, 2, {2, 3})])
@pytest.mark.parametrize("contiguous", [True, False])
def test_calls_of_fewer_rows_copy_and_pull_only_their_rows(fake_cuda, W, rank, near, contiguous):
    """The rows per rank are a call's (up to the op's bound, 8 here: 2 row tiles of 4, in 2 chunks): rank q's slot
    stays at rows q x 8 of A_full and a call of m rows copies my m rows there and pulls each peer's m rows, chunk by
    chunk (whole row tiles, the last chunk shorter or empty; a chunk past the call's rows a copy of no bytes, its
    flag set all the same), the same on the fast path as on the profiled one, whose records give each chunk's bytes
    of this call and each GEMM's blocks of this call's grid; both GEMMs get m (and the slots' 8 rows) at run time.
    Calls of other rows after it (fewer, the bound again) set the sizes anew."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, near)
    rb = op.K * 2
    for m, chunks in ((5, [(0, 4), (4, 1)]), (3, [(0, 3), (3, 0)]), (8, [(0, 4), (4, 4)]), (1, [(0, 1), (1, 0)])):
        a, b, c = _args(op, contiguous, m)
        fast, steps, rec = _fast_then_steps(log, op, a, b, c)
        assert fast == steps and op.m == m
        assert op.chunk_rows(m) == chunks
        assert [r[-1] for r in rec.records if r[1] == "copy_done"] == [n * rb for _ in range(W - 1) for _, n in chunks]
        tiles = -(-m // 4)   # row tiles of a rank's m rows (block_m 4), one column tile
        assert rec.tiles == [tiles, tiles * (W - 1)]
        pulls = sorted(o[2:5] for o in fast if o[0] in (so.COPY, so.GET) and o[1] != MAIN
                       and o[1] != op.streams[-1].cuda_stream)
        want = sorted((op.a_full.data_ptr() + (src * 8 + lo) * rb, (op._peers[src].data_ptr() if src in near else
                       op.a_full.data_ptr()) + (src * 8 + lo) * rb, n * rb)
                      for src in range(W) if src != rank for lo, n in chunks)
        assert pulls == want, (m, pulls, want)
        if contiguous:
            [copy] = [o for o in fast if o[0] == so.COPY and o[1] == op.streams[-1].cuda_stream]
            assert copy[2:5] == (op.a_full.data_ptr() + rank * 8 * rb, a.data_ptr(), m * rb)


class Recorder:
    """A profiled call's record (tilescale.profiler.records.OpCall) that notes its copy records with the number of
    stream operations issued before each, and launches the GEMMs as the kernels' own ``launch`` does."""

    def __init__(self, log):
        self.log, self.records, self.ends, self.tiles = log, [], 0, []

    def copies_begin(self, stream, src, direction="from"):
        self.records.append((len(self.log.ops), "copies_begin", stream.cuda_stream, src, direction))

    def copy_done(self, stream, src, chunk, nbytes=0):
        self.records.append((len(self.log.ops), "copy_done", stream.cuda_stream, src, chunk, nbytes))

    def launcher(self, kernel, *, instrumented=None, tiles=0, end=False, stream=None):
        self.tiles.append(tiles)

        def launch(*args):
            kernel.launch(*args)
            self.ends += end
        return launch


@contextlib.contextmanager
def profiled(log):
    """A profiler session for AGGemm's calls: each takes its profiled path, recorded by one :class:`Recorder`."""
    rec = Recorder(log)
    with mock.patch.object(session, "current", object()), mock.patch.object(session, "call", lambda *a, **k: rec):
        yield rec


def _fast_then_steps(log, op, a, b, c):
    """(fast, steps, record): what the fast path issues for ``op(a, b, out=c)`` (the first call of these rows: it sets
    the sizes), then what a profiled call of the same issues, and that call's profiler record."""
    with log.Mode():
        assert op(a, b, out=c) is c
    fast, log.ops = log.ops, []
    with log.Mode(), profiled(log) as rec:
        assert op(a, b, out=c) is c
    steps, log.ops = log.ops, []
    return fast, steps, rec


def _both_paths(log, op, a, b, c):
    """(profiled, fast): what a profiled call issues for ``op(a, b, out=c)``, then what the fast path issues for the
    same call; each returns `c`, and the profiled call's record ends once (with its last GEMM)."""
    with log.Mode(), profiled(log) as rec:
        assert op(a, b, out=c) is c
    assert rec.ends == 1
    steps, log.ops = log.ops, []
    with log.Mode():
        assert op(a, b, out=c) is c
    return steps, log.ops


@pytest.mark.parametrize("W,rank,near", [(3, 1, {0, 1, 2}), (4, 2, {2, 3}), (2, 0, {0})])
@pytest.mark.parametrize("contiguous", [True, False])
def test_fast_path_issues_the_steps_in_their_order(fake_cuda, W, rank, near, contiguous):
    """Three shim calls around the two GEMMs issue what the step-by-step path (the profiled call) issues: the
    same operations, streams, addresses and values, in the same order (steps 1-6 of the module docstring), for
    peers of this node (copies through the mapping, stream writes) and of another (NVSHMEM gets, signals); the
    GEMM of the own rows comes before any wait on the main stream, and reads `a_local` itself when it can."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, near)
    a, b, c = _args(op, contiguous)
    steps, fast = _both_paths(log, op, a, b, c)
    assert fast == steps
    kinds = [o[0] for o in fast]
    assert kinds.count("GEMM") == 2 and kinds[-1] == so.ZERO
    first, second = (i for i, k in enumerate(kinds) if k == "GEMM")
    assert fast[second] == ("GEMM", MAIN, op.a_full.data_ptr(), b.data_ptr(), c.data_ptr(), op.arrived.data_ptr())
    on_main = [o for o in fast[:first] if o[1] == MAIN]
    local = op.streams[-1].cuda_stream
    if contiguous:   # a_local is a program op (the local stream's copy); the first GEMM reads it where it is
        assert kinds.count(so.COPY) == 1 + op.chunks * len(near - {rank})
        assert fast[first] == ("GEMM", MAIN, a.data_ptr(), b.data_ptr(), c.data_ptr())
        assert on_main == [(so.EVENT_RECORD, MAIN, "start")]          # nothing waited for ahead of it
        [copy] = [o for o in fast if o[0] == so.COPY and o[1] == local]
        assert copy[2:5] == (op._slot.data_ptr(), a.data_ptr(), a.nbytes)
    else:            # copied by torch into the slot on the main stream, after the waits for the peers' reads
        assert fast[first] == ("GEMM", MAIN, op._slot.data_ptr(), b.data_ptr(), c.data_ptr())
        assert [o[0] for o in on_main] == [so.WAIT_GEQ, so.WRITE] * (W - 1) + [so.COPY] + \
            [so.WRITE if p in near else so.SIGNAL_ADD for p in ((rank + j) % W for j in range(1, W))] + \
            [so.EVENT_RECORD, so.EVENT_RECORD]
    # the second GEMM comes after my copy (its event): no peer's flag is waited for on the main stream
    between = [o for o in fast[first + 1:second] if o[1] == MAIN]
    assert between == [(so.EVENT_WAIT, MAIN, "copied")]


@pytest.mark.parametrize("protocol,W,rank,near", [("pull", 4, 1, {0, 1, 2, 3}), ("pull", 3, 2, {2}),
                                                  ("push", 2, 1, {0, 1}), ("push", 3, 0, {0, 1, 2})])
@pytest.mark.parametrize("contiguous", [True, False])
def test_a_profiled_call_records_each_copy_stream_between_its_operations(fake_cuda, protocol, W, rank, near,
                                                                          contiguous):
    """A profiled call's records of the copies (tilescale.profiler.records.OpCall), made between the stream
    operations it issues: a copy stream's ``copies_begin`` where its copies may start (pull: before its wait for the
    peer's ``ready``; push: after its wait for the peer's ``freed`` and its reset), then a ``copy_done`` after each
    chunk's ``arrived`` write, with the chunk's bytes; peers in the order the steps serve them."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, near, protocol=protocol)
    a, b, c = _args(op, contiguous)
    with log.Mode(), profiled(log) as rec:
        op(a, b, out=c)
    ops, nbytes, pull = log.ops, op.rows // op.chunks * op.K * 2, protocol == "pull"
    want = []
    for j, q in enumerate((rank + j) % W if pull else (rank - j) % W for j in range(1, W)):
        h = op.streams[j if pull else 0].cuda_stream
        if pull:
            begin = next(i for i, o in enumerate(ops) if o[:4] == (so.WAIT_GEQ, h, op._ready_here[q], 1))
            want.append((begin, "copies_begin", h, q, "from"))
        else:
            want.append((ops.index((so.WRITE, h, op._freed_here[q], 0, 0, 0)) + 1, "copies_begin", h, q, "to"))
        for ch in range(op.chunks):
            at = op._arrived_at[q * op.chunks + ch] if pull else op._arrived_on[q] + 8 * ch
            want.append((ops.index((so.WRITE, h, at, 1, 0, 0)) + 1, "copy_done", h, q, ch, nbytes))
    assert rec.records == sorted(want)


@pytest.mark.parametrize("W,rank,near", [(4, 1, {0, 1, 2, 3}), (4, 2, {2, 3}), (2, 1, {0, 1})])
@pytest.mark.parametrize("contiguous", [True, False])
def test_pulls_start_with_the_call(fake_cuda, W, rank, near, contiguous):
    """Communication starts when the call starts, beside the GEMM of my own rows: every copy stream's operations
    are issued before that GEMM, and the only event a copy stream waits for is the call's start (and, when the
    pulls run one peer after another, the previous peer's last pull); each waits for its peer's ``ready`` flag
    on itself, never on the main stream. Peers are pulled in the order the second GEMM reads them (rank+1 first),
    and each chunk's ``arrived`` write follows its pull."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, near)
    a, b, c = _args(op, contiguous)
    with log.Mode():
        op(a, b, out=c)
    fast = log.ops
    first, second = (i for i, o in enumerate(fast) if o[0] == "GEMM")
    peers = [(rank + j) % W for j in range(1, W)]
    for j, src in enumerate(peers):
        h = op.streams[j].cuda_stream
        mine = [o for o in fast[:second] if o[1] == h]      # (after the second GEMM: step 6's join)
        assert all(fast.index(o) < first for o in mine), (src, mine)
        waited = [o[2] for o in mine if o[0] == so.EVENT_WAIT]
        assert waited == (["start", "pulled"] if j else ["start"]), (src, waited)
        wait = mine[len(waited)]
        assert wait[:4] == (so.WAIT_GEQ, h, op._ready_here[src], 1) and wait[4], wait   # (its slot: below)
        pulls = [i for i, o in enumerate(mine) if o[0] in (so.COPY, so.GET)]
        assert len(pulls) == op.chunks
        for ch, i in enumerate(pulls):
            assert mine[i + 1] == (so.WRITE, h, op._arrived_at[src * op.chunks + ch], 1, 0, 0)
        if j < W - 2:   # the next peer's pulls wait for this one's last
            assert mine[pulls[-1] + 2] == (so.EVENT_RECORD, h, "pulled")
    # nothing on the main stream between the call's start and the first GEMM waits for a peer
    assert not [o for o in fast[:first] if o[1] == MAIN and o[0] == so.WAIT_GEQ and o[2] in op._ready_here]


@pytest.mark.parametrize("W,rank,near,gpu", [(2, 0, {0, 1}, {0, 1}), (4, 1, {0, 1, 2, 3}, {0, 1}),
                                             (4, 3, {2, 3}, {0, 1, 2, 3})])
def test_pulls_from_my_own_gpu_end_before_the_second_gemm(fake_cuda, W, rank, near, gpu):
    """A peer on this rank's GPU (ranks sharing one) is pulled by copy kernels: the main stream waits for its copy
    stream's last operation (the join event recorded after its ``freed`` signal) before the second GEMM, whose
    waiting tiles would otherwise hold the SMs those copies need (they did: the op hung). Peers on other GPUs are
    not waited for there. The fast path issues the same as the steps."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, near, gpu=gpu)
    a, b, c = _args(op)
    steps, fast = _both_paths(log, op, a, b, c)
    assert fast == steps
    second = [i for i, o in enumerate(fast) if o[0] == "GEMM"][1]
    peers = [(rank + j) % W for j in range(1, W)]
    for j, src in enumerate(peers):
        s = op.streams[j].cuda_stream
        mine = [i for i, o in enumerate(fast[:second]) if o[1] == s]
        joined = (so.EVENT_RECORD, s, "join") in fast[:second]
        assert joined == (src in gpu), (src, fast[:second])
        if joined:   # recorded after every operation of that stream, waited for by the main stream before the GEMM
            rec = fast.index((so.EVENT_RECORD, s, "join"))
            assert rec == mine[-1] and fast[rec - 1][0] in (so.WRITE, so.SIGNAL_ADD)
            assert any(o == (so.EVENT_WAIT, MAIN, "join") for o in fast[rec:second])
    assert sum(o == (so.EVENT_WAIT, MAIN, "join") for o in fast[:second]) == len(gpu - {rank})


@pytest.mark.parametrize("contiguous", [True, False])
def test_every_stream_wait_is_watched_under_its_label(fake_cuda, contiguous):
    """Each stream wait of a call (step 2's for ``freed[q]``, step 4's for ``ready[src]``) has its slot of
    tilescale/runtime/stream_waits.py, labelled with the op, the flag and the rank that sets it, with the flag's
    address and the value waited for, bounded by TILESCALE_WAIT_TIMEOUT_S as it was when the op was built; the
    profiled steps use the slot of the same wait (the same stream). With TILESCALE_WAIT_TIMEOUT_S=0, no slot:
    nothing is queued for the bound."""
    from tilescale.env import settings

    log = fake_cuda
    W, rank = 4, 1
    with settings.scope(wait_timeout_s=7):
        op = _ag_gemm(log, W, rank, {0, 1, 2, 3})
    a, b, c = _args(op, contiguous)
    with log.Mode():
        op(a, b, out=c)
    fast, log.ops = log.ops, []
    with log.Mode(), profiled(log):
        op(a, b, out=c)
    assert [o for o in log.ops if o[0] == so.WAIT_GEQ] == [o for o in fast if o[0] == so.WAIT_GEQ]
    slots = {t.address(i): (t, w) for p in (op._first, op._local_head, op._local_tail) if p.table is not None
             for t in [p.table] for i, w in enumerate(t.waits)}
    waits = [o for o in fast if o[0] == so.WAIT_GEQ]
    assert len(waits) == 2 * (W - 1) and len({o[4] for o in waits}) == len(waits)
    for _, _, at, _, slot, _ in waits:
        table, w = slots[slot]
        flag = "freed" if at in op._freed_here else "ready"
        q = (op._freed_here if flag == "freed" else op._ready_here).index(at)
        assert (w.op, w.flag, w.peer, w.addr, w.value) == ("AGGemm", f"{flag}[{q}]", q, at, 1)
        assert table.words[(slot - table.base) // 8 + 3] == 7 * 10**9    # bound_ns
        assert w.text() == f"AGGemm's stream wait for flag {flag}[{q}] (set by rank {q})"
    assert {(w.flag, w.peer) for _, w in slots.values()} == {(f"{f}[{q}]", q) for f in ("freed", "ready")
                                                            for q in (0, 2, 3)}
    with settings.scope(wait_timeout_s=0):
        unbounded = _ag_gemm(log, W, rank, {0, 1, 2, 3})
    log.ops = []
    with log.Mode():
        unbounded(a, b, out=c)
        with profiled(log):
            unbounded(a, b, out=c)
    assert [o[4] for o in log.ops if o[0] == so.WAIT_GEQ] == [0] * 4 * (W - 1)


def test_a_failed_stream_operation_raises_alike_on_both_paths(fake_cuda):
    """A stream wait or write the driver refuses raises RuntimeError naming the op, the operation's index in its
    program, the operation (a wait: its flag and the rank that sets it) and the CUresult; a profiled call, which
    issues the program in pieces, names the same (the index in the whole program)."""
    log = fake_cuda
    op = _ag_gemm(log, 2, 0, {0, 1})
    a, b, c = _args(op)
    program = op._stream_ops

    def refusing(kind, value):     # the shim, refusing the first op of `kind` (and value `value`) it is given
        def shim(streams_at, ops_at, n, failed_at):
            bad = [i for i, o in enumerate(_decode(streams_at, ops_at, n)) if o[0] == kind and value in (None, o[3])]
            if not bad:
                return program(streams_at, ops_at, n, failed_at)
            ctypes.c_int.from_address(failed_at).value = bad[0]
            return 700
        return shim

    for kind, value, what in ((so.WAIT_GEQ, None, r"stream wait \(>=\) for AGGemm's flag ready\[1\] \(set by rank 1\) "
                                                   r"on stream 1 \(.*\)"),
                              (so.WRITE, 1, r"stream write on stream 1 \(a=0x[0-9a-f]+, b=0x1, .*\)")):
        op._stream_ops = refusing(kind, value)
        with pytest.raises(RuntimeError) as fast:
            op(a, b, out=c)
        assert re.fullmatch(r"AGGemm: op (\d+) of \d+ failed: " + what + ": CUresult 700", str(fast.value)), fast.value
        with profiled(log), pytest.raises(RuntimeError) as steps:
            op(a, b, out=c)
        assert str(steps.value) == str(fast.value)
    # the first chunk's arrived (after the start, the copy stream's event wait, ready's wait and reset, the copy)
    assert re.search(r"op 5 of \d+ failed", str(fast.value))


def test_pulls_that_need_an_sm_are_from_my_gpu_or_unmapped_peers():
    """Copy kernels (a peer on my GPU) and NVSHMEM's proxy kernels (a peer without a mapping: another node) need an SM;
    a copy engine's pull from a mapped peer on another GPU does not; never myself."""
    # 4 ranks, 2 per GPU ([0, 0, 1, 1]), rank 2's view; rank 0 not mapped (another node), rank 1 and 3 mapped
    got = agm.pulls_needing_sms(4, 2, lambda p: p in (2, 3), lambda p: p != 0)
    assert got == [True, False, False, True]
    assert agm.pulls_needing_sms(2, 0, lambda p: p == 0, lambda p: True) == [False, False]    # distinct GPUs, mapped
    assert agm.pulls_needing_sms(3, 1, lambda p: p == 1, lambda p: False) == [True, False, True]  # no mappings


def test_same_gpu_reads_the_node_device_map():
    from tilescale import runtime

    info = runtime.DistInfo(rank=5, world_size=8, local_rank=1, local_world_size=4, device=0, shared_gpu=True,
                            node_devices=tuple(runtime.device_map(4, 2, 2)))      # [0, 0, 1, 1] on each node
    assert [info.same_gpu(r) for r in range(8)] == [False, False, False, False, True, True, False, False]
    alone = runtime.DistInfo(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert [alone.same_gpu(r) for r in range(2)] == [False, True]


def test_fast_path_makes_three_shim_calls_and_two_launches(fake_cuda):
    log = fake_cuda
    op = _ag_gemm(log, 8, 3, set(range(8)))
    calls = []
    inner = op.rt.shim.ts_stream_ops
    op._stream_ops = lambda *a: calls.append(a[2]) or inner(*a)
    a, b, c = _args(op)
    op(a, b, out=c)
    assert len(calls) == 3 and calls[2] == 2 * 8 + 1   # after: a join per copy stream and the local one, a zero fill
    assert [o[0] for o in log.ops].count("GEMM") == 2


@pytest.mark.parametrize("contiguous", [True, False])
def test_world_size_one_is_the_gemm_alone_on_a_local(fake_cuda, contiguous):
    """Nothing to gather: no copy, no flag, no program; the GEMM reads a_local (a contiguous copy of it when it is
    not contiguous), and gathered() is the a_local of the last call."""
    log = fake_cuda
    op = _ag_gemm(log, 1, 0, {0})
    a, b, c = _args(op, contiguous)
    with log.Mode():
        assert op(a, b, out=c) is c
    [gemm] = log.ops
    assert gemm[0] == "GEMM" and gemm[1] == MAIN and gemm[3:] == (b.data_ptr(), c.data_ptr())
    assert (gemm[2] == a.data_ptr()) == contiguous
    assert op.gathered() is a


def test_world_size_one_copies_a_misaligned_a_local(fake_cuda):
    """A contiguous a_local that is not 16-byte aligned (TMA's rule) is copied into an aligned tensor: contiguous()
    alone would hand the kernel the misaligned one."""
    log = fake_cuda
    op = _ag_gemm(log, 1, 0, {0})
    _, b, c = _args(op)
    a = torch.ones(op.rows * op.K + 1, dtype=torch.float16)[1:].view(op.rows, op.K)
    assert a.is_contiguous() and a.data_ptr() & 15
    op(a, b, out=c)
    [gemm] = log.ops
    assert gemm[2] != a.data_ptr() and not gemm[2] & 15


def test_without_the_direct_entry_the_gemms_launch_through_tilelang(fake_cuda):
    log = fake_cuda
    op = _ag_gemm(log, 3, 0, {0, 1, 2}, direct=False)
    a, b, c = _args(op)
    op(a, b, out=c)
    gemm = [o for o in log.ops if o[0] == "GEMM"]
    assert gemm == [("GEMM", MAIN, a.data_ptr(), b.data_ptr(), c.data_ptr()),
                    ("GEMM", MAIN, op.a_full.data_ptr(), b.data_ptr(), c.data_ptr(), op.arrived.data_ptr())]


def test_a_new_output_when_out_is_none(fake_cuda):
    op = _ag_gemm(fake_cuda, 2, 0, {0, 1})
    a, b, _ = _args(op)
    c = op(a, b)
    assert c.shape == (op.M, op.N) and c.dtype == op.dtype


def test_a_failed_direct_launch_raises_with_the_librarys_error(fake_cuda):
    op = _ag_gemm(fake_cuda, 2, 0, {0, 1})
    op._direct_own = (lambda *a: 1, lambda: b"no kernel image")
    op.KERNEL = "ag_gemm"
    a, b, c = _args(op)
    with pytest.raises(RuntimeError, match="ag_gemm kernel launch failed: no kernel image"):
        op(a, b, out=c)


# ------------------------------------------------------------------------------------------ the call key
def test_call_key_sees_every_change_the_checks_read(fake_cuda):
    op = _ag_gemm(fake_cuda, 2, 0, {0, 1})
    a, b, c = _args(op)
    key = op.call_key(a, b, c)
    assert key == op.call_key(a.clone(), b.clone(), c.clone())             # another tensor, the same signature
    bf = torch.bfloat16
    changed = [(a.to(bf), b, c), (a[:4], b, c), (a, b.to(bf), c), (a, b.t().contiguous().t(), c),
               (a, torch.zeros(op.K * op.N + 8, dtype=torch.float16)[1:op.K * op.N + 1].view(op.K, op.N), c),
               (a, b, c.to(bf)), (a, b, c[:, :8]), (a, b, None),
               (a, torch.nn.Parameter(b, requires_grad=False), c)]
    for args in changed:
        assert op.call_key(*args) != key
    with pytest.raises(AttributeError):
        op.call_key([1], b, c)     # Op.begin then runs the checks (which raise the argument error)


def test_begin_rechecks_a_changed_tensor_and_not_an_agreed_one(fake_cuda, monkeypatch):
    op = _ag_gemm(fake_cuda, 2, 0, {0, 1})
    validated = []
    monkeypatch.setattr(checks, "agree", lambda *a: None)
    monkeypatch.setattr(op, "_validate", lambda *a: validated.append(a))
    a, b, c = _args(op)
    assert op.begin(a, b, c) == MAIN and len(validated) == 1
    op.begin(a, b, c)
    op.begin(a.clone(), b.clone(), c)
    assert len(validated) == 1
    b.resize_(op.K // 2, op.N * 2)                              # the same tensor object, another shape
    op.begin(a, b, c)
    assert len(validated) == 2


# --------------------------------------------------------------------------------------- the direct entry
def test_the_gemm_takes_its_direct_entry():
    """The host wrapper tilelang generates for the GEMM has the signature AGGemm launches with raw pointers."""
    import inspect

    from tilescale.ops.direct_launch import argtypes_for, call_signature

    tail, sizes = agm.SPLIT_PARAMS, agm.SPLIT_SIZES
    [(_, split)] = agm.kernels(512, 2752, 1024, 1, "float16")    # 44 tiles < 132 SMs, split in 3
    assert agm.kernel_plan(split, 512).split == 3
    [_, (_, peers_split)] = agm.kernels(1024, 2752, 1024, 2, "float16")   # the other rank's 44 tiles, split too
    assert agm.kernel_plan(peers_split, 1024).split == 3
    ptr, ints = [ctypes.c_void_p], [ctypes.c_int]
    for args, kw, names, types in (
            ((512, 512, 4, 2, "float16"), dict(own=False), ("A", "B", "C", "arrived", "slot_rows", "m"),
             ptr * 4 + ints * 2),
            ((512, 512, 4, 2, "float16"), dict(own=True), ("A", "B", "C", "m"), ptr * 3 + ints),
            (split, {}, ("A", "B", "C", *tail, "m", *sizes), ptr * 6 + ints * 5),
            (peers_split, {}, ("A", "B", "C", "arrived", *tail, "slot_rows", "m", *sizes), ptr * 7 + ints * 6)):
        r = agm.ag_gemm_kernel.build(*args, **kw)   # tests/prebuild_cpu_tier.py
        host = Path(r.library).with_suffix(".cu").read_text()
        got = argtypes_for(call_signature(host), names)
        assert got == types + ptr, host[host.find("int call("):][:400]     # (the stream last)
    src = inspect.getsource(agm.AGGemm.__init__)
    assert 'self.build(fn, jobs[0][1], ("A", "B", "C", *tail[0], "m", *sizes[0]))' in src
    assert 'self.build(fn, self.args, ("A", "B", "C", "arrived", *tail[1], "slot_rows", "m",' in src
    assert 'tail, sizes = [SPLIT_PARAMS if z else () for z in self._sizes], [SPLIT_SIZES if z else ()' in src


def test_the_cpu_harness_runs():
    """benchmarks/host_cpu.py (the CPU-side Python cost per call; stand-ins for every CUDA call) runs and finds two
    direct launches and three shim calls per AG+GEMM call at world size 4 (pull), two at 2 (push), one direct launch
    alone at 1."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "host_cpu.py"), "--calls", "200", "--world", "1", "2", "4"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout
    assert "NOT a GPU measurement" in r.stdout
    for W, calls in ((1, "1: kernel direct launch x1"), (2, "4: kernel direct launch x2, shim ts_stream_ops x2"),
                     (4, "5: kernel direct launch x2, shim ts_stream_ops x3")):
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"AG+GEMM op(a, b, out=c), W={W} "))
        assert row.endswith(calls), row
    assert "AllGather ag(x)" in r.stdout and "1: kernel direct launch x1" in r.stdout


def test_pull_chunks_keep_copies_of_16_mib():
    """A shard is pulled in copies of at least 16 MiB, at most 4, at least one, of whole row tiles (the last one
    shorter), counted per call from its rows (the kernel computes the same: chunk_tiles); kernels() leaves the
    count to the call (0) unless one is given."""
    mib = 1 << 20
    assert [agm.pull_chunks(n * mib) for n in (1, 15, 16, 31, 32, 48, 64, 1024)] == [1, 1, 1, 1, 2, 3, 4, 4]
    # 4096 rows x 8192 bf16 at W = 4: 16 MiB shards, one copy; 16384 rows: 64 MiB, four copies
    assert agm.kernels(4096, 2048, 8192, 4, "bfloat16")[1][1][3] == 0
    assert agm.kernels(4096, 2048, 8192, 4, "bfloat16", chunks=3)[1][1][3] == 3
    # 1024 rows x 8192 bf16: 16 MiB shards, one copy of 8 row tiles; 4096 rows: 64 MiB, four copies of 8 tiles
    assert agm.chunk_tiles(8, 1024, 8192, 0, 2) == 8 and agm.chunk_tiles(32, 4096, 8192, 0, 2) == 8
    # 48 MiB (3072 rows): 3 copies of 8 row tiles; 1000 rows at K = 24576 (46.9 MiB: 2 copies) of 4 tiles
    assert agm.chunk_tiles(24, 3072, 8192, 0, 2) == 8 and agm.chunk_tiles(8, 1000, 24576, 0, 2) == 4
    assert agm.chunk_tiles(1, 1, 8192, 0, 2) == 1 and agm.chunk_tiles(5, 600, 8192, 4, 2) == 2   # given: 4 chunks


# ------------------------------------------------------------------------------------------ the push protocol
def test_push_where_every_rank_has_a_gpu_of_its_own_on_this_node():
    """The push protocol where every copy runs on a copy engine: every peer mapped here (this node) and no GPU of
    the node run by two ranks, at any world size; pull where a peer shares this rank's GPU, where any two ranks of
    the node share one (the answer must be the same on every rank), or where a peer is on another node."""
    near = lambda *ps: [p in ps for p in range(4)]  # noqa: E731
    distinct = lambda p: p == 1  # noqa: E731      (rank 1's GPU is its own)
    assert agm.protocol_for(2, 1, near(0), distinct) == "push"
    assert agm.protocol_for(2, 1, near(), distinct) == "pull"                           # rank 0 on another node
    assert agm.protocol_for(2, 1, near(0), lambda p: True) == "pull"                    # one GPU for both
    assert agm.protocol_for(4, 1, near(0, 2, 3), distinct) == "push"
    assert agm.protocol_for(3, 2, near(0, 1), lambda p: p == 2) == "push"
    assert agm.protocol_for(4, 1, near(0, 2), distinct) == "pull"                       # rank 3 on another node
    assert agm.protocol_for(4, 1, near(0, 2, 3), lambda p: p in (0, 1)) == "pull"       # rank 0 shares my GPU
    assert agm.protocol_for(4, 1, near(0, 2, 3), distinct, shared_gpu=True) == "pull"   # ranks 2 and 3 share one
    assert agm.protocol_for(1, 0, near(), lambda p: p == 0) == "pull"                   # no peer: nothing moves


@pytest.mark.parametrize("W,rank", [(2, 0), (3, 1), (4, 2)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_push_fast_path_issues_the_steps_in_their_order(fake_cuda, W, rank, contiguous):
    """The push protocol's two shim calls around the GEMMs issue what its step-by-step path (the profiled call)
    issues: the same operations, streams, addresses and values, in the same order."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, set(range(W)), protocol="push")
    a, b, c = _args(op, contiguous)
    steps, fast = _both_paths(log, op, a, b, c)
    assert fast == steps
    assert [o[0] for o in fast].count("GEMM") == 2


@pytest.mark.parametrize("W,rank", [(2, 1), (4, 1), (4, 3)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_pushes_start_with_the_call(fake_cuda, W, rank, contiguous):
    """Push (module docstring): the copy stream's operations are all issued before the first GEMM and wait for
    nothing but the call's start and each peer's ``freed`` flag (here); my rows go to rank-1 first (it reads them
    first), in chunks, straight from `a_local` when it can be read as it is (else from my rows of A_full, filled
    on the main stream first), each chunk followed by its ``arrived`` write on that peer. The main stream waits for
    no flag: after the second GEMM it waits for the pushes, zeroes ``arrived`` and then tells every peer it may
    write again (``freed``)."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, set(range(W)), protocol="push")
    a, b, c = _args(op, contiguous)
    with log.Mode():
        op(a, b, out=c)
    ops = log.ops
    first, second = (i for i, o in enumerate(ops) if o[0] == "GEMM")
    h = op.streams[0].cuda_stream
    mine = [(i, o) for i, o in enumerate(ops) if o[1] == h]
    assert all(i < first for i, _ in mine)
    mine = [o for _, o in mine]
    src = a.data_ptr() if contiguous else op._slot.data_ptr()
    step = op.rows // op.chunks * op.K * 2
    want = [(so.EVENT_WAIT, h, "start")]
    for j in range(1, W):
        dst = (rank - j) % W
        watch = op._first.watches[("AGGemm", f"freed[{dst}]", dst)]      # its slot (tilescale/runtime/stream_waits.py)
        assert watch
        want += [(so.WAIT_GEQ, h, op._freed_here[dst], 1, watch, 0), (so.WRITE, h, op._freed_here[dst], 0, 0, 0)]
        at = op._peers[dst].data_ptr() + rank * op.rows * op.K * 2
        for ch in range(op.chunks):
            want += [(so.COPY, h, at + ch * step, src + ch * step, step, 0),
                     (so.WRITE, h, op._arrived_on[dst] + 8 * ch, 1, 0, 0)]
    assert mine == want + [(so.EVENT_RECORD, h, "join")]
    main = [o for o in ops if o[1] == MAIN]
    assert not [o for o in main if o[0] == so.WAIT_GEQ]
    assert ops[first][2] == src
    assert ops[second + 1:] == [(so.EVENT_WAIT, MAIN, "join"),
                                (so.ZERO, MAIN, op.arrived.data_ptr(), 0, op.arrived.nbytes, 0)] + \
        [(so.WRITE, MAIN, op._flag_at["freed"][q], 1, 0, 0) for q in range(W) if q != rank]


@pytest.mark.parametrize("W,rank", [(2, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_push_calls_of_fewer_rows_copy_and_flag_exactly_their_chunks(fake_cuda, W, rank, contiguous):
    """Push with the rows per call (bound 8: 2 row tiles of 4, in 2 chunks): a call of m rows copies my m rows,
    chunk by chunk (whole row tiles, the last chunk shorter or empty), from `a_local` (or my slot of A_full, filled
    by torch) into my slot of each peer's A_full (rows rank x 8 ..), and sets every chunk's ``arrived`` word on that
    peer (``arrived[me * slots + chunk]``), an empty chunk's too (a copy of no bytes); the profiled call issues
    what the fast path does, its records with each chunk's bytes and each GEMM's blocks of this call; both GEMMs get
    m. gathered() then copies my m rows into my slot once and returns the W x m rows of the call."""
    log = fake_cuda
    op = _ag_gemm(log, W, rank, set(range(W)), protocol="push")
    rb = op.K * 2
    for m, chunks in ((5, [(0, 4), (4, 1)]), (3, [(0, 3), (3, 0)]), (8, [(0, 4), (4, 4)]), (1, [(0, 1), (1, 0)])):
        a, b, c = _args(op, contiguous, m)
        a.copy_(torch.arange(a.numel(), dtype=torch.float16).view(m, op.K) + 1)
        fast, steps, rec = _fast_then_steps(log, op, a, b, c)
        assert fast == steps and op.m == m and op.chunk_rows(m) == chunks
        assert [r[-1] for r in rec.records if r[1] == "copy_done"] == [n * rb for _ in range(W - 1) for _, n in chunks]
        assert rec.tiles == [-(-m // 4), -(-m // 4) * (W - 1)]   # each GEMM's blocks of this call (block_m 4)
        h = op.streams[0].cuda_stream
        src = a.data_ptr() if a.is_contiguous() else op._slot.data_ptr()    # (one row: contiguous either way)
        want = []
        for j in range(1, W):
            dst = (rank - j) % W
            at = op._peers[dst].data_ptr() + rank * 8 * rb
            for ch, (lo, n) in enumerate(chunks):
                want += [(so.COPY, h, at + lo * rb, src + lo * rb, n * rb, 0),
                         (so.WRITE, h, 0x500000 + 0x1000 * dst + 8 * (rank * op.slots + ch), 1, 0, 0)]
        assert [o for o in fast if o[1] == h and o[0] in (so.COPY, so.WRITE) and o[2] not in op._freed_here] == want
        assert [o for o in fast if o[0] == so.WRITE and o[1] == MAIN] == \
            [(so.WRITE, MAIN, op._flag_at["freed"][q], 1, 0, 0) for q in range(W) if q != rank]
        g = op.gathered()
        assert g.shape == (W * m, op.K) and torch.equal(g[rank * m:(rank + 1) * m], a)


def test_push_gathered_copies_my_rows_in_once(fake_cuda):
    """A push call sends my rows from `a_local` without copying them into A_full: gathered() does, once per call
    (a call that copied a non-contiguous `a_local` into A_full leaves nothing to do)."""
    log = fake_cuda
    op = _ag_gemm(log, 4, 2, set(range(4)), protocol="push")
    a, b, c = _args(op)
    a.copy_(torch.arange(a.numel(), dtype=torch.float16).view_as(a))
    op(a, b, out=c)
    log.ops = []
    with log.Mode():
        g = op.gathered()
        assert g is op.a_full and torch.equal(g[2 * op.rows:3 * op.rows], a)
        op.gathered()
    assert [o[0] for o in log.ops] == [so.COPY]
    a2, _, _ = _args(op, contiguous=False)
    op(a2, b, out=c)
    log.ops = []
    with log.Mode():
        op.gathered()
    assert log.ops == []


@pytest.mark.parametrize("team,pes", [(None, [1]), (Team(1, 2, 2), [3]), (Team(4, 1, 3), [5, 6])])
def test_nvshmem_gets_and_signals_of_a_group_address_its_world_ranks(fake_cuda, team, pes):
    """An op of a group (rank 0 of it) pulls its peers' rows with NVSHMEM gets, and signals their flags with NVSHMEM
    adds, at the peers' world ranks (PEs): team rank p is PE start + stride * p; without a group, PE p."""
    W = 2 if team is None else team.size
    op = _ag_gemm(fake_cuda, W, 0, near=(), team=team)
    ops = [(o.kind, o.stream, o.a, o.b, o.n, o.pe) for prog in (op._first, op._pre, op._post) for o in prog.array]
    gets = sorted({o[5] for o in ops if o[0] == so.GET})
    signals = sorted({o[5] for o in ops if o[0] == so.SIGNAL_ADD})
    assert gets == pes and signals == pes, (gets, signals)
