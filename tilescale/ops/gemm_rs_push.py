"""The push path of GEMM + ReduceScatter (:mod:`tilescale.ops.gemm_reduce_scatter`): its one kernel.

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
(:func:`tilescale.ops.gemm_rs_path.push_takes`). The sums are rounded to the dtype at each step (W - 1 times, as
NCCL's ring does).

The rows per rank are a run-time argument of the kernel, up to the op's bound (its buffers are sized for it, their
sizes run-time arguments too: one build serves every bound of one config). The kernel runs one block per SM
whatever the rows (call numbers count per block: the grid never changes), a block past the call's tiles doing
nothing.
"""
import tilescale
import tilescale.language as T

from . import vectors
from .gemm import SUM_IN_PAD, even_panel, tile_buffers, tile_loop, tile_order

# the push kernel's parameters, as GemmRS launches it through its C entry point (raw pointers, then the run-time sizes:
# the call's rows per rank, the rows of R and the words of arrived (the op's bound), then the stream)
PUSH_PARAMS = ("X", "Wt", "C", "R", "arrived", "counters", "Rp", "Ap", "pushed", "m", "r_rows", "words")


@tilescale.jit
def gemm_rs_push_kernel(N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                        sms: int = 132, team=None):
    """The one kernel of :class:`GemmRS`'s push path (module docstring): each tile of a peer's rows, with the
    partial sum that rank me + 1 pushed for it added, pushed on into rank me - 1's ``R`` and counted in its
    ``arrived`` (`Rp`, `Ap`: those of rank me - 1, through its peer mapping); my rows, with theirs added, into
    C. No NVSHMEM call but the rank: the peer is reached through its mapping. `sms`: the GPU's SMs (the blocks of
    the persistent kernel, one per SM: every block must be resident); world size 1: C = X @ Wt.

    The rows per rank `m` are a run-time size (X: (W, m, K), C: (m, N)), and so are those of the op's buffers,
    sized for its bound (``R``: `r_rows`, ``arrived``, ``pushed``: `words`, :func:`push_shapes`): one build serves
    every row count. A tile's word of ``arrived`` is counted up to the call number (the pusher adds the calls
    since it last pushed that tile, which it keeps in its own ``pushed``), so words of tiles a call of fewer rows
    leaves out are right again at the next call that has them. `team`: the ranks of the op's group
    (tilescale.runtime.team.kernel_team; None: the world), ``me`` this rank's index in it."""
    return _push_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle, False, sms, team)


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
               sms: int, team=None):
    if world_size > 1:
        return _push_persistent_func(N, K, world_size, dtype, block_m, block_n, block_k, stages, threads, swizzle,
                                     loopback, sms, team)
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
                          loopback: bool, sms: int, team=None):
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
            me = T.team_rank(team)
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

