"""Diagnostic (run 29, K5): the push kernel of the working tree (a copy, loopback) with clock stamps (`stamps`) and
wgmma kept one step in flight (`async`: T.wgmma_gemm + T.wait_wgmma(1), a stage freed one step later)."""
import tilescale
import tilescale.language as T
from tilescale.ops import vectors
from tilescale.ops.gemm import SUM_IN_PAD, even_panel, tile_order
from tilescale.ops.gemm_reduce_scatter import _pushed_to, _sum_row, push_shapes

SRC = r"""
#ifndef DIAG5_CUH_
#define DIAG5_CUH_
__device__ __forceinline__ long long diag_clock() { long long c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); return c; }
__device__ __forceinline__ long long diag_gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return (long long)t; }
#endif
"""


def clock():
    return T.call_extern("int64", "diag_clock")


def gtime():
    return T.call_extern("int64", "diag_gtime")


def diag_func(M, N, K, world_size, V="", dtype="bfloat16", block_m=128, block_n=256, block_k=64, stages=3,
              threads=256, swizzle=10, loopback=True, sms=132):
    """:func:`_push_func` at world size > 1 (module docstring, push 1-3): `sms` persistent blocks (at most one per SM)
    of three roles, block b running tiles b, b + sms, ... of the step-by-step order."""
    W = world_size
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n     # an owner's tiles
    slots = W - 1
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = min(sms, total)
    panel = even_panel(tiles_per_rank, swizzle)     # within a step
    slab, words = push_shapes(M, N, W, block_m, block_n)
    ST = "stamps" in V
    ASYNC = "async" in V
    mma = threads                                    # the multiplying threads: warps 4 ..
    out = _pushed_to(loopback)

    def where(g):    # tile g of the step-by-step order: (step d, its row tile t within the owner's rows, column bx)
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
        return g // tiles + 1, t, bx

    def tile_of(buf, e, w):    # call e's tile of word w in `buf` (R or rank me - 1's), its padded rows
        return buf[_sum_row(e, w, slots, tiles, block_m):_sum_row(e, w, slots, tiles, block_m) + block_m, :]

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64"),
                     S: T.Tensor((blocks, 32, 16), "int64")):
        with T.Kernel(blocks, threads=128 + mma) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((stages, block_m, block_k), dtype)
            Bs = T.alloc_shared((stages, block_k, block_n), dtype)
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)   # the sum in, then out (rows padded: banks)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * stages)          # a stage's X and W tiles loaded
            empty = T.alloc_barrier([mma] * stages)       # ... and multiplied
            summed = T.alloc_barrier([mma])               # Rs holds the tile's sum out
            landed = T.alloc_shared((1,), "uint64", scope="shared")   # Rs holds its sum in (or is free: step 1)
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            tx = T.get_thread_binding()
            me = T.get_rank()
            mine = T.ceildiv(total - bid, blocks)        # this block's tiles
            if tx < 32:                                   # 1: X and W, by TMA
                T.set_max_nreg(40, 0)
                for it in T.serial(mine * k_tiles):
                    s, ko = it % stages, it % k_tiles
                    d, t, bx = where((it // k_tiles) * blocks + bid)
                    rb = ((me + d) % W) * tiles_per_rank + t
                    T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                    T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k], As[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n], Bs[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    if tx == 0:
                        T.mbarrier_arrive(full[s])
            elif tx < 64:                                 # 3: the sums (every use of the call number)
                T.set_max_nreg(40, 0)
                e[0] = T.call_number(counters, scope="warp")
                for j in T.serial(mine):
                    d, t, bx = where(j * blocks + bid)
                    tile = t * tiles_n + bx
                    if d > 1:
                        w_in = (d - 2) * tiles + tile
                        T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                        T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                    elif tx == 32:
                        T.arrive_barrier(landed)
                    T.mbarrier_wait_parity(summed[0], j & 1)
                    if d == W:                            # my rows, complete (written before the block ends)
                        T.store_async(Rs[0:block_m, 0:block_n], C[t * block_m:(t + 1) * block_m,
                                                                     bx * block_n:(bx + 1) * block_n],
                                      wait="written")
                    else:
                        w_out = (d - 1) * tiles + tile
                        T.store_async(Rs, tile_of(out(R, Rp), e[0], w_out))
                        T.release_stores(out(arrived, Ap)[w_out], 1, scope="sys")
            elif tx < 128:
                T.set_max_nreg(40, 0)
            else:                                         # 2: the GEMM and the add
                T.set_max_nreg(232, 1)
                for j in T.serial(mine):
                    d, t, bx = where(j * blocks + bid)
                    if ST:
                        if tx == 128:
                            S[bid, j, 0] = clock()
                            S[bid, j, 10] = gtime()
                    if ASYNC:
                        for ko in T.serial(k_tiles):
                            s = (j * k_tiles + ko) % stages
                            T.mbarrier_wait_parity(full[s], ((j * k_tiles + ko) // stages) & 1)
                            T.wgmma_gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                            T.wait_wgmma(1)
                            if ko > 0:
                                T.mbarrier_arrive(empty[(j * k_tiles + ko - 1) % stages])
                        T.wait_wgmma(0)
                        T.mbarrier_arrive(empty[(j * k_tiles + k_tiles - 1) % stages])
                    else:
                        for ko in T.serial(k_tiles):
                            s = (j * k_tiles + ko) % stages
                            T.mbarrier_wait_parity(full[s], ((j * k_tiles + ko) // stages) & 1)
                            T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                            T.mbarrier_arrive(empty[s])
                    if ST:
                        if tx == 128:
                            S[bid, j, 1] = clock()
                    T.wait_barrier(landed, j & 1)
                    if ST:
                        if tx == 128:
                            S[bid, j, 2] = clock()
                    if d > 1:
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    for i, k in T.Parallel(block_m, block_n):
                        Rs[i, k] = Cl[i, k]
                    if ST:
                        if tx == 128:
                            S[bid, j, 3] = clock()
                    T.fence_proxy_async()                 # (written by this thread, read by the bulk copy)
                    T.mbarrier_arrive(summed[0])
                    if ST:
                        if tx == 128:
                            S[bid, j, 4] = clock()
                            S[bid, j, 14] = gtime()

    return gemm_rs_push


@tilescale.jit
def diag_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_func(M, N, K, W, V)


@tilescale.jit(pass_configs={"tl.disable_thread_storage_sync": True})
def diag_nosync_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_func(M, N, K, W, V)
