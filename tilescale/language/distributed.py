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
  every rank); remote operands must be symmetric, which tilescale checks at launch;
* every op picks its path per peer at run time: a rank of this node through its NVLink / P2P mapping
  (loads and stores), a rank of another node through NVSHMEM's API (puts, gets, atomics).
  ``TILESCALE_NODE_SIZE=k`` makes nodes of k ranks on one host (1: every other rank is remote).
  ``remote`` alone has no such path: test ``peer_reachable`` first.

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
from tvm import tirx

from ..compilation.analysis import register_symmetric_args
from ..errors import user_location
from .operands import (
    _ATOM_ADD_DTYPES,
    _ATOM_SEMS,
    _CMPS,
    _CTYPES,
    _GROUPS,
    _LD_SEMS,
    _SCOPES,
    _SIG_OPS,
    _ST_SEMS,
    _WAIT_DTYPES,
    _err,
    _pair,
    _pe,
    _pick,
    _scalar,
    _signal,
    _Tile,
    _u64,
    _value,
)

__all__ = [
    "get_rank", "get_num_ranks", "team_rank", "team_pe", "call_number",
    "put_block", "put_warp", "put_thread", "put_block_nbi", "put_warp_nbi", "put_thread_nbi",
    "get_block", "get_warp", "get_thread", "get_block_nbi", "get_warp_nbi", "get_thread_nbi",
    "put_signal_block", "put_signal_warp", "put_signal_thread",
    "signal_op", "signal_set", "signal_add",
    "wait_until", "wait_eq", "wait_ne", "wait_ge", "wait_gt", "wait_le", "wait_lt",
    "ld", "st", "atom_add", "atom_cas", "release_stores",
    "fence", "quiet", "barrier_all", "sync_all", "remote", "peer_reachable",
]

# Positions of the symmetric operands of each device call (ops.cuh: what is read first, then the destination).
for _name, _pos in (("tilescale::put", (1,)), ("tilescale::get", (0,)), ("tilescale::put_signal", (1, 7)),
                    ("tilescale::signal_op", (1,)), ("tilescale::ld_pe", (0,)), ("tilescale::st_pe", (1,)),
                    ("tilescale::atom_add_pe", (1,)), ("tilescale::atom_cas_pe", (2,)),
                    ("tilescale::peer_ptr", (0,)), ("tilescale::wait_until_pe", (0,)),
                    ("tilescale::peer_reachable", (0,))):
    register_symmetric_args(_name, _pos)

# wait site id -> "file:line" of the user's kernel (ids are stable across processes: a hash).
# Barriers (T.barrier_all, T.sync_all, tilescale.barrier, the barriers of symm.zeros/free) report site -2.
BARRIER_SITE = -2
# T.call_number stops a kernel whose block has no counter with a wait's record of this site (expected: the
# counters buffer's size; observed: the block's index): a printf there would slow the kernel (ops.cuh)
CALL_NUMBER_SITE = -3
WAIT_SITES: dict[int, str] = {BARRIER_SITE: "a barrier of all ranks (T.barrier_all / T.sync_all / tilescale.barrier)",
                              CALL_NUMBER_SITE: "T.call_number"}


# ----------------------------------------------------------------------------------- identity
def get_rank() -> tirx.PrimExpr:
    """This rank's PE number (device side), an int32 expression. torch equivalent: ``dist.get_rank()``."""
    return T.call_extern("int32", "nvshmem_my_pe")


def get_num_ranks() -> tirx.PrimExpr:
    """Number of PEs (device side). torch equivalent: ``dist.get_world_size()``."""
    return T.call_extern("int32", "nvshmem_n_pes")


def team_rank(team=None):
    """This rank's index in `team`, a kernel's compile-time group (:class:`tilescale.runtime.team.Team`: world ranks
    start, start + stride, ...; None: the whole world, ``get_rank()``). torch: ``dist.get_rank(group)``."""
    return get_rank() if team is None else team.index(get_rank())


