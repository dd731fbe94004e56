"""Host time per eager call of tilescale's ops (what one call costs the CPU), and a captured AllGather's replays.

    GPUS=2 bash launch.sh benchmarks/bench_host.py [--json out.json] [--calls 1000]
    GPUS=1 bash launch.sh benchmarks/bench_host.py
    GPUS=2 TILESCALE_RANKS_PER_GPU=2 bash launch.sh benchmarks/bench_host.py     # 2 ranks on one GPU
    bash tests/gpu/run_gpu_tier.sh OUTDIR host      # ranks: HOST_RANKS (default the GPUs found); OUTDIR/host.json

What is measured: the wall time of the Python call alone (``time.perf_counter_ns`` around it, nothing
synchronised inside), for each of ``--calls`` calls made in batches (``--batch``, 20; ``--fused-batch``, 5, for
AG+GEMM and GEMM+RS, whose calls enqueue tens of copies and launches each), with a synchronisation between
batches that is not timed: the GPU queue never holds more than a batch, so no call waits for room in it and the
time is the host's own (``benchmarks/timing.py``: ``host_us_per_call``). Median, p10 and p90 over the calls;
growth: the median of the last quarter of the calls over that of the first (does host time grow with the number
of calls? ``GROWTH_LIMIT``). Every rank measures its own calls; a row shows the rank of the largest median, and
the largest growth of any rank. The first row times a call of an empty Python function the same way: the
method's floor (timer and loop). No GPU time is reported here (bench_allgather.py, bench_fused.py do that).

Ops, bf16: AllGather of 1 MiB per rank (the op object ``ag(x)``, which returns its slot, and the functions
``all_gather_into_tensor(out, x)`` and ``all_gather(x)``, bound once by ``from tilescale.ops import ...``; and
``tilescale.ops.all_gather_into_tensor(out, x)`` as the README writes calls, whose name is looked up through the
package's lazy ``__getattr__`` on every call), AllReduce of 1 MiB (``ar(x, out=o)``;
``all_reduce(t)`` in place, on zeros), ReduceScatter of a 1 MiB input (``rs(x, out=o)``;
``reduce_scatter_tensor(o, x)``), AG+GEMM on M x K x N = 8192 x 8192 x 2048 (A gathered from M / W rows per
rank: ``op(a, b, out=c)``; ``ag_gemm(a, b)``) and GEMM+RS on 8192 x 8192 x 8192 (K split over the ranks:
``op(x, w, out=o)``; ``gemm_rs(x, w)``): the shapes of bench_fused.py's README rows (``--ag-shape``,
``--rs-shape``). torch's equivalents where ranks have GPUs of their own: NCCL (``dist.all_gather_into_tensor``,
``all_reduce``, ``reduce_scatter_tensor``), NCCL then cuBLAS for AG+GEMM and cuBLAS then NCCL for GEMM+RS;
``torch.matmul`` alone in every mode. Each is checked against torch once before it is timed.

Floors (issue 15: what the op's Python costs above a launch on this host), measured right after ``ag(x)``'s row the
same way: the op's C entry point (tilescale/ops/direct_launch.py, one ctypes call) called alone with the arguments
``ag(x)`` passes it, with no Python op around it; and an empty kernel (PTX loaded through libcuda) launched with
``cuLaunchKernel`` through ctypes, the driver's own floor. The line "python overhead above the launch floor" is
``ag(x)``'s median minus its entry point's (per rank, the most of any rank). The entry point's launches advance the
device's count of the op's calls, so the op's host count is set to the device's after them (and its result checked
again).

Targets (issue 15): an AllGather of 1 MiB per rank, the op object's call: <= 3 us; AG+GEMM, the op object's
call: <= 30 us. The functions'
rows have no target.

CUDA graph (issue 16): an AllGather of 1 MiB per rank ``ag(x, out=t)`` captured with torch.cuda.graph: host us
per ``graph.replay()`` (a table row), and the Python function entries into tilescale's modules during
``--replays`` replays (``tilescale.testing.PythonCalls``: sys.setprofile on the calling thread), expected 0,
next to the same count over as many eager calls of that op (> 0, so the count can fail); the replayed result is
checked with new inputs and a poisoned output, before and after.

Ranks sharing a GPU (``TILESCALE_RANKS_PER_GPU``): their kernels take turns on the GPU, so any GPU time would
mean nothing, and there is no NCCL (its rows are skipped). Host time per call is still each process's own CPU
work per call and is measured the same way; the processes share the machine's cores and the GPU's driver,
so it is a per-process measure, not a substitute for one GPU per rank. The output says which mode it ran in.
Bounds: the number of calls is fixed; the synchronisations are tilescale.synchronize (the waits in tilescale's
kernels give up after TILESCALE_WAIT_TIMEOUT_S where it is set, as run_gpu_tier.sh sets it: 30 s; a rank that
fails ends the others through its watchdog) and the exchanges of results go over the host's gloo group. Waits
that nothing inside bounds remain (a stream wait of AG+GEMM's handshake, NCCL's): run it under ``timeout``
(run_gpu_tier.sh does, 420 s; launch.sh ends every rank on SIGTERM).
"""
import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fused import AG_SHAPES, RS_SHAPES  # noqa: E402
from timing import environment, host_stats, host_us_per_call, print_table, target_status, write_json  # noqa: E402

