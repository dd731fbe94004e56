"""The caches behind tilescale.ops' torch-like functions (evicted ops are closed, finalize forgets them)
and the refusal of CUDA graph capture by the fused ops (CPU tier: fake ops, a faked capture state)."""
import pytest
import torch

from tilescale.ops import capture, op_cache


class FakeOp:
    def __init__(self, *key):
        self.key, self.closed = key, 0

    def close(self):
        self.closed += 1


def test_evicted_ops_are_closed_in_lru_order():
    built = []
    cache = op_cache.OpCache(lambda *k: built.append(FakeOp(*k)) or built[-1], maxsize=2)
    a, b = cache(1, "bf16"), cache(2, "bf16")
    assert cache(1, "bf16") is a                      # a hit: a becomes the most recent
    c = cache(3, "bf16")                              # evicts b, the least recently used
    assert (a.closed, b.closed, c.closed) == (0, 1, 0)
    assert len(cache) == 2 and len(built) == 3
    assert cache(2, "bf16") is not b                  # rebuilt, and a is evicted now
    assert a.closed == 1 and b.closed == 1


def test_ops_whose_buffers_callers_may_hold_are_dropped_not_closed():
    cache = op_cache.cached(1, close_evicted=False)(FakeOp)
    first = cache("x")
    cache("y")
    assert first.closed == 0 and len(cache) == 1


def test_clear_all_forgets_every_cache_without_closing():
    cache = op_cache.cached(4)(FakeOp)
    op = cache("z")
    op_cache.clear_all()
    assert len(cache) == 0 and op.closed == 0
    assert cache("z") is not op


def test_collective_functions_use_closing_caches():
    import importlib

    for mod, names in (("allreduce", ["_cached"]), ("reduce_scatter", ["_cached"]),
                       ("broadcast_from_root", ["_cached"]), ("all_to_all", ["_cached", "_cached_v"])):
        m = importlib.import_module(f"tilescale.ops.{mod}")
        for n in names:
            c = getattr(m, n)
            assert isinstance(c, op_cache.OpCache) and c.close_evicted, f"{mod}.{n}"
    ag = importlib.import_module("tilescale.ops.allgather")
    assert isinstance(ag._cached, op_cache.OpCache) and not ag._cached.close_evicted


def test_graph_capture_is_refused_with_the_op_name(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"AGGemm: called during CUDA graph capture"):
        capture.refuse_graph_capture("AGGemm")
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)
    capture.refuse_graph_capture("AGGemm")     # not capturing: nothing raised


def test_a_group_given_as_a_list_of_ranks_is_keyed_as_a_tuple():
    """ag_gemm(..., group=[0, 2]) and the other functions key their op caches by the group: a list of ranks is keyed
    (and passed to the op) as a tuple, so that a second call finds the first call's op."""
    built = []
    cache = op_cache.OpCache(lambda n, group: built.append(group) or object(), 4)
    first = cache(8, [0, 2])
    assert cache(8, [0, 2]) is first and cache(8, (0, 2)) is first and built == [(0, 2)]


def test_cached_op_finds_a_larger_op_of_a_group_given_as_a_list(monkeypatch):
    """cached_op reuses the op of a larger bound cached for the same group when the group is a list of ranks too."""
    from types import SimpleNamespace

    from tilescale.ops import gemm

    monkeypatch.setattr(gemm, "gemm_config", lambda *a, **k: "cfg")
    built = []
    cache = op_cache.OpCache(lambda M, *key: built.append(M) or SimpleNamespace(M=M), 4)
    big = op_cache.cached_op(cache, 1024, 256, 256, "bf16", 2, "ag_gemm", [0, 2])
    assert op_cache.cached_op(cache, 200, 256, 256, "bf16", 2, "ag_gemm", [0, 2]) is big and built == [2048]
