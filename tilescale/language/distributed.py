"""Every distributed tile op of tilescale. Re-exported by ``tilescale.language`` (import it as ``T``).

Conventions, everywhere:

* operand order is source first, destination second, like ``T.copy(src, dst)``;
* peers (``dst_pe=``, ``src_pe=``, ``pe=``), scopes (``scope=``), memory semantics (``sem=``) and
  comparisons (``cmp=``) are keyword arguments, validated while the kernel is traced: a bad value
  raises :class:`tilescale.errors.LanguageError` naming the argument, the value, what is allowed,
  and the line of your kernel;
* regions are tilelang's: a buffer (``A``), a slice (``A[0:64, 128:256]``) or an element taken as
  the start of a contiguous run (``A[i]`` with ``size=``). 2-D tiles of row-major buffers are moved
  row by row; contiguous runs in one transfer;
* "symmetric" memory is memory allocated with ``tilescale.symm.empty`` (the same buffer exists on
  every rank); remote operands must be symmetric, which tilescale checks at launch.

Memory model in one paragraph: puts and gets are one-sided; a blocking put returns when its source
may be reused, not when the data is visible at the peer. ``fence()`` orders this thread's earlier puts
to a PE before its later ones to the same PE; ``quiet()`` waits until all of them are complete and
visible. ``put_signal_*`` makes the data visible before the signal. A consumer that waits for a
signal (``wait_until``, acquire at system scope) then sees all data delivered before that signal.
"""
from __future__ import annotations

import os
import zlib

import tilelang.language as T
from tilelang import tvm
from tvm import tirx

from ..analysis import register_symmetric_args
from ..errors import LanguageError, user_location

__all__ = [
    "get_rank", "get_num_ranks",
    "put_block", "put_warp", "put_thread", "put_block_nbi", "put_warp_nbi", "put_thread_nbi",
    "get_block", "get_warp", "get_thread", "get_block_nbi", "get_warp_nbi", "get_thread_nbi",
    "put_signal_block", "put_signal_warp", "put_signal_thread",
    "signal_op", "signal_set", "signal_add",
    "wait_until", "wait_eq", "wait_ne", "wait_ge", "wait_gt", "wait_le", "wait_lt",
    "ld", "st", "atom_add", "atom_cas",
    "fence", "quiet", "barrier_all", "sync_all", "remote",
]

_GROUPS = {"thread": 0, "warp": 1, "block": 2}
_CMPS = {"eq": 0, "ne": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5}
_SIG_OPS = {"set": 0, "add": 1}
_SCOPES = {"cta": 0, "gpu": 1, "sys": 2}
_LD_SEMS = {"relaxed": 0, "acquire": 1, "volatile": 4}
_ST_SEMS = {"relaxed": 0, "release": 2, "volatile": 4}
_ATOM_SEMS = {"relaxed": 0, "acquire": 1, "release": 2, "acq_rel": 3}
_CTYPES = {"int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long",
           "float32": "float", "float64": "double"}
_WAIT_DTYPES = ("int32", "uint32", "int64", "uint64")
_ATOM_ADD_DTYPES = ("int32", "uint32", "int64", "uint64", "float32")

# Positions of the symmetric operands of each device call (ops.cuh: what is read first, then the destination).
for _name, _pos in (("tilescale::put", (1,)), ("tilescale::get", (0,)), ("tilescale::put_signal", (1, 7)),
                    ("tilescale::signal_op", (1,)), ("tilescale::ld_pe", (0,)), ("tilescale::st_pe", (1,)),
                    ("tilescale::atom_add_pe", (1,)), ("tilescale::atom_cas_pe", (2,)),
                    ("tilescale::peer_ptr", (0,)), ("tilescale::wait_until_pe", (0,))):
    register_symmetric_args(_name, _pos)

# wait site id -> "file:line" of the user's kernel (ids are stable across processes: a hash).
# Barriers (T.barrier_all, T.sync_all, tilescale.barrier, the barriers of symm.zeros/free) report site -2.
BARRIER_SITE = -2
WAIT_SITES: dict[int, str] = {BARRIER_SITE: "a barrier of all ranks (T.barrier_all / T.sync_all / tilescale.barrier)"}


