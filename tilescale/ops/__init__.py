"""Kernels built with tilescale, behind torch-like entry points.

==================================  ===============================================================
op                                  torch equivalent
==================================  ===============================================================
``all_gather(x)``                   ``torch.cat([x from every rank])`` (``dist.all_gather_into_tensor``)
``all_gather_into_tensor(out, x)``  ``dist.all_gather_into_tensor(out, x)``
``ag_gemm(a_local, b)``             ``all_gather(a_local) @ b``, communication overlapped with the GEMM
``gemm_rs(x, w)``                   ``reduce_scatter(x @ w)``, reduction overlapped with the GEMM
==================================  ===============================================================

The classes (``AllGather``, ``AGGemm``, ``GemmRS``) own their symmetric buffers: build them once per
shape (collective) and call them; the functions cache one per shape.
"""
from .ag_gemm import AGGemm, ag_gemm
from .allgather import AllGather, all_gather, all_gather_into_tensor
from .gemm_rs import GemmRS, gemm_rs

__all__ = ["AllGather", "all_gather", "all_gather_into_tensor", "AGGemm", "ag_gemm", "GemmRS", "gemm_rs"]
