"""Prototype (run 29): a persistent GEMM with hand-written warp specialisation (T.tma_copy, T.alloc_barrier):
warp 0 loads (TMA), warps 4-11 (two warpgroups) multiply, C through shared memory by TMA store. C = A @ B."""
import tilescale
import tilescale.language as T
from tilescale.ops.gemm import tile_order


def flat_ws_func(M, N, K, blocks=132, block_m=128, block_n=256, block_k=64, stages=3, swizzle=8, dtype="bfloat16"):
    tiles_m, tiles_n = M // block_m, N // block_n
    total = tiles_m * tiles_n
    k_tiles = K // block_k
    blocks = min(blocks, total)

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(blocks, threads=384) as bid:
            As = T.alloc_shared((stages, block_m, block_k), dtype)
            Bs = T.alloc_shared((stages, block_k, block_n), dtype)
            Cs = T.alloc_shared((block_m, block_n), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * stages)
            empty = T.alloc_barrier([256] * stages)
            tx = T.get_thread_binding()
            n_mine = T.ceildiv(total - bid, blocks)
            if tx < 32:
                T.set_max_nreg(40, 0)
                for it in T.serial(n_mine * k_tiles):
                    s = it % stages
                    ko = it % k_tiles
                    by, bx = tile_order((it // k_tiles) * blocks + bid, tiles_m, tiles_n, swizzle)
                    T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                    T.tma_copy(A[by * block_m:(by + 1) * block_m, ko * block_k:(ko + 1) * block_k], As[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    T.tma_copy(B[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n], Bs[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    if tx == 0:
                        T.mbarrier_arrive(full[s])
            elif tx < 128:
                T.set_max_nreg(40, 0)
            else:
                T.set_max_nreg(232, 1)
                T.fence_proxy_async()
                for it in T.serial(n_mine * k_tiles):
                    s = it % stages
                    ko = it % k_tiles
                    by, bx = tile_order((it // k_tiles) * blocks + bid, tiles_m, tiles_n, swizzle)
                    T.mbarrier_wait_parity(full[s], (it // stages) & 1)
                    T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                    T.mbarrier_arrive(empty[s])
                    if ko == k_tiles - 1:
                        T.copy(Cl, Cs)
                        T.copy(Cs, C[by * block_m, bx * block_n])
                        T.fence_proxy_async()

    return gemm


@tilescale.jit
def flat_ws_kernel(M: int, N: int, K: int):
    return flat_ws_func(M, N, K)


SRC = r"""
#ifndef DIAG3_CUH_
#define DIAG3_CUH_
__device__ __forceinline__ void diag_arrive1(void* bar) {
  if ((threadIdx.x & 31) == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))) : "memory");
  __syncwarp();
}
__device__ __forceinline__ void diag_store_nowait(const void* src, void* dst, int rows, int row_bytes, int src_ld, long dst_ld) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(src));
  const int lane = threadIdx.x & 31;
  for (int r = lane; r < rows; r += 32)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(static_cast<char*>(dst) + r * dst_ld), "r"(s + r * src_ld), "r"(row_bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  __syncwarp();
}
__device__ __forceinline__ void diag_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); __syncwarp(); }
__device__ __forceinline__ void diag_wait_ge_gpu(const void* p, unsigned long long v) {
  unsigned long long x;
  do { asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(p) : "memory"); } while (x < v);
}
__device__ __forceinline__ void diag_wait_written() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); __syncwarp(); }
#endif
"""


def push_ws_func(M, N, K, W, V="", blocks=132, block_m=128, block_n=256, block_k=64, stages=3, swizzle=10):
    """GEMM+RS's persistent push kernel (loopback: rank 0 of W, pushes into its own R) with hand-written warp
    specialisation: warp 0 loads X and W (TMA), warp 1 moves the sums (waits for a sum in, loads it into Rs, pushes
    the sum out from Rs or stores it into C, counts it), warps 4-11 multiply and add. V: "gpu" (GPU-scope flags)."""
    from tilescale.ops import vectors
    from tilescale.ops.gemm import SUM_IN_PAD, even_panel
    from tilescale.ops.gemm_reduce_scatter import _sum_row, push_shapes
    dtype = "bfloat16"
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = K // block_k
    total = W * tiles
    blocks = min(blocks, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)
    rb_bytes = (block_n + SUM_IN_PAD) * 2
    GPU = "gpu" in V
    NOFENCE = "nofence" in V

    def where(g):          # tile g of the step-by-step order: (step d, row tile t within the owner's, column bx)
        d = g // tiles + 1
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
        return d, t, bx

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER)):
        with T.Kernel(blocks, threads=384) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((stages, block_m, block_k), dtype)
            Bs = T.alloc_shared((stages, block_k, block_n), dtype)
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * stages)
            empty = T.alloc_barrier([256] * stages)
            rs_full = T.alloc_barrier([256])
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            tx = T.get_thread_binding()
            n_mine = T.ceildiv(total - bid, blocks)
            if tx < 32:                                   # warp 0: X and W, by TMA
                T.set_max_nreg(40, 0)
                for it in T.serial(n_mine * k_tiles):
                    s = it % stages
                    ko = it % k_tiles
                    d, t, bx = where((it // k_tiles) * blocks + bid)
                    rb = (d % W) * tiles_per_rank + t
                    T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                    T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k], As[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n], Bs[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    if tx == 0:
                        T.mbarrier_arrive(full[s])
            elif tx < 64:                                 # warp 1: the sums
                T.set_max_nreg(40, 0)
                e[0] = T.call_number(counters, scope="warp")
                for j in T.serial(n_mine):
                    d, t, bx = where(j * blocks + bid)
                    tile = t * tiles_n + bx
                    w_in = (d - 2) * tiles + tile
                    w_out = (d - 1) * tiles + tile
                    if d > 1:                             # the sum in, once pushed (Rs is free: its last push read it)
                        if GPU:
                            T.call_extern("handle", "diag_wait_ge_gpu", T.access_ptr(arrived[w_in], "r"), e[0])
                        else:
                            T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                        T.load_async(R[_sum_row(e[0], w_in, slots, tiles, block_m):_sum_row(e[0], w_in, slots, tiles, block_m) + block_m, :], Rs, barrier=landed)
                    else:
                        T.call_extern("handle", "diag_arrive1", T.address_of(landed[0]))
                    T.mbarrier_wait_parity(rs_full[0], j & 1)     # the sum out, written into Rs
                    if d == W:
                        T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                      T.access_ptr(C[t * block_m, bx * block_n], "w"),
                                      block_m, block_n * 2, rb_bytes, N * 2)
                        T.call_extern("handle", "diag_wait_read")
                    else:
                        T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                      T.access_ptr(R[_sum_row(e[0], w_out, slots, tiles, block_m), 0], "w"),
                                      1, block_m * rb_bytes, block_m * rb_bytes, block_m * rb_bytes)
                        T.call_extern("handle", "diag_wait_read")
                        T.release_stores(arrived[w_out], 1, scope="gpu" if GPU else "sys")
                T.call_extern("handle", "diag_wait_written")
            elif tx < 128:
                T.set_max_nreg(40, 0)
            else:                                         # warps 4-11: the GEMM, the add
                T.set_max_nreg(232, 1)
                if not NOFENCE:
                    T.fence_proxy_async()
                for j in T.serial(n_mine):
                    d, t, bx = where(j * blocks + bid)
                    for ko in T.serial(k_tiles):
                        it = j * k_tiles + ko
                        s = it % stages
                        T.mbarrier_wait_parity(full[s], (it // stages) & 1)
                        T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                        T.mbarrier_arrive(empty[s])
                    T.wait_barrier(landed, j & 1)
                    if d > 1:
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    for i, k in T.Parallel(block_m, block_n):
                        Rs[i, k] = Cl[i, k]
                    T.fence_proxy_async()
                    T.mbarrier_arrive(rs_full[0])

    return gemm_rs_push


def push_swz_func(M, N, K, W, V="", blocks=132, block_m=128, block_n=256, block_k=64, stages=3, swizzle=10):
    """GEMM+RS's persistent push kernel (loopback: rank 0 of W, pushes into its own R) with hand-written warp
    specialisation: warp 0 loads X and W (TMA), warp 1 moves the sums (waits for a sum in, loads it into Rs, pushes
    the sum out from Rs or stores it into C, counts it), warps 4-11 multiply and add. V: "gpu" (GPU-scope flags)."""
    from tilelang.layout import make_swizzled_layout

    from tilescale.ops import vectors
    from tilescale.ops.gemm import SUM_IN_PAD, even_panel
    from tilescale.ops.gemm_reduce_scatter import _sum_row, push_shapes
    dtype = "bfloat16"
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = K // block_k
    total = W * tiles
    blocks = min(blocks, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)
    rb_bytes = (block_n + SUM_IN_PAD) * 2
    GPU = "gpu" in V
    NOFENCE = "nofence" in V

    def where(g):          # tile g of the step-by-step order: (step d, row tile t within the owner's, column bx)
        d = g // tiles + 1
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
        return d, t, bx

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER)):
        with T.Kernel(blocks, threads=384) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((stages, block_m, block_k), dtype)
            Bs = T.alloc_shared((stages, block_k, block_n), dtype)
            Rs = T.alloc_shared((block_m, block_n), dtype)
            T.annotate_layout({Rs: make_swizzled_layout(Rs)})
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * stages)
            empty = T.alloc_barrier([256] * stages)
            rs_full = T.alloc_barrier([256])
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            tx = T.get_thread_binding()
            n_mine = T.ceildiv(total - bid, blocks)
            if tx < 32:                                   # warp 0: X and W, by TMA
                T.set_max_nreg(40, 0)
                for it in T.serial(n_mine * k_tiles):
                    s = it % stages
                    ko = it % k_tiles
                    d, t, bx = where((it // k_tiles) * blocks + bid)
                    rb = (d % W) * tiles_per_rank + t
                    T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                    T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k], As[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n], Bs[s, :, :],
                               barrier=full[s], leader_scope_threads=32)
                    if tx == 0:
                        T.mbarrier_arrive(full[s])
            elif tx < 64:                                 # warp 1: the sums
                T.set_max_nreg(40, 0)
                e[0] = T.call_number(counters, scope="warp")
                for j in T.serial(n_mine):
                    d, t, bx = where(j * blocks + bid)
                    tile = t * tiles_n + bx
                    w_in = (d - 2) * tiles + tile
                    w_out = (d - 1) * tiles + tile
                    if d > 1:                             # the sum in, once pushed (Rs is free: its last push read it)
                        if GPU:
                            T.call_extern("handle", "diag_wait_ge_gpu", T.access_ptr(arrived[w_in], "r"), e[0])
                        else:
                            T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                        T.call_extern("handle", "tilescale::load_rows_async", T.access_ptr(R[_sum_row(e[0], w_in, slots, tiles, block_m), 0], "r"), T.access_ptr(Rs[0, 0], "w"), 1, block_m * block_n * 2, block_m * block_n * 2, block_m * block_n * 2, T.address_of(landed[0]))
                    else:
                        T.call_extern("handle", "diag_arrive1", T.address_of(landed[0]))
                    T.mbarrier_wait_parity(rs_full[0], j & 1)     # the sum out, written into Rs
                    if d == W:
                        T.tma_copy(Rs, C[t * block_m:(t + 1) * block_m, bx * block_n:(bx + 1) * block_n],
                                   leader_scope_threads=32)
                        T.call_extern("handle", "diag_wait_read")
                    else:
                        T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                      T.access_ptr(R[_sum_row(e[0], w_out, slots, tiles, block_m), 0], "w"),
                                      1, block_m * block_n * 2, block_m * block_n * 2, block_m * block_n * 2)
                        T.call_extern("handle", "diag_wait_read")
                        T.release_stores(arrived[w_out], 1, scope="gpu" if GPU else "sys")
                T.call_extern("handle", "diag_wait_written")
            elif tx < 128:
                T.set_max_nreg(40, 0)
            else:                                         # warps 4-11: the GEMM, the add
                T.set_max_nreg(232, 1)
                if not NOFENCE:
                    T.fence_proxy_async()
                for j in T.serial(n_mine):
                    d, t, bx = where(j * blocks + bid)
                    for ko in T.serial(k_tiles):
                        it = j * k_tiles + ko
                        s = it % stages
                        T.mbarrier_wait_parity(full[s], (it // stages) & 1)
                        T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                        T.mbarrier_arrive(empty[s])
                    T.wait_barrier(landed, j & 1)
                    if d > 1:
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    T.copy(Cl, Rs)
                    T.fence_proxy_async()
                    T.mbarrier_arrive(rs_full[0])

    return gemm_rs_push


@tilescale.jit
def push_ws_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return push_ws_func(M, N, K, W, V)


@tilescale.jit(pass_configs={"tl.disable_thread_storage_sync": True})
def push_ws_nosync_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return push_ws_func(M, N, K, W, V)


@tilescale.jit
def push_swz_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return push_swz_func(M, N, K, W, V)
