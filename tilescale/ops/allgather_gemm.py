"""AllGather + GEMM, overlapped: ``C = AllGather(A) @ B`` with A sharded by rows.

torch equivalent (A_local: (M/W, K) on each rank, B: (K, N) local)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, A_local)
    C = A @ B

How it overlaps: communication starts when the call starts and runs beside the GEMM. The GEMM starts at once on
this rank's own rows, read where they are (`a_local`); a second launch of the GEMM computes the other ranks' rows
in the order they arrive (rank+1's first, then rank+2's, ...), each tile waiting only for its chunk of rows. Two
protocols move the rows, chosen by topology (:func:`protocol_for`). At world size 1 the call is the first GEMM
alone, on `a_local`.

Push (two ranks on two GPUs of this node: every copy runs on a copy engine, no SM is taken from the GEMM).
Flags: ``arrived[q, chunk]`` (symmetric, here): rank q's chunk is in my ``A_full``; ``freed[q]`` (symmetric,
here): rank q has read my rows of its ``A_full`` of the last call and zeroed its ``arrived`` (1 before the first
call). Each is set to 1 by its one writer and reset by its one reader.

1. main stream: an event ``start`` (after the work enqueued before the call);
2. the copy stream, from ``start``, for dst = rank-1, rank-2, ... (dst reads my rows first when I am its rank+1):
   wait until ``freed[dst] >= 1``, set it to 0;
3. for each chunk of my rows (:meth:`AGGemm.chunk_rows` of the call's rows): a copy-engine copy from `a_local` into
   dst's ``A_full`` through its mapping (none for a chunk past the call's rows), then a stream write
   ``arrived[me, chunk] = 1`` on dst (ordered after the copy); last, an event ``pushed``;
4. main stream: the GEMM of my own rows from `a_local`;
5. main stream: the GEMM of the other ranks' rows from ``A_full``; a tile first waits until
   ``arrived[src, chunk] >= 1`` (acquire, system scope);
6. main stream: wait for ``pushed`` (the call ends after its reads of `a_local`), zero ``arrived``, then
   ``freed[me] = 1`` on every peer.

My rows are not copied into my own ``A_full`` by the call (a copy within one GPU needs SMs): ``gathered()`` copies
them in when asked. A non-contiguous (or not 16-byte aligned) `a_local` is copied into my rows of ``A_full`` by
torch on the main stream first and pushed from there. Unlike pulling (below), no copy kernel of my rows competes
with the first GEMM for SMs before the peers may read them.

Pull (a peer shares this rank's GPU, or is on another node). This rank's shard is copied into its slot of the
symmetric gathered buffer (``A_full``), where peers pull it from, and the copy engines pull the other shards over
NVLink one peer after another (rank+1, rank+2, ...). A rank of another node (``TILESCALE_NODE_SIZE`` included, per
:func:`tilescale.topology.current`) has no peer view: its chunks come by NVSHMEM's on-stream get
(``nvshmemx_getmem_on_stream``).

Signal protocol of a pull call. Flags are set to 1 by their one writer and reset to 0 by their one reader, so no
value depends on a count kept on the host: a call captured in a CUDA graph replays correctly, and replays and
eager calls may be interleaved. No barrier, and no flag that needs an SM: stream memory operations
(``cuStreamWaitValue64`` / ``cuStreamWriteValue64``), on a peer's flag through its mapping, or NVSHMEM's on-stream
signal (an add) for a rank of another node. ``ready[q]`` (symmetric, here): rank q's slot of its ``A_full``
holds its shard of this call; ``freed[q]`` (symmetric, here): rank q has pulled my slot of the last call (1 before
the first call); ``arrived[q, chunk]`` (local): that chunk is here. An event ``start`` on the main stream marks
the call's start (after the work enqueued before it).

1. main stream: the GEMM of my own rows, ``C[my rows] = a_local @ B`` (TMA loads from `a_local` itself);
2. local stream, from ``start``: for every peer q, wait until ``freed[q] >= 1`` (q is done reading my slot), set
   it to 0; copy a_local into my slot of ``A_full``, then set ``ready[me] = 1`` on every peer; then an event
   (``copied``);
3. main stream, after 1: wait for ``copied``: the copy is a copy kernel (a copy within one GPU takes SMs), which
   peers wait for, so it must not be left behind the second GEMM's waiting tiles;
4. copy stream j (one per peer src = rank + 1 + j), from ``start`` and, for j > 0, once stream j - 1 has pulled
   (its event ``pulled``): wait until ``ready[src] >= 1``, set it to 0; for each chunk of src's shard a pull from
   src's ``A_full`` (a copy-engine copy from its peer view, or an on-stream NVSHMEM get from another node), then
   a stream write ``arrived[src, chunk] = 1`` (ordered after the pull); record ``pulled``; last, ``freed[me] = 1``
   on src. A pull that needs an SM must end before step 5 (:func:`pulls_needing_sms`; step 3 also waits for its
   copy stream's join event): from a src on this rank's own GPU (ranks sharing one: a copy kernel), or from one
   NVSHMEM has no mapping to (its on-stream get launches a one-thread proxy kernel). Were such a copy still to
   come, the second GEMM's waiting tiles could hold every SM and it would never start;
5. main stream: the GEMM of the other ranks' rows from ``A_full``; a tile first waits until
   ``arrived[src, chunk] >= 1`` (acquire, system scope), then loads them with TMA;
6. main stream: joins the copy streams and the local stream, then zeroes ``arrived`` (the next call's copy
   streams start after its ``start``, so after this).

Each flag's set and reset alternate: my reset of ``ready[src]`` (4) precedes my ``freed`` signal to src, which
src's next set of ``ready[src]`` waits for (its 2); my reset of ``freed[q]`` (2) precedes my ``ready`` signal to
q, which q's next reset of ``ready[me]`` waits for (its 4).

How the host issues a call: the ``start`` event, step 4 and step 2 are one program of stream operations
(:mod:`.stream_ops`, built once by ``AGGemm._plan``, each operation on its stream), issued by one call of the
runtime shim; then the first GEMM (1, through the kernel's C entry point); step 3 (a second program); the second
GEMM (5); step 6 (a third program). A non-contiguous (or not 16-byte aligned) `a_local` is copied into my slot by
torch on the main stream first (after step 2's waits), and the first GEMM reads it there; a profiled call issues
the same steps one by one from Python.
"""

