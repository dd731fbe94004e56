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
   (``T.store_tile``, which ends when all three have read ``Rs`` and met), then warp 1 adds 1 to rank me - 1's
   ``arrived[d - 1, tile]`` (one release per tile, system scope, covering the three warps' stores:
   ``T.release_stores`` through the mapping); step W: warp 1 stores my rows into C_local (bulk copies, written
   before the block ends). Either way ``Rs`` has been read before warp 1 loads the next sum in.

Rank me + 1 may overwrite a slot of half e % 2 in its call e + 2 only after its call e + 1 ended, which waited
(steps W .. 2) for the sums along the ring, the first of them pushed by my step 1 of call e + 1, which my GPU
ran after this call's kernel: so after I read the slot. A block may wait for a tile of a block after its own in
the order: every block of the grid must be resident (one per SM; another kernel holding SMs delays it, and the
wait of warp 1 (sums) for a flag gives up after ``TILESCALE_WAIT_TIMEOUT_S``, 100 s by default, and stops the
kernel); on distinct GPUs and for ranks that share a GPU time-sliced, every rank's blocks get SMs; ranks sharing a
GPU under MPS take the pull path (a rank's waiting blocks could hold every SM of the GPU they share). At world
size > 1 the kernel loads rows of X by TMA: a K_local that is not a multiple of 8 takes the pull path
(:func:`push_takes`). The sums are rounded to the dtype at each step (W - 1 times, as NCCL's ring does).

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
from .gemm_rs_path import MAX_PUSH_RANKS, PATHS, check_sizes, default_path, push_takes  # noqa: F401  (re-exported)

__all__ = ["GemmRS", "gemm_rs"]

# the push kernel's parameters, as GemmRS launches it through its C entry point (raw pointers, then the stream)
PUSH_PARAMS = ("X", "Wt", "C", "R", "arrived", "counters", "Rp", "Ap")


@tilescale.jit
def gemm_rs_push_kernel(M: int, N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                        sms: int = 132):
    """The one kernel of :class:`GemmRS`'s push path (module docstring): each tile of a peer's rows, with the
    partial sum that rank me + 1 pushed for it added, pushed on into rank me - 1's ``R`` and counted in its
    ``arrived`` (`Rp`, `Ap`: those of rank me - 1, through its peer mapping); my rows, with theirs added, into
    C. No NVSHMEM call but the rank: the peer is reached through its mapping. `sms`: the GPU's SMs (the blocks of
    the persistent kernel, at most one per SM: every block must be resident); world size 1: C = X @ Wt."""
    return _push_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, False, sms)


@tilescale.jit
def gemm_rs_push_loopback_kernel(M: int, N: int, K: int, ranks: int, dtype: str = "bfloat16", block_m: int = 128,
                                 block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256,
                                 swizzle: int = 10, sms: int = 132):
    """:func:`gemm_rs_push_kernel` as rank 0 of `ranks` runs it, on one GPU with no peers, in a job of any size
    (benchmarks): its pushes go to its own ``R`` and are counted in its own ``arrived``, where its next steps
    wait for them and add them (C = the sum over d of X[rows of rank d] @ Wt). Same parameters (`Rp`, `Ap`
    unused: any tensors of their shapes)."""
    return _push_func(M, N, K, ranks, dtype, block_m, block_n, block_k, stages, threads, swizzle, True, sms)


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
               sms: int):
    if world_size > 1:
        return _push_persistent_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                                     loopback, sms)
    tiles_m, tiles_n = M // block_m, N // block_n
    slab, words = push_shapes(M, N, 1, block_m, block_n)     # (unused at world size 1)

    @T.prim_func
    def gemm_rs_push(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
                     R: T.Tensor(slab, dtype), arrived: T.Tensor(words, "uint64"),
                     counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER),
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
        with T.Kernel(tiles_n, tiles_m, threads=threads) as (bx, by):   # nothing to add: C = X @ Wt
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            T.call_number(counters)
            main_loop(X, Wt, As, Bs, Cl, by, bx, stages)
            T.copy(Cl, Cs)
            T.copy(Cs, C[by * block_m, bx * block_n])

    return gemm_rs_push


