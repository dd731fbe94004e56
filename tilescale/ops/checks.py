"""Argument checks of tilescale's ops and collectives (one module, shared by all of them).

Every check raises :class:`~tilescale.errors.OpArgumentError` (a ValueError) or, where the argument has
the wrong type, :class:`~tilescale.errors.OpArgumentTypeError` (also a TypeError), with one message
format::

    AGGemm: out: got a float32 tensor of shape (8192, 1024) on cuda:0, expected a contiguous, 16-byte
    aligned bfloat16 tensor of shape (8192, 2048) on cuda:0

A rank must never raise alone: the other ranks would wait for it, in a collective on the host or in a
kernel on the GPU. So

* at construction (collective), :func:`require_same_on_all_ranks` exchanges the raw arguments *and* the
  result of the local checks (run inside :class:`deferred`) in one all_gather over the control group:
  every rank raises :class:`~tilescale.errors.CollectiveMismatchError` if the arguments differ, else every
  rank raises if any rank's checks failed;
* at call time, :class:`CallCheck` runs the checks of a call whose argument *signature* (types, dtypes,
  shapes, devices, contiguity... whatever the checks read) it has not seen, and agrees on the result with
  the other ranks (:func:`agree`: one all_gather of "ok" or the error text); a signature that passed is
  remembered, so later calls with it cost one dict lookup on a tuple and no exchange. Every rank raises if
  any rank failed: the failing ranks their own error, the others a CollectiveMismatchError naming them.

  Limit (the price of skipping the exchange): ranks must see new signatures on the same calls, which SPMD
  code does (same code, same shapes). A rank whose arguments turn invalid on a call where the others pass
  a signature already agreed exchanges alone (it waits for the control group's timeout) while the others
  launch: ``TILESCALE_WAIT_TIMEOUT_S`` bounds that.

:class:`StreamOrder` keeps the ops' double buffering correct when the current stream changes between two
calls of one op: the new stream waits for the work enqueued on the old one.
"""
from ..arguments import as_int, as_shape, describe, dtype_name, fail  # noqa: F401  (checks.as_int, checks.as_shape)
from ..arguments import is_int as _is_int
from ..arguments import short as _short
from ..errors import CollectiveMismatchError, NotInitializedError, OpArgumentError, OpArgumentTypeError

# dtype sets (tilelang names)
REDUCE_DTYPES = ("bfloat16", "float16", "float32")     # summed in fp32 (AllReduce, ReduceScatter)
GEMM_DTYPES = ("bfloat16", "float16")                  # the wgmma GEMMs (AGGemm, GemmRS)
COPY_DTYPES = ("bfloat16", "float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")  # AllGather

_MAX_SIGNATURES = 64      # signatures remembered per op (then forgotten at once: every rank alike)
INT32_MAX = (1 << 31) - 1  # the largest size a kernel holds in a 32-bit integer (tilelang's index type)


# ------------------------------------------------------------------------------------------- messages
def _dtypes_text(names) -> str:
    return ", ".join(f"torch.{n}" for n in names)


# ------------------------------------------------------------------------------- construction-time values
def fits_int32(op: str, arg: str, got: str, value: int, what: str) -> None:
    """Raise unless `value` (`what`: a size that a kernel of `op` takes or computes as a 32-bit integer, derived
    from argument `arg`, received as `got`) is at most :data:`INT32_MAX`: beyond it the kernel would index out
    of bounds, or fail to build deep in TVM ("Literal value ... exceeds maximum of int32")."""
    if value > INT32_MAX:
        fail(op, arg, f"{got} ({what}: {value})", f"sizes for which {what} is at most 2**31 - 1 = {INT32_MAX} "
             "(its kernel holds it in a 32-bit integer)")


