"""Reduce (sum) to one rank over NVLink, written in tilescale: every other rank pushes, the root sums.

    GPUS=2 bash launch.sh examples/distributed/example_reduce.py [--iters 4]

torch equivalent:  dist.reduce(x, dst)      (x = sum over ranks on rank dst, in place; the others' x unchanged)
For bf16, fp16 and fp32, sizes that fill whole 16-byte vectors and odd ones that are staged, and every rank as
the root, every rank runs several calls back to back (random delays between them, so ranks drift apart) on
random inputs rebuilt from each rank's seed, with the root's outputs poisoned (NaN) before, then checks every
result: on the root exactly against the fp32 sum in rank order (the kernel's order, rounded once) and against
torch's sum within the dtype's tolerance, on the other ranks that nothing changed. Protocol:
tilescale/ops/reduce_to_root.py. Registered in tilescale.ops.registry by that file alone: tilescale.plan,
tilescale.distributed (``dist.reduce``), the prebuild and benchmarks/bench_collectives.py know it.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops import prebuild as pb
from tilescale.ops.reduce_to_root import Reduce, kernels, reduce, reduce_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

DTYPES = ("bfloat16", "float16", "float32")
SIZES = (1, 4099, 65536, 600_003)          # elements: one vector, odd, whole vectors, odd and > 1 MiB
# |ours - torch| <= atol + rtol |torch| per element (torch may sum in another order / in the dtype)
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
            for dst in range(W):
                red = Reduce((n,), dtype, dst)
                steps = list(range(step, step + iters))
                step += iters
                xs = [data(rank, n, s, dtype) for s in steps]
                outs = [torch.full((n,), float("nan"), device="cuda", dtype=dtype) for _ in steps]
                for s, x, o in zip(steps, xs, outs, strict=False):   # back to back, no host synchronisation
                    torch.cuda._sleep(((rank * 7 + s * 13) % 5) * 20_000)
                    assert red(x, out=o) is o
                torch.cuda.synchronize()
                for s, x, o in zip(steps, xs, outs, strict=False):
                    what = f"reduce {name} n={n} dst={dst} call {s}"
                    testing.check_close(what + " x untouched", x, data(rank, n, s, dtype), rank)
                    if rank == dst:
                        testing.check_close(what, o, want(W, n, s, dtype), rank)
                    elif not o.isnan().all():
                        raise AssertionError(f"[rank {rank}] {what}: out of a rank other than dst was written")
                ref = xs[-1].clone()
                dist.all_reduce(ref)                     # torch's sum (dist.reduce's result on dst)
                if rank == dst:
                    testing.check_close(f"reduce {name} n={n} dst={dst} vs torch", outs[-1], ref, rank, atol * W, rtol)
                y = xs[0].clone()                         # in place
                assert red(y) is y
                torch.cuda.synchronize()
                testing.check_close(f"reduce {name} n={n} dst={dst} in place", y,
                                    want(W, n, steps[0], dtype) if rank == dst else xs[0], rank)
                red.close()
        # the torch-like function: in place, on a non-contiguous view, cached op
        base = data(rank, 64 * 33, step, dtype).view(64, 33)
        t = base.t()
        reduce(t, W - 1)
        torch.cuda.synchronize()
        expect = want(W, 64 * 33, step, dtype) if rank == W - 1 else data(rank, 64 * 33, step, dtype)
        testing.check_close(f"reduce() {name} non-contiguous", t, expect.view(64, 33).t(), rank)
        step += 1
    print(f"[rank {rank}] OK: reduce to every rank, bf16/fp16/fp32, sizes {SIZES}, {iters} calls back to back each, "
          f"over {W} ranks, matches the fp32 rank-order sum and torch on the root, others unchanged", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    return pb.unique(job for name in DTYPES for n in (*SIZES, 64 * 33)
                     for job in kernels(n * (4 if name == "float32" else 2), world_size, name, sms))


def prebuild(world_size: int) -> None:
    """Compile every kernel of this example in parallel on local rank 0; the other ranks load them."""
    from tilescale.ops.vectors import sm_count

    pb.on_local_rank0(jobs(world_size, sm_count()))


def build(world_size: int) -> None:
    tilescale.build_all([(reduce_kernel, (world_size, 16, "bfloat16"))])


def test_reduce_compiles_for_sm90():
    import re

    r = reduce_kernel.build(4, 32, "float16")
    assert r.spec.distributed
    for call in ("tilescale::put_signal<2>", "tilescale::wait_until", "tilescale::st_pe"):
        assert call in r.source, call
    assert "__half22float2" in r.source and "float acc[" in r.source        # fp16 -> fp32 sums in registers
    # an empty chunk must still signal: no bound guard around the put
    assert not re.search(r"if \(\(\(\(\(int\)blockIdx\.x\)[^\n]*\n\s*tilescale::put", r.source)


def test_reduce_is_registered():
    """This file's collective, known from its op file alone: plan names and built-in plan, tuning tables,
    tilescale.distributed.reduce, the prebuild, the collectives benchmark and tilescale.ops."""
    import importlib.util
    import inspect
    from pathlib import Path

    import torch

    import tilescale.distributed as tdist
    import tilescale.plan as P
    from tilescale.ops import prebuild as ops_prebuild
    from tilescale.ops import registry
    from tilescale.plan import builtin, tuning

    c = registry.find("reduce")
    assert c is not None and P.plan.canonical_collective("Reduce") == "reduce" and "reduce" in P.COLLECTIVES
    assert builtin.ALGOS["tilescale.reduce.push"][0] == "reduce" and tuning.full_name("reduce", "push")
    assert tdist.reduce is not torch.distributed.reduce and "plan" in inspect.signature(tdist.reduce).parameters
    assert all(j in ops_prebuild.collective_jobs(2, [1 << 20]) for j in kernels(1 << 20, 2, "bfloat16", 132))
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", bench)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert ("reduce", c, "push") in mod.cases()
    assert tilescale.ops.reduce is reduce and tilescale.ops.Reduce is Reduce
    assert tilescale.ops.reduce_to_root.COLLECTIVE is c
    call = c.serve(2, tensor=torch.zeros(8), dst=None, group_dst=1)
    assert call.args == (1,) and call.msg_bytes == 32 and c.serve(2, tensor=torch.zeros(8), dst=2, group_dst=None)


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_reduce_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--iters", "3"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.iters), build)
