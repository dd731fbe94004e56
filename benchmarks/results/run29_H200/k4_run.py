"""Diagnostic (run 29, K4): GEMM+RS's push kernels on the loopback (rank 0 of W on one GPU), every per-rank shape of
the benchmarks: the op's kernels as run (grid: the step-by-step grid; persistent: tilelang's warp specialisation) vs
the hand-specialised persistent kernel (push_ws: a warp of its own for the sums; push_swz: the same with a swizzled
tile, written by stmatrix, C by TMA store), vs cuBLAS and the flat loop. Each result checked (3 calls, poisoned)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from manual import push_swz_kernel, push_ws_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_loopback_kernel, push_shapes  # noqa: E402

SHAPES = [(2, (8192, 8192, 4096)), (2, (16384, 8192, 4096)), (2, (8192, 8192, 14336)),
          (4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (4, (8192, 8192, 7168)),
          (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024)), (8, (8192, 8192, 3584))]


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    cfg = (128, 256, 64, 3, 256, 10)
    kern = {"grid": lambda M, N, K, W: (gemm_rs_push_loopback_kernel, (M, N, K, W, "bfloat16", *cfg)),
            "persistent": lambda M, N, K, W: (gemm_rs_push_loopback_kernel, (M, N, K, W, "bfloat16", *cfg, 132)),
            "push_ws": lambda M, N, K, W: (push_ws_kernel, (M, N, K, W, "")),
            "push_swz": lambda M, N, K, W: (push_swz_kernel, (M, N, K, W, ""))}
    jobs = [f(M, N, K, W) for W, (M, N, K) in SHAPES for f in kern.values()]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in SHAPES]
    compile_all(jobs, 16)
    for W, (M, N, K) in SHAPES:
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        full_ref = X.float() @ B.float()
        ref = sum(full_ref[d * (M // W):(d + 1) * (M // W)] for d in range(W))
        del full_ref
        fns = {"cublas": lambda: torch.matmul(X, B, out=Cf)}
        fl = gemm_flat_kernel(M, N, K, *FLAT)
        fns["flat"] = lambda: fl(X, B, Cf)
        for name, f in kern.items():
            fn, args = f(M, N, K, W)
            k = fn(*args)
            C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            slab, words = push_shapes(M, N, W, 128, 256)
            R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters) + ((R, arrived) if fn is gemm_rs_push_loopback_kernel else ())
            errs = []
            for _ in range(3):
                C.fill_(float("nan"))
                k(*a)
                torch.cuda.synchronize()
                errs.append((C.float() - ref).abs().max().item() / ref.abs().max().item())
            print(f"  W={W} {M}x{N}x{K} {name}: rel max err {', '.join(f'{x:.3g}' for x in errs)}", flush=True)
            fns[name] = (lambda k=k, a=a: k(*a))
        us = time_in_turns(fns, 7, 3000.0)
        print(f"W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.3f}" for key, u in us.items())
              + f"  (cublas {us['cublas']:.1f} us)", flush=True)


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
