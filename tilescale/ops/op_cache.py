"""The caches behind the torch-like functions (``all_reduce``, ``broadcast``...): one op object (and its
symmetric buffers) per shape, built on first use.

Unlike ``functools.lru_cache``, an evicted op is closed (its symmetric buffers freed, collectively: every
rank makes the same calls, so every rank evicts the same op at the same call), so a job that sees many
message sizes does not fill the symmetric heap with buffers nobody can reach. ``tilescale.finalize()``
empties every cache (without closing: finalize frees the whole heap).
"""
import collections
import functools
import threading

from .. import runtime

_CACHES: list = []


class OpCache:
    """An LRU of op objects keyed by the arguments of `build`; ``close_evicted=False`` for ops whose
    buffers a caller may still hold (they are then only dropped, as lru_cache would)."""

    def __init__(self, build, maxsize: int, close_evicted: bool = True):
        self.build, self.maxsize, self.close_evicted = build, maxsize, close_evicted
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()
        functools.update_wrapper(self, build)
        _CACHES.append(self)

    def __call__(self, *key):
        with self.lock:
            op = self.entries.get(key)
            if op is not None:
                self.entries.move_to_end(key)
                return op
        op = self.build(*key)
        evicted = []
        with self.lock:
            self.entries[key] = op
            while len(self.entries) > self.maxsize:
                evicted.append(self.entries.popitem(last=False)[1])
        if self.close_evicted:
            for old in evicted:
                old.close()
        return op

    def cache_clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)


def cached(maxsize: int, *, close_evicted: bool = True):
    """Decorator: ``@cached(16)`` on a function ``(key...) -> op``."""
    return lambda build: OpCache(build, maxsize, close_evicted)


def clear_all() -> None:
    """Forget every cached op (``tilescale.finalize()``: their buffers are freed with the heap)."""
    for c in _CACHES:
        c.cache_clear()


runtime.at_finalize(clear_all)   # finalize frees the heap the cached ops' buffers live on
