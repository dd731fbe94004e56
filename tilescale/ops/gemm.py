"""The Hopper GEMM tile loop shared by the fused kernels (TMA + wgmma, warp-specialised by tilelang).

A kernel built on it allocates its tiles with :func:`tile_buffers` and computes one output tile with
:func:`tile_loop` (both ``T.macro``); AG+GEMM, GEMM+RS and the GEMM benchmarks only change which tile a
block computes, what it waits for before (gathered rows: a wait per chunk) and what it signals after
(partials: a completion count). The tile configuration is chosen per problem by :func:`gemm_config`:

1. the tuning table ``gemm_tuning.json`` next to this file (written by
   ``benchmarks/bench_gemm_configs.py --write-tuning``): per measured GEMM shape (and op) and GPU model
   (an entry's ``gpu``: ``torch.cuda.get_device_name()`` of the sweep; an entry without one matches any
   GPU), the configs ranked by measured time. Among the entries of this process's GPU, the exact shape's
   first config that the op can run (:func:`check`) wins;
2. for a shape they do not list: the entry of the same op with the same N and K and the nearest M;
3. when this GPU's entries give nothing by 1-2 (a GPU never swept, or a shape swept on other GPUs only):
   rules 1-2 over the entries of every GPU, ties going to the GPU listed first in the file. Without a
   visible GPU (CI, compile-only builds) this is the only step: kernels compiled there follow the first
   GPU's entries (in the shipped table, the H200's);
4. else (or when no listed config can run) :data:`DEFAULT`, 128x256x64, 3 stages, 256 threads:
   681-695 TFLOP/s on H200 for bf16 8192^3.

Shapes that are not multiples of the tile are fine for the GEMM itself (the grid rounds up, TMA clips the
edges); the fused ops add their own constraints (:func:`check`).
"""
import functools
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tilescale.language as T

TUNING_FILE = Path(__file__).with_name("gemm_tuning.json")
SMEM_LIMIT = 232448        # bytes of shared memory one block may use on H100 / H200 (227 KiB)
OPS = ("ag_gemm", "gemm_rs", "gemm_rs_push")   # gemm_rs: its pull path's GEMM; gemm_rs_push: its push kernel
SUM_IN_PAD = 8   # elements of padding per row of the push kernel's tile of partial sums (against bank conflicts)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    threads: int = 256    # consumer threads (warpgroups of 128); tilelang adds one producer warpgroup
    swizzle: int = 10     # panel width of T.use_swizzle (rows of tiles), 0 = tiles in launch order

    def smem_bytes(self, elem_bytes: int = 2, sum_in: bool = False) -> int:
        """Shared memory of the tile loop: `stages` A and B tiles; the C tile reuses them. `sum_in`: plus GEMM+RS's
        push kernel's tile of partial sums, a buffer of its own (live through the loop), rows padded."""
        stages = self.stages * (self.block_m * self.block_k + self.block_k * self.block_n)
        if sum_in:
            return (stages + self.block_m * (self.block_n + SUM_IN_PAD)) * elem_bytes
        return max(stages, self.block_m * self.block_n) * elem_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GemmConfig":
        names = {f.name for f in fields(cls)}
        extra = set(d) - names
        if extra:
            raise ValueError(f"GemmConfig: unknown field(s) {sorted(extra)}, expected some of {sorted(names)}")
        bad = {k: v for k, v in d.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0}
        if bad:
            raise ValueError(f"GemmConfig: got {bad}, expected non-negative ints")
        return cls(**d)

    def short(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} s{self.stages} t{self.threads}"
                f"{' sw' + str(self.swizzle) if self.swizzle else ' nosw'}")


DEFAULT = GemmConfig()


# ------------------------------------------------------------------------------------- the tile loop
@T.macro
def tile_buffers(block_m: int, block_n: int, block_k: int, dtype: str, swizzle: int):
    """The tiles of one block: A and B tiles in shared memory (the pipeline's stages are added by
    ``T.Pipelined``), the fp32 accumulator in registers and the C tile in shared memory; blocks launched
    in panels of `swizzle` rows of tiles (0: launch order) for L2 reuse. Returns (A tile, B tile,
    accumulator, C tile)."""
    As = T.alloc_shared((block_m, block_k), dtype)
    Bs = T.alloc_shared((block_k, block_n), dtype)
    Cl = T.alloc_fragment((block_m, block_n), "float32")
    Cs = T.alloc_shared((block_m, block_n), dtype)
    T.use_swizzle(panel_size=max(swizzle, 1), enable=swizzle > 0)
    return As, Bs, Cl, Cs


