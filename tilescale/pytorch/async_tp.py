"""Drop-ins for PyTorch's async-TP ops (``torch.ops.symm_mem``), on tilescale's torch operators
(:mod:`tilescale.pytorch.torch_ops`): :func:`fused_all_gather_matmul` and :func:`fused_matmul_reduce_scatter`
take the arguments of ``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` and
return what they return, so code written for async-TP switches by name::

    A, (C,) = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group_name)
    A, (C,) = tilescale.ops.fused_all_gather_matmul(A_shard, [B], 0, group_name)     # the same

The same as torch (the installed torch's ``torch/distributed/_symmetric_memory``; CPU tests compare with its
meta kernels, tests/test_async_tp_cpu.py): the signatures, the shapes, the dtypes (the operands') and the
strides of every result:

* ``fused_all_gather_matmul``, ``gather_dim`` g before the last dim: the gathered A and every output are laid out
  as a contiguous tensor whose dims are (g, then the others in order), moved back to their places (contiguous
  for g = 0; for A_shard (8, 16, 32) gathered along dim 1 over 4 ranks, A (8, 64, 32) has strides (32, 256, 1));
  g = the last dim: contiguous;
* ``fused_matmul_reduce_scatter``: contiguous, for every ``scatter_dim``.

How each call runs (W = world size; the dims before the last are flattened into rows, ``gather_dim`` /
``scatter_dim`` first, which copies A unless ``A.movedim(dim, 0)`` is contiguous: torch's
``restride_A_shard_for_fused_all_gather_matmul`` / ``restride_A_for_fused_matmul_reduce_scatter`` give that
layout, and Inductor's pass passes it):

* all-gather, g before the last dim: one AG+GEMM (``torch.ops.tilescale.ag_gemm``, fused, gather overlapped with
  the GEMM). Several Bs (bf16, fp16) run as one AG+GEMM over ``torch.cat(Bs, dim=1)``, so the gather is overlapped
  with every B's GEMM; that costs one copy of the Bs per call, and one of the output to split it into the
  contiguous outputs torch returns. fp32 (no fused kernel): all_gather, then one GEMM per B;
* all-gather along the last dim (K): tilescale's all_gather, then torch's GEMMs (not overlapped);
* reduce-scatter, scatter_dim before the last dim: one GEMM+RS (``torch.ops.tilescale.gemm_rs``, fused); the
  result (1/W of A @ B) copied into torch's contiguous layout where scatter_dim > 0; "avg": that, divided by W;
* reduce-scatter along the last dim (columns): torch's GEMM, then tilescale's reduce_scatter (not overlapped).

`group_name`: the whole world, or a group of evenly spaced ranks (a TP group of a DP x TP job; W is then its size:
tilescale.runtime.team). Calls tilescale cannot serve go to torch's own op, with a debug line
(``TILESCALE_DIST_DEBUG=1``): a group whose ranks are not evenly spaced, a reduce_op other than "sum" / "avg", a
dtype other than bf16 / fp16 / fp32 or operands of different dtypes. Not covered: torch's fp8 variants
(``fused_all_gather_scaled_matmul``, ``fused_scaled_matmul_reduce_scatter``: ``out_dtype``, ``orig_scatter_dim``),
which stay torch's. Inductor's micro-pipeline TP pass on these: :mod:`.inductor_async_tp`.
"""
import torch

from ..arguments import describe, fail
from .torch_ops import (
    SERVED_DTYPES,
    _backend,
    _debug,
    ag_gemm,
    ag_gemm_gathered,
    all_gather,
    gemm_rs,
    reduce_scatter,
    world_size,
)

FUSED_DTYPES = (torch.bfloat16, torch.float16)     # the dtypes of the fused GEMMs (fp32: collective, then GEMM)
AG, RS = "fused_all_gather_matmul", "fused_matmul_reduce_scatter"


def torch_op(op: str):
    """``torch.ops.symm_mem.<op>``, registered first (what the drop-ins fall back to)."""
    from .. import compat

    compat.symm_mem_module()
    return getattr(torch.ops.symm_mem, op)


