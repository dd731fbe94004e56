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
earlier, and pushes the new sum to rank me - 1; the owner's sum is complete. Every tile but those of step 1
adds one tile (the reads spread over the whole GEMM) and that tile is loaded while the tile's GEMM runs. No SM
is reserved, no reduction kernel runs, and at world size 1 the call is this GEMM alone. Signal protocol of call
e = 1, 2, ... (counted on the device by every block, ``T.call_number``: a call captured in a CUDA graph sees a
new e on every replay); ``R`` holds a tile per row block (rows padded, so that a sum in lands in shared memory
in one copy) and is double-buffered by e % 2: tile i of slot s = d - 2 of step d is row block
``((e % 2) * (W - 1) + s) * tiles + i``; ``arrived`` has one word per slot and tile:

1. step d > 1, before the GEMM's loop (one consumer warp; the producer starts loading the GEMM's tiles
   meanwhile): if ``arrived[slot, tile] >= e`` already (acquire, system scope), start loading the sum in
   from this call's half of ``R`` into shared memory (``T.load_async``, an mbarrier); after the loop, else, wait
   until it is (acquire, system scope), then load it. Add it to the accumulator (fp32);
2. step d < W: TMA store of the sum into rank me - 1's ``R`` (through its peer mapping), slot d - 1; the
   consumer warp of the thread that issued it then waits until that store is written and adds 1 to rank
   me - 1's ``arrived[d - 1, tile]`` (one release per tile, system scope: ``T.release_stores`` through the
   mapping). Step W: store the sum into C_local (TMA).

Rank me + 1 may overwrite a slot of half e % 2 in its call e + 2 only after its call e + 1 ended, which waited
(steps W .. 2) for the sums along the ring, the first of them pushed by my step 1 of call e + 1, which my GPU
ran after this call's kernel: so after I read the slot. The grid is launched step by step (its z), so a tile
of step d starts after every tile of step d - 1 did, a step's tiles apart (rasterized within a step): the sum
it adds is normally there when it starts, and a block waits only for blocks launched before its own (step 1
waits for nothing), which on distinct GPUs and for ranks that share a GPU time-sliced get SMs; ranks sharing a
GPU under MPS take the pull path (a rank's waiting tiles could hold every SM of the GPU they share). The sums
are rounded to the dtype at each step (W - 1 times, as NCCL's ring does).

*Persistent kernel* (:func:`persistent_push`: tiles with a short loop over K, where a block's start and end
cost most): one block per SM runs tiles b, b + SMs, ... of the same grid order through ONE pipelined loop
over (tile, K step), so the producer loads the next tile's operands while a tile's epilogue runs. It has no C
tile in shared memory (three stages fit): the sum in lands in one padded tile and the sum out leaves from it
(``T.store_async``: one bulk copy into R, whose tiles are padded alike); my rows go to C from the registers.
The protocol is the same but for step 2: the storing warp counts a pushed tile at the block's next tile's
epilogue, before anything there waits (its write long done), and its last one after the loop. A block may
then wait for a tile of a block launched after its own: every block of the grid is resident (one per SM).

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
    padded_rows,
    problem_config,
    tile_buffers,
    tile_loop,
    tile_order,
)

__all__ = ["GemmRS", "gemm_rs"]

PATHS = ("push", "pull")
MAX_PUSH_RANKS = 8     # the push path's ranks: one NVLink domain (8 GPUs of a node)
PERSISTENT_MAX_K_TILES = 32   # the push path's persistent kernel: tiles of at most this many K steps
# the push kernel's parameters, as GemmRS launches it through its C entry point (raw pointers, then the stream)
PUSH_PARAMS = ("X", "Wt", "C", "R", "arrived", "counters", "Rp", "Ap")


@tilescale.jit
def gemm_rs_push_kernel(M: int, N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                        persistent: int = 0):
    """The one kernel of :class:`GemmRS`'s push path (module docstring): each tile of a peer's rows, with the
    partial sum that rank me + 1 pushed for it added, pushed on into rank me - 1's ``R`` and counted in its
    ``arrived`` (`Rp`, `Ap`: those of rank me - 1, through its peer mapping); my rows, with theirs added, into
    C. No NVSHMEM call but the rank: the peer is reached through its mapping. `persistent` > 0 (world size > 1):
    the persistent kernel on that many blocks, one per SM (at most the GPU's SMs: every block must be resident)."""
    return _push_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, False,
                      persistent)


