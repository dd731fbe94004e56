"""Block-level put bandwidth, 1 KiB .. 256 MiB: T.put_block to the next rank, 32 blocks x 1024 threads
(each block one contiguous chunk), next to the NVSHMEM ceiling measured on the same machines
(DEVICE.md: nvshmemx_putmem_nbi_block, 32 x 1024: 1 MiB 155 GB/s, 64 MiB 344, 256 MiB 352).

    GPUS=2 bash launch.sh benchmarks/bench_put_bw.py [--json out.json]

Every size is checked: the receiver's buffer must equal the sender's data.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import environment, fmt_bytes, print_table, time_op, write_json  # noqa: E402

import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402

NVSHMEM_CEILING = {1 << 20: 155.0, 64 << 20: 344.0, 256 << 20: 352.0}


@tilescale.jit
def put_bw_kernel(world_size: int, blocks: int = 32, threads: int = 1024):
    n = T.dynamic("n")
    chunk = n // blocks

    @T.prim_func
    def put_bw(src: T.Tensor((n,), "uint8"), dst: T.Tensor((n,), "uint8")):
        with T.Kernel(blocks, threads=threads) as b:
            nxt = (T.get_rank() + 1) % world_size
            T.put_block_nbi(src[b * chunk:(b + 1) * chunk], dst[b * chunk:(b + 1) * chunk], dst_pe=nxt)
            T.quiet()

    return put_bw


def run(info, args):
    import torch

    W, rank = info.world_size, info.rank
    k = put_bw_kernel(W).prepare()
    rows = []
    biggest = 256 << 20
    pattern = lambda r: ((torch.arange(biggest, device="cuda") * (2 * r + 1)) % 251).to(torch.uint8)  # noqa: E731
    src = pattern(rank)
    want = pattern((rank - 1) % W)
    dst = tilescale.symm.zeros((biggest,), dtype=torch.uint8)
    for e in range(10, 29, args.step):
        nbytes = 1 << e
        s, d = src[:nbytes], dst[:nbytes]
        d.zero_()
        tilescale.synchronize()
        tilescale.barrier()
        k(s, d)
        tilescale.synchronize()
        tilescale.barrier()
        tilescale.synchronize()
        if not torch.equal(d, want[:nbytes]):
            raise AssertionError(f"[rank {rank}] put of {fmt_bytes(nbytes)}: received data differs from rank-1's")
        iters = 100 if nbytes <= 1 << 20 else 20
        t = time_op(lambda: k.launch(s, d), iters=iters)
        rows.append(dict(bytes=nbytes, us=t, gbps=nbytes / (t * 1e-6) / 1e9, ceiling=NVSHMEM_CEILING.get(nbytes)))
    if rank == 0:
        print_table(f"put_block bandwidth to the next rank, 32 x 1024 threads, {W} x {environment()['gpu']}",
                    ["bytes", "us", "GB/s", "NVSHMEM ceiling (DEVICE.md)", "ratio"],
                    [[fmt_bytes(r["bytes"]), f"{r['us']:.1f}", f"{r['gbps']:.1f}",
                      f"{r['ceiling']:.0f}" if r["ceiling"] else "-",
                      f"{r['gbps'] / r['ceiling']:.2f}" if r["ceiling"] else "-"] for r in rows])
        write_json(args.json, dict(op="put_bw", env=environment(), rows=rows))
    print(f"[rank {rank}] OK: put bandwidth benchmark done", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--step", type=int, default=1)
    a = ap.parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), lambda ws: print(put_bw_kernel.build(ws).library))
