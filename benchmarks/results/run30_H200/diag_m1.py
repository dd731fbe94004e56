"""Diagnostic (run 30, M1): the push kernel of the working tree (a copy, loopback) with switches: `noring` (the sums
warp moves nothing: no waits, loads, pushes or counts; results wrong, timing only), `noadd` (the multiplying warps
skip the add and the write; timing only), `discard` (the sums warp drops each sum in from L2 once read:
discard.global.L2, so that the dead sums are never written back to HBM), `wlast` (W's TMA loads evict_last)."""
import tilescale
import tilescale.language as T
from tilescale.ops import vectors
from tilescale.ops.gemm import SUM_IN_PAD, even_panel, tile_order
from tilescale.ops.gemm_reduce_scatter import _pushed_to, _sum_row, push_shapes

SRC = r"""
#ifndef DIAGM1_CUH_
#define DIAGM1_CUH_
__device__ __forceinline__ void diag_discard(void* p, long long offset, int nbytes) {
  char* c = (char*)p + offset;
  for (int o = (threadIdx.x & 31) * 128; o < nbytes; o += 32 * 128)
    asm volatile("discard.global.L2 [%0], 128;" :: "l"(c + o) : "memory");
}
__device__ __forceinline__ void diag_copy_out(const void* src, void* dst, long long off, int nbytes, int tid,
                                              int nthr) {
  const int4* s = (const int4*)src;
  int4* d = (int4*)((char*)dst + off);
  const int n = nbytes >> 4;
#pragma unroll 4
  for (int i = tid; i < n; i += nthr) d[i] = s[i];
}
__device__ __forceinline__ void diag_copy_in(const void* src, long long off, void* dst, int nbytes, int tid, int nthr) {
  const int4* s = (const int4*)((const char*)src + off);
  int4* d = (int4*)dst;
  const int n = nbytes >> 4;
#pragma unroll 4
  for (int i = tid; i < n; i += nthr) d[i] = s[i];
}
__device__ __forceinline__ void diag_bar(int id, int n) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ unsigned long long diag_share(unsigned long long v, int writer) {
  __shared__ unsigned long long shared_v;
  if (writer && (threadIdx.x & 31) == 0) shared_v = v;
  asm volatile("bar.sync 12, 96;" ::: "memory");
  return shared_v;
}
__device__ __forceinline__ void diag_release(void* flag) {
  if ((threadIdx.x & 31) == 0) {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("red.relaxed.sys.global.add.u64 [%0], 1;" :: "l"(flag) : "memory");
  }
}
#endif
"""


