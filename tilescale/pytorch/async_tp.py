"""Drop-ins for PyTorch's async-TP ops (``torch.ops.symm_mem``), on tilescale's torch operators
(:mod:`tilescale.ops.torch_ops`): :func:`fused_all_gather_matmul` and :func:`fused_matmul_reduce_scatter`
take the arguments of ``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` and
return what they return, so code written for async-TP switches by name::

    A, (C,) = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group_name)
    A, (C,) = tilescale.ops.fused_all_gather_matmul(A_shard, [B], 0, group_name)     # the same

Calls tilescale cannot serve (a group other than the whole world, a reduce_op other than "sum" / "avg", a
dtype other than bf16 / fp16 / fp32) go to torch's op, with a debug line (``TILESCALE_DIST_DEBUG=1``).
"""
import importlib

import torch

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


@torch.compiler.assume_constant_result
def _torch_serves(group_name) -> str:
    """'' where tilescale serves `group_name`, else why not (a constant to torch.compile)."""
    return "" if _backend().is_world_group(group_name) else f"group {group_name!r} is not the whole world"


def _to_torch(op: str, why: str):
    if not torch.compiler.is_compiling():
        _debug(op, f"torch.ops.symm_mem.{op} ({why})")
    importlib.import_module("torch.distributed._symmetric_memory")   # registers torch.ops.symm_mem
    return getattr(torch.ops.symm_mem, op)


def _why_torch(op: str, group_name, tensors, reduce_op=None) -> str:
    why = _torch_serves(group_name)
    if why:
        return why
    if reduce_op is not None and reduce_op not in ("sum", "avg"):
        return f"reduce_op {reduce_op!r} (tilescale reduces by sum)"
    for t in tensors:
        if t.dtype not in SERVED_DTYPES or t.dtype != tensors[0].dtype:
            return f"dtype {t.dtype}" + ("" if t.dtype in SERVED_DTYPES else " (tilescale: bf16, fp16, fp32)")
    return ""


def fused_all_gather_matmul(A_shard, Bs, gather_dim: int, group_name, *, return_A: bool = True):
    """``torch.ops.symm_mem.fused_all_gather_matmul``: ``A = all_gather(A_shard, dim=gather_dim)`` and
    ``[A @ B for B in Bs]``; returns ``(A if return_A else None, outputs)``. A has any number of leading
    dims; the first B runs fused with the gather (AG+GEMM), the others as ``A @ B`` on the gathered A.
    gather_dim = the last dim (A gathered along K): tilescale's all_gather, then torch's GEMMs."""
    Bs = list(Bs)
    why = _why_torch("fused_all_gather_matmul", group_name, [A_shard, *Bs])
    if why:
        return _to_torch("fused_all_gather_matmul", why)(A_shard, Bs, gather_dim, group_name, return_A=return_A)
    if A_shard.dim() < 2:
        raise ValueError("fused_all_gather_matmul: A_shard must be a matrix")
    if not Bs or any(B.dim() != 2 for B in Bs):
        raise ValueError("fused_all_gather_matmul: Bs must be 2-D matrices")
    nd = A_shard.dim()
    g = gather_dim + nd if gather_dim < 0 else gather_dim
    if not 0 <= g < nd:
        raise ValueError(f"fused_all_gather_matmul: invalid gather_dim {gather_dim} for {nd}-D A_shard")
    W = world_size()
    if g == nd - 1:                        # gathered along K: concatenated columns
        A = all_gather(A_shard.movedim(-1, 0)).movedim(0, -1)
        return (A if return_A else None), [A @ B for B in Bs]
    a = A_shard.movedim(g, 0)              # (rows of gather_dim, other leading dims..., K)
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    if return_A or len(Bs) > 1:
        A2, c0 = ag_gemm_gathered(a2, Bs[0])
    else:
        A2, c0 = None, ag_gemm(a2, Bs[0])
    outs = [c0] + [A2 @ B for B in Bs[1:]]
    full = (W * lead[0], *lead[1:])
    outs = [c.view(*full, c.shape[-1]).movedim(0, g) for c in outs]
    A = A2.view(*full, A2.shape[-1]).movedim(0, g) if return_A else None
    return A, outs


def fused_matmul_reduce_scatter(A, B, reduce_op: str, scatter_dim: int, group_name):
    """``torch.ops.symm_mem.fused_matmul_reduce_scatter``: ``reduce_scatter(A @ B, reduce_op, scatter_dim)``
    ("sum" or "avg") with A of any number of leading dims (GEMM+RS, fused); scatter_dim = the last dim
    (columns scattered): torch's GEMM, then tilescale's reduce_scatter."""
    why = _why_torch("fused_matmul_reduce_scatter", group_name, [A, B], reduce_op)
    if why:
        return _to_torch("fused_matmul_reduce_scatter", why)(A, B, reduce_op, scatter_dim, group_name)
    if A.dim() < 2:
        raise ValueError("fused_matmul_reduce_scatter: A must be a matrix")
    if B.dim() != 2:
        raise ValueError("fused_matmul_reduce_scatter: B must be a matrix")
    nd = A.dim()
    s = scatter_dim + nd if scatter_dim < 0 else scatter_dim
    if not 0 <= s < nd:
        raise ValueError(f"fused_matmul_reduce_scatter: invalid scatter_dim {scatter_dim} for {nd}-D A")
    W = world_size()
    n = B.shape[1] if s == nd - 1 else A.shape[s]
    if n % W:
        raise ValueError(f"fused_matmul_reduce_scatter: dim {scatter_dim} of A @ B has {n} elements, expected a "
                         f"multiple of the world size {W}")
    if s == nd - 1:
        y = reduce_scatter((A @ B).movedim(-1, 0)).movedim(0, -1)
    else:
        a = A.movedim(s, 0)
        lead = a.shape[:-1]
        y = gemm_rs(a.reshape(-1, a.shape[-1]), B)
        y = y.view(lead[0] // W, *lead[1:], y.shape[-1]).movedim(0, s)
    return y / W if reduce_op == "avg" else y
