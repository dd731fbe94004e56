"""Diagnostic (session 33, run 28 J9): the persistent push kernel (loopback) with parts of its epilogue removed
(wrong results: timing only), vs cuBLAS and the flat loop alone."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]     # the repo (it ran from .device/probe/ there: parents[2])
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import *  # noqa
from tilescale.ops.gemm_reduce_scatter import SUM_IN_PAD, even_panel, push_shapes, storing_warp, tile_order, vectors  # noqa: E402,F401,E501


def _push_persistent_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                          loopback: bool, blocks: int, V=""):
    """:func:`_push_func` on `blocks` persistent blocks, one per SM (module docstring, *persistent kernel*): block
    b runs tiles b, b + blocks, ... of the step-by-step grid's order through ONE pipelined loop over (tile, K step);
    a pushed tile is counted at the block's next tile's epilogue, before anything there waits."""
    W = world_size
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n     # an owner's tiles
    slots = W - 1
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = min(blocks, total)
    panel = even_panel(tiles_per_rank, swizzle)     # within a step
    slab, words = push_shapes(M, N, W, block_m, block_n)
    sw = storing_warp(threads)

    def rows_at(e, w):
        return (T.cast(e % 2, "int32") * slots * tiles + w) * block_m

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
        with T.Kernel(blocks, threads=threads) as bid:
            As = T.alloc_shared((block_m, block_k), dtype)
            Bs = T.alloc_shared((block_k, block_n), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            # the sum in lands here, and the sum out leaves from here (one bulk copy each way: R's tiles are padded
            # as this buffer); no C tile beside it, so that 3 stages fit
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            started = T.alloc_local((1,), "int32")
            loads = T.alloc_local((1,), "int32")      # sums in loaded so far (the barrier's phase)
            pend = T.alloc_local((1,), "int32")       # the word of the pushed tile not yet counted, or -1
            loads[0] = 0
            pend[0] = -1
            started[0] = 0
            me = T.get_rank()
            if T.get_thread_binding() // 32 == sw:
                e[0] = T.call_number(counters, scope="warp")
            # tilelang's proxy fences: those before the loop (the barrier's set-up) would fence every step's wgmma
            T.fence_proxy_async()
            for it in T.Pipelined(T.ceildiv(total - bid, blocks) * k_tiles, num_stages=stages):
                g = (it // k_tiles) * blocks + bid
                ko = it % k_tiles
                d = g // tiles + 1
                t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
                rb = ((me + d) % W) * tiles_per_rank + t
                tile = t * tiles_n + bx
                w_in = (d - 2) * tiles + tile
                w_out = (d - 1) * tiles + tile
                T.copy(X[rb * block_m, ko * block_k], As)
                T.copy(Wt[ko * block_k, bx * block_n], Bs)
                if ko == 0:
                    if d > 1 and "nofold" not in V:
                        if T.get_thread_binding() // 32 == sw:
                            started[0] = 0
                            if T.ld(arrived[w_in], sem="acquire", scope="sys") >= e[0]:
                                T.load_async(R[rows_at(e[0], w_in):rows_at(e[0], w_in) + block_m, :], Rs,
                                             barrier=landed)
                                started[0] = 1
                    T.fence_proxy_async()   # (as above: else every step's wgmma is fenced)
                # the accumulator cleared by wgmma's scale-d at a tile's first step (a T.clear here costs a select per
                # accumulator register in every step)
                T.gemm(As, Bs, Cl, clear_accum=ko == 0)
                if ko == k_tiles - 1:
                    if T.get_thread_binding() // 32 == sw:
                        if pend[0] >= 0:              # the tile pushed before this one: count it
                            if loopback:
                                T.release_stores(arrived[pend[0]], 1, scope="sys")
                            else:
                                T.release_stores(Ap[pend[0]], 1, scope="sys")
                            pend[0] = -1
                    if d > 1 and "nofold" not in V:
                        if T.get_thread_binding() // 32 == sw:
                            if started[0] == 0:
                                T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                                T.load_async(R[rows_at(e[0], w_in):rows_at(e[0], w_in) + block_m, :], Rs,
                                             barrier=landed)
                        T.wait_barrier(landed, loads[0] % 2)
                        loads[0] = loads[0] + 1
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    if d == W:                        # my rows, complete: straight from the registers
                        if "noC" not in V:
                            T.copy(Cl, C[t * block_m, bx * block_n])
                    else:                             # on to rank me - 1, from shared memory by one bulk copy
                        if "noRs" not in V:
                            T.copy(Cl, Rs[0:block_m, 0:block_n])
                        T.fence_proxy_async()
                        if T.get_thread_binding() // 32 == sw:
                            if "nostore" in V:
                                pass
                            elif loopback:
                                T.store_async(Rs, R[rows_at(e[0], w_out):rows_at(e[0], w_out) + block_m, :])
                            else:
                                T.store_async(Rs, Rp[rows_at(e[0], w_out):rows_at(e[0], w_out) + block_m, :])
                            pend[0] = w_out
                    T.fence_proxy_async()   # (the stores into C: else every step's wgmma is fenced)
            if T.get_thread_binding() // 32 == sw:     # the block's last pushed tile
                if pend[0] >= 0:
                    if loopback:
                        T.release_stores(arrived[pend[0]], 1, scope="sys")
                    else:
                        T.release_stores(Ap[pend[0]], 1, scope="sys")

    return gemm_rs_push


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
