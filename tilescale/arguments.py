"""How a bad argument is reported, and the value checks every part of tilescale shares.

One message format for every argument error: ``"{op}: {arg}: got {got}, expected {expected}"``, raised as
:class:`~tilescale.errors.OpArgumentError` (a ValueError) or, where the argument has the wrong type,
:class:`~tilescale.errors.OpArgumentTypeError` (also a TypeError). The ops' own checks
(:mod:`tilescale.ops.checks`) and the symmetric tensors' (:mod:`tilescale.runtime.symm`) build on these.
"""
import operator

from .errors import OpArgumentError, OpArgumentTypeError


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (tilelang's name)."""
    return str(dtype).replace("torch.", "")


def fail(op: str, arg: str, got: str, expected: str, *, type_error: bool = False):
    """Raise the error of argument `arg` of `op`: ``"{op}: {arg}: got {got}, expected {expected}"``."""
    cls = OpArgumentTypeError if type_error else OpArgumentError
    raise cls(f"{op}: {arg}: got {got}, expected {expected}")


def short(v, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def describe(v, *, strides: bool = False, address: bool = False) -> str:
    """How a message shows a received value: ``a float32 tensor of shape (8, 4) on cuda:0`` (with its
    strides / its address alignment when asked), ``None``, ``list [1, 2]``, ``2.5``."""
    import torch

    if isinstance(v, torch.Tensor):
        s = f"a {dtype_name(v.dtype)} tensor of shape {tuple(v.shape)} on {v.device}"
        if strides and not v.is_contiguous():
            s += f" with strides {tuple(v.stride())} (not contiguous)"
        if address and v.data_ptr() % 16:
            s += f" at address 0x{v.data_ptr():x} (not 16-byte aligned)"
        return s
    if v is None or isinstance(v, (int, float, str, bool)):
        return short(v)
    return f"{type(v).__name__} {short(v)}"


def is_int(v) -> bool:
    return not isinstance(v, bool) and hasattr(type(v), "__index__")


def as_int(op: str, arg: str, v, *, lo: int = 1, hi: int | None = None, allow_none: bool = False):
    """`v` as an int in [lo, hi] (ints only: a float, a bool or a string is refused); None passes with
    `allow_none`."""
    if v is None and allow_none:
        return None
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    none = " (or None)" if allow_none else ""
    if not is_int(v):
        fail(op, arg, describe(v), f"an int {rng}{none}", type_error=True)
    v = operator.index(v)
    if v < lo or (hi is not None and v > hi):
        fail(op, arg, repr(v), f"an int {rng}{none}")
    return v


def as_shape(op: str, arg: str, shape, *, lo: int = 0, min_dims: int = 0, allow_int: bool = False,
             sizes: str | None = None) -> tuple:
    """`shape` as a tuple of ints >= `lo` with at least `min_dims` dimensions. Each size must be an int
    (``(2.5,)`` is refused, not truncated); a bare int is a 1-D shape only with `allow_int`. `sizes`
    replaces the words ``sizes >= lo`` of the message."""
    if allow_int and is_int(shape):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        fail(op, arg, describe(shape), "a sequence of ints", type_error=True)
    items = tuple(shape)
    for i, s in enumerate(items):
        if not is_int(s):
            fail(op, arg, short(items), f"a sequence of ints (size {i} is {type(s).__name__} {short(s)})",
                 type_error=True)
    out = tuple(operator.index(s) for s in items)
    if len(out) < min_dims:
        fail(op, arg, repr(out), f"at least {min_dims} dimension(s)")
    if any(s < lo for s in out):
        fail(op, arg, repr(out), sizes or f"sizes >= {lo}")
    return out