def as_dtype(op: str, arg: str, dtype, supported=None, note: str = ""):
    """`dtype` if it is a torch.dtype (of `supported`, tilelang names, if given)."""
    import torch

    if not isinstance(dtype, torch.dtype):
        fail(op, arg, _short(dtype), "a torch.dtype" + (f" (one of {_dtypes_text(supported)})" if supported else ""),
             type_error=True)
    if supported is not None and dtype_name(dtype) not in supported:
        fail(op, arg, str(dtype), f"one of {_dtypes_text(supported)}{note}")
    return dtype


def as_choice(op: str, arg: str, v, choices):
    if not isinstance(v, str) or v not in choices:
        fail(op, arg, _short(v), f"one of {', '.join(map(repr, choices))}", type_error=not isinstance(v, str))
    return v


def as_threads(op: str, threads, world_size: int | None = None):
    """`threads` if it is a multiple of 32 in [32, 1024] (and at least `world_size`, when given: kernels whose
    threads tx < W wait for rank tx)."""
    more = "" if world_size is None else f", at least the world size {world_size}"
    if (not _is_int(threads) or not 32 <= threads <= 1024 or threads % 32
            or (world_size is not None and threads < world_size)):
        fail(op, "threads", repr(threads), f"a multiple of 32 in [32, 1024]{more}", type_error=not _is_int(threads))
    return threads


def check_op(fn: str, op) -> None:
    """Unless `op` is the sum (the string "sum" or torch.distributed.ReduceOp.SUM): the error of argument
    `op` of `fn`."""
    if op == "sum":
        return
    try:
        import torch.distributed as dist

        if op == dist.ReduceOp.SUM:
            return
    except Exception:  # noqa: BLE001  (torch.distributed without ReduceOp)
        pass
    fail(fn, "op", describe(op), "'sum' (the only reduction tilescale implements)")


# ------------------------------------------------------------------------------------------ tensors
def this_device():
    """This rank's GPU: ``cuda:<torch.cuda.current_device()>`` (``cuda`` where none is visible)."""
    import torch

    try:
        return torch.device("cuda", torch.cuda.current_device())
    except Exception:  # noqa: BLE001  (no GPU: every tensor is refused anyway)
        return torch.device("cuda")


def check_tensor(op: str, arg: str, t, *, shape=None, dtype=None, dtypes=None, device=None, contiguous: bool = False,
                 aligned: bool = False, min_dims: int = 0, what: str = "") -> None:
    """Raise unless `t` is a torch.Tensor with this `shape`, `dtype` (or one of `dtypes`), on `device`
    (default: this rank's GPU), contiguous / with a 16-byte aligned address if asked, with at least
    `min_dims` dimensions. `what` is added to the expectation (why)."""
    import torch

    device = this_device() if device is None else device
    parts = [p for p in ("contiguous" if contiguous else "", "16-byte aligned" if aligned else "") if p]
    want = "a " + (", ".join(parts) + " " if parts else "")
    want += (dtype_name(dtype) + " " if dtype is not None else "") + ("CUDA " if dtype is None else "") + "tensor"
    if dtypes is not None and dtype is None:
        want += f" of dtype {_dtypes_text(dtypes)}".replace(", torch.", " / torch.")
    if shape is not None:
        want += f" of shape {tuple(shape)}"
    elif min_dims:
        want += f" with at least {min_dims} dimension(s)"
    want += f" on {device}" + (f" ({what})" if what else "")
    if not isinstance(t, torch.Tensor):
        fail(op, arg, describe(t), want, type_error=True)
    if ((shape is not None and tuple(t.shape) != tuple(shape)) or (dtype is not None and t.dtype != dtype)
            or (dtypes is not None and dtype_name(t.dtype) not in dtypes) or t.device != device
            or t.dim() < min_dims or (contiguous and not t.is_contiguous()) or (aligned and t.data_ptr() % 16)):
        fail(op, arg, describe(t, strides=contiguous, address=aligned), want)


