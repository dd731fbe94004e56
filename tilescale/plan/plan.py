"""A plan: one compiled variant of a collective (algorithm, launch configuration, message-size range,
tags), with an id that is the same on every rank and in every process that compiles the same inputs.

    plan = tilescale.plan.compile(my_allreduce, name="ar_small", collective="allreduce", world_size=4,
                                  min_msg_size=0, max_msg_size=1 << 20, tags={"small"}, blocks=8)
    plan.id            # 32 characters of base32(blake2b(canonical JSON of the inputs below))
    plan(tensor)       # == my_allreduce(tensor, blocks=8)

The id hashes the canonical JSON (sorted keys, no spaces, ASCII) of::

    {"schema_version", "tilescale_version", "algo" (module.qualname), "algo_src_hash",
     "name", "collective", "tags" (sorted), "constraints" (extra ones, e.g. dtypes),
     "env_fingerprint": {"world_size", "nranks_per_node", "size_bucket": [min, max], "launch_config"}}

so a change of any of them (the algorithm's source included) gives a new id. The plan is written to
``$TILESCALE_PLAN_DIR/plans/<collective>/<id>.json`` (see :mod:`tilescale.plan.cache`).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..ops.registry import MAX_MSG_SIZE, PlanUnsupportedError  # noqa: F401  (re-exported: tilescale.plan's names)
from ..ops.registry import canonical as canonical_collective
from .ids import canonical_json, hash_id

SCHEMA_VERSION = 1
# Keys of Plan.constraints beyond the message-size range, world size and ranks per node.
EXTRA_CONSTRAINTS = ("dtypes", "devices", "needs_runtime")


# ------------------------------------------------------------------------------------ source hashing
def _code_fingerprint(code: types.CodeType, h) -> None:
    """Path- and line-independent digest of a code object (used when the source is not available)."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_fingerprint(c, h)
        else:
            h.update(repr(c).encode())


def _target(algo) -> tuple[Callable, tuple, dict]:
    """(underlying function, bound positional args, bound keyword args) of a callable."""
    args, kwargs = (), {}
    while isinstance(algo, functools.partial):
        args, kwargs = algo.args + args, {**algo.keywords, **kwargs}
        algo = algo.func
    return algo, args, kwargs


def algo_name(algo) -> str:
    fn, _, _ = _target(algo)
    if not inspect.isfunction(fn) and not inspect.ismethod(fn) and not inspect.isbuiltin(fn):
        fn = type(fn)  # a callable object: its class
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def source_hash(algo) -> str:
    """Hash of the algorithm's source (inspect.getsource), or of its code object where the source is
    not available (functions made by exec); a functools.partial adds its bound arguments."""
    fn, args, kwargs = _target(algo)
    h = hashlib.blake2b(digest_size=16)
    obj = fn if (inspect.isfunction(fn) or inspect.ismethod(fn)) else type(fn)
    try:
        import linecache

        linecache.checkcache()  # a file edited since it was first read is read again
        h.update(b"src:" + inspect.getsource(obj).encode())
    except (OSError, TypeError):
        code = getattr(inspect.unwrap(fn) if inspect.isfunction(fn) else fn, "__code__", None)
        if code is None:
            call = getattr(type(fn), "__call__", None)   # noqa: B004  (the method, for its code object)
            code = getattr(call, "__code__", None)
        if code is None:
            raise ValueError(f"algo: got {algo!r}, whose source and code object are both unavailable; expected "
                             "a Python function (def ...) or a callable object defined in Python") from None
        h.update(b"code:")
        _code_fingerprint(code, h)
    if args or kwargs:
        h.update(b"bound:" + repr((args, sorted(kwargs.items()))).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True, eq=False)
