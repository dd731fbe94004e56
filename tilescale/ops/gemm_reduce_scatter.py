"""GEMM + ReduceScatter, overlapped (row-parallel layer): ``C_local = ReduceScatter(X_local @ W_local)``.

torch equivalent (X_local: (M, K/W), W_local: (K/W, N) on each rank)::

    partial = X_local @ W_local                                   # (M, N)
    C_local = torch.empty(M // W, N)
    torch.distributed.reduce_scatter_tensor(C_local, partial)     # sum over ranks, rows split by rank

Each rank's GEMM computes the row chunks in the order their owners need them: rank+1's rows first, its own
last. Two ways to sum them (chosen per job, the same on every rank: :func:`default_path`):

**push** (every rank on this node, NVLink / P2P mapped; the default there): one kernel on every SM, nothing
else, summing along a ring like NCCL's reduce-scatter. At step d = 1 .. W a rank computes the rows of rank
me + d, so the tile (t, n) of owner o is computed at step 1 by rank o - 1, at step 2 by o - 2, ..., at step W
by o itself: each rank adds its product to the sum of the steps before, which rank me + 1 pushed one step
earlier, and pushes the new sum to rank me - 1; the owner's sum is complete. No SM is reserved, no reduction
kernel runs, and at world size 1 the call is this GEMM alone (a plain grid). The kernel is persistent: one block
per SM runs tiles b, b + SMs, ... of the step-by-step order (all of step 1's tiles, then step 2's, ...;
rasterized in equal panels within a step), and its warps have roles, so that nothing but the GEMM waits on the
multiplying warps (the sums' waits, loads, pushes and counts cost a tile of the GEMM 13-20% when its own warps
made them). The sums go out by three warps' plain stores (``T.store_tile``: why not one bulk store, in its
docstring).
``R`` holds a tile per row block (rows padded against bank conflicts, so that a sum moves in one copy each
way) and is double-buffered by the call number e = 1, 2, ... (counted on the
device, ``T.call_number``: a call captured in a CUDA graph sees a new e on every replay): tile i of slot
s = d - 2 of step d is row block ``((e % 2) * (W - 1) + s) * tiles + i``; ``arrived`` has one word per slot and
tile. Per tile of the block, in its order:

1. warp 0 (loads): for each step of K, waits until the stage is free, then loads the tiles of X and W into it
   by TMA (an mbarrier per stage each way, the config's stages: the next tile's first steps load during this
   tile's end);
2. warps 4 .. (multiply): for each step of K, wait for the stage, wgmma, free the stage; then wait until the tile
   ``Rs`` in shared memory holds the sum in (step d > 1) or is free (step 1), add it in fp32, write the sum
   (rounded to the dtype) into ``Rs``, fence it for the bulk copy and arrive on ``summed``: the next tile's
   steps follow at once;
3. warps 1-3 (sums; e is known to every thread before the roles): warp 1, step d > 1: wait until
   ``arrived[d - 2, tile] >= e`` (acquire, system scope), then load the sum in from this call's half of ``R``
   into ``Rs`` (``T.load_async``, one bulk copy); step 1: arrive on that barrier instead (``T.arrive_barrier``:
   ``Rs`` is free, its last push read). Warps 1-3 wait for ``summed``; step d < W: they push the sum from
   ``Rs`` into rank me - 1's ``R`` (through its peer mapping), slot d - 1, by their plain 16-byte stores
   (``T.store_tile``, which ends when all three have read ``Rs`` and met), then warp 1 raises rank me - 1's
   ``arrived[d - 1, tile]`` to e (one release per tile, system scope, covering the three warps' stores:
   ``T.release_stores`` through the mapping, of the calls since this rank last pushed the tile, which it notes in
   its own ``pushed``: a call of fewer rows leaves tiles out); step W: warp 1 stores my rows into C_local (bulk
   copies, only the call's rows, written before the block ends). Either way ``Rs`` has been read before warp 1
   loads the next sum in.

Rank me + 1 may overwrite a slot of half e % 2 in its call e + 2 only after its call e + 1 ended, which waited
(steps W .. 2) for the sums along the ring, the first of them pushed by my step 1 of call e + 1, which my GPU
ran after this call's kernel: so after I read the slot. A block may wait for a tile of a block after its own in
the order: every block of the grid must be resident (one per SM; another kernel holding SMs delays it, and the
wait of warp 1 (sums) for a flag gives up after ``TILESCALE_WAIT_TIMEOUT_S``, 100 s by default, and stops the
kernel); on distinct GPUs and for ranks that share a GPU time-sliced, every rank's blocks get SMs; ranks sharing a
GPU under MPS take the pull path (a rank's waiting blocks could hold every SM of the GPU they share). At world
size > 1 the kernel loads rows of X by TMA: a K_local that is not a multiple of 8 takes the pull path
(:func:`push_takes`). The sums are rounded to the dtype at each step (W - 1 times, as NCCL's ring does).

The rows per rank are a run-time argument of the kernels, up to the op's bound (its buffers are sized for it, their
sizes run-time arguments too: one build serves every bound of one config). The push kernel runs one block per SM
whatever the rows (call numbers count per block: the grid never changes), a block past the call's tiles doing
nothing; the pull path's GEMM runs the bound's tiles, those past the call's rows with no step of K, so that every
count of ``done`` grows by a tile's per call.

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
"""

