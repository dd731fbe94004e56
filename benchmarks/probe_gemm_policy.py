"""Probe: how the tile loop's wgmma is laid out over its warpgroups, and a persistent tile loop, vs cuBLAS, on ONE GPU.

    GPUS=1 bash launch.sh benchmarks/probe_gemm_policy.py --json policy.json
    python benchmarks/probe_gemm_policy.py --compile-check        # build every kernel for sm_90a (CPU)
    python benchmarks/probe_gemm_policy.py --wgmma                # the wgmma shape of each kernel (CPU, no nvcc)

The fused ops' tile loop (tilescale/ops/gemm.py) calls ``T.gemm(As, Bs, Cl)`` with tilelang's default warp policy,
``Square``: a 128x256 tile on two consumer warpgroups is split along N, each warpgroup computing 128x128 as two
``wgmma m64n128k16`` per K step of 16, so B's 16x128 slice is read from shared memory twice and A's rows once per
instruction; a 256x128 tile becomes four ``m64n64k16``. ``FullRow`` splits the tile along M instead: 64x256 per
warpgroup, one ``m64n256k16`` (the layout of CUTLASS's and cuBLAS's 128x256 Hopper kernels), about 17% less
shared-memory traffic per multiply-add. This probe times both, and a persistent loop over the tiles (one block
per SM, ``T.Persistent``: the producer warpgroup loads the next tile's first stages while the consumers store this
one), per GEMM shape of the fused ops' benchmarks, against cuBLAS, timed in turns (tests nothing: a table).

Each kernel's result is checked against cuBLAS (relative error < 1e-2) before it is timed. Shapes (M, N, K): AG+GEMM's
(the full M) and GEMM+RS's per-rank GEMMs at W = 2, 4, 8 (K / W), as benchmarks/bench_gemm_configs.py.
"""
import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_gemm_configs import AG_SHAPES, RS_SHAPES, SMS, WORLD_SIZES, build_tirs, time_in_turns  # noqa: E402
from timing import print_table  # noqa: E402

import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402

POLICIES = {"sq": "Square", "fr": "FullRow"}
# (block_m, block_n, block_k, stages, swizzle); every one with 256 consumer threads (two warpgroups)
PLAIN = [(128, 256, 64, 3, 10), (128, 256, 64, 4, 10), (128, 256, 64, 3, 4), (256, 128, 64, 3, 10),
         (256, 128, 64, 4, 10)]
PERSISTENT = [(128, 256, 64, 3, 8), (256, 128, 64, 3, 8)]      # swizzle: T.Persistent's group size