def _err(op: str, msg: str) -> LanguageError:
    return LanguageError(f"T.{op}: {msg} (at {user_location(kernel_line=True)})")


# --------------------------------------------------------------------------------- validation
def _pick(op: str, arg: str, value, table: dict) -> int:
    if not isinstance(value, str) or value not in table:
        raise _err(op, f"{arg}: got {value!r}, expected one of {', '.join(repr(k) for k in table)}")
    return table[value]


def _pe(op: str, arg: str, pe) -> tirx.PrimExpr:
    """A PE index: a Python int >= 0 or an integer PrimExpr (cast to int32)."""
    if pe is None:
        raise _err(op, f"{arg}: missing; pass the peer's rank as {arg}=<int expression>")
    if isinstance(pe, bool):
        raise _err(op, f"{arg}: got a bool ({pe}), expected an integer rank")
    if isinstance(pe, int):
        if pe < 0:
            raise _err(op, f"{arg}: got {pe}, expected a rank >= 0")
        return tirx.IntImm("int32", pe)
    if isinstance(pe, tirx.PrimExpr):
        dt = str(pe.dtype)
        if not (dt.startswith("int") or dt.startswith("uint")):
            raise _err(op, f"{arg}: got an expression of type {dt}, expected an integer rank expression")
        return pe if dt == "int32" else T.cast(pe, "int32")
    raise _err(op, f"{arg}: got {type(pe).__name__} {pe!r}, expected an int or an integer expression")


def _as_int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _same(a, b) -> bool:
    ia, ib = _as_int(a), _as_int(b)
    if ia is not None and ib is not None:
        return ia == ib
    try:
        return bool(tvm.ir.structural_equal(a, b))
    except Exception:  # noqa: BLE001
        return False


class _Tile:
    """A region seen as `rows` rows of `cols` elements, `ld` elements apart (row-major)."""

    def __init__(self, op: str, arg: str, x, size, need_global: bool):
        if isinstance(x, tirx.Buffer):
            buf, starts, extents, point = x, [0] * len(x.shape), list(x.shape), False
        elif isinstance(x, tirx.BufferRegion):
            buf, starts, extents, point = x.buffer, [r.min for r in x.region], [r.extent for r in x.region], False
        elif isinstance(x, tirx.BufferLoad):
            buf, starts, extents, point = x.buffer, list(x.indices), [1] * len(x.indices), True
        else:
            raise _err(op, f"{arg}: got {type(x).__name__}, expected a buffer, a slice such as A[0:64, :] or an "
                           "element A[i] (start of a run of `size` elements)")
        scope = buf.scope()
        if scope.startswith("local"):
            raise _err(op, f"{arg}: buffer '{buf.name}' is in {scope} (registers); copy it to shared memory "
                           "with T.copy first")
        if need_global and scope != "global":
            raise _err(op, f"{arg}: buffer '{buf.name}' is in {scope}; the remote side must be a global buffer on "
                           "the symmetric heap (a kernel parameter)")
        if buf.strides and len(buf.strides) > 0:
            expect, acc = [], 1
            for dim in reversed(list(buf.shape)):
                expect.append(acc)
                acc = acc * dim
            if not all(_same(a, b) for a, b in zip(buf.strides, reversed(expect), strict=False)):
                raise _err(op, f"{arg}: buffer '{buf.name}' has strides {list(buf.strides)}; only compact row-major "
                               "buffers are supported")
        self.buffer, self.dtype = buf, str(buf.dtype)
        self.elem_bytes = tvm.DataType(self.dtype).bits // 8
        shape = list(buf.shape)
        numel = 1
        for e in extents:
            numel = numel * e
        if point:
            if size is None:
                self.rows, self.cols, self.ld = 1, 1, 1
            else:
                self.rows, self.cols, self.ld = 1, size, size
            self.numel = self.cols
        else:
            self.numel = numel
            self.rows, self.cols, self.ld = self._shape2d(op, arg, shape, extents)
            if size is not None and not _same(size, numel):
                raise _err(op, f"size: got {size}, expected {numel} (the number of elements in {arg} "
                               f"'{buf.name}' region {self._desc(starts, extents)}), or omit size")
        self.starts = starts
        self.start = buf[tuple(starts)] if starts else buf

    @staticmethod
    def _desc(starts, extents) -> str:
        parts = (f"{s}:{s}+{e}" if _as_int(e) != 1 else f"{s}" for s, e in zip(starts, extents, strict=False))
        return "[" + ", ".join(parts) + "]"

    def _shape2d(self, op, arg, shape, extents):
        nd = len(shape)
        if nd == 1:
            return 1, extents[0], extents[0]
        # contiguous: dims before the first partial one have extent 1, dims after it are full
        first = next((d for d in range(nd) if _as_int(extents[d]) != 1), nd - 1)
        if all(_same(extents[d], shape[d]) for d in range(first + 1, nd)):
            n = 1
            for e in extents:
                n = n * e
            return 1, n, n
        # rows x cols tile: one outer dim with extent > 1, last dim partial
        outer = [d for d in range(nd - 1) if _as_int(extents[d]) != 1]
        if len(outer) == 1 and all(_same(extents[d], shape[d]) for d in range(outer[0] + 1, nd - 1)):
            ld = 1
            for d in range(outer[0] + 1, nd):
                ld = ld * shape[d]
            cols = 1
            for d in range(outer[0] + 1, nd):
                cols = cols * extents[d]
            return extents[outer[0]], cols, ld
        raise _err(op, f"{arg}: region of '{self.buffer.name}' is neither contiguous nor a rows x cols tile")

    def ptr(self, mode: str):
        return T.access_ptr(self.start, mode)