@tilescale.jit
def gemm_rs_push_loopback_kernel(M: int, N: int, K: int, ranks: int, dtype: str = "bfloat16", block_m: int = 128,
                                 block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256,
                                 swizzle: int = 10, persistent: int = 0):
    """:func:`gemm_rs_push_kernel` as rank 0 of `ranks` runs it, on one GPU with no peers, in a job of any size
    (benchmarks): its pushes go to its own ``R`` and are counted in its own ``arrived``, where its next steps
    wait for them and add them (C = the sum over d of X[rows of rank d] @ Wt). Same parameters (`Rp`, `Ap`
    unused: any tensors of their shapes)."""
    return _push_func(M, N, K, ranks, dtype, block_m, block_n, block_k, stages, threads, swizzle, True, persistent)


def push_shapes(M: int, N: int, world_size: int, block_m: int, block_n: int) -> tuple:
    """The shapes of the push kernel's ``R`` and ``arrived`` (module docstring): R holds a tile per row block,
    rows padded (a sum in lands in shared memory in one copy, padded against bank conflicts), tile i of slot s
    of half h at row block ``(h * slots + s) * tiles + i``; arrived holds a count per slot and tile."""
    slots, tiles = max(world_size - 1, 1), (M // world_size // block_m) * (N // block_n)
    return (2 * slots * tiles * block_m, block_n + SUM_IN_PAD), (slots * tiles,)


def _sum_row(e, w, slots: int, tiles: int, block_m: int):
    """The first row of ``R`` (:func:`push_shapes`) of call `e`'s tile of word `w` (slot and tile) of ``arrived``."""
    return (T.cast(e % 2, "int32") * slots * tiles + w) * block_m


def _pushed_to(loopback: bool):
    """Where the push kernel's sums go and are counted: of its two buffers (its own, rank me - 1's through the
    peer mapping), its own in the loopback kernel. (Called inline: a buffer bound to a new name in a prim_func
    would rename the kernel's parameter.)"""
    return lambda own, peer: own if loopback else peer


def _push_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, loopback: bool,
               persistent: int = 0):
    if persistent and world_size > 1:
        return _push_persistent_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                                     loopback, persistent)
    W = world_size
    rows = M // W
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = N // block_n
    tiles = tiles_per_rank * tiles_n     # an owner's tiles
    slots = max(W - 1, 1)

    slab, words = push_shapes(M, N, W, block_m, block_n)     # R's shape, arrived's

    sw = storing_warp(threads)

    out = _pushed_to(loopback)

    def rows_at(e, w):
        return _sum_row(e, w, slots, tiles, block_m)

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((rows, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
        if W == 1:                                       # nothing to add: C = X @ Wt
            with T.Kernel(tiles_n, tiles_m, threads=threads) as (bx, by):
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
                T.call_number(counters)
                main_loop(X, Wt, As, Bs, Cl, by, bx, stages)
                T.copy(Cl, Cs)
                T.copy(Cs, C[by * block_m, bx * block_n])
        else:   # blocks launched step by step (z), so that a step's tile starts after the tile it adds did
            with T.Kernel(tiles_n, tiles_per_rank, W, threads=threads) as (bx, t, s):
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
                Rs = T.alloc_shared((block_m, block_n + SUM_IN_PAD), dtype)   # the sum in (rows padded: banks)
                landed = T.alloc_shared((1,), "uint64", scope="shared")  # its mbarrier
                T.init_barrier(landed)
                # one consumer warp makes every use of the call number: it loads the sum in, issues the tile's
                # store (tilelang elects one of its lanes: compat.storing_warp) and counts it once written;
                # nothing else waits for the count
                e = T.alloc_local((1,), "uint64")
                started = T.alloc_local((1,), "int32")                  # its load of the sum in has started
                started[0] = 0
                me = T.get_rank()
                d = s + 1                                # step d: the rows of rank me + d (d = W: mine)
                tile = t * tiles_n + bx                  # t: the row tile within the owner's rows
                w_in = (d - 2) * tiles + tile            # the sum in: slot d - 2 (steps 2 .. W), its count
                if T.get_thread_binding() // 32 == sw:   # protocol 1, before the GEMM: start loading the sum in
                    e[0] = T.call_number(counters, scope="warp")
                    if d > 1:
                        if T.ld(arrived[w_in], sem="acquire", scope="sys") >= e[0]:
                            T.load_async(R[rows_at(e[0], w_in):rows_at(e[0], w_in) + block_m, :], Rs,
                                         barrier=landed)
                            started[0] = 1
                main_loop(X, Wt, As, Bs, Cl, ((me + d) % W) * tiles_per_rank + t, bx, stages)
                if d > 1:                                # protocol 1, after the GEMM: else load it now; add it
                    if T.get_thread_binding() // 32 == sw:
                        if started[0] == 0:
                            T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                            T.load_async(R[rows_at(e[0], w_in):rows_at(e[0], w_in) + block_m, :], Rs,
                                         barrier=landed)
                    T.wait_barrier(landed, 0)
                    for i, k in T.Parallel(block_m, block_n):
                        Cl[i, k] += Rs[i, k]
                T.copy(Cl, Cs)
                if d == W:                               # protocol 2: my rows, complete
                    T.copy(Cs, C[t * block_m, bx * block_n])
                else:                                    # protocol 2: rank me + d's rows, on to rank me - 1
                    w_out = (d - 1) * tiles + tile           # slot d - 1 of rank me - 1
                    # counted once written, by the warp whose elected lane issued the store: one release at
                    # system scope per tile
                    T.copy(Cs, out(R, Rp)[rows_at(e[0], w_out), 0])
                    if T.get_thread_binding() // 32 == sw:
                        T.release_stores(out(arrived, Ap)[w_out], 1, scope="sys")

    return gemm_rs_push


def _push_persistent_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                          loopback: bool, blocks: int):
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

    out = _pushed_to(loopback)

    def tile_of(buf, e, w):    # call e's tile of word w in `buf` (R or rank me - 1's), its padded rows
        return buf[_sum_row(e, w, slots, tiles, block_m):_sum_row(e, w, slots, tiles, block_m) + block_m, :]

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
                    if d > 1:
                        if T.get_thread_binding() // 32 == sw:
                            started[0] = 0
                            if T.ld(arrived[w_in], sem="acquire", scope="sys") >= e[0]:
                                T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                                started[0] = 1
                    T.fence_proxy_async()   # (as above: else every step's wgmma is fenced)
                # the accumulator cleared by wgmma's scale-d at a tile's first step (a T.clear here costs a select per
                # accumulator register in every step)
                T.gemm(As, Bs, Cl, clear_accum=ko == 0)
                if ko == k_tiles - 1:
                    if T.get_thread_binding() // 32 == sw:
                        if pend[0] >= 0:              # the tile pushed before this one: count it
                            T.release_stores(out(arrived, Ap)[pend[0]], 1, scope="sys")
                            pend[0] = -1
                    if d > 1:
                        if T.get_thread_binding() // 32 == sw:
                            if started[0] == 0:
                                T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                                T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                        T.wait_barrier(landed, loads[0] % 2)
                        loads[0] = loads[0] + 1
                        for i, k in T.Parallel(block_m, block_n):
                            Cl[i, k] += Rs[i, k]
                    if d == W:                        # my rows, complete: straight from the registers
                        T.copy(Cl, C[t * block_m, bx * block_n])
                    else:                             # on to rank me - 1, from shared memory by one bulk copy
                        T.copy(Cl, Rs[0:block_m, 0:block_n])
                        T.fence_proxy_async()
                        if T.get_thread_binding() // 32 == sw:
                            T.store_async(Rs, tile_of(out(R, Rp), e[0], w_out))
                            pend[0] = w_out
                    T.fence_proxy_async()   # (the stores into C: else every step's wgmma is fenced)
            if T.get_thread_binding() // 32 == sw:     # the block's last pushed tile
                if pend[0] >= 0:
                    T.release_stores(out(arrived, Ap)[pend[0]], 1, scope="sys")

    return gemm_rs_push


@tilescale.jit
def gemm_rs_gemm_kernel(M: int, N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10):
    """The GEMM of :class:`GemmRS`: partial rows in the order their owners reduce them, with counts."""
    W = world_size
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W

    tiles_n = -(-N // block_n)

    @T.prim_func
    def gemm_rs_gemm(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), P: T.Tensor((2 * M, N), dtype),
                     done: T.Tensor((tiles_m,), "uint64"), counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER)):
        with T.Kernel(tiles_n, tiles_m, threads=threads) as (bx, by):
            Xs, Ws, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            e = T.call_number(counters)
            p = T.cast(e % 2, "int32")                        # this call's half of P
            me = T.get_rank()
            rb = (by + (me + 1) * tiles_per_rank) % tiles_m   # rank+1's rows first, own rows last
            tile_loop(X, Wt, P, Xs, Ws, Cl, Cs, rb, bx, stages, False, c_rb=p * tiles_m + rb)  # a TMA store
            if T.get_thread_binding() // 32 == storing_warp(threads):   # once written: one release per tile,
                T.release_stores(done[rb], 1, scope="sys")               # by the warp that issued the store

    return gemm_rs_gemm