@torch.compiler.assume_constant_result
def _group_served(group_name) -> str:
    """'' where tilescale serves `group_name`, else why not (a constant to torch.compile)."""
    if _backend().is_world_group(group_name):
        return ""
    try:
        _backend().group_size(group_name)
    except Exception as e:  # noqa: BLE001  (an unknown name, ranks not evenly spaced: torch's op serves it)
        return f"group {group_name!r}: {e}"
    return ""


@torch.compiler.assume_constant_result
def _group(group_name) -> str:
    """The torch operators' group name of a served `group_name`: '' for the whole world (a constant to
    torch.compile)."""
    return "" if _backend().is_world_group(group_name) else group_name


def why_not_served(group_name, tensors, reduce_op=None) -> str:
    """Why tilescale does not serve a call of these operands ('' where it does)."""
    why = _group_served(group_name)
    if why:
        return why
    if reduce_op is not None and reduce_op not in ("sum", "avg"):
        return f"reduce_op {reduce_op!r} (tilescale reduces by sum)"
    for t in tensors:
        if t.dtype not in SERVED_DTYPES or t.dtype != tensors[0].dtype:
            return f"dtype {t.dtype}" + ("" if t.dtype in SERVED_DTYPES else " (tilescale: bf16, fp16, fp32)")
    return ""


def _to_torch(op: str, why: str, fallback):
    if not torch.compiler.is_compiling():
        _debug(op, f"torch.ops.symm_mem.{op} ({why})")
    return fallback(op)


def _dim(op: str, arg: str, dim, nd: int, tensor: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -nd <= dim < nd:
        fail(op, arg, describe(dim), f"a dim of the {nd}-D {tensor}, in [{-nd}, {nd})")
    return dim + nd if dim < 0 else dim


def _check_matrix(op: str, arg: str, t, at_least: bool = False) -> None:
    if not isinstance(t, torch.Tensor) or (t.dim() < 2 if at_least else t.dim() != 2):
        fail(op, arg, describe(t), "a tensor of at least 2 dims" if at_least else "a 2-D tensor (a matrix)",
             type_error=not isinstance(t, torch.Tensor))


# ---------------------------------------------------------------------------------------------- all-gather
def fused_all_gather_matmul(A_shard, Bs, gather_dim: int, group_name, *, return_A: bool = True):
    """``torch.ops.symm_mem.fused_all_gather_matmul``: ``A = all_gather(A_shard, dim=gather_dim)`` and
    ``[A @ B for B in Bs]``; returns ``(A if return_A else None, outputs)``, laid out as torch's (module docstring).
    A_shard has at least 2 dims; gather_dim may be negative. Falls back to torch's op where tilescale does not
    serve the call (module docstring)."""
    return all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A, torch_op)


def all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A: bool, fallback):
    """:func:`fused_all_gather_matmul`, falling back to ``fallback(op)`` (a callable of torch's op's arguments)."""
    Bs = list(Bs)
    _check_matrix(AG, "A_shard", A_shard, at_least=True)
    if not Bs:
        fail(AG, "Bs", "an empty list", "at least one B")
    for i, B in enumerate(Bs):
        _check_matrix(AG, f"Bs[{i}]", B)
    why = why_not_served(group_name, [A_shard, *Bs])
    if why:
        return _to_torch(AG, why, fallback)(A_shard, Bs, gather_dim, group_name, return_A=return_A)
    nd = A_shard.dim()
    g = _dim(AG, "gather_dim", gather_dim, nd, "A_shard")
    group = _group(group_name)
    W = world_size(group)
    K = A_shard.shape[-1] * (W if g == nd - 1 else 1)
    for i, B in enumerate(Bs):
        if B.shape[0] != K:
            fail(AG, f"Bs[{i}]", describe(B), f"{K} rows: the last dim of A = all_gather(A_shard of shape "
                 f"{tuple(A_shard.shape)}, dim={gather_dim}) over {W} ranks")
    if g == nd - 1:
        return _gather_last_dim(A_shard, Bs, W, return_A, group)
    a = A_shard.movedim(g, 0)                      # (dim g, the other dims..., K): rows = every dim but the last
    full = (W * a.shape[0], *a.shape[1:-1])        # the gathered rows: rank 0's, then rank 1's, ...
    A2, outs = _gemms(a.reshape(-1, a.shape[-1]), Bs, return_A, group)
    outs = [c.view(*full, c.shape[-1]).movedim(0, g) for c in outs]
    return (A2.view(*full, A2.shape[-1]).movedim(0, g) if return_A else None), outs


