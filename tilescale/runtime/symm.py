"""Symmetric memory: torch tensors on the NVSHMEM heap, and views of peers' copies.

Allocate like ``torch.empty``, then take an explicit handle for peers::

    x = tilescale.symm.empty((4096, 1024), dtype=torch.bfloat16)   # collective: same call on every rank
    h = tilescale.symm.handle(x)
    y = h.peer(2)               # torch view of rank 2's `x` (intra-node, over NVLink / P2P)
    p = h.remote_ptr(2)         # its address as an int
    tilescale.symm.free(x)      # collective; or left to tilescale.finalize()

Every allocation is checked across ranks first (same size, dtype, shape, order); a mismatch raises
:class:`SymmetricMismatchError` on every rank instead of corrupting the heap or hanging.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..arguments import as_shape
from ..env import settings, symmetric_heap_size
from ..errors import (
    NotSymmetricError,
    OpArgumentError,
    OpArgumentTypeError,
    SymmetricHeapExhaustedError,
    TileScaleError,
    user_location,
)
from . import current
from .heap import Allocation
from .heap import registry as _registry


class _CudaMemory:
    """Raw device memory exposed through __cuda_array_interface__ (bytes)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def _wrap(ptr: int, nbytes: int, shape, dtype, device):
    import torch

    raw = torch.as_tensor(_CudaMemory(ptr, max(nbytes, 1)), device=device)
    return raw[:nbytes].view(dtype).view(tuple(shape))


def _dtype(dtype, op: str = "symm.empty"):
    import torch

    if dtype is None:
        return torch.get_default_dtype()
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return getattr(torch, dtype)
    raise OpArgumentTypeError(f"{op}: dtype: got {dtype!r}, expected a torch.dtype such as torch.bfloat16")


def _shape(shape, op: str = "symm.empty") -> tuple:
    """`shape` (an int, or a sequence of ints) as a tuple of ints >= 0: a float size is refused, not
    truncated (OpArgumentTypeError, a TypeError; a negative size: OpArgumentError, a ValueError)."""
    return as_shape(op, "shape", shape, allow_int=True, sizes="non-negative sizes")


def heap_size() -> int:
    """Bytes of symmetric heap per rank: NVSHMEM_SYMMETRIC_SIZE, or NVSHMEM's default (1 GiB)."""
    return symmetric_heap_size()


def empty(*shape, dtype=None):
    """A tensor on the NVSHMEM symmetric heap, uninitialised. Collective: every rank makes the same call."""
    import torch

    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = shape[0]
    if settings.compile_only:   # a meta tensor (tilescale/compilation/compile_only.py)
        from ..compilation.compile_only import meta_tensor

        return meta_tensor(_shape(shape), _dtype(dtype))
    rt = current()
    reg = _registry(rt)
    try:  # checked before the agreement below, which also carries the verdict: no rank raises alone
        shape, dtype, error = _shape(shape), _dtype(dtype), None
    except OpArgumentError as e:
        shape, dtype, error = f"invalid: {e}", repr(dtype), e
    where = user_location()
    rt.agree("symmetric allocation (seq, shape, dtype)", (reg.seq, shape, str(dtype)))
    if error is not None:  # the same invalid arguments on every rank
        raise error
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    heap = heap_size()
    exhausted = SymmetricHeapExhaustedError(
        f"symmetric heap exhausted: allocating {nbytes} bytes ({shape}, {dtype}) at {where} needs more than the "
        f"{heap - reg.live_bytes} bytes left (live symmetric bytes {reg.live_bytes} of NVSHMEM_SYMMETRIC_SIZE="
        f"{os.environ.get('NVSHMEM_SYMMETRIC_SIZE', '1G (default)')}). Raise it (e.g. NVSHMEM_SYMMETRIC_SIZE=8G bash "
        "launch.sh ...) or free tensors with tilescale.symm.free()")
    if reg.live_bytes + nbytes > heap:  # same sizes on every rank (agreed above): every rank raises here
        raise exhausted
    ptr = rt.shim.ts_malloc(max(nbytes, 1)) or 0
    ok = rt.all_gather_object(ptr != 0)
    if not all(ok):
        if ptr:
            rt.shim.ts_free(ptr)  # collective on the ranks that did get memory (size is the same everywhere)
        raise exhausted
    a = Allocation(base=ptr, nbytes=nbytes, shape=shape, dtype=dtype, seq=reg.seq, where=where)
    reg.seq += 1
    reg.add(a)
    return _wrap(ptr, nbytes, shape, dtype, rt.device)


