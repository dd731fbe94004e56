"""AG+GEMM and GEMM+RS for jobs on several nodes: the hierarchical collective composed with a local GEMM.

torch equivalents (a_local: (M/W, K), b: (K, N); x: (M, K), w: (K, N), M divisible by W)::

    c = all_gather(a_local) @ b                       # ag_gemm_multinode(a_local, b)
    y = reduce_scatter(x @ w)                         # gemm_rs_multinode(x, w): rows (M/W, N) of this rank

``variant``: "flat" is :func:`~tilescale.ops.ag_gemm` / :func:`~tilescale.ops.gemm_rs` (their overlapped
kernels, one node); "hierarchical" is :class:`~tilescale.ops.allgather_hierarchical.AllGatherHierarchical` then
``torch.matmul``, and ``torch.matmul`` then
:class:`~tilescale.ops.reduce_scatter_hierarchical.ReduceScatterHierarchical`; "auto" (default) goes by the
topology: "flat" on one node, "hierarchical" on several. The cost model (docs/multinode.md) would keep tiny
messages flat across nodes too, but the flat fused kernels reach their peers through load/store mappings
(AGGemm's copy engines pull through ``symm.peer_tensor``, GemmRS reads ``T.remote`` views), which do not exist
across nodes: "flat" on several nodes works only while every peer is mapped (emulated nodes before the remote
path refuses mappings across them).

What the hierarchical variants lack: overlap. The GEMM starts only when the whole gather has ended (and the
reduce-scatter only when the whole GEMM has), so the communication is exposed in full, where the model's
fused times assume it hidden under the GEMM (AG+GEMM: tiles of own rows first, the others as their rows
land; GEMM+RS: row blocks sent as they are computed). The GEMM is cuBLAS on the gathered rows (or on the
whole product, which is also staged in memory: M x N elements more).
"""
from ..runtime import topology
from . import allgather_hierarchical, checks, reduce_scatter_hierarchical

__all__ = ["ag_gemm_multinode", "gemm_rs_multinode"]

VARIANTS = ("auto", "flat", "hierarchical")

_ag_check = checks.CallCheck("ag_gemm_multinode")
_rs_check = checks.CallCheck("gemm_rs_multinode")


def _operands(op: str, a_name: str, a, b_name: str, b, variant, W=None) -> None:
    checks.as_choice(op, "variant", variant, VARIANTS)
    checks.check_tensor(op, a_name, a, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor(op, b_name, b, dtype=a.dtype, min_dims=2)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        checks.fail(op, b_name, checks.describe(b), f"a 2-D ({a.shape[-1]}, N) tensor for {a_name} {tuple(a.shape)} "
                    "(2-D operands, inner sizes equal)")
    if W is not None and a.shape[0] % W:
        checks.fail(op, a_name, f"{a.shape[0]} rows", f"a multiple of the world size {W} (equal row slices)")


def pick(variant: str) -> str:
    """"flat" or "hierarchical": `variant` itself, or for "auto" by the topology (see the module docstring)."""
    if variant != "auto":
        return variant
    return "hierarchical" if topology.current().nodes > 1 else "flat"


def ag_gemm_multinode(a_local, b, *, variant: str = "auto"):
    """``all_gather(a_local) @ b`` (see the module docstring); collective, the same call on every rank."""
    _ag_check((checks.signature(a_local), checks.signature(b), variant), _operands, "ag_gemm_multinode", "a_local",
              a_local, "b", b, variant)
    topo = topology.current()
    if pick(variant) == "flat":
        from .allgather_gemm import ag_gemm

        return ag_gemm(a_local, b)
    ag = allgather_hierarchical._cached(tuple(a_local.shape), a_local.dtype, topo.world_size, topo.node_size)
    return ag(a_local) @ b   # the slot holds the gathered A for work enqueued before the next call: this GEMM


def gemm_rs_multinode(x, w, *, variant: str = "auto"):
    """``reduce_scatter(x @ w)``: this rank's (M/W, N) rows of the sum (see the module docstring); collective."""
    topo = topology.current()
    _rs_check((checks.signature(x), checks.signature(w), variant), _operands, "gemm_rs_multinode", "x", x, "w", w,
              variant, topo.world_size)
    M, N = x.shape[0], w.shape[1]
    if pick(variant) == "flat":
        from .gemm_reduce_scatter import gemm_rs

        return gemm_rs(x, w)
    p = x @ w
    rs = reduce_scatter_hierarchical._cached(p.numel(), p.dtype, topo.world_size, topo.node_size)
    return rs(p.view(-1)).view(M // topo.world_size, N)
