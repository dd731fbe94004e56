"""The Python part of one op call, on the CPU (no GPU, no CUDA): AllGather ``ag(x)`` and AG+GEMM ``op(a, b, out=c)``.

    PYTHONPATH=. python benchmarks/host_cpu.py [--calls 20000] [--world 1 8] [--profile] [--no-shim]

What this measures is NOT a GPU measurement: the op objects are made without their GPU pieces (``object.__new__``
plus the attributes ``__call__`` reads), with small CPU tensors, fake torch.cuda streams / events (Python objects
that do nothing), and every C entry point (the kernel's direct launch, the runtime shim's functions, the
stand-in for tilelang's launch) replaced by a ctypes function of libm that returns 0 at once (``fegetround``,
given the real argument types: the ctypes argument conversion is paid, the CUDA work is not). So the numbers
are the op's own Python + ctypes cost per call; on a GPU every CUDA call (a launch, a stream write, a copy) and
every torch CUDA call (``torch.cuda.current_stream()``, ``Event()``, a CUDA ``copy_``) costs more than its
stand-in here. Next to the time, each row counts what a call reaches outside Python: C entry points (ctypes
calls) and torch CUDA / tensor calls (torch.cuda stream and event API, tensor methods) -- on a GPU those are
the microseconds. bench_host.py measures the real thing.

The row "AllGather ag(x), profiled" makes the same call in a host-events profiler session (``tilescale.profiler``,
mask "host", its events discarded), in rounds alternating with unprofiled ones: the profiler's cost is the difference
(printed below it). Its call is timed and recorded by the runtime shim's ``ts_timed_call`` (issue 15) when this tree
has it and the shim builds and loads here (nvcc against the stub libcuda, NVSHMEM's host library; ``--no-shim``: not
tried), with libm's ``fegetround`` as the kernel's C entry point that the shim calls; otherwise by Python.

Runs against whatever tilescale is on PYTHONPATH (this tree, or an older one to compare: the old AGGemm layout,
before ``AGGemm._plan``, is supported)."""
import argparse
import contextlib
import cProfile
import ctypes
import inspect
import pstats
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from tilescale.profiler import session

LIBM = ctypes.CDLL("libm.so.6")


def c_noop(argtypes, restype=ctypes.c_int):
    """A fresh ctypes function object of libm's ``fegetround`` (returns 0; extra register arguments are ignored
    by the x86-64 / aarch64 calling conventions) with these argument types."""
    fn = LIBM["fegetround"]
    fn.argtypes, fn.restype = argtypes, restype
    return fn


VP, U64, I32 = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int
FEGETROUND = ctypes.cast(LIBM.fegetround, VP).value   # the C function behind c_noop: what the shim's timed call calls


class Counter:
    def __init__(self):
        self.n = {}

    def hit(self, what):
        self.n[what] = self.n.get(what, 0) + 1


COUNT = None    # a Counter while counting (the timing passes run without it)


def counted(what, fn):
    """`fn`, counted as `what` when made while counting (the timing passes call `fn` itself)."""
    if COUNT is None:
        return fn

    def call(*a, **k):
        if COUNT is not None:
            COUNT.hit(what)
        return fn(*a, **k)
    return call


# ------------------------------------------------------------------------------------- fake torch.cuda
class FakeEvent:
    cuda_event = 0x7000

    def __init__(self, *a, **k):
        if COUNT is not None:
            COUNT.hit("torch.cuda.Event()")

    def record(self, stream=None):
        if COUNT is not None:
            COUNT.hit("Event.record")

    def wait(self, stream=None):
        if COUNT is not None:
            COUNT.hit("Event.wait")


class FakeStream:
    def __init__(self, handle):
        self.cuda_stream = handle

    def wait_event(self, ev):
        if COUNT is not None:
            COUNT.hit("Stream.wait_event")

    def wait_stream(self, s):
        if COUNT is not None:
            COUNT.hit("Stream.wait_stream")

    def synchronize(self):
        pass


def fake_current_stream(device=None):
    if COUNT is not None:
        COUNT.hit("torch.cuda.current_stream()")
    return FakeStream(0x5000)


@contextlib.contextmanager
def fake_stream_ctx(s):
    if COUNT is not None:
        COUNT.hit("torch.cuda.stream(s)")
    yield