def signature(t, strict: bool = False):
    """What the call checks read of argument `t`: (type, dtype, shape, device) of a tensor, plus whether it
    is contiguous and its address modulo 16 with `strict` (tensors handed to a kernel as they are); the type
    of anything else (it fails the checks, so it is never remembered)."""
    try:
        if strict:
            return type(t), t.dtype, t.shape, t.device, t.is_contiguous(), t.data_ptr() & 15
        return type(t), t.dtype, t.shape, t.device
    except Exception:  # noqa: BLE001
        return type(t),


# ------------------------------------------------------------------------------------- agreement
def runtime_or_none():
    """The runtime, or None before init_distributed (no peer to agree with)."""
    from .. import runtime

    try:
        return runtime.current()
    except NotInitializedError:
        return None


def agree(op: str, error: BaseException | None) -> None:
    """Exchange this rank's check result (None or its error) with every rank over the control group and
    raise on every rank if any failed: a failing rank its own error (noting which ranks failed), the others
    :class:`~tilescale.errors.CollectiveMismatchError` naming the failed ranks and their errors. Without a
    runtime (or with one rank) nobody waits: the local error, if any, is raised at once."""
    rt = runtime_or_none()
    if rt is None or rt.info.world_size == 1:
        if error is not None:
            raise error
        return
    every = rt.all_gather_object(None if error is None else str(error))
    raise_if_any_failed(op, error, every, rt.info.rank)


def raise_if_any_failed(op: str, error: BaseException | None, every: list, rank: int) -> None:
    """The raising half of :func:`agree`, given every rank's result (None or an error text)."""
    bad = [(r, e) for r, e in enumerate(every) if e is not None]
    if not bad:
        return
    if error is not None:
        ranks = ", ".join(str(r) for r, _ in bad)
        error.args = (f"{error} [failed on rank(s) {ranks} of {len(every)}; this is rank {rank}]",)
        raise error
    raise CollectiveMismatchError(
        f"{op}: invalid arguments on rank(s) {', '.join(str(r) for r, _ in bad)}: "
        + "; ".join(f"rank {r}: {e}" for r, e in bad)
        + f". This rank's arguments were valid; it raises too rather than wait for those ranks (this is rank {rank})")


class deferred:
    """``with deferred(op) as d: <checks>``: an argument error raised by the checks is kept in ``d.error``
    instead of propagating (a plain ValueError / TypeError, e.g. of a shared helper, becomes an
    OpArgumentError named after `op`), so that the ranks can agree on it first (:func:`agree`,
    :func:`require_same_on_all_ranks`)."""

    def __init__(self, op: str):
        self.op = op
        self.error = None

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if et is None:
            return False
        if issubclass(et, OpArgumentError):
            self.error = e
            return True
        if issubclass(et, (ValueError, TypeError)) and not issubclass(et, CollectiveMismatchError):
            msg = str(e) if str(e).startswith(self.op + ":") else f"{self.op}: {e}"
            self.error = (OpArgumentTypeError if issubclass(et, TypeError) else OpArgumentError)(msg)
            self.error.__cause__ = e
            return True
        return False


class CallCheck:
    """Call-time checks of one op (or function), agreed across ranks once per argument signature.

    ``check(key, validate, *args)``: nothing when `key` (a tuple built from the arguments:
    :func:`signature`) has passed before; else runs ``validate(*args)`` (which raises an argument error),
    agrees on the result with every rank (:func:`agree`: raises on every rank if any failed) and remembers
    `key`. Hot paths test ``key in check.agreed`` themselves and call ``check(...)`` only on a miss.
    ``exchanges`` counts the agreements (tests)."""

    def __init__(self, op: str):
        self.op = op
        self.agreed: set = set()
        self.exchanges = 0

    def __call__(self, key, validate, *args) -> None:
        try:
            if key in self.agreed:
                return
        except TypeError:     # an unhashable part: checked (and agreed) every time
            key = None
        d = deferred(self.op)
        with d:
            validate(*args)
        self.exchanges += 1
        agree(self.op, d.error)
        if key is not None:
            if len(self.agreed) >= _MAX_SIGNATURES:
                self.agreed.clear()
            self.agreed.add(key)

    def forget(self) -> None:
        self.agreed.clear()


