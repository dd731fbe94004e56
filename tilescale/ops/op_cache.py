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


def _hashable(value):
    """`value` as op caches key it: a list (a group given as a list of ranks) as a tuple."""
    return tuple(value) if isinstance(value, list) else value


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
            try:
                op = self.entries.get(key)
            except TypeError:   # a list among the arguments: keyed (and built) as a tuple
                key = tuple(map(_hashable, key))
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


def row_bound(rows: int) -> int:
    """The bound of rows per rank of the cached fused op that runs `rows` rows per rank: `rows` rounded up to a
    power of two, at least tilescale.ops.gemm.ROW_TILE."""
    from .gemm import ROW_TILE

    return max(ROW_TILE, 1 << max(rows - 1, 0).bit_length())


def cached_op(cache, rows: int, N: int, K: int, dtype, world_size: int, op: str, group=None):
    """The op of `cache` (an op cache keyed ``(M, N, K, dtype, world size, config, group)``, M the bound of gathered
    rows, the world size that of `group`) that ``tilescale.ops.ag_gemm`` / ``gemm_rs`` run `rows` rows per rank with:
    the config the tuning table gives the rows' bound (:func:`row_bound`), on the largest op cached with it when that
    covers `rows` (its kernels take any rows up to its bound), else a new one for that bound. So a job builds at most
    one op per doubling of its rows, and kernels only for each config the table picks."""
    from .gemm import gemm_config

    bound = row_bound(rows)
    cfg = gemm_config(bound * world_size, N, K, world_size=world_size, op=op)
    key = (N, K, dtype, world_size, cfg, _hashable(group))   # (as OpCache keys it)
    have = max((k[0] // world_size for k in list(cache.entries) if k[1:] == key), default=0)
    return cache(max(have, bound) * world_size, *key)


def clear_all() -> None:
    """Forget every cached op (``tilescale.finalize()``: their buffers are freed with the heap)."""
    for c in _CACHES:
        c.cache_clear()


runtime.at_finalize(clear_all)   # finalize frees the heap the cached ops' buffers live on