class Plan:
    """A frozen handle to one compiled variant of a collective.

    ``kernel`` is the algorithm with its launch configuration bound: calling the plan calls it with the
    collective's torch-like arguments (e.g. ``plan(tensor)`` for an allreduce). Two plans are equal
    when their ids are."""

    id: str
    name: str
    collective: str
    tags: frozenset
    constraints: Mapping[str, Any]
    kernel: Callable = field(repr=False)
    launch_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    algo: str = ""
    path: Any = field(default=None, repr=False)   # the JSON file in the plan cache

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, Plan) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    # ------------------------------------------------------------------ does it fit a request?
    def mismatch(self, request, *, sizes: bool = True) -> str | None:
        """Why this plan cannot serve `request` (a :class:`tilescale.plan.Request`), or None.

        Hard constraints (collective, world size, ranks per node, dtype, device, runtime) always count;
        the message-size range only with ``sizes=True`` (a selector may pick a plan outside its range)."""
        c = self.constraints
        if self.collective != request.collective:
            return f"plan is for {self.collective}, not {request.collective}"
        if c["world_size"] != request.world_size:
            return f"plan is for world size {c['world_size']}, not {request.world_size}"
        if c["nranks_per_node"] != request.nranks_per_node:
            return f"plan is for {c['nranks_per_node']} ranks per node, not {request.nranks_per_node}"
        if c.get("dtypes") and request.dtype not in c["dtypes"]:
            return f"plan supports dtypes {list(c['dtypes'])}, not {request.dtype}"
        if c.get("devices") and request.device not in c["devices"]:
            return f"plan runs on {list(c['devices'])} tensors, not {request.device}"
        if c.get("needs_runtime"):
            from .. import runtime

            if not runtime.is_initialized():
                return "plan needs the tilescale runtime (tilescale.init_distributed), which is not running"
        if sizes and not (c["min_msg_size"] <= request.msg_bytes <= c["max_msg_size"]):
            return (f"{request.msg_bytes} bytes is outside the plan's range "
                    f"[{c['min_msg_size']}, {c['max_msg_size']}]")
        return None

    def matches(self, request, *, sizes: bool = True) -> bool:
        return self.mismatch(request, sizes=sizes) is None

    def record(self) -> dict:
        """What the plan cache stores (see tilescale.plan.cache)."""
        return build_record(self._inputs, self.id)

    @property
    def _inputs(self) -> dict:
        return object.__getattribute__(self, "_hashed_inputs")


def _check_int(arg: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{arg}: got {v!r}, expected an integer >= {lo}")
    return v


def _check_json(arg: str, v):
    try:
        canonical_json(v)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{arg}: got {v!r}, expected JSON values (str, int, float, bool, None, lists and "
                         f"dicts of them): {e}") from None
    return json.loads(canonical_json(v))


def inputs(algo, *, name, collective, world_size, nranks_per_node=None, min_msg_size=0,
           max_msg_size=MAX_MSG_SIZE, tags=None, constraints=None, launch_config=None) -> dict:
    """The validated, canonical inputs of a plan: what its id hashes."""
    from .. import __version__

    if not callable(algo):
        raise ValueError(f"algo: got {algo!r}, expected a callable with the collective's torch-like signature, "
                         "e.g. def my_allreduce(tensor, op='sum', **launch_config)")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: got {name!r}, expected a non-empty string")
    collective = canonical_collective(collective)
    world_size = _check_int("world_size", world_size, 1)
    nranks_per_node = world_size if nranks_per_node is None else _check_int("nranks_per_node", nranks_per_node, 1)
    if world_size % nranks_per_node:
        raise ValueError(f"nranks_per_node: got {nranks_per_node}, expected a divisor of world_size={world_size}")
    min_msg_size = _check_int("min_msg_size", min_msg_size, 0)
    max_msg_size = _check_int("max_msg_size", max_msg_size, 0)
    if max_msg_size < min_msg_size:
        raise ValueError(f"max_msg_size: got {max_msg_size}, expected >= min_msg_size={min_msg_size}")
    if tags is None:
        tags = ()
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"tags: got {tags!r}, expected a set of strings, e.g. {{'small', 'nvlink'}}")
    extra = dict(constraints or {})
    unknown = sorted(set(extra) - set(EXTRA_CONSTRAINTS))
    if unknown:
        raise ValueError(f"constraints: got unknown key(s) {unknown}, expected some of {list(EXTRA_CONSTRAINTS)}")
    for k in ("dtypes", "devices"):
        if k in extra:
            v = extra[k]
            if isinstance(v, str) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"constraints[{k!r}]: got {v!r}, expected a list of strings")
            extra[k] = sorted(set(v))
    if "needs_runtime" in extra:
        extra["needs_runtime"] = bool(extra["needs_runtime"])
    launch_config = _check_json("launch_config", dict(launch_config or {}))
    return {
        "schema_version": SCHEMA_VERSION,
        "tilescale_version": __version__,
        "algo": algo_name(algo),
        "algo_src_hash": source_hash(algo),
        "name": name,
        "collective": collective,
        "tags": sorted(set(tags)),
        "constraints": extra,
        "env_fingerprint": {
            "world_size": world_size,
            "nranks_per_node": nranks_per_node,
            "size_bucket": [min_msg_size, max_msg_size],
            "launch_config": launch_config,
        },
    }


