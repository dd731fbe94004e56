"""How the collectives' kernels see memory: flat runs of 16-byte vectors, cut into chunks per block.

The reducing kernels (AllReduce, ReduceScatter...) read and write ``(..., nv, VEC)`` views of the
user's tensors, ``VEC = 16 // element size`` elements per vector, so that every load and store is
one 16-byte access. A tensor whose element count does not fill whole vectors (or that is not
contiguous and 16-byte aligned) is staged through a padded scratch tensor owned by the op: one
local copy in, one out. The copying kernels (AllToAll, Broadcast) move bytes and need no padding.
Every block owns one chunk of the run (:func:`blocks_for`: how many blocks for a message), possibly empty.
"""
import functools
import math

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
# dtypes of the kernels' bookkeeping tensors (names, so that annotations hold no string literals)
SIGNAL, BYTE, INDEX = "uint64", "uint8", "int64"
COUNTER = "int64"   # the call counters (T.call_number): one word per block, in the op's local memory
# Empty chunks are legal (a block whose chunk starts at the end still signals): no bound guards. The
# collectives' kernels are compiled with these pass configs.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (tilelang's name)."""
    return str(dtype).replace("torch.", "")


def check_dtype(op: str, dtype, arg: str = "dtype") -> None:
    """OpArgumentError (a ValueError) unless `dtype` is one of the reduction dtypes (bf16, fp16, fp32)."""
    from . import checks

    checks.as_dtype(op, arg, dtype, SUPPORTED_DTYPES, note=" (sums are accumulated in fp32)")


def element_size(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def vector_width(dtype) -> int:
    """Elements per 16-byte vector: 8 for bf16/fp16, 4 for fp32."""
    return 16 // element_size(dtype)


def as_shape(op: str, shape) -> tuple:
    """`shape` as a tuple of ints >= 0 (ints only: ``(2.5,)`` is refused), or an OpArgumentError naming
    `op`'s shape argument."""
    from . import checks

    return checks.as_shape(op, "shape", shape)


def check_launch(op: str, blocks, threads, world_size: int, per_wave=None) -> None:
    """OpArgumentError unless `blocks` (None: by size) is a positive int of at most ``per_wave()`` (one wave:
    the SM count) and `threads` a multiple of 32 in [32, 1024], at least the world size (threads < W wait)."""
    from .checks import _is_int, as_threads, fail

    if blocks is not None:
        if not _is_int(blocks) or blocks < 1:
            fail(op, "blocks", repr(blocks), "a positive int (or None: by size)", type_error=not _is_int(blocks))
        most = (per_wave or sm_count)()
        if blocks > most:
            fail(op, "blocks", repr(blocks), f"at most {most} (all blocks must be co-resident: one wave)")
    as_threads(op, threads, world_size)


def numel(shape) -> int:
    return math.prod(shape)


def is_aligned(t) -> bool:
    """Whether `t` is contiguous at a 16-byte aligned address: what TMA, the copy engines' fast path and the
    kernels' 16-byte vector loads read in place."""
    return t.is_contiguous() and not t.data_ptr() & 15


def aligned(t):
    """`t` itself when :func:`is_aligned`, else a copy that is (a new allocation is aligned; ``contiguous()``
    alone returns a misaligned contiguous tensor as it is)."""
    if t.is_contiguous():
        return t if not t.data_ptr() & 15 else t.clone()
    return t.contiguous()


def vector_view(t, shape: tuple):
    """`t` seen as `shape` (..., VEC) without a copy when it is contiguous, 16-byte aligned and holds
    exactly that many elements; else None (the caller stages it)."""
    if is_aligned(t) and t.numel() == numel(shape):
        return t.view(shape)
    return None


def blocks_for(nbytes: int, table, sms: int) -> int:
    """Blocks of a kernel for a message of `nbytes`: the first ``(max_bytes, blocks)`` of `table` with
    nbytes <= max_bytes, capped at the SM count (all blocks must be co-resident: one wave)."""
    for limit, blocks in table:
        if nbytes <= limit:
            return max(1, min(blocks, sms))
    return max(1, min(table[-1][1], sms))


def sm_count() -> int:
    """Streaming multiprocessors of the current GPU (132 on H100/H200 SXM)."""
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def stream_getter(device_index: int | None = None):
    """A function returning the current CUDA stream of device `device_index` (default: the current device)
    as a raw handle (an int), cheaply."""
    import torch

    from .. import compat

    raw = compat.raw_stream_query()
    dev = torch.cuda.current_device() if device_index is None else device_index
    if raw is not None:
        return functools.partial(raw, dev)      # no Python frame per call
    return lambda: torch.cuda.current_stream().cuda_stream
