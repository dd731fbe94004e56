"""torch.distributed, with collectives optionally served by tilescale plans: a drop-in replacement.

    import tilescale.distributed as dist

    dist.init_process_group("nccl", use_tilescale=True)   # or without use_tilescale: plain torch.distributed
    dist.all_reduce(x)                                     # a tilescale plan or NCCL, as the selector decides
    dist.all_gather_into_tensor(out, x)
    work = dist.reduce_scatter_tensor(y, z, async_op=True); work.wait()

Every public name of torch.distributed is available here (the ones not listed below are torch's own).
With ``use_tilescale=True``, the function of every collective that tilescale.ops registers
(:mod:`tilescale.ops.registry`: ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single``, ``broadcast``...) asks :mod:`tilescale.plan` which plan serves the call
(explicit ``plan=`` -> selector -> registered plan whose constraints match -> NCCL; the same on every
rank, agreed once per distinct call over a gloo group). Built-in plans are registered only where the
tuning table of this GPU model and world size says they beat NCCL, so by default NCCL serves every
call that was not measured. These calls go to torch.distributed unchanged, with a debug line on the
``tilescale.distributed`` logger (``TILESCALE_DIST_DEBUG=1`` prints them): a group other than the whole
world, a reduction other than sum, a non-contiguous tensor, all-to-all with split sizes, a call no plan
can serve (dtype, device, size). Tensors need not be on the symmetric heap: the built-in kernels copy
through symmetric buffers of their own.
Where no NCCL backend serves a group (the shared-GPU mode, ``TILESCALE_RANKS_PER_GPU``: gloo only), those
calls on CUDA tensors run gloo on host copies (:mod:`tilescale.staged_collectives`), still counted as
``"nccl"`` by :func:`stats` (meaning: torch.distributed).

CUDA graphs: during capture, a call that a graph-safe built-in plan serves (the collectives' kernels count
their calls on the device: tilescale/ops/capture.py) is captured as tilescale kernels; any other plan's go to
NCCL, and so does a call whose op does not exist yet (construction cannot be captured: make one eager call
with the same arguments first). In the shared-GPU mode (gloo only) there is no NCCL to capture.

Extensions to torch's signatures (keyword-only): ``plan=`` (a Plan or plan id: use it, skipping the
selector) and ``hints=`` (e.g. ``{"prefer": "tilescale"}`` to use a built-in plan wherever one can
run, or ``"nccl"``); defaults for the hints come from ``init_process_group(tilescale_hints=...)``,
:func:`set_hints` and ``TILESCALE_DIST_PREFER``. :func:`stats` counts what served each collective.
"""
from __future__ import annotations

import collections
import importlib
import inspect
import logging
import os
import sys
import threading

import torch
import torch.distributed as _td

from ..errors import GraphCaptureError, SymmetricHeapExhaustedError
from ..ops.registry import collectives
from ..plan import Plan, PlanUnsupportedError
from ..plan import registry as _registry
from ..plan import selector as _selector
from ..runtime import topology
from . import staged_collectives
from .staged_collectives import DoneWork

log = logging.getLogger("tilescale.distributed")

ReduceOp = _td.ReduceOp
GroupMember = _td.GroupMember
Work = _td.Work


class _State:
    def __init__(self):
        self.enabled = False
        self.started_runtime = False   # tilescale.init_distributed() was called by init_process_group
        self.own_ctrl = False          # the gloo group below was created here
        self.ctrl = None               # CPU group for the cross-rank agreement of plan choices
        self.hints: dict = {}
        self.nranks_per_node = 1
        self.stats: dict = collections.defaultdict(collections.Counter)
        self.lock = threading.Lock()
        self.fast: dict = {}           # call key -> agreed Choice (see _route)
        self.fast_generation = -1


_S = _State()


# --------------------------------------------------------------------------------- process groups
def init_process_group(*args, use_tilescale: bool = False, tilescale_hints: dict | None = None, **kwargs) -> None:
    """``torch.distributed.init_process_group(*args, **kwargs)``; with ``use_tilescale=True`` also
    start the tilescale runtime (NVSHMEM; needs CUDA and an NCCL backend, reusing this default group)
    and register the tuned built-in plans of this machine. Without CUDA, collectives still go through
    the selector (registered Python plans run), and built-in plans are unavailable.

    In the shared-GPU mode (``TILESCALE_RANKS_PER_GPU``, several ranks of this node on one GPU) an NCCL
    backend is replaced by gloo (and ``device_id`` dropped), with a warning: NCCL refuses two ranks on
    one GPU. Calls that no plan serves then run gloo on host copies of their CUDA tensors
    (:mod:`tilescale.staged_collectives`): correct, slow."""
    hints = _check_hints(tilescale_hints, "tilescale_hints")
    args, kwargs, shared = _without_nccl_if_shared(args, kwargs)
    _td.init_process_group(*args, **kwargs)
    if use_tilescale:
        _enable(hints, shared)


