"""tilescale's ops as torch operators (``torch.ops.tilescale.*``): traced by ``torch.compile(fullgraph=True)``
without a graph break, differentiable, and a drop-in for PyTorch's async-TP ops.

==========================================================  =========================================================
operator (``torch.ops.tilescale.``)                         result (W = world size, every op over all ranks)
==========================================================  =========================================================
``all_gather(x, W)``                                        ``torch.cat`` of every rank's x (dim 0)
``reduce_scatter(x, W)``                                    this rank's dim-0 slice of the sum of every rank's x
``all_reduce(x)`` / ``all_reduce_(x)``                      sum over ranks: a new tensor / in place (mutates x)
``all_to_all_single(x, output_splits, input_splits)``       ``dist.all_to_all_single`` (``[]``: equal splits)
``broadcast(x, src)``                                       rank src's x (a new tensor)
``ag_gemm(a, b, W)``                                        ``all_gather(a) @ b``, overlapped (AGGemm)
``ag_gemm_gathered(a, b, W)``                               ``(all_gather(a), all_gather(a) @ b)``
``gemm_rs(x, w, W)``                                        ``reduce_scatter(x @ w)``, overlapped (GemmRS)
==========================================================  =========================================================

Design (as ``torch.ops._c10d_functional``): every operator is functional (a new output; ``all_reduce_`` is
the one that mutates, declared), and those whose output shape depends on the world size take it as an
int argument, so their fake (meta) implementations need neither a GPU nor the runtime. The functions of
this module fill it in (:func:`world_size`, a constant to ``torch.compile``). ``all_gather``, ``reduce_scatter``
and the fused GEMMs take a process group too (``group=``: a ProcessGroup, its name or a 1-D DeviceMesh; the
operators' ``group_name``, '' for the whole world), W being its size (tilescale.runtime.team)::

    from tilescale.ops import torch_ops
    h = torch_ops.ag_gemm(x_local, w1)            # column-parallel: all_gather(x_local) @ w1
    y = torch_ops.gemm_rs(F.gelu(h), w2)          # row-parallel: reduce_scatter(h @ w2)

Autograd (``register_autograd``), with A sharded by rows and B this rank's column shard:
``C = ag_gemm(A, B)``: ``dA = gemm_rs(dC, B^T)`` (reduce_scatter of dC @ B^T, fused), ``dB = all_gather(A)^T @ dC``
(``ag_gemm`` gathers A again in the backward, as Megatron does; ``ag_gemm_gathered`` keeps its gathered A).
``Y = gemm_rs(X, W)``: ``(dY_full, dX) = ag_gemm_gathered(dY, W^T)`` (fused), ``dW = X^T @ dY_full``.
``all_gather`` and ``reduce_scatter`` are each other's backward.

Any shape: ``ag_gemm`` and ``gemm_rs`` take any rows per rank as they are (their kernels take them at run time:
tilescale.ops.op_cache.cached_op);
where the fused kernels cannot run a problem at all (a dtype other than bf16 / fp16, N or K not a multiple
of 8, gemm_rs with N not a multiple of 128) the operators run tilescale's collective and torch's GEMM
one after the other (correct, not overlapped) and say so on the debug log (``TILESCALE_DIST_DEBUG=1``).

Async-TP drop-ins on these operators: :mod:`tilescale.ops.async_tp`.

CUDA graph capture: every operator may be captured and replayed, forward and backward (no per-call state on the
host: see tilescale.ops.capture); make one eager call with the same shapes first, which builds the ops.
"""
import logging
import sys

import torch

log = logging.getLogger("tilescale.ops")

SERVED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)   # the drop-ins (fp32: collective + torch GEMM)


def _debug(op: str, msg: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("[rank %s] %s: %s", _backend().rank(), op, msg)


def _debug_to_stderr() -> None:
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tilescale.ops %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.DEBUG)


