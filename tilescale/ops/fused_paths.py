"""Where a fused op takes the unfused path: a rule from a committed table measured per GPU model and world size.

Where the fused kernel cannot beat NCCL-then-cuBLAS (small M: a shard too short to hide the GEMM's start and the
flags' round trips), AG+GEMM runs ``all_gather_into_tensor`` then ``torch.matmul`` instead. The table
(``fused_paths.json`` beside this module) holds the measured rows of ``benchmarks/bench_fused.py`` per GPU model
(``torch.cuda.get_device_name()``) and world size, each ``[M, N, K, path]``; ``benchmarks/fused_paths.py`` writes it
from the benchmark's JSONs (``benchmarks/results/<machine>/fused.json``).

The rule: among the rows of this GPU, world size and op with the same N and K, the one nearest in M (on a log
scale; a tie goes to the smaller M) decides. A shape whose (N, K) was never measured, another GPU, ranks sharing a
GPU (NCCL cannot serve them) or a job of several nodes (the table is measured on one) runs fused.
"""
import functools
import json
import math
from pathlib import Path

TABLE = Path(__file__).with_name("fused_paths.json")
PATHS = ("fused", "unfused")


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)["tables"]


def lookup(op: str, M: int, N: int, K: int, world_size: int, gpu: str | None, table: dict | None = None) -> str:
    """"fused" or "unfused" for `op` ("ag_gemm") at (M, N, K) on `world_size` ranks of GPU model `gpu` (module
    docstring); `table` (default: the committed one) maps gpu -> str(world_size) -> op -> [[M, N, K, path], ...]."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (M, N, K)):
        return "fused"      # (the op's own checks name a bad size)
    table = _load(str(TABLE)) if table is None else table
    rows = [r for r in table.get(gpu or "", {}).get(str(world_size), {}).get(op, []) if r[1] == N and r[2] == K]
    if not rows:
        return "fused"
    best = min(rows, key=lambda r: (abs(math.log2(r[0] / M)), r[0]))
    return best[3] if best[3] in PATHS else "fused"


def choose(op: str, M: int, N: int, K: int, info, gpu: str | None, group_size: int | None = None) -> str:
    """The path of `op` on this job (`info`: the runtime's DistInfo) among `group_size` ranks (None: the world): the
    table's (at that size) where every rank has a GPU of its own on one node, else "fused"."""
    W = info.world_size if group_size is None else group_size
    if W < 2 or info.shared_gpu or info.local_world_size != info.world_size:
        return "fused"
    return lookup(op, M, N, K, W, gpu)
