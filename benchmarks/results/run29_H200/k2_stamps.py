"""Diagnostic (run 29, K2): the persistent push kernel (loopback) as run (diag_kernel, V='') vs v2 (the storing
warp's waits moved into the next tile's loop; fused epilogue; C by bulk copies), and v2's phases by clock stamps."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from diag_kernel import MAX_TILES, SLOTS, diag_kernel, diag_v2_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import push_shapes  # noqa: E402

SHAPES = [(4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)), (8, (8192, 8192, 1024)), (8, (16384, 8192, 1024))]
VARIANTS = [("persistent", diag_kernel, ""), ("v2", diag_v2_kernel, ""), ("v2 gpu", diag_v2_kernel, "gpu"),
            ("v2 s=2,4,6", diag_v2_kernel, "s=2,4,6"), ("v2 s=4,8,12", diag_v2_kernel, "s=4,8,12"),
            ("v2 s=1,1,1", diag_v2_kernel, "s=1,1,1"), ("v2 stamps", diag_v2_kernel, "stamps")]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    import os

    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    out = Path(os.environ.get("DIAG_OUT", "."))
    jobs = [(fn, (M, N, K, W, v)) for W, (M, N, K) in SHAPES for _, fn, v in VARIANTS]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in SHAPES]
    compile_all(jobs, 16)
    for W, (M, N, K) in SHAPES:
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = sum(X[d * (M // W):(d + 1) * (M // W)].float() @ B.float() for d in range(W))
        fns = {"cublas": lambda: torch.matmul(X, B, out=Cf)}
        fl = gemm_flat_kernel(M, N, K, *FLAT)
        fns["flat"] = lambda: fl(X, B, Cf)
        S = torch.zeros(132, MAX_TILES, SLOTS, device="cuda", dtype=torch.int64)
        stamped = None
        for name, fn, v in VARIANTS:
            k = fn(M, N, K, W, v)
            C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            slab, words = push_shapes(M, N, W, 128, 256)
            R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters, S)
            errs = []
            for _ in range(3):   # back-to-back calls (the halves of R alternate), each checked
                C.fill_(float("nan"))
                k(*a)
                torch.cuda.synchronize()
                errs.append((C.float() - ref).abs().max().item() / ref.abs().max().item())
            print(f"  W={W} {M}x{N}x{K} {name}: rel max err {', '.join(f'{x:.3g}' for x in errs)}", flush=True)
            fns[name] = (lambda k=k, a=a: k(*a))
            if "stamps" in v:
                stamped = (k, a)
        us = time_in_turns(fns, 7, 3000.0)
        print(f"W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.3f}" for key, u in us.items())
              + f"  (cublas {us['cublas']:.1f} us)", flush=True)
        k, a = stamped
        for _ in range(3):
            k(*a)
        S.zero_()
        torch.cuda.synchronize()
        k(*a)
        torch.cuda.synchronize()
        s = S.cpu()
        torch.save(s, out / f"v2stamps_W{W}_{M}x{N}x{K}.pt")
        ntiles = [int((s[b, :, 0] != 0).sum()) for b in range(132)]
        ghz = []
        for b in range(132):
            n = ntiles[b]
            if n >= 2:
                dc, dt = int(s[b, n - 1, 9] - s[b, 0, 0]), int(s[b, n - 1, 14] - s[b, 0, 10])
                if dt > 0:
                    ghz.append(dc / dt)
        f = sorted(ghz)[len(ghz) // 2]
        phases = {"tile (start to next start)": [], "K loop (S0->S2)": [], "read wait, step s1 (B)": [],
                  "release, step s2 (B)": [], "acquire + load, step s3 (B)": [], "sum-in wait/issue (S2->S4)": [],
                  "landed (S4->S5)": [], "add + write Rs (S5->S6)": [], "store issue (S6->S9)": [],
                  "epilogue B (S2->S9)": [], "WG A: epilogue (S7->S13)": [], "gap to next (S9->S0')": []}
        early = [0, 0]
        for b in range(132):
            for j in range(ntiles[b]):
                r = [int(x) for x in s[b, j]]
                phases["K loop (S0->S2)"].append(r[2] - r[0])
                phases["read wait, step s1 (B)"].append(r[1])
                phases["release, step s2 (B)"].append(r[3])
                phases["acquire + load, step s3 (B)"].append(r[15])
                phases["sum-in wait/issue (S2->S4)"].append(r[4] - r[2])
                phases["landed (S4->S5)"].append(r[5] - r[4])
                phases["add + write Rs (S5->S6)"].append(r[6] - r[5])
                phases["store issue (S6->S9)"].append(r[9] - r[6])
                phases["epilogue B (S2->S9)"].append(r[9] - r[2])
                phases["WG A: epilogue (S7->S13)"].append(r[13] - r[7])
                early[r[12]] += 1
                if j + 1 < ntiles[b]:
                    n0 = int(s[b, j + 1, 0])
                    phases["tile (start to next start)"].append(n0 - r[0])
                    phases["gap to next (S9->S0')"].append(n0 - r[9])
        print(f"  v2 stamps: SM clock {f:.3f} GHz, tiles per block {min(ntiles)}-{max(ntiles)}; sum in started "
              f"early {early[1]} / late {early[0]}")
        print(f"  {'phase':44s} {'p10':>8s} {'median':>8s} {'p90':>8s} {'max':>8s}  (us)")
        for name, xs in phases.items():
            print(f"  {name:44s} " + " ".join(f"{pct(xs, q) / f / 1e3:8.3f}" for q in (0.1, 0.5, 0.9, 0.999)),
                  flush=True)


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
