"""Simulated worlds for the CPU tests of the torch integration (tests/test_torch_ops_cpu.py,
tests/test_async_tp_cpu.py): a backend of ``tilescale.pytorch.torch_ops`` (put in place of ``torch_ops._BACKEND``)
whose collectives and fused ops are plain torch, in one process. :class:`MirrorWorld`: one rank of W that all hold
the same tensors (deterministic: opcheck, torch.compile); :class:`ThreadWorld`: W ranks as W threads, with real
collectives between them; the fixture ``world`` (:func:`world_fixture`) puts one in place."""
import threading

import pytest
import torch


class MirrorWorld:
    """Rank `rank` of `W` ranks that all hold the same tensors (one process, deterministic): what opcheck
    and torch.compile need. Records which backend calls ran."""

    def __init__(self, W=2, rank=0):
        self.W, self.r, self.calls = W, rank, []
        self.world_names = {None, "world"}      # the group names that are the whole world (tests add theirs)
        self.ag_gemm_ns = []                    # the N (columns of b) of every ag_gemm call

    def world_size(self):
        return self.W

    def group_size(self, group_name):
        raise ValueError(f"group {group_name!r} is not the whole world (a mirror world has no other group)")

    def rank(self):
        return self.r

    def is_world_group(self, group_name):
        return group_name in self.world_names

    def all_gather(self, x):
        self.calls.append("all_gather")
        return torch.cat([x] * self.W)

    def reduce_scatter(self, x, W):
        self.calls.append("reduce_scatter")
        return (x * W).chunk(W)[self.r].contiguous()

    def all_reduce_(self, x):
        self.calls.append("all_reduce")
        x.mul_(self.W)

    def all_to_all_single(self, x, out_splits, in_splits):
        self.calls.append("all_to_all")
        part = x.chunk(self.W)[self.r] if not in_splits else x.split(in_splits)[self.r]
        return torch.cat([part] * self.W)

    def broadcast_(self, x, src):
        self.calls.append("broadcast")

    def ag_gemm(self, a, b, return_gathered):
        self.calls.append("ag_gemm")
        self.ag_gemm_ns.append(b.shape[1])
        assert b.is_contiguous()
        a_full = torch.cat([a] * self.W)
        return a_full @ b, (a_full if return_gathered else None)

    def gemm_rs(self, x, w):
        self.calls.append("gemm_rs")
        assert x.is_contiguous() and w.is_contiguous()
        return ((x @ w) * self.W).chunk(self.W)[self.r].contiguous()


class ThreadWorld:
    """W ranks as W threads of this process; collectives meet in shared slots behind a barrier. Each
    thread's rank: ``world.local.rank``."""

    def __init__(self, W):
        self.W = W
        self.local = threading.local()
        self.slots = [None] * W
        self.barrier = threading.Barrier(W, timeout=60)
        self.calls = []
        self.world_names = {None, "world"}
        self.groups = {}                        # name -> the world ranks of a subgroup (tests add theirs)
        self.ag_gemm_ns = []                    # rank 0's

    def world_size(self):
        return self.W

    def group_size(self, group_name):
        if group_name not in self.groups:
            raise ValueError(f"no group {group_name!r}")
        return len(self.groups[group_name])

    def _members(self, every, group):
        """(this rank's index in `group`, the items of `every` of its ranks; None: the world)."""
        ranks = range(self.W) if group is None else self.groups[group]
        return list(ranks).index(self.local.rank), [every[r] for r in ranks]

    def rank(self):
        return self.local.rank

    def is_world_group(self, group_name):
        return group_name in self.world_names

    def _exchange(self, obj):
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        every = list(self.slots)
        self.barrier.wait()
        return every

    def _log(self, what):
        if self.local.rank == 0:
            self.calls.append(what)

    def all_gather(self, x, group=None):
        self._log("all_gather" if group is None else f"all_gather {group}")
        return torch.cat(self._members(self._exchange(x), group)[1])

    def reduce_scatter(self, x, W, group=None):
        self._log("reduce_scatter" if group is None else f"reduce_scatter {group}")
        i, xs = self._members(self._exchange(x), group)
        return sum(xs).chunk(W)[i].contiguous()

    def all_reduce_(self, x):
        self._log("all_reduce")
        x.copy_(sum(self._exchange(x.clone())))

    def all_to_all_single(self, x, out_splits, in_splits):
        self._log("all_to_all")
        every = self._exchange((x, in_splits))
        parts = [t.split(s)[self.local.rank] if s else t.chunk(self.W)[self.local.rank] for t, s in every]
        return torch.cat(parts)

    def broadcast_(self, x, src):
        self._log("broadcast")
        x.copy_(self._exchange(x.clone())[src])

    def ag_gemm(self, a, b, return_gathered, group=None):
        self._log("ag_gemm" if group is None else f"ag_gemm {group}")
        if self.local.rank == 0:
            self.ag_gemm_ns.append(b.shape[1])
        a_full = torch.cat(self._members(self._exchange(a), group)[1])
        return a_full @ b, (a_full if return_gathered else None)

    def gemm_rs(self, x, w, group=None):
        self._log("gemm_rs" if group is None else f"gemm_rs {group}")
        i, ps = self._members(self._exchange(x @ w), group)
        return sum(ps).chunk(len(ps))[i].contiguous()

    def run(self, fn):
        """fn(rank) on every rank (thread); the results by rank; re-raises the first error."""
        out, errs = [None] * self.W, []

        def body(r):
            self.local.rank = r
            try:
                out[r] = fn(r)
            except BaseException as e:  # noqa: BLE001
                errs.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.W)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errs:
            raise errs[0]
        return out


def randn(*shape, seed=0, dtype=torch.float32):
    """A seeded normal tensor (CPU) of `dtype`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.fixture(name="world")
def world_fixture(monkeypatch):
    """world(w) puts the simulated world `w` in place of torch_ops' backend for the test (and returns it)."""
    from tilescale.pytorch import torch_ops

    def use(w):
        monkeypatch.setattr(torch_ops, "_BACKEND", w)
        torch._dynamo.reset()          # world_size() is a constant of compiled code
        return w

    yield use
    torch._dynamo.reset()
