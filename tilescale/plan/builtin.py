"""Built-in plans: tilescale's collective kernels (tilescale.ops) as plan algorithms.

==================================  =========================================================
plan (algorithm)                    kernel
==================================  =========================================================
``tilescale.allreduce.one_shot``    ``tilescale.ops.allreduce.all_reduce(t, algo="one_shot")``
``tilescale.allreduce.two_shot``    ``tilescale.ops.allreduce.all_reduce(t, algo="two_shot")``
``tilescale.reduce_scatter.direct`` ``tilescale.ops.reduce_scatter.reduce_scatter_tensor``
``tilescale.allgather.push``        ``tilescale.ops.allgather.all_gather_into_tensor``
``tilescale.all_to_all.push``       ``tilescale.ops.all_to_all.all_to_all_single``
``tilescale.broadcast.pull``        ``tilescale.ops.broadcast.broadcast``
==================================  =========================================================

All run over the whole world of the tilescale runtime, on one node, sum only, on contiguous CUDA
bf16/fp16/fp32 tensors, which need not be symmetric (each op copies through its own symmetric buffers).

* :func:`register_tuned` registers the plans of the tuning table that matches the machine (message
  ranges where they beat NCCL); without a matching table it registers none, so NCCL is chosen.
* :func:`catalog` gives one plan per algorithm over default ranges (one-shot / two-shot split at
  ``ONE_SHOT_MAX_BYTES``): what ``hints={"prefer": "tilescale"}`` uses, and what an explicit plan id of
  a built-in refers to.
"""
from __future__ import annotations

import logging
import threading

from .plan import MAX_MSG_SIZE, Plan, PlanUnsupportedError, compile

log = logging.getLogger("tilescale.plan")

DTYPES = ("bfloat16", "float16", "float32")
CONSTRAINTS = {"dtypes": list(DTYPES), "devices": ["cuda"], "needs_runtime": True}


# ------------------------------------------------------------------------------------- algorithms
# Each op keeps its own symmetric buffers and copies from / into the caller's tensors, which therefore
# need not be on the symmetric heap. Tensors are passed flat: the ops' results do not depend on shapes.
def allreduce_one_shot(tensor, op="sum"):
    """torch: ``dist.all_reduce(tensor)``; every rank reads every peer's input (small messages)."""
    from ..ops.allreduce import all_reduce

    all_reduce(tensor.view(-1), op=op, algo="one_shot")


def allreduce_two_shot(tensor, op="sum"):
    """torch: ``dist.all_reduce(tensor)``; reduce-scatter, then all-gather (large messages)."""
    from ..ops.allreduce import all_reduce

    all_reduce(tensor.view(-1), op=op, algo="two_shot")


def reduce_scatter_direct(output, input, op="sum"):  # noqa: A002  (torch's argument names)
    """torch: ``dist.reduce_scatter_tensor(output, input)``."""
    from ..ops.reduce_scatter import reduce_scatter_tensor

    reduce_scatter_tensor(output.view(-1), input.view(-1), op=op)


def allgather_push(output, input):  # noqa: A002
    """torch: ``dist.all_gather_into_tensor(output, input)``."""
    from ..ops.allgather import all_gather_into_tensor

    n = input.numel()
    if n == 0 or n >= 1 << 31:
        raise PlanUnsupportedError(f"allgather of {n} elements per rank (the kernel takes 1 .. 2**31 - 1)")
    all_gather_into_tensor(output.view(-1), input.view(-1))


def all_to_all_push(output, input, output_split_sizes=None, input_split_sizes=None):  # noqa: A002
    """torch: ``dist.all_to_all_single(output, input)`` (equal splits: rank r gets the r-th W-th of
    every rank's input, which is the same memory whatever the row shape)."""
    from ..ops.all_to_all import all_to_all_single

    if output_split_sizes is not None or input_split_sizes is not None:
        raise PlanUnsupportedError("split sizes (the ranks' message sizes differ)")
    all_to_all_single(output.view(-1), input.view(-1))


