"""AllReduce (sum) over NVLink, written in tilescale: the one-shot and the two-shot kernel.

    GPUS=2 bash launch.sh examples/distributed/example_allreduce.py [--iters 4]

torch equivalent:  dist.all_reduce(x)      (x = sum over ranks, in place)
For bf16, fp16 and fp32, sizes that fill whole 16-byte vectors and odd ones that are staged, and every
algorithm ("one_shot", "two_shot", "auto"), every rank runs several calls back to back (random delays
between them, so ranks drift apart) on random inputs rebuilt from each rank's seed, with outputs poisoned
(NaN) before, then checks every result: exactly against the fp32 sum in rank order (the kernels' order,
rounded once), and against NCCL within the dtype's tolerance. Protocols: tilescale/ops/allreduce.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops import prebuild as pb
from tilescale.ops.allreduce import allreduce_one_shot_kernel, allreduce_two_shot_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

DTYPES = ("bfloat16", "float16", "float32")
SIZES = (1, 4099, 65536, 600_003)          # elements: one vector, odd, whole vectors, odd and > 1 MiB
# |ours - NCCL| <= atol + rtol |NCCL| per element (NCCL may sum in another order / in the dtype)
TOL = {"bfloat16": (3e-2, 2e-2), "float16": (4e-3, 2e-3), "float32": (1e-5, 1e-5)}


def data(rank: int, n: int, step: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1_000_003 * step + 7919 * n + rank)
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def want(W: int, n: int, step: int, dtype):
    acc = data(0, n, step, dtype).float()
    for r in range(1, W):
        acc = acc + data(r, n, step, dtype).float()
    return acc.to(dtype)


def skew(rank: int, step: int) -> None:
    """A different short GPU delay on each rank and call: the ranks enter calls at different times."""
    import torch

    torch.cuda._sleep(((rank * 7 + step * 13) % 5) * 20_000)


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
        for n in SIZES:
            for algo in ("one_shot", "two_shot", "auto"):
                ar = tilescale.ops.allreduce.AllReduce((n,), dtype, algo=algo)
                steps = list(range(step, step + iters))
                step += iters
                xs = [data(rank, n, s, dtype) for s in steps]
                outs = [torch.full((n,), float("nan"), device="cuda", dtype=dtype) for _ in steps]
                for s, x, o in zip(steps, xs, outs, strict=False):   # back to back, no host synchronisation
                    skew(rank, s)
                    ar(x, out=o)
                torch.cuda.synchronize()
                for s, o in zip(steps, outs, strict=False):
                    testing.check_close(f"allreduce {algo} ({ar.algo}) {name} n={n} call {s}", o, want(W, n, s, dtype),
                                        rank)
                ref = xs[-1].clone()
                dist.all_reduce(ref)
                testing.check_close(f"allreduce {algo} {name} n={n} vs NCCL", outs[-1], ref, rank, atol * W, rtol)
                # in place, and returning a new tensor
                y = xs[0].clone()
                assert ar(y, out=y) is y
                z = ar(xs[1])
                torch.cuda.synchronize()
                testing.check_close(f"allreduce {algo} {name} n={n} in place", y, want(W, n, steps[0], dtype), rank)
                testing.check_close(f"allreduce {algo} {name} n={n} new tensor", z, want(W, n, steps[1], dtype), rank)
                ar.close()
        # the torch-like function: in place, 2-D, cached op
        x = data(rank, 4 * 999, step, dtype).view(4, 999)
        tilescale.ops.allreduce.all_reduce(x)
        torch.cuda.synchronize()
        testing.check_close(f"all_reduce() {name}", x.view(-1), want(W, 4 * 999, step, dtype), rank)
        step += 1
    print(f"[rank {rank}] OK: all_reduce one-shot/two-shot/auto, bf16/fp16/fp32, sizes {SIZES}, {iters} calls back "
          f"to back each, over {W} ranks, matches the fp32 rank-order sum and NCCL", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    from tilescale.ops import allreduce

    out = []
    for name in DTYPES:
        esize = 4 if name == "float32" else 2
        for n in (*SIZES, 4 * 999):
            nb = n * esize
            out += allreduce.kernels(nb, world_size, name, sms)     # both algorithms
    return pb.unique(out)


def prebuild(world_size: int) -> None:
    """Compile every kernel of this example in parallel on local rank 0; the other ranks load them."""
    from tilescale.ops.vectors import sm_count

    pb.on_local_rank0(jobs(world_size, sm_count()))


def build(world_size: int) -> None:
    tilescale.build_all([(allreduce_one_shot_kernel, (world_size, 16, "bfloat16")),
                         (allreduce_two_shot_kernel, (world_size, 32, "bfloat16"))])


def test_allreduce_compiles_for_sm90():
    r = allreduce_two_shot_kernel.build(4, 32, "float16")
    assert r.spec.distributed
    for call in ("tilescale::put_signal<2>", "tilescale::wait_until", "tilescale::st_pe", "tilescale::get<2"):
        assert call in r.source, call
    assert "__bfloat1622float2" not in r.source and "__half22float2" in r.source   # fp16 -> fp32 sums


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_allreduce_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--iters", "3"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.iters), build)
