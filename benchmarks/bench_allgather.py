"""AllGather: tilescale (push over NVLink) vs NCCL (torch.distributed.all_gather_into_tensor), one run.

    GPUS=4 bash launch.sh benchmarks/bench_allgather.py [--json out.json] [--plot out.png]

Sizes are bytes per rank, 1 KiB .. 256 MiB (bf16). Bus bandwidth = (W-1)/W * total bytes / time
(nccl-tests' definition); also shown as a fraction of the NVLink4 ceiling (450 GB/s per direction).
Each size is checked against NCCL before it is timed.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilescale  # noqa: E402
from timing import environment, fmt_bytes, print_table, time_op, write_json  # noqa: E402

NVLINK_GBPS = 450.0


def run(info, args):
    import torch
    import torch.distributed as dist

    from tilescale.ops import prebuild

    W, rank = info.world_size, info.rank
    prebuild.on_local_rank0(prebuild.allgather_jobs(W, "bfloat16"))
    sizes = [1 << k for k in range(10, 29, args.step)]  # 1 KiB .. 256 MiB
    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        cols = min(n, 1024)
        shape = (n // cols, cols)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        ag = tilescale.ops.AllGather(shape, torch.bfloat16)
        ref = torch.empty(W * shape[0], cols, device="cuda", dtype=torch.bfloat16)
        dist.all_gather_into_tensor(ref, x)
        out = ag(x)
        torch.cuda.synchronize()
        if not torch.equal(out, ref):
            raise AssertionError(f"[rank {rank}] all_gather of {fmt_bytes(nbytes)} differs from NCCL")
        iters = 50 if nbytes <= 1 << 20 else (20 if nbytes <= 32 << 20 else 8)
        t_ts = time_op(lambda: ag(x), iters=iters)
        t_nccl = time_op(lambda: dist.all_gather_into_tensor(ref, x), iters=iters)
        bus = lambda t: (W - 1) / W * (W * nbytes) / (t * 1e-6) / 1e9  # noqa: E731
        rows.append(dict(bytes=nbytes, tilescale_us=t_ts, nccl_us=t_nccl, tilescale_busbw=bus(t_ts),
                         nccl_busbw=bus(t_nccl), speedup=t_nccl / t_ts, blocks_per_peer=ag.blocks_per_peer))
        ag.close()
    if rank == 0:
        print_table(f"AllGather bf16, {W} x {environment()['gpu']} (time = slowest rank; busbw in GB/s)",
                    ["bytes/rank", "tilescale us", "NCCL us", "tilescale busbw", "NCCL busbw", "of NVLink",
                     "speedup"],
                    [[fmt_bytes(r["bytes"]), f"{r['tilescale_us']:.1f}", f"{r['nccl_us']:.1f}",
                      f"{r['tilescale_busbw']:.1f}", f"{r['nccl_busbw']:.1f}",
                      f"{r['tilescale_busbw'] / NVLINK_GBPS:.2f}", f"{r['speedup']:.2f}x"] for r in rows])
        big = [r for r in rows if r["bytes"] == 256 << 20]
        one = [r for r in rows if r["bytes"] == 1 << 20]
        slower = [fmt_bytes(r["bytes"]) for r in rows if r["speedup"] < 1.0]
        if big:
            print(f"target busbw at 256 MiB >= 380 GB/s: {big[0]['tilescale_busbw']:.0f} "
                  f"({'MET' if big[0]['tilescale_busbw'] >= 380 else 'MISSED'})")
        if one:
            print(f"target 1 MiB <= 15 us: {one[0]['tilescale_us']:.1f} us "
                  f"({'MET' if one[0]['tilescale_us'] <= 15 else 'MISSED'})")
        print(f"never slower than NCCL: {'MET' if not slower else 'MISSED at ' + ', '.join(slower)}")
        write_json(args.json, dict(op="allgather", env=environment(), rows=rows))
        if args.plot:
            plot(rows, W, args.plot)
    print(f"[rank {rank}] OK: allgather benchmark done", flush=True)


def plot(rows, W, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["tilescale_busbw"] for r in rows], "o-", label="tilescale")
    ax.plot(x, [r["nccl_busbw"] for r in rows], "s--", label="NCCL")
    ax.axhline(NVLINK_GBPS, color="gray", lw=0.8, ls=":", label="NVLink4 450 GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"AllGather bf16, {W} GPUs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build(world_size):
    from tilescale.ops import prebuild

    for fn, args in prebuild.allgather_jobs(world_size, "bfloat16"):
        print(fn.build(*args).library)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--step", type=int, default=1, help="size step in powers of two")
    a = ap.parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), build)
