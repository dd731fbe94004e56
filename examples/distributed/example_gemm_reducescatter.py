"""GEMM + ReduceScatter with overlap: C_local = ReduceScatter(X_local @ W_local) (row-parallel layer).

    GPUS=4 bash launch.sh examples/distributed/example_gemm_reducescatter.py [--shape 8192 8192 8192]   # M N K

torch equivalent (K is the full inner size; each rank holds K/W of it):
    partial = X_local @ W_local; C_local = torch.empty(M // W, N); dist.reduce_scatter_tensor(C_local, partial)
The reduction of finished row blocks runs while the GEMM goes on. Every rank checks its C_local
against torch (partials of every rank rebuilt from their seeds, summed in fp32) and against NCCL,
on random data, output poisoned, bf16 and fp16. Protocol: tilescale/ops/gemm_reduce_scatter.py.
"""
import argparse

import tilescale
from tilescale import testing
from tilescale.ops.gemm_reduce_scatter import gemm_rs_gemm_kernel, gemm_rs_reduce_kernel

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None


def operands(rank, M, N, k_local, epoch, dtype):
    import torch

    g = torch.Generator(device="cuda").manual_seed(15485863 * epoch + rank)
    x = torch.randn(M, k_local, device="cuda", generator=g).to(dtype)
    w = (torch.randn(k_local, N, device="cuda", generator=g) / k_local ** 0.5).to(dtype)
    return x, w


def run(info, M: int, N: int, K: int, iters: int = 3) -> None:
    import torch

    from tilescale import staged_collectives
    from tilescale.ops import prebuild

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    rank, W = info.rank, info.world_size
    prebuild.on_local_rank0([j for d in ("bfloat16", "float16") for j in prebuild.gemm_rs_jobs([(M, K, N)], W, d)])
    kl = K // W
    rows = slice(rank * (M // W), (rank + 1) * (M // W))
    for dtype in (torch.bfloat16, torch.float16):
        op = tilescale.ops.GemmRS(M, N, kl, dtype)
        out = torch.empty(M // W, N, device="cuda", dtype=dtype)
        for epoch in range(1, iters + 1):
            x, w = operands(rank, M, N, kl, epoch, dtype)
            out.fill_(float("nan"))
            op(x, w, out=out)
            torch.cuda.synchronize()
            ref = sum(xr[rows].float() @ wr.float() for xr, wr in
                      (operands(r, M, N, kl, epoch, dtype) for r in range(W)))
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                raise AssertionError(f"[rank {rank}] gemm_rs {dtype} epoch {epoch}: relative max error {err:.3g}")
        partial = x @ w
        nccl = torch.empty(M // W, N, device="cuda", dtype=dtype)
        dist.reduce_scatter_tensor(nccl, partial)
        err = ((out.float() - nccl.float()).abs().max() / nccl.float().abs().max()).item()
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] gemm_rs {dtype} vs NCCL: relative max error {err:.3g}")
        op.close()   # its symmetric buffers (collective): the cached op of the same shape below needs the heap
        again = tilescale.ops.gemm_rs(x, w)
        torch.cuda.synchronize()
        testing.check_close("tilescale.ops.gemm_rs vs GemmRS", again, out, rank)
    print(f"[rank {rank}] OK: gemm_rs M={M} N={N} K={K} over {W} ranks matches torch and NCCL (bf16, fp16)",
          flush=True)


def build(world_size: int, M: int = 2048, N: int = 1024, K: int = 2048) -> None:
    for r in (gemm_rs_gemm_kernel.build(M, N, K // world_size, world_size),
              gemm_rs_reduce_kernel.build(M, N, world_size, 256 * (N // 256), 20)):
        print(f"built {r.library}")


def test_gemm_rs_compiles_for_sm90():
    r = gemm_rs_reduce_kernel.build(1024, 512, 4, 512, 8, "float16")
    assert r.spec.distributed and "tilescale::wait_until_pe" in r.source and "tilescale::peer_ptr" in r.source


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_gemm_rs_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, "--shape", str(512 * nranks), "1024", "2048")
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), default=[8192, 8192, 8192])
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, *a.shape), lambda ws: build(ws))