def _pair(op: str, src, dst, size, remote: str):
    s = _Tile(op, "src", src, size, need_global=remote == "src")
    d = _Tile(op, "dst", dst, size if isinstance(dst, tirx.BufferLoad) else None, need_global=remote == "dst")
    if isinstance(src, tirx.BufferLoad) and size is None and not isinstance(dst, tirx.BufferLoad):
        s.rows, s.cols, s.ld, s.numel = 1, d.numel, d.numel, d.numel
    if isinstance(dst, tirx.BufferLoad) and size is None and not isinstance(src, tirx.BufferLoad):
        d.rows, d.cols, d.ld, d.numel = 1, s.numel, s.numel, s.numel
    if s.dtype != d.dtype:
        raise _err(op, f"dst: dtype {d.dtype} differs from src dtype {s.dtype}")
    if not _same(s.numel, d.numel):
        raise _err(op, f"dst: region has {d.numel} elements but src has {s.numel}")
    # a contiguous run on one side takes the tile shape of the other side
    s_flat, d_flat = _as_int(s.rows) == 1, _as_int(d.rows) == 1
    if s_flat and d_flat:
        rows, cols, src_ld, dst_ld = 1, s.numel, s.numel, s.numel
    elif s_flat:
        rows, cols, src_ld, dst_ld = d.rows, d.cols, d.cols, d.ld
    elif d_flat:
        rows, cols, src_ld, dst_ld = s.rows, s.cols, s.ld, s.cols
    else:
        if not (_same(s.rows, d.rows) and _same(s.cols, d.cols)):
            raise _err(op, f"dst: tile shape {d.rows}x{d.cols} does not match src tile {s.rows}x{s.cols}")
        rows, cols, src_ld, dst_ld = s.rows, s.cols, s.ld, d.ld
    eb = s.elem_bytes
    return s, d, rows, cols * eb, src_ld * eb, dst_ld * eb


# ----------------------------------------------------------------------------------- identity
def get_rank() -> tirx.PrimExpr:
    """This rank's PE number (device side), an int32 expression. torch equivalent: ``dist.get_rank()``."""
    return T.call_extern("int32", "nvshmem_my_pe")


