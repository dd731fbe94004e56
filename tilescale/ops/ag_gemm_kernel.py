"""The GEMM kernel of AG+GEMM (:mod:`tilescale.ops.allgather_gemm`), launched twice per call: on this rank's own
rows, read where they are (`a_local`), then on the other ranks' rows in the gathered buffer, each tile first waiting
for its chunk's ``arrived`` flag. Also its grids (a short last wave split along K), how many chunks a shard moves in,
and the list of kernels an op compiles. The steps named here are those of the pull protocol
(:mod:`tilescale.ops.ag_gemm_pull`; the push protocol's are in :mod:`tilescale.ops.ag_gemm_push`).
"""
from tilelang import tvm

import tilescale
import tilescale.language as T

from ..profiler.device_timeline import TILE_WORDS
from . import checks
from .gemm import (
    GemmConfig,
    SplitPlan,
    problem_config,
    split_block,
    split_plan,
    split_sizes,
    split_tile_loop,
    tile_buffers,
    tile_loop,
    tile_order,
)

SPLIT_PARAMS = ("work", "tail_arrived", "tail_fixed", "slices", "tail")
SPLIT_SIZES = ("work_tiles", "tail_words")


@T.macro
def _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, slot, split, m, *, W: int, chunks: int, elem: int,
             stages: int, threads: int, profile: bool, own: bool, team=None):
    """One block of :func:`ag_gemm_kernel`: the tile (`by`: row of the kernel's grid, `bx`: column), its chunk's
    wait, its timestamps in ``prof[slot * TILE_WORDS:]``; `m`: the call's rows per rank; `split`: None (the whole
    tile), or (work, arrived, fixed, tile, slice, first K tile, K tiles, first tail tile, slices) of a split grid
    (tilescale.ops.gemm.split_tile_loop)."""
    block_m = As.shape[0]
    tiles_per_rank = T.ceildiv(m, block_m)
    me = T.team_rank(team)
    if own:
        t, src = by, me
        chunk = t // chunk_tiles(tiles_per_rank, m, A.shape[-1], chunks, elem)
    else:                      # in registers (tilescale.ops.gemm, NOTE [registers]); t, src read by the epilogue too
        at = T.alloc_local((3,), "int32")
        at[0] = by % tiles_per_rank                     # the row tile within its rank's rows
        at[1] = (me + 1 + by // tiles_per_rank) % W     # rank+1's rows first, then rank+2, ...: pull order
        at[2] = at[0] // chunk_tiles(tiles_per_rank, m, A.shape[-1], chunks, elem)
        t = at[0]
        src = at[1]
        chunk = at[2]
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS] = T.timestamp()
    if not own:
        T.wait_until(arrived[src * chunk_slots(chunks) + chunk], cmp="ge", value=1)
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS + 1] = T.timestamp()
            fields = (T.smid(), src, chunk, src * tiles_per_rank + t, bx)   # (indexed: a name bound to a
            for i in (0, 1, 2, 3, 4):                                        # variable would rename it)
                prof[slot * TILE_WORDS + 3 + i] = T.cast(fields[i], "uint64")
    if split is None:
        tile_loop(A, B, C, As, Bs, Cl, Cs, t, bx, stages, False, a_src=None if own else src, c_src=src)
    else:
        work, tail_arrived, tail_fixed, tile, s, k0, kn, full, slices = split
        split_tile_loop(A, B, C, As, Bs, Cl, Cs, work, tail_arrived, tail_fixed, t, bx, tile, s, k0, kn, None, stages,
                        threads // 32, full=full, a_src=None if own else src, c_src=src, slices=slices)
    if profile:
        if T.get_thread_binding() == 0:
            prof[slot * TILE_WORDS + 2] = T.timestamp()


def chunk_tiles(tiles_per_rank, rows, K: int, chunks: int, elem_bytes: int):
    """Row tiles per chunk of a shard of `rows` rows (`tiles_per_rank` tiles; ints, or kernel expressions of the
    call's rows): the shard in `chunks` chunks (0: :func:`pull_chunks` of its bytes), each a whole number of tiles,
    the last the shorter one (or empty)."""
    if isinstance(tiles_per_rank, int):
        n = chunks or pull_chunks(rows * K * elem_bytes)
        return max(1, -(-tiles_per_rank // n))
    if not chunks:   # pull_chunks of the shard's bytes, as comparisons of 32-bit rows (no 64-bit division: ptxas
        n = 1        # emulates it with a call, which serialises the kernel's wgmma)
        for c in range(2, PULL_MAX_CHUNKS + 1):
            n = n + T.if_then_else(rows >= -(-c * PULL_MIN_BYTES // (K * elem_bytes)), 1, 0)
        chunks = n
    return T.max(1, T.ceildiv(tiles_per_rank, chunks))


def grid_plan(M: int, N: int, K: int, world_size: int, block_m: int, block_n: int, block_k: int, sms: int,
              own: bool) -> SplitPlan:
    """The :class:`~tilescale.ops.gemm.SplitPlan` of one of :class:`AGGemm`'s GEMMs (`own`: its own rows) for `M`
    gathered rows on `sms` SMs; ``sms=0``: no split (the plain 2-D grid)."""
    tiles_n = -(-N // block_n)
    tiles_per_rank = -(-(M // world_size) // block_m)
    tiles = (tiles_per_rank if own else tiles_per_rank * (world_size - 1)) * tiles_n
    if sms <= 0 or tiles == 0:
        return SplitPlan(tiles, tiles, 1)
    return split_plan(tiles, sms, -(-K // block_k))


@tilescale.jit
def ag_gemm_kernel(N: int, K: int, world_size: int, chunks: int, dtype: str = "bfloat16", block_m: int = 128,
                   block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10,
                   profile: bool = False, own: bool = False, sms: int = 0, team=None):
    """A GEMM of :class:`AGGemm`, on one part of the rows of ``C = A_full @ B`` (W x m rows, N columns), the rows
    per rank `m` a run-time argument (one build serves every row count):

    - `own`: this rank's rows, ``C[me] = A @ B`` with `A` its shard (m, K) as the caller gave it; nothing is waited
      for (step 1 of the module docstring);
    - else: the other ranks' rows, in the order they arrive (rank+1's, rank+2's, ...), `A` the gathered buffer
      seen as (W, slot_rows, K), rank q's rows in ``A[q, :m]`` (`slot_rows`, the op's bound, also a run-time
      argument: rows past m are never stored); a tile first waits for its chunk's ``arrived`` flag (step 5;
      :func:`chunk_slots` words per rank, rank q's chunk c at ``q * chunk_slots + c``). Its parameters are (A, B,
      C, arrived).

    `C` is seen as (W, m, N): a tile stores the rows of its rank only (TMA clips at m), whatever m is. `chunks`:
    the chunks of a shard (0: :func:`pull_chunks` of the call's shard, computed in the kernel from m, as the host
    does: :func:`chunk_tiles`).

    `sms` (0: the plain 2-D grid): a 1-D grid, in the same tile order, whose last ``tail`` tiles run as ``slices``
    slices along K each (tilescale.ops.gemm.split_tile_loop), both run-time arguments: a call's :func:`grid_plan`
    on `sms` SMs, as the kernel built for its rows alone would split them (slices 1, tail 0: none split). It then
    takes ``work, tail_arrived, tail_fixed`` (tilescale.ops.gemm.split_workspace, of run-time sizes: for the
    largest of the plans it serves) and ``slices, tail`` after its other parameters, before `prof`.

    `team`: the ranks of the op's group (tilescale.runtime.team.kernel_team; None: the world): ``me`` is this rank's
    index in it, and so are the ranks q of the rows.

    `profile=True` adds a parameter `prof` (uint64, TILE_WORDS per block of the grid, `prof_words` a run-time
    size) where thread 0 of each block writes its record (tilescale.profiler.device_timeline.TILE_FIELDS: entry,
    signal observed and end timestamps, SM, source rank, chunk, row and column tile); `profile=False` generates
    the same code as a kernel without the option (tests/test_profiler.py checks it against a snapshot)."""
    W = world_size
    m = T.dynamic("m")
    tiles_per_rank = T.ceildiv(m, block_m)
    tiles_n = (N + block_n - 1) // block_n
    grid_m = tiles_per_rank if own else tiles_per_rank * (W - 1)
    k_tiles = -(-K // block_k)
    tiles = grid_m * tiles_n
    split = sms > 0
    if split:
        work_tiles, words = T.dynamic("work_tiles"), T.dynamic("tail_words")
        Work = T.Tensor((work_tiles, block_m, block_n), "float32")
        TailArrived, TailFixed = T.Tensor((words,), "uint64"), T.Tensor((words,), "uint64")   # (two objects:
        # a parameter per annotation object)
        Slices = Tail = T.int32
    else:
        Work = TailArrived = TailFixed = Slices = Tail = None
    Prof = T.Tensor((T.dynamic("prof_words"),), "uint64") if profile else None
    Arrived = None if own else T.Tensor((W * chunk_slots(chunks),), "uint64")
    opts = dict(W=W, chunks=chunks, elem=tvm.DataType(dtype).bits // 8, stages=stages, threads=threads,
                profile=profile, own=own, team=team)

    @T.prim_func
    def ag_gemm(A: T.Tensor((m, K) if own else (W, T.dynamic("slot_rows"), K), dtype), B: T.Tensor((K, N), dtype),
                C: T.Tensor((W, m, N), dtype), arrived: Arrived, work: Work, tail_arrived: TailArrived,
                tail_fixed: TailFixed, slices: Slices, tail: Tail, prof: Prof):
        if split:
            full = T.max(tiles - tail, 0)
            with T.Kernel(full + (tiles - full) * slices, threads=threads) as b:
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, 0)
                at = T.alloc_local((7,), "int32")       # in registers (tilescale.ops.gemm, NOTE [registers])
                t, s, k0, kn = split_block(b, None, k_tiles, full, slices)
                at[0] = t
                at[1] = s
                at[2] = full
                at[3] = k0
                at[4] = kn
                by, bx = tile_order(at[0], grid_m, tiles_n, swizzle)
                at[5] = by
                at[6] = bx
                _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, at[5], at[6], b,
                         (work, tail_arrived, tail_fixed, at[0], at[1], at[3], at[4], at[2], slices), m, **opts)
        else:
            with T.Kernel(T.ceildiv(N, block_n), grid_m, threads=threads) as (bx, by):
                As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
                _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, by * tiles_n + bx, None, m, **opts)

    return ag_gemm



PULL_MIN_BYTES = 16 << 20   # copy-engine copies of 4-8 MiB moved a shard at up to half the speed of 16 MiB ones
PULL_MAX_CHUNKS = 4


def chunk_slots(chunks: int) -> int:
    """The ``arrived`` flags of one rank's shard (and the pulls of it a call issues): `chunks`, or for 0 (chunks by
    the call's rows) :data:`PULL_MAX_CHUNKS`; a call's chunks past its rows pull nothing and only set their flag."""
    return chunks or PULL_MAX_CHUNKS


def elem_bytes(dtype) -> int:
    return tvm.DataType(checks.dtype_name(dtype)).bits // 8


def pull_chunks(shard_bytes: int) -> int:
    """How many copies pull one peer's shard (step 4; before rounding down to a divisor of its row tiles): as
    many as keep each copy at least ``PULL_MIN_BYTES``, at most ``PULL_MAX_CHUNKS``, at least one. More chunks let
    the second GEMM start on a shard's first rows sooner; on 4 x H200, 3 x 16 MiB pulled in 4 MiB copies took up to
    twice as long as in whole-shard copies, and AG+GEMM at 2048-8192 rows ran 15-40% faster with one copy per
    shard, 16384 rows (four 16 MiB copies) 4% faster than with one."""
    return max(1, min(PULL_MAX_CHUNKS, shard_bytes // PULL_MIN_BYTES))


def splits(args: tuple) -> bool:
    """Whether :func:`ag_gemm_kernel` called with `args` runs a split grid (its ``sms`` > 0)."""
    return ag_gemm_kernel.signature.bind(*args).arguments.get("sms", 0) > 0


def kernel_plan(args: tuple, M: int) -> SplitPlan:
    """The grid of :func:`ag_gemm_kernel` called with `args` (as :func:`kernels` lists them) for a call of `M`
    gathered rows: its :func:`grid_plan` (a plain grid when the kernel has none split)."""
    bound = ag_gemm_kernel.signature.bind(*args)
    bound.apply_defaults()
    a = bound.arguments
    return grid_plan(M, a["N"], a["K"], a["world_size"], a["block_m"], a["block_n"], a["block_k"], a["sms"], a["own"])


def split_space(args: tuple, M: int) -> tuple:
    """(work tiles, words) of the workspace of :func:`ag_gemm_kernel` called with `args` that serves every call of
    up to `M` gathered rows (tilescale.ops.gemm.split_sizes of their plans)."""
    bound = ag_gemm_kernel.signature.bind(*args)
    bound.apply_defaults()
    W, bm = bound.arguments["world_size"], bound.arguments["block_m"]
    return split_sizes([kernel_plan(args, W * r * bm) for r in range(1, -(-(M // W) // bm) + 1)])


def kernels(M: int, N: int, K: int, world_size: int, dtype: str, chunks: int | None = None,
            config: GemmConfig | None = None, sms: int = 132, team=None) -> list:
    """[(jit function, args)] of the kernels :class:`AGGemm` compiles for problems of up to `M` gathered rows: the
    GEMM of its own rows, then (world size > 1) the GEMM of the other ranks' rows; the rows are an argument of each
    call, so M only chooses the config (the tuning table's for M) and, per GEMM, the kernel its plan at M takes
    (:func:`grid_plan` on `sms` SMs, 0: no split; tests/gpu/ag_gemm_split_main.py): the plain grid, or the one that
    splits each call's last wave as its own plan says; `chunks` (None: by each call's rows, :func:`pull_chunks`);
    `team`: the ranks of the op's group (None: the world; its kernels take no team argument)."""
    cfg = problem_config(M, N, K, world_size=world_size, op="ag_gemm", config=config)
    args = (N, K, world_size, chunks or 0, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
            cfg.swizzle, False)
    jobs = []
    for own in ((True, False) if world_size > 1 else (True,)):
        plan = grid_plan(M, N, K, world_size, cfg.block_m, cfg.block_n, cfg.block_k, sms, own)
        jobs.append((ag_gemm_kernel, (*args, own, sms if plan.split > 1 else 0) + (() if team is None else (team,))))
    return jobs

