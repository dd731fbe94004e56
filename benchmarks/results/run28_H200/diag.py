"""Diagnostic (run 28, J9): the persistent push kernel (loopback) with parts of its epilogue removed (wrong results:
timing only), vs cuBLAS and the flat loop alone. It needs the library at commit aa56934 with `diag_variant.diff`
applied (a `V` argument of `_push_persistent_func` that removes those parts); J9 ran it from .device/probe/ so.

    git checkout aa56934 && git apply benchmarks/results/run28_H200/diag_variant.diff
    GPUS=1 bash launch.sh benchmarks/results/run28_H200/diag.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import _push_persistent_func, push_shapes  # noqa: E402


@tilescale.jit
def diag_kernel(M, N, K, W, V):
    return _push_persistent_func(M, N, K, W, "bfloat16", 128, 256, 64, 3, 256, 10, True, 132, V)


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    shapes = [(4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024))]
    Vs = ["", "nofold", "nostore", "noC", "noRs", "nofold nostore noC noRs"]
    jobs = [(diag_kernel, (M, N, K, W, v)) for W, (M, N, K) in shapes for v in Vs]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in shapes]
    compile_all(jobs, 16)
    for W, (M, N, K) in shapes:
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns = {"cublas": lambda: torch.matmul(X, B, out=Cf)}
        fl = gemm_flat_kernel(M, N, K, *FLAT)
        fns["flat"] = lambda: fl(X, B, Cf)
        for v in Vs:
            k = diag_kernel(M, N, K, W, v)
            C = torch.empty(M // W, N, device="cuda", dtype=torch.bfloat16)
            slab, words = push_shapes(M, N, W, 128, 256)
            R = torch.zeros(slab, device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters, R, arrived)
            fns[v or "persistent"] = (lambda k=k, a=a: k(*a))
        us = time_in_turns(fns, 7, 3000.0)
        print(f"W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.2f}" for key, u in us.items()), flush=True)


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