def team_pe(team, i):
    """The PE (world rank) of rank `i` of `team` (None: the whole world, `i` itself): the ``dst_pe`` / ``src_pe`` of
    a peer named by its rank in the kernel's group. torch: ``dist.get_global_rank(group, i)``."""
    return i if team is None else team.pe(i)


def call_number(counters, *, scope="block") -> tirx.PrimExpr:
    """Which launch of this kernel this is: 1, 2, ... (a uint64 expression), counted on the device in
    `counters`, a local (not symmetric) int64 buffer of one word per block of the kernel, zero before the
    first launch. A kernel replayed from a CUDA graph sees a new number on every replay, where a number
    passed from the host would keep its value of the capture. Every block of one launch sees the same
    number. Call it once per kernel, first, outside any branch (it synchronises the block), and bind it:
    ``e = T.call_number(counters)``. torch: ``counters += 1; e = counters[block]``.

    ``scope="warp"``: only the calling warp learns the number (lane 0 counts, the lanes share it by shuffle),
    and nothing waits for the rest of the block: every lane of exactly one warp of the block calls it, once
    per launch, and that warp makes every use of the number (e.g. the consumer warp that issues a tile's
    stores and counts them). The block-wide call holds every thread of the block, the producer of a
    warp-specialised GEMM included, for a round trip to memory before the first load."""
    fn = _pick("call_number", "scope", scope,
               {"block": "tilescale::call_number", "warp": "tilescale::call_number_warp"})
    if not isinstance(counters, tirx.Buffer):
        raise _err("call_number", f"counters: got {type(counters).__name__}, expected a buffer (a kernel parameter)")
    if counters.scope() != "global" or str(counters.dtype) != "int64" or len(counters.shape) != 1:
        raise _err("call_number", f"counters: buffer '{counters.name}' is a {str(counters.dtype)} buffer of shape "
                   f"{tuple(counters.shape)} in {counters.scope()}, expected a 1-D int64 buffer in global memory "
                   "(one word per block)")
    return T.call_extern("uint64", fn, T.access_ptr(counters, "rw"), T.cast(counters.shape[0], "int32"))


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
    With ``src_pe``, polls rank `src_pe`'s copy of symmetric `signal` instead: through its peer mapping, or
    with NVSHMEM's atomic fetch for a rank on another node."""
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
def ld(src, *, scope="gpu", sem="acquire", src_pe=None):
    """Load one 32- or 64-bit element with explicit memory semantics: ``sem`` "acquire" (later loads
    see what the writer released), "relaxed", or "volatile"; ``scope`` "cta", "gpu" or "sys" (use "sys"
    for data written by peers or the host). With ``src_pe``, loads rank `src_pe`'s copy of symmetric `src`
    (through its peer mapping, or NVSHMEM's atomic fetch for a rank on another node, with the same
    meaning). Returns an expression; bind it once (``v = T.ld(...)``)."""
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
    "sys". With ``dst_pe``, stores into rank `dst_pe`'s copy of symmetric `dst` (peer mapping; for a rank on
    another node NVSHMEM's atomic set, a release one after ``nvshmem_fence``, so earlier puts land first).
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
    ``dst_pe``) on rank `dst_pe`'s copy of symmetric `dst` (NVSHMEM's atomics for a rank on another node);
    returns the previous value.
    ``sem``: relaxed, acquire, release, acq_rel; ``scope``: cta, gpu, sys."""
    scope_c = _pick("atom_add", "scope", scope, _SCOPES)
    sem_c = _pick("atom_add", "sem", sem, _ATOM_SEMS)
    t, dt = _scalar("atom_add", "dst", dst, _ATOM_ADD_DTYPES)
    v = _value("atom_add", "value", value, dt)
    if dst_pe is None:
        return T.call_extern(dt, f"tilescale::atom_add<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("rw"))
    return T.call_extern(dt, f"tilescale::atom_add_pe<{sem_c}, {scope_c}, {_CTYPES[dt]}>", v, t.ptr("rw"),
                         _pe("atom_add", "dst_pe", dst_pe))


def release_stores(counter, value=1, *, scope="sys", pending=0):
    """Count this block's stores into global memory once they are visible at `scope`: each calling thread
    waits for its own TMA (bulk) stores to be written (``cp.async.bulk.wait_group 0``, then a proxy fence,
    so they are ordered like its plain stores), its warp converges, and lane 0 adds `value` to the local
    `counter` (int32/uint32/int64/uint64) with release semantics. A reader that acquires the count (e.g.
    ``T.wait_until(..., src_pe=...)``) then sees every store made before it.

    Every thread of each calling warp must call it (a warp-level step). The counter grows by `value` per
    warp: a block whose W consumer warps call it after storing a tile adds W x `value`, not one per thread. A
    tile stored by ``T.copy`` (one TMA store, issued by one elected lane) can be counted once, by that lane's
    warp alone (which warp tilelang elects: ``tilescale.compat.storing_warp``): each release at system scope
    costs a memory barrier; another warp's release would not wait for the store.
    ``pending=n`` leaves this thread's n most recent groups of TMA stores in flight (``wait_group n``): a
    persistent kernel counts tile i once it has issued the store of tile i + 1, so that the write of tile i is
    not waited for (default 0: every store written).

    torch has no equivalent (it orders whole kernels, not tiles): "tile written" -> ``counter += warps``."""
    scope_c = _pick("release_stores", "scope", scope, _SCOPES)
    t, dt = _scalar("release_stores", "counter", counter, _WAIT_DTYPES)
    v = _value("release_stores", "value", value, dt)
    if isinstance(pending, bool) or not isinstance(pending, int) or not 0 <= pending <= 7:
        raise _err("release_stores", f"pending: got {pending!r}, expected an int from 0 to 7 (groups of TMA stores "
                   "left in flight)")
    T.evaluate(T.call_extern("handle", f"tilescale::release_stores<{scope_c}, {_CTYPES[dt]}, {pending}>", v,
                             t.ptr("rw")))


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


def _global_buffer(op: str, buf) -> tirx.Buffer:
    if not isinstance(buf, tirx.Buffer):
        raise _err(op, f"buf: got {type(buf).__name__}, expected a buffer (a kernel parameter)")
    if buf.scope() != "global":
        raise _err(op, f"buf: buffer '{buf.name}' is in {buf.scope()}, expected a global (symmetric) buffer")
    return buf


def remote(buf, *, pe):
    """Rank `pe`'s copy of symmetric buffer `buf`, as a buffer of the same shape and dtype that tilelang's
    own ops (``T.copy``, loads, stores) use directly: a peer pointer (NVLink / P2P, intra-node only).
    torch: ``tilescale.symm.peer_tensor``. Reads through it are not ordered with the peer's writes:
    synchronise with signals first. A rank on another node (``TILESCALE_NODE_SIZE`` included) has no
    peer pointer: the kernel stops with "T.remote: PE <me> has no load/store path to PE <pe> ... move the
    data with put/get". Test :func:`peer_reachable` first and move the data with ``get_*``/``put_*`` there."""
    _global_buffer("remote", buf)
    p = _pe("remote", "pe", pe)
    ptr = T.call_extern("handle", "tilescale::peer_ptr", T.access_ptr(buf, "rw"), p)
    return T.make_tensor(ptr, tuple(buf.shape), str(buf.dtype))


def peer_reachable(buf, *, pe) -> tirx.PrimExpr:
    """True (a bool expression) when rank `pe`'s copy of symmetric `buf` has a load/store path from this
    rank, i.e. when ``T.remote(buf, pe=pe)`` works: a rank of this node (``TILESCALE_NODE_SIZE`` sets the
    nodes), NVLink / P2P mapped. Pick the path per peer at run time::

        if T.peer_reachable(P, pe=s):
            ... T.remote(P, pe=s) ...                 # direct loads over NVLink
        else:
            T.get_block(P[rows, cols], staging, src_pe=s)   # NVSHMEM get, then local loads"""
    _global_buffer("peer_reachable", buf)
    return T.call_extern("bool", "tilescale::peer_reachable", T.access_ptr(buf, "r"), _pe("peer_reachable", "pe", pe))
