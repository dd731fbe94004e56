"""Tile configurations of the GEMM inside the fused kernels, per shape, on ONE GPU (no communication).

    GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --json gemm_configs.json   # ~2 min on one H200
    python benchmarks/bench_gemm_configs.py --dry-run                         # candidates per shape, no GPU
    python benchmarks/bench_gemm_configs.py --compile-check [--only 1,5]      # build candidates for sm_90a (CPU)
    python benchmarks/bench_gemm_configs.py --write-tuning tilescale/ops/gemm_tuning.json --from gemm_configs.json
    python benchmarks/bench_gemm_configs.py --write-tuning tilescale/ops/gemm_tuning.json --from h100.json \
        --merge tilescale/ops/gemm_tuning.json     # add (or replace) one GPU's entries, keep the other GPUs'
    GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --persistent   # GEMM+RS's GEMM: a persistent kernel too
    GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py --push         # GEMM+RS's push kernel, per shape and W

The kernel is the fused ops' tile loop (tilescale/ops/gemm.py) without waits or counts: TMA loads
of A and B tiles in a `stages`-deep pipeline, wgmma, the C tile through shared memory to global with a TMA
store (`epilogue` "tma", as in AG+GEMM), or with a TMA store whose completion each consumer warp then counts
with a release add (`T.release_stores`, "signal", as in GEMM+RS, so its epilogue costs what it costs there).
M, N and K are run-time sizes, so one build per configuration serves every shape; all builds run in parallel
threads.

Shapes: the per-rank GEMMs of the fused-kernel baselines (DEVICE.md) at W = 2, 4 and 8, bf16:
AG+GEMM (M, K) x (K, N) with the full M (the same GEMM for every W; W only limits block_m), GEMM+RS
(M, K/W) x (K/W, N). Each candidate is checked against cuBLAS (torch.matmul) once, then timed with CUDA
events: warm-up, then `--reps` rounds that time every candidate of the shape in turn (round-robin, so
clocks and heat hit all alike); the median round counts. L2 is not flushed (the same for every candidate
and for cuBLAS). Prints one table row per (op, W, shape) and writes JSON with every timing and the best
configuration per shape; --write-tuning turns that JSON into tilescale's tuning table (tilescale.ops.gemm.tuning_table).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from timing import round_us  # noqa: E402

import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402
from tilescale.compat import storing_warp  # noqa: E402
from tilescale.ops.gemm import (  # noqa: E402
    DEFAULT,
    GemmConfig,
    check,
    main_loop,
    split_block,
    split_buffers,
    split_plan,
    split_tile_loop,
    split_workspace,
    tile_buffers,
    tile_loop,
    tile_order,
    tuning_table,
)

SMS = 132
AG_SHAPES = [(4096, 8192, 2048), (4096, 8192, 7168), (8192, 8192, 2048), (8192, 8192, 7168),
             (16384, 8192, 2048), (16384, 8192, 7168), (8192, 4096, 2752)]       # (M, K, N), as bench_fused
RS_SHAPES = [(8192, 8192, 8192), (16384, 8192, 8192), (8192, 28672, 8192)]       # (M, K, N), K the full K
WORLD_SIZES = (2, 4, 8)

# Block shapes tried (swizzle 10 unless said otherwise). 128x256x64 s3 is the default; the others trade
# tile size (waves, L2 reuse), pipeline depth and warpgroups per tile. Shared memory of each: GemmConfig.smem_bytes.
BASE = [
    GemmConfig(128, 256, 64, 3, 256),
    GemmConfig(128, 256, 64, 4, 256),
    GemmConfig(128, 256, 128, 2, 256),
    GemmConfig(128, 128, 64, 4, 256),
    GemmConfig(128, 128, 64, 5, 256),
    GemmConfig(128, 128, 128, 3, 256),
    GemmConfig(128, 192, 64, 4, 256),
    GemmConfig(128, 192, 64, 4, 384),
    GemmConfig(64, 256, 64, 4, 128),
    GemmConfig(256, 128, 64, 3, 256),
    GemmConfig(256, 128, 64, 4, 256),
]
SWIZZLE_OF = [GemmConfig(128, 256, 64, 3, 256), GemmConfig(256, 128, 64, 3, 256)]
SWIZZLES = (0, 4, 16)
EPILOGUES = ("tma", "signal")
# --push only, to split the cost of "signal": the same counts released at GPU scope (enough on one GPU, not across
# GPUs: the fence of a system-scope release is what it drops)
DIAGNOSTIC_EPILOGUES = ("signal_gpu",)


def candidates(epilogue: str) -> list[GemmConfig]:
    """Configurations built for one epilogue ("tma": AG+GEMM; "signal": GEMM+RS, whole tiles of N only)."""
    out = list(BASE) + [GemmConfig(c.block_m, c.block_n, c.block_k, c.stages, c.threads, s)
                        for c in SWIZZLE_OF for s in SWIZZLES]
    if epilogue == "signal":  # GEMM+RS needs N % block_n == 0; every RS shape has N = 8192
        out = [c for c in out if 8192 % c.block_n == 0]
    return [c for c in out if check(c, 1 << 20, 1 << 20, 1 << 20) is None]


def problems():
    """[(op, W, (M, N, K) of one rank's GEMM)] in table order."""
    out = []
    for W in WORLD_SIZES:
        out += [("ag_gemm", W, (M, N, K)) for M, K, N in AG_SHAPES]
        out += [("gemm_rs", W, (M, N, K // W)) for M, K, N in RS_SHAPES]
    return out


def epilogue_of(op: str) -> str:
    return "tma" if op == "ag_gemm" else "signal"


def waves(cfg: GemmConfig, M: int, N: int) -> tuple[int, float]:
    tiles = math.ceil(M / cfg.block_m) * math.ceil(N / cfg.block_n)
    return tiles, tiles / (math.ceil(tiles / SMS) * SMS)


@tilescale.jit
def gemm_kernel(block_m: int, block_n: int, block_k: int, stages: int, threads: int, swizzle: int,
                epilogue: str = "tma", dtype: str = "bfloat16"):
    """C = A @ B with the fused kernels' tile loop; M, N, K are run-time sizes. "signal": `done` (one word per
    row of tiles) counts the written tiles as GEMM+RS's GEMM does (other epilogues ignore it)."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")
    if epilogue not in EPILOGUES + DIAGNOSTIC_EPILOGUES:
        raise ValueError(f"epilogue: got {epilogue!r}, expected one of {EPILOGUES + DIAGNOSTIC_EPILOGUES}")

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
             done: T.Tensor((T.ceildiv(M, block_m),), "uint64")):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            tile_loop(A, B, C, As, Bs, Cl, Cs, by, bx, stages, False)
            if epilogue == "signal":                 # (as GEMM+RS: once per tile, by the warp that stored it)
                if T.get_thread_binding() // 32 == storing_warp(threads):
                    T.release_stores(done[by], 1, scope="sys")
            elif epilogue == "signal_gpu":
                if T.get_thread_binding() // 32 == storing_warp(threads):
                    T.release_stores(done[by], 1, scope="gpu")

    return gemm


@tilescale.jit
def gemm_call_number_kernel(block_m: int, block_n: int, block_k: int, stages: int, threads: int, swizzle: int,
                            dtype: str = "bfloat16"):
    """--push's "tma_cn": the tile loop ("tma") after a ``T.call_number`` (the fused kernels' device call count:
    one atomic per block, which the whole block awaits before its main loop), counted in `counts` (one word per
    block)."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
             counts: T.Tensor((T.ceildiv(M, block_m) * T.ceildiv(N, block_n),), "int64")):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            T.call_number(counts)
            tile_loop(A, B, C, As, Bs, Cl, Cs, by, bx, stages, False)

    return gemm


@tilescale.jit
def gemm_split_kernel(M: int, N: int, K: int, block_m: int, block_n: int, block_k: int, stages: int, threads: int,
                      swizzle: int, sms: int = SMS, dtype: str = "bfloat16"):
    """--split: C = A @ B with the last wave's tiles split along K (tilescale.ops.gemm.split_tile_loop), tiles in
    swizzled launch order on a 1-D grid; its parameters after C: split_buffers'. M, N, K fixed (the plan needs
    the tile count). The plan: any split the model expects to gain from (the fused ops ask for 2%)."""
    tiles_m, tiles_n, k_tiles = -(-M // block_m), -(-N // block_n), -(-K // block_k)
    plan = split_plan(tiles_m * tiles_n, sms, k_tiles, min_gain=0.0)
    Work, Arrived, Fixed = split_buffers(plan, block_m, block_n)

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype), work: Work,
             arrived: Arrived, fixed: Fixed):
        with T.Kernel(plan.blocks, threads=threads) as b:
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, 0)
            t, s, k0, kn = split_block(b, plan, k_tiles)
            rb, bx = tile_order(t, tiles_m, tiles_n, swizzle)
            split_tile_loop(A, B, C, As, Bs, Cl, Cs, work, arrived, fixed, rb, bx, t, s, k0, kn, plan, stages,
                            threads // 32)

    return gemm


# GEMM+RS's GEMM as a persistent kernel (--persistent; not in the tuning table): one block
# per SM walks the tiles in the order the non-persistent kernel's swizzle launches them (panels of `swizzle` rows of
# tiles); its C tile has shared memory of its own (the next tile's loads overlap this tile's store); tile i is counted
# after tile i + 1's main loop, just before tile i + 1's store is issued, when its own write has long been done: no
# write is waited for, and no store is in flight when the count's release fence runs.
PERSISTENT = [GemmConfig(128, 256, 64, 3, 256, 10), GemmConfig(256, 128, 64, 3, 256, 10),
              GemmConfig(128, 128, 64, 4, 256, 10)]


@tilescale.jit
def gemm_persistent_kernel(block_m: int, block_n: int, block_k: int, stages: int, threads: int, swizzle: int = 10,
                           sms: int = SMS, dtype: str = "bfloat16"):
    """C = A @ B with the fused kernels' tile loop on `sms` persistent blocks, tiles in swizzled launch order, each
    counted in `done` (one word per row of tiles) just before the block's next tile is stored (its last tile: once
    written)."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
             done: T.Tensor((T.ceildiv(M, block_m),), "uint64")):
        with T.Kernel(sms, threads=threads) as bid:
            As = T.alloc_shared((block_m, block_k), dtype)
            Bs = T.alloc_shared((block_k, block_n), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            Cs = T.alloc_shared((block_m, block_n), dtype)
            tiles_m, tiles_n = T.ceildiv(M, block_m), T.ceildiv(N, block_n)
            tiles = tiles_m * tiles_n
            for it in T.serial(T.ceildiv(tiles, sms)):
                t = it * sms + bid
                if t < tiles:
                    by, bx = tile_order(t, tiles_m, tiles_n, swizzle)
                    main_loop(A, B, As, Bs, Cl, by, bx, stages)
                    if it > 0:   # the block's tile before this one: written long ago, counted now
                        T.release_stores(done[tile_order(t - sms, tiles_m, tiles_n, swizzle)[0]], 1, scope="sys")
                    T.copy(Cl, Cs)
                    T.copy(Cs, C[by * block_m, bx * block_n])
            if bid < tiles:      # the block's last tile
                last = (tiles - 1 - bid) // sms * sms + bid
                T.release_stores(done[tile_order(last, tiles_m, tiles_n, swizzle)[0]], 1, scope="sys")

    return gemm


@tilescale.jit
def gemm_flat_kernel(M: int, N: int, K: int, block_m: int, block_n: int, block_k: int, stages: int, threads: int,
                     swizzle: int = 10, sms: int = SMS, dtype: str = "bfloat16"):
    """--push's "flat": C = A @ B on `sms` persistent blocks through ONE pipelined loop over (tile, K tile), tiles in
    swizzled launch order: the producer loads the next tile's operands while this tile's epilogue runs (the
    persistent push kernel's loop, tilescale/ops/gemm_reduce_scatter.py, without its sums and counts). M, N, K
    fixed, as the push kernel's (the tile's indices are divisions by constants, in the producer's every step)."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(sms, threads=threads) as bid:
            As = T.alloc_shared((block_m, block_k), dtype)
            Bs = T.alloc_shared((block_k, block_n), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            Cs = T.alloc_shared((block_m, block_n), dtype)
            tiles_m, tiles_n = T.ceildiv(M, block_m), T.ceildiv(N, block_n)
            k_tiles = T.ceildiv(K, block_k)
            for it in T.Pipelined(T.ceildiv(tiles_m * tiles_n - bid, sms) * k_tiles, num_stages=stages):
                ko = it % k_tiles
                by, bx = tile_order((it // k_tiles) * sms + bid, tiles_m, tiles_n, swizzle)
                T.copy(A[by * block_m, ko * block_k], As)
                T.copy(B[ko * block_k, bx * block_n], Bs)
                T.gemm(As, Bs, Cl, clear_accum=ko == 0)   # (wgmma's scale-d: a T.clear here costs a select per
                                                          # accumulator register in every step)
                if ko == k_tiles - 1:
                    T.copy(Cl, Cs)
                    T.fence_proxy_async()   # else tilelang fences every step's wgmma (the store's lane alone fences)
                    T.copy(Cs, C[by * block_m, bx * block_n])

    return gemm


# --push's "flat": the persistent push kernel's config (no C tile aliasing the stages: a persistent block's stages hold
# the next tile's operands while its C tile is stored)
FLAT = (128, 256, 64, 3, 256, 8)


def kernel_key(cfg: GemmConfig, epilogue: str) -> tuple:
    return (cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads, cfg.swizzle, epilogue)


def all_builds() -> list[tuple]:
    """Every (config, epilogue) to build: the union over the epilogues the shapes need."""
    return [(c, e) for e in EPILOGUES for c in candidates(e)]


def compile_all(builds, workers: int, build_only: bool):
    """{kernel_key: kernel or None}, {kernel_key: error} of [(config, epilogue)] -- :func:`build_tirs`."""
    return build_tirs([(kernel_key(c, e), gemm_persistent_kernel.get_tir(*kernel_key(c, e)[:6]) if e == "persistent"
                        else gemm_kernel.get_tir(*kernel_key(c, e))) for c, e in builds],   # elaborated in this thread
                      workers, build_only)


def build_tirs(tirs, workers: int, build_only: bool):
    """{key: kernel or None}, {key: error} of [(key, prim_func)] -- all built in parallel threads (tilelang's
    lowering releases the GIL; nvcc runs as a subprocess); `build_only`: compile and link for sm_90a without a GPU
    (against tilescale's stub libcuda), load nothing. A kernel tilelang or nvcc refuses is noted, not raised."""
    flags = []
    if build_only:   # no driver here: link tilelang's -lcuda against tilescale's stub
        from tilescale.toolchain import stub_libcuda_dir

        stub = stub_libcuda_dir()
        flags = [f"-L{stub}"] if stub is not None else []

    def one(item):
        key, pf = item
        t0 = time.time()
        try:
            k = tilescale.build(pf, compile_flags=flags) if build_only else tilescale.compile(pf)
            return key, k, None, time.time() - t0
        except Exception as ex:  # noqa: BLE001  (a configuration tilelang or nvcc refuses: skipped, noted)
            msg = " ".join(str(ex).split())
            return key, None, f"{type(ex).__name__}: {msg[:300]}", time.time() - t0

    kernels, errors = {}, {}
    t0 = time.time()
    with ThreadPoolExecutor(max(1, workers)) as ex:
        for key, k, err, dt in ex.map(one, tirs):
            kernels[key] = k
            if err:
                errors[key] = err
            print(f"  built {key} in {dt:.0f} s{'' if err is None else ' -- FAILED: ' + err[:160]}", flush=True)
    print(f"compiled {len(tirs)} kernels in {time.time() - t0:.0f} s with {workers} threads, "
          f"{len(errors)} failed", flush=True)
    return kernels, errors


def time_in_turns(fns: dict, reps: int, target_us: float) -> dict:
    """{key: microseconds per call} of `fns` (one of them "cublas"): one warm-up call each, then `reps` rounds that
    time every fn in turn (round-robin, so clocks and heat hit all alike), each over as many back-to-back calls as
    take about `target_us` of cuBLAS (3 to 50); the median round counts."""
    import torch

    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    iters = max(3, min(50, math.ceil(target_us / max(round_us(fns["cublas"], 3), 1.0))))
    rounds = {key: [] for key in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            rounds[key].append(round_us(fn, iters))
    return {key: statistics.median(v) for key, v in rounds.items()}


def measure(shape, cands, kernels, reps: int, target_us: float) -> tuple[dict, float, dict]:
    """(us per candidate key, cuBLAS us, notes) for one GEMM shape."""
    import torch

    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
    ref = torch.matmul(A, B)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    dones = {}   # block_m -> the counts of "signal" (one word per row of tiles; every kernel takes one)
    fns, notes = {"cublas": lambda: torch.matmul(A, B, out=C)}, {}
    for key in cands:
        k = kernels.get(key)
        if k is None:
            continue
        C.fill_(float("nan"))
        done = dones.setdefault(key[0], torch.zeros(math.ceil(M / key[0]), device="cuda", dtype=torch.uint64))
        try:
            k(A, B, C, done)
            torch.cuda.synchronize()
        except Exception as ex:  # noqa: BLE001
            notes[key] = f"launch failed: {' '.join(str(ex).split())[:200]}"
            continue
        err = ((C.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        if not err < 1e-2:
            notes[key] = f"wrong result (max rel err {err:.3g} vs cuBLAS)"
            continue
        fns[key] = (lambda k=k, done=done: k(A, B, C, done))
    us = time_in_turns(fns, reps, target_us)
    cublas = us.pop("cublas")
    return us, cublas, notes


def run(args) -> None:
    import torch

    builds = all_builds()
    kernels, errors = compile_all(builds, args.workers, build_only=False)
    gpu = torch.cuda.get_device_name()
    shapes = {}   # (M, N, K, epilogue) -> [keys]
    for op, _W, shape in problems():
        e = epilogue_of(op)
        shapes.setdefault((*shape, e), [kernel_key(c, e) for c in candidates(e)])
    measured = {}
    t0 = time.time()
    for (M, N, K, e), keys in shapes.items():
        us, cublas, notes = measure((M, N, K), keys, kernels, args.reps, args.target_us)
        measured[(M, N, K, e)] = (us, cublas, notes)
        best = min(us, key=us.get) if us else None
        print(f"  {M}x{N}x{K} ({e}): cuBLAS {cublas:.0f} us, best {best} {us.get(best, float('nan')):.0f} us "
              f"({len(us)} timed)", flush=True)
    print(f"timed {len(shapes)} shapes in {time.time() - t0:.0f} s", flush=True)
    report(measured, errors, gpu, args)


def run_persistent(args) -> None:
    """--persistent: GEMM+RS's GEMM per shape (every W), its "signal" configs vs the persistent kernel's, vs cuBLAS."""
    import torch

    signal = [c for c in candidates("signal") if c.swizzle in (0, 10, 16)]
    builds = [(c, "signal") for c in signal] + [(c, "persistent") for c in PERSISTENT]
    kernels, errors = compile_all(builds, args.workers, build_only=False)
    rows = []
    for op, W, (M, N, K) in problems():
        if op != "gemm_rs":
            continue
        keys = [kernel_key(c, e) for c, e in builds if check(c, M, N, K, world_size=W, op=op) is None]
        us, cublas, notes = measure((M, N, K), keys, kernels, args.reps, args.target_us)
        best = {e: min((k for k in us if k[6] == e), key=us.get, default=None) for e in ("signal", "persistent")}
        rows.append([W, f"{M}x{N}x{K}", f"{2.0 * M * N * K / (cublas * 1e-6) / 1e12:.0f}"]
                    + [f"{_cfg_of(k).short()} {cublas / us[k]:.2f}" if k else "-" for k in best.values()])
        for k, v in notes.items():
            print(f"  {M}x{N}x{K} {_cfg_of(k).short()} {k[6]}: {v}", flush=True)
    print_table(f"GEMM+RS's GEMM, bf16, one {torch.cuda.get_device_name()}: non-persistent vs persistent "
                "(ratio = cuBLAS time / ours)", ["W", "MxNxK (per rank)", "cuBLAS TFLOP/s", "signal (best)",
                                                 "persistent (best)"], rows)
    for key, err in errors.items():
        print(f"skipped (did not build): {_cfg_of(key).short()} {key[6]}: {err[:200]}")


SPLIT_CONFIGS = [GemmConfig(128, 256, 64, 3, 256, 10), GemmConfig(128, 256, 64, 4, 256, 10),
                 GemmConfig(256, 128, 64, 4, 256, 10), GemmConfig(128, 128, 128, 3, 256, 10)]


def run_split(args) -> None:
    """--split: AG+GEMM's GEMM (TMA epilogue) per shape, each of SPLIT_CONFIGS as the plain tile loop ("tma") and with
    the last wave's tiles split along K (``gemm_split_kernel``), vs cuBLAS, timed in turns; each split kernel checked
    first over 3 back-to-back calls (NaN-poisoned output) against cuBLAS."""
    import torch

    from tilescale.ops.prebuild import compile_all as compile_jobs

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [(M, N, K) for M, K, N in AG_SHAPES]
    jobs = {(shape, c): (gemm_split_kernel, (*shape, c.block_m, c.block_n, c.block_k, c.stages, c.threads, c.swizzle,
                                             sms)) for shape in shapes for c in SPLIT_CONFIGS}
    compile_jobs(list(jobs.values()), args.workers)
    tiles, _ = compile_all([(c, "tma") for c in SPLIT_CONFIGS], args.workers, build_only=False)
    rows, out = [], []
    for M, N, K in shapes:
        g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
        A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
        ref = torch.matmul(A, B).float()
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns, plans, errs = {"cublas": lambda: torch.matmul(A, B, out=C)}, {}, {}
        for c in SPLIT_CONFIGS:
            plan = split_plan(-(-M // c.block_m) * -(-N // c.block_n), sms, -(-K // c.block_k), min_gain=0.0)
            plans[c] = plan
            fn, fargs = jobs[((M, N, K), c)]
            k = fn(*fargs)
            ws = split_workspace(plan, c.block_m, c.block_n, device="cuda")
            err = 0.0
            for _ in range(3):
                C.fill_(float("nan"))
                k(A, B, C, *ws)
                torch.cuda.synchronize()
                err = max(err, ((C.float() - ref).abs().max() / ref.abs().max()).item())
            if not err < 1e-2:
                raise AssertionError(f"split {c.short()} {M}x{N}x{K} ({plan}): relative max error {err:.3g}")
            errs[c.short()] = err
            fns[("split", c)] = (lambda k=k, ws=ws: k(A, B, C, *ws))
            kt = tiles.get(kernel_key(c, "tma"))
            if kt is not None:
                done = torch.zeros(-(-M // c.block_m), device="cuda", dtype=torch.uint64)   # ignored by "tma"
                fns[("tma", c)] = (lambda k=kt, done=done: k(A, B, C, done))
        us = time_in_turns(fns, args.reps, args.target_us)
        cub = us["cublas"]
        for c in SPLIT_CONFIGS:
            p = plans[c]
            tma = us.get(("tma", c))
            rows.append([f"{M}x{N}x{K}", c.short(), p.tiles, f"{p.tail} x {p.split}" if p.split > 1 else "-",
                         f"{2.0 * M * N * K / (cub * 1e-6) / 1e12:.0f}", f"{cub / tma:.3f}" if tma else "-",
                         f"{cub / us[('split', c)]:.3f}"])
            out.append(dict(M=M, N=N, K=K, config=c.to_dict(), tiles=p.tiles, full=p.full, split=p.split,
                            cublas_us=cub, tma_us=tma, split_us=us[("split", c)], err=errs[c.short()]))
        print(f"  {M}x{N}x{K}: cuBLAS {cub:.1f} us", flush=True)
    print_table(f"AG+GEMM's GEMM, bf16, one {torch.cuda.get_device_name()} ({sms} SMs): the tile loop vs the same with "
                "the last wave's tiles split along K (ratio = cuBLAS time / ours)",
                ["MxNxK", "config", "tiles", "tail x slices", "cuBLAS TFLOP/s", "tma", "split"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), sms=sms, date=time.strftime("%Y-%m-%d"), rows=out), f,
                      indent=1)


def run_push(args) -> None:
    """--push: GEMM+RS's one kernel (its push path, tilescale/ops/gemm_reduce_scatter.py) as rank 0 of W runs it,
    on this GPU alone (``gemm_rs_push_loopback_kernel``: its pushes go into its own memory, counted in its own
    words, where its next steps wait for them and add them): the op's kernel and config ("push"), the same kernel
    with the pull path's tuned config where it fits; vs cuBLAS, the pull path's GEMM ("signal"; "signal_gpu": its
    count released at GPU scope, to split what the count costs), the plain tile loop ("tma"; "tma_cn": after a call
    number) and the persistent loop alone ("flat": 128x256x64, 3 stages, tilelang's warp specialisation), timed in
    turns in the same run; 3 back-to-back calls checked first. What it cannot show: NVLink's latency and bandwidth
    (the stores go to this GPU's memory)."""
    import torch

    from tilescale.ops import gemm_reduce_scatter as grs
    from tilescale.ops.gemm import gemm_config
    from tilescale.ops.prebuild import compile_all as compile_jobs

    probs = [(W, (M, N, K)) for op, W, (M, N, K) in problems() if op == "gemm_rs"]
    cfgs = {p: gemm_config(*p[1], world_size=p[0], op="gemm_rs") for p in probs}        # the pull path's GEMM's
    ops = {p: gemm_config(*p[1], world_size=p[0], op="gemm_rs_push") for p in probs}    # the push kernel's

    def push_job(p, c):
        return (grs.gemm_rs_push_loopback_kernel, (*p[1][1:], p[0], "bfloat16", c.block_m, c.block_n, c.block_k,
                                                   c.stages, c.threads, c.swizzle, SMS))   # (N, K, ranks, ...)

    variants = {p: [("push", ops[p], push_job(p, ops[p]))]
                + [("push pull-tuned", c, push_job(p, c)) for c in [cfgs[p]]
                   if c != ops[p] and check(c, *p[1], world_size=p[0], op="gemm_rs_push") is None]
                for p in probs}
    cn = {c: (gemm_call_number_kernel, (c.block_m, c.block_n, c.block_k, c.stages, c.threads, c.swizzle))
          for c in set(cfgs.values())}
    flat = {p: (gemm_flat_kernel, (*p[1], *FLAT)) for p in probs}
    compile_jobs([job for vs in variants.values() for _, _, job in vs] + list(cn.values()) + list(flat.values()),
                 args.workers)
    epis = ("signal", "signal_gpu", "tma")
    tiles, _ = compile_all(sorted({(c, e) for c in cfgs.values() for e in epis}, key=str), args.workers,
                           build_only=False)
    rows, out = [], []
    for (W, (M, N, K)), cfg in cfgs.items():
        g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K + W)
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
        rows_w = M // W
        want = (X.view(W, rows_w, K).float() @ B.float()).sum(0)   # rank 0's rows + what it pushed for the others
        ref = X @ B
        Cf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        done = torch.zeros(M // cfg.block_m, device="cuda", dtype=torch.uint64)
        fns, errs = {"cublas": lambda: torch.matmul(X, B, out=Cf)}, {}
        for name, c, (fn, fargs) in variants[(W, (M, N, K))]:
            push = fn(*fargs)
            C = torch.full((rows_w, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            slab, words = grs.push_shapes(M, N, W, c.block_m, c.block_n)
            R = torch.zeros(slab, device="cuda", dtype=torch.bfloat16)
            arrived = torch.zeros(words, device="cuda", dtype=torch.uint64)
            counters = torch.zeros(SMS, device="cuda", dtype=torch.int64)        # a word per block
            pushed = torch.zeros_like(arrived)
            a = (X.view(W, rows_w, K), B, C, R, arrived, counters, R, arrived, pushed)   # (Rp, Ap: unused)
            for _ in range(3):          # back-to-back calls: both halves of R, the counts of calls 1-3
                C.fill_(float("nan"))
                push(*a)
            torch.cuda.synchronize()
            errs[name] = err = ((C.float() - want).abs().max() / want.abs().max()).item()
            if not err < 2e-2:
                raise AssertionError(f"{name} W={W} {M}x{N}x{K} {c.short()}: relative max error {err:.3g}")
            fns[name] = (lambda push=push, a=a: push(*a))
        for e in epis:
            k = tiles.get(kernel_key(cfg, e))
            if k is not None:
                fns[e] = (lambda k=k: k(X, B, Cf, done))
        fn, fargs = cn[cfg]
        k_cn = fn(*fargs)
        counts = torch.zeros((M // cfg.block_m) * (N // cfg.block_n), device="cuda", dtype=torch.int64)
        fns["tma_cn"] = (lambda k=k_cn, counts=counts: k(X, B, Cf, counts))
        fn, fargs = flat[(W, (M, N, K))]
        k_flat = fn(*fargs)
        Cf.fill_(float("nan"))
        k_flat(X, B, Cf)
        torch.cuda.synchronize()
        errs["flat"] = err = ((Cf.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        if not err < 1e-2:
            raise AssertionError(f"flat W={W} {M}x{N}x{K}: relative max error {err:.3g}")
        fns["flat"] = (lambda k=k_flat: k(X, B, Cf))
        us = time_in_turns(fns, args.reps, args.target_us)
        ratio = {k: f"{us['cublas'] / v:.2f}" for k, v in us.items()}
        rows.append([W, f"{M}x{N}x{K}", ops[(W, (M, N, K))].short(), cfg.short(),
                     f"{2.0 * M * N * K / (us['cublas'] * 1e-6) / 1e12:.0f}"]
                    + [ratio.get(k, "-") for k in ("push", "push pull-tuned", "signal", "signal_gpu", "tma", "tma_cn",
                                                   "flat")])
        out.append(dict(world_size=W, M=M, N=N, K=K, config=ops[(W, (M, N, K))].to_dict(),
                        pull_config=cfg.to_dict(), us=us, err=errs))
        print(f"  W={W} {M}x{N}x{K}: {us}", flush=True)
    print_table(f"GEMM+RS's GEMM, bf16, one {torch.cuda.get_device_name()}: the push kernel (loopback) vs cuBLAS "
                "(ratio = cuBLAS time / ours; push: the op's kernel and config; push pull-tuned: the same kernel, "
                "signal (the pull path's GEMM), signal_gpu (its counts released at GPU scope: a diagnostic), tma (the "
                "tile loop alone) and tma_cn (the same after a T.call_number): the pull path's tuned config; flat: a "
                "persistent loop alone)",
                ["W", "MxNxK (per rank)", "op's config", "pull's config", "cuBLAS TFLOP/s", "push", "push pull-tuned",
                 "signal", "signal_gpu", "tma", "tma_cn", "flat"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), rows=out), f, indent=1)


def _cfg_of(key) -> GemmConfig:
    return GemmConfig(*key[:6])


def report(measured, errors, gpu, args) -> None:
    rows, table = [], []
    dkey = {e: kernel_key(DEFAULT, e) for e in EPILOGUES}
    for op, W, (M, N, K) in problems():
        e = epilogue_of(op)
        us, cublas, notes = measured[(M, N, K, e)]
        flop = 2.0 * M * N * K
        tf = {key: flop / (t * 1e-6) / 1e12 for key, t in us.items()}
        ranked = sorted(us, key=us.get)
        valid = [key for key in ranked if check(_cfg_of(key), M, N, K, world_size=W, op=op) is None]
        best = valid[0] if valid else None
        cub_tf = flop / (cublas * 1e-6) / 1e12
        d = dkey[e]
        row = dict(op=op, world_size=W, M=M, N=N, K=K, epilogue=e, cublas_us=cublas, cublas_tflops=cub_tf,
                   best=_cfg_of(best).to_dict() if best else None, best_us=us.get(best), best_tflops=tf.get(best),
                   ratio=(cublas / us[best]) if best else None, default_us=us.get(d),
                   default_ratio=(cublas / us[d]) if d in us else None,
                   ranked=[dict(config=_cfg_of(k).to_dict(), us=us[k], tflops=tf[k], ratio=cublas / us[k],
                                tiles=waves(_cfg_of(k), M, N)[0], wave_eff=round(waves(_cfg_of(k), M, N)[1], 3))
                           for k in valid],
                   notes={_cfg_of(k).short(): v for k, v in notes.items()})
        rows.append(row)
        table.append([op, W, f"{M}x{N}x{K}", _cfg_of(best).short() if best else "-",
                      f"{tf[best]:.0f}" if best else "-", f"{cub_tf:.0f}",
                      f"{cublas / us[best]:.2f}" if best else "-",
                      f"{cublas / us[d]:.2f}" if d in us else "-"])
    print_table(f"GEMM tile configs, bf16, one {gpu} (per-rank GEMM of the fused ops; ratio = cuBLAS time / ours)",
                ["op", "W", "MxNxK (per rank)", "best config", "TFLOP/s", "cuBLAS TFLOP/s", "ratio", "default ratio"],
                table)
    met = [r for r in rows if r["ratio"] and r["ratio"] >= 0.90]
    print(f"target >= 0.90 of cuBLAS with the best config: met on {len(met)} of {len(rows)} (op, W, shape) rows")
    if errors:
        print("skipped (did not build):")
        for key, err in errors.items():
            print(f"  {_cfg_of(key).short()} {key[6]}: {err[:200]}")
    if args.json:
        payload = dict(gpu=gpu, date=time.strftime("%Y-%m-%d"), reps=args.reps, rows=rows,
                       skipped=[dict(config=_cfg_of(k).to_dict(), epilogue=k[6], error=v) for k, v in errors.items()])
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.json}")


def print_table(title, header, rows) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) + " |")


def dry_run() -> None:
    builds = all_builds()
    print(f"{len(builds)} kernels to build (one per configuration and epilogue; M, N, K at run time):")
    for i, (c, e) in enumerate(builds):
        print(f"  [{i:2d}] {c.short():28s} epilogue={e:6s} smem {c.smem_bytes() // 1024} KiB")
    print("\nper (op, W, shape): candidates that the op can run, tiles and wave efficiency on 132 SMs")
    for op, W, (M, N, K) in problems():
        e = epilogue_of(op)
        cs = [c for c in candidates(e) if check(c, M, N, K, world_size=W, op=op) is None]
        dt, deff = waves(DEFAULT, M, N)
        print(f"  {op:7s} W={W} {M}x{N}x{K}: {len(cs)} candidates; default: {dt} tiles, wave efficiency "
              f"{deff:.2f}; best wave efficiency among them {max(waves(c, M, N)[1] for c in cs):.2f}")


def compile_check(args) -> None:
    """Build (compile + link, no load) candidates for sm_90a without a GPU."""
    builds = [(c, "persistent") for c in PERSISTENT] if args.persistent else all_builds()
    if args.only:
        idx = [int(i) for i in args.only.split(",")]
        builds = [builds[i] for i in idx]
    _, errors = compile_all(builds, args.workers, build_only=True)
    for key, err in errors.items():
        print(f"FAILED {key}: {err}")
    print(f"compile check: {len(builds) - len(errors)} of {len(builds)} built")
    if errors:
        sys.exit(1)


def write_tuning(ap, args) -> None:
    """--write-tuning OUT --from SWEEP.json [--merge EXISTING.json [--legacy-gpu NAME]]: the sweep's tuning table
    (tilescale.ops.gemm.tuning_table), merged into EXISTING's (tilescale.ops.gemm.merge_tables); prints the entries
    written per GPU."""
    from collections import Counter

    from tilescale.ops.gemm import load_table, merge_tables

    if not args.src:
        ap.error("--write-tuning needs --from SWEEP.json")
    if args.legacy_gpu is not None and not args.merge:
        ap.error("--legacy-gpu needs --merge EXISTING.json")
    with open(args.src) as f:
        sweep = json.load(f)
    table = tuning_table(sweep, args.keep)
    if args.merge:
        if not sweep.get("gpu"):
            ap.error(f"--merge: {args.src} names no 'gpu' (the sweep's torch.cuda.get_device_name())")
        if not os.path.exists(args.merge):
            ap.error(f"--merge: {args.merge}: no such file")
        load_table(args.merge)   # a ValueError naming the file and field when it is not a valid table
        with open(args.merge) as f:
            table = merge_tables(json.load(f), table, args.legacy_gpu)
    with open(args.write_tuning, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    per_gpu = Counter(e.get("gpu") or "any GPU" for e in table["entries"])
    print(f"wrote {args.write_tuning}: {len(table['entries'])} entries: "
          + ", ".join(f"{n} of {g}" for g, n in per_gpu.items()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write every timing and the best config per shape here")
    ap.add_argument("--reps", type=int, default=7, help="round-robin timing rounds per shape (median)")
    ap.add_argument("--target-us", type=float, default=3000.0, help="length of one timing round")
    ap.add_argument("--workers", type=int, default=min(32, os.cpu_count() or 2), help="parallel builds")
    ap.add_argument("--persistent", action="store_true", help="GEMM+RS's GEMM: its configs vs a persistent kernel "
                    "that counts each tile once the next one's store is issued (a table; no JSON, no tuning)")
    ap.add_argument("--push", action="store_true", help="GEMM+RS's push kernel per (shape, W) with its tuned config, "
                    "on this GPU alone (loopback), vs cuBLAS and the pull path's GEMM (a table; --json: the timings)")
    ap.add_argument("--split", action="store_true", help="AG+GEMM's GEMM per shape: the tile loop vs the same with the "
                    "last wave's tiles split along K (a table; --json: the timings)")
    ap.add_argument("--dry-run", action="store_true", help="list the candidates; no GPU, no build")
    ap.add_argument("--compile-check", action="store_true", help="build candidates for sm_90a (no GPU needed)")
    ap.add_argument("--only", help="with --compile-check: indices (as --dry-run lists them), e.g. 0,5,9")
    ap.add_argument("--write-tuning", help="write tilescale's tuning table here from --from's sweep JSON (its entries "
                    "tagged with the sweep's GPU)")
    ap.add_argument("--from", dest="src", help="sweep JSON for --write-tuning")
    ap.add_argument("--merge", metavar="EXISTING.json", help="with --write-tuning: keep EXISTING's entries of other "
                    "GPUs, in its order; the sweep's GPU's entries replace EXISTING's of that GPU (or come last)")
    ap.add_argument("--legacy-gpu", metavar="NAME", help="with --merge: tag EXISTING's entries that name no GPU with "
                    "this one (torch.cuda.get_device_name(), e.g. 'NVIDIA H200'); untagged, they match any GPU")
    ap.add_argument("--keep", type=int, default=6, help="configs kept per shape in the tuning table")
    args = ap.parse_args(argv)
    if args.write_tuning:
        write_tuning(ap, args)
        return
    if args.merge or args.legacy_gpu:
        ap.error("--merge and --legacy-gpu go with --write-tuning")
    if args.dry_run:
        dry_run()
        return
    from tilescale.env import settings

    if settings.compile_only and not args.compile_check:   # launch.sh on a machine without GPUs
        args.compile_check, args.only = True, args.only or "0,9"
    if args.compile_check:
        compile_check(args)
        return
    import torch

    if not torch.cuda.is_available():
        print("bench_gemm_configs: no GPU visible (use --dry-run or --compile-check here)", file=sys.stderr)
        sys.exit(2)
    if "WORLD_SIZE" not in os.environ:   # the "signal" epilogue (GEMM+RS's) links NVSHMEM: it needs the runtime
        print("bench_gemm_configs: run it through launch.sh (GPUS=1 bash launch.sh benchmarks/bench_gemm_configs.py): "
              "GEMM+RS's epilogue kernels need tilescale's distributed runtime", file=sys.stderr)
        sys.exit(2)
    from tilescale import runtime

    tilescale.init_distributed()
    try:
        if runtime.current().info.rank == 0:   # with GPUS > 1: one process does the work
            (run_persistent if args.persistent else run_push if args.push else run_split if args.split else run)(args)
    finally:
        tilescale.finalize()


if __name__ == "__main__":
    main()