def patch_torch_cuda():
    torch.cuda.current_stream = fake_current_stream
    torch.cuda.Event = FakeEvent
    torch.cuda.stream = fake_stream_ctx


# ------------------------------------------------------------------------------------------ op objects
def _common(op, cls, W, rank, shim):
    from tilescale.ops import base, checks

    base._capturing = bool                      # a C call returning False (torch's capture query)
    op.device = torch.device("cpu")
    op.world_size, op.rank = W, rank
    op._check = checks.CallCheck(cls.__name__)
    op._agreed = op._check.agreed
    op._order = checks.StreamOrder(op.device)
    op._stream = (0x5000).__index__             # a C call returning the handle (torch's raw stream query)
    op._order.handle = 0x5000
    op.captured = False
    op.rt = SimpleNamespace(shim=shim, info=SimpleNamespace(world_size=W, rank=rank))


def shim_stub():
    return SimpleNamespace(
        ts_stream_write_u64=counted("shim ts_stream_write_u64", c_noop([VP, VP, U64])),
        ts_stream_wait_geq_u64=counted("shim ts_stream_wait_geq_u64", c_noop([VP, VP, U64, VP])),
        ts_getmem_on_stream=counted("shim ts_getmem_on_stream", c_noop([VP, VP, ctypes.c_size_t, I32, VP], None)),
        ts_signal_add_on_stream=counted("shim ts_signal_add_on_stream", c_noop([VP, U64, I32, VP], None)),
        ts_stream_ops=counted("shim ts_stream_ops", c_noop([VP, VP, I32, VP])))


def tilelang_launch_stand_in(n_args):
    """tilelang's ``kernel.launch`` (its Cython forward: a c_void_p per tensor, then ``lib.call``): a lower
    bound of it."""
    fn = c_noop([VP] * (n_args + 1))

    def launch(*tensors):
        if COUNT is not None:
            COUNT.hit("kernel.launch (tilelang)")
        args = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        args.append(ctypes.c_void_p(0x5000))
        return fn(*args)
    return SimpleNamespace(launch=launch)


def make_allgather(W):
    from tilescale.ops import allgather

    op = object.__new__(allgather.AllGather)
    _common(op, allgather.AllGather, W, 0, shim_stub())
    rows, cols = 4, 64
    op.shape, op.dtype, op.n = (rows, cols), torch.bfloat16, rows * cols
    op.make_slots = None
    slots = torch.zeros(2, W * rows, cols, dtype=torch.bfloat16)
    op._slots, op.buffers, op.calls = slots, (slots[0], slots[1]), 0
    op._out3d = slots.view(2, W, op.n)
    op.arrived, op.counters = torch.zeros(2, W, dtype=torch.int64), torch.zeros(2 * W, dtype=torch.int64)
    op._ptrs = (slots.data_ptr(), op.arrived.data_ptr(), op.counters.data_ptr())
    op.launch_path = "direct"
    op._direct = (counted("kernel direct launch", c_noop([VP, VP, VP, VP, ctypes.c_int64, VP])), lambda: b"")
    op._entry = FEGETROUND   # the address of the C entry point (a profiled call's timed launch; unused by older trees)
    x = torch.zeros(rows, cols, dtype=torch.bfloat16)
    return op, (x,), {}


