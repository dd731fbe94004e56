"""Which plan serves a collective call, the same on every rank.

Precedence (first that gives a plan wins):

1. an explicit plan (a Plan or its id) passed with the call;
2. the user's selector, ``fn(plans, request) -> Plan | plan id | None``, where `plans` is
   ``{collective: [registered plans]}`` (None: no opinion, go on);
3. the first registered plan whose constraints (message-size range included) match the request;
   with ``hints={"prefer": "tilescale"}`` then also a built-in tilescale plan that can run the call;
4. NCCL (torch.distributed).

``hints={"prefer": "nccl"}`` skips 3. A selector must be a pure function of its arguments (no time,
randomness or rank): :func:`resolve` checks once per distinct request, over a CPU (gloo) group, that
every rank chose the same plan, and raises :class:`PlanMismatchError` on every rank when they did not
(instead of ranks launching different algorithms and hanging).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CollectiveMismatchError
from . import registry
from .plan import Plan, canonical_json, compiled

PREFER = ("auto", "tilescale", "nccl")


class PlanMismatchError(CollectiveMismatchError):
    """Ranks chose different plans (or made different requests) for the same collective call."""


@dataclass(frozen=True)
class Request:
    """What a selector sees of one collective call.

    ``msg_bytes`` follows nccl-tests' "size" (each collective's entry in tilescale.ops.registry computes
    it): the tensor for allreduce and broadcast, the whole gathered output for allgather, the whole input
    for reduce-scatter and all-to-all (in bytes, per rank). ``dtype`` is torch's name without the prefix
    ("bfloat16"), ``device`` the tensor's device type ("cuda")."""

    collective: str
    msg_bytes: int
    world_size: int
    nranks_per_node: int
    hints: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = ""
    device: str = ""

    def key(self) -> str:
        return canonical_json([self.collective, self.msg_bytes, self.world_size, self.nranks_per_node,
                               {k: str(v) for k, v in self.hints.items()}, self.dtype, self.device])


@dataclass(frozen=True)
class Choice:
    """The outcome of selection: a plan, or None for NCCL, where it came from and why."""

    plan: Plan | None
    source: str          # explicit | selector | registered | builtin | nccl
    reason: str = ""

    @property
    def label(self) -> str:
        return "nccl" if self.plan is None else f"{self.plan.name} ({self.plan.id})"


_selector: Callable | None = None


def set_selector(fn: Callable) -> None:
    """Install `fn(plans, request)` as the selector (see the module's docstring). Call it on every rank."""
    global _selector
    if not callable(fn):
        raise TypeError(f"fn: got {fn!r}, expected a callable (plans, request) -> Plan | plan id | None")
    _selector = fn
    registry.bump()


def clear_selector() -> None:
    global _selector
    _selector = None
    registry.bump()


def get_selector() -> Callable | None:
    return _selector


def find(plan_id: str) -> Plan | None:
    """A plan by id: registered, or compiled in this process (built-in plans included)."""
    return registry.get(plan_id) or compiled(plan_id)


def _as_plan(value, what: str) -> Plan:
    if isinstance(value, Plan):
        return value
    if isinstance(value, str):
        p = find(value)
        if p is None:
            raise ValueError(f"{what}: got the plan id {value!r}, which is neither registered nor compiled in this "
                             "process; expected an id from tilescale.plan.list() or tilescale.plan.compile(...).id")
        return p
    raise TypeError(f"{what}: got {type(value).__name__} {value!r}, expected a Plan or a plan id (str)")


def _prefer(request: Request) -> str:
    prefer = request.hints.get("prefer", "auto")
    if prefer not in PREFER:
        raise ValueError(f"hints['prefer']: got {prefer!r}, expected one of {', '.join(PREFER)}")
    return prefer


