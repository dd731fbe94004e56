"""Bounded waits and job-wide abort: a device-side wait that gave up, or an uncaught error of one rank,
becomes a Python error on that rank and stops every other rank.

With ``TILESCALE_WAIT_TIMEOUT_S`` > 0 (default 100 s) every ``T.wait_until`` and every barrier in a kernel
built then gives up after that long: it writes what it saw into a record in pinned host memory and stops
the kernel (trap). Then:

1. a watchdog thread of that rank sees the record, prints it (rank, block, thread, the kernel line of
   the wait, signal address, expected and observed values) and publishes it in the job's store;
2. the watchdogs of the other ranks see it there and stop their process with a message naming the
   rank that failed, instead of waiting for it forever; they give that rank ``STOP_GRACE_S`` first to
   raise and report its error itself (step 3), so that a launcher which reports the first process to
   exit (torchrun) names the rank that failed, and its traceback is not cut off by the others' exits;
3. on the failing rank, ``tilescale.synchronize()`` (:func:`tilescale.runtime.synchronize`) and
   ``tilescale.barrier()`` raise
   :class:`tilescale.errors.WaitTimeoutError` with the same message; the CUDA context is unusable after
   a trap, so the process should exit.

An uncaught exception on a rank (``sys.excepthook``; ``tilescale.testing.example_main``) is published the
same way (:func:`publish_failure`), so the other ranks stop within a second, naming that rank and its
error, instead of waiting for it: under any launcher, not only torchrun.

Stream-memory waits (a stream stopped until a peer's flag is set: AG+GEMM's copy streams) have no timeout on the
device: the watchdog watches them (:mod:`tilescale.runtime.stream_waits`). One whose call was issued more than the bound
ago and has not passed it is said (rank, op, flag, the peer that sets it, address, value) and published as in step
1; then the watchdog ends its own process at once, since its streams can never go on (nothing traps: a main thread
blocked in a synchronize would wait forever). The other ranks stop as in step 2.
"""
import linecache
import os
import struct
import sys
import threading
import time

from ..compat import default_store
from ..errors import RemoteRankError, WaitTimeoutError
from . import stream_waits

_CMP_NAMES = ("==", "!=", ">", ">=", "<", "<=")
# Set while this rank reports an error of its own (runtime's excepthook): its watchdog then leaves it be.
failing = threading.Event()
_FMT = "<Q8iQQQQ"
# The failure of a runtime generation is published under "tilescale/failed/<generation>" (failure_key):
# "<rank>|<error>" for an error, "<rank>|wait|<record>" for a wait that gave up. Per generation, so that a
# failure that a job caught (then finalize, init_distributed again) does not stop the ranks of its next runtime.
STORE_KEY = "tilescale/failed"
STOP_GRACE_S = 5.0               # a rank told of a wait that gave up elsewhere waits this long before it stops


def read_record(rt) -> dict | None:
    raw = bytes(rt.wait_diag[:struct.calcsize(_FMT)].tolist())
    flag, rank, block, thread, site, cmp, bits, _, _, addr, expected, observed, elapsed = struct.unpack(_FMT, raw)
    if flag not in (1, 2):
        return None
    return dict(rank=rank, block=block, thread=thread, site=site, cmp=cmp, bits=bits, addr=addr, expected=expected,
                observed=observed, elapsed_ns=elapsed, complete=flag == 1)


def describe(rec: dict) -> str:
    from ..language.distributed import CALL_NUMBER_SITE, WAIT_SITES

    if rec["site"] == CALL_NUMBER_SITE:
        return (f"rank {rec['rank']}, block {rec['block']}: T.call_number: block {rec['observed']} of the grid has no "
                f"counter (the counters buffer at 0x{rec['addr']:x} holds {rec['expected']}: one per block of the "
                "kernel is needed). The kernel was stopped")

    if not rec.get("complete", True):   # claimed (flag 2), never finished: the kernel stopped while it was written
        return ("a T.wait_until gave up (TILESCALE_WAIT_TIMEOUT_S) and the kernel was stopped before its record "
                "was complete: which wait, and what it saw, are unknown")
    where = WAIT_SITES.get(rec["site"], f"wait #{rec['site']}")
    path, _, line = where.rpartition(":")     # a kernel's line: its text names the signal (the flag) waited for
    text = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    cmp = _CMP_NAMES[rec["cmp"]] if 0 <= rec["cmp"] < len(_CMP_NAMES) else f"cmp {rec['cmp']}"
    return (f"rank {rec['rank']}, block {rec['block']}, thread {rec['thread']}: T.wait_until at {where} gave up "
            f"after {rec['elapsed_ns'] / 1e9:.1f} s waiting for the {rec['bits']}-bit signal at 0x{rec['addr']:x} "
            f"to become {cmp} {rec['expected']}; it was {rec['observed']}. The kernel was stopped "
            "(TILESCALE_WAIT_TIMEOUT_S); the peer that should set this signal did not: check the protocol, "
            "or a rank that failed earlier" + (f". The wait: {text}" if text else ""))


