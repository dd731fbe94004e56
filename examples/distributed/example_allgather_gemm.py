"""AllGather + GEMM with overlap: C = AllGather(A) @ B, A sharded by rows (M/W x K per rank), B local.

    GPUS=4 bash launch.sh examples/distributed/example_allgather_gemm.py [--shape 8192 2048 8192]   # M N K

torch equivalent:
    A = torch.empty(M, K); dist.all_gather_into_tensor(A, A_local); C = A @ B
GEMM tiles start as soon as the rows they need have arrived (a signal per chunk), own rows first.
Every rank checks C against torch (A rebuilt from every rank's seed), on random data, output
poisoned, for bf16 and fp16. Protocol: tilescale/ops/allgather_gemm.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops.allgather_gemm import ag_gemm_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None


def a_shard(rank, rows, K, epoch, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(104729 * epoch + rank)
    return torch.randn(rows, K, device="cuda", generator=g).to(dtype)


def run(info, M: int, N: int, K: int, iters: int = 3) -> None:
    import torch

    from tilescale.ops import prebuild

    rank, W = info.rank, info.world_size
    prebuild.on_local_rank0([j for d in ("bfloat16", "float16") for cached in (False, True)
                             for j in prebuild.ag_gemm_jobs([(M, K, N)], W, d, cached=cached)])
    for dtype in (torch.bfloat16, torch.float16):
        op = tilescale.ops.AGGemm(M, N, K, dtype)
        rows = M // W
        g = torch.Generator(device="cuda").manual_seed(17 + rank)
        b = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).to(dtype)
        c = torch.empty(M, N, device="cuda", dtype=dtype)
        for epoch in range(1, iters + 1):
            a = a_shard(rank, rows, K, epoch, dtype)
            c.fill_(float("nan"))
            op(a, b, out=c)
            torch.cuda.synchronize()
            a_full = torch.cat([a_shard(r, rows, K, epoch, dtype) for r in range(W)])
            testing.check_close(f"gathered A {dtype} epoch {epoch}", op.gathered(), a_full, rank)
            ref = (a_full.float() @ b.float())
            err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                raise AssertionError(f"[rank {rank}] ag_gemm {dtype} epoch {epoch}: relative max error {err:.3g}")
        c2 = tilescale.ops.ag_gemm(a, b)
        torch.cuda.synchronize()
        # the function's cached op is built for a bound of rows of its own, whose tuned config may sum K in another
        # order: equal to AGGemm's result up to bf16 / fp16 rounding, not bit for bit
        testing.check_close("tilescale.ops.ag_gemm vs AGGemm", c2, c, rank, atol=1e-2 * ref.abs().max().item(),
                            rtol=1e-2)
    print(f"[rank {rank}] OK: ag_gemm M={M} N={N} K={K} over {W} ranks matches torch (bf16, fp16)", flush=True)


def build(world_size: int, M: int = 2048, N: int = 1024, K: int = 1024) -> None:
    tilescale.build_all([(ag_gemm_kernel, (N, K, world_size, 4), {"own": own})   # the own rows' GEMM, the others'
                         for own in ((True, False) if world_size > 1 else (True,))])


def test_ag_gemm_compiles_for_sm90():
    """Both GEMMs: the others' rows wait for their chunk; the own rows wait for nothing."""
    r = ag_gemm_kernel.build(512, 512, 4, 2, "float16")
    assert r.spec.distributed and "tilescale::wait_until" in r.source and "wgmma" in r.source
    own = ag_gemm_kernel.build(512, 512, 4, 2, "float16", own=True)
    assert "tilescale::wait_until" not in own.source and "wgmma" in own.source


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_ag_gemm_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, "--shape", str(1024 * nranks), "1024", "2048")
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), default=[8192, 2048, 8192])
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, *a.shape), lambda ws: build(ws))