from tilelang import tvm

import tilescale
import tilescale.language as T

from ..profiler import session as profiling
from ..profiler.device_timeline import TILE_WORDS
from . import checks, op_cache, vectors
from . import stream_ops as so
from .base import Op
from .gemm import (
    GemmConfig,
    SplitPlan,
    check_problem,
    problem_config,
    split_block,
    split_plan,
    split_sizes,
    split_tile_loop,
    split_workspace,
    tile_buffers,
    tile_loop,
    tile_order,
)

__all__ = ["AGGemm", "ag_gemm"]

# a split grid's parameters in its C entry point: after C (and arrived), and after the rows (AGGemm's direct launch)
SPLIT_PARAMS = ("work", "tail_arrived", "tail_fixed", "slices", "tail")
SPLIT_SIZES = ("work_tiles", "tail_words")


@T.macro
def _ag_tile(A, B, C, As, Bs, Cl, Cs, arrived, prof, by, bx, slot, split, m, *, W: int, chunks: int, elem: int,
             stages: int, threads: int, profile: bool, own: bool):
    """One block of :func:`ag_gemm_kernel`: the tile (`by`: row of the kernel's grid, `bx`: column), its chunk's
    wait, its timestamps in ``prof[slot * TILE_WORDS:]``; `m`: the call's rows per rank; `split`: None (the whole
    tile), or (work, arrived, fixed, tile, slice, first K tile, K tiles, first tail tile, slices) of a split grid
    (tilescale.ops.gemm.split_tile_loop)."""
    block_m = As.shape[0]
    tiles_per_rank = T.ceildiv(m, block_m)
    me = T.get_rank()
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
                   profile: bool = False, own: bool = False, sms: int = 0):
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
                profile=profile, own=own)

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


def pulls_needing_sms(world_size: int, rank: int, same_gpu, mapped) -> list[bool]:
    """Per rank p, whether this rank's pull of p's shard needs an SM (step 4 of the module docstring), so that it must
    end before the second GEMM's tiles, which wait for it, take every SM: p on this rank's GPU (``same_gpu(p)``: a copy
    within one GPU is a copy kernel), or p not mapped here (``mapped(p)`` False: NVSHMEM's on-stream get from a peer
    without a load/store mapping launches a one-thread proxy kernel, NVSHMEM's ``nvshmemi_proxy_rma_launcher``). A
    mapped peer on another GPU is pulled by a copy engine. False for `rank` itself."""
    return [p != rank and (same_gpu(p) or not mapped(p)) for p in range(world_size)]


def protocol_for(world_size: int, rank: int, near, same_gpu) -> str:
    """"push" for two ranks on two GPUs of this node (``near[p]``: mapped here; ``same_gpu(p)``: on this rank's GPU),
    where every copy runs on a copy engine; else "pull" (module docstring). Not yet at 3 or more ranks: on 4
    distinct H200s a rank's second push never reached its peer, whose second GEMM waited until
    TILESCALE_WAIT_TIMEOUT_S (docs/ag-gemm-overlap.md)."""
    others = [p for p in range(world_size) if p != rank]
    return "push" if world_size == 2 and all(near[p] and not same_gpu(p) for p in others) else "pull"


PULL_MIN_BYTES = 16 << 20   # copy-engine copies of 4-8 MiB moved a shard at up to half the speed of 16 MiB ones
PULL_MAX_CHUNKS = 4


def chunk_slots(chunks: int) -> int:
    """The ``arrived`` flags of one rank's shard (and the pulls of it a call issues): `chunks`, or for 0 (chunks by
    the call's rows) :data:`PULL_MAX_CHUNKS`; a call's chunks past its rows pull nothing and only set their flag."""
    return chunks or PULL_MAX_CHUNKS


def _elem_bytes(dtype) -> int:
    return tvm.DataType(checks.dtype_name(dtype)).bits // 8