@tilescale.jit
def gemm_rs_reduce_kernel(M: int, N: int, world_size: int, per_block: int, blocks: int, dtype: str = "bfloat16",
                          block_m: int = 128, col_tile: int = 256, threads: int = 512):
    """The reduction of :class:`GemmRS`: C_local = sum over ranks of their partial rows of this rank."""
    W = world_size
    rows = M // W
    tiles_per_rank = rows // block_m
    col_tiles = N // col_tile
    units = tiles_per_rank * col_tiles

    @T.prim_func
    def gemm_rs_reduce(P: T.Tensor((2 * M, N), dtype), done: T.Tensor((M // block_m,), "uint64"),
                       C: T.Tensor((rows, N), dtype), staging: T.Tensor((blocks, block_m, col_tile), dtype),
                       counters: T.Tensor((blocks,), vectors.COUNTER)):
        with T.Kernel(blocks, threads=threads) as bid:
            acc = T.alloc_fragment((block_m, col_tile), "float32")
            e = T.call_number(counters)
            p0 = T.cast(e % 2, "int32") * M                   # this call's half of P
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
                    T.copy(acc, C[t * block_m, c0])

    return gemm_rs_reduce


def _mps_client() -> bool:
    """Whether this process's CUDA work would go through an MPS daemon (its pipe directory exists)."""
    import os

    return os.path.isdir(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def default_path(world_size: int) -> str:
    """The path :class:`GemmRS` takes on this job (module docstring): "push" when every rank is on this node
    (the launcher's grouping, or ``TILESCALE_NODE_SIZE``), at most :data:`MAX_PUSH_RANKS` ranks, and ranks that
    share a GPU do not share it through MPS; else "pull". The same on every rank of a job."""
    from .. import runtime, topology

    rt = runtime.current() if runtime.is_initialized() else None
    local = rt.info.local_world_size if rt is not None else None
    if topology.of(world_size, local).nodes > 1 or world_size > MAX_PUSH_RANKS:
        return "pull"
    if rt is not None and runtime.shares_gpu() and _mps_client():
        return "pull"
    return "push"


def persistent_push(K_local: int, world_size: int, cfg: GemmConfig) -> bool:
    """Whether the push path runs its persistent kernel (module docstring): at more than one rank, when a tile's
    loop over K is short (at most :data:`PERSISTENT_MAX_K_TILES` steps), where the step-by-step grid's per-tile
    start and end cost most (RESULTS.md run 28: 0.81 vs 0.71 of cuBLAS at 16 steps, 0.89 vs 0.92 at 56)."""
    return world_size > 1 and -(-K_local // cfg.block_k) <= PERSISTENT_MAX_K_TILES


def kernels(M: int, N: int, K_local: int, world_size: int, dtype: str, reduce_blocks: int = 20,
            config: GemmConfig | None = None, path: str | None = None, sms: int = 132) -> list:
    """[(jit function, args)] of the kernels :class:`GemmRS` compiles for this problem on `path` (None:
    :func:`default_path`): the push kernel, or the pull path's GEMM and reduction; `sms`: the GPU's SM count (the
    persistent push kernel's blocks, :func:`persistent_push`)."""
    push = (path or default_path(world_size)) == "push"
    # the tuning table ranks the pull path's GEMM ("gemm_rs"); the push kernel has entries of its own, or the default
    # config (which ran at least as fast as the pull-tuned one for it on every benchmark shape: RESULTS.md run 21)
    cfg = problem_config(M, N, K_local, world_size=world_size, op="gemm_rs_push" if push else "gemm_rs", config=config)
    gemm_args = (M, N, K_local, world_size, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
                 cfg.swizzle)
    if push:
        return [(gemm_rs_push_kernel, gemm_args + ((sms,) if persistent_push(K_local, world_size, cfg) else ()))]
    col_tile = 256 if N % 256 == 0 and cfg.block_m <= 128 else 128   # fp32 accumulator <= 128 x 256
    if N % col_tile:
        raise ValueError(f"N: got {N}, expected a multiple of 128")
    per_block = N // cfg.block_n                          # T.release_stores: one count per tile
    return [(gemm_rs_gemm_kernel, gemm_args),
            (gemm_rs_reduce_kernel, (M, N, world_size, per_block, reduce_blocks, dtype, cfg.block_m, col_tile))]


class GemmRS(Op):
    """``reduce_scatter(X_local @ W_local)`` for fixed shapes; collective to construct. `path`: "push" or "pull"
    (module docstring; None: :func:`default_path`, the fastest this job can take); `reduce_blocks`: the SMs of the pull
    path's reduction."""

    NAME, KERNEL = "GemmRS", "gemm_rs"
    GRAPH_SAFE = True     # the kernels count calls on the device (module docstring)

    def __init__(self, M: int, N: int, K_local: int, dtype, *, reduce_blocks: int = 20,
                 config: GemmConfig | None = None, path: str | None = None):
        import torch

        from .. import symm

        with self.arguments(M=M, N=N, K_local=K_local, dtype=dtype, reduce_blocks=reduce_blocks, config=config,
                            path=path) as agreed:
            check_problem("GemmRS", M, N, K_local, dtype, config, "K_local")
            checks.as_int("GemmRS", "reduce_blocks", reduce_blocks)
            best = default_path(self.world_size)
            if path is not None and path not in PATHS:
                checks.fail("GemmRS", "path", repr(path), f"one of {PATHS} or None (the job's best: {best!r})")
            elif path == "push" and best != "push":
                checks.fail("GemmRS", "path", "'push'", "'pull' or None on this job (push needs every rank on this "
                            f"node, at most {MAX_PUSH_RANKS} ranks, and no MPS-shared GPU)")
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
        W = self.world_size
        self.path = path
        (gemm_fn, self.gemm_args) = jobs[0]
        self.block_m, block_n = self.gemm_args[5], self.gemm_args[6]
        self.M, self.N, self.K, self.dtype = M, N, K_local, dtype
        tiles = (M // self.block_m) * -(-N // block_n)
        if path == "push":
            slab, words = push_shapes(M, N, W, self.block_m, block_n)
            self.R = self.symmetric(slab, dtype)                         # the sums in from rank + 1
            self.arrived = self.symmetric(words, torch.uint64, zero=True)  # their counts
            self.gemm, self._direct = self.build(gemm_fn, self.gemm_args, PUSH_PARAMS)
            self.gemm_counters = self.call_counters(tiles)
            prev = (self.rank - 1) % W                                     # Rp, Ap: rank - 1's, where mine go
            self._tail = (self.R, self.arrived, self.gemm_counters, symm.peer_tensor(self.R, prev),
                          symm.peer_tensor(self.arrived, prev))
            self._tail_ptrs = tuple(t.data_ptr() for t in self._tail)
            self.launch_path = "direct" if self._direct is not None else "tilelang"
            return
        (reduce_fn, self.reduce_args) = jobs[1]
        self.P = self.symmetric((2 * M, N), dtype)     # the partials of even calls, then of odd ones
        self.done = self.symmetric((M // self.block_m,), torch.uint64, zero=True)
        # where a peer's partial rows land before they are summed, for peers on other nodes (an NVSHMEM get's
        # local buffer must be symmetric, i.e. registered, to cross a network)
        blocks, col_tile = self.reduce_args[4], self.reduce_args[7]
        self.staging = self.symmetric((blocks, self.block_m, col_tile), dtype)
        self.stream = torch.cuda.Stream(priority=-1)
        self.gemm, _ = self.build(gemm_fn, self.gemm_args)
        self.reduce, _ = self.build(reduce_fn, self.reduce_args)
        counters = self.call_counters(tiles + blocks)        # the GEMM's, then the reduction's
        self.gemm_counters, self.reduce_counters = counters[:tiles], counters[tiles:]
        self.launch_path = "tilelang"

    def _validate(self, x, w, out) -> None:
        """The call checks (agreed across ranks): `x` (M, K_local), `w` (K_local, N) and `out` (M / W, N),
        all of the dtype on this GPU, handed to the kernels as they are: contiguous and 16-byte aligned."""
        d, dt = self.device, self.dtype
        checks.check_tensor("GemmRS", "x", x, shape=(self.M, self.K), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        checks.check_tensor("GemmRS", "w", w, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("GemmRS", "out", out, shape=(self.M // self.world_size, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="M / world_size rows")

    def call_key(self, x, w, out):
        return checks.signature(x, True), checks.signature(w, True), checks.signature(out, True)

    def __call__(self, x, w, out=None):
        import torch

        stream = self.begin(x, w, out)
        c = out if out is not None else torch.empty(self.M // self.world_size, self.N, dtype=self.dtype,
                                                    device=x.device)
        if self.path == "push":            # one kernel (module docstring, push)
            direct = self._direct
            if direct is None:
                self.gemm.launch(x, w, c, *self._tail)
            elif direct[0](x.data_ptr(), w.data_ptr(), c.data_ptr(), *self._tail_ptrs, stream):
                raise self.launch_error()
            return c
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.reduce.launch(self.P, self.done, c, self.staging, self.reduce_counters)
        self.gemm.launch(x, w, self.P, self.done, self.gemm_counters)
        main.wait_stream(self.stream)
        if not _capturing():    # (a graph's memory is its own pool: nothing to tell the allocator)
            c.record_stream(self.stream)
        return c


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size):
    return GemmRS(M, N, K, dtype)


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
    """``reduce_scatter(x @ w)`` over all ranks (see :class:`GemmRS`); builds and caches the op per shape.

    Any number of rows divisible by the world size: when the rows per rank are not a multiple of 128, each
    rank's slice of `x` is padded with zero rows (one copy of `x`; zero rows add nothing) and the padding
    rows of the result are dropped."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(x), checks.signature(w)), _validate_fn, x, w,
              rt.info.world_size if rt is not None else None)
    W = runtime.current().info.world_size
    (M, K), N = x.shape, w.shape[1]
    rows = M // W
    rp = padded_rows(rows)
    if rp == rows:
        return _cached(M, N, K, x.dtype, W)(x, w)
    x_p = x.new_zeros((W, rp, K))
    x_p[:, :rows].copy_(x.reshape(W, rows, K))
    return _cached(W * rp, N, K, x.dtype, W)(x_p.view(W * rp, K), w)[:rows]
