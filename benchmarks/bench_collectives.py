"""The collectives of tilescale vs NCCL (torch.distributed), in one run: every algorithm of every collective
that tilescale.ops registers (tilescale/ops/registry.py): AllReduce (one-shot, two-shot), AllGather,
ReduceScatter, AllToAll (equal splits), Broadcast...

    GPUS=2 bash launch.sh benchmarks/bench_collectives.py [--json out.json] [--write-tuning tuning.json]

Sizes are message sizes as tilescale.plan.Request.msg_bytes (the tensor for allreduce and broadcast, the
gathered output for allgather, the whole input for reduce-scatter and all-to-all), 1 KiB .. 256 MiB in
powers of 4 (bf16); every op writes into a tensor of the caller's, as torch does (each collective's
``bench`` in its op module says how). A case is a collective, or a collective and an algorithm
(``allreduce_one_shot``) where it has several. Times are the slowest rank's (benchmarks/timing.py). Bus
bandwidth as nccl-tests defines it (the registry's ``busbw`` factor x bytes / time). Each size is checked
against NCCL before it is timed; a size whose symmetric buffers do not fit the heap is skipped. The JSON
holds every row and, per case, ``wins``: the [min_bytes, max_bytes] ranges of consecutive measured sizes
where tilescale is at least 3% faster than NCCL. ``--write-tuning PATH`` writes the plan selector's table
(tilescale.plan.tuning.table: per collective, each algorithm where it is the faster of the collective's and
beats NCCL by >= 3%)::

    {"gpu": ..., "world_size": W, "collectives": {"reduce_scatter": {"algo": "direct", "ranges": [[lo, hi]]},
     ..., "allreduce": [{"algo": "one_shot", "ranges": [...]}, {"algo": "two_shot", "ranges": [...]}]}}
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import environment, fmt_bytes, print_table, time_op, write_json  # noqa: E402

import tilescale  # noqa: E402


def cases(nodes: int = 1) -> list[tuple[str, object, str]]:
    """(case name, registry entry, algorithm) of every algorithm of every registered collective that runs on
    `nodes` nodes (the hierarchical ones, ``Algorithm.nodes == "several"``, on several only)."""
    from tilescale.ops import registry

    out = []
    for c in registry.collectives():
        algos = [a for a, alg in c.algos.items() if nodes > 1 or alg.nodes != "several"]
        out += [(c.name if len(algos) == 1 else f"{c.name}_{a}", c, a) for a in algos]
    return out


def bench_case(c, algo: str):
    """The benchmark case of `algo` of `c`: the registry entry's, or for an algorithm defined in a file of its own
    (a hierarchical variant) that file's ``bench``."""
    mod = sys.modules[c.algos[algo].run.__module__]
    return getattr(mod, "bench", c.bench) if mod.__name__ != c.module else c.bench


def check(name: str, c, out, reference, nbytes: int, W: int, rank: int) -> None:
    """`out` (ours) against `reference` (NCCL's): equal for copies, within bf16 rounding for sums."""
    import torch

    ok = torch.equal(out, reference) if c.exact else torch.allclose(out.float(), reference.float(), atol=0.06 * W,
                                                                     rtol=0.02)
    if not ok:
        raise AssertionError(f"[rank {rank}] {name} of {fmt_bytes(nbytes)} differs from NCCL")


def run(info, args):
    import torch
    import torch.distributed as dist

    from tilescale.errors import SymmetricHeapExhaustedError
    from tilescale.ops import prebuild
    from tilescale.ops.vectors import sm_count
    from tilescale.plan import tuning

    W, rank = info.world_size, info.rank
    from tilescale import topology

    every = cases(topology.current().nodes)
    chosen = every if args.ops is None else [k for k in every if k[0] in args.ops.split(",")]
    sizes = [1 << k for k in range(10, 29, args.step) if (1 << k) <= args.max_bytes]
    prebuild.on_local_rank0(prebuild.collective_jobs(W, sizes, ("bfloat16",), sm_count(),
                                                     ops=sorted({c.name for _, c, _ in chosen})))
    rows = []
    for name, c, algo in chosen:
        reference = getattr(dist, c.torch_name)
        for nbytes in sizes:
            g = torch.Generator(device="cuda").manual_seed(1234 + rank)
            x = torch.randn(nbytes // 2, device="cuda", generator=g).to(torch.bfloat16)
            try:
                op, ours, out, torch_args = bench_case(c, algo)(algo, x, W)
            except SymmetricHeapExhaustedError:   # raised on every rank alike
                if rank == 0:
                    print(f"{name} {fmt_bytes(nbytes)}: skipped (its symmetric buffers do not fit the heap)")
                continue
            ours()
            reference(*torch_args)
            torch.cuda.synchronize()
            check(name, c, out, torch_args[0], nbytes, W, rank)
            iters = 50 if nbytes <= 1 << 20 else (20 if nbytes <= 32 << 20 else 8)
            t_ts = time_op(ours, iters=iters, repeats=5)
            t_nccl = time_op(lambda: reference(*torch_args), iters=iters, repeats=5)
            busbw = c.busbw(W) * nbytes / 1e3
            rows.append(dict(case=name, collective=c.name, algo=algo, bytes=nbytes, tilescale_us=t_ts, nccl_us=t_nccl,
                             tilescale_busbw=busbw / t_ts, nccl_busbw=busbw / t_nccl, speedup=t_nccl / t_ts))
            op.close()
    if rank == 0:
        gpu = environment()["gpu"]
        for name, _, _ in chosen:
            rs = [r for r in rows if r["case"] == name]
            print_table(f"{name} bf16, {W} x {gpu} (time = slowest rank; busbw in GB/s)",
                        ["message", "tilescale us", "NCCL us", "speedup", "tilescale busbw", "NCCL busbw"],
                        [[fmt_bytes(r["bytes"]), f"{r['tilescale_us']:.1f}", f"{r['nccl_us']:.1f}",
                          f"{r['speedup']:.2f}x", f"{r['tilescale_busbw']:.1f}", f"{r['nccl_busbw']:.1f}"] for r in rs])
            wins = tuning.win_ranges(rs)
            print(f"{name}: tilescale >= 3% faster at " +
                  (", ".join(f"{fmt_bytes(lo)}..{fmt_bytes(hi)}" for lo, hi in wins) if wins else "no size"))
        wins = {name: tuning.win_ranges([r for r in rows if r["case"] == name]) for name, _, _ in chosen}
        table = tuning.table(rows, gpu, W)
        write_json(args.json, dict(op="collectives", env=environment(), rows=rows, wins=wins, tuning=table))
        if args.write_tuning:
            os.makedirs(os.path.dirname(os.path.abspath(args.write_tuning)), exist_ok=True)
            with open(args.write_tuning, "w") as f:
                json.dump(table, f, indent=1)
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
    ap.add_argument("--ops", help="comma-separated subset of the cases (default: all), "
                                  "e.g. allreduce_one_shot,broadcast")
    ap.add_argument("--step", type=int, default=2, help="size step in powers of two (2: powers of 4)")
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    a = ap.parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), build)