def diag_func(M, N, K, world_size, V="", dtype="bfloat16", block_m=128, block_n=256, block_k=64, stages=3,
              threads=256, swizzle=10, loopback=True, sms=132):
    W = world_size
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n
    slots = W - 1
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = min(sms, total)
    panel = even_panel(tiles_per_rank, swizzle)
    slab, words = push_shapes(M, N, W, block_m, block_n)
    NORING, NOADD, DISCARD, WLAST = ("noring" in V, "noadd" in V, "discard" in V, "wlast" in V)
    NOWAIT, NOREL, NOLOAD, NOPUSH = ("nowait" in V, "norel" in V, "noload" in V, "nopush" in V)
    LSUPUSH, LSULOAD, LSUBAR = "lsupush" in V, "lsuload" in V, "lsubar" in V
    MC = "mc" in V      # 2-CTA clusters: tiles (2p, bx), (2p + 1, bx) of a step, W's tile multicast to both
    if MC:
        assert tiles_per_rank % 2 == 0
        blocks = blocks // 2 * 2
        pairs = total // 2
        clusters = blocks // 2
        panel2 = even_panel(tiles_per_rank // 2, swizzle)
    slot_bytes = block_m * (block_n + SUM_IN_PAD) * 2
    mma = threads
    out = _pushed_to(loopback)

    def where(g):
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, panel)
        return g // tiles + 1, t, bx

    def where2(p, r):     # pair p of the step-by-step order, CTA r of the cluster
        tp, bx = tile_order(p % (tiles // 2), tiles_per_rank // 2, tiles_n, panel2)
        return p // (tiles // 2) + 1, 2 * tp + r, bx

    def at(j, bid):       # this block's j-th tile
        if MC:
            return where2(j * clusters + bid // 2, bid % 2)
        return where(j * blocks + bid)

    def tile_of(buf, e, w):
        return buf[_sum_row(e, w, slots, tiles, block_m):_sum_row(e, w, slots, tiles, block_m) + block_m, :]

    row_bytes = (block_n + SUM_IN_PAD) * 2

    @T.macro
    def diag_lsu_loop(first, tx, bid, mine, e, R, Rs, C, arrived, counters, landed,
                      summed):     # warps 1-3 (96 threads): the pushes by plain 16-byte stores; warp 1 the rest
        if first:
            e[0] = T.call_extern("uint64", "diag_share", T.call_number(counters, scope="warp"), 1)
        else:
            e[0] = T.call_extern("uint64", "diag_share", T.cast(0, "uint64"), 0)
        for j in T.serial(mine):
            d, t, bx = at(j, bid)
            tile = t * tiles_n + bx
            if d > 1:
                w_in = (d - 2) * tiles + tile
                if LSULOAD:
                    if first:
                        T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                    T.evaluate(T.call_extern("handle", "diag_bar", 13, 96))
                    T.evaluate(T.call_extern("handle", "diag_copy_in", T.address_of(R[0, 0]),
                                             T.cast(_sum_row(e[0], w_in, slots, tiles, block_m), "int64") * row_bytes,
                                             T.address_of(Rs[0, 0]), slot_bytes, tx - 32, 96))
                    T.evaluate(T.call_extern("handle", "diag_bar", 14, 96))
                    if tx == 32:
                        T.arrive_barrier(landed)
                elif first:
                    T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                    T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
            elif tx == 32:
                T.arrive_barrier(landed)
            if LSUBAR:        # warp 1 waits for the sum out; warps 2, 3 sleep at a named barrier meanwhile
                if first:
                    T.mbarrier_wait_parity(summed[0], j & 1)
                T.evaluate(T.call_extern("handle", "diag_bar", 11, 96))
            else:
                T.mbarrier_wait_parity(summed[0], j & 1)
            if d == W:
                if first:
                    T.store_async(Rs[0:block_m, 0:block_n], C[t * block_m:(t + 1) * block_m,
                                                                 bx * block_n:(bx + 1) * block_n], wait="written")
            else:
                w_out = (d - 1) * tiles + tile
                T.evaluate(T.call_extern("handle", "diag_copy_out", T.address_of(Rs[0, 0]), T.address_of(R[0, 0]),
                                         T.cast(_sum_row(e[0], w_out, slots, tiles, block_m), "int64") * row_bytes,
                                         slot_bytes, tx - 32, 96))
                T.evaluate(T.call_extern("handle", "diag_bar", 12, 96))
                if first:
                    T.evaluate(T.call_extern("handle", "diag_release", T.address_of(arrived[w_out])))
            T.fence_proxy_async()     # (generic reads of Rs before the next bulk load writes it)

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
        with T.Kernel(blocks, threads=128 + mma, cluster_dims=2 if MC else None) as bid:
            T.import_source(SRC)
            As = T.alloc_shared((stages, block_m, block_k), dtype)
            Bs = T.alloc_shared((stages, block_k, block_n), dtype)
            Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)
            Cl = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([1] * stages)
            if MC:
                empty = T.alloc_cluster_barrier([mma + mma // 32] * stages)   # both CTAs' warps
            else:
                empty = T.alloc_barrier([mma] * stages)
            summed = T.alloc_barrier([mma])
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(landed)
            e = T.alloc_local((1,), "uint64")
            tx = T.get_thread_binding()
            me = T.get_rank()
            mine = T.ceildiv(pairs - bid // 2, clusters) if MC else T.ceildiv(total - bid, blocks)
            if tx < 128:
                T.set_max_nreg(40, 0)
                if tx < 32:
                    for it in T.serial(mine * k_tiles):
                        s, ko = it % stages, it % k_tiles
                        d, t, bx = at(it // k_tiles, bid)
                        rb = ((me + d) % W) * tiles_per_rank + t
                        T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                        T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k],
                                   As[s, :, :], barrier=full[s], leader_scope_threads=32)
                        if MC:
                            T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n],
                                       Bs[s, :, :], barrier=full[s], leader_scope_threads=32, cluster_mask=3)
                        elif WLAST:
                            T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n],
                                       Bs[s, :, :], barrier=full[s], leader_scope_threads=32,
                                       eviction_policy="evict_last")
                        else:
                            T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n],
                                       Bs[s, :, :], barrier=full[s], leader_scope_threads=32)
                        if tx == 0:
                            T.mbarrier_arrive(full[s])
                elif tx < 64 and LSUPUSH:
                    diag_lsu_loop(True, tx, bid, mine, e, R, Rs, C, arrived, counters, landed, summed)
                elif tx < 64:
                    e[0] = T.call_number(counters, scope="warp")
                    for j in T.serial(mine):
                        d, t, bx = at(j, bid)
                        tile = t * tiles_n + bx
                        if NORING:
                            if tx == 32:
                                T.arrive_barrier(landed)
                            T.mbarrier_wait_parity(summed[0], j & 1)
                        else:
                            if d > 1:
                                w_in = (d - 2) * tiles + tile
                                if not NOWAIT:
                                    T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                                if NOLOAD:
                                    if tx == 32:
                                        T.arrive_barrier(landed)
                                else:
                                    T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                            elif tx == 32:
                                T.arrive_barrier(landed)
                            T.mbarrier_wait_parity(summed[0], j & 1)
                            if DISCARD:
                                if d > 1:
                                    T.evaluate(T.call_extern(
                                        "handle", "diag_discard",
                                        T.address_of(R[0, 0]),
                                        T.cast(_sum_row(e[0], (d - 2) * tiles + tile, slots, tiles, block_m),
                                               "int64") * ((block_n + SUM_IN_PAD) * 2), slot_bytes))
                            if d == W:
                                T.store_async(Rs[0:block_m, 0:block_n], C[t * block_m:(t + 1) * block_m,
                                                                             bx * block_n:(bx + 1) * block_n],
                                              wait="written")
                            else:
                                w_out = (d - 1) * tiles + tile
                                if not NOPUSH:
                                    T.store_async(Rs, tile_of(out(R, Rp), e[0], w_out))
                                if not NOREL:
                                    T.release_stores(out(arrived, Ap)[w_out], 1, scope="sys")
                elif LSUPUSH:                         # warps 2, 3: helpers of the sums warp
                    diag_lsu_loop(False, tx, bid, mine, e, R, Rs, C, arrived, counters, landed, summed)
            else:
                T.set_max_nreg(232, 1)
                for j in T.serial(mine):
                    d, t, bx = at(j, bid)
                    for ko in T.serial(k_tiles):
                        s = (j * k_tiles + ko) % stages
                        T.mbarrier_wait_parity(full[s], ((j * k_tiles + ko) // stages) & 1)
                        T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                        T.mbarrier_arrive(empty[s])
                        if MC:
                            if tx % 32 == 0:
                                T.mbarrier_arrive(empty[s], cta_id=1 - bid % 2)
                    T.wait_barrier(landed, j & 1)
                    if not NOADD:
                        if d > 1:
                            for i, k in T.Parallel(block_m, block_n):
                                Cl[i, k] += Rs[i, k]
                        for i, k in T.Parallel(block_m, block_n):
                            Rs[i, k] = Cl[i, k]
                    T.fence_proxy_async()
                    T.mbarrier_arrive(summed[0])
            if MC:
                T.cluster_sync()     # no CTA leaves while its peer may still arrive on its barriers

    return gemm_rs_push


@tilescale.jit
def diag_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_func(M, N, K, W, V)