def _push_persistent_func(M, N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                          loopback: bool, sms: int):
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
                     Rp: T.Tensor(slab, dtype), Ap: T.Tensor(words, "uint64")):
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
            e[0] = T.call_number(counters)               # (the sums warps' every use of it)
            tx = T.get_thread_binding()
            me = T.get_rank()
            mine = T.ceildiv(total - bid, blocks)        # this block's tiles
            if tx < 128:                                  # warpgroup 0: its registers given up at once (PTX:
                T.set_max_nreg(40, 0)                     # every warp of a warpgroup runs the same setmaxnreg)
                if tx < 32:                               # 1: X and W, by TMA
                    for it in T.serial(mine * k_tiles):
                        s, ko = it % stages, it % k_tiles
                        d, t, bx = where((it // k_tiles) * blocks + bid)
                        rb = ((me + d) % W) * tiles_per_rank + t
                        T.mbarrier_wait_parity(empty[s], ((it // stages) & 1) ^ 1)
                        T.tma_copy(X[rb * block_m:(rb + 1) * block_m, ko * block_k:(ko + 1) * block_k],
                                   As[s, :, :], barrier=full[s], leader_scope_threads=32)
                        T.tma_copy(Wt[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n],
                                   Bs[s, :, :], barrier=full[s], leader_scope_threads=32)
                        if tx == 0:
                            T.mbarrier_arrive(full[s])
                else:                                     # 3: the sums: warps 1-3 push, warp 1 alone waits,
                    for j in T.serial(mine):              # loads, stores my rows and counts
                        d, t, bx = where(j * blocks + bid)
                        tile = t * tiles_n + bx
                        if tx < 64:
                            if d > 1:
                                w_in = (d - 2) * tiles + tile
                                T.wait_until(arrived[w_in], cmp="ge", value=e[0])
                                T.load_async(tile_of(R, e[0], w_in), Rs, barrier=landed)
                            elif tx == 32:
                                T.arrive_barrier(landed)
                        T.mbarrier_wait_parity(summed[0], j & 1)
                        if d == W:                        # my rows, complete (written before the block ends)
                            if tx < 64:
                                T.store_async(Rs[0:block_m, 0:block_n], C[t * block_m:(t + 1) * block_m,
                                                                             bx * block_n:(bx + 1) * block_n],
                                              wait="written")
                        else:                             # plain stores (T.store_tile: why, there)
                            w_out = (d - 1) * tiles + tile
                            T.store_tile(Rs, tile_of(out(R, Rp), e[0], w_out), threads=(32, 96))
                            if tx < 64:
                                T.release_stores(out(arrived, Ap)[w_out], 1, scope="sys")
            else:                                         # 2: the GEMM and the add (1 or 2 warpgroups)
                T.set_max_nreg(232, 1)
                for j in T.serial(mine):
                    d, t, bx = where(j * blocks + bid)
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


def kernels(M: int, N: int, K_local: int, world_size: int, dtype: str, reduce_blocks: int = 20,
            config: GemmConfig | None = None, path: str | None = None, sms: int = 132) -> list:
    """[(jit function, args)] of the kernels :class:`GemmRS` compiles for this problem on `path` (None:
    :func:`default_path`): the push kernel, or the pull path's GEMM and reduction; `sms`: the GPU's SM count (the
    push kernel's blocks)."""
    push = (path or default_path(world_size, K_local)) == "push"
    # the tuning table ranks the pull path's GEMM ("gemm_rs"); the push kernel has entries of its own, or the default
    # config (which ran at least as fast as the pull-tuned one for it on every benchmark shape)
    cfg = problem_config(M, N, K_local, world_size=world_size, op="gemm_rs_push" if push else "gemm_rs", config=config)
    gemm_args = (M, N, K_local, world_size, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
                 cfg.swizzle)
    if push:
        return [(gemm_rs_push_kernel, gemm_args + (sms,))]
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
            check_sizes(M, N, K_local, self.world_size, path, jobs[0][1][5])
        W = self.world_size
        self.path = path
        self.compile_ahead(jobs)                   # its kernels side by side; build() takes them
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