# NOTE [registers]: a kernel whose grid is sized at run time (a call's rows) computes each block's tile, rank and
# slice once into 32-bit registers (a local buffer), read through names bound before the pipelined loop. As
# expressions of the run-time sizes they are computed at every use: in each TMA load of the producer's loop (nvcc
# does not hoist a division by a run-time value) and, in 64 bits, at each element of a split tile's fix-up (AG+GEMM:
# 10,000 instructions, not 1,700, spills, 1.25-1.8x the static kernel's time on 2 H200s). The epilogue must read
# each name the producer reads: else tilelang gives the producer an uninitialised copy of the buffer.
@T.macro
def main_loop(A, B, As, Bs, Cl, rb, bx, stages: int, k_first=0, k_count=None, a_src=None):
    """``Cl = A[rb, :] @ B[:, bx]`` in the accumulator, for tiles of (block_m, block_n) given by the buffers of
    :func:`tile_buffers`: TMA loads of A and B tiles in a `stages`-deep pipeline over K, wgmma. `k_first`,
    `k_count` (K tiles of block_k; None: all): one slice of K instead (:func:`split_tile_loop`). `a_src`: A is
    3-D (ranks, rows, K), the tile's rows those of rank `a_src` (rows past a rank's end: TMA loads zeros)."""
    block_m, block_k = As.shape
    block_n = Bs.shape[1]
    T.clear(Cl)
    for ko in T.Pipelined(T.ceildiv(A.shape[-1], block_k) if k_count is None else k_count, num_stages=stages):
        if a_src is None:
            T.copy(A[rb * block_m, (k_first + ko) * block_k], As)
        else:
            T.copy(A[a_src, rb * block_m, (k_first + ko) * block_k], As)
        T.copy(B[(k_first + ko) * block_k, bx * block_n], Bs)
        T.gemm(As, Bs, Cl)


@T.macro
def store_tile(Cs, C, rb, bx, disable_tma: bool = False, c_src=None):
    """The C tile in shared memory into ``C[rb, bx]`` (tiles of Cs's shape): one TMA store (plain vector stores by
    every thread with `disable_tma`). `c_src`: C is 3-D (ranks, rows, N), the tile in rank `c_src`'s rows (rows past
    its end are not written: TMA clips at the view's bounds)."""
    block_m, block_n = Cs.shape
    if c_src is None:
        T.copy(Cs, C[rb * block_m, bx * block_n], disable_tma=disable_tma)
    else:
        T.copy(Cs, C[c_src, rb * block_m, bx * block_n], disable_tma=disable_tma)


@T.macro
def tile_loop(A, B, C, As, Bs, Cl, Cs, rb, bx, stages: int, disable_tma: bool, c_rb=None, a_src=None, c_src=None):
    """``C[c_rb, bx] = A[rb, :] @ B[:, bx]`` in tiles of (block_m, block_n) given by the buffers of
    :func:`tile_buffers` (`c_rb` None: `rb`): :func:`main_loop`, then the tile through shared memory to C
    (:func:`store_tile`). `a_src`, `c_src`: the rank of A's, C's rows when they are 3-D (ranks, rows, columns)."""
    main_loop(A, B, As, Bs, Cl, rb, bx, stages, a_src=a_src)
    T.copy(Cl, Cs)
    store_tile(Cs, C, rb if c_rb is None else c_rb, bx, disable_tma, c_src)


