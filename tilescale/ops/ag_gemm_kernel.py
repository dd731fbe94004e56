"""The GEMM kernel of AG+GEMM (:mod:`tilescale.ops.allgather_gemm`), launched twice per call: on this rank's own
rows, read where they are (`a_local`), then on the other ranks' rows in the gathered buffer, each tile first waiting
for its chunk's ``arrived`` flag. Also its grids (a short last wave split along K), how many chunks a shard moves in,
and the list of kernels an op compiles. The steps named here are those of the pull protocol
(:mod:`tilescale.ops.ag_gemm_pull`; the push protocol's are in :mod:`tilescale.ops.ag_gemm_push`).
"""
import tilescale
import tilescale.language as T

from ..profiler.device_timeline import TILE_WORDS
from . import vectors
from .gemm import (
    GemmConfig,
    SplitPlan,
    problem_config,
    split_block,
    split_buffers,
    split_plan,
    split_tile_loop,
    tile_buffers,
    tile_loop,
    tile_order,
)


@T.macro
def _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, slot, split, *, M: int, W: int, chunks: int,
             stages: int, threads: int, profile: bool, own: bool):
    """One block of :func:`ag_gemm_kernel`: the tile (`by`: row of the kernel's grid, `bx`: column), its chunk's
    wait, its timestamps in ``prof[slot * TILE_WORDS:]``; `split`: None (the whole tile), or (work, arrived, fixed,
    tile, slice, first K tile, K tiles, plan) of a split grid (tilescale.ops.gemm.split_tile_loop)."""
    block_m = As.shape[0]
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    rows_per_chunk = (M // W) // chunks
    me = T.get_rank()
    if own:
        rb = me * tiles_per_rank + by                  # C's row tile; A's is `by`
        src, chunk = me, by * block_m // rows_per_chunk
    else:
        rb = (by + (me + 1) * tiles_per_rank) % tiles_m   # rank+1's rows first, then rank+2, ...: pull order
        src = rb // tiles_per_rank
        chunk = (rb % tiles_per_rank) * block_m // rows_per_chunk
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS] = T.timestamp()
    if not own:
        T.wait_until(arrived[src * chunks + chunk], cmp="ge", value=1)
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS + 1] = T.timestamp()
            for i, v in enumerate((T.smid(), src, chunk, rb, bx)):
                prof[slot * TILE_WORDS + 3 + i] = T.cast(v, "uint64")
    if split is None:
        tile_loop(A, B, C, As, Bs, Cl, Cs, by if own else rb, bx, stages, False, c_rb=rb)
    else:
        work, tail_arrived, tail_fixed, t, s, k0, kn, plan = split
        split_tile_loop(A, B, C, As, Bs, Cl, Cs, work, tail_arrived, tail_fixed, by if own else rb, bx, t, s, k0, kn,
                        plan, stages, threads // 32, c_rb=rb)
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS + 2] = T.timestamp()


