"""The collectives of tilescale vs NCCL (torch.distributed), in one run: AllReduce (one-shot, two-shot),
ReduceScatter, AllToAll (equal splits) and Broadcast.

    GPUS=2 bash launch.sh benchmarks/bench_collectives.py [--json out.json] [--write-tuning tuning.json]

Sizes are bytes of each rank's input, 1 KiB .. 256 MiB in powers of 4 (bf16); every op writes into a
tensor of the caller's, as torch does (AllToAll: its kernel's output buffer, then one local copy). Times
are the slowest rank's (benchmarks/timing.py). Bus bandwidth as nccl-tests defines it: AllReduce 2 (W-1)/W x bytes / time,
ReduceScatter and AllToAll (W-1)/W x bytes / time, Broadcast bytes / time. Each size is checked against
NCCL before it is timed. The JSON holds every row and, per collective, ``wins``: the [min_bytes,
max_bytes] ranges of consecutive measured sizes where tilescale is at least 3% faster than NCCL.
``--write-tuning PATH`` writes the table for the plan selector (tilescale/plan/tuning.py; message sizes
as its Request.msg_bytes: the tensor for allreduce and broadcast, the whole input for reduce-scatter and
all-to-all, which is what this benchmark's sizes are)::

    {"gpu": ..., "world_size": W, "collectives": {"reduce_scatter": {"algo": "direct", "ranges": [[lo, hi]]},
     ..., "allreduce": [{"algo": "one_shot", "ranges": [...]}, {"algo": "two_shot", "ranges": [...]}]}}

(allreduce: each kernel where it is the faster of the two and beats NCCL by >= 3%).
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilescale  # noqa: E402
from timing import environment, fmt_bytes, print_table, time_op, write_json  # noqa: E402

WIN = 1.03          # "ours wins" means at least 3% faster
COLLECTIVES = ("all_reduce_one_shot", "all_reduce_two_shot", "reduce_scatter", "all_to_all", "broadcast")
ALGO = {"all_reduce_one_shot": "one_shot", "all_reduce_two_shot": "two_shot", "reduce_scatter": "direct",
        "all_to_all": "push", "broadcast": "pull"}


def busbw(name: str, nbytes: int, W: int, us: float) -> float:
    factor = {"reduce_scatter": (W - 1) / W, "all_to_all": (W - 1) / W, "broadcast": 1.0}.get(name, 2 * (W - 1) / W)
    return factor * nbytes / (us * 1e-6) / 1e9


def win_ranges(rows: list[dict], ratio: float = WIN) -> list[list[int]]:
    """[[lo, hi], ...]: runs of consecutive measured sizes (rows sorted by bytes) with speedup >= ratio."""
    out, cur = [], None
    for r in sorted(rows, key=lambda r: r["bytes"]):
        if r["speedup"] >= ratio:
            cur = [r["bytes"], r["bytes"]] if cur is None else [cur[0], r["bytes"]]
        elif cur is not None:
            out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return out


def tuning_table(rows: list[dict], gpu: str, W: int) -> dict:
    """The plan selector's table (tilescale.plan.tuning): per collective, the message ranges where ours
    wins; allreduce lists each kernel where it is the faster of the two and beats NCCL."""
    by = {c: [r for r in rows if r["collective"] == c] for c in COLLECTIVES}
    table = {}
    for c in ("reduce_scatter", "all_to_all", "broadcast"):
        if by[c]:
            table[c] = {"algo": ALGO[c], "ranges": win_ranges(by[c])}
    one = {r["bytes"]: r for r in by["all_reduce_one_shot"]}
    two = {r["bytes"]: r for r in by["all_reduce_two_shot"]}
    best = []
    for nb in sorted(set(one) | set(two)):
        b = min((r for r in (one.get(nb), two.get(nb)) if r is not None), key=lambda r: r["tilescale_us"])
        best.append(dict(bytes=nb, speedup=b["speedup"], algo=ALGO[b["collective"]]))
    if best:
        table["allreduce"] = [{"algo": a, "ranges": win_ranges([r if r["algo"] == a else dict(r, speedup=0.0)
                                                                for r in best])}
                              for a in ("one_shot", "two_shot")]
    return {"gpu": gpu, "world_size": W, "collectives": table}


def make(name: str, nbytes: int, W: int, rank: int):
    """(ours, nccl, check) callables for one collective and size (bf16)."""
    import torch
    import torch.distributed as dist

    from tilescale.ops.all_to_all import AllToAll
    from tilescale.ops.allreduce import AllReduce
    from tilescale.ops.broadcast import Broadcast
    from tilescale.ops.reduce_scatter import ReduceScatter

    n = nbytes // 2
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    x = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    if name.startswith("all_reduce"):
        op = AllReduce((n,), torch.bfloat16, algo=ALGO[name])
        out, ref = torch.empty_like(x), x.clone()
        ours, nccl = (lambda: op(x, out=out)), (lambda: dist.all_reduce(ref))

        def check():
            ours()
            r = x.clone()
            dist.all_reduce(r)
            torch.cuda.synchronize()
            if not torch.allclose(out.float(), r.float(), atol=0.06 * W, rtol=0.02):
                raise AssertionError(f"[rank {rank}] {name} of {fmt_bytes(nbytes)} differs from NCCL")
    elif name == "reduce_scatter":
        n -= n % W
        x = x[:n]
        op = ReduceScatter((n,), torch.bfloat16)
        out, ref = torch.empty(n // W, device="cuda", dtype=torch.bfloat16), torch.empty(n // W, device="cuda",
                                                                                          dtype=torch.bfloat16)
        ours, nccl = (lambda: op(x, out=out)), (lambda: dist.reduce_scatter_tensor(ref, x))

        def check():
            ours()
            nccl()
            torch.cuda.synchronize()
            if not torch.allclose(out.float(), ref.float(), atol=0.06 * W, rtol=0.02):
                raise AssertionError(f"[rank {rank}] reduce_scatter of {fmt_bytes(nbytes)} differs from NCCL")
    elif name == "all_to_all":
        rows = max(W, n // 64 // W * W)
        cols = n // rows
        x = x[:rows * cols].view(rows, cols)
        op = AllToAll((rows, cols), torch.bfloat16)
        out, ref = torch.empty_like(x), torch.empty_like(x)
        # into the caller's tensor, as all_to_all_single (and the plan selector) does: the kernel writes this
        # op's symmetric buffer, then one local copy
        ours, nccl = (lambda: op(x, out=out)), (lambda: dist.all_to_all_single(ref, x))

        def check():
            got = ours()
            nccl()
            torch.cuda.synchronize()
            if not torch.equal(got, ref):
                raise AssertionError(f"[rank {rank}] all_to_all of {fmt_bytes(nbytes)} differs from NCCL")
    else:
        op = Broadcast((n,), torch.bfloat16, 0)
        ref = x.clone()
        ours, nccl = (lambda: op(x)), (lambda: dist.broadcast(ref, 0))

        def check():
            ours()
            nccl()
            torch.cuda.synchronize()
            if not torch.equal(x, ref):
                raise AssertionError(f"[rank {rank}] broadcast of {fmt_bytes(nbytes)} differs from NCCL")
    return op, ours, nccl, check


def run(info, args):
    from tilescale import symm
    from tilescale.ops import prebuild
    from tilescale.ops.vectors import sm_count

    W, rank = info.world_size, info.rank
    names = [c for c in COLLECTIVES if c in args.ops.split(",")]
    sizes = [1 << k for k in range(10, 29, args.step) if (1 << k) <= args.max_bytes]
    prebuild.on_local_rank0(prebuild.collective_jobs(W, sizes, ("bfloat16",), sm_count()))
    heap = symm.heap_size()
    rows = []
    for name in names:
        for nbytes in sizes:
            need = {"all_reduce_one_shot": 2 * W * nbytes, "all_reduce_two_shot": 3 * nbytes,
                    "reduce_scatter": 2 * nbytes, "all_to_all": nbytes, "broadcast": 2 * nbytes}[name]
            if need > heap // 2:
                if rank == 0:
                    print(f"{name} {fmt_bytes(nbytes)}: skipped (needs {fmt_bytes(need)} of symmetric heap)")
                continue
            op, ours, nccl, check = make(name, nbytes, W, rank)
            check()
            iters = 50 if nbytes <= 1 << 20 else (20 if nbytes <= 32 << 20 else 8)
            t_ts = time_op(ours, iters=iters, repeats=5)
            t_nccl = time_op(nccl, iters=iters, repeats=5)
            rows.append(dict(collective=name, bytes=nbytes, tilescale_us=t_ts, nccl_us=t_nccl,
                             tilescale_busbw=busbw(name, nbytes, W, t_ts), nccl_busbw=busbw(name, nbytes, W, t_nccl),
                             speedup=t_nccl / t_ts))
            op.close()
    if rank == 0:
        gpu = environment()["gpu"]
        for name in names:
            rs = [r for r in rows if r["collective"] == name]
            print_table(f"{name} bf16, {W} x {gpu} (time = slowest rank; busbw in GB/s)",
                        ["bytes/rank", "tilescale us", "NCCL us", "speedup", "tilescale busbw", "NCCL busbw"],
                        [[fmt_bytes(r["bytes"]), f"{r['tilescale_us']:.1f}", f"{r['nccl_us']:.1f}",
                          f"{r['speedup']:.2f}x", f"{r['tilescale_busbw']:.1f}", f"{r['nccl_busbw']:.1f}"] for r in rs])
            wins = win_ranges(rs)
            print(f"{name}: tilescale >= 3% faster at " +
                  (", ".join(f"{fmt_bytes(lo)}..{fmt_bytes(hi)}" for lo, hi in wins) if wins else "no size"))
        wins = {name: win_ranges([r for r in rows if r["collective"] == name]) for name in names}
        tuning = tuning_table(rows, gpu, W)
        write_json(args.json, dict(op="collectives", env=environment(), rows=rows, wins=wins, tuning=tuning))
        if args.write_tuning:
            os.makedirs(os.path.dirname(os.path.abspath(args.write_tuning)), exist_ok=True)
            with open(args.write_tuning, "w") as f:
                json.dump(tuning, f, indent=1)
            print(f"tuning table: {args.write_tuning}")
    print(f"[rank {rank}] OK: collectives benchmark done", flush=True)


def build(world_size):
    from tilescale.ops import prebuild

    for fn, args in prebuild.collective_jobs(world_size, [1 << k for k in range(10, 29, 2)], ("bfloat16",)):
        print(fn.build(*args).library)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--write-tuning", help="write the tuning table (where ours wins) to this path")
    ap.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated subset of " + ", ".join(COLLECTIVES))
    ap.add_argument("--step", type=int, default=2, help="size step in powers of two (2: powers of 4)")
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    a = ap.parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), build)
