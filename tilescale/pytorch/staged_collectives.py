"""torch.distributed's collectives for CUDA tensors where NCCL cannot run: gloo on host copies.

In the shared-GPU mode (``TILESCALE_RANKS_PER_GPU``: several ranks on one GPU) torch.distributed runs on
gloo alone, because NCCL refuses two ranks on one GPU ("Duplicate GPU detected"). The collectives here
take the same arguments as torch.distributed's and give the same results: each call copies its tensors
to the host (after the work queued on the current stream), runs gloo's collective on the copies over
`group`, and copies the results back on the current stream. They are slow (a host round trip, no
overlap): for references that check tilescale's kernels, and for tilescale.distributed's fallbacks in
that mode; never for timings.

    from tilescale import staged_collectives
    coll = staged_collectives.for_cuda()       # torch.distributed where NCCL serves CUDA tensors, else this module
    coll.all_reduce(ref)                       # the same call either way
    coll.reduce_scatter_tensor(out, partial)

Names: :func:`all_reduce`, :func:`all_gather_into_tensor`, :func:`all_gather`,
:func:`reduce_scatter_tensor`, :func:`all_to_all_single`, :func:`broadcast`, :func:`barrier`; every
other public name (``ReduceOp``, ``get_rank``, ``new_group`` ...) is torch.distributed's own. `group`
must have a CPU backend (gloo: what the shared-GPU mode and ``init_distributed`` create).

Differences from NCCL, none of which changes a correct result: ``async_op=True`` runs the collective at
once and returns a completed work object (its ``wait()`` orders the current stream after the copies
back); float16 and bfloat16 are reduced in float32 and rounded once (at least as accurate as NCCL,
whose order is unspecified); tensors need not be contiguous; ``ReduceOp.AVG`` works for floating
types, ``PREMUL_SUM`` is refused; a call inside CUDA graph capture is refused (host copies cannot be
captured).
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as _td

ReduceOp = _td.ReduceOp

__all__ = ["DoneWork", "ReduceOp", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all_single", "barrier",
           "broadcast", "for_cuda", "needs_staging", "reduce_scatter_tensor"]


# ----------------------------------------------------------------------------------------- choice
def needs_staging(group=None) -> bool:
    """Whether CUDA tensors of `group` (default: the whole world) must be staged through the host:
    True where no NCCL backend serves the group (gloo only: the shared-GPU mode). False for a group this
    rank is not in (torch.distributed's calls do nothing there)."""
    try:
        backend = _td.get_backend(group)
    except ValueError:  # "Invalid process group specified": this rank is not in `group`
        return False
    return "nccl" not in str(backend).lower()


def for_cuda(group=None):
    """The module whose collectives to call on CUDA tensors of `group`: ``torch.distributed`` where NCCL
    serves the group (distinct GPUs), else this module (gloo on host copies). Call it once the process
    group exists; every rank gets the same answer."""
    return sys.modules[__name__] if needs_staging(group) else _td


# ---------------------------------------------------------------------------------------- helpers
_HALF = (torch.float16, torch.bfloat16)


def _check(tensors) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"staged collectives take tensors; got {type(t).__name__}")
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a staged (gloo, host-copy) collective cannot be captured in a CUDA graph: in the "
                           "shared-GPU mode (TILESCALE_RANKS_PER_GPU) torch.distributed has no NCCL to capture")


def _done(async_op: bool, result):
    """The work object of a call made at once (None without `async_op`): it records an event on the current
    stream after the copies back."""
    return DoneWork(result) if async_op else None


