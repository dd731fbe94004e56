"""Which variant of a collective a job on several nodes should use: the rule of the cost model
(:mod:`tilescale.plan.multinode_model`, ``rule``; its tables are in docs/multinode.md), not restated here.

    multinode.variant("allgather", msg_bytes, world_size, node_size)     # "flat" or "hierarchical"
    multinode.flat_max_bytes("allgather", world_size, node_size)          # largest message that stays flat

The rule (docs/multinode.md, "What the plan selector should do"): one node, or one rank per node: flat. Else,
with n nodes of g ranks and shard = msg_bytes / world_size (Request.msg_bytes: the gathered output of an
allgather, the whole input of a reduce-scatter): flat while the shard is at most the model's crossover
s*(n, g), hierarchical above it (AllGather and AG+GEMM inter-node then intra-node, ReduceScatter and GEMM+RS
intra-node then inter-node). Emulated nodes (TILESCALE_NODE_SIZE) count as nodes.
"""
from __future__ import annotations

import logging
import math

FLAT, HIERARCHICAL = "flat", "hierarchical"
# the model's names of collectives whose hierarchical variant is the AllGather one (the others: ReduceScatter's)
_GATHERS = {"allgather": "all_gather", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
            "ag_gemm": "ag_gemm"}

log = logging.getLogger("tilescale.plan")


def model():
    """The cost model (:mod:`tilescale.plan.multinode_model`, docs/multinode.md)."""
    from . import multinode_model

    return multinode_model


def variant(collective: str, msg_bytes: int, world_size: int, node_size: int) -> str:
    """"flat" or "hierarchical" for a call of `collective` (a registry name such as "allgather" or
    "reduce_scatter", or "ag_gemm" / "gemm_rs") of `msg_bytes` on `world_size` ranks in nodes of `node_size`."""
    if world_size // node_size <= 1 or node_size <= 1:
        return FLAT
    m = model()
    v = m.rule(_GATHERS.get(collective, "reduce_scatter"), msg_bytes, world_size, node_size)
    return FLAT if v == m.FLAT_DIRECT else HIERARCHICAL


def flat_max_bytes(collective: str, world_size: int, node_size: int) -> int:
    """The largest msg_bytes for which :func:`variant` says flat (-1: never; the model's "no upper bound" when
    always); the rule depends on msg_bytes through one threshold."""
    from ..ops.registry import MAX_MSG_SIZE

    if world_size // node_size <= 1 or node_size <= 1:
        return MAX_MSG_SIZE
    m = model()
    thr = m.flat_threshold(world_size // node_size, node_size)
    if math.isinf(thr):
        return MAX_MSG_SIZE
    limit = math.floor(thr * world_size)          # msg / W <= thr  <=>  msg <= floor(thr * W)
    while limit >= 0 and variant(collective, limit, world_size, node_size) != FLAT:   # float rounding at the edge
        limit -= 1
    while variant(collective, limit + 1, world_size, node_size) == FLAT:
        limit += 1
    return limit
