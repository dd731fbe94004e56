"""AG+GEMM and GEMM+RS: tilescale's fused, overlapped kernels vs NCCL + cuBLAS and PyTorch async-TP.

    GPUS=4 bash launch.sh benchmarks/bench_fused.py --op ag_gemm [--json out.json]
    GPUS=4 bash launch.sh benchmarks/bench_fused.py --op gemm_rs [--json out.json]

Shapes are those of the baseline table in the project's DEVICE.md (bf16):
  AG+GEMM: A sharded by rows (M/W x K per rank), B local (K x N); C = AllGather(A) @ B (M x N).
  GEMM+RS: X (M x K/W) @ W (K/W x N) -> partial (M x N) -> reduce-scatter by rows (M/W x N).
Columns (microseconds, slowest rank): NCCL alone, cuBLAS alone, NCCL then cuBLAS, async-TP
(torch.ops.symm_mem.fused_*), tilescale fused, tilescale's GEMM alone (no waiting); ideal = max(NCCL
alone, cuBLAS alone); ratio = tilescale / ideal (target <= 1.10); GEMM eff = cuBLAS / our GEMM alone.
Every shape is checked against torch before it is timed. ``--timing`` says how the columns of a shape are timed:
``interleaved`` (the default: one call of each column after another, each call between its own
events, timing.time_interleaved, so that every column runs in the same power and thermal state of the GPU),
``turns`` (each repeat times every column's calls back to back, one column after the other,
timing.time_ops; the column timed after a light one, such as cuBLAS after NCCL, runs on a cooler GPU: the same
kernels measure 0.92 or 0.99 of cuBLAS by the order of the columns) or ``sequential`` (each
column's repeats before the next column's). ``--reverse`` times the columns in the
reverse order. ``--group-size G``: the world split into groups of G consecutive ranks (the TP groups of a DP x TP
job), every op, collective and async-TP call over this rank's group, all groups side by side; W is then G, and a
column's time the slowest rank's of any group (compare with a run of a world of G).
"""
import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import (  # noqa: E402
    environment,
    print_table,
    time_interleaved,
    time_op,
    time_ops,
    write_json,
    write_markdown,
)

import tilescale  # noqa: E402

AG_SHAPES = [(4096, 8192, 2048), (4096, 8192, 7168), (8192, 8192, 2048), (8192, 8192, 7168),
             (16384, 8192, 2048), (16384, 8192, 7168), (8192, 4096, 2752)]
RS_SHAPES = [(8192, 8192, 8192), (16384, 8192, 8192), (8192, 28672, 8192)]
# small M (prefill chunks, decode batches): M total rows, K = 8192, both ops; --no-small leaves them out
SMALL_SHAPES = [(M, 8192, N) for M in (512, 1024, 2048) for N in (2048, 7168)]
TIMING = "interleaved"   # --timing (see timer)
REVERSE = False          # --reverse: the columns timed in the reverse order


def _async_tp(group=None):
    """(fused_all_gather_matmul, fused_matmul_reduce_scatter, group name) where this torch has them (over `group`:
    None, the world)."""
    import torch
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory as symm_mem  # registers torch.ops.symm_mem

        name = (group or dist.group.WORLD).group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(name)
        return torch.ops.symm_mem.fused_all_gather_matmul, torch.ops.symm_mem.fused_matmul_reduce_scatter, name
    except Exception as e:  # noqa: BLE001
        print(f"async-TP unavailable: {e}")
        return None, None, None


def timer(fns: dict, iters: int) -> dict:
    """{name: us per call} by ``--timing`` (module docstring), the columns in the order of `fns` (reversed with
    ``--reverse``); interleaved timing adds ``_idle``, the share of a round the GPU spent between calls."""
    if REVERSE:
        fns = dict(reversed(fns.items()))
    if TIMING == "sequential":
        return {name: time_op(fn, iters=iters) for name, fn in fns.items()}
    if TIMING == "interleaved":
        return time_interleaved(fns, iters=iters)
    return time_ops(fns, iters=iters)