import tilescale  # noqa: E402

MIB = 1 << 20
AG_SHAPE = AG_SHAPES[2]      # (M, K, N) = 8192 x 8192 x 2048
RS_SHAPE = RS_SHAPES[0]      # 8192 x 8192 x 8192
TARGET_AG_US = 3.0           # issue 15: host time per eager call, AllGather of 1 MiB
TARGET_AG_GEMM_US = 30.0     # issue 15: host time per eager call, AG+GEMM
GROWTH_LIMIT = 1.2           # this script's bound for "does not grow": last quarter's median / first quarter's
QUEUE_SUSPECT = 2.0          # last call of a batch / first call above this: the calls may have waited for the GPU

HEADER = ["op", "world size", "host us median", "p10", "p90", "growth", "target", "status"]
ROW_PYTHON = "floor: a call of an empty Python function"
ROW_AG = "AllGather 1 MiB/rank: op ag(x)"
ROW_ENTRY = "floor: AllGather's C entry point alone (ctypes), ag(x)'s arguments"
ROW_EMPTY = "floor: cuLaunchKernel of an empty kernel (ctypes, libcuda)"


# --------------------------------------------------------------------------------------- report (CPU-testable)
def table_rows(rows: list[dict]) -> list[list]:
    """The markdown table's cells of measured rows (dicts as :class:`Host` records them)."""
    out = []
    for r in rows:
        t = r.get("target_us")
        out.append([r["op"], r["world_size"], f"{r['median']:.2f}", f"{r['p10']:.2f}", f"{r['p90']:.2f}",
                    f"{r['growth']:.2f}", "-" if t is None else f"<= {t:g}", target_status(r["median"], t)])
    return out


def summary_lines(rows: list[dict]) -> list[str]:
    """Targets met or missed, whether host time grew over the calls, and rows whose calls may have waited for
    room in the GPU queue."""
    lines = []
    for r in rows:
        if r.get("target_us") is not None:
            lines.append(f"target {r['op']}: host time per call <= {r['target_us']:g} us: {r['median']:.2f} us "
                         f"(rank {r['slowest_rank']}) {target_status(r['median'], r['target_us'])}")
    grew = [f"{r['op']} ({r['growth']:.2f}x)" for r in rows if r["kind"] == "tilescale" and
            not r["growth"] <= GROWTH_LIMIT]
    ours = [r for r in rows if r["kind"] == "tilescale"]
    if ours:
        lines.append(f"host time does not grow over the calls (last quarter's median <= {GROWTH_LIMIT:g}x the first "
                     f"quarter's, every rank): {'MET' if not grew else 'MISSED at ' + ', '.join(grew)}")
    waited = [r["op"] for r in rows if r.get("last_in_batch", 0) > QUEUE_SUSPECT]
    if waited:
        lines.append(f"warning: the last call of a batch took > {QUEUE_SUSPECT:g}x the first in: {', '.join(waited)} "
                     "(the calls may have waited for the GPU queue: try a smaller --batch / --fused-batch)")
    return lines