def pull_chunks(shard_bytes: int) -> int:
    """How many copies pull one peer's shard (step 4; before rounding down to a divisor of its row tiles): as
    many as keep each copy at least ``PULL_MIN_BYTES``, at most ``PULL_MAX_CHUNKS``, at least one. More chunks let
    the second GEMM start on a shard's first rows sooner; on 4 x H200, 3 x 16 MiB pulled in 4 MiB copies took up to
    twice as long as in whole-shard copies, and AG+GEMM at 2048-8192 rows ran 15-40% faster with one copy per
    shard, 16384 rows (four 16 MiB copies) 4% faster than with one."""
    return max(1, min(PULL_MAX_CHUNKS, shard_bytes // PULL_MIN_BYTES))


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
            config: GemmConfig | None = None, sms: int = 132) -> list:
    """[(jit function, args)] of the kernels :class:`AGGemm` compiles for problems of up to `M` gathered rows: the
    GEMM of its own rows, then (world size > 1) the GEMM of the other ranks' rows; the rows are an argument of each
    call, so M only chooses the config (the tuning table's for M) and, per GEMM, the kernel its plan at M takes
    (:func:`grid_plan` on `sms` SMs, 0: no split; tests/gpu/ag_gemm_split_main.py): the plain grid, or the one that
    splits each call's last wave as its own plan says; `chunks` (None: by each call's rows, :func:`pull_chunks`)."""
    cfg = problem_config(M, N, K, world_size=world_size, op="ag_gemm", config=config)
    args = (N, K, world_size, chunks or 0, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
            cfg.swizzle, False)
    jobs = []
    for own in ((True, False) if world_size > 1 else (True,)):
        plan = grid_plan(M, N, K, world_size, cfg.block_m, cfg.block_n, cfg.block_k, sms, own)
        jobs.append((ag_gemm_kernel, (*args, own, sms if plan.split > 1 else 0)))
    return jobs


class AGGemm(Op):
    """``C = all_gather(A_local) @ B`` for fixed N, K and dtype; collective to construct.

    `M` is the bound of the gathered rows (W x rows per rank): a call takes `a_local` of any m <= M / W rows (the
    same m on every rank) and returns C of W x m rows, with the kernels built once (the rows are a kernel argument;
    the buffers are sized for M). ``op(a_local, b)`` returns C (a new tensor unless `out=` is given). The gathered
    A of the last call stays in ``op.gathered()``. `fused` (default: the committed table at M,
    tilescale/ops/fused_paths.py): False runs NCCL's AllGather then cuBLAS, where the fused kernel is slower
    (small M); ``op.fused`` says which path the op takes. `split` (default True): a GEMM whose last wave's tiles
    split along K at M rows (:func:`grid_plan`) runs a grid that splits each call's last wave as that call's own
    plan says (as a kernel built for its rows would); False: plain grids. Either way the kernels depend on the
    config and the SM count alone (the cached ``ag_gemm``'s ops of every bound share them). `profile` (default
    TILESCALE_PROFILE_DEVICE) also builds the kernels with in-kernel timestamps, used while a tilescale.profiler
    session records WAIT/TILE events.
    """

    NAME, KERNEL = "AGGemm", "ag_gemm"
    GRAPH_SAFE = True     # flags set and reset on the device (module docstring): no per-call host state

    def __init__(self, M: int, N: int, K: int, dtype, *, chunks: int | None = None, config: GemmConfig | None = None,
                 profile: bool | None = None, split: bool = True, fused: bool | None = None):
        import torch

        from ..env import settings
        from ..runtime import symm, topology
        from . import fused_paths
        from .gemm import current_gpu

        with self.arguments(M=M, N=N, K=K, dtype=dtype, chunks=chunks, config=config, profile=profile,
                            split=split, fused=fused) as agreed:
            if fused is None:   # the table's path, decided before any check can fail on this rank alone, so that
                # a rank with a bad argument and one without still agree on it (only the bad argument is named)
                agreed["fused"] = fused = fused_paths.choose("ag_gemm", M, N, K, self.rt.info, current_gpu()) == "fused"
            if not isinstance(fused, bool):
                checks.fail("AGGemm", "fused", checks.describe(fused), "a bool (or None: the committed table, "
                            "tilescale/ops/fused_paths.json)", type_error=True)
            profile = settings.profile_device if profile is None else profile
            check_problem("AGGemm", M, N, K, dtype, config, "K")
            checks.as_int("AGGemm", "chunks", chunks, allow_none=True)
            if not isinstance(split, bool):
                checks.fail("AGGemm", "split", checks.describe(split), "a bool", type_error=True)
            if not isinstance(profile, bool) and profile not in (0, 1):
                checks.fail("AGGemm", "profile", checks.describe(profile), "a bool (or None: TILESCALE_PROFILE_DEVICE)",
                            type_error=True)
            agreed["profile"] = profile = bool(profile)
            kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config, 0)   # its errors: agreed
            self.fused = fused
        self.M, self.N, self.K, self.dtype = M, N, K, dtype
        self.rows = M // self.world_size     # the bound of a call's rows per rank (`m`: those of the last call)
        self.m = self.rows
        if not self.fused:    # NCCL then cuBLAS (tilescale/ops/fused_paths.py): no kernel, no symmetric buffer
            self.launch_path, self._full = "unfused", None
            return
        # the SM count (the last waves' split) read once every rank's arguments agreed: no rank queries its GPU, and
        # maybe fails alone, before the others learn whether the call was valid
        jobs = kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config,
                       vectors.sm_count() if split else 0)
        W, (fn, self.args) = self.world_size, jobs[-1]
        self.chunks = self.args[3]                   # 0: by each call's rows
        self.block_m = self.args[5]
        self._last_a = None       # world size 1: the a_local of the last call (gathered())
        # the GEMM of my rows (step 1) and of the others' (step 5; world size > 1): their grids at the bound, and a
        # split grid's workspace (for every call's plan: split_space), which it takes after its other arguments
        # with a call's slices and tail tiles (_tail)
        self._job_args = [a for _, a in jobs]
        self.plans = [kernel_plan(a, M) for _, a in jobs]
        self._sizes = [split_space(a, M) if a[-1] else () for _, a in jobs]
        self._ws = [split_workspace(z, *a[5:7], device=self.rt.device) if z else () for z, (_, a) in
                    zip(self._sizes, jobs, strict=True)]
        self._splits = {}         # rows per rank -> each GEMM's (slices, tail tiles): _split_of
        self.tail = [self._tail(i, self.rows) for i in range(len(jobs))]     # (a call of the bound's rows)
        tail, sizes = [SPLIT_PARAMS if z else () for z in self._sizes], [SPLIT_SIZES if z else () for z in self._sizes]
        prof_jobs = [(fn, a[:11] + (True,) + a[12:]) for _, a in jobs] if profile else []
        self.compile_ahead(jobs + prof_jobs)   # every kernel of the op side by side; build() takes them
        self.kernel_own, self._direct_own = self.build(fn, jobs[0][1], ("A", "B", "C", *tail[0], "m", *sizes[0]))
        self.kernel, self._direct = (self.build(fn, self.args, ("A", "B", "C", "arrived", *tail[1], "slot_rows", "m",
                                                                *sizes[1])) if W > 1 else (None, None))
        self._tail_ptrs = [tuple(t.data_ptr() for t in ws) for ws in self._ws]
        self.launch_path = "direct" if self._direct_own is not None else "tilelang"  # how __call__ launches
        # the same kernels with timestamps, and their blocks at the bound (one record each)
        self.kernels_prof = [f(*a).prepare() for f, a in prof_jobs] if profile else None
        self.tiles = [p.blocks for p in self.plans] + [0] * (2 - len(self.plans))
        if W == 1:
            return
        self.a_full = self.symmetric((M, K), dtype)     # rank q's rows of a call: its slot, A_full[q * rows:][:m]
        self.ready = self.symmetric((W,), torch.uint64, zero=True)
        self.freed = self.symmetric((W,), torch.uint64, zero=True)
        self.freed.fill_(1)     # no peer reads my slot before the first call (a peer sets it only after that)
        torch.cuda.current_stream().synchronize()
        self.slots = chunk_slots(self.chunks)       # arrived flags (and copies) per rank
        # written by the peers (push) or by this rank's copy streams (pull): symmetric for the first
        self.arrived = self.symmetric((W * self.slots,), torch.uint64, zero=True)
        # a peer of this node: a torch view of its A_full (copy-engine copies) and the addresses of its flags
        # (stream writes); of another node: None (NVSHMEM gets and signals)
        topo = topology.current()
        near = [topo.same_node(p, self.rank) and p != self.rank for p in range(W)]
        same_gpu = self.rt.info.same_gpu
        self.protocol = protocol_for(W, self.rank, near, same_gpu)
        # push: one copy stream; pull: a copy stream per peer (step 4), then the local stream (step 2)
        self.streams = [torch.cuda.Stream(priority=-1) for _ in range(1 if self.protocol == "push" else W)]
        # pulls that need an SM are done before the second GEMM (step 4)
        shim, at = self.rt.shim, self.a_full.data_ptr()
        self._pull_first = pulls_needing_sms(W, self.rank, same_gpu, lambda p: near[p] or bool(shim.ts_ptr(at, p)))
        self._peers = [symm.peer_tensor(self.a_full, p) if near[p] else None for p in range(W)]
        # my word of a flag on rank p: through its mapping, or the symmetric address for NVSHMEM's signal
        self._flag_at = {name: [(symm.get_remote_ptr(f, p) if near[p] else f.data_ptr()) + 8 * self.rank
                                for p in range(W)] for name, f in (("ready", self.ready), ("freed", self.freed))}
        # push: rank p's arrived flags of my chunks, through its mapping
        self._arrived_on = [symm.get_remote_ptr(self.arrived, p) + 8 * self.rank * self.slots if near[p] else None
                            for p in range(W)]
        self._ready_here = [self.ready.data_ptr() + 8 * q for q in range(W)]     # rank q's word here
        self._freed_here = [self.freed.data_ptr() + 8 * q for q in range(W)]
        self._arrived_at = [self.arrived.data_ptr() + 8 * i for i in range(W * self.slots)]
        self._slot = self.a_full[self.rank * self.rows:(self.rank + 1) * self.rows]   # my rows of A_full (step 2)
        # the events of the steps: made once, recorded once here (a CUDA event exists from its first record), reused
        # by every call (a wait sees the record made before it): the call's start, step 2's copy, a join per copy
        # stream and the local stream (step 6), and step 4's ``pulled`` per copy stream but the last
        self._start, self._copied = torch.cuda.Event(), torch.cuda.Event()
        self._joins = [torch.cuda.Event() for _ in self.streams]
        self._pulled = [torch.cuda.Event() for _ in range(W - 2)]
        main = torch.cuda.current_stream()
        for e in (self._start, self._copied, *self._joins, *self._pulled):
            e.record(main)
        main.synchronize()
        self._slot_stale = False    # push: my rows of A_full not copied in by the last call (gathered() does it)
        self._stream_ops = getattr(self.rt.shim, "ts_stream_ops", None)
        if self.protocol == "push":
            self._plan_push()
            return
        self._plan(a_full=self.a_full.data_ptr(), row_bytes=self.K * self.a_full.element_size(),
                   peer_at=[None if t is None else t.data_ptr() for t in self._peers],
                   streams=[s.cuda_stream for s in self.streams],
                   events=dict(start=self._start.cuda_event, copied=self._copied.cuda_event),
                   joins=[e.cuda_event for e in self._joins], pulled=[e.cuda_event for e in self._pulled],
                   arrived=self.arrived.data_ptr(), arrived_bytes=self.arrived.nbytes)

    def _plan_push(self) -> None:
        """The push protocol's programs (module docstring, "Push"): ``_first`` (the call's start, then steps 2-3 on
        the copy stream; each copy ``_push_ops[i]`` (op, dst, chunk): its destination and size set for the call's
        rows by :meth:`_set_rows`, its source per call) and ``_post`` (step 6)."""
        W, r = self.world_size, self.rank
        self._row_bytes = self.K * self.a_full.element_size()
        first = so.Program([s.cuda_stream for s in self.streams])
        first.add(so.EVENT_RECORD, self._start.cuda_event)                                   # 1
        first.add(so.EVENT_WAIT, self._start.cuda_event, stream=1)
        copies = []       # (op index, dst, chunk)
        for j in range(1, W):                                                                # 2, 3
            dst = (r - j) % W     # rank-1 first: it reads my rows first (its rank+1)
            first.add(so.WAIT_GEQ, self._freed_here[dst], 1, stream=1, label=_label("freed", dst))
            first.add(so.WRITE, self._freed_here[dst], 0, stream=1)
            for ch in range(self.slots):
                copies.append((first.add(so.COPY, 0, 0, 0, stream=1), dst, ch))
                first.add(so.WRITE, self._arrived_on[dst] + 8 * ch, 1, stream=1)
        first.add(so.EVENT_RECORD, self._joins[0].cuda_event, stream=1)
        post = so.Program([s.cuda_stream for s in self.streams])
        post.add(so.EVENT_WAIT, self._joins[0].cuda_event)                                   # 6
        post.add(so.ZERO, self.arrived.data_ptr(), 0, self.arrived.nbytes)
        for q in range(W):
            if q != r:
                post.add(so.WRITE, self._flag_at["freed"][q], 1)
        self._first, self._post = first.seal(), post.seal()
        self._push_ops = [(self._first.array[i], dst, ch) for i, dst, ch in copies]
        self._set_rows(self.rows)

    def _plan(self, *, a_full: int, row_bytes: int, peer_at: list, streams: list, events: dict, joins: list,
              pulled: list, arrived: int, arrived_bytes: int) -> None:
        """The host steps of a call (module docstring) as programs of stream operations, issued by one shim call
        each (:mod:`.stream_ops`; stream 0: the caller's current stream, stream j: ``self.streams[j - 1]``: a copy
        stream per peer, then the local stream), in the order of the steps:
        ``_first`` (the call's start, the pulls of 4 and the copy of 2, whose source is op ``_copy_at``, set per
        call), or, when `a_local` is not contiguous, ``_local_head`` (2's waits, on the main stream), a torch copy,
        ``_local_tail`` (the rest of 2, then what ``_first`` issues but 2); then the first GEMM (1); ``_pre``
        (3); the second GEMM (5); ``_post`` (6). `a_full`, `peer_at` (a peer of this node: the address of its
        A_full; else None), `events` (start, copied), `joins`, `pulled`, `arrived`: raw addresses and handles."""
        W, r, rows, slots = self.world_size, self.rank, self.rows, self.slots
        peers = [(r + j) % W for j in range(1, W)]
        local = W          # the local stream's index
        ops = []

        def add(kind, a, b=0, n=0, stream=0, pe=0, label=None):
            ops.append((kind, a, b, n, stream, pe, label))

        def signal(flag, pe, stream):     # my word of `flag` on rank pe := 1 (a stream write, or NVSHMEM's add)
            if peer_at[pe] is not None:
                add(so.WRITE, self._flag_at[flag][pe], 1, stream=stream)
            else:
                add(so.SIGNAL_ADD, self._flag_at[flag][pe], 1, stream=stream, pe=pe)

        def local_steps(stream):                                                               # 2
            for q in peers:
                add(so.WAIT_GEQ, self._freed_here[q], 1, stream=stream, label=_label("freed", q))
                add(so.WRITE, self._freed_here[q], 0, stream=stream)
            head = len(ops)
            add(so.COPY, a_full + r * rows * row_bytes, 0, rows * row_bytes, stream=stream)  # (source: a_local)
            for q in peers:
                signal("ready", q, stream)
            add(so.EVENT_RECORD, events["copied"], stream=stream)
            return head

        def begin():               # the call's start; 4 on the copy streams from there
            add(so.EVENT_RECORD, events["start"])
            for j, src in enumerate(peers):                                                    # 4
                s = j + 1
                add(so.EVENT_WAIT, events["start"], stream=s)
                if j:       # one peer after another: the pulls share the copy engines' bandwidth less
                    add(so.EVENT_WAIT, pulled[j - 1], stream=s)
                add(so.WAIT_GEQ, self._ready_here[src], 1, stream=s, label=_label("ready", src))
                add(so.WRITE, self._ready_here[src], 0, stream=s)
                for ch, (lo, n) in enumerate(self.chunk_rows(rows)):   # (sizes set per call: _set_rows)
                    off = (src * rows + lo) * row_bytes
                    if peer_at[src] is not None:    # a copy-engine pull from the peer's A_full through its mapping
                        add(so.COPY, a_full + off, peer_at[src] + off, n * row_bytes, stream=s)
                    else:   # NVSHMEM's get of the same rows of the peer's buffer (symmetric: one address on every rank)
                        add(so.GET, a_full + off, a_full + off, n * row_bytes, stream=s, pe=src)
                    add(so.WRITE, self._arrived_at[src * slots + ch], 1, stream=s)
                if j < W - 2:
                    add(so.EVENT_RECORD, pulled[j], stream=s)
                signal("freed", src, s)
                if self._pull_first[src]:      # a pull that needs an SM: 3 waits for it
                    add(so.EVENT_RECORD, joins[j], stream=s)

        begin()
        add(so.EVENT_WAIT, events["start"], stream=local)
        head = local_steps(local)
        first, ops = ops, []
        head_main = local_steps(0)                     # the same on the main stream (a_local copied by torch)
        local_head, local_tail, ops = ops[:head_main], ops[head_main + 1:], []
        begin()
        local_tail += ops
        ops = []
        add(so.EVENT_WAIT, events["copied"])                                                   # 3
        for j, src in enumerate(peers):
            if self._pull_first[src]:
                add(so.EVENT_WAIT, joins[j])
        pre = ops
        post = []
        for j in range(len(streams)):                                                          # 6
            post += [(so.EVENT_RECORD, joins[j], 0, 0, j + 1, 0, None), (so.EVENT_WAIT, joins[j], 0, 0, 0, 0, None)]
        post.append((so.ZERO, arrived, 0, arrived_bytes, 0, 0, None))

        def program(rows_):
            p = so.Program(streams)
            for kind, a, b, n, stream, pe, label in rows_:
                p.add(kind, a, b, n, stream=stream, pe=pe, label=label)
            return p.seal()

        self._first, self._local_head, self._local_tail = program(first), program(local_head), program(local_tail)
        self._pre, self._post = program(pre), program(post)
        self._copy_at = head
        self._a_local_op = self._first.array[head]     # a view into the program: its source is set per call
        # the pulls of both programs that issue them, found by the flag each sets next: (op, src, chunk), their
        # addresses and sizes set per call for its rows (_set_rows)
        flag = {a: (i // slots, i % slots) for i, a in enumerate(self._arrived_at)}
        self._pull_ops = [(prog.array[i - 1], *flag[op.a]) for prog in (self._first, self._local_tail)
                          for i, op in enumerate(prog.array) if op.kind == so.WRITE and op.a in flag]
        self._pull_at = [a_full if p is None else p for p in peer_at]
        self._a_full_at, self._row_bytes = a_full, row_bytes

    def chunk_rows(self, m: int) -> list:
        """(first row, rows) of each chunk of a shard of `m` rows, as the kernel reads them (:func:`chunk_tiles`):
        :func:`chunk_slots` chunks of whole row tiles, the last ones shorter or empty."""
        step = chunk_tiles(-(-m // self.block_m), m, self.K, self.chunks, _elem_bytes(self.dtype)) * self.block_m
        return [(min(ch * step, m), max(0, min(step, m - ch * step))) for ch in range(self.slots)]

    def _set_rows(self, m: int) -> None:
        """The programs' copies for a call of `m` rows per rank (rank q's slot: rows ``q * rows ..`` of A_full, its
        first m rows used). Pull: the size of my shard's copy, the address and size of each pull; push: the
        destination and size of each push, and its offset in the call's rows (``_push_from``; the source is set
        per call). A chunk past the call's rows copies nothing and sets its flag all the same."""
        rb, rows, r = self._row_bytes, self.rows, self.rank
        chunks = self.chunk_rows(m)
        if self.protocol == "push":
            for op, dst, ch in self._push_ops:
                lo, n = chunks[ch]
                op.a, op.n = self._peers[dst].data_ptr() + (r * rows + lo) * rb, n * rb
            self._push_from = [chunks[ch][0] * rb for _, _, ch in self._push_ops]
        else:
            self._a_local_op.n = m * rb
            for op, src, ch in self._pull_ops:
                lo, n = chunks[ch]
                off = (src * rows + lo) * rb
                op.a, op.b, op.n = self._a_full_at + off, self._pull_at[src] + off, n * rb
        self._slot = self.a_full[r * rows:r * rows + m]   # (the torch copy's, a_local not contiguous; gathered())
        self.m = m

    def gathered(self):
        """The gathered A of the last call (W x m rows): this op's buffer when the call had the bound's rows (the
        next call overwrites it), else a copy of its slots' rows; at world size 1, the `a_local` of the last call
        itself (nothing is gathered, and no copy is made). With the push protocol the call sends this rank's rows to
        the peers straight from `a_local`: they are copied into the buffer here, from the last call's `a_local` (on
        the current stream, once per call). Unfused: the first W x m rows of the AllGather's buffer."""
        if self.world_size == 1:
            return self._last_a
        if not self.fused:
            return self._full if self._full is None or self.m == self.rows else self._full[:self.world_size * self.m]
        if self._slot_stale:
            self._slot.copy_(self._last_a)
            self._slot_stale = False
        if self.m == self.rows:
            return self.a_full
        return self.a_full.view(self.world_size, self.rows, self.K)[:, :self.m].reshape(-1, self.K)

    def _validate(self, a_local, b, out) -> None:
        """The call checks (agreed across ranks): `a_local` (m, K), m <= M / world_size, of the dtype on this GPU
        (any strides: a non-contiguous one is copied into the gathered buffer first); `b` (K, N) and `out`
        (W x m, N) handed to the kernels as they are: contiguous and 16-byte aligned (TMA)."""
        d, dt = self.device, self.dtype
        m = a_local.shape[0] if getattr(a_local, "dim", lambda: 0)() == 2 else self.rows
        if m > self.rows:
            checks.fail("AGGemm", "a_local", checks.describe(a_local), f"at most {self.rows} rows (the bound M / "
                        f"world_size of this op, built for M={self.M}: a larger M needs an op of its own)")
        checks.check_tensor("AGGemm", "a_local", a_local, shape=(m, self.K), dtype=dt, device=d,
                            what=f"m <= M / world_size = {self.rows} rows")
        checks.check_tensor("AGGemm", "b", b, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("AGGemm", "out", out, shape=(self.world_size * m, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="world_size x the rows of a_local")

    def call_key(self, a_local, b, out):
        """``checks.signature(a_local), checks.signature(b, True), checks.signature(out, True)``, flattened into
        one tuple built inline (raises AttributeError for a non-tensor: Op.begin then runs the checks)."""
        return (type(a_local), a_local.dtype, a_local.shape, a_local.device,
                type(b), b.dtype, b.shape, b.device, b.is_contiguous(), b.data_ptr() & 15,
                None if out is None else (type(out), out.dtype, out.shape, out.device, out.is_contiguous(),
                                          out.data_ptr() & 15))

    def _signal(self, stream, flag: str, pe: int) -> None:
        """Set my word of `flag` (``ready`` / ``freed``) on rank `pe` to 1, ordered on `stream` (step 2 / 4)."""
        h = self.rt.shim
        if self._peers[pe] is not None:    # this node: a stream write through the mapping
            so.check(h.ts_stream_write_u64(stream, self._flag_at[flag][pe], 1), "AGGemm", so.WRITE, stream,
                     self._flag_at[flag][pe], 1)
        else:                              # another node: NVSHMEM's signal (the word is 0: an add sets it)
            h.ts_signal_add_on_stream(self._flag_at[flag][pe], 1, pe, stream)

    def _split_of(self, m: int) -> list:
        """Per GEMM, the (slices, tail tiles) of a call of `m` rows per rank on a split grid (slices 1, tail 0: none
        split), () on a plain grid: its :func:`kernel_plan`, as a kernel built for those rows alone would split."""
        if not any(self._sizes):
            return self._sizes                           # (plain grids: () each)
        got = self._splits.get(m)
        if got is None:
            plans = [kernel_plan(a, self.world_size * m) if z else None for a, z in zip(self._job_args, self._sizes,
                                                                                         strict=True)]
            got = self._splits[m] = [((p.split, p.tail) if p.split > 1 else (1, 0)) if p else () for p in plans]
        return got

    def _tail(self, i: int, m: int) -> tuple:
        """The arguments of GEMM `i` (0: my rows, 1: the others') after C (and arrived) for a call of `m` rows per
        rank, as tilelang launches it: a split grid's workspace, slices and tail tiles; () for a plain grid."""
        return (*self._ws[i], *self._split_of(m)[i])

    def _gemm_own(self, a, b, c, stream) -> None:
        """Step 1: the GEMM of my rows (a: m rows, c: W x m), through its C entry point (raw pointers and ints: a
        split grid's workspace, slices and tail, the rows, its workspace's sizes, the stream last) or tilelang."""
        direct, m = self._direct_own, a.shape[0]
        if direct is None:
            self.kernel_own.launch(a, b, c.view(self.world_size, m, self.N), *self._tail(0, m))
        elif direct[0](a.data_ptr(), b.data_ptr(), c.data_ptr(), *self._tail_ptrs[0], *self._split_of(m)[0], m,
                       *self._sizes[0], stream):
            raise self.launch_error(direct)

    def _gemm_peers(self, b, c, stream) -> None:
        """Step 5: the GEMM of the other ranks' rows (``self.m`` per rank), as :meth:`_gemm_own`."""
        direct, m, W = self._direct, self.m, self.world_size
        if direct is None:
            self.kernel.launch(self.a_full.view(W, self.rows, self.K), b, c.view(W, m, self.N), self.arrived,
                               *self._tail(1, m))
        elif direct[0](self.a_full.data_ptr(), b.data_ptr(), c.data_ptr(), self.arrived.data_ptr(), *self._tail_ptrs[1],
                       *self._split_of(m)[1], self.rows, m, *self._sizes[1], stream):
            raise self.launch_error(direct)

    def __call__(self, a_local, b, out=None):
        m = self.begin(a_local, b, out)
        if not self.fused:
            return self._call_unfused(a_local, b, out)
        if profiling.current is not None:
            rec = profiling.call("AGGemm", "fused", M=self.M, N=self.N, K=self.K)
            if rec is not None:
                return self._call_steps(a_local, b, out, rec)
        rows = a_local.shape[0]                         # the call's rows per rank (<= self.rows)
        if out is None:
            import torch

            out = torch.empty(self.world_size * rows, self.N, dtype=self.dtype, device=a_local.device)
        if rows == 0:
            return out
        if self.world_size == 1:                        # 1 alone: nothing to gather
            self._last_a = a_local
            self._gemm_own(_tma_ready(a_local), b, out, m)
            return out
        if rows != self.m:                              # the copies' sizes (and the pulls' chunks) of these rows
            self._set_rows(rows)
        fn = self._stream_ops
        if fn is None:     # a shim without ts_stream_ops
            return self._call_steps(a_local, b, out, None)
        if self.protocol == "push":
            return self._call_push(fn, a_local, b, out, m)
        if a_local.is_contiguous() and not a_local.data_ptr() & 15:   # 2 and 4 in one shim call; a_local an op
            self._a_local_op.b = a_local.data_ptr()
            self._first.run(fn, m, "AGGemm")
            a = a_local
        else:                                           # 2 on the main stream: its waits, the copy by torch, the rest
            self._local_head.run(fn, m, "AGGemm")
            self._slot.copy_(a_local)
            self._local_tail.run(fn, m, "AGGemm")
            a = self._slot
        self._gemm_own(a, b, out, m)                                                           # 1
        self._pre.run(fn, m, "AGGemm")                                                         # 3
        self._gemm_peers(b, out, m)                                                            # 5
        self._post.run(fn, m, "AGGemm")                                                        # 6
        return out

    def _call_unfused(self, a_local, b, out):
        """NCCL's AllGather into the first W x m rows of a buffer of this op (M rows), then ``torch.matmul`` (the
        op's torch equivalent)."""
        import torch
        import torch.distributed as dist

        self.m = m = a_local.shape[0]
        if self._full is None:
            self._full = torch.empty(self.M, self.K, dtype=self.dtype, device=a_local.device)
        full = self._full[:self.world_size * m]       # a call of m rows per rank: W x m rows, contiguous
        if m:
            dist.all_gather_into_tensor(full, a_local.contiguous())
        return torch.matmul(full, b, out=out)

    def _push_source(self, a_local):
        """The rows a push call sends and its first GEMM reads: `a_local` itself when the copy engines and TMA can
        read it (contiguous, 16-byte aligned; gathered() copies it into my rows of A_full later), else my rows of
        A_full, filled from it by torch on the main stream first."""
        if a_local.is_contiguous() and not a_local.data_ptr() & 15:
            self._last_a, self._slot_stale = a_local, True
            return a_local
        self._slot.copy_(a_local)
        self._last_a, self._slot_stale = None, False
        return self._slot

    def _call_push(self, fn, a_local, b, out, m):
        """A call of the push protocol (module docstring, "Push"): its programs and the two GEMMs."""
        a = self._push_source(a_local)
        base = a.data_ptr()
        for (op, _, _), off in zip(self._push_ops, self._push_from, strict=True):
            op.b = base + off
        self._first.run(fn, m, "AGGemm")                                                       # 1-3
        self._gemm_own(a, b, out, m)                                                           # 4
        self._gemm_peers(b, out, m)                                                            # 5
        self._post.run(fn, m, "AGGemm")                                                        # 6
        return out

    def _call_steps(self, a_local, b, out, rec):
        """A call step by step from Python (one torch / shim call per operation, the order of ``_plan``'s
        programs): the profiled call (`rec`: the profiler's hooks between the copies and around the GEMMs)."""
        import torch

        main = torch.cuda.current_stream()
        W, r, shim, m = self.world_size, self.rank, self.rt.shim, a_local.shape[0]
        c = out if out is not None else torch.empty(W * m, self.N, dtype=self.dtype, device=a_local.device)
        direct = a_local.is_contiguous() and not a_local.data_ptr() & 15
        if m == 0:
            return c
        if W > 1 and m != self.m:
            self._set_rows(m)
        c3 = c.view(W, m, self.N)                    # as the kernels see C: a tile stores its rank's rows only
        tiles = ([kernel_plan(a, W * m).blocks for a in self._job_args] + [0] * (2 - len(self._job_args))
                 if rec is not None else [0, 0])       # (blocks of this call: one record each)

        def gemm(kernel, prof, tiles, args, end):
            if rec is None:
                kernel.launch(*args)
            else:  # LAUNCH (+ KERNEL, and WAIT/TILE from the instrumented kernel) events
                rec.launcher(kernel, instrumented=prof, tiles=tiles, end=end)(*args)

        prof = self.kernels_prof or [None, None]
        if W == 1:                                                           # 1 alone
            self._last_a = a_local
            gemm(self.kernel_own, prof[0], tiles[0], (_tma_ready(a_local), b, c3, *self._tail(0, m)), True)
            return c
        if self.protocol == "push":
            return self._push_steps(a_local, b, c, rec, gemm, prof, tiles)
        a_full = self.a_full
        peers = [(r + j) % W for j in range(1, W)]
        local = self.streams[-1]
        chunks = self.chunk_rows(m)

        # the slots of the programs that the fast path would run (the same waits on the same streams): bounded alike
        watch = {k: v for p in ((self._first,) if direct else (self._local_head, self._local_tail))
                 for k, v in p.watches.items()}

        def wait(h, flag, q, at):     # wait for my flag `flag` of rank q (at `at`) to be 1, then reset it
            so.check(shim.ts_stream_wait_geq_u64(h, at, 1, watch.get(_label(flag, q))), "AGGemm", so.WAIT_GEQ, h,
                     at, 1, label=_label(flag, q))
            so.check(shim.ts_stream_write_u64(h, at, 0), "AGGemm", so.WRITE, h, at)

        def local_steps(s2):                                                 # 2
            h2 = s2.cuda_stream
            for q in peers:
                wait(h2, "freed", q, self._freed_here[q])
            with torch.cuda.stream(s2):
                self._slot.copy_(a_local)
            for q in peers:
                self._signal(h2, "ready", q)
            self._copied.record(s2)

        def begin():                                                         # 4
            self._start.record(main)
            for j, src in enumerate(peers):
                s = self.streams[j]
                s.wait_event(self._start)
                if j:
                    s.wait_event(self._pulled[j - 1])
                h = s.cuda_stream
                with torch.cuda.stream(s):
                    if rec is not None:
                        rec.copies_begin(s, src)
                    wait(h, "ready", src, self._ready_here[src])
                    lo, peer = src * self.rows, self._peers[src]
                    for ch, (first, n) in enumerate(chunks):
                        rows = slice(lo + first, lo + first + n)
                        if not n:          # past the call's rows: nothing to pull (the flag is set all the same)
                            pass
                        elif peer is not None:
                            a_full[rows].copy_(peer[rows], non_blocking=True)
                        else:   # the same rows of the peer's buffer (symmetric: one address on every rank)
                            chunk = a_full[rows]
                            shim.ts_getmem_on_stream(chunk.data_ptr(), chunk.data_ptr(), chunk.nbytes, src, h)
                        at = self._arrived_at[src * self.slots + ch]
                        so.check(shim.ts_stream_write_u64(h, at, 1), "AGGemm", so.WRITE, h, at, 1)
                        if rec is not None:
                            rec.copy_done(s, src, ch, a_full[rows].nbytes)
                    if j < W - 2:
                        self._pulled[j].record(s)
                    self._signal(h, "freed", src)
                if self._pull_first[src]:
                    self._joins[j].record(s)

        if direct:
            begin()
            local.wait_event(self._start)
            local_steps(local)
        else:
            local_steps(main)
            begin()
        gemm(self.kernel_own, prof[0], tiles[0], (a_local if direct else self._slot, b, c3, *self._tail(0, m)),
             False)                                                          # 1
        main.wait_event(self._copied)                                        # 3
        for j, src in enumerate(peers):
            if self._pull_first[src]:
                main.wait_event(self._joins[j])
        gemm(self.kernel, prof[1], tiles[1],
             (a_full.view(W, self.rows, self.K), b, c3, self.arrived, *self._tail(1, m)), True)      # 5
        for j, s in enumerate(self.streams):                                 # 6
            self._joins[j].record(s)
            main.wait_event(self._joins[j])
        self.arrived.zero_()
        return c

    def _push_steps(self, a_local, b, c, rec, gemm, prof, tiles):
        """The push protocol's call step by step (:meth:`_call_steps`; `tiles`: the blocks of each GEMM for this
        call)."""
        import torch

        main, s, shim = torch.cuda.current_stream(), self.streams[0], self.rt.shim
        W, r, rows = self.world_size, self.rank, self.rows
        m = a_local.shape[0]
        chunks, c3 = self.chunk_rows(m), c.view(W, m, self.N)     # (C as the kernels see it)
        a = self._push_source(a_local)
        self._start.record(main)                                                            # 1
        s.wait_event(self._start)
        h = s.cuda_stream
        for j in range(1, W):                                                               # 2, 3
            dst = (r - j) % W
            at = self._freed_here[dst]
            so.check(shim.ts_stream_wait_geq_u64(h, at, 1, self._first.watches.get(_label("freed", dst))), "AGGemm",
                     so.WAIT_GEQ, h, at, 1, label=_label("freed", dst))
            so.check(shim.ts_stream_write_u64(h, at, 0), "AGGemm", so.WRITE, h, at)
            with torch.cuda.stream(s):
                if rec is not None:
                    rec.copies_begin(s, dst, "to")
                for ch, (lo, n) in enumerate(chunks):
                    if n:      # past the call's rows: nothing to push (the flag is set all the same)
                        self._peers[dst][r * rows + lo:r * rows + lo + n].copy_(a[lo:lo + n], non_blocking=True)
                    at = self._arrived_on[dst] + 8 * ch
                    so.check(shim.ts_stream_write_u64(h, at, 1), "AGGemm", so.WRITE, h, at, 1)
                    if rec is not None:
                        rec.copy_done(s, dst, ch, n * self.K * a.element_size())
        self._joins[0].record(s)
        gemm(self.kernel_own, prof[0], tiles[0], (a, b, c3, *self._tail(0, m)), False)            # 4
        gemm(self.kernel, prof[1], tiles[1],
             (self.a_full.view(W, rows, self.K), b, c3, self.arrived, *self._tail(1, m)), True)      # 5
        main.wait_event(self._joins[0])                                                     # 6
        self.arrived.zero_()
        for q in range(W):
            if q != r:
                at = self._flag_at["freed"][q]
                so.check(shim.ts_stream_write_u64(main.cuda_stream, at, 1), "AGGemm", so.WRITE, main.cuda_stream, at, 1)
        return c


def _label(flag: str, q: int) -> tuple:
    """The label of a stream wait for my flag `flag` (``ready`` / ``freed``) of rank `q`, which rank q sets: what the
    record of a wait that did not end within TILESCALE_WAIT_TIMEOUT_S names (tilescale/runtime/stream_waits.py)."""
    return ("AGGemm", f"{flag}[{q}]", q)


def _tma_ready(a):
    """`a` itself when TMA can load it (contiguous, 16-byte aligned), else a copy that is (a new allocation is
    aligned; ``contiguous()`` alone would return a misaligned contiguous tensor as it is)."""
    if a.is_contiguous():
        return a if not a.data_ptr() & 15 else a.clone()
    return a.contiguous()


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size, config):
    return AGGemm(M, N, K, dtype, config=config, split=False)   # plain grids: ops of one config share kernels


_fn_check = checks.CallCheck("ag_gemm")


def _validate_fn(a_local, b) -> None:
    checks.check_tensor("ag_gemm", "a_local", a_local, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("ag_gemm", "b", b, dtype=a_local.dtype, min_dims=2)
    if a_local.dim() != 2 or b.dim() != 2 or a_local.shape[1] != b.shape[0]:
        checks.fail("ag_gemm", "b", checks.describe(b), f"a 2-D ({a_local.shape[-1]}, N) tensor for a_local "
                    f"{tuple(a_local.shape)} (2-D operands, inner sizes equal)")


def ag_gemm(a_local, b, *, return_gathered: bool = False):
    """``all_gather(a_local) @ b`` (see :class:`AGGemm`); builds and caches the op per (N, K, dtype, config).

    Any number of rows, run as they are by an op of a bound of rows per rank (tilescale.ops.op_cache.cached_op: the
    rows rounded up to a power of two, or a larger op cached with the same config); ops of one config share
    their kernels, so new rows build nothing unless the tuning table picks another config for their bound (plain
    grids: no split of the last wave). ``return_gathered=True`` returns
    ``(c, all_gather(a_local))`` (the gathered A, a copy: the op's buffer is reused by its next call)."""
    from .. import runtime

    _fn_check((checks.signature(a_local), checks.signature(b)), _validate_fn, a_local, b)
    W = runtime.current().info.world_size
    (rows, K), N = a_local.shape, b.shape[1]
    op = op_cache.cached_op(_cached, rows, N, K, a_local.dtype, W, "ag_gemm")
    c = op(a_local, b)
    if not return_gathered:
        return c
    g = op.gathered()   # a copy of its slots' rows when fused at fewer rows than the bound; else the op's own
    return c, (g if W > 1 and op.fused and op.m != op.rows else g.clone())
