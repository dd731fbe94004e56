"""CUDA graph capture: the collectives count their calls on the host (epochs), so a captured call would
replay with the epoch of its capture and its waits would pass at once on every replay: wrong results,
silently. They refuse instead; ``tilescale.distributed`` sends captured calls to NCCL."""


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_graph_capture(op: str) -> None:
    """Raise if the current stream is capturing (called on every op call: one C call, ~0.1 us, since the
    op already initialised CUDA)."""
    import torch

    if torch._C._cuda_isCurrentStreamCapturing():
        raise RuntimeError(f"{op}: called during CUDA graph capture, which it does not support (its signals count "
                           "calls on the host, so a replayed call would not wait for its data); call it outside "
                           "the captured region, or use torch.distributed / tilescale.distributed, which routes "
                           "captured calls to NCCL")
