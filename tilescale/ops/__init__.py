"""Kernels built with tilescale, behind torch-like entry points.

One module per op: its configuration, its symmetric buffers and its kernel; the host steps every op shares
(agreement of the arguments across ranks, buffers, call checks, launch, staging) are in :mod:`.base`. Each
op module exports a class that owns its buffers (build it once per shape, then call it) and a torch-like
function that caches one per shape; ``tilescale.ops`` re-exports both (each module's ``__all__``):

==================================  ===============================================================
op                                  torch equivalent
==================================  ===============================================================
``ag_gemm(a_local, b)``             ``all_gather(a_local) @ b``, communication overlapped with the GEMM
``gemm_rs(x, w)``                   ``reduce_scatter(x @ w)``, reduction overlapped with the GEMM
``all_gather(x)``                   ``torch.cat([x from every rank])`` (``dist.all_gather_into_tensor``)
``all_reduce(t)`` and the other     their ``torch.distributed`` namesakes: ``all_gather_into_tensor``,
collectives                         ``all_reduce``, ``reduce_scatter_tensor``, ``all_to_all_single``,
                                    ``broadcast``... (:func:`tilescale.ops.registry.collectives`)
==================================  ===============================================================

The fused ops have parts of their own, which export nothing: ``allgather_gemm`` with ``ag_gemm_kernel``,
``ag_gemm_pull`` and ``ag_gemm_push`` (its kernel and its two protocols); ``gemm_reduce_scatter`` with
``gemm_rs_push``, ``gemm_rs_pull`` (its two paths' kernels and protocols) and ``gemm_rs_path`` (which path a job
takes).

A module's name differs from the function it exports, so that both are reachable:
``tilescale.ops.broadcast`` is the function, ``tilescale.ops.broadcast_from_root`` its module;
``tilescale.ops.ag_gemm`` / ``allgather_gemm``, ``tilescale.ops.gemm_rs`` / ``gemm_reduce_scatter``.
A collective's module also registers it (:mod:`.registry`), which is all that tilescale.plan,
tilescale.distributed, the prebuild and the collectives benchmark need to know of it.

The same as torch operators (``torch.ops.tilescale.*``: ``torch.compile(fullgraph=True)`` traces them,
the fused ones are differentiable): :mod:`tilescale.pytorch.torch_ops` (registered when it is first imported,
or at the first use of ``tilescale.ops.torch_ops``); on them, drop-ins for PyTorch's async-TP ops,
``tilescale.ops.fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` (``torch.ops.symm_mem``'s
arguments and results: :mod:`tilescale.pytorch.async_tp`).

Importing ``tilescale.ops`` is light; the op modules are imported at the first use of a name.
"""
import importlib
import pkgutil

_LAZY = ("torch_ops", "fused_all_gather_matmul", "fused_matmul_reduce_scatter")
_MODULES = {m.name for m in pkgutil.iter_modules(__path__)}
_public: dict = {}


def _exports() -> dict:
    """{name: object} of every op module's ``__all__`` (importing them once)."""
    if not _public:
        registry = importlib.import_module(f"{__name__}.registry")
        _public.update({n: getattr(m, n) for m in registry.modules() for n in getattr(m, "__all__", ())})
    return _public


def __getattr__(name: str):
    """An op module's public name, a module of the package, or torch_ops (and its drop-ins) on first use:
    it registers torch.ops.tilescale.* and imports torch._dynamo, which `import tilescale.ops` alone does
    not need."""
    if name in _LAZY:
        mod = importlib.import_module("tilescale.pytorch." + ("torch_ops" if name == "torch_ops" else "async_tp"))
        return mod if name == "torch_ops" else getattr(mod, name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "__all__":
        return [*_exports(), *_LAZY]
    if not name.startswith("_") and name in _exports():
        return _public[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _MODULES | set(_exports()) | set(_LAZY))