def describe_late(rank: int, late: stream_waits.Late) -> str:
    """What the watchdog says of a stream wait of rank `rank` that did not end within its bound."""
    w = late.wait
    return (f"rank {rank}: {w.text()} gave up: call {late.issued} of this wait was issued {late.waited_s:.1f} s ago "
            f"and has not passed it (TILESCALE_WAIT_TIMEOUT_S): the 64-bit flag at 0x{w.addr:x} did not become >= "
            f"{w.value}; rank {w.peer} did not set it (it skipped a call, diverged, stopped, or failed earlier). "
            "This rank's GPU streams cannot go on: it stops")


def _behind(rec: dict) -> str:
    """The stream waits of this rank that had not ended since before the device-side wait of `rec` began (the
    cause, maybe, of a wait for data a stream brings once its own wait ends), as a sentence to add."""
    began = time.monotonic_ns() - rec.get("elapsed_ns", 0)
    late = stream_waits.Monitor.pending(began)
    if not late:
        return ""
    said = "; ".join(f"{x.wait.text()}, issued {x.waited_s:.1f} s ago" for x in late[:4])
    return f". Stream waits of this rank that had not ended since before it began: {said}"


def check(rt) -> None:
    """Raise WaitTimeoutError if a wait of this rank gave up."""
    rec = read_record(rt)
    if rec is not None:
        raise WaitTimeoutError(describe(rec))


def failure_key(generation: int) -> str:
    """The store key of the failures of runtime generation `generation` (the same on every rank)."""
    return f"{STORE_KEY}/{generation}"


def publish(store, key: str, rank: int, what: str, *, wait: bool = False) -> None:
    """Publish that `rank` failed (`what`: the error, or with `wait` the record of a wait that gave up) under `key`
    in `store`, unless a failure is there already (the first report stays)."""
    try:
        if store is not None and not store.check([key]):
            store.set(key, f"{rank}|wait|{what}" if wait else f"{rank}|{what}")
    except Exception:  # noqa: BLE001  (store gone: the job is ending anyway)
        pass


def publish_failure(rt, what: str, *, wait: bool = False) -> None:
    """Tell every rank that this one failed (`what`: the error, or with `wait` the record of a wait that gave
    up): the first report of this runtime generation stays in the job's store (STORE_KEY's format)."""
    dog = rt.watchdog
    if dog is not None:
        dog.reported = True
    try:
        store = dog.store if dog is not None else default_store()
    except Exception:  # noqa: BLE001  (no store: nobody to tell)
        return
    publish(store, failure_key(rt.generation), rt.info.rank, what, wait=wait)


def stop_if_failed(store, key: str, me: int) -> None:
    """If another rank than `me` published a failure under `key`, say so and end this process (after
    STOP_GRACE_S for a wait that gave up, which that rank reports itself next; half a second for an error,
    whose traceback it printed before publishing it). Nothing while this rank reports its own error
    (``failing``), or when the store is gone."""
    try:
        if not store.check([key]) or failing.is_set():
            return
        who, msg, wait = parse_failure(store.get(key).decode())
    except Exception:  # noqa: BLE001  (store gone: job is ending)
        return
    if who == me:
        return
    err = RemoteRankError(f"rank {who} failed: {msg}")
    print(f"tilescale: rank {me} stops: {err}", file=sys.stderr, flush=True)
    time.sleep(STOP_GRACE_S if wait else 0.5)
    os._exit(1)


