"""How tilescale's distributed ops (:mod:`tilescale.language.distributed`) read their operands while a kernel
is traced: the tables of the keyword arguments' values, regions seen as row-major tiles, peers, signal
words and scalar values, each checked, with a :class:`tilescale.errors.LanguageError` that names the op,
the argument, what was received, what is allowed, and the line of the user's kernel."""
from __future__ import annotations

import tilelang.language as T
from tilelang import tvm
from tvm import tirx

from ..errors import LanguageError, user_location

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


def _err(op: str, msg: str) -> LanguageError:
    return LanguageError(f"T.{op}: {msg} (at {user_location(kernel_line=True)})")


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
