"""The pull path of GEMM + ReduceScatter (:mod:`tilescale.ops.gemm_reduce_scatter`): its GEMM and its reduction.

**pull** (a rank on another node, ``TILESCALE_NODE_SIZE`` included; more than 8 ranks; MPS-shared GPUs): the
GEMM counts finished tiles per row block and a reduction kernel on a side stream, on a few SMs, pulls each
finished row block of every rank as soon as its count is complete and sums it in fp32, while the GEMM goes on.
A rank of this node is read over NVLink (loads through its peer mapping); a rank of another node with NVSHMEM:
its count polled with atomic fetches, its rows fetched with a get into a symmetric staging tile. The partials
``P`` are double-buffered by e % 2 (rows ``(e % 2) * M + ...``):

1. GEMM (main stream): a block stores its tile of row block rb into ``P[e % 2]`` with one TMA store; the
   consumer warp of the thread that issued it waits until that store is written, then adds 1 to ``done[rb]``
   (one release per tile, system scope; ``T.release_stores``); a row block is complete at ``e * tiles_n``;
2. reduction (side stream), for each row block of this rank's chunk, for each rank s in the order the
   blocks complete (rank-1, rank-2, ..., rank): wait until s's ``done[rb]`` is complete (acquire,
   system scope; polled through the peer mapping, or with NVSHMEM atomic fetches for another node),
   add s's partial rows into fp32 accumulators (loaded through the mapping, or first fetched with
   ``get_block`` into this block's ``staging`` tile); then store the sum into C_local;
3. the main stream joins the side stream. The next-but-one call may overwrite ``P[e % 2]``: by then
   every peer has finished reducing epoch e (its call e + 1 started after, and we waited for it).
The rows per rank are a run-time argument of both kernels, up to the op's bound (``P`` and ``done`` are sized for
it, their sizes run-time arguments too: one build serves every bound of one config). The GEMM runs the bound's
tiles, those past the call's rows with no step of K, so that every count of ``done`` grows by a tile's per call.
"""
import tilescale
import tilescale.language as T

from ..compat import storing_warp
from . import vectors
from .gemm import main_loop, store_tile, tile_buffers

REDUCE_THREADS = 512    # the reduction's threads per block


@tilescale.jit
def gemm_rs_gemm_kernel(N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                        team=None):
    """The GEMM of :class:`GemmRS`'s pull path: partial rows in the order their owners reduce them, with counts.
    The rows per rank `m` are a run-time size (X: (W, m, K)), and so is the op's bound (``done``: `row_blocks`
    words, W x its row tiles per rank; ``P``: two halves of as many row tiles). The grid covers the bound's row
    tiles, so that every call counts every word of ``done`` (``per_block`` a call): a tile past the call's rows
    multiplies nothing (no step of K) and stores zeros. `team`: the ranks of the op's group
    (tilescale.runtime.team.kernel_team; None: the world): ranks are indices in it."""
    W = world_size
    m, row_blocks, p_rows = T.dynamic("m"), T.dynamic("row_blocks"), T.dynamic("p_rows")
    tiles_per_rank = row_blocks // W                  # at the bound (P's and done's layout)
    tiles_n = -(-N // block_n)
    k_tiles = -(-K // block_k)

    @T.prim_func
    def gemm_rs_gemm(X: T.Tensor((W, m, K), dtype), Wt: T.Tensor((K, N), dtype), P: T.Tensor((p_rows, N), dtype),
                     done: T.Tensor((row_blocks,), "uint64"),
                     counters: T.Tensor((tiles_n * row_blocks,), vectors.COUNTER)):
        with T.Kernel(tiles_n, row_blocks, threads=threads) as (bx, by):
            Xs, Ws, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            e = T.call_number(counters)
            p = T.cast(e % 2, "int32")                        # this call's half of P
            me = T.team_rank(team)
            at = T.alloc_local((2,), "int32")   # in registers (tilescale.ops.gemm, NOTE [registers]), 32-bit: done's
            at[0] = by % tiles_per_rank         # index is 64-bit, and a 64-bit division a call, which serialises the
            at[1] = (me + 1 + by // tiles_per_rank) % W       # wgmma; rank+1's rows first, own rows last
            t = at[0]
            src = at[1]
            rb = src * tiles_per_rank + t                     # (the epilogue reads t and src: the store's row block)
            main_loop(X, Wt, Xs, Ws, Cl, t, bx, stages, 0, T.if_then_else(t * block_m < m, k_tiles, 0), a_src=src)
            T.copy(Cl, Cs)
            store_tile(Cs, P, p * row_blocks + rb, bx)        # a TMA store
            if T.get_thread_binding() // 32 == storing_warp(threads):   # once written: one release per tile,
                T.release_stores(done[rb], 1, scope="sys")               # by the warp that issued the store

    return gemm_rs_gemm


@tilescale.jit
def gemm_rs_reduce_kernel(N: int, world_size: int, per_block: int, blocks: int, dtype: str = "bfloat16",
                          block_m: int = 128, col_tile: int = 256, threads: int = REDUCE_THREADS, team=None):
    """The reduction of :class:`GemmRS`: C_local = sum over ranks of their partial rows of this rank, the call's
    `m` rows (C: (m, N); P and done of the op's bound, as :func:`gemm_rs_gemm_kernel`'s); `team` as there (a peer
    s of the group is PE ``team_pe(team, s)``)."""
    W = world_size
    m, row_blocks, p_rows = T.dynamic("m"), T.dynamic("row_blocks"), T.dynamic("p_rows")
    tiles_per_rank = row_blocks // W                  # at the bound
    col_tiles = N // col_tile
    units = T.ceildiv(m, block_m) * col_tiles         # this call's

    @T.prim_func
    def gemm_rs_reduce(P: T.Tensor((p_rows, N), dtype), done: T.Tensor((row_blocks,), "uint64"),
                       C: T.Tensor((m, N), dtype), staging: T.Tensor((blocks, block_m, col_tile), dtype),
                       counters: T.Tensor((blocks,), vectors.COUNTER)):
        with T.Kernel(blocks, threads=threads) as bid:
            acc = T.alloc_fragment((block_m, col_tile), "float32")
            e = T.call_number(counters)
            p0 = T.cast(e % 2, "int32") * (row_blocks * block_m)   # this call's half of P
            me = T.team_rank(team)
            tx = T.get_thread_binding()
            for u in T.serial(T.ceildiv(units, blocks)):
                unit = u * blocks + bid
                if unit < units:
                    t = unit // col_tiles
                    c0 = (unit % col_tiles) * col_tile
                    rb = me * tiles_per_rank + t
                    r0 = p0 + rb * block_m                    # its rows in this call's half of P
                    T.clear(acc)
                    for j in T.serial(W):
                        s = (me + 2 * W - 1 - j) % W          # rank-1, rank-2, ..., rank
                        if tx == 0:
                            T.wait_until(done[rb], cmp="ge", value=e * per_block, src_pe=T.team_pe(team, s))
                        T.sync_threads()
                        if T.peer_reachable(P, pe=T.team_pe(team, s)):   # this node: loads through the mapping
                            Ps = T.remote(P, pe=T.team_pe(team, s))
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += Ps[r0 + i, c0 + k]
                        else:                                  # another node: an NVSHMEM get, then local loads
                            T.get_block(P[r0:r0 + block_m, c0:c0 + col_tile], staging[bid, :, :],
                                        src_pe=T.team_pe(team, s))
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += staging[bid, i, k]
                    T.copy(acc, C[t * block_m, c0])           # (rows past m: not stored)

    return gemm_rs_reduce

