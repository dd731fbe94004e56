"""The registry of plans that the selector sees and that may replace NCCL.

    tilescale.plan.register(plan)
    tilescale.plan.list(collective="allreduce", tags={"small"})   # in registration order

Like any collective setup, register / unregister on every rank, in the same order: the cross-rank
agreement on which plan serves a call is cached, and every change here starts a new generation of
that cache.
"""
from __future__ import annotations

import builtins
import threading

from ..ops.registry import collectives
from .plan import Plan, canonical_collective

_plans: dict[str, Plan] = {}   # id -> plan, in registration order
_lock = threading.Lock()
_generation = 0


def generation() -> int:
    """Incremented by every change of the registry or the selector (invalidates cached choices)."""
    return _generation


def bump() -> None:
    global _generation
    with _lock:
        _generation += 1


def register(plan: Plan) -> None:
    """Make `plan` visible to the selector and eligible to replace NCCL where its constraints match.
    Registering a plan again (same id) keeps its place."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: got {type(plan).__name__}, expected a Plan from tilescale.plan.compile(...)")
    with _lock:
        _plans[plan.id] = plan
    bump()


def unregister(plan) -> bool:
    """Remove a plan (a Plan or its id); returns whether it was registered."""
    pid = plan.id if isinstance(plan, Plan) else plan
    with _lock:
        found = _plans.pop(pid, None) is not None
    bump()
    return found


def clear() -> None:
    """Remove every registered plan."""
    with _lock:
        _plans.clear()
    bump()


def get(plan_id: str) -> Plan | None:
    with _lock:
        return _plans.get(plan_id)


def list(collective: str | None = None, tags=None) -> builtins.list[Plan]:  # noqa: A001  (the API's name)
    """Registered plans, in registration order; of one `collective` and carrying every tag in `tags`."""
    coll = None if collective is None else canonical_collective(collective)
    if isinstance(tags, str):
        raise ValueError(f"tags: got {tags!r}, expected a set of strings, e.g. {{{tags!r}}}")
    want = frozenset(tags or ())
    with _lock:
        plans = builtins.list(_plans.values())
    return [p for p in plans if (coll is None or p.collective == coll) and want <= p.tags]


def by_collective() -> dict[str, builtins.list[Plan]]:
    """{collective: [registered plans]} with every collective as a key (what a selector receives)."""
    out: dict[str, builtins.list[Plan]] = {c.name: [] for c in collectives()}
    for p in list():
        out[p.collective].append(p)
    return out
