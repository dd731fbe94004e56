"""Diagnostic (run 29, K7): the push kernel as committed (loopback) vs the ping-pong prototype (pingpong.py: each
multiplying warpgroup runs its own 128x128 tiles from its own ring), timing in turns, each result checked."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from pingpong import pingpong_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_loopback_kernel, push_shapes  # noqa: E402

SHAPES = [(4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024)),
          (2, (8192, 8192, 4096))]


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    cfg = (128, 256, 64, 3, 256, 10)
    jobs = [(pingpong_kernel, (M, N, K, W, "")) for W, (M, N, K) in SHAPES]
    jobs += [(gemm_rs_push_loopback_kernel, (M, N, K, W, "bfloat16", *cfg, 132)) for W, (M, N, K) in SHAPES]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in SHAPES]
    compile_all(jobs, 16)
    for rep in range(2):
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
            for name in ("op", "pingpong"):
                if name == "op":
                    k = gemm_rs_push_loopback_kernel(M, N, K, W, "bfloat16", *cfg, 132)
                    slab, words = push_shapes(M, N, W, 128, 256)
                    bn = 256
                else:
                    k = pingpong_kernel(M, N, K, W, "")
                    slab, words = push_shapes(M, N, W, 128, 128)
                    bn = 128
                C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
                arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
                counters = torch.zeros((M // 128) * (N // bn), device="cuda", dtype=torch.int64)
                a = (X, B, C, R, arrived, counters, R, arrived)
                errs = []
                for _ in range(3):
                    C.fill_(float("nan"))
                    k(*a)
                    torch.cuda.synchronize()
                    errs.append((C.float() - ref).abs().max().item() / ref.abs().max().item())
                assert max(errs) < 2e-2, (name, errs)
                fns[name] = (lambda k=k, a=a: k(*a))
            us = time_in_turns(fns, 9, 3000.0)
            print(f"[{rep}] W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.3f}" for key, u in us.items())
                  + f"  (cublas {us['cublas']:.1f} us)", flush=True)


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