def get_num_ranks() -> tirx.PrimExpr:
    """Number of PEs (device side). torch equivalent: ``dist.get_world_size()``."""
    return T.call_extern("int32", "nvshmem_n_pes")


# ---------------------------------------------------------------------------------- put / get
def _put(group: str, nbi: bool, src, dst, size, dst_pe):
    op = f"put_{group}{'_nbi' if nbi else ''}"
    pe = _pe(op, "dst_pe", dst_pe)
    s, d, rows, row_bytes, src_ld, dst_ld = _pair(op, src, dst, size, remote="dst")
    T.evaluate(T.call_extern("handle", f"tilescale::put<{_GROUPS[group]}, {'true' if nbi else 'false'}>",
                             s.ptr("r"), d.ptr("w"), rows, row_bytes, src_ld, dst_ld, pe))


def _get(group: str, nbi: bool, src, dst, size, src_pe):
    op = f"get_{group}{'_nbi' if nbi else ''}"
    pe = _pe(op, "src_pe", src_pe)
    s, d, rows, row_bytes, src_ld, dst_ld = _pair(op, src, dst, size, remote="src")
    T.evaluate(T.call_extern("handle", f"tilescale::get<{_GROUPS[group]}, {'true' if nbi else 'false'}>",
                             s.ptr("r"), d.ptr("w"), rows, row_bytes, src_ld, dst_ld, pe))


def put_block(src, dst, size=None, *, dst_pe):
    """Copy the `src` tile (local: global or shared) into symmetric `dst` on rank `dst_pe`; all threads
    of the block call it together. Blocking: returns when `src` may be reused. Not ordered with later
    operations unless followed by ``fence()``/``quiet()``. torch: ``peer(dst, dst_pe).copy_(src)``."""
    _put("block", False, src, dst, size, dst_pe)


def put_warp(src, dst, size=None, *, dst_pe):
    """:func:`put_block` for the 32 threads of a warp."""
    _put("warp", False, src, dst, size, dst_pe)


def put_thread(src, dst, size=None, *, dst_pe):
    """:func:`put_block` for one thread."""
    _put("thread", False, src, dst, size, dst_pe)


def put_block_nbi(src, dst, size=None, *, dst_pe):
    """Non-blocking :func:`put_block`: `src` may be reused only after ``quiet()``."""
    _put("block", True, src, dst, size, dst_pe)


def put_warp_nbi(src, dst, size=None, *, dst_pe):
    """Non-blocking :func:`put_warp`."""
    _put("warp", True, src, dst, size, dst_pe)


def put_thread_nbi(src, dst, size=None, *, dst_pe):
    """Non-blocking :func:`put_thread`."""
    _put("thread", True, src, dst, size, dst_pe)


def get_block(src, dst, size=None, *, src_pe):
    """Copy symmetric `src` as it is on rank `src_pe` into local `dst` (global or shared); all threads of
    the block call it together. Blocking: `dst` holds the data on return (block-wide).
    torch: ``dst.copy_(peer(src, src_pe))``."""
    _get("block", False, src, dst, size, src_pe)


def get_warp(src, dst, size=None, *, src_pe):
    """:func:`get_block` for the 32 threads of a warp."""
    _get("warp", False, src, dst, size, src_pe)


def get_thread(src, dst, size=None, *, src_pe):
    """:func:`get_block` for one thread."""
    _get("thread", False, src, dst, size, src_pe)


def get_block_nbi(src, dst, size=None, *, src_pe):
    """Non-blocking :func:`get_block`: `dst` holds the data after ``quiet()``."""
    _get("block", True, src, dst, size, src_pe)


def get_warp_nbi(src, dst, size=None, *, src_pe):
    """Non-blocking :func:`get_warp`."""
    _get("warp", True, src, dst, size, src_pe)


def get_thread_nbi(src, dst, size=None, *, src_pe):
    """Non-blocking :func:`get_thread`."""
    _get("thread", True, src, dst, size, src_pe)


