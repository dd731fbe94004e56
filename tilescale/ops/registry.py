"""The collectives of tilescale.ops, one entry each: what tilescale.plan, tilescale.distributed,
tilescale.ops.prebuild and benchmarks/bench_collectives.py know of a collective comes from its entry.

An op module declares its entry, and that is all it takes (no other file changes)::

    COLLECTIVE = registry.collective(
        "allreduce", torch_name="all_reduce", tensors=("tensor",),
        algos={"one_shot": Algorithm(plan_one_shot, ((0, ONE_SHOT_MAX_BYTES),)), ...},
        kernels=kernels, serve=serve, bench=bench)

:func:`collectives` imports every module of this package once, so an entry is known as soon as anything asks.

Message sizes are those of :class:`tilescale.plan.Request` (``msg_bytes``, which each entry's `serve`
computes): nccl-tests' "size", bytes per rank of the tensor for allreduce and broadcast, of the whole
gathered output for allgather, of the whole input for reduce-scatter and all-to-all.
"""
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TileScaleError

MAX_MSG_SIZE = (1 << 63) - 1   # "no upper bound"
NODES = ("one", "any", "several")   # Algorithm.nodes


class PlanUnsupportedError(TileScaleError, NotImplementedError):
    """An algorithm cannot serve this call (raised before any communication, the same way on every rank):
    tilescale.distributed then passes the call to torch.distributed. Also ``tilescale.plan.PlanUnsupportedError``."""


@dataclass(frozen=True)
class Algorithm:
    """One way to run a collective: `run` has the collective's torch-like signature (what a plan calls,
    e.g. ``(tensor, op="sum")`` for an allreduce) and copies through the op's own buffers; `ranges` are
    the message sizes (bytes, inclusive) it serves by default (``hints={"prefer": "tilescale"}``) on one node.
    `nodes` says where it runs: ``"one"`` (one node only), ``"any"`` (also across nodes: the flat variant of
    docs/multinode.md, every peer reached directly, through NVSHMEM's API where there is no mapping),
    ``"several"`` (a hierarchical variant: several nodes only). Across nodes the plan selector picks among the
    "any" and "several" ones by the cost model (:mod:`tilescale.plan.multinode`). `graph_safe`: its ops count
    calls on the device (``Op.GRAPH_SAFE``), so a call may be captured in a CUDA graph (else
    tilescale.distributed sends captured calls to NCCL)."""

    run: Callable
    ranges: tuple = ((0, MAX_MSG_SIZE),)
    nodes: str = "one"
    graph_safe: bool = False

    def __post_init__(self):
        if self.nodes not in NODES:
            raise ValueError(f"Algorithm: nodes: got {self.nodes!r}, expected one of {', '.join(NODES)}")


@dataclass(frozen=True)
class TorchCall:
    """How a plan serves one torch.distributed call of the collective (tilescale.distributed): the plan is
    called as ``plan(out, *args, **kwargs)``; `out` is staged through a contiguous copy when it is not
    contiguous; `key` (default `out`) is the tensor whose dtype and device select the plan."""

    out: Any
    msg_bytes: int
    args: tuple = ()
    kwargs: Mapping = field(default_factory=dict)
    key: Any = None


def rooted_call(world_size: int, tensor, root, group_root, arg: str, **kwargs):
    """The :class:`TorchCall` of a collective to or from one rank (broadcast, reduce): the rank is torch's
    `arg` (src / dst), else its ``group_`` twin; the plan gets ``(tensor, root, **kwargs)``. Or why not."""
    root = root if root is not None else group_root
    if not (isinstance(root, int) and 0 <= root < world_size):
        return f"{arg} {root!r}"
    return TorchCall(out=tensor, args=(root,), kwargs=kwargs, msg_bytes=tensor.numel() * tensor.element_size())