def report_own_failure(rt, error: BaseException) -> None:
    """Publish this rank's uncaught `error` for the other ranks. When a wait of this rank gave up, the error is
    only its consequence (CUDA's "unspecified launch failure" at the next synchronize, before the watchdog's
    next poll): the wait's record is said and published instead, as the watchdog would have."""
    try:
        rec = read_record(rt)
    except Exception:  # noqa: BLE001  (no record to read: report the error itself)
        rec = None
    if rec is None:
        publish_failure(rt, f"{type(error).__name__}: {error}".splitlines()[0][:500])
        return
    msg = describe(rec)
    if rt.watchdog is None or not rt.watchdog.reported:
        print(f"tilescale: rank {rt.info.rank}: {msg}", file=sys.stderr, flush=True)
    publish_failure(rt, msg, wait=True)


def synchronize_within(device, bound_s: float) -> bool:
    """``torch.cuda.synchronize(device)``, waited for at most `bound_s` seconds (0: no bound); False when it had not
    returned by then (it goes on in a daemon thread). Raises its error."""
    import torch

    if bound_s <= 0:
        torch.cuda.synchronize(device)
        return True
    done, errors = threading.Event(), []

    def sync():
        try:
            torch.cuda.synchronize(device)
        except BaseException as e:  # noqa: BLE001  (raised by the caller)
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=sync, name="tilescale-finalize-sync", daemon=True).start()
    if not done.wait(bound_s):
        return False
    if errors:
        raise errors[0]
    return True


def late_ranks(store, key: str, rank: int, world_size: int, bound_s: float, poll_s: float = 0.02) -> list[int]:
    """Say in `store` that `rank` has reached the point named `key`, then wait for every rank to say so, at most
    `bound_s` seconds (0: no bound). Returns the ranks that had not arrived by then (empty when all did):
    a host-side bounded barrier for a step that every rank must join (finalize's collective teardown)."""
    store.set(f"{key}/{rank}", "1")
    arrived = store.add(f"{key}/count", 1)
    deadline = time.monotonic() + bound_s if bound_s > 0 else None
    while arrived < world_size:
        if deadline is not None and time.monotonic() > deadline:
            return [r for r in range(world_size) if not store.check([f"{key}/{r}"])]
        time.sleep(poll_s)
        arrived = store.add(f"{key}/count", 0)
    return []


def parse_failure(value: str) -> tuple[int, str, bool]:
    """(rank, message, whether it is a wait that gave up) of a failure published under STORE_KEY."""
    who, _, rest = value.partition("|")
    wait = rest.startswith("wait|")
    return int(who), rest[len("wait|"):] if wait else rest, wait


class Watchdog(threading.Thread):
    """Polls this rank's record and the job's store; reports and stops as the module docstring says."""

    def __init__(self, rt, interval_s: float = 0.2):
        super().__init__(name="tilescale-watchdog", daemon=True)
        self.rt = rt
        self.interval = interval_s
        self.stop = threading.Event()
        self.reported = False
        self._unwatched_said = False     # _say_unwatched's warning, once
        try:
            self.store = default_store()
        except Exception:  # noqa: BLE001
            self.store = None

    def _say_unwatched(self, me: int) -> None:
        """Once: stream waits the watchdog cannot see (the driver refused the write of their progress, the shim's
        ts_watch_failures) are not bounded; said, not raised (the op's calls go on)."""
        fn = getattr(getattr(self.rt, "shim", None), "ts_watch_failures", None)
        if fn is None or self._unwatched_said or not (n := fn()):
            return
        self._unwatched_said = True
        print(f"tilescale: rank {me}: warning: {n} stream wait(s) of AG+GEMM could not be watched (the CUDA "
              "driver refused cuStreamWriteValue64 into host memory): TILESCALE_WAIT_TIMEOUT_S does not bound them",
              file=sys.stderr, flush=True)

    def run(self) -> None:
        me = self.rt.info.rank
        key = failure_key(self.rt.generation)
        waits = stream_waits.Monitor()
        while not self.stop.wait(self.interval):
            rec = read_record(self.rt)
            if rec is not None and not self.reported:
                self.reported = True
                msg = describe(rec) + _behind(rec)
                print(f"tilescale: rank {me}: {msg}", file=sys.stderr, flush=True)
                publish_failure(self.rt, msg, wait=True)
                continue
            self._say_unwatched(me)
            late = waits.poll() if not self.reported else None
            if late is not None:    # a stream wait that never ends: no trap, no error to raise; say it, stop
                self.reported = True
                msg = describe_late(me, late)
                print(f"tilescale: {msg}", file=sys.stderr, flush=True)
                publish_failure(self.rt, msg, wait=True)
                os._exit(1)
            if self.store is not None and not self.reported:
                stop_if_failed(self.store, key, me)