# ------------------------------------------------------------------------------------------ backend
class TilescaleBackend:
    """What the operators' real implementations call: tilescale's cached ops over the runtime's world.
    (The CPU tests put a simulated world in its place: ``torch_ops._BACKEND``.)"""

    def world_size(self) -> int:
        from .. import runtime

        return runtime.current().info.world_size

    def rank(self) -> int:
        from .. import runtime

        return runtime.current().info.rank if runtime.is_initialized() else -1

    def group_size(self, group_name: str) -> int:
        """The size of torch.distributed group `group_name` (OpArgumentError where tilescale cannot run it: a group
        whose ranks are not evenly spaced)."""
        from ..runtime import team

        return team.of_group("tilescale", group_name).size

    def is_world_group(self, group_name) -> bool:
        """Whether torch.distributed group `group_name` holds every rank of the runtime, in order (without the
        runtime: its NotInitializedError, which says what to call)."""
        import torch.distributed as dist

        from .. import compat

        ranks = list(range(self.world_size()))
        if group_name is None:
            return True
        try:
            return dist.get_process_group_ranks(compat.resolve_process_group(group_name)) == ranks
        except Exception:  # noqa: BLE001  (an unknown name: torch's op says what is wrong)
            return False

    def all_gather(self, x, group=None):
        from ..ops.allgather import all_gather

        return all_gather(x, group=group)

    def reduce_scatter(self, x, W: int, group=None):
        from ..ops.reduce_scatter import reduce_scatter_tensor

        out = x.new_empty((x.shape[0] // W, *x.shape[1:]))
        return reduce_scatter_tensor(out, x, group=group)

    def all_reduce_(self, x) -> None:
        from ..ops.allreduce import all_reduce

        all_reduce(x)

    def all_to_all_single(self, x, output_split_sizes, input_split_sizes):
        from ..ops.all_to_all import all_to_all_single

        rows = sum(output_split_sizes) if output_split_sizes else x.shape[0]
        out = x.new_empty((rows, *x.shape[1:]))
        return all_to_all_single(out, x, output_split_sizes or None, input_split_sizes or None)

    def broadcast_(self, x, src: int) -> None:
        from ..ops.broadcast_from_root import broadcast

        broadcast(x, src)

    def ag_gemm(self, a, b, return_gathered: bool, group=None):
        """(c, all_gather(a) or None): the fused op (rows padded where needed)."""
        from ..ops.allgather_gemm import ag_gemm

        r = ag_gemm(a, b, return_gathered=return_gathered, group=group)
        return r if return_gathered else (r, None)

    def gemm_rs(self, x, w, group=None):
        from ..ops.gemm_reduce_scatter import gemm_rs

        return gemm_rs(x, w, group=group)


_BACKEND = TilescaleBackend()


def _backend():
    return _BACKEND


@torch.compiler.assume_constant_result
def world_size(group_name: str = "") -> int:
    """The runtime's world size, or group `group_name`'s size (to ``torch.compile``: a constant of the traced
    program)."""
    return _backend().group_size(group_name) if group_name else _backend().world_size()


def group_name(group) -> str:
    """The operators' ``group_name`` of `group`: '' for None (the whole world), the name of a ProcessGroup or of a
    1-D DeviceMesh's group, or a name as it is."""
    if group is None or isinstance(group, str):
        return group or ""
    if type(group).__name__ == "DeviceMesh":
        group = group.get_group()
    name = getattr(group, "group_name", None)
    if not isinstance(name, str):
        from ..arguments import describe, fail

        fail("tilescale.ops.torch_ops", "group", describe(group), "None (the whole world), a torch.distributed "
             "ProcessGroup, its name or a 1-D DeviceMesh", type_error=True)
    return name


def _in(group_name: str) -> dict:
    """The backend's keyword arguments for `group_name` (none for the whole world)."""
    return {"group": group_name} if group_name else {}


# --------------------------------------------------------------------------------- when not fused
def why_not_fused(op: str, rows: int, N: int, K: int, dtype, W: int, group_name: str = "") -> str | None:
    """Why the fused kernel of `op` ("ag_gemm" or "gemm_rs") cannot run this problem (rows per rank, N,
    K, with K the local K of gemm_rs) among the W ranks of `group_name` (empty: the world), or None when it can
    (the config of the rows' bound, as tilescale.ops.op_cache.cached_op chooses it)."""
    from ..ops import checks
    from ..ops.gemm import check, gemm_config
    from ..ops.op_cache import row_bound

    if checks.dtype_name(dtype) not in checks.GEMM_DTYPES:
        return f"dtype {dtype} (the fused GEMMs take bfloat16 / float16)"
    if min(rows, N, K) < 1:
        return f"an empty problem (rows {rows}, N={N}, K={K})"
    if K % 8 or N % 8:
        return f"K={K}, N={N}: rows of the operands must be whole 16-byte vectors (multiples of 8 elements)"
    if op == "gemm_rs" and N % 128:
        return f"N={N} is not a multiple of 128 (the reduction's column tile)"
    if op == "gemm_rs":   # the push kernel's configs, or the pull path's GEMM's (as gemm_rs chooses them)
        from ..ops.gemm_rs_path import default_path
        from ..runtime import team

        t = team.of_group("gemm_rs", group_name) if group_name else None   # (the path follows the group's nodes)
        op = "gemm_rs_push" if default_path(W, K, team=t) == "push" else "gemm_rs"
    M = row_bound(rows) * W
    return check(gemm_config(M, N, K, world_size=W, op=op), M, N, K, world_size=W, op=op)


def _dense(t):
    """`t` as the kernels take it: contiguous and 16-byte aligned (a copy only where it is not)."""
    if not t.is_contiguous():
        return t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


# ------------------------------------------------------------------------------------- collectives
@torch.library.custom_op("tilescale::all_gather", mutates_args=())
def _all_gather(x: torch.Tensor, world_size: int, group_name: str = "") -> torch.Tensor:
    return _backend().all_gather(x.contiguous(), **_in(group_name))


@_all_gather.register_fake
def _(x, world_size, group_name=""):
    torch._check(x.dim() >= 1, lambda: "tilescale::all_gather: x must have at least one dimension")
    return x.new_empty((world_size * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("tilescale::reduce_scatter", mutates_args=())
def _reduce_scatter(x: torch.Tensor, world_size: int, group_name: str = "") -> torch.Tensor:
    if x.shape[0] % world_size:
        raise ValueError(f"tilescale::reduce_scatter: x: got {x.shape[0]} rows, expected a multiple of the world "
                         f"size {world_size}")
    return _backend().reduce_scatter(x.contiguous(), world_size, **_in(group_name))


@_reduce_scatter.register_fake
def _(x, world_size, group_name=""):
    torch._check(x.dim() >= 1, lambda: "tilescale::reduce_scatter: x must have at least one dimension")
    torch._check(x.shape[0] % world_size == 0,
                 lambda: f"tilescale::reduce_scatter: rows of x must be a multiple of the world size {world_size}")
    return x.new_empty((x.shape[0] // world_size, *x.shape[1:]))


def _all_gather_setup(ctx, inputs, output):
    ctx.world_size, ctx.group_name = inputs[1], inputs[2] if len(inputs) > 2 else ""


def _all_gather_backward(ctx, g):
    return torch.ops.tilescale.reduce_scatter(g, ctx.world_size, ctx.group_name), None, None


def _reduce_scatter_backward(ctx, g):
    return torch.ops.tilescale.all_gather(g, ctx.world_size, ctx.group_name), None, None


_all_gather.register_autograd(_all_gather_backward, setup_context=_all_gather_setup)
_reduce_scatter.register_autograd(_reduce_scatter_backward, setup_context=_all_gather_setup)


@torch.library.custom_op("tilescale::all_reduce", mutates_args=())
def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x.clone(memory_format=torch.contiguous_format)
    _backend().all_reduce_(y)
    return y


@_all_reduce.register_fake
def _(x):
    return x.new_empty(x.shape)


@torch.library.custom_op("tilescale::all_reduce_", mutates_args=("x",))
def _all_reduce_inplace(x: torch.Tensor) -> None:
    _backend().all_reduce_(x)


@_all_reduce_inplace.register_fake
def _(x):
    return None


@torch.library.custom_op("tilescale::all_to_all_single", mutates_args=())
def _all_to_all_single(x: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int]) -> torch.Tensor:
    return _backend().all_to_all_single(x.contiguous(), list(output_split_sizes), list(input_split_sizes))


@_all_to_all_single.register_fake
def _(x, output_split_sizes, input_split_sizes):
    rows = sum(output_split_sizes) if len(output_split_sizes) else x.shape[0]
    return x.new_empty((rows, *x.shape[1:]))


@torch.library.custom_op("tilescale::broadcast", mutates_args=())
def _broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    y = x.clone(memory_format=torch.contiguous_format)
    _backend().broadcast_(y, src)
    return y


@_broadcast.register_fake
def _(x, src):
    return x.new_empty(x.shape)


# -------------------------------------------------------------------------------------- fused GEMMs
def _check_gemm(op: str, a, b) -> None:
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: f"tilescale::{op}: expected 2-D operands, got "
                 f"{tuple(a.shape)} and {tuple(b.shape)}")
    torch._check(a.shape[1] == b.shape[0], lambda: f"tilescale::{op}: inner sizes differ: {tuple(a.shape)} @ "
                 f"{tuple(b.shape)}")
    torch._check(a.dtype == b.dtype, lambda: f"tilescale::{op}: dtypes differ: {a.dtype} and {b.dtype}")


def _ag_gemm_impl(a, b, world_size: int, gathered: bool, group_name: str):
    _check_gemm("ag_gemm", a, b)
    be = _backend()
    why = why_not_fused("ag_gemm", a.shape[0], b.shape[1], a.shape[1], a.dtype, world_size)
    if why is None:
        return be.ag_gemm(a, _dense(b), gathered, **_in(group_name))
    _debug("ag_gemm", f"not fused ({why}): all_gather, then torch.matmul")
    a_full = be.all_gather(a.contiguous(), **_in(group_name))
    return a_full @ b, a_full


@torch.library.custom_op("tilescale::ag_gemm", mutates_args=())
def _ag_gemm(a: torch.Tensor, b: torch.Tensor, world_size: int, group_name: str = "") -> torch.Tensor:
    return _ag_gemm_impl(a, b, world_size, False, group_name)[0]


@_ag_gemm.register_fake
def _(a, b, world_size, group_name=""):
    _check_gemm("ag_gemm", a, b)
    return a.new_empty((world_size * a.shape[0], b.shape[1]))


@torch.library.custom_op("tilescale::ag_gemm_gathered", mutates_args=())
def _ag_gemm_gathered(a: torch.Tensor, b: torch.Tensor, world_size: int,
                      group_name: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    c, a_full = _ag_gemm_impl(a, b, world_size, True, group_name)
    return a_full, c


@_ag_gemm_gathered.register_fake
def _(a, b, world_size, group_name=""):
    _check_gemm("ag_gemm_gathered", a, b)
    return a.new_empty((world_size * a.shape[0], a.shape[1])), a.new_empty((world_size * a.shape[0], b.shape[1]))


@torch.library.custom_op("tilescale::gemm_rs", mutates_args=())
def _gemm_rs(x: torch.Tensor, w: torch.Tensor, world_size: int, group_name: str = "") -> torch.Tensor:
    _check_gemm("gemm_rs", x, w)
    if x.shape[0] % world_size:
        raise ValueError(f"tilescale::gemm_rs: x: got {x.shape[0]} rows, expected a multiple of the world size "
                         f"{world_size}")
    be = _backend()
    why = why_not_fused("gemm_rs", x.shape[0] // world_size, w.shape[1], x.shape[1], x.dtype, world_size, group_name)
    if why is None:
        return be.gemm_rs(_dense(x), _dense(w), **_in(group_name))
    _debug("gemm_rs", f"not fused ({why}): torch.matmul, then reduce_scatter")
    return be.reduce_scatter(x @ w, world_size, **_in(group_name))


@_gemm_rs.register_fake
def _(x, w, world_size, group_name=""):
    _check_gemm("gemm_rs", x, w)
    torch._check(x.shape[0] % world_size == 0,
                 lambda: f"tilescale::gemm_rs: rows of x must be a multiple of the world size {world_size}")
    return x.new_empty((x.shape[0] // world_size, w.shape[1]))


def _save_inputs(ctx, inputs, output):
    a, b, ctx.world_size, *g = inputs
    ctx.group_name = g[0] if g else ""
    ctx.save_for_backward(a, b)


def _ag_gemm_backward(ctx, dc):
    a, b = ctx.saved_tensors
    W, g = ctx.world_size, ctx.group_name
    da = db = None
    if ctx.needs_input_grad[0]:            # rows of this rank of sum over ranks of dC_r @ B_r^T
        da = torch.ops.tilescale.gemm_rs(dc, b.t(), W, g)
    if ctx.needs_input_grad[1]:
        db = torch.ops.tilescale.all_gather(a, W, g).t() @ dc
    return da, db, None, None


def _ag_gemm_gathered_setup(ctx, inputs, output):
    _, b, ctx.world_size, *g = inputs
    ctx.group_name = g[0] if g else ""
    ctx.save_for_backward(output[0], b)    # the gathered A: no second gather in the backward
    ctx.set_materialize_grads(False)       # an unused output's gradient stays None (eager)


def _ag_gemm_gathered_backward(ctx, da_full, dc):
    a_full, b = ctx.saved_tensors
    W, g = ctx.world_size, ctx.group_name
    da = db = None
    if ctx.needs_input_grad[0]:
        if dc is None:
            da = None if da_full is None else torch.ops.tilescale.reduce_scatter(da_full, W, g)
        elif da_full is None:
            da = torch.ops.tilescale.gemm_rs(dc, b.t(), W, g)
        else:                              # both outputs used: one reduce_scatter of the summed gradient
            da = torch.ops.tilescale.reduce_scatter(torch.addmm(da_full, dc, b.t()), W, g)
    if ctx.needs_input_grad[1] and dc is not None:
        db = a_full.t() @ dc
    return da, db, None, None


def _gemm_rs_backward(ctx, dy):
    x, w = ctx.saved_tensors
    W, g = ctx.world_size, ctx.group_name
    dx = dw = None
    if ctx.needs_input_grad[0]:            # all_gather(dY) @ W^T, fused; keeps the gathered dY for dW
        dy_full, dx = torch.ops.tilescale.ag_gemm_gathered(dy, w.t(), W, g)
    elif ctx.needs_input_grad[1]:
        dy_full = torch.ops.tilescale.all_gather(dy, W, g)
    if ctx.needs_input_grad[1]:
        dw = x.t() @ dy_full
    return dx, dw, None, None


_ag_gemm.register_autograd(_ag_gemm_backward, setup_context=_save_inputs)
_ag_gemm_gathered.register_autograd(_ag_gemm_gathered_backward, setup_context=_ag_gemm_gathered_setup)
_gemm_rs.register_autograd(_gemm_rs_backward, setup_context=_save_inputs)


# ------------------------------------------------------------------------------ torch-style functions
def all_gather(x, *, group=None):
    """``torch.cat`` of every rank's `x` along dim 0 (of `group`'s ranks; differentiable: backward reduce_scatter)."""
    g = group_name(group)
    return torch.ops.tilescale.all_gather(x, world_size(g), g)


def reduce_scatter(x, *, group=None):
    """This rank's dim-0 slice of the sum over ranks (of `group`; differentiable: backward all_gather)."""
    g = group_name(group)
    return torch.ops.tilescale.reduce_scatter(x, world_size(g), g)


def all_reduce(x):
    """The sum over ranks, a new tensor (``all_reduce_`` for in place)."""
    return torch.ops.tilescale.all_reduce(x)


def all_reduce_(x):
    """The sum over ranks into `x` (declared as mutating it); returns `x`."""
    torch.ops.tilescale.all_reduce_(x)
    return x


def all_to_all_single(x, output_split_sizes=None, input_split_sizes=None):
    """``dist.all_to_all_single`` returning a new tensor (None: equal splits)."""
    return torch.ops.tilescale.all_to_all_single(x, list(output_split_sizes or []), list(input_split_sizes or []))


def broadcast(x, src: int):
    """Rank `src`'s `x`, a new tensor on every rank."""
    return torch.ops.tilescale.broadcast(x, src)


def ag_gemm(a, b, *, group=None):
    """``all_gather(a) @ b`` (A by rows, B local; over `group`'s ranks), overlapped, differentiable."""
    g = group_name(group)
    return torch.ops.tilescale.ag_gemm(a, b, world_size(g), g)


def ag_gemm_gathered(a, b, *, group=None):
    """``(all_gather(a), all_gather(a) @ b)`` (over `group`'s ranks), differentiable through both outputs."""
    g = group_name(group)
    return torch.ops.tilescale.ag_gemm_gathered(a, b, world_size(g), g)


def gemm_rs(x, w, *, group=None):
    """``reduce_scatter(x @ w)`` (x: every row, this rank's K slice; over `group`'s ranks), overlapped,
    differentiable."""
    g = group_name(group)
    return torch.ops.tilescale.gemm_rs(x, w, world_size(g), g)


def _init_debug() -> None:
    try:
        from ..env import settings

        if settings.dist_debug:
            _debug_to_stderr()
    except Exception:  # noqa: BLE001  (the debug switch never stops the import)
        pass


_init_debug()