def floor_summary(rows: list[dict]) -> dict | None:
    """ag(x) against its launch floors (None without the entry point's row): ``python_us``, what ag(x) costs above
    its C entry point called alone (per rank, the most of any rank), and the rows' medians."""
    by = {r["op"]: r for r in rows}
    ag, entry = by.get(ROW_AG), by.get(ROW_ENTRY)
    if ag is None or entry is None:
        return None
    mine = ag.get("medians") or [ag["median"]]
    floor = entry.get("medians") or [entry["median"]]
    out = dict(python_us=max(a - e for a, e in zip(mine, floor, strict=True)), ag_us=ag["median"],
               entry_us=entry["median"])
    for key, name in (("empty_launch_us", ROW_EMPTY), ("python_call_us", ROW_PYTHON)):
        if name in by:
            out[key] = by[name]["median"]
    return out


def floor_lines(rows: list[dict]) -> list[str]:
    """The line of :func:`floor_summary` (none without the entry point's row)."""
    f = floor_summary(rows)
    if f is None:
        return []
    line = (f"python overhead above the launch floor, ag(x): {f['python_us']:.2f} us per call (ag(x) "
            f"{f['ag_us']:.2f} us, its C entry point alone {f['entry_us']:.2f} us; per rank, the most of any rank)")
    if "empty_launch_us" in f:
        line += (f"; an empty kernel's cuLaunchKernel {f['empty_launch_us']:.2f} us (the entry point above it: "
                 f"{f['entry_us'] - f['empty_launch_us']:+.2f} us)")
    if "python_call_us" in f:
        line += f"; the timing loop's own floor (an empty Python call) {f['python_call_us']:.2f} us"
    return [line]


def replay_line(g: dict) -> str:
    """The line of the CUDA graph's replays: host time per replay and the Python calls into tilescale."""
    n = g["replays"]
    return (f"CUDA graph of an AllGather of 1 MiB per rank, {g['world_size']} ranks: graph.replay() "
            f"{g['median']:.2f} us host (p10 {g['p10']:.2f}, p90 {g['p90']:.2f}); Python calls into tilescale "
            f"during {n} replays: {g['replay_calls']} (expected 0; the most of any rank), during {n} eager calls: "
            f"{g['eager_calls']} (the fewest of any rank): {replay_status(g)}")


def replay_status(g: dict) -> str:
    """MET: no tilescale Python ran during the replays, while the same count saw the eager calls."""
    if g["eager_calls"] <= 0:
        return "INVALID (the count saw no eager call either)"
    return "MET" if g["replay_calls"] == 0 else "MISSED"


def mode_line(world_size: int, shared_gpu: bool, gpu: str) -> str:
    if not shared_gpu:
        return (f"mode: {world_size} rank(s), a GPU each ({gpu}); NCCL rows are torch.distributed on NCCL; "
                "host times only (no GPU time in this table)")
    return (f"mode: {world_size} ranks SHARING a GPU ({gpu}, TILESCALE_RANKS_PER_GPU): GPU time would mean nothing "
            "here, and there is no NCCL (its rows are skipped); host time per call is still each process's own CPU "
            "work per call, a per-process measure (the processes share the cores and the GPU's driver), not a "
            "substitute for a run with a GPU per rank")