import tilescale
import tilescale.language as T

from ..compat import storing_warp
from . import checks, op_cache, vectors
from .base import Op, _capturing
from .gemm import (
    SUM_IN_PAD,
    GemmConfig,
    check_problem,
    even_panel,
    main_loop,
    problem_config,
    store_tile,
    tile_buffers,
    tile_loop,
    tile_order,
)
from .gemm_rs_path import MAX_PUSH_RANKS, PATHS, check_sizes, default_path, push_takes  # noqa: F401  (re-exported)

__all__ = ["GemmRS", "gemm_rs"]

# the push kernel's parameters, as GemmRS launches it through its C entry point (raw pointers, then the run-time sizes:
# the call's rows per rank, the rows of R and the words of arrived (the op's bound), then the stream)
PUSH_PARAMS = ("X", "Wt", "C", "R", "arrived", "counters", "Rp", "Ap", "pushed", "m", "r_rows", "words")


@tilescale.jit
def gemm_rs_push_kernel(N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                        sms: int = 132):
    """The one kernel of :class:`GemmRS`'s push path (module docstring): each tile of a peer's rows, with the
    partial sum that rank me + 1 pushed for it added, pushed on into rank me - 1's ``R`` and counted in its
    ``arrived`` (`Rp`, `Ap`: those of rank me - 1, through its peer mapping); my rows, with theirs added, into
    C. No NVSHMEM call but the rank: the peer is reached through its mapping. `sms`: the GPU's SMs (the blocks of
    the persistent kernel, one per SM: every block must be resident); world size 1: C = X @ Wt.

    The rows per rank `m` are a run-time size (X: (W, m, K), C: (m, N)), and so are those of the op's buffers,
    sized for its bound (``R``: `r_rows`, ``arrived``, ``pushed``: `words`, :func:`push_shapes`): one build serves
    every row count. A tile's word of ``arrived`` is counted up to the call number (the pusher adds the calls
    since it last pushed that tile, which it keeps in its own ``pushed``), so words of tiles a call of fewer rows
    leaves out are right again at the next call that has them."""
    return _push_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, False, sms)


@tilescale.jit
def gemm_rs_push_loopback_kernel(N: int, K: int, ranks: int, dtype: str = "bfloat16", block_m: int = 128,
                                 block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256,
                                 swizzle: int = 10, sms: int = 132):
    """:func:`gemm_rs_push_kernel` as rank 0 of `ranks` runs it, on one GPU with no peers, in a job of any size
    (benchmarks): its pushes go to its own ``R`` and are counted in its own ``arrived``, where its next steps
    wait for them and add them (C = the sum over d of X[rows of rank d] @ Wt). Same parameters (`Rp`, `Ap`
    unused: any tensors of their shapes)."""
    return _push_func(N, K, ranks, dtype, block_m, block_n, block_k, stages, threads, swizzle, True, sms)