class DoneWork(_td.Work):
    """The work object of a collective that already ran, on the stream that was current at the call (or on
    the host; a staged collective, or a plan of tilescale.distributed): ``wait()`` makes the now current
    stream wait for it, like NCCL's work objects."""

    def __init__(self, result):
        super().__init__()
        self._result = list(result)
        self._event = None
        if any(t.is_cuda for t in self._result):
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self, timeout=None) -> bool:
        self.block_current_stream()
        return True

    def block_current_stream(self) -> None:
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)

    def synchronize(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def is_completed(self) -> bool:
        return self._event is None or self._event.query()

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return self._result

    def get_future(self):
        """A CUDA-aware future (like NCCL's): its ``wait()`` / ``then()`` order the consuming stream after
        the collective."""
        devices = sorted({t.device for t in self._result if t.is_cuda}, key=str)
        fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        fut.set_result(self._result)
        return fut


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 host copy of `t`'s elements (gloo moves bytes of any dtype)."""
    h = t.detach().to("cpu").contiguous().reshape(-1)
    return h.view(torch.uint8) if h.dtype != torch.uint8 else h


def _from_bytes(dst: torch.Tensor, b: torch.Tensor) -> None:
    """Copy the bytes `b` (as many as `dst` has) into `dst`."""
    dst.copy_(b.view(dst.dtype).view(dst.shape) if b.dtype != dst.dtype else b.view(dst.shape))


def _reduce_copy(t: torch.Tensor, op) -> tuple[torch.Tensor, object, bool]:
    """(a contiguous host copy to reduce, the op gloo runs, whether to divide by the group size)."""
    if _op_is(op, "PREMUL_SUM"):
        raise ValueError("staged collectives: ReduceOp.PREMUL_SUM is not supported (multiply, then SUM)")
    avg = _op_is(op, "AVG")
    if avg and not (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"staged collectives: ReduceOp.AVG of {t.dtype} (floating types only)")
    dtype = torch.float32 if t.dtype in _HALF else t.dtype
    h = t.detach().to("cpu", dtype=dtype, copy=True).contiguous()
    if h.is_complex():
        if not (_op_is(op, "SUM") or avg):
            raise ValueError(f"staged collectives: {op} of complex tensors")
        h = torch.view_as_real(h)
    return h, (ReduceOp.SUM if avg else op), avg


def _op_is(op, name: str) -> bool:
    try:
        return bool(op == getattr(ReduceOp, name))
    except (TypeError, RuntimeError, AttributeError):
        return False


def _write_back(dst: torch.Tensor, h: torch.Tensor, avg: bool, n: int) -> None:
    """Copy the reduced host values `h` (as many as `dst` has; complex as pairs) into `dst`."""
    if dst.is_complex():
        h = torch.view_as_complex(h.reshape(-1, 2))
    if avg:
        h = h / n
    with torch.no_grad():
        dst.copy_(h.reshape(dst.shape))


# ------------------------------------------------------------------------------------ collectives
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """``torch.distributed.all_reduce``: `tensor` becomes the reduction over the ranks of `group`, in place."""
    _check([tensor])
    h, gop, avg = _reduce_copy(tensor, op)
    _td.all_reduce(h, op=gop, group=group)
    _write_back(tensor, h, avg, _td.get_world_size(group))
    return _done(async_op, [tensor])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """``torch.distributed.reduce_scatter_tensor``: `output` = this rank's chunk (dim 0, in rank order) of
    the reduction of `input` over the ranks (gloo all-reduces the whole input; this rank keeps its chunk)."""
    _check([output, input])
    W, r = _td.get_world_size(group), _td.get_rank(group)
    if output.dtype != input.dtype:
        raise ValueError(f"reduce_scatter_tensor: output dtype {output.dtype} != input dtype {input.dtype}")
    if input.numel() != W * output.numel():
        raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements, expected world size {W} x "
                         f"output's {output.numel()}")
    h, gop, avg = _reduce_copy(input, op)
    _td.all_reduce(h, op=gop, group=group)
    _write_back(output, h.reshape(W, -1)[r], avg, W)
    return _done(async_op, [output])


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """``torch.distributed.all_gather_into_tensor``: `output_tensor` = every rank's `input_tensor`, in rank
    order (concatenated along dim 0, or stacked: any output shape of world size x as many elements)."""
    _check([output_tensor, input_tensor])
    W = _td.get_world_size(group)
    if output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"all_gather_into_tensor: output dtype {output_tensor.dtype} != input dtype "
                         f"{input_tensor.dtype}")
    if output_tensor.numel() != W * input_tensor.numel():
        raise ValueError(f"all_gather_into_tensor: output has {output_tensor.numel()} elements, expected world "
                         f"size {W} x input's {input_tensor.numel()}")
    src = _bytes(input_tensor)
    out = torch.empty(W * src.numel(), dtype=torch.uint8)
    _td.all_gather_into_tensor(out, src, group=group)
    with torch.no_grad():
        _from_bytes(output_tensor, out)
    return _done(async_op, [output_tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``torch.distributed.all_gather``: ``tensor_list[r]`` = rank r's `tensor` (every entry as many
    elements as `tensor`)."""
    _check([*tensor_list, tensor])
    W = _td.get_world_size(group)
    if len(tensor_list) != W:
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors, expected the group size {W}")
    for i, t in enumerate(tensor_list):
        if t.numel() != tensor.numel() or t.dtype != tensor.dtype:
            raise ValueError(f"all_gather: tensor_list[{i}] is {t.dtype} of {t.numel()} elements, expected "
                             f"{tensor.dtype} of {tensor.numel()} (the input's)")
    src = _bytes(tensor)
    out = torch.empty(W * src.numel(), dtype=torch.uint8)
    _td.all_gather_into_tensor(out, src, group=group)
    with torch.no_grad():
        for t, b in zip(tensor_list, out.view(W, -1), strict=False):
            _from_bytes(t, b)
    return _done(async_op, tensor_list)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,  # noqa: A002
                      async_op=False):
    """``torch.distributed.all_to_all_single``: rank r's i-th chunk of `input` (dim 0; equal chunks, or
    `input_split_sizes` rows) becomes rank i's r-th chunk of `output` (`output_split_sizes` rows)."""
    _check([output, input])
    W = _td.get_world_size(group)
    if output.dtype != input.dtype:
        raise ValueError(f"all_to_all_single: output dtype {output.dtype} != input dtype {input.dtype}")

    def row_bytes(t):
        n = t.element_size()
        for s in t.shape[1:]:
            n *= s
        return n

    def splits(sizes, t, what):
        if sizes is None or len(sizes) == 0:
            if t.dim() == 0 or t.shape[0] % W:
                raise ValueError(f"all_to_all_single: {what} dim 0 ({tuple(t.shape)}) is not divisible by the "
                                 f"group size {W}; give split sizes")
            return None
        sizes = [int(s) for s in sizes]
        if len(sizes) != W or sum(sizes) != t.shape[0] or min(sizes) < 0:
            raise ValueError(f"all_to_all_single: {what}_split_sizes {sizes}: expected {W} sizes summing to dim 0 "
                             f"({t.shape[0]})")
        return [s * row_bytes(t) for s in sizes]

    osp, isp = splits(output_split_sizes, output, "output"), splits(input_split_sizes, input, "input")
    src = _bytes(input)
    out = torch.empty(output.numel() * output.element_size(), dtype=torch.uint8)
    if osp is None and isp is None:
        if out.numel() != src.numel():
            raise ValueError(f"all_to_all_single: output has {output.numel()} elements, input {input.numel()} "
                             "(equal without split sizes)")
        _td.all_to_all_single(out, src, group=group)
    else:
        if osp is None:
            osp = [out.numel() // W] * W
        if isp is None:
            isp = [src.numel() // W] * W
        _td.all_to_all_single(out, src, osp, isp, group=group)
    with torch.no_grad():
        _from_bytes(output, out)
    return _done(async_op, [output])


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """``torch.distributed.broadcast``: `tensor` = rank `src`'s (global rank; or `group_src`, a rank of
    `group`), in place."""
    _check([tensor])
    h = _bytes(tensor)
    kw = {"group_src": group_src} if group_src is not None else {}
    _td.broadcast(h, src=src, group=group, **kw)
    with torch.no_grad():
        _from_bytes(tensor, h)
    return _done(async_op, [tensor])


def barrier(group=None, async_op=False, device_ids=None):
    """``torch.distributed.barrier`` over gloo (`device_ids` is ignored: no NCCL)."""
    _td.barrier(group=group)
    return _done(async_op, [])


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(_td, name)
    except AttributeError:
        raise AttributeError(f"module 'tilescale.staged_collectives' has no attribute {name!r} "
                             "(neither has torch.distributed)") from None
