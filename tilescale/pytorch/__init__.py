"""The torch integration: tilescale under PyTorch's own APIs.

:mod:`.distributed` (``import tilescale.distributed as dist``: torch.distributed's names, collectives served by
tilescale's plans where they win), :mod:`.staged_collectives` (torch.distributed's collectives on gloo where NCCL
cannot run), :mod:`.torch_ops` (the ops as ``torch.ops.tilescale.*``: traced by ``torch.compile``, differentiable),
:mod:`.async_tp` (drop-ins for PyTorch's async-TP ops) and :func:`use_for_inductor_async_tp`
(:mod:`.inductor_async_tp`: Inductor's micro-pipeline TP pass runs tilescale's fused ops). It sits on top: the ops,
plans and runtime import nothing of it (``tilescale.ops.torch_ops`` and the drop-ins' names there are loaded from
here on first use). Importing it is light: a name is loaded on its first use.
"""
import importlib

_LAZY = {"use_for_inductor_async_tp": "inductor_async_tp"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"tilescale.pytorch.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
