"""Op calls timed and recorded by the runtime shim (``ts_timed_call``, tilescale/csrc/ts_runtime.cu) instead of
Python: the session's side of the protocol (:class:`ShimCalls`) and an op's timed call (:func:`timed_call`)."""
from __future__ import annotations

import ctypes
import threading
import time

TIMED_CHUNK = 4096                 # records a ShimCalls moves per ts_timed_take
_TIMED_CALLS: list = []            # the shim's ts_timed_fn of each timed_call (TimedFn), kept for the process
_lock = threading.Lock()


class ShimCalls:
    """Op calls timed and recorded by the runtime shim (``ts_timed_call``, tilescale/csrc/ts_runtime.cu) instead of
    Python (a Python record costs more than the profiler's 2% of a 1 MiB AllGather call). A session whose
    COLL calls are quick records (``quick_coll``) makes one when the shim has them; the protocol:

    1. the session starts: the shim's buffer emptied, its group 0 (``ts_timed_reset``);
    2. an op calls ``session.timed(op_call, a, b)`` (:attr:`call`; `op_call` from :func:`timed_call`, made once per
       op; `a`, `b`: the two arguments of its C entry point that change per call): the shim reads CLOCK_MONOTONIC,
       calls the op's C entry point with its arguments, reads it again and, when it returned 0, appends the quick
       record (record, group, t0, t1) to its buffer; returns its result;
    3. a group opens or closes: the session tells the shim its innermost group (:meth:`Session.set_top`);
    4. before the session appends a record of its own (``Session.raw`` is a :class:`RawWithShim`), and when it flushes,
       :meth:`drain` moves the shim's records into ``raw``: each keeps its place among the session's records.

    The shim's clock is that of ``time.perf_counter_ns`` when Python's perf_counter is CLOCK_MONOTONIC (Linux); else
    there are no timed calls. One buffer for the process (one session at a time); a mutex in the shim guards it, for
    any number of threads (ctypes releases the GIL around the calls)."""

    __slots__ = ("call", "group", "_take", "_buf", "pending", "lost")

    def __init__(self, shim):
        self.call = shim.ts_timed_call
        self._take = shim.ts_timed_take
        self.group = shim.ts_timed_group   # group(top): the parent of the records made from now on (step 3)
        self.pending = ctypes.c_longlong.in_dll(shim, "ts_timed_pending")   # records waiting in the shim
        self.lost = ctypes.c_longlong.in_dll(shim, "ts_timed_lost")         # records the shim could not store
        self._buf = (ctypes.c_longlong * (4 * TIMED_CHUNK))()
        shim.ts_timed_reset()

    @classmethod
    def of(cls, shim) -> ShimCalls | None:
        """The timed calls of the loaded runtime shim `shim` for a new session, or None: no shim, a shim without them,
        or a perf_counter that is not the shim's clock."""
        if shim is None or getattr(shim, "ts_timed_call", None) is None:
            return None
        if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            return None
        return cls(shim)

    def drain(self, raw: list) -> None:
        """Move the shim's records to the end of `raw`, oldest first (quick records: four ints each)."""
        while self.pending.value:
            n = self._take(self._buf, TIMED_CHUNK)
            list.extend(raw, self._buf[:4 * n])


class RawWithShim(list):
    """``Session.raw`` of a session with the shim's timed calls: a record appended here first takes in the shim's
    records (made before it), so that the records stay in the order they were made (:class:`ShimCalls` step 4)."""

    __slots__ = ("shim",)

    def __init__(self, shim: ShimCalls):
        super().__init__()
        self.shim = shim

    def append(self, record) -> None:
        if self.shim.pending.value:
            self.shim.drain(self)
        list.append(self, record)

    def extend(self, records) -> None:
        if self.shim.pending.value:
            self.shim.drain(self)
        list.extend(self, records)


class TimedFn(ctypes.Structure):
    """The shim's ``ts_timed_fn`` (tilescale/csrc/ts_runtime.cu): an op's C entry point (6 word-sized integer
    arguments), its :func:`call_record`, the arguments that stay the same from call to call and where the two that
    change go."""

    _fields_ = [("fn", ctypes.c_void_p), ("record", ctypes.c_longlong), ("args", ctypes.c_uint64 * 6),
                ("vary", ctypes.c_int * 2)]


def timed_call(entry: int, record: int, args: tuple, vary: tuple) -> int:
    """An op's timed call for the shim (a :class:`TimedFn`: the address of its C entry point, its
    :func:`call_record`, its 6 arguments `args` of which those at the two indices `vary` are given per call), made
    once per op and kept for the process like its record; returns its address, the first argument of
    ``Session.timed``."""
    if len(args) != 6 or len(vary) != 2 or not all(0 <= i < 6 for i in vary) or vary[0] == vary[1]:
        raise ValueError(f"timed_call: args {args!r}, vary {vary!r}: expected 6 arguments and 2 distinct indices")
    fn = TimedFn(entry, record, (ctypes.c_uint64 * 6)(*(int(a) for a in args)), (ctypes.c_int * 2)(*vary))
    with _lock:
        _TIMED_CALLS.append(fn)
    return ctypes.addressof(fn)