def make_ag_gemm(W):
    from tilescale.ops import allgather_gemm as agm

    cls = agm.AGGemm
    op = object.__new__(cls)
    shim = shim_stub()
    _common(op, cls, W, 0, shim)
    rows, K, N, chunks = 8, 16, 16, 4          # tiny: the CPU copies stay cheap (on a GPU they are async)
    M, dt = W * rows, torch.bfloat16
    op.M, op.N, op.K, op.dtype, op.rows, op.chunks = M, N, K, dt, rows, chunks
    op.m, op.slots, op.block_m = rows, chunks, 4    # (trees with rows per call: the call's rows, chunks, row tile)
    rows_args = [ctypes.c_int] if hasattr(cls, "_set_rows") else []   # the GEMMs' run-time rows (+ slot rows)
    op.a_full = torch.zeros(M, K, dtype=dt)
    op.arrived = torch.zeros(W * chunks, dtype=torch.int64)
    op.fused = True
    two_gemms = hasattr(cls, "_gemm_own")      # this tree: the GEMM of the own rows first, a local stream
    op.streams = [FakeStream(0x6000 + j) for j in range(W if two_gemms else max(1, W - 1))]
    peers = [torch.zeros(M, K, dtype=dt) if p != 0 else None for p in range(W)]   # every peer on this node
    op._peers = peers
    op._pull_first = [False] * W      # every peer on another GPU (copy engines)
    op._flag_at = {"ready": [0x100000 + 8 * p for p in range(W)], "freed": [0x200000 + 8 * p for p in range(W)]}
    op._ready_here = [0x300000 + 8 * q for q in range(W)]
    op._freed_here = [0x400000 + 8 * q for q in range(W)]
    op._arrived_at = [op.arrived.data_ptr() + 8 * i for i in range(W * chunks)]
    op.kernel = tilelang_launch_stand_in(4)
    op.kernel_prof, op.tiles = None, 1
    op._slot = op.a_full[:rows]
    if two_gemms:
        op.kernel_own, op.kernels_prof, op.tiles = tilelang_launch_stand_in(3), None, [1, 1]
        op._direct_own = (counted("kernel direct launch", c_noop([VP] * 3 + rows_args + [VP])), lambda: b"")
        op.tail, op._tail_ptrs = [(), ()], [(), ()]   # plain grids (no split tail; unused by older trees)
        op._ws = op._sizes = [(), ()]                 # (this tree's names of the same)
    direct = (counted("kernel direct launch", c_noop([VP] * 4 + rows_args * 2 + [VP])), lambda: b"")
    if hasattr(cls, "_plan_push") and W == 2:   # this tree: two ranks on two GPUs push (agm.protocol_for)
        op.protocol, op.streams = "push", op.streams[:1]
        op._arrived_on = [0x500000 + 0x1000 * p for p in range(W)]
        op._start, op._joins = FakeEvent(), [FakeEvent()]
        op._slot_stale, op._stream_ops = False, shim.ts_stream_ops
        op._direct = direct
        op.launch_path = "direct"
        op._plan_push()
    elif hasattr(cls, "_plan") and (W > 1 or not two_gemms):   # the programs (none at W = 1), the direct launch
        op._direct = direct
        op.launch_path = "direct"
        op.protocol, op._stream_ops = "pull", shim.ts_stream_ops     # (set by _plan in older trees)
        joins = [0x7001 + j for j in range(len(op.streams))]
        events = dict(events=dict(start=0x7100, copied=0x7101, gate=0x7000)) if two_gemms else dict(gate=0x7000)
        if "pulled" in inspect.signature(cls._plan).parameters:   # this tree: pulls from the call's start
            events = dict(events=dict(start=0x7100, copied=0x7101), pulled=[0x7200 + j for j in range(W - 2)])
        op._plan(a_full=op.a_full.data_ptr(), row_bytes=K * 2, peer_at=[None if t is None else t.data_ptr()
                                                                        for t in peers],
                 streams=[s.cuda_stream for s in op.streams], joins=joins, arrived=op.arrived.data_ptr(),
                 arrived_bytes=op.arrived.nbytes, **events)
    a, b, c = torch.zeros(rows, K, dtype=dt), torch.zeros(K, N, dtype=dt), torch.zeros(M, N, dtype=dt)
    return op, (a, b), {"out": c}


# ---------------------------------------------------------------------------------------------- measure
def per_call_us(fn, calls, repeats=5):
    for _ in range(200):
        fn()
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(best), min(best)


def profiled_us(make, shim, calls, repeats=5):
    """One op's call (``make(1)``) unprofiled and in a host_session, in alternating rounds of `calls` calls, each
    profiled round in a session of its own, after one session not timed: ((median, min) unprofiled, (median, min)
    profiled) us per call. So both see the op in the same state: in trees before the shim's timed calls, the op's first
    profiled call made its record by ``functools.cached_property``, which materializes the op's ``__dict__`` and
    makes every later call ~15% slower on CPython 3.11, profiled or not."""
    op, args, kw = make(1)
    times = {False: [], True: []}
    for profiled in [True] + [False, True] * repeats:
        with host_session(shim) if profiled else contextlib.nullcontext():
            for _ in range(200):
                op(*args, **kw)
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                op(*args, **kw)
            times[profiled].append((time.perf_counter_ns() - t0) / calls / 1e3)
    off, on = times[False], times[True][1:]
    return (statistics.median(off), min(off)), (statistics.median(on), min(on))