# ------------------------------------------------------------------------------------- signals
def _signal(op: str, signal, write: bool):
    t = _Tile(op, "signal", signal, None, need_global=True)
    if t.dtype != "uint64":
        raise _err(op, f"signal: buffer '{t.buffer.name}' has dtype {t.dtype}, expected uint64 "
                       "(signals are 64-bit unsigned words)")
    return t.ptr("w" if write else "r")


def _u64(op: str, arg: str, value) -> tirx.PrimExpr:
    if isinstance(value, bool) or value is None:
        raise _err(op, f"{arg}: got {value!r}, expected an unsigned integer")
    if isinstance(value, int):
        if value < 0:
            raise _err(op, f"{arg}: got {value}, expected an unsigned integer >= 0")
        return tirx.const(value, "uint64")
    if isinstance(value, tirx.PrimExpr) and (str(value.dtype).startswith(("int", "uint"))):
        return T.cast(value, "uint64")
    raise _err(op, f"{arg}: got {value!r}, expected an unsigned integer (int or integer expression)")


def _put_signal(group: str, src, dst, signal, value, sig_op, dst_pe, size):
    op = f"put_signal_{group}"
    pe = _pe(op, "dst_pe", dst_pe)
    sop = _pick(op, "sig_op", sig_op, _SIG_OPS)
    s, d, rows, row_bytes, src_ld, dst_ld = _pair(op, src, dst, size, remote="dst")
    sig = _signal(op, signal, True)
    val = _u64(op, "value", value)
    T.evaluate(T.call_extern("handle", f"tilescale::put_signal<{_GROUPS[group]}>", s.ptr("r"), d.ptr("w"), rows,
                             row_bytes, src_ld, dst_ld, val, sig, sop, pe))


def put_signal_block(src, dst, signal, size=None, *, value, sig_op="set", dst_pe):
    """Put the `src` tile into symmetric `dst` on `dst_pe`, then update `signal` (uint64, symmetric) on
    `dst_pe` with `sig_op` ("set" or "add") `value`. The data is visible at the peer before the signal:
    1. the block copies the tile; 2. one thread fences (system scope) and updates the signal.
    A peer that ``wait_until``s the signal then reads the tile."""
    _put_signal("block", src, dst, signal, value, sig_op, dst_pe, size)


def put_signal_warp(src, dst, signal, size=None, *, value, sig_op="set", dst_pe):
    """:func:`put_signal_block` for the 32 threads of a warp."""
    _put_signal("warp", src, dst, signal, value, sig_op, dst_pe, size)


def put_signal_thread(src, dst, signal, size=None, *, value, sig_op="set", dst_pe):
    """:func:`put_signal_block` for one thread."""
    _put_signal("thread", src, dst, signal, value, sig_op, dst_pe, size)


def signal_op(signal, *, value, op="set", dst_pe):
    """Atomically set or add `value` to the uint64 `signal` (symmetric) on `dst_pe` (NVSHMEM signal op).
    Ordered after earlier puts to `dst_pe` only with a ``fence()`` in between."""
    code = _pick("signal_op", "op", op, _SIG_OPS)
    sig = _signal("signal_op", signal, True)
    T.evaluate(T.call_extern("handle", "tilescale::signal_op", _u64("signal_op", "value", value), sig, code,
                             _pe("signal_op", "dst_pe", dst_pe)))


def signal_set(signal, value, *, dst_pe):
    """``signal_op(signal, value=value, op="set", dst_pe=dst_pe)``."""
    signal_op(signal, value=value, op="set", dst_pe=dst_pe)


def signal_add(signal, value, *, dst_pe):
    """``signal_op(signal, value=value, op="add", dst_pe=dst_pe)``."""
    signal_op(signal, value=value, op="add", dst_pe=dst_pe)


# --------------------------------------------------------------------------------------- waits
def _site() -> int:
    loc = user_location(kernel_line=True)
    fn, _, line = loc.rpartition(":")
    key = f"{os.path.basename(fn)}:{line}"
    site = zlib.crc32(key.encode()) & 0x7FFFFFFF
    WAIT_SITES[site] = loc
    return site