def choose(request: Request, *, plan=None) -> Choice:
    """This rank's choice for `request` (no communication); see the module's docstring."""
    prefer = _prefer(request)
    if plan is not None:
        p = _as_plan(plan, "plan")
        why = p.mismatch(request, sizes=False)
        if why is not None:
            raise ValueError(f"plan: got {p.name} ({p.id}), which cannot serve this {request.collective} call: {why}")
        return Choice(p, "explicit")
    if _selector is not None:
        picked = _selector(registry.by_collective(), request)
        if picked is not None:
            p = _as_plan(picked, f"the selector {getattr(_selector, '__name__', _selector)!r} returned a value that")
            why = p.mismatch(request, sizes=False)
            if why is None:
                return Choice(p, "selector")
            return Choice(None, "nccl", f"the selector chose {p.name}, which cannot serve this call: {why}")
    if prefer == "nccl":
        return Choice(None, "nccl", "hints prefer nccl")
    registered = registry.list(request.collective)
    for p in registered:
        if p.matches(request):
            return Choice(p, "registered")
    if prefer == "tilescale":
        from . import builtin

        # built-in plans run on CUDA tensors only (and building their catalog imports the kernels)
        ours = (builtin.catalog(request.world_size, request.nranks_per_node, request.collective)
                if request.device in builtin.CONSTRAINTS["devices"] else [])
        for p, sizes in [(p, True) for p in ours] + [(p, False) for p in (*registered, *ours)]:
            if p.matches(request, sizes=sizes):
                return Choice(p, "builtin" if p in ours else "registered")
        why = ("; ".join(f"{p.name}: {p.mismatch(request, sizes=False)}" for p in ours)
               or f"no built-in plan for {request.device} tensors on {request.nranks_per_node} of "
                  f"{request.world_size} ranks per node")
        return Choice(None, "nccl", f"hints prefer tilescale, but no tilescale plan can serve this call ({why})")
    return Choice(None, "nccl", "no registered plan matches" if registered else "no plan registered")


# ------------------------------------------------------------------------------ cross-rank agreement
_MAX_CACHED = 4096
_cache: dict[str, Choice] = {}
_cache_generation = -1
_cache_lock = threading.Lock()


def _explicit_key(plan) -> str:
    if plan is None:
        return ""
    return plan.id if isinstance(plan, Plan) else str(plan)


def resolve(request: Request, *, plan=None, group=None) -> Choice:
    """:func:`choose`, agreed by every rank of `group` (a CPU-capable process group; None: the default
    group) once per distinct request; later identical requests reuse the agreed choice.

    Collective on the first call of each distinct request: every rank must call it, with the same
    request. Raises :class:`PlanMismatchError` on every rank when the ranks' requests or choices differ;
    an error in selection (a bad plan id, a failing selector) is raised on every rank: as itself when
    every rank failed alike, else as the PlanMismatchError that shows it."""
    global _cache_generation
    key = request.key() + "|" + _explicit_key(plan)
    gen = registry.generation()
    with _cache_lock:
        if gen != _cache_generation or len(_cache) >= _MAX_CACHED:
            _cache.clear()
            _cache_generation = gen
        hit = _cache.get(key)
    if hit is not None:
        return hit
    err: BaseException | None = None
    try:
        choice = choose(request, plan=plan)
        mine = choice.label
    except Exception as e:  # noqa: BLE001  (reported on every rank below)
        choice, err = None, e
        mine = f"error: {type(e).__name__}: {e}"
    everyone = _gather((key, mine), group) if request.world_size > 1 else [(key, mine)]
    if any(v != everyone[0] for v in everyone):
        rank = _rank(group)
        lines = "\n".join(f"  rank {r}: request {k}\n          choice  {c}" for r, (k, c) in enumerate(everyone))
        raise PlanMismatchError(
            f"{request.collective}: ranks disagree on the plan for this call (a selector must be a pure function "
            f"of (plans, request), and every rank must make the same call and register the same plans):\n{lines}\n"
            f"(this is rank {rank})") from err
    if err is not None:
        raise err  # every rank failed the same way
    with _cache_lock:
        if registry.generation() == _cache_generation:
            _cache[key] = choice
    return choice


def _gather(obj, group) -> list:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _rank(group) -> int:
    import torch.distributed as dist

    return dist.get_rank(group) if dist.is_initialized() else 0


def forget() -> None:
    """Drop every agreed choice (the next call of each request agrees again, on every rank)."""
    registry.bump()