def _gpus_shared() -> bool:
    """Whether the ranks of this node share GPUs (the shared-GPU mode, ``TILESCALE_RANKS_PER_GPU``): the
    device map that ``tilescale.init_distributed`` will use, from the launcher's environment."""
    from .. import runtime
    from ..env import settings
    from ..errors import TileScaleError

    if runtime.is_initialized():
        return runtime.shares_gpu()
    if not torch.cuda.is_available():
        return False
    local_world = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE"))
    try:
        devices = runtime.device_map(int(local_world), torch.cuda.device_count(), settings.ranks_per_gpu)
    except (TypeError, ValueError, TileScaleError):  # not launched, or too many ranks: init_distributed says why
        return False
    return len(set(devices)) < len(devices)


def _without_nccl_if_shared(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """init_process_group's arguments, with an NCCL backend replaced by gloo in the shared-GPU mode (NCCL
    refuses two ranks on one GPU); collectives on CUDA tensors then run staged through the host
    (:mod:`tilescale.staged_collectives`). Also whether that mode is on."""
    backend = args[0] if args else kwargs.get("backend")
    # None: torch's default, NCCL for CUDA tensors where CUDA is available
    if (backend is not None and "nccl" not in str(backend).lower()) or not _gpus_shared():
        return args, kwargs, False
    log.warning("shared-GPU mode (TILESCALE_RANKS_PER_GPU): torch.distributed on gloo instead of %r (NCCL cannot "
                "run two ranks on one GPU); collectives on CUDA tensors are staged through the host", backend)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("backend", "device_id")}
    return ("gloo", *args[1:]), kwargs, True


def _enable(hints: dict, shared: bool = False) -> None:
    from .. import runtime
    from ..env import settings
    from ..plan import builtin

    if settings.dist_debug:
        _debug_to_stderr()
    world = _td.get_world_size()
    if torch.cuda.is_available() and (shared or "nccl" in str(_td.get_backend()).lower()):
        if not runtime.is_initialized():
            runtime.init_distributed()
            _S.started_runtime = True
        rt = runtime.current()
        if rt.info.world_size != world:
            raise RuntimeError(f"the tilescale runtime has world size {rt.info.world_size}, torch.distributed {world}")
        _S.ctrl, _S.own_ctrl = rt.ctrl_group, False
        _S.nranks_per_node = topology.current().node_size     # emulated nodes (TILESCALE_NODE_SIZE) count
        builtin.register_tuned(torch.cuda.get_device_name(rt.info.device), world, _S.nranks_per_node)
    else:
        log.warning("use_tilescale=True without CUDA and an NCCL backend (backend %s): the "
                    "tilescale runtime is not started; registered plans still run, built-in plans cannot",
                    _td.get_backend())
        _S.ctrl, _S.own_ctrl = _td.new_group(backend="gloo"), True
        _S.nranks_per_node = topology.of(world, int(os.environ.get("LOCAL_WORLD_SIZE", world))).node_size
    _S.hints = hints
    _S.enabled = True
    _selector.forget()


def destroy_process_group(group=None) -> None:
    """``torch.distributed.destroy_process_group``; destroying the default group also shuts the tilescale
    runtime down if :func:`init_process_group` started it."""
    if group is None or group is GroupMember.WORLD:
        if _S.enabled:
            if _S.started_runtime:
                from .. import runtime

                runtime.finalize()
            elif _S.own_ctrl and _S.ctrl is not None:
                _td.destroy_process_group(_S.ctrl)
        _S.__init__()
        _selector.forget()
    _td.destroy_process_group(group)


def is_tilescale_enabled() -> bool:
    """Whether collectives go through the plan selector (init_process_group(..., use_tilescale=True))."""
    return _S.enabled


def set_hints(hints: dict | None) -> None:
    """Default hints of every later collective call, e.g. ``{"prefer": "tilescale"}`` (call on every rank)."""
    _S.hints = _check_hints(hints, "hints")


def stats() -> dict:
    """{collective: {plan name or "nccl": calls}} since start (or :func:`reset_stats`)."""
    with _S.lock:
        return {c: dict(v) for c, v in _S.stats.items()}


def reset_stats() -> None:
    with _S.lock:
        _S.stats.clear()


