"""What a kernel's IR says about distribution: which distributed calls it makes, and which of its
tensor parameters those calls use as symmetric (remotely addressed) memory."""
from __future__ import annotations

from tilelang import tvm
from tvm import tirx

from ..compat import post_order_visit

# Device functions that make a kernel distributed (prefixes of the callee name).
DISTRIBUTED_PREFIXES = ("nvshmem", "tilescale::")

# Arguments (0-based, after the callee name) that must point into the symmetric heap.
# Keys are callee names without template arguments.
SYMMETRIC_ARGS: dict[str, tuple[int, ...]] = {}


def register_symmetric_args(callee: str, positions: tuple[int, ...]) -> None:
    SYMMETRIC_ARGS[callee] = positions


_CALL_EXTERN = tvm.ir.Op.get("tirx.call_extern")


def _extern_calls(func):
    out = []

    def visit(n):
        if isinstance(n, tirx.Call) and n.op.same_as(_CALL_EXTERN) and n.args and isinstance(n.args[0], tirx.StringImm):
            out.append(n)

    post_order_visit(func.body, visit)
    return out


def _base_name(callee: str) -> str:
    return callee.split("<", 1)[0]


def distributed_calls(func) -> list[tirx.Call]:
    return [c for c in _extern_calls(func) if str(c.args[0].value).startswith(DISTRIBUTED_PREFIXES)]


def describe_distributed_calls(func) -> list[str]:
    """Distinct callee names of the distributed calls in `func`, in order of first use."""
    seen: dict[str, None] = {}
    for c in distributed_calls(func):
        seen.setdefault(_base_name(str(c.args[0].value)), None)
    return list(seen)


def uses_distributed(func) -> bool:
    return bool(distributed_calls(func))


def symmetric_params(func) -> list[str]:
    """Names of `func`'s tensor parameters that distributed calls address remotely."""
    data_to_param = {}
    for p in func.params:
        buf = func.buffer_map.get(p, None)
        if buf is not None:
            data_to_param[buf.data] = buf.name
    found: dict[str, None] = {}
    for c in distributed_calls(func):
        positions = SYMMETRIC_ARGS.get(_base_name(str(c.args[0].value)))
        if not positions:
            continue
        for pos in positions:
            if pos + 1 >= len(c.args):
                continue

            def visit(n):
                var = n.buffer.data if isinstance(n, (tirx.BufferLoad, tirx.BufferRegion)) else n
                if isinstance(var, tirx.Var) and var in data_to_param:
                    found.setdefault(data_to_param[var], None)

            post_order_visit(c.args[pos + 1], visit)
    return list(found)


def param_names(func) -> list[str]:
    """Names of the kernel's parameters as the caller passes them (buffers by buffer name)."""
    names = []
    for p in func.params:
        buf = func.buffer_map.get(p, None)
        names.append(buf.name if buf is not None else p.name)
    return names