def _gemms(a2, Bs, return_A: bool, group: str):
    """(the gathered a2 or None, [all_gather(a2) @ B for B in Bs]), each contiguous: one AG+GEMM over every B."""
    if len(Bs) == 1:
        A2, c = ag_gemm_gathered(a2, Bs[0], group=group) if return_A else (None, ag_gemm(a2, Bs[0], group=group))
        return A2, [c]
    if a2.dtype in FUSED_DTYPES:                   # the gather overlapped with every B's GEMM: one GEMM of them all
        B = torch.cat(Bs, dim=1)
        A2, c = ag_gemm_gathered(a2, B, group=group) if return_A else (None, ag_gemm(a2, B, group=group))
        return A2, [part.contiguous() for part in c.split([b.shape[1] for b in Bs], dim=1)]
    A2, c0 = ag_gemm_gathered(a2, Bs[0], group=group)    # no fused kernel: all_gather, then a GEMM per B
    return (A2 if return_A else None), [c0, *(A2 @ B for B in Bs[1:])]


def _gather_last_dim(A_shard, Bs, W: int, return_A: bool, group: str):
    """All-gather along the last dim (K): tilescale's all_gather of the rows, then torch's GEMMs (contiguous)."""
    lead, k = A_shard.shape[:-1], A_shard.shape[-1]
    a2 = A_shard.reshape(-1, k)
    rows = a2.shape[0]
    A2 = all_gather(a2, group=group).view(W, rows, k).transpose(0, 1).reshape(rows, W * k)   # rank r's columns at r * k
    outs = [(A2 @ B).view(*lead, B.shape[1]) for B in Bs]
    return (A2.view(*lead, W * k) if return_A else None), outs


# ------------------------------------------------------------------------------------------ reduce-scatter
def fused_matmul_reduce_scatter(A, B, reduce_op: str, scatter_dim: int, group_name):
    """``torch.ops.symm_mem.fused_matmul_reduce_scatter``: ``reduce_scatter(A @ B, reduce_op, scatter_dim)``
    ("sum" or "avg"), contiguous as torch's; A has at least 2 dims, B is a matrix; scatter_dim may be negative.
    Falls back to torch's op where tilescale does not serve the call (module docstring)."""
    return matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, torch_op)


def matmul_reduce_scatter(A, B, reduce_op: str, scatter_dim, group_name, fallback):
    """:func:`fused_matmul_reduce_scatter`, falling back to ``fallback(op)``."""
    _check_matrix(RS, "A", A, at_least=True)
    _check_matrix(RS, "B", B)
    why = why_not_served(group_name, [A, B], reduce_op)
    if why:
        return _to_torch(RS, why, fallback)(A, B, reduce_op, scatter_dim, group_name)
    nd = A.dim()
    s = _dim(RS, "scatter_dim", scatter_dim, nd, "A")
    if B.shape[0] != A.shape[-1]:
        fail(RS, "B", describe(B), f"{A.shape[-1]} rows (the last dim of A, of shape {tuple(A.shape)})")
    group = _group(group_name)
    W = world_size(group)
    n = B.shape[1] if s == nd - 1 else A.shape[s]
    if n % W:
        fail(RS, "scatter_dim", describe(scatter_dim), f"a dim of A @ B whose size ({n} here) is a multiple of the "
             f"world size {W}")
    if s == nd - 1:                                # columns: torch's GEMM, then tilescale's reduce_scatter
        lead, N = A.shape[:-1], B.shape[1]
        p = A.reshape(-1, A.shape[-1]) @ B
        rows = p.shape[0]
        y = reduce_scatter(p.view(rows, W, N // W).transpose(0, 1).reshape(W * rows, N // W), group=group)
        y = y.view(*lead, N // W)
    else:
        a = A.movedim(s, 0)
        y = gemm_rs(a.reshape(-1, a.shape[-1]), B, group=group)
        y = y.view(a.shape[0] // W, *a.shape[1:-1], y.shape[-1]).movedim(0, s).contiguous()
    return y / W if reduce_op == "avg" else y