# ------------------------------------------------------------------------------------------------ measuring
class Host:
    """Measures host time per call (every rank the same calls, in the same order) and keeps the rows."""

    def __init__(self, info, args):
        self.W, self.rank, self.args = info.world_size, info.rank, args
        self.rows: list[dict] = []

    def gather(self, value) -> list:
        from tilescale import runtime

        return runtime.current().all_gather_object(value)   # the host's gloo group: bounded, no GPU work

    def measure(self, op: str, fn, *, target=None, kind="tilescale", fused=False) -> dict:
        batch = self.args.fused_batch if fused else self.args.batch
        calls = self.args.fused_calls if fused else self.args.calls
        st = host_stats(host_us_per_call(fn, calls, batch, sync=tilescale.synchronize), batch)
        per_rank = self.gather(st)
        worst = max(range(self.W), key=lambda r: per_rank[r]["median"])
        row = dict(per_rank[worst], op=op, kind=kind, world_size=self.W, target_us=target, slowest_rank=worst,
                   batch=batch, growth=max(s["growth"] for s in per_rank),
                   last_in_batch=max(s.get("last_in_batch", 0.0) for s in per_rank),
                   medians=[s["median"] for s in per_rank])
        self.rows.append(row)
        return row


class EmptyKernel:
    """An empty kernel (no parameters, ``ret``) loaded from PTX through libcuda into the current context (the
    driver JIT-compiles it) and launched with ``cuLaunchKernel`` through ctypes: 1 block of 32 threads on `stream`
    (a raw handle). ``launch()`` returns the CUresult (0: launched)."""

    PTX = ".version {v}\n.target {t}\n.address_size 64\n.visible .entry tilescale_empty()\n{{\n\tret;\n}}\n"
    TARGETS = (("7.0", "sm_70"), ("7.8", "sm_90"))   # the first the driver loads

    def __init__(self, stream: int):
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        ctx, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self._check(cuda, cuda.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("no current CUDA context on this thread")
        tried = []
        for version, target in self.TARGETS:
            r = cuda.cuModuleLoadData(ctypes.byref(mod), self.PTX.format(v=version, t=target).encode() + b"\0")
            if r == 0:
                break
            tried.append(f"{target}: {self._name(cuda, r)}")
        else:
            raise RuntimeError(f"cuModuleLoadData: {'; '.join(tried)}")
        self._check(cuda, cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"tilescale_empty"), "cuModuleGetFunction")
        u, vp = ctypes.c_uint, ctypes.c_void_p
        launch = cuda["cuLaunchKernel"]     # a function object of its own (argument types set here only)
        launch.argtypes, launch.restype = [vp, u, u, u, u, u, u, u, vp, vp, vp], ctypes.c_int
        self.cuda, self.module = cuda, mod
        self.launch = functools.partial(launch, fn.value, 1, 1, 1, 32, 1, 1, 0, stream or None, None, None)
        self._check(cuda, self.launch(), "cuLaunchKernel")

    @staticmethod
    def _name(cuda, code: int) -> str:
        import ctypes

        s = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(s))
        return f"{(s.value or b'?').decode()} ({code})"

    def _check(self, cuda, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: {self._name(cuda, code)}")


def launch_floors(h: Host, ag, x, ref, rank: int) -> None:
    """The floor rows under ag(x)'s (see the module docstring): its C entry point alone with ag(x)'s arguments, then
    an empty kernel's cuLaunchKernel. Every rank measures a row or none does (a rank without it says why)."""
    import torch

    direct = ag._direct
    if all(h.gather(direct is not None and x.is_contiguous() and x.data_ptr() % 16 == 0)):
        fn, p, (out3d, arrived, counters), n, stream = direct[0], x.data_ptr(), ag._ptrs, ag.n, ag._stream()
        if fn(p, out3d, arrived, counters, n, stream):
            raise RuntimeError(f"AllGather's entry point failed: {direct[1]().decode(errors='replace')}")
        h.measure(ROW_ENTRY, lambda: fn(p, out3d, arrived, counters, n, stream), kind="floor")
        torch.cuda.synchronize()
        ag.calls = int(ag.counters[0].item())   # the entry point's launches were calls of ag, counted on the device
        _check("AllGather op after its entry point's launches", ag(x), ref, rank, exact=True)
    else:
        print(f"[rank {rank}] {ROW_ENTRY}: skipped (on some rank the op launches through tilelang: "
              f"launch_path={ag.launch_path})")
    empty, why = None, ""
    try:
        empty = EmptyKernel(ag._stream())
    except Exception as e:  # noqa: BLE001  (a row of its own: the others go on)
        why = f"{type(e).__name__}: {e}"
    if all(h.gather(empty is not None)):
        launch = empty.launch
        h.measure(ROW_EMPTY, lambda: launch(), kind="floor")
        torch.cuda.synchronize()
    else:
        print(f"[rank {rank}] {ROW_EMPTY}: skipped ({why or 'failed on another rank'})")


def _check(name, got, ref, rank, *, exact=False, rel=None, W=1):
    import torch

    if exact:
        ok = torch.equal(got, ref)
    elif rel is not None:
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        ok = err < rel       # NaN fails
    else:
        ok = torch.allclose(got.float(), ref.float(), atol=0.06 * W, rtol=0.02)
    if not ok:
        raise AssertionError(f"[rank {rank}] {name}: differs from torch's result")


def collectives(info, h: Host, coll, nccl: bool) -> None:
    """AllGather of 1 MiB per rank, AllReduce of 1 MiB, ReduceScatter of a 1 MiB input: op objects, functions,
    NCCL."""
    import torch
    import torch.distributed as dist

    from tilescale.ops import all_gather, all_gather_into_tensor, all_reduce, reduce_scatter_tensor

    ops, W, rank, dt = tilescale.ops, info.world_size, info.rank, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(100 + rank)
    rows = MIB // 2 // 1024
    x = torch.randn(rows, 1024, device="cuda", dtype=dt, generator=g)
    ref = torch.empty(W * rows, 1024, device="cuda", dtype=dt)
    coll.all_gather_into_tensor(ref, x)
    ag = ops.AllGather((rows, 1024), dt)
    out = torch.empty_like(ref)
    _check("AllGather op", ag(x), ref, rank, exact=True)
    _check("all_gather_into_tensor", all_gather_into_tensor(out, x), ref, rank, exact=True)
    _check("all_gather", all_gather(x), ref, rank, exact=True)
    torch.cuda.synchronize()
    h.measure(ROW_AG, lambda: ag(x), target=TARGET_AG_US)
    launch_floors(h, ag, x, ref, rank)
    h.measure("AllGather 1 MiB/rank: all_gather_into_tensor(out, x)", lambda: all_gather_into_tensor(out, x))
    h.measure("AllGather 1 MiB/rank: all_gather(x)", lambda: all_gather(x))
    h.measure("AllGather 1 MiB/rank: tilescale.ops.all_gather_into_tensor(out, x), looked up each call",
              lambda: tilescale.ops.all_gather_into_tensor(out, x))
    if nccl:
        h.measure("AllGather 1 MiB/rank: NCCL dist.all_gather_into_tensor", lambda: dist.all_gather_into_tensor(ref, x),
                  kind="torch")
    ag.close()

    n = MIB // 2
    v = torch.randn(n, device="cuda", dtype=dt, generator=g)
    ar, o = ops.AllReduce((n,), dt), torch.empty(n, device="cuda", dtype=dt)
    want = v.clone()
    coll.all_reduce(want)
    _check("AllReduce op", ar(v, out=o), want, rank, W=W)
    _check("all_reduce", all_reduce(v.clone()), want, rank, W=W)
    zeros = torch.zeros(n, device="cuda", dtype=dt)      # in place, called again and again: stays finite
    h.measure("AllReduce 1 MiB: op ar(x, out=o)", lambda: ar(v, out=o))
    h.measure("AllReduce 1 MiB: all_reduce(t) in place", lambda: all_reduce(zeros))
    if nccl:
        h.measure("AllReduce 1 MiB: NCCL dist.all_reduce", lambda: dist.all_reduce(zeros), kind="torch")
    ar.close()

    rs, o = ops.ReduceScatter((n,), dt), torch.empty(n // W, device="cuda", dtype=dt)
    want = torch.empty(n // W, device="cuda", dtype=dt)
    coll.reduce_scatter_tensor(want, v.clone())
    _check("ReduceScatter op", rs(v, out=o), want, rank, W=W)
    o2 = torch.empty_like(o)
    _check("reduce_scatter_tensor", reduce_scatter_tensor(o2, v), want, rank, W=W)
    h.measure("ReduceScatter 1 MiB input: op rs(x, out=o)", lambda: rs(v, out=o))
    h.measure("ReduceScatter 1 MiB input: reduce_scatter_tensor(o, x)", lambda: reduce_scatter_tensor(o2, v))
    if nccl:
        h.measure("ReduceScatter 1 MiB input: NCCL dist.reduce_scatter_tensor",
                  lambda: dist.reduce_scatter_tensor(want, v), kind="torch")
    rs.close()


def fused(info, h: Host, coll, nccl: bool, ag_shape, rs_shape) -> None:
    """AG+GEMM and GEMM+RS: op objects (out= given), functions, and torch (NCCL with cuBLAS; cuBLAS alone)."""
    import torch
    import torch.distributed as dist

    from tilescale.ops import ag_gemm, gemm_rs

    ops, W, rank, dt = tilescale.ops, info.world_size, info.rank, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(200 + rank)
    M, K, N = ag_shape
    tag = f"{M}x{K}x{N}"
    if M % (W * 128):
        print(f"AG+GEMM {tag}: skipped (M is not a multiple of 128 x {W} ranks)")
    else:
        a = torch.randn(M // W, K, device="cuda", dtype=dt, generator=g)
        b = torch.randn(K, N, device="cuda", dtype=dt, generator=g) / K ** 0.5
        a_full = torch.empty(M, K, device="cuda", dtype=dt)
        coll.all_gather_into_tensor(a_full, a)
        ref = a_full @ b
        op, c = ops.AGGemm(M, N, K, dt), torch.empty(M, N, device="cuda", dtype=dt)
        _check(f"AG+GEMM {tag} op", op(a, b, out=c), ref, rank, rel=2e-2)
        _check(f"ag_gemm {tag}", ag_gemm(a, b), ref, rank, rel=2e-2)
        h.measure(f"AG+GEMM {tag}: op(a, b, out=c)", lambda: op(a, b, out=c), target=TARGET_AG_GEMM_US, fused=True)
        h.measure(f"AG+GEMM {tag}: ag_gemm(a, b)", lambda: ag_gemm(a, b), fused=True)
        h.measure(f"AG+GEMM {tag}: torch.matmul (cuBLAS) alone", lambda: torch.matmul(a_full, b, out=ref),
                  kind="torch", fused=True)
        if nccl:
            h.measure(f"AG+GEMM {tag}: NCCL all_gather + cuBLAS matmul",
                      lambda: (dist.all_gather_into_tensor(a_full, a), torch.matmul(a_full, b, out=ref)),
                      kind="torch", fused=True)
        op.close()
        del a, b, a_full, ref, c

    M, K, N = rs_shape
    tag = f"{M}x{K}x{N}"
    if M % (W * 128) or K % W:
        print(f"GEMM+RS {tag}: skipped (M not a multiple of 128 x {W} ranks, or K not of {W})")
        return
    kl = K // W
    x = torch.randn(M, kl, device="cuda", dtype=dt, generator=g)
    w = torch.randn(kl, N, device="cuda", dtype=dt, generator=g) / kl ** 0.5
    partial = x @ w
    ref = torch.empty(M // W, N, device="cuda", dtype=dt)
    coll.reduce_scatter_tensor(ref, partial.clone())
    op, out = ops.GemmRS(M, N, kl, dt), torch.empty(M // W, N, device="cuda", dtype=dt)
    _check(f"GEMM+RS {tag} op", op(x, w, out=out), ref, rank, rel=2e-2)
    _check(f"gemm_rs {tag}", gemm_rs(x, w), ref, rank, rel=2e-2)
    h.measure(f"GEMM+RS {tag}: op(x, w, out=o)", lambda: op(x, w, out=out), fused=True)
    h.measure(f"GEMM+RS {tag}: gemm_rs(x, w)", lambda: gemm_rs(x, w), fused=True)
    if nccl:
        h.measure(f"GEMM+RS {tag}: cuBLAS matmul + NCCL reduce_scatter",
                  lambda: (torch.matmul(x, w, out=partial), dist.reduce_scatter_tensor(ref, partial)),
                  kind="torch", fused=True)
    op.close()


def graph_replays(info, h: Host, coll, replays: int) -> dict:
    """A captured AllGather of 1 MiB per rank: host us per replay, and tilescale's Python calls during
    `replays` replays (expected 0) and as many eager calls (> 0); results checked with new inputs and a poisoned
    output before and after."""
    import torch

    from tilescale import testing

    W, rank, dt = info.world_size, info.rank, torch.bfloat16
    rows = MIB // 2 // 1024
    ag = tilescale.ops.AllGather((rows, 1024), dt)
    x = torch.empty(rows, 1024, device="cuda", dtype=dt)
    out = torch.empty(W * rows, 1024, device="cuda", dtype=dt)
    ref = torch.empty_like(out)

    def new_input(i):
        x.copy_(torch.randn(rows, 1024, device="cuda", dtype=dt,
                            generator=torch.Generator(device="cuda").manual_seed(1000 * i + rank)))
        out.fill_(float("nan"))

    def check(what):
        coll.all_gather_into_tensor(ref, x)
        _check(f"captured AllGather: {what}", out, ref, rank, exact=True)

    for i in range(3):                       # eager warm-up: builds and loads everything before the capture
        new_input(i)
        ag(x, out=out)
        check(f"eager call {i}")
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ag(x, out=out)
    new_input(10)
    graph.replay()
    check("first replay")
    row = h.measure("AllGather 1 MiB/rank: graph.replay() of a captured ag(x, out=t)", graph.replay)

    def count(fn):
        tilescale.synchronize()
        with testing.PythonCalls() as calls:
            for i in range(replays):
                fn()
                if (i + 1) % h.args.batch == 0:
                    torch.cuda.synchronize()
        tilescale.synchronize()
        return calls

    in_replays = count(graph.replay)
    in_eager = count(lambda: ag(x, out=out))
    new_input(11)
    graph.replay()
    check("a replay after the counted ones")
    mine = dict(replay=in_replays.count, eager=in_eager.count, replay_top=in_replays.top(), eager_top=in_eager.top())
    every = h.gather(mine)
    g = dict(world_size=W, replays=replays, median=row["median"], p10=row["p10"], p90=row["p90"],
             replay_calls=max(m["replay"] for m in every), eager_calls=min(m["eager"] for m in every),
             per_rank=every)
    g["status"] = replay_status(g)
    del graph
    ag.close()
    return g


def jobs(world_size: int, ag_shape=AG_SHAPE, rs_shape=RS_SHAPE, sms: int = 132) -> list:
    """(jit function, args) of every kernel this benchmark builds, deduplicated."""
    from tilescale.ops import allgather, allreduce, prebuild, reduce_scatter

    return prebuild.unique(allgather.kernels(world_size * MIB, world_size, "bfloat16")
                           + allreduce.kernels(MIB, world_size, "bfloat16", sms, "auto")
                           + reduce_scatter.kernels(MIB, world_size, "bfloat16", sms)
                           + prebuild.ag_gemm_jobs([ag_shape], world_size)
                           + prebuild.gemm_rs_jobs([rs_shape], world_size))


def run(info, args):
    import torch

    from tilescale import staged_collectives
    from tilescale.ops import prebuild
    from tilescale.ops.vectors import sm_count

    W, rank = info.world_size, info.rank
    prebuild.on_local_rank0(jobs(W, args.ag_shape, args.rs_shape, sm_count()))
    coll = staged_collectives.for_cuda()      # references: NCCL, or gloo on host copies when ranks share a GPU
    nccl = not staged_collectives.needs_staging()
    h = Host(info, args)

    def empty():
        pass

    h.measure(ROW_PYTHON, empty, kind="floor")
    collectives(info, h, coll, nccl)
    g = graph_replays(info, h, coll, args.replays)
    if not args.no_fused:
        fused(info, h, coll, nccl, args.ag_shape, args.rs_shape)
    torch.cuda.synchronize()
    if rank == 0:
        env = environment()
        print(mode_line(W, info.shared_gpu, env["gpu"]))
        print_table(f"Host time per eager call (us, the rank of the largest median), {W} rank(s), {env['gpu']}; "
                    f"{args.calls} calls in batches of {args.batch} ({args.fused_calls} in batches of "
                    f"{args.fused_batch} for the fused ops)", HEADER, table_rows(h.rows))
        for line in summary_lines(h.rows) + floor_lines(h.rows) + [replay_line(g)]:
            print(line)
        if g["status"] != "MET":
            for r, m in enumerate(g["per_rank"]):
                print(f"  rank {r}: tilescale functions entered during the replays: {m['replay_top']}; during the "
                      f"eager calls: {m['eager_top']}")
        write_json(args.json, dict(op="host", env=env, shared_gpu=info.shared_gpu, nccl=nccl,
                                   calls=args.calls, batch=args.batch, fused_calls=args.fused_calls,
                                   fused_batch=args.fused_batch, growth_limit=GROWTH_LIMIT, rows=h.rows, graph=g,
                                   floor=floor_summary(h.rows)))
    print(f"[rank {rank}] OK: host benchmark done", flush=True)


def build(world_size):
    a = parse_args(sys.argv[1:])
    for fn, args in jobs(world_size, a.ag_shape, a.rs_shape):
        print(fn.build(*args).library)


def _shape(text: str) -> tuple[int, int, int]:
    try:
        m, k, n = (int(v) for v in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected M,K,N (or MxKxN)") from None
    return m, k, n


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows and the graph's result to this path (rank 0)")
    ap.add_argument("--calls", type=int, default=1000, help="timed calls per collective row (whole batches)")
    ap.add_argument("--batch", type=int, default=20, help="calls between two synchronisations (collectives)")
    ap.add_argument("--fused-calls", type=int, default=100, help="timed calls per AG+GEMM / GEMM+RS row")
    ap.add_argument("--fused-batch", type=int, default=5, help="calls between two synchronisations (fused ops)")
    ap.add_argument("--replays", type=int, default=100, help="graph replays (and eager calls) counted")
    ap.add_argument("--ag-shape", type=_shape, default=AG_SHAPE, help="AG+GEMM M,K,N (default %(default)s)")
    ap.add_argument("--rs-shape", type=_shape, default=RS_SHAPE, help="GEMM+RS M,K,N (default %(default)s)")
    ap.add_argument("--no-fused", action="store_true", help="skip AG+GEMM and GEMM+RS")
    a = ap.parse_args(argv)
    for name in ("calls", "batch", "fused_calls", "fused_batch", "replays"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1")
    return a


if __name__ == "__main__":
    a = parse_args(sys.argv[1:])
    tilescale.testing.example_main(lambda info: run(info, a), build)
