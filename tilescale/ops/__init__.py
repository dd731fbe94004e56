"""Kernels built with tilescale, behind torch-like entry points.

==================================  ===============================================================
op                                  torch equivalent
==================================  ===============================================================
``all_gather(x)``                   ``torch.cat([x from every rank])`` (``dist.all_gather_into_tensor``)
``all_gather_into_tensor(out, x)``  ``dist.all_gather_into_tensor(out, x)``
``ag_gemm(a_local, b)``             ``all_gather(a_local) @ b``, communication overlapped with the GEMM
``gemm_rs(x, w)``                   ``reduce_scatter(x @ w)``, reduction overlapped with the GEMM
``all_reduce(t)``                   ``dist.all_reduce(t)`` (sum; one-shot below ``ONE_SHOT_MAX_BYTES``, else two-shot)
``reduce_scatter_tensor(o, i)``     ``dist.reduce_scatter_tensor(o, i)`` (sum)
``all_to_all_single(o, i, os, is)`` ``dist.all_to_all_single(o, i, os, is)`` (equal or variable splits)
``broadcast(t, src)``               ``dist.broadcast(t, src)``
==================================  ===============================================================

The same as torch operators (``torch.ops.tilescale.*``: ``torch.compile(fullgraph=True)`` traces them,
the fused ones are differentiable): :mod:`tilescale.ops.torch_ops` (registered when it is first imported,
or at the first use of ``tilescale.ops.torch_ops``); with it, drop-ins for PyTorch's async-TP ops,
``tilescale.ops.fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` (``torch.ops.symm_mem``'s
arguments and results).

``tilescale.ops.broadcast`` is the function; its module is ``sys.modules["tilescale.ops.broadcast"]`` (or
``from tilescale.ops.broadcast import ...``).

The classes (``AllGather``, ``AGGemm``, ``GemmRS``, ``AllReduce``, ``ReduceScatter``, ``AllToAll``,
``Broadcast``) own their symmetric buffers: build them once per
shape (collective) and call them; the functions cache one per shape.
"""
from .ag_gemm import AGGemm, ag_gemm
from .allgather import AllGather, all_gather, all_gather_into_tensor
from .all_to_all import AllToAll, all_to_all_single
from .allreduce import ONE_SHOT_MAX_BYTES, AllReduce, all_reduce
from .broadcast import Broadcast, broadcast
from .gemm_rs import GemmRS, gemm_rs
from .reduce_scatter import ReduceScatter, reduce_scatter_tensor

__all__ = ["AllGather", "all_gather", "all_gather_into_tensor", "AGGemm", "ag_gemm", "GemmRS", "gemm_rs",
           "AllReduce", "all_reduce", "ONE_SHOT_MAX_BYTES", "ReduceScatter", "reduce_scatter_tensor",
           "AllToAll", "all_to_all_single", "Broadcast", "broadcast", "torch_ops", "fused_all_gather_matmul",
           "fused_matmul_reduce_scatter"]

_LAZY = ("torch_ops", "fused_all_gather_matmul", "fused_matmul_reduce_scatter")


def __getattr__(name: str):
    """torch_ops (and its drop-ins) on first use: it registers torch.ops.tilescale.* and imports
    torch._dynamo, which `import tilescale.ops` alone does not need."""
    if name in _LAZY:
        import importlib

        mod = importlib.import_module(".torch_ops", __name__)
        return mod if name == "torch_ops" else getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
