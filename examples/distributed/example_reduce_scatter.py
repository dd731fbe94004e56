"""ReduceScatter (sum) over NVLink, written in tilescale: push every slice to its owner, reduce on arrival.

    GPUS=2 bash launch.sh examples/distributed/example_reduce_scatter.py [--iters 4]

torch equivalent:  dist.reduce_scatter_tensor(out, x)     (out = rank r's rows of the sum over ranks)
For bf16, fp16 and fp32 and shapes that fill whole 16-byte vectors or not, every rank runs several calls
back to back (random delays between them) on random inputs rebuilt from each rank's seed, with outputs
poisoned (NaN) before, then checks every result: exactly against the fp32 sum in rank order (the kernel's
order, rounded once) and against NCCL within the dtype's tolerance. Protocol: tilescale/ops/reduce_scatter.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops import prebuild as pb
from tilescale.ops.reduce_scatter import ReduceScatter, reduce_scatter_kernel, reduce_scatter_tensor

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

DTYPES = ("bfloat16", "float16", "float32")
TOL = {"bfloat16": (3e-2, 2e-2), "float16": (4e-3, 2e-3), "float32": (1e-5, 1e-5)}


def shapes(W: int):
    """(rows, cols) of the full input: odd (staged), whole vectors, and a few MiB."""
    return ((W * 3, 7), (W * 64, 1000), (W * 1024, 1024), (W * 5,))


def data(rank: int, shape, step: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1_000_003 * step + 31 * sum(shape) + rank)
    return torch.randn(shape, device="cuda", generator=g).to(dtype)


def want(rank: int, W: int, shape, step: int, dtype):
    rows = shape[0] // W
    acc = data(0, shape, step, dtype)[rank * rows:(rank + 1) * rows].float()
    for r in range(1, W):
        acc = acc + data(r, shape, step, dtype)[rank * rows:(rank + 1) * rows].float()
    return acc.to(dtype)


def run(info, iters: int = 4) -> None:
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    rank, W = info.rank, info.world_size
    prebuild(W)
    step = 0
    for name in DTYPES:
        dtype = getattr(torch, name)
        atol, rtol = TOL[name]
        for shape in shapes(W):
            rs = ReduceScatter(shape, dtype)
            out_shape = (shape[0] // W, *shape[1:])
            steps = list(range(step, step + iters))
            step += iters
            xs = [data(rank, shape, s, dtype) for s in steps]
            outs = [torch.full(out_shape, float("nan"), device="cuda", dtype=dtype) for _ in steps]
            for s, x, o in zip(steps, xs, outs, strict=False):       # back to back, no host synchronisation
                torch.cuda._sleep(((rank * 7 + s * 13) % 5) * 20_000)
                rs(x, out=o)
            torch.cuda.synchronize()
            for s, o in zip(steps, outs, strict=False):
                testing.check_close(f"reduce_scatter {name} {shape} call {s}", o, want(rank, W, shape, s, dtype), rank)
            ref = torch.empty(out_shape, device="cuda", dtype=dtype)
            dist.reduce_scatter_tensor(ref, xs[-1])
            testing.check_close(f"reduce_scatter {name} {shape} vs NCCL", outs[-1], ref, rank, atol * W, rtol)
            z = rs(xs[0])
            torch.cuda.synchronize()
            testing.check_close(f"reduce_scatter {name} {shape} new tensor", z, want(rank, W, shape, steps[0], dtype),
                                rank)
            rs.close()
        # the torch-like function: a flat input, a 2-D output
        shape = (W * 16, 24)
        x = data(rank, shape, step, dtype)
        out = torch.full((16, 24), float("nan"), device="cuda", dtype=dtype)
        assert reduce_scatter_tensor(out, x.view(-1)) is out
        torch.cuda.synchronize()
        testing.check_close(f"reduce_scatter_tensor() {name}", out, want(rank, W, shape, step, dtype), rank)
        step += 1
    print(f"[rank {rank}] OK: reduce_scatter bf16/fp16/fp32, shapes {shapes(W)}, {iters} calls back to back each, "
          f"over {W} ranks, matches the fp32 rank-order sum and NCCL", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    import math

    from tilescale.ops import reduce_scatter

    out = []
    for name in DTYPES:
        esize = 4 if name == "float32" else 2
        for shape in (*shapes(world_size), (world_size * 16, 24)):
            out += reduce_scatter.kernels(math.prod(shape) * esize, world_size, name, sms)
    return pb.unique(out)


def prebuild(world_size: int) -> None:
    """Compile every kernel of this example in parallel on local rank 0; the other ranks load them."""
    from tilescale.ops.vectors import sm_count

    pb.on_local_rank0(jobs(world_size, sm_count()))


def build(world_size: int) -> None:
    tilescale.build_all([(reduce_scatter_kernel, (world_size, 16, "bfloat16"))])


def test_reduce_scatter_compiles_for_sm90():
    r = reduce_scatter_kernel.build(8, 64, "float32")
    assert r.spec.distributed
    assert "tilescale::put_signal<2>" in r.source and "tilescale::wait_until" in r.source
    assert "float4" in r.source          # 16-byte vector loads of fp32


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_reduce_scatter_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--iters", "3"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.iters), build)
