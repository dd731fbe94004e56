"""Diagnostic (run 29): GEMM+RS's persistent push kernel (loopback, tilescale/ops/gemm_reduce_scatter.py at
965338d) with in-kernel clock stamps and switches V (timing only where a switch changes the protocol):
  stamps  clock64 at each phase of each tile (S[block, tile, slot]), by lane 0 of the storing warp and of warp 0
  gpu     the acquire load, the wait and the release at GPU scope (valid in the loopback: one GPU)
  late    no early start of the sum in (always loaded after the tile's GEMM)
  defer   the push's bulk copy returns without waiting for its read of Rs; the early sum-in load at step 2
          (after a wait for that read)
"""
import tilescale
import tilescale.language as T
from tilescale.ops import vectors
from tilescale.ops.gemm import SUM_IN_PAD, even_panel, tile_order
from tilescale.ops.gemm_reduce_scatter import _sum_row, push_shapes

SRC = r"""
#ifndef DIAG_CUH_
#define DIAG_CUH_
__device__ __forceinline__ long long diag_clock() { long long c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); return c; }
__device__ __forceinline__ long long diag_gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return (long long)t; }
__device__ __forceinline__ void diag_wait_ge_gpu(const void* p, unsigned long long v) {
  unsigned long long x;
  do { asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(p) : "memory"); } while (x < v);
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
__device__ __forceinline__ void diag_arrive(void* bar) {
  if ((threadIdx.x & 31) == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))) : "memory");
  __syncwarp();
}
__device__ __forceinline__ void diag_wait_written() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); __syncwarp(); }
__device__ __forceinline__ void diag_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); __syncwarp(); }
#endif
"""

MAX_TILES = 32
SLOTS = 16


def clock():
    T.import_source(SRC)
    return T.call_extern("int64", "diag_clock")


def gtime():
    T.import_source(SRC)
    return T.call_extern("int64", "diag_gtime")


def diag_func(M, N, K, W, V="", blocks=132, block_m=128, block_n=256, block_k=64, stages=3, threads=256, swizzle=10):
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = min(blocks, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)
    sw = 4
    ST = "stamps" in V
    GPU = "gpu" in V
    LATE = "late" in V
    DEFER = "defer" in V
    early_at = 2 if DEFER else 0
    rb_bytes = (block_n + SUM_IN_PAD) * 2

    def tile_of(buf, e, w):
        return buf[_sum_row(e, w, slots, tiles, block_m):_sum_row(e, w, slots, tiles, block_m) + block_m, :]

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), "bfloat16"), Wt: T.Tensor((K, N), "bfloat16"), C: T.Tensor((rows, N), "bfloat16"),
                     R: T.Tensor(slab, "bfloat16"), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     S: T.Tensor((blocks, MAX_TILES, SLOTS), "int64")):
        with T.Kernel(blocks, threads=threads) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((block_m, block_k), "bfloat16")
            Bs = T.alloc_shared((block_k, block_n), "bfloat16")
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), "bfloat16")
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            started = T.alloc_local((1,), "int32")
            loads = T.alloc_local((1,), "int32")
            pend = T.alloc_local((1,), "int32")
            loads[0] = 0
            pend[0] = -1
            started[0] = 0
            if T.get_thread_binding() // 32 == sw:
                e[0] = T.call_number(counters, scope="warp")
            T.fence_proxy_async()
            for it in T.Pipelined(T.ceildiv(total - bid, blocks) * k_tiles, num_stages=stages):
                g = (it // k_tiles) * blocks + bid
                j = it // k_tiles
                ko = it % k_tiles
                d = g // tiles + 1
                t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
                rb = ((0 + d) % W) * tiles_per_rank + t
                tile = t * tiles_n + bx
                w_in = (d - 2) * tiles + tile
                w_out = (d - 1) * tiles + tile
                T.copy(X[rb * block_m, ko * block_k], As)
                T.copy(Wt[ko * block_k, bx * block_n], Bs)
                if ko == 0:
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 0] = clock()
                            S[bid, j, 10] = gtime()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 11] = clock()
                    if DEFER:
                        if T.get_thread_binding() // 32 == sw:
                            started[0] = 0
                        T.fence_proxy_async()
                if ko == early_at:
                    if d > 1 and not LATE:
                        if T.get_thread_binding() // 32 == sw:
                            if DEFER:
                                T.call_extern("handle", "diag_wait_read")
                            else:
                                started[0] = 0
                            if T.ld(arrived[w_in], sem="acquire", scope="gpu" if GPU else "sys") >= e[0]:
                                T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                                started[0] = 1
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 1] = clock()
                    T.fence_proxy_async()
                T.gemm(As, Bs, Cl, clear_accum=ko == 0)
                if ko == k_tiles - 1:
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 2] = clock()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 7] = clock()
                    if T.get_thread_binding() // 32 == sw:
                        if pend[0] >= 0:
                            T.release_stores(arrived[pend[0]], 1, scope="gpu" if GPU else "sys")
                            pend[0] = -1
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 3] = clock()
                    if d > 1:
                        if T.get_thread_binding() // 32 == sw:
                            if LATE or DEFER:
                                if LATE:
                                    started[0] = 0
                                if DEFER:
                                    if started[0] == 0:
                                        T.call_extern("handle", "diag_wait_read")
                            if started[0] == 0:
                                if GPU:
                                    T.call_extern("handle", "diag_wait_ge_gpu", T.access_ptr(arrived[w_in], "r"), e[0])
                                else:
                                    T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                                T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                        if ST:
                            if T.get_thread_binding() == 128:
                                S[bid, j, 4] = clock()
                                S[bid, j, 12] = started[0]
                        T.wait_barrier(landed, loads[0] % 2)
                        loads[0] = loads[0] + 1
                        if ST:
                            if T.get_thread_binding() == 128:
                                S[bid, j, 5] = clock()
                            if T.get_thread_binding() == 0:
                                S[bid, j, 8] = clock()
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 6] = clock()
                    if d == W:
                        T.copy(Cl, C[t * block_m, bx * block_n])
                    else:
                        T.copy(Cl, Rs[0:block_m, 0:block_n])
                        T.fence_proxy_async()
                        if T.get_thread_binding() // 32 == sw:
                            if DEFER:
                                T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                              T.access_ptr(R[_sum_row(e[0], w_out, slots, tiles, block_m), 0], "w"),
                                              1, block_m * rb_bytes, block_m * rb_bytes, block_m * rb_bytes)
                            else:
                                T.store_async(Rs, tile_of(R, e[0], w_out))
                            pend[0] = w_out
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 9] = clock()
                            S[bid, j, 14] = gtime()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 13] = clock()
                    T.fence_proxy_async()
            if T.get_thread_binding() // 32 == sw:
                if DEFER:
                    T.call_extern("handle", "diag_wait_read")
                if pend[0] >= 0:
                    T.release_stores(arrived[pend[0]], 1, scope="gpu" if GPU else "sys")

    return gemm_rs_push