def broadcast_pull(tensor, src):
    """torch: ``dist.broadcast(tensor, src)``; every rank reads `src`'s staged copy."""
    from ..ops.broadcast import broadcast

    broadcast(tensor.view(-1), src)


ALGOS = {
    "tilescale.allreduce.one_shot": ("allreduce", allreduce_one_shot),
    "tilescale.allreduce.two_shot": ("allreduce", allreduce_two_shot),
    "tilescale.reduce_scatter.direct": ("reduce_scatter", reduce_scatter_direct),
    "tilescale.allgather.push": ("allgather", allgather_push),
    "tilescale.all_to_all.push": ("all_to_all", all_to_all_push),
    "tilescale.broadcast.pull": ("broadcast", broadcast_pull),
}


def full_name(collective: str, algo: str, where: str = "algo") -> str:
    """'one_shot' (of allreduce) -> 'tilescale.allreduce.one_shot'; checks that it exists."""
    name = algo if algo.startswith("tilescale.") else f"tilescale.{collective}.{algo}"
    if name not in ALGOS or ALGOS[name][0] != collective:
        have = [n for n, (c, _) in ALGOS.items() if c == collective]
        raise ValueError(f"{where}: got {algo!r}, expected a built-in {collective} algorithm: {', '.join(have)}")
    return name


def default_ranges() -> dict[str, list[tuple[int, int]]]:
    """Message ranges of the catalog: one-shot up to ONE_SHOT_MAX_BYTES, two-shot above; others all."""
    ranges = {name: [(0, MAX_MSG_SIZE)] for name in ALGOS}
    from ..ops.allreduce import ONE_SHOT_MAX_BYTES

    ranges["tilescale.allreduce.one_shot"] = [(0, ONE_SHOT_MAX_BYTES)]
    ranges["tilescale.allreduce.two_shot"] = [(ONE_SHOT_MAX_BYTES + 1, MAX_MSG_SIZE)]
    return ranges


def _compile(name: str, world_size: int, lo: int, hi: int, tags: set) -> Plan:
    collective, fn = ALGOS[name]
    return compile(fn, name=name, collective=collective, world_size=world_size, nranks_per_node=world_size,
                   min_msg_size=lo, max_msg_size=hi, tags={"tilescale", "builtin", *tags}, constraints=CONSTRAINTS)


_catalog: dict[tuple, list[Plan]] = {}   # (world size, plan cache root) -> plans
_catalog_lock = threading.Lock()


def catalog(world_size: int, nranks_per_node: int, collective: str | None = None) -> list[Plan]:
    """One plan per built-in algorithm over its default range (see the module's docstring); none when
    the job spans several nodes (the kernels address peers over NVLink)."""
    if nranks_per_node != world_size:
        return []
    from . import cache

    key = (world_size, str(cache.root()))
    with _catalog_lock:
        plans = _catalog.get(key)
        if plans is None:
            plans = [_compile(name, world_size, lo, hi, {"default-range"})
                     for name, rs in default_ranges().items() for lo, hi in rs]
            _catalog[key] = plans
    return [p for p in plans if collective is None or p.collective == collective]


def tuned_plans(gpu_name: str, world_size: int, nranks_per_node: int) -> list[Plan]:
    """The plans of the tuning table for this GPU model and world size (none without a table)."""
    from . import tuning

    if nranks_per_node != world_size:
        return []
    table = tuning.load(gpu_name, world_size)
    if table is None:
        return []
    return [_compile(algo, world_size, lo, hi, {"tuned"})
            for entries in table["collectives"].values() for algo, ranges in entries for lo, hi in ranges]


def register_tuned(gpu_name: str, world_size: int, nranks_per_node: int) -> list[Plan]:
    """Register :func:`tuned_plans` (call on every rank); returns them."""
    from . import registry

    plans = tuned_plans(gpu_name, world_size, nranks_per_node)
    for p in plans:
        registry.register(p)
    log.info("registered %d tuned built-in plan(s) for %s x %d", len(plans), gpu_name, world_size)
    return plans
