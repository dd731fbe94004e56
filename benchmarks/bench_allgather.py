"""AllGather: tilescale (push over NVLink) vs NCCL (torch.distributed.all_gather_into_tensor), one run.

    GPUS=4 bash launch.sh benchmarks/bench_allgather.py [--json out.json] [--plot out.png]

Sizes are bytes per rank, 1 KiB .. 256 MiB (bf16). Bus bandwidth = (W-1)/W * total bytes / time
(nccl-tests' definition); also shown as a fraction of the NVLink4 ceiling (450 GB/s per direction).
Each size is checked against NCCL before it is timed. Both are timed the same way: back-to-back calls
from Python between CUDA events (timing.time_op), slowest rank. "host us" is what one call of ours costs
the CPU (enqueue rate over 200 calls without synchronising): when it is above the GPU time, the
back-to-back figure is the CPU's.

--sweep adds a second table: blocks per peer (and 1024 threads) at 64 KiB .. 64 MiB, to tune
tilescale.ops.allgather.default_blocks_per_peer.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import environment, fmt_bytes, print_table, time_op, write_json  # noqa: E402

import tilescale  # noqa: E402

NVLINK_GBPS = 450.0


def run(info, args):
    import torch
    import torch.distributed as dist

    from tilescale.ops import prebuild

    W, rank = info.world_size, info.rank
    jobs = prebuild.allgather_jobs(W, "bfloat16") + (sweep_jobs(W) if args.sweep else [])
    prebuild.on_local_rank0(jobs)   # on_local_rank0 drops repeats
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
        host = host_us_per_call(lambda: ag(x)) if nbytes <= 1 << 20 else None
        bus = lambda t: (W - 1) / W * (W * nbytes) / (t * 1e-6) / 1e9  # noqa: E731
        rows.append(dict(bytes=nbytes, tilescale_us=t_ts, nccl_us=t_nccl, tilescale_busbw=bus(t_ts),
                         nccl_busbw=bus(t_nccl), speedup=t_nccl / t_ts, blocks_per_peer=ag.blocks_per_peer,
                         host_us=host, launch_path=ag.launch_path))
        ag.close()
    if rank == 0:
        print_table(f"AllGather bf16, {W} x {environment()['gpu']} (time = slowest rank; busbw in GB/s)",
                    ["bytes/rank", "tilescale us", "NCCL us", "tilescale busbw", "NCCL busbw", "of NVLink",
                     "speedup", "blocks/peer", "host us"],
                    [[fmt_bytes(r["bytes"]), f"{r['tilescale_us']:.1f}", f"{r['nccl_us']:.1f}",
                      f"{r['tilescale_busbw']:.1f}", f"{r['nccl_busbw']:.1f}",
                      f"{r['tilescale_busbw'] / NVLINK_GBPS:.2f}", f"{r['speedup']:.2f}x", r["blocks_per_peer"],
                      "-" if r["host_us"] is None else f"{r['host_us']:.1f}"] for r in rows])
        print(f"launch path: {rows[0]['launch_path'] if rows else '-'} (direct = raw C entry point, tilelang = "
              "its checked launcher)")
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
    sweep_rows = run_sweep(info) if args.sweep else []
    if rank == 0:
        write_json(args.json, dict(op="allgather", env=environment(), rows=rows, sweep=sweep_rows))
        if args.plot:
            plot(rows, W, args.plot)
    print(f"[rank {rank}] OK: allgather benchmark done", flush=True)


def host_us_per_call(fn, calls: int = 200) -> float:
    """CPU time of one call when calls are issued back to back (no synchronisation in between)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


SWEEP_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def sweep_configs(W: int, sms: int = 132) -> list[tuple[int, int]]:
    """(blocks per peer, threads) tried by --sweep: powers of two up to one block per SM, and 1024 threads
    at 16 and 32 blocks per peer."""
    bpps = [b for b in (2, 4, 8, 16, 32, 64) if b * W <= sms]
    return [(b, 512) for b in bpps] + [(b, 1024) for b in (16, 32) if b in bpps]


def sweep_jobs(W: int) -> list:
    from tilescale.ops.allgather import allgather_kernel

    return [(allgather_kernel, (W, b, "bfloat16") + ((t,) if t != 512 else ())) for b, t in sweep_configs(W)]


def run_sweep(info) -> list:
    import torch
    import torch.distributed as dist

    W, rank = info.world_size, info.rank
    out = []
    for nbytes in SWEEP_SIZES:
        n = nbytes // 2
        shape = (n // 1024, 1024)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        ref = torch.empty(W * shape[0], 1024, device="cuda", dtype=torch.bfloat16)
        dist.all_gather_into_tensor(ref, x)
        iters = 50 if nbytes <= 1 << 20 else 20
        for bpp, threads in sweep_configs(W):
            ag = tilescale.ops.AllGather(shape, torch.bfloat16, blocks_per_peer=bpp, threads=threads)
            got = ag(x)
            torch.cuda.synchronize()
            if not torch.equal(got, ref):
                raise AssertionError(f"[rank {rank}] sweep: {fmt_bytes(nbytes)} bpp={bpp} threads={threads} differs "
                                     "from NCCL")
            t = time_op(lambda: ag(x), iters=iters)
            out.append(dict(bytes=nbytes, blocks_per_peer=bpp, threads=threads, us=t,
                            busbw=(W - 1) * nbytes / (t * 1e-6) / 1e9))
            ag.close()
    if rank == 0:
        from tilescale.ops.allgather import default_blocks_per_peer

        cfgs = sweep_configs(W)
        head = ["bytes/rank"] + [f"{b}x{t}" for b, t in cfgs] + ["best", "default"]
        table = []
        for nbytes in SWEEP_SIZES:
            rs = {(r["blocks_per_peer"], r["threads"]): r["us"] for r in out if r["bytes"] == nbytes}
            best = min(rs, key=rs.get)
            table.append([fmt_bytes(nbytes)] + [f"{rs[c]:.1f}" for c in cfgs] + [f"{best[0]}x{best[1]}",
                                                                                 default_blocks_per_peer(nbytes, W)])
        print_table(f"AllGather sweep, us per call (blocks per peer x threads), {W} ranks", head, table)
    return out


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

    jobs = prebuild.allgather_jobs(world_size, "bfloat16")
    if "--sweep" in sys.argv:
        jobs += sweep_jobs(world_size)
    for fn, args in {a: (f, a) for f, a in jobs}.values():
        print(fn.build(*args).library)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--step", type=int, default=1, help="size step in powers of two")
    ap.add_argument("--sweep", action="store_true", help="also time blocks per peer / threads (tuning table)")
    a = ap.parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), build)
