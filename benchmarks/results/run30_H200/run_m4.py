"""Diagnostic (run 30, M4): the push kernel's copy with switches (diag_m1.py) vs the committed kernel, the flat
loop and cuBLAS, loopback, timed in turns; then each run alone for ~1 s while nvidia-smi samples the SM clock and
the power drawn."""
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]
from diag_m1 import diag_kernel  # noqa: E402
from probe_m1 import probe_kernel  # noqa: E402

import tilescale  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_loopback_kernel, push_shapes  # noqa: E402

SHAPES = [(8, (8192, 8192, 1024)), (8, (16384, 8192, 1024)), (4, (8192, 8192, 2048)), (4, (16384, 8192, 2048)),
          (2, (8192, 8192, 4096))]
VS = ["", "lsupush", "lsupush lsuload", "noring"]
CHECKED = {"op", "copy", "lsupush", "lsupush lsuload"}
SAMPLED = []


class Smi:
    def __init__(self):
        self.rows = []
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks.mem,temperature.gpu",
                                   "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.rows.append((time.monotonic(), [float(x) for x in line.split(",")]))
            except ValueError:
                pass

    def window(self, t0, t1):
        xs = [v for t, v in self.rows if t0 <= t <= t1]
        if not xs:
            return None
        return [statistics.median(v[i] for v in xs) for i in range(4)] + [len(xs)]

    def stop(self):
        self.p.terminate()
        self.p.wait(5)


def main():
    import torch
    from bench_gemm_configs import FLAT, gemm_flat_kernel, time_in_turns

    from tilescale.ops.prebuild import compile_all
    cfg = (128, 256, 64, 3, 256, 10)
    jobs = [(diag_kernel, (M, N, K, W, v)) for W, (M, N, K) in SHAPES for v in VS]
    jobs += [(gemm_rs_push_loopback_kernel, (M, N, K, W, "bfloat16", *cfg, 132)) for W, (M, N, K) in SHAPES]
    jobs += [(probe_kernel, (132, 3 * 128 * 64 + 3 * 64 * 256 + 128 * 264))]
    jobs += [(gemm_flat_kernel, (M, N, K, *FLAT)) for W, (M, N, K) in SHAPES]
    t = time.time()
    compile_all(jobs, 16)
    print(f"compiled {len(jobs)} kernels in {time.time() - t:.0f} s", flush=True)
    cnt = torch.zeros(2, device="cuda", dtype=torch.int32)
    probe_kernel(132, 3 * 128 * 64 + 3 * 64 * 256 + 128 * 264)(cnt)
    torch.cuda.synchronize()
    print(f"probe: {cnt[1].item()} of 132 CTAs (2-CTA clusters, the push kernel's shared memory) saw all resident",
          flush=True)
    smi = Smi()
    sampled = []
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
        slab, words = push_shapes(M, N, W, 128, 256)
        for name in ["op"] + VS:
            k = gemm_rs_push_loopback_kernel(M, N, K, W, "bfloat16", *cfg, 132) if name == "op" else \
                diag_kernel(M, N, K, W, name)
            C = torch.full((M // W, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            R = torch.full(slab, float("nan"), device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros((M // 128) * (N // 256), device="cuda", dtype=torch.int64)
            a = (X, B, C, R, arrived, counters, R, arrived)
            key = name or "copy"
            if key in CHECKED:
                errs = []
                for _ in range(3):
                    C.fill_(float("nan"))
                    k(*a)
                    torch.cuda.synchronize()
                    errs.append((C.float() - ref).abs().max().item() / ref.abs().max().item())
                print(f"  W={W} {M}x{N}x{K} {key}: rel max err {', '.join(f'{x:.3g}' for x in errs)}"
                      + ("" if max(errs) < 2e-2 else "  WRONG"), flush=True)
            fns[key] = (lambda k=k, a=a: k(*a))
        us = time_in_turns(fns, 7, 3000.0)
        print(f"W={W} {M}x{N}x{K}: " + ", ".join(f"{key}={us['cublas'] / u:.3f}" for key, u in us.items())
              + f"  (cublas {us['cublas']:.1f} us)", flush=True)
        if W == 2:
            continue
        for key in SAMPLED:
            fn = fns[key]
            torch.cuda.synchronize()
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < 1.2:
                for _ in range(10):
                    fn()
                n += 10
                torch.cuda.synchronize()
            t1 = time.monotonic()
            w = smi.window(t0 + 0.3, t1)
            sampled.append((f"W={W} {M}x{N}x{K}", key, (t1 - t0) / n * 1e6, w))
    smi.stop()
    print("\nalone for ~1.2 s each, nvidia-smi every 50 ms (median of the samples after the first 0.3 s):")
    print("| shape | kernel | us per call (incl. syncs) | SM MHz | power W | mem MHz | temp C | samples |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, key, us, w in sampled:
        if w is None:
            print(f"| {shape} | {key} | {us:.1f} | - | - | - | - | 0 |")
        else:
            print(f"| {shape} | {key} | {us:.1f} | {w[0]:.0f} | {w[1]:.0f} | {w[2]:.0f} | {w[3]:.0f} | {w[4]} |")


if __name__ == "__main__":
    tilescale.init_distributed()
    main()
