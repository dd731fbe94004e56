"""Prototype (run 29, K7): GEMM+RS's push kernel (loopback) with two multiplying warpgroups that each run their own
tiles (128x128, tiles j and j + 1 of the block in turn), each fed by its own TMA warp and 3-stage ring, so that one
warpgroup's epilogue can overlap the other's GEMM; one sums warp and one tile Rs serve both in tile order."""
import tilescale
import tilescale.language as T
from tilescale.ops import vectors
from tilescale.ops.gemm import SUM_IN_PAD, even_panel, tile_order
from tilescale.ops.gemm_reduce_scatter import _sum_row, push_shapes


def pingpong_func(M, N, K, W, V="", sms=132, block_m=128, block_n=128, block_k=64, stages=3, swizzle=10):
    dtype = "bfloat16"
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = K // block_k
    total = W * tiles
    blocks = min(sms, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)

    def where(g):
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
        return g // tiles + 1, t, bx

    def tile_of(buf, e, w):
        return buf[_sum_row(e, w, slots, tiles, block_m):_sum_row(e, w, slots, tiles, block_m) + block_m, :]

    @T.macro
    def mma(w, Cl, landed, As, Bs, Rs, full, empty, summed, bid, mine):
        for jj in T.serial(T.ceildiv(mine - w, 2)):
            j = jj * 2 + w
            d, t, bx = where(j * blocks + bid)
            for ko in T.serial(k_tiles):
                it = jj * k_tiles + ko
                s = w * stages + it % stages
                T.mbarrier_wait_parity(full[s], (it // stages) & 1)
                T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                T.mbarrier_arrive(empty[s])
            T.wait_barrier(landed, jj & 1)
            if d > 1:
                for i, k in T.Parallel(block_m, block_n):
                    Cl[i, k] += Rs[i, k]
            for i, k in T.Parallel(block_m, block_n):
                Rs[i, k] = Cl[i, k]
            T.fence_proxy_async()
            T.mbarrier_arrive(summed[w])

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
        with T.Kernel(blocks, threads=384) as bid:
            As = T.alloc_shared((2 * stages, block_m, block_k), dtype)    # ring of warpgroup w: stages w*3 ..
            Bs = T.alloc_shared((2 * stages, block_k, block_n), dtype)
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)
            Cl0 = T.alloc_fragment((block_m, block_n), "float32")
            Cl1 = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * (2 * stages))
            empty = T.alloc_barrier([128] * (2 * stages))
            summed = T.alloc_barrier([128, 128])
            landed0 = T.alloc_shared((1,), "uint64", scope="shared")
            landed1 = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed0)
            T.init_barrier(landed1)
            e = T.alloc_local((1,), "uint64")
            tx = T.get_thread_binding()
            mine = T.ceildiv(total - bid, blocks)
            if tx < 32 or (tx >= 64 and tx < 96):          # warps 0 and 2: the rings of warpgroups 0 and 1
                T.set_max_nreg(40, 0)
                w = tx // 64
                for it in T.serial(T.ceildiv(mine - w, 2) * k_tiles):
                    j = (it // k_tiles) * 2 + w
                    ko = it % k_tiles
                    s = w * stages + it % stages
                    d, t, bx = where(j * blocks + bid)
                    rb = (d % W) * tiles_per_rank + t
                    T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                    T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k], As[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n], Bs[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    if tx % 64 == 0:
                        T.mbarrier_arrive(full[s])
            elif tx < 64:                                   # warp 1: the sums, in tile order
                T.set_max_nreg(40, 0)
                e[0] = T.call_number(counters, scope="warp")
                for j in T.serial(mine):
                    d, t, bx = where(j * blocks + bid)
                    tile = t * tiles_n + bx
                    if d > 1:
                        w_in = (d - 2) * tiles + tile
                        T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                        if j % 2 == 0:
                            T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed0)
                        else:
                            T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed1)
                    elif tx == 32:
                        if j % 2 == 0:
                            T.arrive_barrier(landed0)
                        else:
                            T.arrive_barrier(landed1)
                    T.mbarrier_wait_parity(summed[j % 2], (j // 2) & 1)
                    if d == W:
                        T.store_async(Rs[0:block_m, 0:block_n], C[t * block_m:(t + 1) * block_m,
                                                                     bx * block_n:(bx + 1) * block_n], wait="written")
                    else:
                        w_out = (d - 1) * tiles + tile
                        T.store_async(Rs, tile_of(R, e[0], w_out))
                        T.release_stores(arrived[w_out], 1, scope="sys")
            elif tx < 128:
                T.set_max_nreg(40, 0)
            elif tx < 256:                                  # warpgroup 1: tiles 0, 2, ...
                T.set_max_nreg(232, 1)
                mma(0, Cl0, landed0, As, Bs, Rs, full, empty, summed, bid, mine)
            else:                                           # warpgroup 2: tiles 1, 3, ...
                T.set_max_nreg(232, 1)
                mma(1, Cl1, landed1, As, Bs, Rs, full, empty, summed, bid, mine)

    return gemm_rs_push


@tilescale.jit(pass_configs={"tl.disable_thread_storage_sync": True})
def pingpong_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return pingpong_func(M, N, K, W, V)