def _works(name: str, fn) -> bool:
    """Whether one call of torch's async-TP op `fn` runs (it may not in this torch or on this machine)."""
    try:
        fn()
        return True
    except Exception as e:  # noqa: BLE001
        print(f"async-TP {name} failed: {e}")
        return False


def run_ag_gemm(info, shapes, dtype, quick):
    import torch
    import torch.distributed as dist

    W, rank, pg = info.world_size, info.rank, info.group
    ag_mm, _, group = _async_tp(pg)
    rows = []
    for M, K, N in shapes:
        if M % (W * 128):
            continue
        g = torch.Generator(device="cuda").manual_seed(rank)
        a = torch.randn(M // W, K, device="cuda", dtype=dtype, generator=g)
        b = (torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / K ** 0.5)
        gk = {} if pg is None else {"group": pg}      # (an older tree, compare_fused.sh: no groups)
        op = tilescale.ops.AGGemm(M, N, K, dtype, **gk)      # its path: the committed table (ops/fused_paths.py)
        fused = getattr(op, "fused", True)             # (an older tree, compare_fused.sh: always fused)
        fop = op if fused else tilescale.ops.AGGemm(M, N, K, dtype, fused=True, **gk)   # the fused kernels
        c = torch.empty(M, N, device="cuda", dtype=dtype)
        a_full = torch.empty(M, K, device="cuda", dtype=dtype)
        dist.all_gather_into_tensor(a_full, a, group=pg)
        ref = a_full @ b
        for o in dict.fromkeys((op, fop)):    # the same order on every rank (a set's order follows ids)
            c.fill_(float("nan"))
            o(a, b, out=c)
            torch.cuda.synchronize()
            err = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            if not err < 2e-2:
                raise AssertionError(f"[rank {rank}] ag_gemm {M}x{K}x{N} (fused={o is fop}): relative error "
                                     f"{err:.3g} vs torch")
        it = 5 if quick else 20
        # kernels that take the rows at run time see C as (W, rows, N) and A_full as (W, rows, K)
        runtime_rows = hasattr(fop, "chunk_rows")
        c_k = c.view(W, M // W, N) if runtime_rows else c
        if runtime_rows:   # the op's own launches (its C entry points), the peers' GEMM on flags all set
            landed = torch.ones_like(fop.arrived) if W > 1 else None
            slot = fop.gathered()[rank * (M // W):(rank + 1) * (M // W)] if W > 1 else a

            def ts_gemm():
                stream = torch.cuda.current_stream().cuda_stream
                fop._gemm_own(slot, b, c, stream)
                if W > 1:
                    arrived, fop.arrived = fop.arrived, landed
                    try:
                        fop._gemm_peers(b, c, stream)
                    finally:
                        fop.arrived = arrived
        elif W > 1:   # the GEMMs alone: every chunk marked as arrived, both launches reading the gathered buffer
            landed = torch.ones_like(fop.arrived)
            slot = fop.gathered()[rank * (M // W):(rank + 1) * (M // W)]
            full_k = fop.gathered()

            def ts_gemm():
                fop.kernel_own(slot, b, c_k, *fop.tail[0])
                fop.kernel(full_k, b, c_k, landed, *fop.tail[1])
        else:       # the GEMM of the own rows is all there is
            def ts_gemm():
                fop.kernel_own(a, b, c_k, *fop.tail[0])
        fns = dict(
            nccl=lambda: dist.all_gather_into_tensor(a_full, a, group=pg),
            cublas=lambda: torch.matmul(a_full, b, out=ref),
            nccl_cublas=lambda: (dist.all_gather_into_tensor(a_full, a, group=pg), torch.matmul(a_full, b, out=ref)),
            tilescale=lambda: op(a, b, out=c),
            ts_gemm=ts_gemm,
        )
        if fop is not op:   # the op took the unfused path: its fused kernels timed too (benchmarks/fused_paths.py)
            fns["ts_fused"] = lambda: fop(a, b, out=c)
        if ag_mm is not None and _works("ag_mm", lambda: ag_mm(a, [b], 0, group)):
            fns["async_tp"] = lambda: ag_mm(a, [b], 0, group)
        t = timer(fns, it)
        rows.append(dict(op="ag_gemm", M=M, K=K, N=N, path="fused" if fused else "unfused", **t))
        for o in dict.fromkeys((op, fop)):    # the same order on every rank (a set's order follows ids)
            o.close()
    return rows


def run_gemm_rs(info, shapes, dtype, quick):
    import torch
    import torch.distributed as dist

    W, rank, pg = info.world_size, info.rank, info.group
    _, mm_rs, group = _async_tp(pg)
    rows = []
    for M, K, N in shapes:
        if M % (W * 128) or K % W:
            continue
        kl = K // W
        g = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randn(M, kl, device="cuda", dtype=dtype, generator=g)
        w = torch.randn(kl, N, device="cuda", dtype=dtype, generator=g) / kl ** 0.5
        op = tilescale.ops.GemmRS(M, N, kl, dtype, **({} if pg is None else {"group": pg}))
        out = torch.empty(M // W, N, device="cuda", dtype=dtype)
        partial = x @ w
        ref = torch.empty(M // W, N, device="cuda", dtype=dtype)
        dist.reduce_scatter_tensor(ref, partial, group=pg)
        op(x, w, out=out)
        torch.cuda.synchronize()
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] gemm_rs {M}x{K}x{N}: relative error {err:.3g} vs NCCL")
        it = 5 if quick else 20
        fns = dict(
            nccl=lambda: dist.reduce_scatter_tensor(ref, partial, group=pg),
            cublas=lambda: torch.matmul(x, w, out=partial),
            nccl_cublas=lambda: (torch.matmul(x, w, out=partial), dist.reduce_scatter_tensor(ref, partial, group=pg)),
            tilescale=lambda: op(x, w, out=out),
            ts_gemm=_gemm_alone(op, x, w),
        )
        if mm_rs is not None and _works("mm_rs", lambda: mm_rs(x, w, "sum", 0, group)):
            fns["async_tp"] = lambda: mm_rs(x, w, "sum", 0, group)
        t = timer(fns, it)
        rows.append(dict(op="gemm_rs", M=M, K=K, N=N, **t))
        op.close()
    return rows


def _gemm_alone(op, x, w):
    """A call of GemmRS's GEMM without its communication, on this rank's GPU: the pull path's GEMM with its counts
    in scratch words; the push path's kernel as rank 0 of W runs it with its pushes into this GPU's memory
    (``gemm_rs_push_loopback_kernel``; at world size 1 the same work as the op)."""
    import torch

    from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_loopback_kernel

    W = op.world_size
    xv = x.view(W, x.shape[0] // W, op.K) if W > 1 else x        # (as the kernels see it)
    if op.path == "pull":
        scratch, calls = torch.zeros_like(op.done), torch.zeros_like(op.gemm_counters)
        return lambda: op.gemm(xv, w, op.P, scratch, calls)
    k = gemm_rs_push_loopback_kernel(*op.gemm_args[:11])      # (a group's team, last: the loopback has no peers)
    R, arrived = torch.zeros_like(op.R), torch.zeros_like(op.arrived)
    args = (xv, w, torch.empty(x.shape[0] // W, op.N, dtype=op.dtype, device=x.device), R, arrived,
            torch.zeros_like(op.gemm_counters), R, arrived, torch.zeros_like(op.pushed))  # (Rp, Ap: unused)
    return lambda: k(*args)


def target(r: dict) -> tuple[str, bool]:
    """The row's target (tilescale's overlap goals on several GPUs) and whether this run met it: small-M rows never
    more than 3% slower than the faster unfused path; AG+GEMM faster than NCCL+cuBLAS and async-TP and <= 1.10 x ideal
    (N = 7168) or 1.25 x; GEMM+RS <= 1.15 x ideal and >= 1.10x faster than async-TP."""
    ts, atp = r["tilescale"], r.get("async_tp")
    best = min(r["nccl_cublas"], atp or math.inf)
    if (r["M"], r["K"], r["N"]) in SMALL_SHAPES:
        return "<= 1.03 x best unfused", ts <= 1.03 * best
    if r["op"] == "ag_gemm":
        bound = 1.10 if r["N"] == 7168 else 1.25
        return f"< both, <= {bound:.2f} x ideal", ts < best and r["ratio_to_ideal"] <= bound
    return "<= 1.15 x ideal, >= 1.10x async-TP", r["ratio_to_ideal"] <= 1.15 and bool(atp) and atp / ts >= 1.10


def report(rows, W, title) -> str:
    """Print the table of `rows` (adding their ratios and targets); returns it."""
    table = []
    for r in rows:
        ideal = max(r["nccl"], r["cublas"])
        r["ideal"] = ideal
        r["ratio_to_ideal"] = r["tilescale"] / ideal
        r["gemm_eff"] = r["cublas"] / r["ts_gemm"]
        r["speedup_vs_nccl_cublas"] = r["nccl_cublas"] / r["tilescale"]
        atp = r.get("async_tp")
        if atp:
            r["speedup_vs_async_tp"] = atp / r["tilescale"]
        r["target"], r["target_met"] = target(r)
        M, K, N = r["M"], r["K"], r["N"]
        flop = 2.0 * M * N * (K if r["op"] == "ag_gemm" else K // W)
        table.append([f"{M}x{K}x{N}", f"{r['nccl']:.0f}", f"{r['cublas']:.0f}", f"{r['nccl_cublas']:.0f}",
                      f"{atp:.0f}" if atp else "-",
                      f"{r['tilescale']:.0f}" + (f" (fused {r['ts_fused']:.0f})" if "ts_fused" in r else ""),
                      f"{ideal:.0f}",
                      f"{r['ratio_to_ideal']:.2f}", f"{flop / (r['tilescale'] * 1e-6) / 1e12:.0f}",
                      f"{r['gemm_eff']:.2f}", f"{r['speedup_vs_nccl_cublas']:.2f}x",
                      f"{r['speedup_vs_async_tp']:.2f}x" if atp else "-",
                      f"{'met' if r['target_met'] else 'MISSED'} ({r['target']})"])
    text = print_table(title, ["MxKxN", "NCCL", "cuBLAS", "NCCL+cuBLAS", "async-TP", "tilescale", "ideal",
                               "ts/ideal", "TFLOP/s", "GEMM eff", "vs NCCL+cuBLAS", "vs async-TP", "target"], table)
    met = sum(r["target_met"] for r in rows)
    lines = [f"targets met on {met} of {len(rows)} rows"]
    if any("ts_fused" in r for r in rows):
        lines.append("(fused N): the op took NCCL then cuBLAS by tilescale/ops/fused_paths.json; its fused kernels "
                     "took N us")
    idle = [r["_idle"] for r in rows if "_idle" in r]
    if idle:
        lines.append(f"interleaved timing: the GPU idle between calls for at most {max(idle):.1%} of a round")
    print("\n".join(lines))
    return text + "\n\n" + "\n".join(lines) + "\n"


def grouped(info, size: int):
    """`info` as the benchmark reads it: world_size, rank and group of this rank's group of `size` consecutive ranks
    (0: the world, group None); ``first``: whether this rank reports (the world's rank 0)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    first = info.rank == 0
    if not size:
        return SimpleNamespace(world_size=info.world_size, rank=info.rank, group=None, first=first)
    if size < 1 or info.world_size % size:
        raise SystemExit(f"--group-size {size}: expected a divisor of the world size {info.world_size}")
    groups = [dist.new_group(list(range(s, s + size))) for s in range(0, info.world_size, size)]   # (every rank
    return SimpleNamespace(world_size=size, rank=info.rank % size, group=groups[info.rank // size], first=first)
    # makes every group, in the same order, as torch requires)


def group_teams(world: int, size: int) -> list:
    """The teams of the groups of `size` consecutive ranks (an older tree, compare_fused.sh, has no teams)."""
    from tilescale.runtime.team import Team

    return [Team(s, 1, size) for s in range(0, world, size)]


def kernel_jobs(op: str, ag_shapes, rs_shapes, W: int, dtype: str, teams) -> list:
    """(jit function, args) of the kernels the benchmark's ops build (`op`: ag_gemm, gemm_rs or both), for each of
    `teams` (None: the world; a group's kernels take its team, so every group's are listed: the prebuild's local
    rank 0 compiles them all)."""
    from tilescale.ops import prebuild
    from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_kernel, gemm_rs_push_loopback_kernel

    jobs = []
    for t in teams:
        team = {} if t is None else {"team": t}
        if op in ("ag_gemm", "both"):
            jobs += prebuild.ag_gemm_jobs(ag_shapes, W, dtype, **team)
        if op in ("gemm_rs", "both"):
            rs = prebuild.gemm_rs_jobs(rs_shapes, W, dtype, **team)       # + _gemm_alone's loopback (no team)
            jobs += rs + [(gemm_rs_push_loopback_kernel, a[:11]) for fn, a in rs if fn is gemm_rs_push_kernel]
    return prebuild.unique(jobs)


def run(info, args):
    import torch

    from tilescale.ops import prebuild

    dtype = getattr(torch, args.dtype)
    world = info.world_size
    info = grouped(info, args.group_size)
    W = info.world_size
    where = f"{W} x {environment()['gpu']}" if W == world else f"groups of {W} of {world} x {environment()['gpu']}"
    small = [] if args.no_small else SMALL_SHAPES
    ag_shapes, rs_shapes = AG_SHAPES[:args.max_shapes] + small, RS_SHAPES[:args.max_shapes] + small
    jobs = kernel_jobs(args.op, ag_shapes, rs_shapes, W, args.dtype,
                       [None] if info.group is None else group_teams(world, W))
    prebuild.on_local_rank0(jobs)  # local rank 0 compiles every kernel in parallel; the others load them
    all_rows, tables = [], []
    if args.op in ("ag_gemm", "both"):
        rows = run_ag_gemm(info, ag_shapes, dtype, args.quick)
        if info.first:
            tables.append(report(rows, W, f"AG+GEMM {args.dtype}, {where} (us)"))
        all_rows += rows
    if args.op in ("gemm_rs", "both"):
        rows = run_gemm_rs(info, rs_shapes, dtype, args.quick)
        if info.first:
            tables.append(report(rows, W, f"GEMM+RS {args.dtype}, {where} (us)"))
        all_rows += rows
    if info.first:
        env = environment()
        write_json(args.json, dict(env=env, dtype=args.dtype, timing=TIMING, reverse=REVERSE,
                                   group_size=args.group_size or world, rows=all_rows))
        if args.json:   # the table beside the JSON (benchmarks/results/<machine>/fused.md)
            write_markdown(str(Path(args.json).with_suffix(".md")), env, tables)
    print(f"[rank {torch.distributed.get_rank()}] OK: fused benchmark done", flush=True)


def build(world_size):
    from tilescale.ops import prebuild

    for fn, args in prebuild.ag_gemm_jobs(AG_SHAPES[:1], world_size) + prebuild.gemm_rs_jobs(RS_SHAPES[:1], world_size):
        print(fn.build(*args).library)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", choices=["ag_gemm", "gemm_rs", "both"], default="both")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--max-shapes", type=int, default=99, help="the first N of the large shapes")
    ap.add_argument("--no-small", action="store_true", help="leave out the small-M rows")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--timing", choices=["turns", "interleaved", "sequential"], default=TIMING,
                    help="how the columns of a shape are timed (module docstring)")
    ap.add_argument("--reverse", action="store_true", help="time the columns in the reverse order")
    ap.add_argument("--group-size", type=int, default=0,
                    help="run over groups of this many consecutive ranks, side by side (module docstring)")
    a = ap.parse_args()
    TIMING, REVERSE = a.timing, a.reverse
    tilescale.testing.example_main(lambda info: run(info, a), build)
