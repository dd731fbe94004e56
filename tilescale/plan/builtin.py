"""Built-in plans: tilescale's collective kernels (tilescale.ops) as plan algorithms.

Every algorithm of every collective that :mod:`tilescale.ops.registry` lists is a built-in plan named
``tilescale.<collective>.<algorithm>``, e.g. ``tilescale.allreduce.one_shot`` (``all_reduce(t,
algo="one_shot")``), ``tilescale.reduce_scatter.direct``, ``tilescale.allgather.push``,
``tilescale.all_to_all.push``, ``tilescale.broadcast.pull`` (:data:`ALGOS`).

All run over the whole world of the tilescale runtime, sum only, on contiguous CUDA bf16/fp16/fp32 tensors,
which need not be symmetric (each op copies through its own symmetric buffers). On one node every algorithm
but the hierarchical ones (``Algorithm.nodes == "several"``); on several nodes (real, or emulated with
TILESCALE_NODE_SIZE) the algorithms that run across nodes (``nodes == "any"``: every peer reached directly,
through NVSHMEM's API where there is no load/store mapping), and where a collective has a hierarchical variant,
its flat algorithm up to the cost model's crossover and the hierarchical one above it
(:mod:`tilescale.plan.multinode`).

* :func:`register_tuned` registers the plans of the tuning table that matches the machine (message
  ranges where they beat NCCL); without a matching table it registers none, so NCCL is chosen.
* :func:`catalog` gives one plan per algorithm over its default ranges (the registry's; e.g. one-shot /
  two-shot split at ``ONE_SHOT_MAX_BYTES``): what ``hints={"prefer": "tilescale"}`` uses, and what an
  explicit plan id of a built-in refers to.
"""
from __future__ import annotations

import logging
import threading

from ..ops.registry import collectives
from .plan import Plan, compile

log = logging.getLogger("tilescale.plan")

DTYPES = ("bfloat16", "float16", "float32")
CONSTRAINTS = {"dtypes": list(DTYPES), "devices": ["cuda"], "needs_runtime": True}

# {plan name: (collective, algorithm)}: each op keeps its own symmetric buffers and copies from / into the
# caller's tensors, which therefore need not be on the symmetric heap.
ALGOS = {f"tilescale.{c.name}.{a}": (c.name, alg.run) for c in collectives() for a, alg in c.algos.items()}
# the built-in plans whose ops count calls on the device: tilescale.distributed runs them in CUDA graph capture
GRAPH_SAFE = frozenset(f"tilescale.{c.name}.{a}" for c in collectives() for a, alg in c.algos.items() if alg.graph_safe)


def default_ranges() -> dict[str, list[tuple[int, int]]]:
    """Message ranges of the catalog on one node: each algorithm's default ranges in the registry (none for the
    hierarchical ones)."""
    return {f"tilescale.{c.name}.{a}": list(alg.ranges) for c in collectives() for a, alg in c.algos.items()
            if alg.nodes != "several"}


def _compile(name: str, world_size: int, lo: int, hi: int, tags: set, nranks_per_node: int | None = None) -> Plan:
    collective, fn = ALGOS[name]
    return compile(fn, name=name, collective=collective, world_size=world_size,
                   nranks_per_node=nranks_per_node or world_size, min_msg_size=lo, max_msg_size=hi,
                   tags={"tilescale", "builtin", *tags}, constraints=CONSTRAINTS)


def multinode_ranges(world_size: int, nranks_per_node: int) -> dict[str, list[tuple[int, int]]]:
    """Message ranges of the catalog on several nodes: for each collective with a hierarchical algorithm, its
    flat ones up to :func:`tilescale.plan.multinode.flat_max_bytes` and its hierarchical ones above; for the
    others, their algorithms that run across nodes (``nodes == "any"``) over their default ranges."""
    from ..ops.registry import MAX_MSG_SIZE
    from .multinode import flat_max_bytes

    out = {}
    for c in collectives():
        if not any(alg.nodes == "several" for alg in c.algos.values()):   # no variant to choose: its flat ones
            out.update({f"tilescale.{c.name}.{a}": list(alg.ranges) for a, alg in c.algos.items()
                        if alg.nodes == "any"})
            continue
        top = flat_max_bytes(c.name, world_size, nranks_per_node)
        for a, alg in c.algos.items():
            lo, hi = {"any": (0, top), "several": (top + 1, MAX_MSG_SIZE)}.get(alg.nodes, (1, 0))
            if lo <= hi:
                out[f"tilescale.{c.name}.{a}"] = [(lo, hi)]
    return out


_catalog: dict[tuple, list[Plan]] = {}   # (world size, ranks per node, plan cache root) -> plans
_catalog_lock = threading.Lock()


def catalog(world_size: int, nranks_per_node: int, collective: str | None = None) -> list[Plan]:
    """One plan per built-in algorithm over its default range on one node; on several nodes, the flat and
    hierarchical algorithms over the cost model's ranges (see the module's docstring)."""
    from . import cache

    key = (world_size, nranks_per_node, str(cache.root()))
    with _catalog_lock:
        plans = _catalog.get(key)
        if plans is None:
            several = nranks_per_node != world_size
            ranges = multinode_ranges(world_size, nranks_per_node) if several else default_ranges()
            plans = [_compile(name, world_size, lo, hi, {"model-range" if several else "default-range"},
                              nranks_per_node) for name, rs in ranges.items() for lo, hi in rs]
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