@tilescale.jit
def diag_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_func(M, N, K, W, V)


def diag_v2(M, N, K, W, V="", blocks=132, block_m=128, block_n=256, block_k=64, stages=3, threads=256, swizzle=10):
    """v2: the storing warp's waits moved into the next tile's loop (its WG stalls there while the other WG's
    wgmma go on): step s1 waits for the read of the previous push (or C store), s2 counts it (release), s3
    checks the next sum in and starts loading it (or arrives on `landed`: no sum in at step 1); the epilogue
    writes the sum (fp32 add, rounded) into Rs in one pass and pushes it, or stores it into C, by bulk copies
    that do not wait. V: "stamps", "gpu" (GPU-scope flags: loopback only), "s=a,b,c" the three steps."""
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = min(blocks, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)
    sw = 4
    ST = "stamps" in V
    GPU = "gpu" in V
    steps = (1, 2, 3)
    for tok in V.split():
        if tok.startswith("s="):
            steps = tuple(int(x) for x in tok[2:].split(","))
    s1, s2, s3 = (min(x, k_tiles - 1) for x in steps)
    rb_bytes = (block_n + SUM_IN_PAD) * 2
    scope = "gpu" if GPU else "sys"

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), "bfloat16"), Wt: T.Tensor((K, N), "bfloat16"), C: T.Tensor((rows, N), "bfloat16"),
                     R: T.Tensor(slab, "bfloat16"), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     S: T.Tensor((blocks, MAX_TILES, SLOTS), "int64")):
        with T.Kernel(blocks, threads=threads) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((block_m, block_k), "bfloat16")
            Bs = T.alloc_shared((block_k, block_n), "bfloat16")
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), "bfloat16")
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            started = T.alloc_local((1,), "int32")
            loads = T.alloc_local((1,), "int32")
            pend = T.alloc_local((1,), "int32")       # word of the pushed tile not yet counted, or -1
            stored = T.alloc_local((1,), "int32")     # a bulk store from Rs not yet known to have read it
            t0 = T.alloc_local((1,), "int64")
            loads[0] = 0
            pend[0] = -1
            stored[0] = 0
            started[0] = 0
            if T.get_thread_binding() // 32 == sw:
                e[0] = T.call_number(counters, scope="warp")
            T.fence_proxy_async()
            for it in T.Pipelined(T.ceildiv(total - bid, blocks) * k_tiles, num_stages=stages):
                g = (it // k_tiles) * blocks + bid
                j = it // k_tiles
                ko = it % k_tiles
                d = g // tiles + 1
                t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
                rb = ((0 + d) % W) * tiles_per_rank + t
                tile = t * tiles_n + bx
                w_in = (d - 2) * tiles + tile
                w_out = (d - 1) * tiles + tile
                T.copy(X[rb * block_m, ko * block_k], As)
                T.copy(Wt[ko * block_k, bx * block_n], Bs)
                if ko == 0:
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 0] = clock()
                            S[bid, j, 10] = gtime()
                if ko == s1:
                    if T.get_thread_binding() // 32 == sw:
                        if ST:
                            t0[0] = clock()
                        if stored[0] == 1:
                            T.call_extern("handle", "diag_wait_read")
                            stored[0] = 0
                        if ST:
                            S[bid, j, 1] = clock() - t0[0]
                    T.fence_proxy_async()
                if ko == s2:
                    if T.get_thread_binding() // 32 == sw:
                        if ST:
                            t0[0] = clock()
                        if pend[0] >= 0:
                            T.release_stores(arrived[pend[0]], 1, scope=scope)
                            pend[0] = -1
                        if ST:
                            S[bid, j, 3] = clock() - t0[0]
                    T.fence_proxy_async()
                if ko == s3:
                    if T.get_thread_binding() // 32 == sw:
                        if ST:
                            t0[0] = clock()
                        started[0] = 0
                        if d > 1:
                            if T.ld(arrived[w_in], sem="acquire", scope=scope) >= e[0]:
                                T.load_async(R[_sum_row(e[0], w_in, slots, tiles, block_m):_sum_row(e[0], w_in, slots, tiles, block_m) + block_m, :], Rs, barrier=landed)
                                started[0] = 1
                        else:
                            T.call_extern("handle", "diag_arrive", T.address_of(landed[0]))
                            started[0] = 1
                        if ST:
                            S[bid, j, 15] = clock() - t0[0]
                    T.fence_proxy_async()
                T.gemm(As, Bs, Cl, clear_accum=ko == 0)
                if ko == k_tiles - 1:
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 2] = clock()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 7] = clock()
                    if T.get_thread_binding() // 32 == sw:
                        if started[0] == 0:
                            if GPU:
                                T.call_extern("handle", "diag_wait_ge_gpu", T.access_ptr(arrived[w_in], "r"), e[0])
                            else:
                                T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                            T.load_async(R[_sum_row(e[0], w_in, slots, tiles, block_m):_sum_row(e[0], w_in, slots, tiles, block_m) + block_m, :], Rs, barrier=landed)
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 4] = clock()
                            S[bid, j, 12] = started[0]
                    T.wait_barrier(landed, loads[0] % 2)
                    loads[0] = loads[0] + 1
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 5] = clock()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 8] = clock()
                    if d > 1:
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    for i, k in T.Parallel(block_m, block_n):
                        Rs[i, k] = Cl[i, k]
                    T.fence_proxy_async()
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 6] = clock()
                    if T.get_thread_binding() // 32 == sw:
                        if d == W:
                            T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                          T.access_ptr(C[t * block_m, bx * block_n], "w"),
                                          block_m, block_n * 2, rb_bytes, N * 2)
                        else:
                            T.call_extern("handle", "diag_store_nowait", T.access_ptr(Rs[0, 0], "r"),
                                          T.access_ptr(R[_sum_row(e[0], w_out, slots, tiles, block_m), 0], "w"),
                                          1, block_m * rb_bytes, block_m * rb_bytes, block_m * rb_bytes)
                            pend[0] = w_out
                        stored[0] = 1
                    if ST:
                        if T.get_thread_binding() == 128:
                            S[bid, j, 9] = clock()
                            S[bid, j, 14] = gtime()
                        if T.get_thread_binding() == 0:
                            S[bid, j, 13] = clock()
                    T.fence_proxy_async()
            if T.get_thread_binding() // 32 == sw:
                T.call_extern("handle", "diag_wait_written")
                if pend[0] >= 0:
                    T.release_stores(arrived[pend[0]], 1, scope=scope)

    return gemm_rs_push


@tilescale.jit
def diag_v2_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_v2(M, N, K, W, V)