# ---------------------------------------------------------------- the last wave's tiles split along K
# A grid of T tiles on S SMs runs ceil(T / S) waves, the last one partly empty: 8192x2752 in 128x256 tiles is 704
# tiles, 5.33 waves on 132 SMs, so the sixth wave runs 44 tiles on a third of the GPU for a whole tile's time. Split
# those tail tiles along K into `split` slices each (44 x 3 = 132 blocks, one wave of a third of the time): slices
# 0 .. split-2 of a tile add their fp32 partial sums to a workspace and count them; its last slice waits for the
# count, adds the partial sums to its own in slice order (the same bits every call) and stores the tile.
SPLIT_COST = 0.08     # a slice's time beyond its share of K, in tile times (its prologue, epilogue and fix-up)
SPLIT_PENALTY = 0.025  # a split grid's time beyond the plain grid's, all tiles alike (a 1-D grid: 1-3%)
SPLIT_MIN_GAIN = 0.02  # split only when the model says the kernel gets at least this much faster
SPLIT_MAX = 8


@dataclass(frozen=True)
class SplitPlan:
    """How a grid of `tiles` tiles runs on `sms` SMs: tiles ``0 .. full - 1`` whole, one block each; each of the
    ``tiles - full`` tail tiles as `split` blocks, one per slice of K (split 1: no tail split, a plain grid)."""

    tiles: int
    full: int
    split: int

    @property
    def tail(self) -> int:
        return self.tiles - self.full

    @property
    def blocks(self) -> int:
        return self.full + self.tail * self.split


def split_plan(tiles: int, sms: int, k_tiles: int, *, min_gain: float = SPLIT_MIN_GAIN) -> SplitPlan:
    """Whether and how to split the last wave of a grid of `tiles` tiles (each `k_tiles` K tiles long) on `sms`
    SMs. The model, in tile times: the plain grid takes ceil(tiles / sms) waves; a split one
    ``(full waves + ceil(tail x split / sms) x (1 / split + SPLIT_COST)) x (1 + SPLIT_PENALTY)``; the best split
    (2 .. SPLIT_MAX, each slice at least 4 K tiles) is taken when it saves at least `min_gain` of the plain
    grid's time (1 x H100: 8192x2752x4096 in 128x256 tiles, 44 tail tiles in 3 slices, 0.92 -> 0.96 of
    cuBLAS; tails of 76 tiles in 3 or 20 in 6, which the model refuses, gained -2% to +1%)."""
    if min(tiles, sms, k_tiles) < 1:
        raise ValueError(f"split_plan: tiles={tiles}, sms={sms}, k_tiles={k_tiles}: expected positive ints")
    waves, tail = divmod(tiles, sms)
    plain = waves + (tail > 0)
    best, best_split = float(plain), 1
    for s in range(2, SPLIT_MAX + 1):
        if k_tiles < 4 * s:
            break
        t = (waves + math.ceil(tail * s / sms) * (1.0 / s + SPLIT_COST)) * (1.0 + SPLIT_PENALTY)
        if t < best:
            best, best_split = t, s
    if tail == 0 or best_split == 1 or best > plain * (1.0 - min_gain):
        return SplitPlan(tiles, tiles, 1)
    return SplitPlan(tiles, tiles - tail, best_split)


def tile_order(t, tiles_m: int, tiles_n: int, swizzle: int):
    """(row, column) of tiles of the `t`-th tile in the order :func:`tile_buffers` launches blocks: panels of
    `swizzle` rows of tiles (the last panel: the rows left), column by column inside a panel, odd panels from the
    last column back (tilelang's ``T.use_swizzle``, row rasterisation); `swizzle` 0: row by row. For 1-D grids
    (persistent and split kernels), which launch tiles in the same order as the plain 2-D grid."""
    if isinstance(swizzle, int) and swizzle <= 0:
        return t // tiles_n, t % tiles_n
    group = swizzle * tiles_n
    panel = t // group
    rows = T.min(swizzle, tiles_m - panel * swizzle)
    r = t % group
    col = r // rows
    return panel * swizzle + r % rows, T.if_then_else(panel % 2 == 1, tiles_n - 1 - col, col)


def even_panel(rows, swizzle: int):
    """The largest panel height <= `swizzle` that divides `rows` rows of tiles into equal panels (0: 0), for
    :func:`tile_order` over few rows: 16 rows in panels of 10 and 6 ran GEMM+RS's persistent kernel at half speed,
    in panels of 8 at full. `rows` an int, or an expression (then so is the panel)."""
    if swizzle <= 0:
        return 0
    if isinstance(rows, int):
        return max(p for p in range(1, swizzle + 1) if rows % p == 0)
    panel = 1
    for p in range(2, swizzle + 1):
        panel = T.if_then_else(rows % p == 0, p, panel)
    return panel


