"""The Hopper GEMM tile loop shared by the fused kernels (TMA + wgmma, warp-specialised by tilelang).

A kernel built on it allocates its tiles with :func:`tile_buffers` and computes one output tile with
:func:`tile_loop` (both ``T.macro``); AG+GEMM, GEMM+RS and the GEMM benchmarks only change which tile a
block computes, what it waits for before (gathered rows: a wait per chunk) and what it signals after
(partials: a completion count). The tile configuration is chosen per problem by :func:`gemm_config`:

1. the tuning table ``gemm_tuning.json`` next to this file (written by
   ``benchmarks/bench_gemm_configs.py --write-tuning``): per measured GEMM shape (and op), the configs
   ranked by measured time; the first one that the op can run (:func:`check`) wins;
2. for a shape it does not list: the entry of the same op with the same N and K and the nearest M;
3. else (or when no listed config can run) :data:`DEFAULT`, 128x256x64, 3 stages, 256 threads:
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


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    threads: int = 256    # consumer threads (warpgroups of 128); tilelang adds one producer warpgroup
    swizzle: int = 10     # panel width of T.use_swizzle (rows of tiles), 0 = tiles in launch order

    def smem_bytes(self, elem_bytes: int = 2) -> int:
        """Shared memory of the tile loop: `stages` A and B tiles; the C tile reuses them."""
        return max(self.stages * (self.block_m * self.block_k + self.block_k * self.block_n),
                   self.block_m * self.block_n) * elem_bytes

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


@T.macro
def main_loop(A, B, As, Bs, Cl, rb, bx, stages: int):
    """``Cl = A[rb, :] @ B[:, bx]`` in the accumulator, for tiles of (block_m, block_n) given by the buffers of
    :func:`tile_buffers`: TMA loads of A and B tiles in a `stages`-deep pipeline over K, wgmma."""
    block_m, block_k = As.shape
    block_n = Bs.shape[1]
    T.clear(Cl)
    for ko in T.Pipelined(T.ceildiv(A.shape[1], block_k), num_stages=stages):
        T.copy(A[rb * block_m, ko * block_k], As)
        T.copy(B[ko * block_k, bx * block_n], Bs)
        T.gemm(As, Bs, Cl)


@T.macro
def tile_loop(A, B, C, As, Bs, Cl, Cs, rb, bx, stages: int, disable_tma: bool, c_rb=None):
    """``C[c_rb, bx] = A[rb, :] @ B[:, bx]`` in tiles of (block_m, block_n) given by the buffers of
    :func:`tile_buffers` (`c_rb` None: `rb`): :func:`main_loop`, then the tile through shared memory to C (a TMA
    store; plain vector stores by every thread with `disable_tma`)."""
    block_m, block_n = Cs.shape
    main_loop(A, B, As, Bs, Cl, rb, bx, stages)
    T.copy(Cl, Cs)
    T.copy(Cs, C[(rb if c_rb is None else c_rb) * block_m, bx * block_n], disable_tma=disable_tma)


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


ROW_TILE = 128   # rows per rank of the fused ops are padded to a multiple of this (the GEMM's block_m)


def padded_rows(rows: int) -> int:
    """The rows per rank that ``tilescale.ops.ag_gemm`` and ``gemm_rs`` run: `rows` rounded up to a multiple
    of :data:`ROW_TILE` (the tuned configs of a padded problem all fit it)."""
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
    if cfg.smem_bytes(elem_bytes) > SMEM_LIMIT:
        return f"needs {cfg.smem_bytes(elem_bytes)} bytes of shared memory, more than {SMEM_LIMIT}"
    if op is not None and M % (world_size * cfg.block_m):
        return f"M={M} is not a multiple of world_size x block_m = {world_size} x {cfg.block_m}"
    if op in ("gemm_rs", "gemm_rs_push") and N % cfg.block_n:
        return f"N={N} is not a multiple of block_n={cfg.block_n} (completion counts are per whole tile)"
    return None


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> tuple:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a GEMM tuning table (expected {{'format': 1, 'entries': [...]}})")
    entries = []
    for e in data["entries"]:
        cfgs = tuple(GemmConfig.from_dict(c) for c in e["configs"])
        entries.append((e.get("op"), int(e["M"]), int(e["N"]), int(e["K"]), cfgs))
    return tuple(entries)


def load_table(path=None) -> tuple:
    """Entries (op, M, N, K, ranked configs) of a tuning table; () when the file does not exist."""
    p = str(path or TUNING_FILE)
    try:
        mtime = os.stat(p).st_mtime_ns
    except FileNotFoundError:
        return ()
    return _load(p, mtime)


def _first_valid(cfgs, M, N, K, world_size, op):
    return next((c for c in cfgs if check(c, M, N, K, world_size=world_size, op=op) is None), None)


def gemm_config(M: int, N: int, K: int, *, world_size: int = 1, op: str | None = None, table=None) -> GemmConfig:
    """The tile configuration for an (M, N, K) GEMM run by `op` on `world_size` ranks (see the module
    docstring for the rule). `table`: a tuning-table path instead of the shipped one."""
    entries = load_table(table)
    same_op = [e for e in entries if e[0] in (op, None)] if op is not None else list(entries)
    for e in sorted(same_op, key=lambda e: e[0] != op):      # exact shape, this op's entry first
        if (e[1], e[2], e[3]) == (M, N, K):
            c = _first_valid(e[4], M, N, K, world_size, op)
            if c is not None:
                return c
    near = [e for e in same_op if (e[2], e[3]) == (N, K)]
    for e in sorted(near, key=lambda e: (abs(math.log2(e[1]) - math.log2(max(M, 1))), e[0] != op)):
        c = _first_valid(e[4], M, N, K, world_size, op)
        if c is not None:
            return c
    return DEFAULT


def problem_config(M: int, N: int, K: int, *, world_size: int, op: str, config: GemmConfig | None = None) -> GemmConfig:
    """The configuration `op` runs this problem with: `config`, or else the tuned one (:func:`gemm_config`);
    a ValueError naming M or config when it cannot run it."""
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
    are applied at selection."""
    entries = {}
    for r in sweep["rows"]:
        key = (r["op"], r["M"], r["N"], r["K"])
        if key in entries or not r["ranked"]:
            continue   # the same GEMM at another W: the ranking is the same (constraints differ, not times)
        ranked = r["ranked"]
        top = ranked[:keep] + [x for x in ranked[keep:] if x["config"] == DEFAULT.to_dict()]
        entries[key] = dict(op=r["op"], M=r["M"], N=r["N"], K=r["K"], configs=[x["config"] for x in top],
                            tflops=[round(x["tflops"], 1) for x in top], cublas_tflops=round(r["cublas_tflops"], 1))
    # configs that did not fit some W (e.g. block_m 256 when M / W is not a multiple) stay listed: the
    # selection skips them for that W and takes the next one
    return dict(format=1, source=f"benchmarks/bench_gemm_configs.py on {sweep.get('gpu', '?')}, "
                                 f"{sweep.get('date', '?')}", entries=list(entries.values()))
