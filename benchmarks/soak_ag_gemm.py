"""Soak: many iterations of the fused AllGather+GEMM (tilescale.ops.AGGemm) on every rank, checked against
torch at regular intervals, with GPU memory recorded at each check and required to stay flat.

    GPUS=4 bash launch.sh benchmarks/soak_ag_gemm.py [--iters 10000] [--check-every 500] [--json soak.json]

torch equivalent of one iteration (A sharded by rows, M/W x K per rank; B local, K x N)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, a_local); C = A @ B

A check (at iteration 0 and every --check-every iterations): new random inputs on every rank, C poisoned
with NaN, one call, compared with NCCL all_gather + torch.matmul (max |C - ref| / max |ref| < 2e-2, no
NaN left), on every rank; then torch.cuda.memory_allocated / memory_reserved and the device's used memory
(torch.cuda.mem_get_info) are recorded. Between checks the op runs back to back on the same inputs.
The run fails (every rank raises) if a check fails or memory grows past the tolerances after the first
block of iterations (what that block takes once, allocator pools and library workspaces, is reported).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import environment, print_table, write_json  # noqa: E402

import tilescale  # noqa: E402

MIB = 1 << 20


def parse_shape(s: str) -> tuple[int, int, int]:
    try:
        M, K, N = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {s!r}, expected MxKxN, e.g. 4096x4096x2048") from None
    return M, K, N


def inputs(rank: int, check: int, M: int, K: int, N: int, W: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1_000_003 * check + rank)
    a = torch.randn(M // W, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    return a, b


def memory() -> dict:
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"allocated_mib": torch.cuda.memory_allocated() / MIB, "reserved_mib": torch.cuda.memory_reserved() / MIB,
            "device_used_mib": (total - free) / MIB}


def checked_call(op, a, b, c, dtype) -> float:
    """One call on poisoned output, compared with NCCL + torch.matmul; returns the relative error (inf if
    NaN is left anywhere)."""
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    M, K = op.M, op.K
    c.fill_(float("nan"))
    op(a, b, out=c)
    a_full = torch.empty(M, K, device="cuda", dtype=dtype)
    dist.all_gather_into_tensor(a_full, a)
    ref = (a_full @ b).float()
    torch.cuda.synchronize()
    got = c.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).abs().max() / ref.abs().max()).item()


def agree_max(x: float) -> float:
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def run(info, args):
    import torch

    from tilescale.ops import prebuild

    M, K, N = args.shape
    W, rank = info.world_size, info.rank
    dtype = getattr(torch, args.dtype)
    prebuild.on_local_rank0(prebuild.ag_gemm_jobs([(M, K, N)], W, args.dtype))
    op = tilescale.ops.AGGemm(M, N, K, dtype)
    c = torch.empty(M, N, device="cuda", dtype=dtype)
    checks = []
    it, us = 0, 0.0
    t_start = time.monotonic()
    for n in range(args.iters // args.check_every + 1):
        a, b = inputs(rank, n, M, K, N, W, dtype)
        err = agree_max(checked_call(op, a, b, c, dtype))
        if args.empty_cache:
            torch.cuda.empty_cache()
        mem = {k: agree_max(v) for k, v in memory().items()}           # the largest over ranks
        rec = {"check": n, "iter": it, "max_rel_err": err, **mem}
        if n:
            rec["us_per_iter"] = us
        checks.append(rec)
        if rank == 0:
            print(f"soak: iteration {it:6d}: max rel err {err:.2e}, allocated {mem['allocated_mib']:.1f} MiB, "
                  f"device used {mem['device_used_mib']:.0f} MiB" + (f", {us:.1f} us/iter" if n else ""), flush=True)
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] soak: iteration {it}: AG+GEMM differs from torch (max relative "
                                 f"error over ranks {err:.3g}, or NaN left in the output)")
        if it >= args.iters:
            break
        steps = min(args.check_every, args.iters - it)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(steps):
            op(a, b, out=c)
        e.record()
        e.synchronize()
        us = agree_max(s.elapsed_time(e) * 1e3 / steps)
        it += steps
    wall = time.monotonic() - t_start

    # growth after the first block of iterations (which may allocate once: allocator pools, NCCL, cuBLAS)
    base = checks[1] if len(checks) > 2 else checks[0]
    keys = ("allocated_mib", "reserved_mib", "device_used_mib")
    drift = {k: max(r[k] for r in checks) - base[k] for k in keys}
    warmup = {k: base[k] - checks[0][k] for k in keys}
    steady = (drift["allocated_mib"] <= args.alloc_tolerance_mib
              and drift["device_used_mib"] <= args.device_tolerance_mib)
    if rank == 0:
        rows = [[r["iter"], f"{r['max_rel_err']:.2e}", f"{r['allocated_mib']:.1f}", f"{r['reserved_mib']:.1f}",
                 f"{r['device_used_mib']:.0f}", f"{r['us_per_iter']:.1f}" if "us_per_iter" in r else "-"]
                for r in checks]
        print_table(f"AG+GEMM soak, {M}x{K}x{N} {args.dtype}, {W} x {environment()['gpu']}: {it} iterations in "
                    f"{wall:.1f} s (checks included); figures: max over ranks",
                    ["iteration", "max rel err", "allocated MiB", "reserved MiB", "device used MiB", "us/iter"], rows)
        print(f"memory taken by the first {base['iter']} iterations: allocated {warmup['allocated_mib']:+.1f} MiB, "
              f"reserved {warmup['reserved_mib']:+.1f} MiB, device used {warmup['device_used_mib']:+.0f} MiB")
        print(f"memory growth after that (max over checks - iteration {base['iter']}): allocated "
              f"{drift['allocated_mib']:+.1f} "
              f"MiB (tolerance {args.alloc_tolerance_mib}), reserved {drift['reserved_mib']:+.1f} MiB, device used "
              f"{drift['device_used_mib']:+.0f} MiB (tolerance {args.device_tolerance_mib}): "
              f"{'STEADY' if steady else 'GROWING'}")
        write_json(args.json, dict(env=environment(), shape=[M, K, N], dtype=args.dtype, iters=it,
                                   check_every=args.check_every, wall_s=wall, checks=checks, drift_mib=drift,
                                   drift_from_iter=base["iter"], warmup_mib=warmup,
                                   steady=steady, max_rel_err=max(r["max_rel_err"] for r in checks)))
    if not steady:
        raise AssertionError(f"[rank {rank}] soak: GPU memory grew over {it} iterations: {drift}")
    print(f"[rank {rank}] OK: soak of {it} iterations, {len(checks)} checks, memory steady", flush=True)


def build(world_size, args):
    from tilescale.ops import prebuild

    for fn, fargs in prebuild.ag_gemm_jobs([args.shape], world_size, args.dtype):
        print(fn.build(*fargs).library)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--check-every", type=int, default=500)
    ap.add_argument("--shape", type=parse_shape, default=(4096, 4096, 2048), help="MxKxN (default 4096x4096x2048)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--alloc-tolerance-mib", type=float, default=1.0,
                    help="allowed growth of torch.cuda.memory_allocated over the run")
    ap.add_argument("--device-tolerance-mib", type=float, default=32.0,
                    help="allowed growth of the device's used memory (torch.cuda.mem_get_info) over the run")
    ap.add_argument("--empty-cache", action="store_true", help="torch.cuda.empty_cache() before each memory reading")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.iters < 1 or a.check_every < 1:
        ap.error(f"--iters and --check-every: got {a.iters} and {a.check_every}, expected positive integers")
    tilescale.testing.example_main(lambda info: run(info, a), lambda ws: build(ws, a))