def split_block(b, plan: SplitPlan, k_tiles: int, full=None, slices=None):
    """(tile, slice, first K tile, K tiles) of block `b` of a :class:`SplitPlan`'s grid (expressions); `full`,
    `slices` (None: ``plan.full``, ``plan.split``): its whole tiles, a tail tile's slices (expressions or ints)."""
    full = plan.full if full is None else full
    slices = plan.split if slices is None else slices
    tail = b >= full
    s = T.if_then_else(tail, (b - full) % slices, 0)
    t = T.if_then_else(tail, full + (b - full) // slices, b)
    k0 = s * k_tiles // slices
    return t, s, T.if_then_else(tail, k0, 0), T.if_then_else(tail, (s + 1) * k_tiles // slices - k0, k_tiles)


def split_sizes(plans) -> tuple:
    """(work tiles, words) of a workspace for every split grid of `plans`: ``tail x (split - 1)``, tail (>= 1)."""
    return max([p.tail * (p.split - 1) for p in plans] + [1]), max([p.tail for p in plans if p.split > 1] + [1])


def split_buffers(plan: SplitPlan, block_m: int, block_n: int):
    """A split grid's fix-up parameters (:func:`split_workspace`): `work` (fp32 partial sums, ``tail x (split - 1)``
    tiles), `arrived`, `fixed` (a word per tail tile: the slices' counts, the part of them fix-ups took; zeroed)."""
    tiles, words = split_sizes([plan])
    return T.Tensor((tiles, block_m, block_n), "float32"), T.Tensor((words,), "uint64"), T.Tensor((words,), "uint64")


def split_workspace(sizes, block_m: int, block_n: int, device=None) -> tuple:
    """torch tensors for :func:`split_buffers`' parameters (counts zeroed), of a plan or (tiles, words) sizes."""
    import torch

    tiles, words = split_sizes([sizes]) if isinstance(sizes, SplitPlan) else sizes
    counts = [torch.zeros(words, dtype=torch.uint64, device=device) for _ in range(2)]
    return (torch.empty(tiles, block_m, block_n, dtype=torch.float32, device=device), *counts)


@T.macro
def split_tile_loop(A, B, C, As, Bs, Cl, Cs, work, arrived, fixed, rb, bx, t, s, k0, kn, plan: SplitPlan,
                    stages: int, warps: int, c_rb=None, full=None, a_src=None, c_src=None, slices=None):
    """:func:`tile_loop` for block (tile `t`, slice `s`, K tiles ``k0 .. k0 + kn``) of a :class:`SplitPlan`'s grid.
    A whole tile (t < full): as tile_loop. A tail tile (index i = t - full) in `slices` slices, its signal protocol:

    1. slice s < slices - 1: its partial sum (fp32, from the registers) into tile ``i x (slices - 1) + s`` of
       `work`; each consumer warp then adds 1 to ``arrived[i]``, a release at GPU scope (``T.release_stores``);
    2. the last slice: waits until ``arrived[i] >= fixed[i] + (slices - 1) x warps`` (this call's counts on top of
       the calls' before), adds the other slices' partial sums to its own in slice order, stores as tile_loop does;
    3. thread 0 of the last slice then adds ``(slices - 1) x warps`` to ``fixed[i]``, after the tile's store has
       been issued, when every consumer thread has passed step 2's wait (the store follows a barrier of them all).

    torch: ``C[tile] = sum(A[rows, k_slice] @ B[k_slice, cols] for k_slice in slices)`` (fp32, slice order).

    `full`, `slices` (None: ``plan.full``, ``plan.split``): expressions when the grid is planned per call. A tail tile's
    counts grow in the calls that split it, by their own slices. `a_src`, `c_src`: as :func:`tile_loop`'s."""
    block_m, block_n = Cs.shape
    k_tiles = T.ceildiv(A.shape[-1], As.shape[1])
    main_loop(A, B, As, Bs, Cl, rb, bx, stages, k0, kn, a_src)
    first_tail = plan.full if full is None else full
    slices = plan.split if slices is None else slices
    per_call = T.cast((slices - 1) * warps, "uint64")
    # indices clamped to the workspace (no-ops where used: bounds proven, no check per element); a block's part told
    # by its K tiles (whole: all of K; a slice but the last: ends before K's end), as the producer reads them
    i = T.min(T.max(t - first_tail, 0), arrived.shape[0] - 1)
    if k0 + kn < k_tiles:
        T.copy(Cl, work[T.min(T.max(i * (slices - 1) + s, 0), work.shape[0] - 1), 0, 0])
        T.release_stores(arrived[i], 1, scope="gpu")
    else:
        if kn < k_tiles:
            T.wait_until(arrived[i], cmp="ge", value=fixed[i] + per_call)
            for j in T.serial(slices - 1):
                w = T.min(T.max(i * (slices - 1) + j, 0), work.shape[0] - 1)
                for y, x in T.Parallel(block_m, block_n):
                    Cl[y, x] += work[w, y, x]
        T.copy(Cl, Cs)
        store_tile(Cs, C, rb if c_rb is None else c_rb, bx, False, c_src)
        if kn < k_tiles:
            if T.get_thread_binding() == 0:
                fixed[i] = fixed[i] + per_call


def check_problem(op: str, M, N, K, dtype, config, k_name: str) -> None:
    """The construction checks shared by the fused ops (AGGemm, GemmRS): positive int sizes, a GEMM dtype
    (bf16, fp16), a GemmConfig or None; `op` names the op in messages, `k_name` its K."""
    from . import checks

    for name, v in (("M", M), ("N", N), (k_name, K)):
        checks.as_int(op, name, v)
    checks.as_dtype(op, "dtype", dtype, checks.GEMM_DTYPES, note=" (the Hopper wgmma GEMM)")
    if config is not None and not isinstance(config, GemmConfig):
        checks.fail(op, "config", checks.describe(config), "a tilescale.ops.gemm.GemmConfig (or None: tuned)",
                    type_error=True)


ROW_TILE = 128   # the least bound of rows per rank of the cached fused ops (the GEMM's block_m)


def padded_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of :data:`ROW_TILE` (the rows per rank a bound's config is chosen for)."""
    return -(-rows // ROW_TILE) * ROW_TILE


def check(cfg: GemmConfig, M: int, N: int, K: int, *, world_size: int = 1, op: str | None = None,
          elem_bytes: int = 2) -> str | None:
    """Why `cfg` cannot compute this (M, N, K) problem inside `op` (one of :data:`OPS`, or None for the
    plain GEMM), or None when it can. (M, N, K) is the GEMM as the op runs it on one rank: for gemm_rs, K is
    the local K."""
    if op is not None and op not in OPS:
        raise ValueError(f"op: got {op!r}, expected one of {OPS} or None")
    if min(cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages) < 1:
        return f"tile sizes and stages must be positive ({cfg.short()})"
    if cfg.threads < 128 or cfg.threads % 128:
        return f"threads={cfg.threads}: expected whole warpgroups (a multiple of 128)"
    if cfg.block_m % 64 or cfg.block_n % 8 or cfg.block_k % 16:
        return "block_m must be a multiple of 64, block_n of 8 and block_k of 16 (wgmma shapes)"
    smem = cfg.smem_bytes(elem_bytes, sum_in=op == "gemm_rs_push" and world_size > 1)
    if smem > SMEM_LIMIT:
        return f"needs {smem} bytes of shared memory, more than {SMEM_LIMIT}"
    if op is not None and M % (world_size * cfg.block_m):
        return f"M={M} is not a multiple of world_size x block_m = {world_size} x {cfg.block_m}"
    if op in ("gemm_rs", "gemm_rs_push") and N % cfg.block_n:
        return f"N={N} is not a multiple of block_n={cfg.block_n} (completion counts are per whole tile)"
    if op == "gemm_rs_push" and world_size > 1 and cfg.threads > 256:
        return (f"threads={cfg.threads}: the push kernel multiplies with 1 or 2 warpgroups (128 or 256 threads: each "
                "takes 232 registers beside its warpgroup of loads and sums)")
    return None


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> tuple:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a GEMM tuning table (expected {{'format': 1, 'entries': [...]}})")
    entries = []
    for i, e in enumerate(data["entries"]):
        gpu = e.get("gpu")
        if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
            raise ValueError(f"{path}: entries[{i}].gpu: got {gpu!r}, expected a non-empty string "
                             "(torch.cuda.get_device_name() of the sweep) or no 'gpu' (any GPU)")
        cfgs = tuple(GemmConfig.from_dict(c) for c in e["configs"])
        entries.append((e.get("op"), int(e["M"]), int(e["N"]), int(e["K"]), cfgs, gpu))
    return tuple(entries)


def load_table(path=None) -> tuple:
    """Entries (op, M, N, K, ranked configs, gpu) of a tuning table, in file order (gpu None: an entry of any
    GPU); () when the file does not exist."""
    p = str(path or TUNING_FILE)
    try:
        mtime = os.stat(p).st_mtime_ns
    except FileNotFoundError:
        return ()
    return _load(p, mtime)


def _first_valid(cfgs, M, N, K, world_size, op):
    return next((c for c in cfgs if check(c, M, N, K, world_size=world_size, op=op) is None), None)


@functools.lru_cache(maxsize=16)
def _device_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def current_gpu() -> str | None:
    """``torch.cuda.get_device_name()`` of this process's CUDA device, read when called (cached per device
    index); None when torch is missing or sees no GPU (CI, compile-only builds), never an error."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return _device_name(torch.cuda.current_device())
    except Exception:  # noqa: BLE001
        return None


def _gpu_ranks(entries, gpu: str | None) -> dict:
    """Preference among the entries' ``gpu`` values (lower first): with `gpu` given, its own entries, then
    those of any GPU (no ``gpu``), then the other GPUs in file order; with None, every value in file order."""
    order = [gpu, None] if gpu is not None else []
    for e in entries:
        if e[5] not in order:
            order.append(e[5])
    return {g: i for i, g in enumerate(order)}


def _select(entries, ranks: dict, M, N, K, world_size, op) -> GemmConfig | None:
    """Rules 1-2 of the module docstring over `entries`: the exact shape's first config the op can run, else
    the same op's with the same N and K and the nearest M; ties to this op's entries, then to the lower
    rank of `ranks` (by ``gpu``). None when none of them gives a config."""
    same_op = [e for e in entries if e[0] in (op, None)] if op is not None else list(entries)
    exact = [e for e in same_op if (e[1], e[2], e[3]) == (M, N, K)]
    near = [e for e in same_op if (e[2], e[3]) == (N, K)]
    for e in (sorted(exact, key=lambda e: (e[0] != op, ranks[e[5]])) +
              sorted(near, key=lambda e: (abs(math.log2(e[1]) - math.log2(max(M, 1))), e[0] != op, ranks[e[5]]))):
        c = _first_valid(e[4], M, N, K, world_size, op)
        if c is not None:
            return c
    return None


def gemm_config(M: int, N: int, K: int, *, world_size: int = 1, op: str | None = None, table=None,
                gpu: str | None = None) -> GemmConfig:
    """The tile configuration for an (M, N, K) GEMM run by `op` on `world_size` ranks (see the module
    docstring for the rule). `table`: a tuning-table path instead of the shipped one. `gpu`: the GPU model
    whose entries come first (``torch.cuda.get_device_name()``); None: this process's GPU
    (:func:`current_gpu`), or, without one, every GPU's entries in file order."""
    entries = load_table(table)
    gpu = gpu if gpu is not None else current_gpu()
    if gpu is not None:                                      # rules 1-2 over this GPU's (and untagged) entries
        c = _select([e for e in entries if e[5] in (gpu, None)], _gpu_ranks(entries, gpu), M, N, K, world_size, op)
        if c is not None:
            return c
    c = _select(entries, _gpu_ranks(entries, None), M, N, K, world_size, op)   # rule 3: every GPU, file order
    return DEFAULT if c is None else c


def problem_config(M: int, N: int, K: int, *, world_size: int, op: str, config: GemmConfig | None = None) -> GemmConfig:
    """The configuration `op` runs this problem with: `config`, or else the tuned one (:func:`gemm_config`);
    a ValueError naming M or config when it cannot run it. The fused ops' kernels take the rows per rank at run
    time: M is the bound of their rows, any multiple of the world size, the config chosen (and checked) for the
    rows per rank rounded up to a whole tile."""
    if op in OPS:        # (the fused ops' kernels take the rows at run time)
        if M % world_size:
            raise ValueError(f"M: got {M}, expected a multiple of world_size = {world_size} (the bound of rows per "
                             "rank times the ranks)")
        rows = M // world_size
        config = config or gemm_config(world_size * padded_rows(rows), N, K, world_size=world_size, op=op)
        M = world_size * max(1, -(-rows // config.block_m)) * config.block_m
    cfg = config or gemm_config(M, N, K, world_size=world_size, op=op)
    if M % (world_size * cfg.block_m):
        raise ValueError(f"M: got {M}, expected a multiple of world_size x block_m = {world_size} x {cfg.block_m}")
    why = check(cfg, M, N, K, world_size=world_size, op=op)
    if why:
        raise ValueError(f"config: got {cfg}, which cannot run this problem: {why}")
    return cfg


def tuning_table(sweep: dict, keep: int = 6) -> dict:
    """The tuning table (:data:`TUNING_FILE`'s format) of a sweep's JSON (benchmarks/bench_gemm_configs.py):
    per (op, M, N, K), the configs in order of measured time (at most `keep`, the default config always
    kept if it was timed, so that a shape never gets something slower than the default); per-W constraints
    are applied at selection. Every entry carries the sweep's ``gpu`` (none when the sweep names none: an
    entry of any GPU); the table's ``source`` names the GPU and date."""
    gpu = sweep.get("gpu")
    entries = {}
    for r in sweep["rows"]:
        key = (r["op"], r["M"], r["N"], r["K"])
        if key in entries or not r["ranked"]:
            continue   # the same GEMM at another W: the ranking is the same (constraints differ, not times)
        ranked = r["ranked"]
        top = ranked[:keep] + [x for x in ranked[keep:] if x["config"] == DEFAULT.to_dict()]
        entries[key] = dict(op=r["op"], **({"gpu": gpu} if gpu else {}), M=r["M"], N=r["N"], K=r["K"],
                            configs=[x["config"] for x in top], tflops=[round(x["tflops"], 1) for x in top],
                            cublas_tflops=round(r["cublas_tflops"], 1))
    # configs that did not fit some W (e.g. block_m 256 when M / W is not a multiple) stay listed: the
    # selection skips them for that W and takes the next one
    return dict(format=1, source=f"benchmarks/bench_gemm_configs.py on {gpu or '?'}, {sweep.get('date', '?')}",
                entries=list(entries.values()))


def merge_tables(old: dict, new: dict, legacy_gpu: str | None = None) -> dict:
    """`old` tuning table with the entries of `new` (one GPU's, :func:`tuning_table`), GPU by GPU in `old`'s
    order: `new`'s GPU's entries replace `old`'s of that GPU where those were (appended when `old` has none);
    every other GPU's entries are kept. `old`'s entries without ``gpu`` are tagged `legacy_gpu` when given
    (so replaced by `new`'s if that is its GPU), else kept untagged (any GPU). ``source``: `old`'s parts
    ("; "-separated) that do not name `new`'s GPU, then `new`'s."""
    gpus = {e.get("gpu") for e in new["entries"]}
    if len(gpus) != 1 or None in gpus:
        raise ValueError(f"merge_tables: new table's entries name the GPUs {sorted(map(str, gpus))}, expected "
                         "one GPU (a sweep's table, its 'gpu' set)")
    (gpu,) = gpus
    groups = {}
    for e in old["entries"]:
        if legacy_gpu and not e.get("gpu"):
            e = {"op": e.get("op"), "gpu": legacy_gpu} | e    # "gpu" after "op", as tuning_table writes it
        groups.setdefault(e.get("gpu"), []).append(e)
    groups[gpu] = list(new["entries"])
    parts = [p for p in old.get("source", "").split("; ") if p and f" on {gpu}," not in p]
    return dict(format=1, source="; ".join(parts + [new["source"]]), entries=[e for g in groups.values() for e in g])