def wait_until(signal, *, cmp, value, src_pe=None):
    """Spin until ``signal cmp value`` holds, `signal` being a local int32/uint32/int64/uint64 word
    (usually a symmetric signal that peers update). Acquire at system scope: everything the peer made
    visible before updating the signal is visible after this returns (also to TMA loads).
    Each calling thread waits. In debug mode (``TILESCALE_WAIT_TIMEOUT_S``) it gives up after that long,
    records rank, block, thread, this line, expected and observed values, and stops the kernel.
    With ``src_pe``, polls rank `src_pe`'s copy of symmetric `signal` through its peer mapping instead."""
    op = "wait_until"
    code = _pick(op, "cmp", cmp, _CMPS)
    t = _Tile(op, "signal", signal, None, need_global=True)
    if t.dtype not in _WAIT_DTYPES:
        raise _err(op, f"signal: buffer '{t.buffer.name}' has dtype {t.dtype}, expected one of "
                       f"{', '.join(_WAIT_DTYPES)}")
    if isinstance(value, bool) or not isinstance(value, (int, tirx.PrimExpr)):
        raise _err(op, f"value: got {value!r}, expected an integer")
    if isinstance(value, tirx.PrimExpr) and not str(value.dtype).startswith(("int", "uint")):
        raise _err(op, f"value: got an expression of type {value.dtype}, expected an integer expression")
    v = tirx.const(value, t.dtype) if isinstance(value, int) else T.cast(value, t.dtype)
    if src_pe is None:
        T.evaluate(T.call_extern(t.dtype, f"tilescale::wait_until<{_CTYPES[t.dtype]}>", t.ptr("r"), code, v, _site()))
    else:
        T.evaluate(T.call_extern(t.dtype, f"tilescale::wait_until_pe<{_CTYPES[t.dtype]}>", t.ptr("r"),
                                 _pe(op, "src_pe", src_pe), code, v, _site()))


def wait_eq(signal, value):
    """``wait_until(signal, cmp="eq", value=value)``."""
    wait_until(signal, cmp="eq", value=value)


def wait_ne(signal, value):
    """``wait_until(signal, cmp="ne", value=value)``."""
    wait_until(signal, cmp="ne", value=value)


def wait_ge(signal, value):
    """``wait_until(signal, cmp="ge", value=value)``."""
    wait_until(signal, cmp="ge", value=value)


def wait_gt(signal, value):
    """``wait_until(signal, cmp="gt", value=value)``."""
    wait_until(signal, cmp="gt", value=value)


def wait_le(signal, value):
    """``wait_until(signal, cmp="le", value=value)``."""
    wait_until(signal, cmp="le", value=value)


def wait_lt(signal, value):
    """``wait_until(signal, cmp="lt", value=value)``."""
    wait_until(signal, cmp="lt", value=value)


# ------------------------------------------------------------------- scoped loads, stores, atomics
def _scalar(op: str, arg: str, x, allowed) -> tuple[_Tile, str]:
    t = _Tile(op, arg, x, None, need_global=False)
    if _as_int(t.numel) != 1:
        raise _err(op, f"{arg}: expected one element such as flag[0], got a region of {t.numel} elements")
    if t.dtype not in allowed:
        raise _err(op, f"{arg}: buffer '{t.buffer.name}' has dtype {t.dtype}, expected one of {', '.join(allowed)}")
    return t, t.dtype


