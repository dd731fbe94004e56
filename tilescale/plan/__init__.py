"""Collective plans: compiled variants of a collective, a registry, and the selector that picks one per
call (the same on every rank). tilescale.distributed consults it when started with ``use_tilescale=True``.

    import tilescale.plan

    def my_allreduce(tensor, op="sum", blocks=8):       # the collective's torch-like signature
        ...

    p = tilescale.plan.compile(my_allreduce, name="ar_small", collective="allreduce", world_size=4,
                               nranks_per_node=4, min_msg_size=0, max_msg_size=1 << 20, tags={"small"},
                               blocks=8)     # -> frozen Plan (id, name, collective, tags, constraints, kernel)
    tilescale.plan.register(p)
    tilescale.plan.set_selector(lambda plans, req: ...)  # pure: returns a Plan, a plan id or None
    tilescale.plan.list(collective="allreduce", tags={"small"})

Precedence per call: explicit plan id -> selector -> registered plan whose constraints match -> NCCL.
Plans persist as ``$TILESCALE_PLAN_DIR/plans/<collective>/<id>.json``.
"""
from .plan import MAX_MSG_SIZE, Plan, PlanUnsupportedError, compile
from .registry import clear, get, list, register, unregister
from .selector import Choice, PlanMismatchError, Request, choose, clear_selector, get_selector, resolve, set_selector

__all__ = ["COLLECTIVES", "MAX_MSG_SIZE", "Plan", "PlanUnsupportedError", "compile", "register", "unregister", "list",
           "get", "clear", "set_selector", "clear_selector", "get_selector", "Request", "Choice", "choose", "resolve",
           "PlanMismatchError"]


def __getattr__(name: str):
    """``COLLECTIVES``: the canonical names of the collectives tilescale.ops registers (in name order)."""
    if name == "COLLECTIVES":
        from ..ops.registry import collectives

        return tuple(c.name for c in collectives())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
