"""Diagnostic (run 29, K5): the push kernel as committed (loopback) vs its copy with wgmma kept one step in flight
(async), and both with clock stamps of the multiplying warps' phases per tile."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from diag5 import diag_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_loopback_kernel, push_shapes  # noqa: E402

SHAPES = [(4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024)),
          (2, (8192, 8192, 4096))]
VS = ["", "async", "stamps", "stamps async"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    cfg = (128, 256, 64, 3, 256, 10)
    jobs = [(diag_kernel, (M, N, K, W, v)) for W, (M, N, K) in SHAPES for v in VS]
    jobs += [(gemm_rs_push_loopback_kernel, (M, N, K, W, "bfloat16", *cfg, 132)) for W, (M, N, K) in SHAPES]
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
        S = torch.zeros(132, 32, 16, device="cuda", dtype=torch.int64)
        stamped = {}
        slab, words = push_shapes(M, N, W, 128, 256)
        for name in ["op"] + VS:
            if name == "op":
                k = gemm_rs_push_loopback_kernel(M, N, K, W, "bfloat16", *cfg, 132)
            else:
                k = diag_kernel(M, N, K, W, name)
            C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters, R, arrived) + (() if name == "op" else (S,))
            errs = []
            for _ in range(3):
                C.fill_(float("nan"))
                k(*a)
                torch.cuda.synchronize()
                errs.append((C.float() - ref).abs().max().item() / ref.abs().max().item())
            print(f"  W={W} {M}x{N}x{K} {name or 'copy'}: rel max err {', '.join(f'{x:.3g}' for x in errs)}", flush=True)
            fns[name or "copy"] = (lambda k=k, a=a: k(*a))
            if "stamps" in name:
                stamped[name] = (k, a)
        us = time_in_turns(fns, 7, 3000.0)
        print(f"W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.3f}" for key, u in us.items())
              + f"  (cublas {us['cublas']:.1f} us)", flush=True)
        for name, (k, a) in stamped.items():
            for _ in range(3):
                k(*a)
            S.zero_()
            torch.cuda.synchronize()
            k(*a)
            torch.cuda.synchronize()
            s = S.cpu()
            n = [int((s[b, :, 0] != 0).sum()) for b in range(132)]
            ghz = sorted(int(s[b, n[b] - 1, 4] - s[b, 0, 0]) / int(s[b, n[b] - 1, 14] - s[b, 0, 10])
                         for b in range(132) if n[b] >= 2)
            f = ghz[len(ghz) // 2]
            ph = {"tile (start to next start)": [], "K loop (S0->S1)": [], "landed (S1->S2)": [],
                  "add + write (S2->S3)": [], "fence + arrive (S3->S4)": [], "gap to next (S4->S0')": []}
            for b in range(132):
                for j in range(n[b]):
                    r = [int(x) for x in s[b, j]]
                    ph["K loop (S0->S1)"].append(r[1] - r[0])
                    ph["landed (S1->S2)"].append(r[2] - r[1])
                    ph["add + write (S2->S3)"].append(r[3] - r[2])
                    ph["fence + arrive (S3->S4)"].append(r[4] - r[3])
                    if j + 1 < n[b]:
                        ph["tile (start to next start)"].append(int(s[b, j + 1, 0]) - r[0])
                        ph["gap to next (S4->S0')"].append(int(s[b, j + 1, 0]) - r[4])
            print(f"  {name}: SM clock {f:.3f} GHz; per tile, us: p10 / median / p90 / max")
            for key, xs in ph.items():
                print(f"    {key:30s} " + " ".join(f"{pct(xs, q) / f / 1e3:8.3f}" for q in (0.1, 0.5, 0.9, 0.999)),
                      flush=True)


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