def rooted_bench(cls):
    """The benchmark case of a collective to or from one rank (broadcast, reduce): ``cls(shape, dtype, 0)``
    in place on the message, as torch."""
    def bench(algo, x, world_size):
        op = cls(x.shape, x.dtype, 0)
        return op, lambda: op(x), x, (x.clone(), 0)

    return bench


@dataclass(frozen=True)
class Collective:
    """One collective.

    * `name`: canonical (plans, tuning tables, requests); `torch_name`: the torch.distributed function
      that tilescale.distributed serves with plans of it; `aliases`: other accepted spellings (the name,
      the torch name and the aliases, in any case, all mean this collective);
    * `algos`: {short name: :class:`Algorithm`} (plan ``tilescale.<name>.<short name>``);
    * `tensors`: the parameters of the torch function that must be tensors; `serve(world_size, **torch
      arguments)`: a :class:`TorchCall`, or why no plan can serve the call (a str), called once the common
      checks passed (whole world, sum, tensors, one dtype);
    * `kernels(msg_bytes, world_size, dtype, sms)`: [(jit function, args)] of what the op compiles for such
      a message (prebuild);
    * `bench(algo, msg_bytes, world_size, rank)`: (op, ours, out, torch_args) for the benchmark: `ours()`
      runs the op (writing `out`), ``torch.distributed.<torch_name>(*torch_args)`` is the reference (its
      first argument holds its result); `busbw(world_size)`: nccl-tests' bus-bandwidth factor;
      `exact`: results must equal the reference (copies), else agree within bf16 rounding (sums).
    """

    name: str
    torch_name: str
    algos: Mapping[str, Algorithm]
    tensors: tuple
    serve: Callable
    kernels: Callable
    bench: Callable
    busbw: Callable
    exact: bool
    aliases: tuple = ()
    module: str = ""

    def spellings(self) -> tuple:
        return (self.name, self.torch_name, *self.aliases)


_entries: dict[str, Collective] = {}
_scanned = False


def collective(name: str, *, torch_name: str, algos: Mapping[str, Algorithm], tensors: tuple, serve: Callable,
               kernels: Callable, bench: Callable, busbw: Callable, exact: bool, aliases: tuple = (),
               module: str) -> Collective:
    """Register a collective (see the module docstring); returns its entry. A name, torch name or alias
    that another module's entry already uses is an error."""
    c = Collective(name=name, torch_name=torch_name, algos=dict(algos), tensors=tuple(tensors), serve=serve,
                   kernels=kernels, bench=bench, busbw=busbw, exact=exact, aliases=tuple(aliases), module=module)
    taken = {s.lower(): e for e in _entries.values() if e.module != module for s in e.spellings()}
    clash = [s for s in c.spellings() if s.lower() in taken]
    if clash:
        raise ValueError(f"collective {name!r} ({module}): {clash} already mean {taken[clash[0].lower()].name!r} "
                         f"({taken[clash[0].lower()].module})")
    _entries[name] = c
    return c


def modules() -> list:
    """Every module of tilescale.ops (imported once, in name order)."""
    global _scanned
    pkg = __name__.rpartition(".")[0]
    mods = [importlib.import_module(f"{pkg}.{m.name}") for m in pkgutil.iter_modules([str(Path(__file__).parent)])]
    _scanned = True
    return mods


def collectives() -> tuple:
    """Every registered collective, by name."""
    if not _scanned:
        modules()
    return tuple(_entries[n] for n in sorted(_entries))


def find(spelling) -> Collective | None:
    """The collective a name, torch name or alias (any case) means, or None."""
    if not isinstance(spelling, str):
        return None
    s = spelling.lower()
    return next((c for c in collectives() if s in {x.lower() for x in c.spellings()}), None)


def canonical(spelling, arg: str = "collective") -> str:
    """The canonical name of a collective; a ValueError naming `arg` for anything else."""
    c = find(spelling)
    if c is None:
        raise ValueError(f"{arg}: got {spelling!r}, expected one of {', '.join(c.name for c in collectives())} "
                         "(or a torch.distributed name such as 'all_reduce')")
    return c.name
