"""AllGather of a row-sharded tensor on the symmetric heap, written in tilescale (push over NVLink).

    GPUS=4 bash launch.sh examples/distributed/example_allgather.py [--rows 4096 --cols 1024]

torch equivalent:  dist.all_gather_into_tensor(out, x)   (out = torch.cat of every rank's x)
Every rank checks the result against the shards rebuilt from each rank's seed, on random data:
1. one call at a time, both output slots poisoned (NaN) before each call (both slots used);
2. `--burst` calls back to back with no host synchronisation, new data each call, each result cloned
   right after its call, and before each call the slot that the call after it writes poisoned; all
   checked after;
3. through the checked tilelang launch path as well as the direct one, with `out=`, odd sizes (empty
   chunks, sizes that are not whole 16-byte vectors), and the torch-like entry points, against NCCL.
Protocol: tilescale/ops/allgather.py.
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


def gathered(W: int, rows: int, cols: int, epoch: int, dtype):
    import torch

    return torch.cat([shard(r, rows, cols, epoch, dtype) for r in range(W)])


def poison(ag) -> None:
    for b in ag.buffers:
        b.fill_(float("nan"))


def one_at_a_time(ag, rank, W, rows, cols, dtype, epochs, what):
    import torch

    for epoch in epochs:
        x = shard(rank, rows, cols, epoch, dtype)
        poison(ag)
        torch.cuda.synchronize()
        tilescale.barrier()  # every rank's output is poisoned before anyone writes
        out = ag(x)
        torch.cuda.synchronize()
        assert out.data_ptr() == ag.out.data_ptr(), f"[rank {rank}] ag.out is not the slot the last call wrote"
        testing.check_close(f"allgather {what} {dtype} call {epoch}", out, gathered(W, rows, cols, epoch, dtype), rank)


def burst(ag, rank, W, rows, cols, dtype, calls, first_epoch):
    """`calls` calls back to back: no host synchronisation between them, a new shard each call, each result
    cloned right after its call (the op promises the slot intact until the next call is enqueued), and the
    slot that the call after this one writes poisoned before each call (safe: its last reader, the clone of
    the previous result, was enqueued before)."""
    import torch

    xs = [shard(rank, rows, cols, first_epoch + i, dtype) for i in range(calls)]
    poison(ag)
    torch.cuda.synchronize()
    tilescale.barrier()
    results = []
    for x in xs:
        ag.buffers[(ag.calls + 1) % 2].fill_(float("nan"))  # the slot of the call after this one
        results.append(ag(x).clone())
    torch.cuda.synchronize()
    for i, got in enumerate(results):
        testing.check_close(f"allgather burst {dtype} call {i + 1} of {calls}", got,
                            gathered(W, rows, cols, first_epoch + i, dtype), rank)


def run(info, rows: int = 4096, cols: int = 1024, iters: int = 5, burst_calls: int = 50) -> None:
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    rank, W = info.rank, info.world_size
    path = "?"
    for dtype in (torch.bfloat16, torch.float16):
        ag = tilescale.ops.AllGather((rows, cols), dtype)
        path = ag.launch_path
        one_at_a_time(ag, rank, W, rows, cols, dtype, range(1, iters + 1), ag.launch_path)
        burst(ag, rank, W, rows, cols, dtype, burst_calls, 100)
        one_at_a_time(ag, rank, W, rows, cols, dtype, range(200, 203), f"{ag.launch_path} after the burst")
        x = shard(rank, rows, cols, 300, dtype)
        ref = torch.empty(W * rows, cols, device="cuda", dtype=dtype)
        dist.all_gather_into_tensor(ref, x)
        testing.check_close(f"allgather {dtype} vs NCCL", ag(x), ref, rank)
        mine = torch.full((W * rows, cols), float("nan"), device="cuda", dtype=dtype)
        testing.check_close(f"allgather {dtype} out=", ag(x, out=mine), ref, rank)
        ag(shard(rank, rows, cols, 301, dtype))
        ag(shard(rank, rows, cols, 302, dtype))  # two more calls: `mine` is a copy, not a slot
        torch.cuda.synchronize()
        testing.check_close(f"allgather {dtype} out= after two more calls", mine, ref, rank)
        ag.close()
        # the same op through tilelang's checked launch path (the fallback when the direct one is unavailable)
        slow = tilescale.ops.AllGather((rows, cols), dtype)
        slow._direct = None
        one_at_a_time(slow, rank, W, rows, cols, dtype, range(400, 403), "tilelang launch path")
        burst(slow, rank, W, rows, cols, dtype, 6, 500)
        slow.close()
        # the torch-like entry points
        testing.check_close("tilescale.ops.all_gather", tilescale.ops.all_gather(x), ref, rank)
        into = torch.full_like(ref, float("nan"))
        tilescale.ops.all_gather_into_tensor(into, x)
        testing.check_close("tilescale.ops.all_gather_into_tensor", into, ref, rank)
    # odd sizes: 1 element (every block but one copies nothing, all still signal), 15 elements (not whole
    # 16-byte vectors: byte copies), 4 x 1000 bf16 over 2 blocks per peer, more blocks than 16-byte vectors
    for shape, bpp in (((1,), None), ((3, 5), None), ((4, 1000), 2), ((2, 24), 8)):
        ag = tilescale.ops.AllGather(shape, torch.bfloat16, blocks_per_peer=bpp)
        r_, c_ = shape if len(shape) == 2 else (1, shape[0])
        for epoch in (600, 601, 602):
            x = shard(rank, r_, c_, epoch, torch.bfloat16).view(shape)
            poison(ag)
            torch.cuda.synchronize()
            tilescale.barrier()
            got = ag(x)
            torch.cuda.synchronize()
            want = gathered(W, r_, c_, epoch, torch.bfloat16).view(W * shape[0], *shape[1:])
            testing.check_close(f"allgather {shape} bpp={ag.blocks_per_peer} call {epoch}", got, want, rank)
        ag.close()
    print(f"[rank {rank}] OK: all_gather of {rows}x{cols} bf16/fp16 shards over {W} ranks matches torch/NCCL "
          f"(one at a time, {burst_calls} back to back, both launch paths, odd sizes; default path: {path})",
          flush=True)


def build(world_size: int) -> None:
    from tilescale.ops.allgather import default_blocks_per_peer

    tilescale.build_all([(allgather_kernel, (world_size, bpp, "bfloat16"))
                         for bpp in sorted({default_blocks_per_peer(4096 * 1024 * 2, world_size), 2, 8})])


def test_allgather_compiles_for_sm90():
    r = allgather_kernel.build(4, 8, "float16")
    assert r.spec.distributed
    assert "tilescale::put_signal<2>" in r.source and "tilescale::wait_until" in r.source
    # every block signals, even one with nothing to copy: no condition on the block index around the put
    body = r.source[r.source.index("__launch_bounds__"):]
    assert "blockIdx" not in body.split("tilescale::put_signal<2>")[0], body[:800]


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_allgather_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--rows", "512", "--cols", "384"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--burst", type=int, default=50, help="calls back to back without host synchronisation")
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.rows, a.cols, burst_calls=a.burst), build)