class TorchCalls(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in ("__get__", "data_ptr", "is_contiguous", "dtype", "shape", "device", "nbytes", "__hash__"):
            COUNT.hit(f"tensor {name}")
        return func(*args, **(kwargs or {}))


def count_calls(make, W):
    global COUNT
    COUNT = Counter()
    op, args, kw = make(W)
    s = session.current
    timed = getattr(s, "timed", None)   # a profiled row: the shim's timed entry, counted too
    if timed is not None:
        s.timed = counted("shim ts_timed_call", timed)
    try:
        op(*args, **kw)                    # the checks' first (agreed) call
        COUNT.n.clear()
        with TorchCalls():
            op(*args, **kw)
    finally:
        if timed is not None:
            s.timed = timed
    n, COUNT = COUNT.n, None
    return n


def load_shim():
    """The runtime shim, built (nvcc, against the stub libcuda on a machine without a GPU) and loaded with NVSHMEM's
    host library; None when that fails here (the profiled row then records in Python)."""
    try:
        from tilescale import discovery, runtime

        return runtime.load_shim(discovery.find_nvshmem())
    except Exception as e:  # noqa: BLE001
        print(f"(the runtime shim is not loaded here: {type(e).__name__}: {str(e)[:200]})")
        return None


class Discard:
    """A profiler that drops its events (made a tilescale Profiler in host_session): the session's own cost only."""

    def start_event(self, descr):
        return None


@contextlib.contextmanager
def host_session(shim):
    """A host-events profiler session (mask "host") that drops its events, whose timed calls go through `shim`'s
    ``ts_timed_call`` (the session takes the runtime's shim; here there is no runtime: `shim` in its place), or
    through Python's record without a shim or in a tree without timed calls."""
    import tilescale.profiler as tp

    prof = type("Discard", (Discard, tp.Profiler), {})()
    hook = getattr(session, "_runtime_shim", None)
    if hook is not None:
        session._runtime_shim = lambda: shim
    try:
        with tp.profile(None, mask="host", profiler=prof, merge=False) as s:
            yield s
    finally:
        if hook is not None:
            session._runtime_shim = hook


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--world", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--profile", action="store_true", help="cProfile AG+GEMM at the largest world size")
    ap.add_argument("--no-shim", action="store_true", help="the profiled row without the runtime shim (Python record)")
    a = ap.parse_args(argv)
    patch_torch_cuda()
    session.current = None             # profiling off (decided), as after the first call of a run
    shim = None if a.no_shim else load_shim()
    print("CPU-side Python + ctypes cost per call (stand-ins for every CUDA call: NOT a GPU measurement)")
    print(f"{'op':44s} {'us/call median':>15s} {'min':>7s}   calls outside Python per call")
    empty = per_call_us(lambda: None, a.calls)
    print(f"{'floor: an empty Python call':44s} {empty[0]:15.2f} {empty[1]:7.2f}")
    rows = [("AllGather ag(x)", make_allgather, 1, False), ("AllGather ag(x), profiled (mask host)", make_allgather, 1,
                                                              True)]
    rows += [(f"AG+GEMM op(a, b, out=c), W={W}", make_ag_gemm, W, False) for W in a.world]
    for name, make, W, profiled in rows:
        if profiled:
            off, (med, lo) = profiled_us(make, shim, a.calls)
            with host_session(shim):
                n = count_calls(make, W)
        else:
            op, args, kw = make(W)
            op(*args, **kw)
            med, lo = per_call_us(lambda: op(*args, **kw), a.calls if W < 8 else a.calls // 4)
            n = count_calls(make, W)
        ext = ", ".join(f"{k} x{v}" for k, v in sorted(n.items()))
        print(f"{name:44s} {med:15.2f} {lo:7.2f}   {sum(n.values())}: {ext}")
        if profiled:
            print(f"{'  the profiler: profiled - unprofiled':44s} {med - off[0]:+15.2f} {lo - off[1]:+7.2f}   "
                  f"(alternating rounds; unprofiled in them: {off[0]:.2f}, min {off[1]:.2f})")
    if a.profile:
        op, args, kw = make_ag_gemm(max(a.world))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            op(*args, **kw)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