def build_record(inp: dict, plan_id: str | None = None) -> dict:
    """The JSON document of a plan: its id, the hashed inputs, and the handle's fields derived from them."""
    fp = inp["env_fingerprint"]
    return {
        "schema_version": SCHEMA_VERSION,
        "id": plan_id or hash_id(inp),
        "inputs": inp,
        "name": inp["name"],
        "collective": inp["collective"],
        "tags": inp["tags"],
        "algo": inp["algo"],
        "constraints": constraints_of(inp),
        "launch_config": fp["launch_config"],
    }


def constraints_of(inp: dict) -> dict:
    fp = inp["env_fingerprint"]
    return {"world_size": fp["world_size"], "nranks_per_node": fp["nranks_per_node"],
            "min_msg_size": fp["size_bucket"][0], "max_msg_size": fp["size_bucket"][1], **inp["constraints"]}


def _freeze(v):
    if isinstance(v, dict):
        return types.MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def make_plan(algo, inp: dict, plan_id: str, path=None) -> Plan:
    launch_config = inp["env_fingerprint"]["launch_config"]
    kernel = functools.partial(algo, **launch_config) if launch_config else algo
    p = Plan(id=plan_id, name=inp["name"], collective=inp["collective"], tags=frozenset(inp["tags"]),
             constraints=_freeze(constraints_of(inp)), kernel=kernel, launch_config=_freeze(launch_config),
             algo=inp["algo"], path=path)
    object.__setattr__(p, "_hashed_inputs", inp)
    return p


# ------------------------------------------------------------------------------------------ compile
_compiled: dict[str, Plan] = {}     # id -> plan, every plan compiled in this process
_compiled_lock = threading.Lock()


def compile(algo, *, name: str, collective: str, world_size: int, nranks_per_node: int | None = None,  # noqa: A001
            min_msg_size: int = 0, max_msg_size: int = MAX_MSG_SIZE, tags=None, constraints: dict | None = None,
            rebuild: bool = False, **launch_config) -> Plan:
    """Compile `algo` into a plan: validate the inputs, compute the id, and keep the plan as JSON in the
    plan cache (``$TILESCALE_PLAN_DIR/plans/<collective>/<id>.json``, written atomically under a file
    lock; a corrupt or mismatched file is rebuilt, never trusted).

    `algo` is a callable with the collective's torch-like signature (``(tensor, op="sum")`` for an
    allreduce, ``(output, input)`` for an allgather, ``(output, input, op="sum")`` for a
    reduce-scatter, ``(output, input, output_split_sizes=None, input_split_sizes=None)`` for an
    all-to-all, ``(tensor, src)`` for a broadcast); the keyword arguments left over (`launch_config`,
    JSON values) are bound to it. `constraints` may add ``dtypes`` / ``devices`` (lists of names, e.g.
    ``["bfloat16"]`` / ``["cuda"]``) and ``needs_runtime`` (the tilescale runtime must be running).
    Messages of ``min_msg_size <= bytes <= max_msg_size`` match the plan (see Request.msg_bytes).
    ``rebuild=True`` rewrites the cached file. Returns a frozen :class:`Plan`."""
    from . import cache

    inp = inputs(algo, name=name, collective=collective, world_size=world_size, nranks_per_node=nranks_per_node,
                 min_msg_size=min_msg_size, max_msg_size=max_msg_size, tags=tags, constraints=constraints,
                 launch_config=launch_config)
    plan_id = hash_id(inp)
    path = cache.store(build_record(inp, plan_id), rebuild=rebuild)
    plan = make_plan(algo, inp, plan_id, path)
    with _compiled_lock:
        _compiled[plan_id] = plan
    return plan


def compiled(plan_id: str) -> Plan | None:
    """A plan compiled in this process, by id."""
    with _compiled_lock:
        return _compiled.get(plan_id)
