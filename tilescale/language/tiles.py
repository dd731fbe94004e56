"""Whole tiles between global and shared memory: bulk copies that complete on an mbarrier (:func:`load_async`),
bulk and plain-store copies out of shared memory (:func:`store_async`, :func:`store_tile`), and the mbarriers
themselves. Re-exported by ``tilescale.language``; count stores once written with ``T.release_stores``
(:mod:`.distributed`)."""
from __future__ import annotations

import tilelang.language as T
from tvm import tirx

from .operands import _as_int, _err, _pair, _Tile

__all__ = ["load_async", "store_async", "store_tile", "init_barrier", "wait_barrier", "arrive_barrier"]


def _tile_copy(op: str, src, dst, *, into: str) -> tuple:
    """:func:`_pair` for a copy between a global tile and a shared one (`into`: the destination's memory), both
    checked: (src, dst, rows, row bytes, src pitch, dst pitch)."""
    s, d, rows, row_bytes, src_ld, dst_ld = _pair(op, src, dst, None, remote="none")
    shared, glob = (d, s) if into == "shared" else (s, d)
    if glob.buffer.scope() != "global" or not shared.buffer.scope().startswith("shared"):
        want = "a global src and a shared dst" if into == "shared" else "a shared src and a global dst"
        raise _err(op, f"src, dst: got buffers in {s.buffer.scope()} and {d.buffer.scope()}, expected {want}")
    return s, d, rows, row_bytes, src_ld, dst_ld


def _rows_of_16(op: str, copies: str, row_bytes, src_ld, dst_ld) -> None:
    """The row size and both pitches of a tile copy made by `copies` (16-byte units): multiples of 16 bytes."""
    for what, v in (("row size", row_bytes), ("src row pitch", src_ld), ("dst row pitch", dst_ld)):
        n = _as_int(v)
        if n is not None and n % 16:
            raise _err(op, f"{what}: got {n} bytes, expected a multiple of 16 ({copies})")


def load_async(src, dst, *, barrier):
    """Start copying the global tile `src` into the shared buffer `dst` without waiting for it: bulk copies
    (``cp.async.bulk``), one per row, that complete on the mbarrier `barrier` (:func:`init_barrier`). Wait for
    the data with :func:`wait_barrier`; `dst` may have longer rows than `src` (padding against bank conflicts:
    ``dst[0:rows, 0:cols]``). Every lane of one warp calls it (the lanes share the rows), once per phase of
    `barrier`. A proxy fence first orders the calling thread's earlier acquires (``T.ld`` / ``T.wait_until``
    of a flag that says `src` is written) before the copies read.

    Rows, their sizes and both row pitches must be multiples of 16 bytes. torch: ``dst[:, :cols].copy_(src)``,
    asynchronously."""
    s, d, rows, row_bytes, src_ld, dst_ld = _tile_copy("load_async", src, dst, into="shared")
    _rows_of_16("load_async", "bulk copies", row_bytes, src_ld, dst_ld)
    # `dst` and the barrier go by address (T.address_of): the copy writes them when it lands, which
    # T.wait_barrier orders; declared as a write where it is started, inside a T.Pipelined loop, `dst` would
    # make tilelang synchronise the threads on every iteration
    T.evaluate(T.call_extern("handle", "tilescale::load_rows_async", s.ptr("r"), T.address_of(d.start), rows,
                             row_bytes, src_ld, dst_ld, _barrier("load_async", barrier)))


def store_async(src, dst, *, wait="read"):
    """Start copying the shared tile `src` into the global tile `dst` (local, or a peer's through its mapping) by
    bulk copies (``cp.async.bulk``, one per row; one copy where both sides are contiguous), and return once they
    have read `src` (it may be written again): their writes complete later. Count them once written with
    :func:`release_stores` by the same warp (a bulk group of its lanes, as a TMA store's). ``wait="written"``:
    return once they are written (nothing left in flight; e.g. the last stores of a block that counts nothing).
    Every lane of one warp calls it; the threads that wrote `src` fence (``T.fence_proxy_async()``) before it
    (tilelang synchronises them here: the call reads `src`).

    Rows, their sizes and both row pitches must be multiples of 16 bytes. torch: ``dst.copy_(src)``, its
    completion awaited by :func:`release_stores`."""
    s, d, rows, row_bytes, src_ld, dst_ld = _tile_copy("store_async", src, dst, into="global")
    if wait not in ("read", "written"):
        raise _err("store_async", f"wait: got {wait!r}, expected 'read' or 'written'")
    _rows_of_16("store_async", "bulk copies", row_bytes, src_ld, dst_ld)
    T.evaluate(T.call_extern("handle", "tilescale::store_rows_async", s.ptr("r"), d.ptr("w"), rows, row_bytes,
                             src_ld, dst_ld, int(wait == "written")))