def push_shapes(M: int, N: int, world_size: int, block_m: int, block_n: int) -> tuple:
    """The shapes of the push kernel's ``R`` and ``arrived`` (and ``pushed``: arrived's) for a bound of `M` rows
    (module docstring): R holds a tile per row block, rows padded (a sum in lands in shared memory in one copy,
    padded against bank conflicts), tile i of slot s of half h at row block ``(h * slots + s) * tiles + i``, tiles
    an owner's at the bound; arrived holds a count per slot and tile."""
    slots, tiles = max(world_size - 1, 1), -(-(M // world_size) // block_m) * (N // block_n)
    return (2 * slots * tiles * block_m, block_n + SUM_IN_PAD), (slots * tiles,)


def _sum_row(e, w, slots: int, tiles, block_m: int):
    """The first row of ``R`` (:func:`push_shapes`) of call `e`'s tile of word `w` (slot and tile) of ``arrived``."""
    return (T.cast(e % 2, "int32") * slots * tiles + w) * block_m


def _pushed_to(loopback: bool):
    """Where the push kernel's sums go and are counted: of its two buffers (its own, rank me - 1's through the
    peer mapping), its own in the loopback kernel. (Called inline: a buffer bound to a new name in a prim_func
    would rename the kernel's parameter.)"""
    return lambda own, peer: own if loopback else peer


def _push_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, loopback: bool,
               sms: int):
    if world_size > 1:
        return _push_persistent_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                                     loopback, sms)
    m, r_rows, words = T.dynamic("m"), T.dynamic("r_rows"), T.dynamic("words")
    slab = (r_rows, block_n + SUM_IN_PAD)             # (R, arrived, pushed, counters: unused at world size 1)

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((m, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((m, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor((words,), "uint64"),
                     counters: T.Tensor((sms,), vectors.COUNTER), Rp: T.Tensor(slab, dtype),
                     Ap: T.Tensor((words,), "uint64"), pushed: T.Tensor((words,), "uint64")):
        with T.Kernel(N // block_n, T.ceildiv(m, block_m), threads=threads) as (bx, by):   # C = X @ Wt
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            tile_loop(X, Wt, C, As, Bs, Cl, Cs, by, bx, stages, False)

    return gemm_rs_push


def _push_persistent_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                          loopback: bool, sms: int):
    """:func:`_push_func` at world size > 1 (module docstring, push 1-3): `sms` persistent blocks (one per SM) of
    three roles, block b running tiles b, b + sms, ... of the step-by-step order of the call's rows."""
    W = world_size
    m, r_rows, words = T.dynamic("m"), T.dynamic("r_rows"), T.dynamic("words")
    tiles_per_rank = T.ceildiv(m, block_m)           # this call's
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n                 # an owner's tiles in this call
    slots = W - 1
    layout = words // slots                          # an owner's tiles at the op's bound (R's and arrived's layout)
    k_tiles = -(-K // block_k)
    total = W * tiles
    blocks = sms
    panel = even_panel(tiles_per_rank, swizzle)      # within a step
    slab = (r_rows, block_n + SUM_IN_PAD)
    mma = threads                                    # the multiplying threads: warps 4 ..
    out = _pushed_to(loopback)

    def where(g, pnl):    # tile g of the step-by-step order: (step d, its row tile t in the owner's rows, column bx)
        t, bx = tile_order(g % tiles, tiles_per_rank, tiles_n, pnl)
        return g // tiles + 1, t, bx

    def tile_of(buf, e, w, lay):    # call e's tile of word w in `buf` (R or rank me - 1's), its padded rows
        return buf[_sum_row(e, w, slots, lay, block_m):_sum_row(e, w, slots, lay, block_m) + block_m, :]

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((W, m, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((m, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor((words,), "uint64"),
                     counters: T.Tensor((blocks,), vectors.COUNTER), Rp: T.Tensor(slab, dtype),
                     Ap: T.Tensor((words,), "uint64"), pushed: T.Tensor((words,), "uint64")):
        with T.Kernel(blocks, threads=128 + mma) as bid:
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
            # a tile's words and places in 32-bit registers: indices of buffers of a run-time size are 64-bit, and a
            # 64-bit division (of the tile's number by the call's tiles) is a call, which serialises the wgmma
            at = T.alloc_local((4,), "int32")
            pnl = T.alloc_local((2,), "int32")            # the panel: computed once (a chain of selects), and
            pnl[0] = panel                                # the layout's tiles per owner
            pnl[1] = layout
            e[0] = T.call_number(counters)               # (the sums warps' every use of it)
            tx = T.get_thread_binding()
            me = T.get_rank()
            mine = T.max(T.ceildiv(total - bid, blocks), 0)   # this block's tiles (none: fewer tiles than blocks)
            if tx < 128:                                  # warpgroup 0: its registers given up at once (PTX:
                T.set_max_nreg(40, 0)                     # every warp of a warpgroup runs the same setmaxnreg)
                if tx < 32:                               # 1: X and W, by TMA
                    for j in T.serial(mine):              # the tile's place once per tile, not at every step of
                        d, t, bx = where(j * blocks + bid, pnl[0] if swizzle > 0 else 0)   # K (divisions by the
                        at[0] = (me + d) % W                                                # call's tiles: NOTE
                        at[1] = t * block_m                                                 # [registers] in
                        at[2] = bx * block_n                                                # tilescale.ops.gemm)
                        for ko in T.serial(k_tiles):
                            s = (j * k_tiles + ko) % stages
                            T.mbarrier_wait_parity(empty[s], (((j * k_tiles + ko) // stages) & 1) ^ 1)
                            T.tma_copy(X[at[0], at[1]:at[1] + block_m, ko * block_k:(ko + 1) * block_k],
                                       As[s, :, :], barrier=full[s], leader_scope_threads=32)
                            T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, at[2]:at[2] + block_n],
                                       Bs[s, :, :], barrier=full[s], leader_scope_threads=32)
                            if tx == 0:
                                T.mbarrier_arrive(full[s])
                else:                                     # 3: the sums: warps 1-3 push, warp 1 alone waits,
                    for j in T.serial(mine):              # loads, stores my rows and counts
                        d, t, bx = where(j * blocks + bid, pnl[0] if swizzle > 0 else 0)
                        at[0] = (d - 2) * pnl[1] + t * tiles_n + bx   # the word of the sum in (step d > 1)
                        at[1] = at[0] + pnl[1]                         # ... and of the sum out
                        at[2] = t * block_m                            # the tile's first row, first column
                        at[3] = bx * block_n
                        if tx < 64:
                            if d > 1:
                                T.wait_until(arrived[at[0]], cmp="ge", value=e[0])
                                T.load_async(tile_of(R, e[0], at[0], pnl[1]), Rs, barrier=landed)
                            elif tx == 32:
                                T.arrive_barrier(landed)
                        T.mbarrier_wait_parity(summed[0], j & 1)
                        if d == W:                        # my rows, complete (written before the block ends):
                            if tx < 64:                   # those of the call (the last tile's may be fewer)
                                n = T.min(block_m, m - at[2])
                                T.store_async(Rs[0:n, 0:block_n], C[at[2]:at[2] + n, at[3]:at[3] + block_n],
                                              wait="written")
                        else:                             # plain stores (T.store_tile: why, there)
                            T.store_tile(Rs, tile_of(out(R, Rp), e[0], at[1], pnl[1]), threads=(32, 96))
                            if tx < 64:                   # the count up to e (release_stores converges the warp
                                T.release_stores(out(arrived, Ap)[at[1]], e[0] - pushed[at[1]], scope="sys")
                                pushed[at[1]] = e[0]      # before its lanes note the push)
            else:                                         # 2: the GEMM and the add (1 or 2 warpgroups)
                T.set_max_nreg(232, 1)
                for j in T.serial(mine):
                    d, t, bx = where(j * blocks + bid, pnl[0] if swizzle > 0 else 0)
                    for ko in T.serial(k_tiles):
                        s = (j * k_tiles + ko) % stages
                        T.mbarrier_wait_parity(full[s], ((j * k_tiles + ko) // stages) & 1)
                        T.gemm(As[s, :, :], Bs[s, :, :], Cl, clear_accum=ko == 0)
                        T.mbarrier_arrive(empty[s])
                    T.wait_barrier(landed, j & 1)
                    if d > 1:
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    for i, k in T.Parallel(block_m, block_n):
                        Rs[i, k] = Cl[i, k]
                    T.fence_proxy_async()                 # (written by this thread, read by the bulk copy)
                    T.mbarrier_arrive(summed[0])

    return gemm_rs_push


@tilescale.jit
def gemm_rs_gemm_kernel(N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10):
    """The GEMM of :class:`GemmRS`'s pull path: partial rows in the order their owners reduce them, with counts.
    The rows per rank `m` are a run-time size (X: (W, m, K)), and so is the op's bound (``done``: `row_blocks`
    words, W x its row tiles per rank; ``P``: two halves of as many row tiles). The grid covers the bound's row
    tiles, so that every call counts every word of ``done`` (``per_block`` a call): a tile past the call's rows
    multiplies nothing (no step of K) and stores zeros."""
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
            me = T.get_rank()
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
                          block_m: int = 128, col_tile: int = 256, threads: int = 512):
    """The reduction of :class:`GemmRS`: C_local = sum over ranks of their partial rows of this rank, the call's
    `m` rows (C: (m, N); P and done of the op's bound, as :func:`gemm_rs_gemm_kernel`'s)."""
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
            me = T.get_rank()
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
                            T.wait_until(done[rb], cmp="ge", value=e * per_block, src_pe=s)
                        T.sync_threads()
                        if T.peer_reachable(P, pe=s):          # this node: loads through the mapping
                            Ps = T.remote(P, pe=s)
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += Ps[r0 + i, c0 + k]
                        else:                                  # another node: an NVSHMEM get, then local loads
                            T.get_block(P[r0:r0 + block_m, c0:c0 + col_tile], staging[bid, :, :], src_pe=s)
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += staging[bid, i, k]
                    T.copy(acc, C[t * block_m, c0])           # (rows past m: not stored)

    return gemm_rs_reduce


def kernels(M: int, N: int, K_local: int, world_size: int, dtype: str, reduce_blocks: int = 20,
            config: GemmConfig | None = None, path: str | None = None, sms: int = 132) -> list:
    """[(jit function, args)] of the kernels :class:`GemmRS` compiles for problems of up to `M` rows (W x rows per
    rank) on `path` (None: :func:`default_path`): the push kernel, or the pull path's GEMM and reduction; `sms`: the
    GPU's SM count (the push kernel's blocks). The rows (and the buffers' sizes) are run-time arguments of each
    call: M only chooses the config (the tuning table's for M)."""
    push = (path or default_path(world_size, K_local)) == "push"
    # the tuning table ranks the pull path's GEMM ("gemm_rs"); the push kernel has entries of its own, or the default
    # config (which ran at least as fast as the pull-tuned one for it on every benchmark shape)
    cfg = problem_config(M, N, K_local, world_size=world_size, op="gemm_rs_push" if push else "gemm_rs", config=config)
    gemm_args = (N, K_local, world_size, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
                 cfg.swizzle)
    if push:
        return [(gemm_rs_push_kernel, gemm_args + (sms,))]
    col_tile = 256 if N % 256 == 0 and cfg.block_m <= 128 else 128   # fp32 accumulator <= 128 x 256
    if N % col_tile:
        raise ValueError(f"N: got {N}, expected a multiple of 128")
    per_block = N // cfg.block_n                          # T.release_stores: one count per tile
    return [(gemm_rs_gemm_kernel, gemm_args),
            (gemm_rs_reduce_kernel, (N, world_size, per_block, reduce_blocks, dtype, cfg.block_m, col_tile))]


class GemmRS(Op):
    """``reduce_scatter(X_local @ W_local)`` for fixed N, K and dtype; collective to construct. `M` is the bound of
    the rows (W x rows per rank): a call takes `x` of W x m rows for any m <= M / W (the same m on every rank) and
    returns m rows, with the kernels built once (the rows are a kernel argument; the buffers are sized for M).
    `path`: "push" or "pull" (module docstring; None: :func:`default_path`, the fastest this job can take);
    `reduce_blocks`: the SMs of the pull path's reduction."""

    NAME, KERNEL = "GemmRS", "gemm_rs"
    GRAPH_SAFE = True     # the kernels count calls on the device (module docstring)

    def __init__(self, M: int, N: int, K_local: int, dtype, *, reduce_blocks: int = 20,
                 config: GemmConfig | None = None, path: str | None = None):
        import torch

        from ..runtime import symm

        with self.arguments(M=M, N=N, K_local=K_local, dtype=dtype, reduce_blocks=reduce_blocks, config=config,
                            path=path) as agreed:
            check_problem("GemmRS", M, N, K_local, dtype, config, "K_local")
            checks.as_int("GemmRS", "reduce_blocks", reduce_blocks)
            job = default_path(self.world_size)                   # the job's path for any K
            best = job if push_takes(self.world_size, K_local) else "pull"
            if path is not None and path not in PATHS:
                checks.fail("GemmRS", "path", repr(path), f"one of {PATHS} or None (the job's best: {best!r})")
            elif path == "push" and job != "push":
                checks.fail("GemmRS", "path", "'push'", "'pull' or None on this job (push needs every rank on this "
                            f"node, at most {MAX_PUSH_RANKS} ranks, and no MPS-shared GPU)")
            elif path == "push" and best != "push":
                checks.fail("GemmRS", "K_local", str(K_local), "a multiple of 8 on the push path (its TMA loads of "
                            "X need rows of whole 16 bytes); path='pull' or None takes any K_local")
            agreed["path"] = path = path or best
            try:
                sms = vectors.sm_count()
            except Exception:  # noqa: BLE001  (no GPU here: the construction fails later, after the agreement)
                sms = None
            if sms is not None and reduce_blocks >= sms:
                checks.fail("GemmRS", "reduce_blocks", repr(reduce_blocks), f"fewer than the {sms} SMs of this GPU "
                            "(the reduction's blocks wait while the GEMM runs, which needs SMs of its own)")
            jobs = kernels(M, N, K_local, self.world_size, checks.dtype_name(dtype), reduce_blocks, config, path,
                           sms if sms is not None else 132)
            check_sizes(M, N, K_local, self.world_size, path, jobs[0][1][4])
        W = self.world_size
        self.path = path
        self.compile_ahead(jobs)                   # its kernels side by side; build() takes them
        (gemm_fn, self.gemm_args) = jobs[0]
        self.block_m, block_n = self.gemm_args[4], self.gemm_args[5]
        self.M, self.N, self.K, self.dtype = M, N, K_local, dtype
        self.rows = M // W                         # the bound of a call's rows per rank
        row_blocks = W * -(-self.rows // self.block_m)                  # the bound's row tiles, every rank's
        if path == "push":
            slab, words = push_shapes(M, N, W, self.block_m, block_n)
            self.R = self.symmetric(slab, dtype)                         # the sums in from rank + 1
            self.arrived = self.symmetric(words, torch.uint64, zero=True)  # their counts
            self.pushed = torch.zeros(words, dtype=torch.uint64, device=self.device)   # mine to rank - 1: up to
            self.gemm, self._direct = self.build(gemm_fn, self.gemm_args, PUSH_PARAMS)   # which call
            self.gemm_counters = self.call_counters(self.gemm_args[-1])   # a word per block (the SMs)
            prev = (self.rank - 1) % W                                     # Rp, Ap: rank - 1's, where mine go
            self._tail = (self.R, self.arrived, self.gemm_counters, symm.peer_tensor(self.R, prev),
                          symm.peer_tensor(self.arrived, prev), self.pushed)
            self._tail_ptrs = tuple(t.data_ptr() for t in self._tail)
            self._sizes = (slab[0], words[0])                              # R's rows, arrived's words
            self.launch_path = "direct" if self._direct is not None else "tilelang"
            return
        (reduce_fn, self.reduce_args) = jobs[1]
        self.P = self.symmetric((2 * row_blocks * self.block_m, N), dtype)   # the partials of even calls, then odd
        self.done = self.symmetric((row_blocks,), torch.uint64, zero=True)
        # where a peer's partial rows land before they are summed, for peers on other nodes (an NVSHMEM get's
        # local buffer must be symmetric, i.e. registered, to cross a network)
        blocks, col_tile = self.reduce_args[3], self.reduce_args[6]
        self.staging = self.symmetric((blocks, self.block_m, col_tile), dtype)
        self.stream = torch.cuda.Stream(priority=-1)
        self.gemm, _ = self.build(gemm_fn, self.gemm_args)
        self.reduce, _ = self.build(reduce_fn, self.reduce_args)
        tiles = row_blocks * -(-N // block_n)
        counters = self.call_counters(tiles + blocks)        # the GEMM's, then the reduction's
        self.gemm_counters, self.reduce_counters = counters[:tiles], counters[tiles:]
        self.launch_path = "tilelang"

    def _validate(self, x, w, out) -> None:
        """The call checks (agreed across ranks): `x` (W x m, K_local), m <= M / W, `w` (K_local, N) and `out`
        (m, N), all of the dtype on this GPU, handed to the kernels as they are: contiguous and 16-byte aligned."""
        d, dt, W = self.device, self.dtype, self.world_size
        rows = x.shape[0] if getattr(x, "dim", lambda: 0)() == 2 else self.M
        if rows > self.M or rows % W:
            checks.fail("GemmRS", "x", checks.describe(x), f"W x m rows, m <= M / world_size = {self.M // W} (the "
                        f"bound of this op, built for M={self.M}: more rows need an op of their own), W = {W}")
        checks.check_tensor("GemmRS", "x", x, shape=(rows, self.K), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        checks.check_tensor("GemmRS", "w", w, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("GemmRS", "out", out, shape=(rows // W, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="the rows of x / world_size")

    def call_key(self, x, w, out):
        return checks.signature(x, True), checks.signature(w, True), checks.signature(out, True)

    def __call__(self, x, w, out=None):
        import torch

        stream = self.begin(x, w, out)
        W = self.world_size
        m = x.shape[0] // W                # the call's rows per rank
        c = out if out is not None else torch.empty(m, self.N, dtype=self.dtype, device=x.device)
        if m == 0:
            return c
        xv = x.view(W, m, self.K) if W > 1 else x     # as the kernels see it: rank q's rows, X[q]
        if self.path == "push":            # one kernel (module docstring, push)
            direct = self._direct
            if direct is None:
                self.gemm.launch(xv, w, c, *self._tail)
            elif direct[0](x.data_ptr(), w.data_ptr(), c.data_ptr(), *self._tail_ptrs, m, *self._sizes, stream):
                raise self.launch_error()
            return c
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.reduce.launch(self.P, self.done, c, self.staging, self.reduce_counters)
        self.gemm.launch(x.view(W, m, self.K), w, self.P, self.done, self.gemm_counters)
        main.wait_stream(self.stream)
        if not _capturing():    # (a graph's memory is its own pool: nothing to tell the allocator)
            c.record_stream(self.stream)
        return c


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size, config):
    return GemmRS(M, N, K, dtype, config=config)     # (the ops of one config share their kernels)


_fn_check = checks.CallCheck("gemm_rs")


def _validate_fn(x, w, W=None) -> None:
    checks.check_tensor("gemm_rs", "x", x, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("gemm_rs", "w", w, dtype=x.dtype, min_dims=2)
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        checks.fail("gemm_rs", "w", checks.describe(w), f"a 2-D ({x.shape[-1]}, N) tensor for x {tuple(x.shape)} "
                    "(2-D operands, inner sizes equal)")
    if W is not None and x.shape[0] % W:
        checks.fail("gemm_rs", "x", f"{x.shape[0]} rows", f"a multiple of the world size {W} (equal row slices)")


def gemm_rs(x, w):
    """``reduce_scatter(x @ w)`` over all ranks (see :class:`GemmRS`); builds and caches the op per (N, K, dtype,
    config).

    Any number of rows divisible by the world size, run as they are by an op of a bound of rows per rank
    (tilescale.ops.op_cache.cached_op: the rows rounded up to a power of two, or a larger op cached with the same
    config); ops of one config share their kernels, so new rows build nothing unless the tuning table picks another
    config for their bound."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(x), checks.signature(w)), _validate_fn, x, w,
              rt.info.world_size if rt is not None else None)
    W = runtime.current().info.world_size
    (M, K), N = x.shape, w.shape[1]
    op = "gemm_rs_push" if default_path(W, K) == "push" else "gemm_rs"
    return op_cache.cached_op(_cached, M // W, N, K, x.dtype, W, op)(x, w)
