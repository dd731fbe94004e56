"""GEMM + ReduceScatter with overlap: C_local = ReduceScatter(X_local @ W_local) (row-parallel layer).

    GPUS=4 bash launch.sh examples/distributed/example_gemm_reducescatter.py [--shape 8192 8192 8192]   # M N K

torch equivalent (K is the full inner size; each rank holds K/W of it):
    partial = X_local @ W_local; C_local = torch.empty(M // W, N); dist.reduce_scatter_tensor(C_local, partial)
On one node the sums go around a ring (the push path): a rank adds its tile of a peer's rows to the sum that
rank + 1 pushed for it and pushes the new sum into rank - 1's memory; the owner's sum is complete. Across nodes
a reduction pulls the finished row blocks while the GEMM goes on (the pull path). Every rank checks its C_local
against torch (partials of every rank rebuilt from their seeds, summed in fp32) and against NCCL, on random data, output
poisoned, bf16 and fp16, on every path the job can take. Protocol: tilescale/ops/gemm_reduce_scatter.py.
"""
import argparse
import re

import tilescale
from tilescale import testing
from tilescale.ops.gemm_reduce_scatter import default_path, gemm_rs_push_kernel, gemm_rs_reduce_kernel

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
    from tilescale.ops.gemm_reduce_scatter import kernels

    kl = K // W
    paths = ("push", "pull") if default_path(W) == "push" else ("pull",)
    prebuild.on_local_rank0([job for d in ("bfloat16", "float16") for p in paths
                             for job in kernels(M, N, kl, W, d, path=p)]
                            + [job for d in ("bfloat16", "float16")                  # tilescale.ops.gemm_rs's
                               for job in prebuild.gemm_rs_jobs([(M, K, N)], W, d, cached=True)])
    rows = slice(rank * (M // W), (rank + 1) * (M // W))
    for dtype, path in ((d, p) for d in (torch.bfloat16, torch.float16) for p in paths):
        op = tilescale.ops.GemmRS(M, N, kl, dtype, path=path)
        assert op.path == path
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
                raise AssertionError(f"[rank {rank}] gemm_rs ({path}) {dtype} epoch {epoch}: relative max error "
                                     f"{err:.3g}")
        partial = x @ w
        nccl = torch.empty(M // W, N, device="cuda", dtype=dtype)
        dist.reduce_scatter_tensor(nccl, partial)
        err = ((out.float() - nccl.float()).abs().max() / nccl.float().abs().max()).item()
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] gemm_rs ({path}) {dtype} vs NCCL: relative max error {err:.3g}")
        op.close()   # its symmetric buffers (collective): the cached op of the same shape below needs the heap
        if path == default_path(W):   # the function takes the same path: the same kernel, the same sums
            again = tilescale.ops.gemm_rs(x, w)
            torch.cuda.synchronize()
            testing.check_close(f"tilescale.ops.gemm_rs vs GemmRS ({path})", again, out, rank)
    print(f"[rank {rank}] OK: gemm_rs M={M} N={N} K={K} over {W} ranks matches torch and NCCL (bf16, fp16; "
          f"paths: {', '.join(paths)})", flush=True)


def build(world_size: int, M: int = 2048, N: int = 1024, K: int = 2048) -> None:
    from tilescale.ops.gemm_reduce_scatter import kernels

    tilescale.build_all(kernels(M, N, K // world_size, world_size, "bfloat16"))   # the path this job takes


def test_gemm_rs_compiles_for_sm90():
    r = gemm_rs_reduce_kernel.build(512, 4, 512, 8, "float16")
    assert r.spec.distributed and "tilescale::wait_until_pe" in r.source and "tilescale::peer_ptr" in r.source


def test_gemm_rs_push_kernel_compiles_for_sm90():
    """The push kernel at 4 ranks (one block per SM; its sums warps): each sum in awaited on its word and loaded by
    one bulk copy, each sum out pushed by the plain stores of warps 1-3 into rank - 1's slab through its view and
    counted there (no NVSHMEM call, no peer_ptr), my rows stored into C and written before the block ends; and the C
    entry point GemmRS launches it through (raw pointers, then the stream)."""
    import ctypes
    from pathlib import Path

    from tilescale.ops.direct_launch import argtypes_for, call_signature
    from tilescale.ops.gemm_reduce_scatter import PUSH_PARAMS

    r = gemm_rs_push_kernel.build(512, 256, 4, "float16", sms=8)
    assert r.spec.distributed and "tilescale::peer_ptr" not in r.source
    host = Path(r.library).with_suffix(".cu").read_text()       # GemmRS launches it through its C entry point
    assert argtypes_for(call_signature(host), PUSH_PARAMS) == [ctypes.c_void_p] * 9 + [ctypes.c_int] * 3 + [
        ctypes.c_void_p], host                                  # 9 buffers, the rows and sizes, the stream
    assert r.source.count("tilescale::release_stores<2, unsigned long long, 0>((e[0] - pushed[") == 1
    assert "(&(Ap[" in r.source
    assert r.source.count("tilescale::wait_until<") == 1 and r.source.count("tilescale::load_rows_async(") == 1
    assert r.source.count("tilescale::store_rows_async(") == 1 and "tl::tma_store(" not in r.source
    assert re.search(r"tilescale::store_tile\(\(&\(\(\(half_t\*\)Rs\)\[0\]\)\), \(&\(Rp\[.*, 32, 96\);", r.source)
    assert re.search(r"store_rows_async\(\(&\(\(\(half_t\*\)Rs\)\[0\]\)\), \(&\(C\[.*, "
                     r"min\(128, \(m - at\[2\]\)\), 512, 528, 1024, 1\);", r.source), \
        "my rows: up to 128 of 512 bytes into C (rows of 1024), written before the block ends"


if pytest is not None:
    # (M, N, K) per world size n: K / n = 4096, 16 x n tiles, one per block; K / n = 1024: 128 x n tiles on the
    # GPU's blocks, several per block (the push path's persistent kernel, gemm_reduce_scatter.gemm_rs_push_kernel)
    SHAPES = {"long_k": lambda n: (512 * n, 1024, 4096 * n), "many_tiles": lambda n: (2048 * n, 2048, 1024 * n)}

    @pytest.mark.multigpu
    @pytest.mark.parametrize("kernel", list(SHAPES))
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_gemm_rs_on_gpus(nranks, kernel):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, "--shape", *map(str, SHAPES[kernel](nranks)))
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), default=[8192, 8192, 8192])
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, *a.shape), lambda ws: build(ws))
