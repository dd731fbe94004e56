"""Broadcast over NVLink, written in tilescale: the root stages its tensor, every other rank pulls it.

    GPUS=2 bash launch.sh examples/distributed/example_broadcast.py [--iters 4]

torch equivalent:  dist.broadcast(x, src)      (x = rank src's x on every rank, in place)
For bf16, fp16 and fp32, sizes from one element to a few MiB (odd ones too) and every rank as the root,
every rank runs several calls back to back (random delays between them) on random data rebuilt from
the root's seed, with the non-root tensors poisoned (NaN) before, then checks every result exactly, and
against NCCL. Protocol: tilescale/ops/broadcast_from_root.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops import prebuild as pb
from tilescale.ops.broadcast_from_root import Broadcast, broadcast, broadcast_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

DTYPES = ("bfloat16", "float16", "float32")
SIZES = (1, 1001, 1 << 20)        # elements


def data(rank: int, n: int, step: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1_000_003 * step + 7 * n + rank)
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def run(info, iters: int = 4) -> None:
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    rank, W = info.rank, info.world_size
    prebuild(W)
    step = 0
    for name in DTYPES:
        dtype = getattr(torch, name)
        for n in SIZES:
            for src in range(W):
                bc = Broadcast((n,), dtype, src)
                steps = list(range(step, step + iters))
                step += iters
                xs = [data(rank, n, s, dtype) if rank == src else torch.full((n,), float("nan"), device="cuda",
                                                                             dtype=dtype) for s in steps]
                for s, x in zip(steps, xs, strict=False):            # in place, back to back
                    torch.cuda._sleep(((rank * 7 + s * 13) % 5) * 20_000)
                    assert bc(x) is x
                torch.cuda.synchronize()
                for s, x in zip(steps, xs, strict=False):
                    testing.check_close(f"broadcast {name} n={n} src={src} call {s}", x, data(src, n, s, dtype), rank)
                # into another tensor, leaving x alone
                x = data(rank, n, steps[0], dtype)
                keep = x.clone()
                o = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
                bc(x, out=o)
                ref = x.clone()
                dist.broadcast(ref, src)
                torch.cuda.synchronize()
                testing.check_close(f"broadcast {name} n={n} src={src} out=", o, data(src, n, steps[0], dtype), rank)
                testing.check_close(f"broadcast {name} n={n} src={src} x untouched", x, keep, rank)
                testing.check_close(f"broadcast {name} n={n} src={src} vs NCCL", o, ref, rank)
                bc.close()
        # the torch-like function, on a non-contiguous view
        base = data(rank, 64 * 33, step, dtype).view(64, 33)
        t = base.t()
        broadcast(t, W - 1)
        torch.cuda.synchronize()
        testing.check_close(f"broadcast() {name} non-contiguous", t, data(W - 1, 64 * 33, step, dtype).view(64, 33).t(),
                            rank)
        step += 1
    print(f"[rank {rank}] OK: broadcast from every rank, bf16/fp16/fp32, sizes {SIZES}, {iters} calls back to back "
          f"each, over {W} ranks, matches the root's data and NCCL", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    from tilescale.ops import broadcast_from_root

    return pb.unique(job for n in (*SIZES, 64 * 33) for esize in (2, 4)
                     for job in broadcast_from_root.kernels(n * esize, world_size, None, sms))


def prebuild(world_size: int) -> None:
    """Compile every kernel of this example in parallel on local rank 0; the other ranks load them."""
    from tilescale.ops.vectors import sm_count

    pb.on_local_rank0(jobs(world_size, sm_count()))


def build(world_size: int) -> None:
    tilescale.build_all([(broadcast_kernel, (world_size, 8))])


def test_broadcast_compiles_for_sm90():
    r = broadcast_kernel.build(4, 32)
    assert r.spec.distributed
    for call in ("tilescale::put<2", "tilescale::get<2", "tilescale::st_pe", "tilescale::wait_until"):
        assert call in r.source, call


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_broadcast_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--iters", "3"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.iters), build)
