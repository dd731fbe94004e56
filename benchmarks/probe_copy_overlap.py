"""Does a device-to-device copy on a side stream slow down a GEMM running at the same time on ONE GPU?

    GPUS=1 bash launch.sh benchmarks/probe_copy_overlap.py

AG+GEMM copies its shard into the symmetric gathered buffer (peers pull it from there). Done ahead of the GEMM,
that copy sits on the critical path (at world size 1: 128 MiB, ~45 us of 8192x8192x2048's ~350 us). Done beside
a GEMM that reads the shard where it is, it costs nothing if the copy runs on a copy engine, and SM time if it
is a kernel. This probe times, in turns (timing.time_ops): the GEMM alone, the copy alone (torch ``copy_``:
``cudaMemcpyAsync`` device to device), and both at once (the copy on a high-priority side stream, issued just
before the GEMM, joined after it); and lists what the profiler records for the copy (a memcpy row: a copy
engine; a kernel row: SMs).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import print_table, time_ops  # noqa: E402

import tilescale  # noqa: E402

SHAPES = [(8192, 8192, 2048), (4096, 8192, 2048), (8192, 4096, 2752)]   # M x K x N: A (M, K) is copied


def run(info):
    import torch

    side = torch.cuda.Stream(priority=-1)
    rows = []
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        slot = torch.empty_like(a)

        def both():
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                slot.copy_(a)
            torch.matmul(a, b, out=c)
            main.wait_stream(side)

        t = time_ops(dict(gemm=lambda: torch.matmul(a, b, out=c), copy=lambda: slot.copy_(a), both=both), iters=20)
        slot.zero_()
        both()
        torch.cuda.synchronize()
        assert torch.equal(slot, a), "the side-stream copy is wrong"
        rows.append([f"{M}x{K}x{N}", f"{a.nbytes >> 20}", f"{t['gemm']:.1f}", f"{t['copy']:.1f}", f"{t['both']:.1f}",
                     f"{t['both'] / t['gemm']:.3f}"])
    print_table(f"GEMM with a concurrent device-to-device copy of A, 1 x {torch.cuda.get_device_name()} (us)",
                ["MxKxN", "A MiB", "GEMM", "copy", "GEMM + copy at once", "at once / GEMM"], rows)

    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    slot = torch.empty_like(a)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        slot.copy_(a)
        torch.cuda.synchronize()
    names = sorted({e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"what the profiler records on the GPU for slot.copy_(a): {names}")
    print(f"[rank {info.rank}] OK: copy overlap probe done", flush=True)


if __name__ == "__main__":
    tilescale.testing.example_main(run, lambda world_size: print("probe_copy_overlap: nothing to build"))