def _value(op: str, arg: str, value, dtype: str) -> tirx.PrimExpr:
    if isinstance(value, bool) or not isinstance(value, (int, float, tirx.PrimExpr)):
        raise _err(op, f"{arg}: got {value!r}, expected a number or expression of type {dtype}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not dtype.startswith("float"):
            raise _err(op, f"{arg}: got the float {value}, expected an integer for a {dtype} location")
        return tirx.const(value, dtype)
    return value if str(value.dtype) == dtype else T.cast(value, dtype)


def ld(src, *, scope="gpu", sem="acquire", src_pe=None):
    """Load one 32- or 64-bit element with explicit memory semantics: ``sem`` "acquire" (later loads
    see what the writer released), "relaxed", or "volatile"; ``scope`` "cta", "gpu" or "sys" (use "sys"
    for data written by peers or the host). With ``src_pe``, loads rank `src_pe`'s copy of symmetric `src`
    through its peer mapping (intra-node). Returns an expression; bind it once (``v = T.ld(...)``)."""
    scope_c = _pick("ld", "scope", scope, _SCOPES)
    sem_c = _pick("ld", "sem", sem, _LD_SEMS)
    t, dt = _scalar("ld", "src", src, tuple(_CTYPES))
    if src_pe is None:
        return T.call_extern(dt, f"tilescale::ld<{sem_c}, {scope_c}, {_CTYPES[dt]}>", t.ptr("r"))
    return T.call_extern(dt, f"tilescale::ld_pe<{sem_c}, {scope_c}, {_CTYPES[dt]}>", t.ptr("r"),
                         _pe("ld", "src_pe", src_pe))


def st(dst, value, *, scope="gpu", sem="release", dst_pe=None):
    """Store one 32- or 64-bit element with explicit semantics: ``sem`` "release" (earlier writes of this
    thread are visible to whoever acquires this value), "relaxed" or "volatile"; ``scope`` "cta", "gpu",
    "sys". With ``dst_pe``, stores into rank `dst_pe`'s copy of symmetric `dst` (intra-node peer mapping).
    The seed's ``T.st(signal[0], 1, scope="sys", sem="release", dst_pe=p)`` is the classic flag release."""
    scope_c = _pick("st", "scope", scope, _SCOPES)
    sem_c = _pick("st", "sem", sem, _ST_SEMS)
    t, dt = _scalar("st", "dst", dst, tuple(_CTYPES))
    v = _value("st", "value", value, dt)
    if dst_pe is None:
        T.evaluate(T.call_extern("handle", f"tilescale::st<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("w")))
    else:
        T.evaluate(T.call_extern("handle", f"tilescale::st_pe<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("w"),
                                 _pe("st", "dst_pe", dst_pe)))


def atom_add(dst, value, *, scope="gpu", sem="relaxed", dst_pe=None):
    """Atomically add `value` to one int32/uint32/int64/uint64/float32 element, on this rank or (with
    ``dst_pe``) on rank `dst_pe`'s copy of symmetric `dst`; returns the previous value.
    ``sem``: relaxed, acquire, release, acq_rel; ``scope``: cta, gpu, sys."""
    scope_c = _pick("atom_add", "scope", scope, _SCOPES)
    sem_c = _pick("atom_add", "sem", sem, _ATOM_SEMS)
    t, dt = _scalar("atom_add", "dst", dst, _ATOM_ADD_DTYPES)
    v = _value("atom_add", "value", value, dt)
    if dst_pe is None:
        return T.call_extern(dt, f"tilescale::atom_add<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("rw"))
    return T.call_extern(dt, f"tilescale::atom_add_pe<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("rw"),
                         _pe("atom_add", "dst_pe", dst_pe))


def atom_cas(dst, compare, value, *, scope="gpu", sem="relaxed", dst_pe=None):
    """Atomic compare-and-swap of one 32/64-bit integer element (local or on `dst_pe`): if it equals
    `compare`, write `value`. Returns the previous value (== `compare` when the swap happened)."""
    scope_c = _pick("atom_cas", "scope", scope, _SCOPES)
    sem_c = _pick("atom_cas", "sem", sem, _ATOM_SEMS)
    t, dt = _scalar("atom_cas", "dst", dst, _WAIT_DTYPES)
    c = _value("atom_cas", "compare", compare, dt)
    v = _value("atom_cas", "value", value, dt)
    if dst_pe is None:
        return T.call_extern(dt, f"tilescale::atom_cas<{sem_c}, {scope_c}, {_CTYPES[dt]}>", c, v, t.ptr("rw"))
    return T.call_extern(dt, f"tilescale::atom_cas_pe<{sem_c}, {scope_c}, {_CTYPES[dt]}>", c, v, t.ptr("rw"),
                         _pe("atom_cas", "dst_pe", dst_pe))


# ---------------------------------------------------------------------- ordering and barriers
def fence():
    """Order this thread's puts (and signal ops) to each PE: those issued before the fence are delivered
    before those issued after it, to the same PE. Does not wait for completion (``nvshmem_fence``)."""
    T.evaluate(T.call_extern("handle", "nvshmem_fence"))


def quiet():
    """Wait until every put/get this thread issued (blocking or not) is complete and visible at its
    destination (``nvshmem_quiet``)."""
    T.evaluate(T.call_extern("handle", "nvshmem_quiet"))


_BARRIER_SCOPES = {"thread": "tilescale::barrier_all<0>", "warp": "tilescale::barrier_all<1>",
                   "block": "tilescale::barrier_all<2>", "grid": None}
_SYNC_SCOPES = {"thread": "tilescale::sync_all<0>", "warp": "tilescale::sync_all<1>",
                "block": "tilescale::sync_all<2>", "grid": None}


def barrier_all(*, scope="block"):
    """Barrier of all ranks: completes this rank's outstanding puts (quiet), then waits until every rank
    arrives. Bounded like every wait (``TILESCALE_WAIT_TIMEOUT_S``): a rank that never arrives stops the
    kernel with a record naming the barrier. ``scope`` says who calls it on each rank:
    "block": all threads of exactly one block per rank; "warp": one warp; "thread": one thread;
    "grid": every block of the kernel (a grid sync, the first block's barrier, a grid sync; the kernel is
    then launched cooperatively so all its blocks are co-resident, or the launch fails with an error)."""
    _pick("barrier_all", "scope", scope, _BARRIER_SCOPES)
    if scope == "grid":
        T.evaluate(T.sync_grid())   # (a bare call inside a helper builds an expression and drops it)
        T.evaluate(T.call_extern("handle", "tilescale::barrier_all_first_block"))
        T.evaluate(T.sync_grid())   # (a bare call inside a helper builds an expression and drops it)
    else:
        T.evaluate(T.call_extern("handle", _BARRIER_SCOPES[scope]))


def sync_all(*, scope="block"):
    """Like :func:`barrier_all` without completing outstanding puts (synchronisation only)."""
    _pick("sync_all", "scope", scope, _SYNC_SCOPES)
    if scope == "grid":
        T.evaluate(T.sync_grid())   # (a bare call inside a helper builds an expression and drops it)
        T.evaluate(T.call_extern("handle", "tilescale::barrier_all_first_block"))  # a barrier is a sync
        T.evaluate(T.sync_grid())   # (a bare call inside a helper builds an expression and drops it)
    else:
        T.evaluate(T.call_extern("handle", _SYNC_SCOPES[scope]))


def remote(buf, *, pe):
    """Rank `pe`'s copy of symmetric buffer `buf`, as a buffer of the same shape and dtype that tilelang's
    own ops (``T.copy``, loads, stores) use directly: a peer pointer (NVLink / P2P, intra-node only; the
    kernel stops with a message if `pe` has no load/store path). torch: ``tilescale.symm.peer_tensor``.
    Reads through it are not ordered with the peer's writes: synchronise with signals first."""
    if not isinstance(buf, tirx.Buffer):
        raise _err("remote", f"buf: got {type(buf).__name__}, expected a buffer (a kernel parameter)")
    if buf.scope() != "global":
        raise _err("remote", f"buf: buffer '{buf.name}' is in {buf.scope()}, expected a global (symmetric) buffer")
    p = _pe("remote", "pe", pe)
    ptr = T.call_extern("handle", "tilescale::peer_ptr", T.access_ptr(buf, "rw"), p)
    return T.make_tensor(ptr, tuple(buf.shape), str(buf.dtype))

