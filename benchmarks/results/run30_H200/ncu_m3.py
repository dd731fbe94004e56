"""M3's ncu step: the flat loop, the push kernel's copy and its `noring` variant, W = 8 8192x8192x1024, two calls
each (the second counts), for `ncu` to profile (kernel names: gemm_flat*, gemm_rs_push*)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from diag_m1 import diag_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import push_shapes  # noqa: E402


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel
    W, M, N, K = 8, 8192, 8192, 1024
    X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    fl = gemm_flat_kernel(M, N, K, *FLAT)
    slab, words = push_shapes(M, N, W, 128, 256)
    runs = [("flat", lambda: fl(X, B, Cf))]
    for name in ["", "noring"]:
        k = diag_kernel(M, N, K, W, name)
        C = torch.empty((M // W, N), device="cuda", dtype=torch.bfloat16)
        R = torch.zeros(slab, device="cuda", dtype=torch.bfloat16)
        arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
        counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
        runs.append((name or "copy", lambda k=k, a=(X, B, C, R, arrived, counters, R, arrived): k(*a)))
    torch.cuda.synchronize()
    for name, fn in runs:
        print(f"ncu: {name}", flush=True)
        fn()
        fn()
        torch.cuda.synchronize()


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