# ------------------------------------------------------------------ same arguments on every rank
def require_same_on_all_ranks(op: str, error: BaseException | None = None, team=None, /, **args) -> None:
    """Raise :class:`~tilescale.errors.CollectiveMismatchError` on every rank unless every rank passed
    equal values for each keyword argument of `op`; the message names each differing argument and shows
    every rank's value. `error`: this rank's result of checking those arguments (None: valid; see
    :class:`deferred`), exchanged in the same all_gather: if the arguments agree, every rank raises when
    any rank's check failed (:func:`agree`). `team`: this rank's group (:mod:`tilescale.runtime.team`), exchanged in
    the same all_gather too: every rank of a group must pass that group, and every group be of one size
    (:func:`~tilescale.runtime.team.check_teams`). Construction of every op starts with it.

    torch equivalent: none (NCCL hangs or reads garbage in this case).
    """
    from .. import runtime

    rt = runtime.current()
    mine = {k: _canon(v) for k, v in args.items()}
    if error is not None:
        mine[_ERROR_KEY] = str(error)
    if team is not None:
        mine[_TEAM_KEY] = (team.start, team.stride, team.size)
    try:
        everyone = rt.all_gather_object(mine)
    except RuntimeError as e:      # gloo's timeout of the control group: some rank never constructed this op
        if team is None or "timed out" not in str(e).lower():
            raise
        raise CollectiveMismatchError(
            f"{op}: not every rank of the world constructed this op within the control group's timeout ({e}); "
            "every rank constructs each op at the same point of the program, an op of a group too (its symmetric "
            f"buffers are allocated by the whole world; this rank's group: {team}; this is rank "
            f"{rt.info.rank})") from e
    bad = [k for k in args if any(v.get(k) != mine[k] for v in everyone)]
    if bad:
        lines = []
        for k in bad:
            vals = ", ".join(f"rank {r}: {v.get(k)}" for r, v in enumerate(everyone))
            lines.append(f"  {k}: {vals}")
        raise CollectiveMismatchError(
            f"{op}: argument(s) {', '.join(bad)} differ across ranks; every rank must pass the same values:\n"
            + "\n".join(lines) + f"\n(this is rank {rt.info.rank})")
    raise_if_any_failed(op, error, [v.get(_ERROR_KEY) for v in everyone], rt.info.rank)
    if team is not None:
        from ..runtime.team import check_teams

        check_teams(op, [v.get(_TEAM_KEY, (0, 1, len(everyone))) for v in everyone])


_ERROR_KEY, _TEAM_KEY = "__error__", "__team__"


def _canon(v):
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    s = str(v)  # torch.dtype, torch.Size, GemmConfig...
    return f"<{type(v).__qualname__} object>" if " at 0x" in s else s   # no addresses: they differ by rank


# ------------------------------------------------------------------------------------- streams
class StreamOrder:
    """The stream rule of the double-buffered ops: a call enqueues its work on the current stream, and the
    buffers a call uses are safe to reuse only once the work of the call before it is ordered before it.
    On one stream that is stream order; when the current stream differs from the one of the previous call,
    the new stream first waits (an event recorded now on the old stream) for everything enqueued there.

    ``order(handle)`` with the raw handle of the current stream (an int); hot paths compare
    ``handle != order.handle`` themselves and call ``order.switch(handle)`` only on a change."""

    __slots__ = ("handle", "stream", "device", "switches")

    def __init__(self, device=None):
        self.handle = None
        self.stream = None
        self.device = device
        self.switches = 0

    def __call__(self, handle) -> None:
        if handle != self.handle:
            self.switch(handle)

    def switch(self, handle) -> None:
        import torch

        cur = torch.cuda.current_stream(self.device)
        if self.stream is not None:
            ev = torch.cuda.Event()
            ev.record(self.stream)
            cur.wait_event(ev)
            self.switches += 1
        self.handle, self.stream = handle, cur