# ------------------------------------------------------------------------------------- dispatch
def _check_hints(hints, arg: str) -> dict:
    if hints is None:
        return {}
    if not isinstance(hints, dict):
        raise TypeError(f"{arg}: got {type(hints).__name__}, expected a dict such as {{'prefer': 'tilescale'}}")
    prefer = hints.get("prefer", "auto")
    if prefer not in _selector.PREFER:
        raise ValueError(f"{arg}['prefer']: got {prefer!r}, expected one of {', '.join(_selector.PREFER)}")
    return dict(hints)


def _hints(call_hints) -> dict:
    from ..env import settings

    h = {}
    if settings.dist_prefer != "auto":
        h["prefer"] = settings.dist_prefer
    h.update(_S.hints)
    h.update(_check_hints(call_hints, "hints"))
    return h


def _count(collective: str, what: str) -> None:
    with _S.lock:
        _S.stats[collective][what] += 1


def _debug(collective: str, msg: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("[rank %d] %s: %s", _td.get_rank(), collective, msg)


def _debug_to_stderr() -> None:
    if not any(getattr(h, "_tilescale", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tilescale.distributed %(message)s"))
        h._tilescale = True
        log.addHandler(h)
    log.setLevel(logging.DEBUG)


def _whole_world(group) -> bool:
    if group is None or group is GroupMember.WORLD:
        return True
    try:
        return _td.get_process_group_ranks(group) == list(range(_td.get_world_size()))
    except (RuntimeError, ValueError):
        return False


def _is_sum(op) -> bool:
    try:
        return bool(op == ReduceOp.SUM)
    except (TypeError, RuntimeError):
        return False


def _why_not(group, tensors, op=None) -> str | None:
    """Why a call cannot go through a plan, whatever the plan (None: it can)."""
    if not _whole_world(group):
        return "group is a subgroup (plans run on the whole world)"
    if op is not None and not _is_sum(op):
        return f"op {op} (plans implement sum)"
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"argument of type {type(t).__name__}, not a tensor"
    if len({t.dtype for t in tensors}) > 1:
        return "input and output dtypes differ"
    return None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def _run_staged(collective: str, plan, async_op: bool, out, *args, **kwargs):
    """:func:`_launch` of `plan` on ``(out, *args)``, with non-contiguous tensors staged through contiguous
    copies and `out` written back (whether a tensor is contiguous may differ between ranks, so it must not
    decide the route); the work object covers the write-back."""
    o = _contiguous(out)
    args = tuple(_contiguous(a) if isinstance(a, torch.Tensor) else a for a in args)
    done, work = _launch(collective, plan, async_op and o is out, [out], o, *args, **kwargs)
    if done and o is not out:
        out.copy_(o)
        work = DoneWork([out]) if async_op else None
    return done, work


def _route(collective: str, t, msg_bytes: int, why_not: str | None, plan, hints):
    """The plan chosen for this call (agreed by every rank), or None for torch.distributed."""
    if not _S.enabled:
        if plan is not None:
            raise ValueError(f"plan: got {plan!r}, but tilescale.distributed was initialised without "
                             "use_tilescale=True; expected plan=None")
        return None
    if why_not is not None:
        if plan is not None:
            raise ValueError(f"plan: got {getattr(plan, 'name', plan)!r}, which cannot serve this {collective} call: "
                             f"{why_not}")
        _debug(collective, f"NCCL ({why_not})")
        _count(collective, "nccl")
        return None
    h = _hints(hints)
    # the agreed choice of an identical earlier call, without building the request again (this cache
    # and the selector's are filled and emptied by the same calls on every rank)
    key = (collective, msg_bytes, t.dtype, t.device.type, tuple(sorted((k, str(v)) for k, v in h.items())),
           plan.id if isinstance(plan, Plan) else plan)
    gen = _registry.generation()
    if gen != _S.fast_generation:
        _S.fast.clear()
        _S.fast_generation = gen
    choice = _S.fast.get(key)
    if choice is None:
        req = _selector.Request(collective=collective, msg_bytes=int(msg_bytes), world_size=_td.get_world_size(),
                                nranks_per_node=_S.nranks_per_node, hints=h,
                                dtype=str(t.dtype).replace("torch.", ""), device=t.device.type)
        choice = _selector.resolve(req, plan=plan, group=_S.ctrl)
        if len(_S.fast) < 4096:
            _S.fast[key] = choice
    if choice.plan is None:
        _debug(collective, f"NCCL ({choice.reason}; {msg_bytes} bytes {t.dtype})")
        _count(collective, "nccl")
    elif _capturing() and not _graph_safe(choice.plan):  # every rank alike: they capture the same region
        _debug(collective, f"NCCL (CUDA graph capture: {choice.plan.name} is not a graph-safe built-in plan)")
        _count(collective, "nccl")
        return None
    return choice.plan


def _graph_safe(plan) -> bool:
    """Whether a captured call may run `plan`: a built-in plan whose ops count calls on the device
    (tilescale.ops.capture); any other plan's calls go to NCCL during capture."""
    from ..plan import builtin

    return "builtin" in plan.tags and plan.name in builtin.GRAPH_SAFE


def _launch(collective: str, plan, async_op: bool, result, *args, **kwargs):
    """Run `plan`; (True, work or None), or (False, None) when the plan declined before communicating."""
    try:
        with torch.no_grad():
            plan(*args, **kwargs)
    except PlanUnsupportedError as e:
        _debug(collective, f"NCCL ({plan.name} cannot serve it: {e})")
        _count(collective, "nccl")
        return False, None
    except GraphCaptureError as e:  # raised on every rank (construction is agreed): all fall back
        log.warning("%s: NCCL (%s cannot run in this CUDA graph capture: %s)", collective, plan.name,
                    str(e).splitlines()[0])
        _count(collective, "nccl")
        return False, None
    except SymmetricHeapExhaustedError as e:  # raised on every rank (allocations are agreed): all fall back
        log.warning("%s: NCCL (%s could not allocate its symmetric buffers: %s)", collective, plan.name,
                    str(e).splitlines()[0])
        _count(collective, "nccl")
        return False, None
    _debug(collective, f"{plan.name} ({plan.id})")
    _count(collective, plan.name)
    return True, (DoneWork(result) if async_op else None)


_STAGED_DEVICES = ("cuda",)   # device types staged through the host where no NCCL serves the group


def _torch(group, *tensors):
    """Where a call that no plan serves goes: torch.distributed; or, for CUDA tensors of a group that no
    NCCL backend serves (the shared-GPU mode: gloo only), the same collective run by gloo on host copies
    (:mod:`tilescale.staged_collectives`; slow, correct)."""
    if (any(isinstance(t, torch.Tensor) and t.device.type in _STAGED_DEVICES for t in tensors)
            and staged_collectives.needs_staging(group)):
        return staged_collectives
    return _td


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# ----------------------------------------------------------------------------------- collectives
def _routed(c):
    """torch.distributed's function of the collective `c` (a tilescale.ops.registry entry), through the plan
    selector when enabled: the common checks (:func:`_why_not`), then the collective's own
    (``c.serve``), the agreed choice (:func:`_route`), the plan run with non-contiguous tensors staged
    (:func:`_run_staged`), or else torch.distributed (:func:`_torch`) with the caller's arguments."""
    name = c.torch_name
    sig = inspect.signature(getattr(_td, name))

    def collective(*args, plan=None, hints=None, **kwargs):
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        tensors = [a[t] for t in c.tensors]
        if _S.enabled or plan is not None:
            why = _why_not(a.get("group"), tensors, a.get("op"))
            call = c.serve(_td.get_world_size(), **a) if why is None else None
            if isinstance(call, str):
                why, call = call, None
            key = None if call is None else (call.out if call.key is None else call.key)
            p = _route(c.name, key, 0 if call is None else call.msg_bytes, why, plan, hints)
            if p is not None:
                done, work = _run_staged(c.name, p, a.get("async_op", False), call.out, *call.args, **call.kwargs)
                if done:
                    return work
        return getattr(_torch(a.get("group"), *tensors), name)(*args, **kwargs)

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"``torch.distributed.{name}``, through the plan selector when enabled."
    collective.__signature__ = sig.replace(parameters=[
        *sig.parameters.values(), inspect.Parameter("plan", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("hints", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return collective


_ROUTED = tuple(c.torch_name for c in collectives())
globals().update({c.torch_name: _routed(c) for c in collectives()})


# --------------------------------------------------------------------- everything else: torch's
_OWN = ("init_process_group", "destroy_process_group", *_ROUTED, "is_tilescale_enabled", "set_hints", "stats",
        "reset_stats")


__all__ = sorted(set(_OWN) | {n for n in dir(_td) if not n.startswith("_")})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if hasattr(_td, name):
        return getattr(_td, name)
    try:
        return importlib.import_module(f"torch.distributed.{name}")
    except ImportError:
        raise AttributeError(f"module 'tilescale.distributed' has no attribute {name!r} "
                             "(neither has torch.distributed)") from None


def __dir__():
    return sorted(set(globals()) | {n for n in dir(_td) if not n.startswith("_")})
