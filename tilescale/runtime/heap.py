"""The symmetric heap's allocations of a runtime: the registry that symm fills and runtime.finalize empties.

Kept on the runtime object itself (``rt._symm_registry``), so that a new runtime starts with none."""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass


@dataclass
class Allocation:
    base: int
    nbytes: int
    shape: tuple
    dtype: object
    seq: int
    where: str
    live: bool = True


_EPOCHS = itertools.count(1)


class Registry:
    def __init__(self):
        self.by_base: dict[int, Allocation] = {}
        self.bases: list[int] = []
        self.seq = 0
        self.live_bytes = 0
        self.epoch = next(_EPOCHS)   # new on every free: kernels' caches of checked pointers drop then

    def add(self, a: Allocation) -> None:
        self.by_base[a.base] = a
        bisect.insort(self.bases, a.base)
        self.live_bytes += a.nbytes

    def remove(self, a: Allocation) -> None:
        a.live = False
        self.epoch = next(_EPOCHS)
        del self.by_base[a.base]
        self.bases.remove(a.base)
        self.live_bytes -= a.nbytes

    def find(self, ptr: int, nbytes: int = 1) -> Allocation | None:
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i < 0:
            return None
        a = self.by_base[self.bases[i]]
        return a if ptr + nbytes <= a.base + max(a.nbytes, 1) else None


def registry(rt) -> Registry:
    """The allocations of runtime `rt` (made on first use)."""
    reg = getattr(rt, "_symm_registry", None)
    if reg is None:
        reg = rt._symm_registry = Registry()
    return reg


def free_all(rt) -> None:
    """Free every symmetric allocation of `rt`, newest first (finalize: every rank frees the same ones)."""
    reg = registry(rt)
    for base in sorted(reg.by_base, key=lambda b: reg.by_base[b].seq, reverse=True):
        rt.shim.ts_free(base)
        reg.remove(reg.by_base[base])
