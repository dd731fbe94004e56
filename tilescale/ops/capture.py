"""CUDA graph capture of tilescale's ops.

Every op of tilescale (``Op.GRAPH_SAFE``: the collectives, the hierarchical ones, AG+GEMM and GEMM+RS) keeps no
per-call state on the host. A collective (and each kernel of GEMM+RS) counts its calls on the device: its
kernel takes the op's call counters (one int64 word per block, local memory) and derives its call number e,
the parity of its double buffers and every value computed from e from them (``T.call_number``), so a call
captured in a CUDA graph sees a new e on every replay, and replays and eager calls may be interleaved in any
order. What a capture needs, and what the ops do:

* the op must exist before the capture (construction allocates symmetric memory and synchronises: it cannot
  be captured): constructing one during capture raises :class:`~tilescale.errors.GraphCaptureError` on every
  rank (agreed over the host's control group). The functional forms (``all_reduce(t)``...) build their op on
  first use: call them once eagerly, with the same shapes, before capturing;
* call checks are agreed over the host's gloo control group (no device work: allowed during capture);
* the stream order between calls (:class:`~tilescale.ops.checks.StreamOrder`) is not changed during capture:
  ``torch.cuda.graph`` synchronises the device before it captures, and orders its stream itself;
* replay a graph on the stream that the eager calls of its ops use (or order the two streams yourself), and
  replay it, as every call, in the same order on every rank;
* AllGather and AllGatherHierarchical return the slot of the call by the device's parity once a graph was
  captured (:class:`~tilescale.ops.base.DoubleBuffered`).

AG+GEMM needs no count at all: its flags are set to 1 by their one writer and reset to 0 by their one reader
(stream memory operations, tilescale/ops/allgather_gemm.py), so a replay waits for its own data.

An op that kept a count on the host would replay with the number of its capture and its waits would pass at
once, silently wrong: an op class that is not declared ``GRAPH_SAFE`` refuses capture (:func:`refusal`), and
``tilescale.distributed`` sends captured calls of a plan whose kernels are not graph-safe (a user's plan) to NCCL.
"""
from ..errors import GraphCaptureError


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_graph_capture(op: str) -> None:
    """Raise :func:`refusal` if the current stream is capturing (one C call, ~0.1 us, once CUDA is
    initialised)."""
    import torch

    if torch._C._cuda_isCurrentStreamCapturing():
        raise refusal(op)


def refusal(op: str) -> GraphCaptureError:
    """The error of a call of op `op`, which counts its calls on the host, during capture."""
    return GraphCaptureError(
        f"{op}: called during CUDA graph capture, which it does not support (its signals count calls on the host, "
        "so a replayed call would not wait for its data); call it outside the captured region, or use "
        "torch.distributed / tilescale.distributed, which routes captured calls to NCCL")


def construction_error(op: str) -> GraphCaptureError | None:
    """The error of constructing op `op` now (None: not capturing)."""
    if not is_capturing():
        return None
    return GraphCaptureError(
        f"{op}: constructed during CUDA graph capture (construction allocates symmetric memory and synchronises "
        "the ranks, which a graph cannot hold); construct it before capturing, or make one eager call of the "
        "function with the same arguments first (a warm-up, on every rank), which builds and caches it")