def store_tile(src, dst, *, threads):
    """Copy the shared tile `src` into the global tile `dst` (local, or a peer's through its mapping) by plain
    16-byte stores shared among the threads ``threads = (first, count)`` of the block (whole warps: first and count
    multiples of 32), every one of which calls it; they then meet at a named barrier (the last, 15: tilelang
    numbers its own from 3 up). Afterwards `src` may be written again and any of them may count the stores with
    :func:`release_stores` (its release covers the whole group's stores: the barrier orders them before it).
    Unlike :func:`store_async` it issues no bulk copy: in GEMM+RS's push kernel, one bulk store of the tile cost
    the GEMM beside it 4-6% more than these stores by three otherwise idle warps. The threads
    that wrote `src` synchronise with the group first (an mbarrier, or tilelang's syncs).

    Rows, their sizes and both row pitches must be multiples of 16 bytes. torch: ``dst.copy_(src)``, its
    completion awaited by :func:`release_stores`."""
    s, d, rows, row_bytes, src_ld, dst_ld = _tile_copy("store_tile", src, dst, into="global")
    ok = (isinstance(threads, tuple) and len(threads) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in threads))
    if not ok or threads[0] < 0 or threads[0] % 32 or threads[1] < 32 or threads[1] % 32 or sum(threads) > 1024:
        raise _err("store_tile", f"threads: got {threads!r}, expected (first, count): whole warps of the block "
                   "(ints, multiples of 32, count >= 32, first + count <= 1024)")
    _rows_of_16("store_tile", "16-byte stores", row_bytes, src_ld, dst_ld)
    T.evaluate(T.call_extern("handle", "tilescale::store_tile", s.ptr("r"), d.ptr("w"), rows, row_bytes, src_ld,
                             dst_ld, threads[0], threads[1]))


def _barrier(op: str, bar):
    """The pointer to the mbarrier `bar`: a uint64 buffer in shared memory (its first word) or one element."""
    t = _Tile(op, "barrier", bar[0] if isinstance(bar, tirx.Buffer) else bar, None, need_global=False)
    if t.dtype != "uint64" or t.buffer.scope() != "shared" or _as_int(t.numel) != 1:
        raise _err(op, f"barrier: got '{t.buffer.name}' ({t.dtype} in {t.buffer.scope()}), expected one uint64 of "
                   "static shared memory made an mbarrier by T.init_barrier: T.alloc_shared((1,), \"uint64\", "
                   "scope=\"shared\") (dynamic shared memory may be reused for other buffers while it is live)")
    return T.address_of(t.start)


def init_barrier(barrier, arrivals=1):
    """Make `barrier`, one uint64 of static shared memory (``T.alloc_shared((1,), "uint64", scope="shared")``),
    an mbarrier whose phases complete after `arrivals` arrivals and the bytes they announce
    (:func:`load_async`). Every thread of the block calls it, outside any branch, before the first use: thread
    0 initialises, the block synchronises. (tilelang 0.1.15's ``T.alloc_barrier`` cannot be used after a
    ``T.Pipelined`` loop: its lowering versions every barrier of the block with the pipeline's.)"""
    if isinstance(arrivals, bool) or not isinstance(arrivals, int) or arrivals < 1:
        raise _err("init_barrier", f"arrivals: got {arrivals!r}, expected an int >= 1")
    T.evaluate(T.call_extern("handle", "tilescale::init_barrier", _barrier("init_barrier", barrier), arrivals))


def wait_barrier(barrier, phase=0):
    """Wait until phase `phase` (0 first, then 1, 0, ...) of the mbarrier `barrier` (:func:`init_barrier`) is
    complete: after :func:`load_async`, the rows are in shared memory. Any thread may wait. It waits without a
    timeout: start the copy of that phase first (a wait on a flag that may never come belongs before it, in
    ``T.wait_until``, which can give up: ``TILESCALE_WAIT_TIMEOUT_S``)."""
    if isinstance(phase, int) and not isinstance(phase, bool):
        ok = phase in (0, 1)
    else:
        ok = isinstance(phase, tirx.PrimExpr) and str(phase.dtype).startswith(("int", "uint"))
    if not ok:
        raise _err("wait_barrier", f"phase: got {phase!r}, expected 0 or 1 (or an integer expression: the parity)")
    T.evaluate(T.call_extern("handle", "tilescale::wait_barrier", _barrier("wait_barrier", barrier), phase))


def arrive_barrier(barrier):
    """One arrival on the mbarrier `barrier` (:func:`init_barrier`), announcing no bytes: the calling thread's
    earlier writes and reads of shared memory happen before a wait on that phase returns (e.g. "this buffer is
    free", where another phase of the same barrier says "loaded" by :func:`load_async`). Thread-level: call it from
    as many threads as the phase expects arrivals (usually one: ``if T.get_thread_binding() == t:``). (tilelang's
    ``T.mbarrier_arrive`` is the same for the barriers of ``T.alloc_barrier``, which :func:`load_async` does not
    take.)"""
    T.evaluate(T.call_extern("handle", "tilescale::arrive_barrier", _barrier("arrive_barrier", barrier)))
