"""AllGather of a row-sharded tensor on the symmetric heap, written in tilescale (push over NVLink).

    GPUS=4 bash launch.sh examples/distributed/example_allgather.py [--rows 4096 --cols 1024]

torch equivalent:  dist.all_gather_into_tensor(out, x)   (out = torch.cat of every rank's x)
Every rank checks the result against the shards rebuilt from each rank's seed, on random data, with
the output poisoned (NaN) before each call; then against NCCL. Protocol: tilescale/ops/allgather.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops.allgather import allgather_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None


def shard(rank: int, rows: int, cols: int, epoch: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(7919 * epoch + rank)
    return torch.randn(rows, cols, device="cuda", generator=g).to(dtype)


def run(info, rows: int = 4096, cols: int = 1024, iters: int = 5) -> None:
    import torch
    import torch.distributed as dist

    rank, W = info.rank, info.world_size
    for dtype in (torch.bfloat16, torch.float16):
        ag = tilescale.ops.AllGather((rows, cols), dtype)
        for epoch in range(1, iters + 1):
            x = shard(rank, rows, cols, epoch, dtype)
            ag.out.fill_(float("nan"))
            torch.cuda.synchronize()
            tilescale.barrier()  # every rank's output is poisoned before anyone writes
            out = ag(x)
            torch.cuda.synchronize()
            want = torch.cat([shard(r, rows, cols, epoch, dtype) for r in range(W)])
            testing.check_close(f"allgather {dtype} epoch {epoch}", out, want, rank)
        ref = torch.empty(W * rows, cols, device="cuda", dtype=dtype)
        dist.all_gather_into_tensor(ref, x)
        testing.check_close(f"allgather {dtype} vs NCCL", ag(x), ref, rank)
        # the torch-like entry points
        testing.check_close("tilescale.ops.all_gather", tilescale.ops.all_gather(x), ref, rank)
    print(f"[rank {rank}] OK: all_gather of {rows}x{cols} bf16/fp16 shards over {W} ranks matches torch/NCCL",
          flush=True)


def build(world_size: int) -> None:
    r = allgather_kernel.build(world_size, 16, "bfloat16")
    print(f"built {r.library}")


def test_allgather_compiles_for_sm90():
    r = allgather_kernel.build(4, 8, "float16")
    assert r.spec.distributed
    assert "tilescale::put_signal<2>" in r.source and "tilescale::wait_until" in r.source


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_allgather_on_gpus(nranks):
        if testing.gpu_count() < nranks:
            pytest.skip(f"needs {nranks} GPUs, found {testing.gpu_count()}")
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--rows", "512", "--cols", "384"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.rows, a.cols), build)