def zeros(*shape, dtype=None):
    """Like :func:`empty`, filled with zeros, and every rank's copy is zero before this returns."""
    import torch

    if settings.compile_only:   # a meta tensor (tilescale/compilation/compile_only.py)
        return empty(*shape, dtype=dtype)
    t = empty(*shape, dtype=dtype)
    t.zero_()
    torch.cuda.current_stream().synchronize()
    current().barrier()
    torch.cuda.current_stream().synchronize()
    return t


def create_symmetric_tensor(shape, dtype=None):
    """The seed's name for :func:`empty`."""
    return empty(shape, dtype=dtype)


def allocation_of(t) -> Allocation | None:
    """The symmetric allocation holding all of tensor `t`, or None."""
    rt = current()
    if not getattr(t, "is_cuda", False):
        return None
    n = t.numel() * t.element_size()
    return _registry(rt).find(t.data_ptr(), max(n, 1))


def registry_epoch() -> int:
    """Changes whenever a symmetric allocation is freed (or the runtime restarts): what a cache of pointers
    known to be symmetric must be invalidated on."""
    return _registry(current()).epoch


def is_symmetric(t) -> bool:
    return allocation_of(t) is not None


def require_symmetric(t, arg: str) -> Allocation:
    a = allocation_of(t)
    if a is None:
        what = (f"a tensor at 0x{t.data_ptr():x} ({tuple(t.shape)}, {t.dtype}, {t.device})"
                if hasattr(t, "data_ptr") else type(t).__name__)
        raise NotSymmetricError(f"{arg}: got {what}, expected a tensor on the symmetric heap: allocate it with "
                                "tilescale.symm.empty(...) (remote ops address the same buffer on every rank)")
    return a


def free(t) -> None:
    """Free the symmetric allocation that `t` starts. Collective: every rank frees the same tensor."""
    rt = current()
    reg = _registry(rt)
    a = reg.by_base.get(t.data_ptr()) if hasattr(t, "data_ptr") else None
    if a is None:
        raise NotSymmetricError(f"free: got a tensor at 0x{t.data_ptr():x}, which is not the start of a live "
                                "symmetric allocation (freed twice, a view, or not symmetric)")
    rt.agree("symmetric free (seq)", a.seq)
    import torch

    torch.cuda.synchronize()
    rt.shim.ts_free(a.base)
    reg.remove(a)


def get_remote_ptr(t, pe: int) -> int:
    """Address of `t`'s copy on rank `pe`, mapped into this process (ranks of this node: with
    TILESCALE_NODE_SIZE the emulated one, :mod:`tilescale.topology`)."""
    from . import topology

    rt = current()
    require_symmetric(t, "tensor")
    n, me = rt.info.world_size, rt.info.rank
    if not isinstance(pe, int) or isinstance(pe, bool) or not 0 <= pe < n:
        raise OpArgumentError(f"pe: got {pe!r}, expected an int in [0, {n})")
    topo = topology.of(n, rt.info.local_world_size)
    if not topo.same_node(pe, me):
        raise TileScaleError(f"rank {pe} is on node {topo.node_of(pe)}, rank {me} on node {topo.node_of(me)}"
                             f"{' (TILESCALE_NODE_SIZE)' if topo.emulated else ''}: no load/store path; use put/get "
                             "ops instead of peer pointers")
    p = rt.shim.ts_ptr(t.data_ptr(), pe) or 0
    if p == 0:
        raise TileScaleError(f"rank {pe} is not reachable by load/store from rank {rt.info.rank} (not on this node "
                             "or no P2P path): use put/get ops instead of peer pointers")
    return p


def peer_tensor(t, pe: int):
    """A torch view of rank `pe`'s copy of symmetric tensor `t` (same shape, strides and dtype)."""
    p = get_remote_ptr(t, pe)
    import torch

    if not t.is_contiguous():
        raise OpArgumentError("peer_tensor: tensor must be contiguous")
    return _wrap(p, t.numel() * t.element_size(), t.shape, t.dtype, t.device) if t.numel() else torch.empty_like(t)


@dataclass(frozen=True)
class SymmHandle:
    """Peer access to a symmetric tensor (like torch's symmetric-memory handle)."""

    tensor: object
    rank: int
    world_size: int

    def peer(self, pe: int):
        return peer_tensor(self.tensor, pe)

    def remote_ptr(self, pe: int) -> int:
        return get_remote_ptr(self.tensor, pe)

    def peers(self) -> list:
        return [self.peer(p) for p in range(self.world_size)]


def handle(t) -> SymmHandle:
    rt = current()
    require_symmetric(t, "tensor")
    return SymmHandle(t, rt.info.rank, rt.info.world_size)