def shapes() -> list[tuple[int, int, int]]:
    """[(M, N, K)] in table order."""
    out = [(M, N, K) for M, K, N in AG_SHAPES]
    for W in WORLD_SIZES:
        out += [(M, N, K // W) for M, K, N in RS_SHAPES]
    return out


@T.macro
def _tile(A, B, C, by, bx, block_m: int, block_n: int, block_k: int, stages: int, pol, dtype: str):
    """One output tile, ``C[by, bx] = A[by, :] @ B[:, bx]``: the fused ops' tile loop with warp policy `pol`."""
    As = T.alloc_shared((block_m, block_k), dtype)
    Bs = T.alloc_shared((block_k, block_n), dtype)
    Cl = T.alloc_fragment((block_m, block_n), "float32")
    Cs = T.alloc_shared((block_m, block_n), dtype)
    T.clear(Cl)
    for ko in T.Pipelined(T.ceildiv(A.shape[1], block_k), num_stages=stages):
        T.copy(A[by * block_m, ko * block_k], As)
        T.copy(B[ko * block_k, bx * block_n], Bs)
        T.gemm(As, Bs, Cl, policy=pol)
    T.copy(Cl, Cs)
    T.copy(Cs, C[by * block_m, bx * block_n])


@tilescale.jit
def gemm_kernel(block_m: int, block_n: int, block_k: int, stages: int, swizzle: int, policy: str,
                persistent: bool = False, dtype: str = "bfloat16"):
    """C = A @ B with the fused ops' tile loop and warp `policy`; M, N, K at run time. One block per tile (tiles
    launched in panels of `swizzle` rows), or `persistent`: SMS blocks walking the tiles (``T.Persistent``, groups
    of `swizzle`)."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")
    pol = getattr(T.GemmWarpPolicy, POLICIES[policy])

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        if persistent:
            with T.Kernel(SMS, threads=256) as bid:
                for by, bx in T.Persistent([T.ceildiv(M, block_m), T.ceildiv(N, block_n)], SMS, bid, swizzle):
                    _tile(A, B, C, by, bx, block_m, block_n, block_k, stages, pol, dtype)
        else:
            with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=256) as (bx, by):
                T.use_swizzle(panel_size=swizzle)
                _tile(A, B, C, by, bx, block_m, block_n, block_k, stages, pol, dtype)

    return gemm


def builds() -> list[tuple]:
    """[(name, args of gemm_kernel)]: every plain config in both policies, the persistent ones in FullRow."""
    out = [(f"{bm}x{bn}x{bk} s{s} sw{sw} {pol}", (bm, bn, bk, s, sw, pol))
           for bm, bn, bk, s, sw in PLAIN for pol in POLICIES]
    return out + [(f"{bm}x{bn}x{bk} s{s} pers fr", (bm, bn, bk, s, g, "fr", True)) for bm, bn, bk, s, g in PERSISTENT]


def compile_all(build_only: bool, workers: int) -> tuple[dict, dict]:
    """({name: kernel or None}, {name: error}) of :func:`builds` (bench_gemm_configs.build_tirs)."""
    return build_tirs([(name, gemm_kernel.get_tir(*args)) for name, args in builds()], workers, build_only)


def run(args) -> None:
    import torch

    kernels, errors = compile_all(False, args.workers)
    results, rows = [], []
    for M, N, K in shapes():
        g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
        ref = torch.matmul(A, B)
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns = {"cublas": lambda: torch.matmul(A, B, out=C)}
        notes = {}
        for name, k in kernels.items():
            if k is None:
                continue
            C.fill_(float("nan"))
            k(A, B, C)
            torch.cuda.synchronize()
            err = ((C.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            if not err < 1e-2:
                notes[name] = f"wrong result: max rel err {err:.3g}"
                continue
            fns[name] = (lambda k=k: k(A, B, C))
        us = time_in_turns(fns, args.reps, args.target_us)
        cub = us.pop("cublas")
        eff = {n: cub / t for n, t in us.items()}

        def best(pred):
            names = [n for n in eff if pred(n)]
            return max(names, key=eff.get) if names else None

        b_sq, b_fr = best(lambda n: n.endswith(" sq")), best(lambda n: n.endswith(" fr") and "pers" not in n)
        b_p = best(lambda n: "pers" in n)
        results.append(dict(M=M, N=N, K=K, cublas_us=cub, us=us, notes=notes))

        def cell(n):
            return "-" if n is None else f"{eff[n]:.3f} ({n})"

        rows.append([f"{M}x{N}x{K}", f"{cub:.0f}", cell(b_sq), cell(b_fr), cell(b_p),
                     f"{eff[b_fr] / eff[b_sq]:.3f}" if b_sq and b_fr else "-"])
        print(f"{M}x{N}x{K}: cuBLAS {cub:.1f} us; " + ", ".join(f"{n} {e:.3f}" for n, e in sorted(eff.items()))
              + (f"; notes {notes}" if notes else ""), flush=True)
    print_table(f"GEMM bf16, one {torch.cuda.get_device_name()}: cuBLAS time / ours (best config of each kind)",
                ["MxNxK", "cuBLAS us", "Square (best)", "FullRow (best)", "persistent FullRow (best)",
                 "FullRow / Square"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), reps=args.reps, results=results, errors=errors), f,
                      indent=1)


def wgmma_shapes() -> None:
    """The wgmma instructions each kernel lowers to (tilelang's CUDA source; no nvcc, no GPU)."""
    import re

    from tilescale.build_only import lower_source

    for name, args in builds():
        src = lower_source(gemm_kernel.get_tir(*args))
        found = sorted(set(re.findall(r"wgmma_ss<[^>]*?, (\d+), (\d+), (\d+), ", src)))
        print(f"{name:28s} " + ", ".join(f"m{m}n{n}k{k}" for m, n, k in found))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--target-us", type=float, default=3000.0)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 2))
    ap.add_argument("--compile-check", action="store_true")
    ap.add_argument("--wgmma", action="store_true")
    args = ap.parse_args()
    if args.wgmma:
        wgmma_shapes()
    elif args.compile_check:
        _, errors = compile_all(True, args.workers)
        sys.exit(1 if errors else 0)
    else:
        run(args)


if __name__ == "__main__":
    main()
