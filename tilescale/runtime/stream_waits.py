"""Bounded stream-memory waits. A stream wait (``cuStreamWaitValue64``: a stream stops until a 64-bit flag holds a
value) has no timeout of its own, and neither a record nor a trap when a peer never sets the flag; so the host
watches it. Every stream wait of tilescale carries a label (op, flag, peer) and a slot here, four 64-bit words of
pinned host memory:

    done       written by the GPU: the number of the last call whose wait ended (a stream write queued right after
               the wait, with no memory barrier: it orders nothing, and costs the stream no SM)
    issued     written by the host: the number of the last call issued (by the shim, ``ts_runtime.cu``'s
               ``watch_wait``, when it queues the wait: one C call for a whole program of stream operations)
    issued_ns  when that call was issued (CLOCK_MONOTONIC: ``time.monotonic_ns``)
    bound_ns   ``TILESCALE_WAIT_TIMEOUT_S`` when the wait's program was built (0: waits forever, and the shim
               queues no write)

A wait is overdue when ``issued > done`` and ``bound_ns`` passed since ``issued_ns``: its latest call was issued
that long ago and has not passed the wait. The runtime's watchdog (:mod:`tilescale.diagnostics`) polls every slot
(:class:`Monitor`) and, for an overdue wait, says which (op, flag, peer, the flag's address and value), publishes
it in the job's store and stops the process: the job-wide abort of a device-side wait that gave up.

A wait issued while its stream captures a CUDA graph is not counted (the shim queues no write into the graph): the
host never sees a replay, so a replay's stream waits are not bounded here (docs/torch.md says what still is).

Slots live in chunks of pinned memory that are never freed: a write still queued on a GPU stream may target any
slot of a program that was dropped. A program's slots are not used again either.
"""
from __future__ import annotations

import ctypes
import threading
import time
import weakref
from dataclasses import dataclass

WORDS = 4                    # done, issued, issued_ns, bound_ns
_CHUNK_SLOTS = 1024          # 32 KiB of pinned memory at a time
_lock = threading.Lock()
_chunks: list = []           # the memory of every chunk (kept alive: see the module docstring)
_room = [0, 0]               # (address, slots) left in the newest chunk
_tables: weakref.WeakSet = weakref.WeakSet()


@dataclass(frozen=True)
class Wait:
    """A watched wait: its label (the `op` that waits, the `flag` it waits for as the op names it, e.g.
    ``ready[2]``, and the `peer` rank that sets it), the flag's address and the value it waits for (>=)."""

    op: str
    flag: str
    peer: int
    addr: int
    value: int

    def text(self) -> str:
        return f"{self.op}'s stream wait for flag {self.flag} (set by rank {self.peer})"


def check_label(label) -> tuple[str, str, int]:
    """`label` as (op, flag, peer): ValueError naming what is wrong."""
    if (not isinstance(label, tuple) or len(label) != 3 or not isinstance(label[0], str) or
            not isinstance(label[1], str) or not isinstance(label[2], int) or isinstance(label[2], bool)):
        raise ValueError(f"stream wait label {label!r}: expected (op, flag, peer), e.g. ('AGGemm', 'ready[2]', 2): "
                         "what the record of a wait that gave up names")
    return label


def _host_words(n: int):
    """(memory, address) of `n` zero 64-bit words the GPU can write: pinned host memory, or plain memory on a
    machine without CUDA (nothing writes it there but the host)."""
    try:
        import torch

        if torch.cuda.is_available():
            t = torch.zeros(n, dtype=torch.int64, pin_memory=True)
            return t, t.data_ptr()
    except ImportError:
        pass
    buf = (ctypes.c_uint64 * n)()
    return buf, ctypes.addressof(buf)


def _slots(n: int) -> int:
    """The address of `n` consecutive new slots."""
    with _lock:
        if _room[1] < n:
            mem, at = _host_words(WORDS * max(n, _CHUNK_SLOTS))
            _chunks.append(mem)
            _room[:] = [at, max(n, _CHUNK_SLOTS)]
        at = _room[0]
        _room[0] += 8 * WORDS * n
        _room[1] -= n
        return at


class Table:
    """The slots of a list of :class:`Wait` (a program's), bounded by `bound_s` seconds (> 0)."""

    def __init__(self, waits: list[Wait], bound_s: float):
        self.waits = list(waits)
        self.base = _slots(len(self.waits))
        self.words = (ctypes.c_uint64 * (WORDS * len(self.waits))).from_address(self.base)
        for i in range(len(self.waits)):
            self.words[WORDS * i + 3] = int(bound_s * 1e9)
        with _lock:     # (the watchdog's thread copies the set meanwhile)
            _tables.add(self)

    def address(self, i: int) -> int:
        """The slot of wait `i` (what the shim takes: ``ts_watch*``)."""
        return self.base + 8 * WORDS * i


def _live() -> list[Table]:
    with _lock:
        return list(_tables)


@dataclass(frozen=True)
class Late:
    """An overdue wait: what the watchdog says of it."""

    wait: Wait
    issued: int        # the number of the call that waits (counted per wait, from 1)
    done: int          # the number of the last call that passed it
    waited_s: float    # since that call was issued


class Monitor:
    """The watchdog's view of every slot. A wait seen overdue is said overdue when the next poll sees it so
    again with the same call: the host's two words (issued, issued_ns) are written by another thread in no order
    that a Python read is bound to see; a second look, a poll later, reads them settled."""

    def __init__(self):
        self._seen: dict[tuple[int, int], int] = {}

    def poll(self, now_ns: int | None = None) -> Late | None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        seen, first = {}, None
        for table in _live():
            w = list(table.words)
            for i in range(len(table.waits)):
                done, issued, at, bound = w[WORDS * i:WORDS * i + 4]
                if not bound or issued <= done or now - at <= bound:
                    continue
                key = (table.base, i)
                seen[key] = issued
                if first is None and self._seen.get(key) == issued:
                    first = Late(table.waits[i], issued, done, (now - at) / 1e9)
        self._seen = seen
        return first

    @staticmethod
    def pending(before_ns: int, now_ns: int | None = None) -> list[Late]:
        """The bounded waits whose latest call, issued before `before_ns`, has not passed them yet (not
        necessarily overdue): when a device-side wait gave up, those it may have waited behind (AG+GEMM's tiles
        wait for chunks that a copy stream pulls once its wait for the peer's flag has ended)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        out = []
        for table in _live():
            w = list(table.words)
            for i in range(len(table.waits)):
                done, issued, at, bound = w[WORDS * i:WORDS * i + 4]
                if bound and issued > done and at <= before_ns:
                    out.append(Late(table.waits[i], issued, done, (now - at) / 1e9))
        return out
