"""Diagnostic (run 29, K3): hand-written warp specialisation (.device/k3/manual.py) vs tilelang's automatic one:
the flat persistent GEMM (flat_ws vs flat), and GEMM+RS's persistent push kernel (loopback) with a warp of its own
for the sums (push_ws) vs the kernel as run (persistent). Every result checked (3 back-to-back calls, poisoned)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from diag_kernel import MAX_TILES, SLOTS, diag_kernel  # noqa: E402
from manual import flat_ws_kernel, push_ws_kernel, push_ws_nosync_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import push_shapes  # noqa: E402

SHAPES = [(4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024))]
PUSH = [("persistent", diag_kernel, "", True), ("push_ws", push_ws_kernel, "", False),
        ("push_ws gpu", push_ws_kernel, "gpu", False), ("push_ws nosync", push_ws_nosync_kernel, "", False),
        ("push_ws nosync gpu", push_ws_nosync_kernel, "gpu", False)]


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    jobs = [(fn, (M, N, K, W, v)) for W, (M, N, K) in SHAPES for _, fn, v, _ in PUSH]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in SHAPES]
    jobs += [(flat_ws_kernel, (M, N, K)) for W, (M, N, K) in SHAPES]
    compile_all(jobs, 16)
    for W, (M, N, K) in SHAPES:
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        full_ref = X.float() @ B.float()
        ref = sum(full_ref[d * (M // W):(d + 1) * (M // W)] for d in range(W))
        fns = {"cublas": lambda: torch.matmul(X, B, out=Cf)}
        fl = gemm_flat_kernel(M, N, K, *FLAT)
        fns["flat"] = lambda: fl(X, B, Cf)
        fw = flat_ws_kernel(M, N, K)
        Cw = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        fw(X, B, Cw)
        torch.cuda.synchronize()
        err = (Cw.float() - full_ref).abs().max().item() / full_ref.abs().max().item()
        print(f"  W={W} {M}x{N}x{K} flat_ws: rel max err {err:.3g}", flush=True)
        fns["flat_ws"] = lambda: fw(X, B, Cw)
        S = torch.zeros(132, MAX_TILES, SLOTS, device="cuda", dtype=torch.int64)
        for name, fn, v, stamps in PUSH:
            k = fn(M, N, K, W, v)
            C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            slab, words = push_shapes(M, N, W, 128, 256)
            R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters) + ((S,) if stamps else ())
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
