"""The torch integration: tilescale under PyTorch's own APIs.

:mod:`.distributed` (``import tilescale.distributed as dist``: torch.distributed's names, collectives served by
tilescale's plans where they win), :mod:`.staged_collectives` (torch.distributed's collectives on gloo where NCCL
cannot run), :mod:`.torch_ops` (the ops as ``torch.ops.tilescale.*``: traced by ``torch.compile``, differentiable)
and :mod:`.async_tp` (drop-ins for PyTorch's async-TP ops). It sits on top: the ops, plans and runtime import
nothing of it (``tilescale.ops.torch_ops`` and the drop-ins' names there are loaded from here on first use).
"""