def grid_plan(M: int, N: int, K: int, world_size: int, block_m: int, block_n: int, block_k: int, sms: int,
              own: bool) -> SplitPlan:
    """The :class:`~tilescale.ops.gemm.SplitPlan` of one of :class:`AGGemm`'s GEMMs (`own`: its own rows) on `sms`
    SMs; ``sms=0``: no split (the plain 2-D grid)."""
    tiles_n = -(-N // block_n)
    rows = M // world_size if own else M - M // world_size
    tiles = rows // block_m * tiles_n
    if sms <= 0:
        return SplitPlan(tiles, tiles, 1)
    return split_plan(tiles, sms, -(-K // block_k))


@tilescale.jit
def ag_gemm_kernel(M: int, N: int, K: int, world_size: int, chunks: int, dtype: str = "bfloat16",
                   block_m: int = 128, block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256,
                   swizzle: int = 10, profile: bool = False, own: bool = False, sms: int = 0):
    """A GEMM of :class:`AGGemm`, on one part of the rows of ``C = A_full @ B`` (M x N):

    - `own`: this rank's rows, ``C[me * rows:(me + 1) * rows] = A @ B`` with `A` its shard (M / W rows) as the
      caller gave it; nothing is waited for (step 1 of the module docstring);
    - else: the other ranks' rows, in the order they arrive (rank+1's, rank+2's, ...), `A` the gathered buffer (M
      rows); a tile first waits for its chunk's ``arrived`` flag (step 5). Its parameters are (A, B, C, arrived).

    `sms` (the GPU's SM count; 0: never): when :func:`grid_plan` splits the last wave's tiles along K
    (tilescale.ops.gemm.split_tile_loop), the grid is 1-D in the same tile order and the kernel takes three more
    parameters, ``work, tail_arrived, tail_fixed`` (tilescale.ops.gemm.split_workspace), before `prof`.

    `profile=True` adds a last argument `prof` (uint64, TILE_WORDS per block of the grid) where thread 0 of
    each block writes its record (tilescale.profiler.device_timeline.TILE_FIELDS: entry, signal observed
    and end timestamps, SM, source rank, chunk, row and column tile); `profile=False` generates the same
    code as a kernel without the option (tests/test_profiler.py checks it against a snapshot)."""
    W = world_size
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    tiles_n = (N + block_n - 1) // block_n
    grid_m = tiles_per_rank if own else tiles_m - tiles_per_rank
    plan = grid_plan(M, N, K, W, block_m, block_n, block_k, sms, own)
    k_tiles = -(-K // block_k)
    split = plan.split > 1
    Work, TailArrived, TailFixed = split_buffers(plan, block_m, block_n) if split else (None, None, None)
    Prof = T.Tensor((plan.blocks * TILE_WORDS,), "uint64") if profile else None
    Arrived = None if own else T.Tensor((W * chunks,), "uint64")
    opts = dict(M=M, W=W, chunks=chunks, stages=stages, threads=threads, profile=profile, own=own)

    @T.prim_func
    def ag_gemm(A: T.Tensor((M // W if own else M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
                arrived: Arrived, work: Work, tail_arrived: TailArrived, tail_fixed: TailFixed, prof: Prof):
        if split:
            with T.Kernel(plan.blocks, threads=threads) as b:
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, 0)
                t, s, k0, kn = split_block(b, plan, k_tiles)
                by, bx = tile_order(t, grid_m, tiles_n, swizzle)
                _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, b,
                         (work, tail_arrived, tail_fixed, t, s, k0, kn, plan), **opts)
        else:
            with T.Kernel(T.ceildiv(N, block_n), grid_m, threads=threads) as (bx, by):
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
                _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, by * tiles_n + bx, None, **opts)

    return ag_gemm



PULL_MIN_BYTES = 16 << 20   # copy-engine copies of 4-8 MiB moved a shard at up to half the speed of 16 MiB ones
PULL_MAX_CHUNKS = 4


def pull_chunks(shard_bytes: int) -> int:
    """How many copies pull one peer's shard (step 4; before rounding down to a divisor of its row tiles): as
    many as keep each copy at least ``PULL_MIN_BYTES``, at most ``PULL_MAX_CHUNKS``, at least one. More chunks let
    the second GEMM start on a shard's first rows sooner; on 4 x H200, 3 x 16 MiB pulled in 4 MiB copies took up to
    twice as long as in whole-shard copies, and AG+GEMM at 2048-8192 rows ran 15-40% faster with one copy per
    shard, 16384 rows (four 16 MiB copies) 4% faster than with one."""
    return max(1, min(PULL_MAX_CHUNKS, shard_bytes // PULL_MIN_BYTES))


def kernel_plan(args: tuple) -> SplitPlan:
    """The :func:`grid_plan` of :func:`ag_gemm_kernel` called with `args` (as :func:`kernels` lists them)."""
    bound = ag_gemm_kernel.signature.bind(*args)
    bound.apply_defaults()
    a = bound.arguments
    return grid_plan(a["M"], a["N"], a["K"], a["world_size"], a["block_m"], a["block_n"], a["block_k"], a["sms"],
                     a["own"])


def kernels(M: int, N: int, K: int, world_size: int, dtype: str, chunks: int | None = None,
            config: GemmConfig | None = None, sms: int = 132) -> list:
    """[(jit function, args)] of the kernels :class:`AGGemm` compiles for this problem: the GEMM of its own rows,
    then (world size > 1) the GEMM of the other ranks' rows; `sms`: the GPU's SM count (either GEMM may split its
    last wave: :func:`grid_plan`, tests/gpu/ag_gemm_split_main.py); `chunks` (None: :func:`pull_chunks`) rounded
    down to a divisor of the row tiles of a shard."""
    cfg = problem_config(M, N, K, world_size=world_size, op="ag_gemm", config=config)
    tiles_per_rank = M // world_size // cfg.block_m
    if not chunks:
        import torch

        chunks = pull_chunks(M // world_size * K * vectors.element_size(getattr(torch, dtype)))
    while tiles_per_rank % chunks:
        chunks -= 1
    args = (M, N, K, world_size, chunks, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
            cfg.swizzle, False)
    parts = (True, False) if world_size > 1 else (True,)
    return [(ag_gemm_kernel, (*args, own, sms)) for own in parts]

