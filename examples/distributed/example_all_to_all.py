"""AllToAll over NVLink, written in tilescale: equal splits, and variable splits as in MoE token dispatch.

    GPUS=2 bash launch.sh examples/distributed/example_all_to_all.py [--iters 4]

torch equivalent:  dist.all_to_all_single(out, x[, out_splits, in_splits])
For bf16, fp16 and fp32, rows of whole 16-byte vectors and odd rows, every rank runs several calls back to
back (random delays between them) on random inputs rebuilt from each rank's seed, with outputs poisoned
(NaN) before, then checks every result exactly against the rows rebuilt from the senders' seeds, and
against NCCL. Variable splits change from call to call and include empty ones (a rank sending nothing to
a peer, and a rank receiving nothing at all). Protocol: tilescale/ops/all_to_all.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops import prebuild as pb
from tilescale.ops.all_to_all import AllToAll, all_to_all_kernel, all_to_all_single

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

DTYPES = ("bfloat16", "float16", "float32")
COLS = (96, 7)          # 192-byte rows (16-byte aligned) and 14-byte rows (odd)


def data(rank: int, rows: int, cols: int, step: int, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1_000_003 * step + 131 * cols + rank)
    return torch.randn(rows, cols, device="cuda", generator=g).to(dtype)


def splits(W: int, step: int) -> list[list[int]]:
    """m[s][p] = rows rank s sends to rank p in call `step`: uneven, with zeros; in odd calls rank W-1
    receives nothing at all."""
    m = [[(3 * s + 5 * p + step) % 7 for p in range(W)] for s in range(W)]
    for s in range(W):
        m[s][(s + 1 + step) % W] = 0
        if step % 2:
            m[s][W - 1] = 0
    return m


def want(rank: int, W: int, m, cols: int, step: int, dtype):
    import torch

    parts = []
    for s in range(W):
        x = data(s, sum(m[s]), cols, step, dtype)
        off = sum(m[s][:rank])
        parts.append(x[off:off + m[s][rank]])
    return torch.cat(parts)


def run(info, iters: int = 4) -> None:
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    rank, W = info.rank, info.world_size
    prebuild(W)
    step = 0
    for name in DTYPES:
        dtype = getattr(torch, name)
        for cols in COLS:
            # equal splits: the op class, back to back into poisoned outputs
            rows = W * 40
            a2a = AllToAll((rows, cols), dtype)
            steps = list(range(step, step + iters))
            step += iters
            eq = [[rows // W] * W for _ in range(W)]
            xs = [data(rank, rows, cols, s, dtype) for s in steps]
            outs = [torch.full((rows, cols), float("nan"), device="cuda", dtype=dtype) for _ in steps]
            for s, x, o in zip(steps, xs, outs, strict=False):
                torch.cuda._sleep(((rank * 7 + s * 13) % 5) * 20_000)
                a2a(x, out=o)
            torch.cuda.synchronize()
            for s, o in zip(steps, outs, strict=False):
                testing.check_close(f"all_to_all {name} cols={cols} call {s}", o, want(rank, W, eq, cols, s, dtype),
                                    rank)
            ref = torch.empty_like(xs[-1])
            dist.all_to_all_single(ref, xs[-1])
            testing.check_close(f"all_to_all {name} cols={cols} vs NCCL", outs[-1], ref, rank)
            got = a2a(xs[0])                              # the op's own buffer
            torch.cuda.synchronize()
            assert got.data_ptr() == a2a.out.data_ptr()
            testing.check_close(f"all_to_all {name} cols={cols} buffer", got, want(rank, W, eq, cols, steps[0], dtype),
                                rank)
            a2a.close()
            # equal splits through the function
            o = torch.full((rows, cols), float("nan"), device="cuda", dtype=dtype)
            assert all_to_all_single(o, xs[1]) is o
            torch.cuda.synchronize()
            testing.check_close(f"all_to_all_single() {name} cols={cols}", o, want(rank, W, eq, cols, steps[1], dtype),
                                rank)
            # variable splits, different in every call, with empty ones
            steps = list(range(step, step + iters))
            step += iters
            results = []
            for s in steps:
                m = splits(W, s)
                x = data(rank, sum(m[rank]), cols, s, dtype)
                recv = [m[p][rank] for p in range(W)]
                o = torch.full((sum(recv), cols), float("nan"), device="cuda", dtype=dtype)
                torch.cuda._sleep(((rank * 7 + s * 13) % 5) * 20_000)
                all_to_all_single(o, x, output_split_sizes=recv, input_split_sizes=m[rank])
                results.append((s, m, x, recv, o))
            torch.cuda.synchronize()
            for s, m, _x, _recv, o in results:
                testing.check_close(f"all_to_all_single() {name} cols={cols} splits {m} call {s}", o,
                                    want(rank, W, m, cols, s, dtype), rank)
            s, m, x, recv, o = results[-1]
            ref = torch.empty_like(o)
            dist.all_to_all_single(ref, x, output_split_sizes=recv, input_split_sizes=m[rank])
            testing.check_close(f"all_to_all_single() {name} cols={cols} vs NCCL", o, ref, rank)
    print(f"[rank {rank}] OK: all_to_all equal and variable splits (with empty ones), bf16/fp16/fp32, rows of "
          f"{COLS} elements, {iters} calls back to back each, over {W} ranks, matches torch and NCCL", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    from tilescale.ops import all_to_all

    out = []
    for esize in (2, 4):
        for cols in COLS:
            out += all_to_all.kernels(world_size * 40 * cols * esize, world_size, None, sms)
            for cap in (1, 2, 4, 8, 16, 32, 64):
                out += all_to_all.kernels(cap * cols * esize, world_size, None, sms)
    return pb.unique(out)


def prebuild(world_size: int) -> None:
    """Compile every kernel of this example in parallel on local rank 0; the other ranks load them."""
    from tilescale.ops.vectors import sm_count

    pb.on_local_rank0(jobs(world_size, sm_count()))


def build(world_size: int) -> None:
    tilescale.build_all([(all_to_all_kernel, (world_size, max(4, world_size)))])


def test_all_to_all_compiles_for_sm90():
    r = all_to_all_kernel.build(8, 16)
    assert r.spec.distributed
    for call in ("tilescale::st_pe", "tilescale::wait_until", "tilescale::put_signal<2>"):
        assert call in r.source, call


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_all_to_all_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        testing.assert_all_ranks_ok(testing.launch(__file__, nranks, "--iters", "3"), nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4)
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.iters), build)
