"""CUDA graphs of the collectives on N ranks (tilescale/ops/capture.py): each op warmed up eagerly, a step of
several calls captured with torch.cuda.graph, then replayed many times, each replay with new random inputs
copied into the static inputs and the static outputs poisoned (NaN) first, every result checked against a
reference computed from every rank's inputs (no communication: rank r's input of replay i is
``base[r] * a_i + b_i + c_i * r``, the bases drawn once from per-rank seeds, a_i, b_i, c_i from a host RNG
seeded by i, the same on every rank), with eager calls of the same ops interleaved. Graph 1 (AllGather x3,
with and without out=, AllReduce, ReduceScatter) is replayed GRAPHS_REPLAYS times (default 1000), graph 2
(AllToAll, Broadcast, Reduce, AllReduce x2) GRAPHS_REPLAYS2 times (default 200); then captured
tilescale.distributed calls, served by tilescale. Between them, a captured AllGather of 1 MiB per rank is replayed
GRAPHS_HOST_REPLAYS times (default 100) with no Python call into tilescale (sys.setprofile), which the same
count over as many eager calls sees (replay_host_work). Prints '[rank R] OK: graphs ...'. Run by
tests/test_graphs_gpu.py.

    GPUS=2 bash launch.sh tests/gpu/graphs_main.py
"""
import os
import random
import time

import tilescale
from tilescale import testing

F32_TOL = 1e-4     # sums in another order than the reference's (fp32)
# torch.cuda.graph's default; "thread_local" if another thread's CUDA calls (NVSHMEM's proxy) break a capture
MODE = os.environ.get("GRAPHS_CAPTURE_ERROR_MODE", "global")


class Inputs:
    """The inputs of one tensor argument on every rank: ``bases[r]`` (drawn once from rank r's seed) and the
    reference tensors derived from them."""

    def __init__(self, n: int, seed: int, W: int, dev):
        import torch

        self.bases = torch.stack([torch.randn(n, generator=torch.Generator().manual_seed(seed * 1000 + r))
                                  for r in range(W)]).to(dev)
        self.sum = self.bases.sum(0)
        self.ridx = torch.arange(W, dtype=torch.float32, device=dev).view(W, 1)
        self.W = W

    def mine(self, rank, a, b, c, out):
        """Rank `rank`'s input of a replay, written into `out` (two kernels, no host sync)."""
        import torch

        torch.mul(self.bases[rank], a, out=out)
        out.add_(b + c * rank)

    def gathered(self, a, b, c):
        return self.bases * a + (self.ridx * c + b)

    def summed(self, a, b, c):
        W = self.W
        return self.sum * a + (W * b + c * W * (W - 1) / 2)


def coeffs(i: int):
    rng = random.Random(i)
    return rng.uniform(0.5, 2.0), rng.uniform(-1, 1), rng.uniform(-1, 1)


class Worst:
    """The largest error seen, kept on the GPU (NaN wins: a poisoned output that was not written)."""

    def __init__(self, dev):
        import torch

        self.v = torch.zeros((), device=dev)
        self.n = 0

    def add(self, got, want):
        import torch

        torch.maximum(self.v, (got.float().reshape(-1) - want.reshape(-1)).abs().max(), out=self.v)
        self.n += 1

    def check(self, what, rank, tol):
        v = float(self.v)
        if not v <= tol:   # NaN too
            raise AssertionError(f"[rank {rank}] {what}: largest error {v} over {self.n} checked results "
                                 f"(tolerance {tol})")


def graph1(info, dev, replays):
    """AllGather x3 (out=None twice, out= once), AllReduce, ReduceScatter in one graph."""
    import torch

    rank, W = info.rank, info.world_size
    ops = tilescale.ops
    n_ag = (1 << 20) // 4 // W                      # a gathered 1 MiB (fp32)
    n_ar, n_rs = 4096, 2048 * W
    ag = ops.AllGather((n_ag,), torch.float32)
    ar = ops.AllReduce((n_ar,), torch.float32)
    rs = ops.ReduceScatter((n_rs,), torch.float32)
    ins = {k: Inputs(n, s, W, dev) for k, n, s in (("ag1", n_ag, 1), ("ag2", n_ag, 2), ("ag3", n_ag, 3),
                                                   ("ar", n_ar, 4), ("rs", n_rs, 5))}
    x = {k: torch.empty(v.bases.shape[1], device=dev) for k, v in ins.items()}   # the static inputs
    ag_out2 = torch.empty(W * n_ag, device=dev)
    ar_out, rs_out = torch.empty(n_ar, device=dev), torch.empty(n_rs // W, device=dev)

    def fill(i):
        a, b, c = coeffs(i)
        for k, v in ins.items():
            v.mine(rank, a, b, c, x[k])
        return a, b, c

    def step():
        # before any capture ag(x) returns its slot, which call e + 2 (o3's) overwrites: keep a copy
        o1 = ag(x["ag1"]).clone()
        ar(x["ar"], out=ar_out)
        ag(x["ag2"], out=ag_out2)
        rs(x["rs"], out=rs_out)
        o3 = ag(x["ag3"])
        return o1, o3

    def check_all(worst, coeff, o1, o3):
        a, b, c = coeff
        worst.add(o1, ins["ag1"].gathered(a, b, c))
        worst.add(ag_out2, ins["ag2"].gathered(a, b, c))
        worst.add(o3, ins["ag3"].gathered(a, b, c))
        worst.add(ar_out, ins["ar"].summed(a, b, c))
        worst.add(rs_out, ins["rs"].summed(a, b, c).view(W, -1)[rank])

    worst = Worst(dev)
    for i in range(3):                         # warm-up, eager (also builds everything)
        coeff = fill(10_000_000 + i)
        o1, o3 = step()
        check_all(worst, coeff, o1, o3)
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=MODE):
        o1, o3 = step()
    assert ag.captured and o1.data_ptr() not in (b.data_ptr() for b in ag.buffers)
    eager = 0
    t0 = time.time()
    for i in range(replays):
        coeff = fill(i)
        for t in (o1, o3, ag_out2, ar_out, rs_out):
            t.fill_(float("nan"))
        graph.replay()
        check_all(worst, coeff, o1, o3)
        if i % 50 == 25:                        # eager calls between replays (the device counts both)
            coeff = fill(5_000_000 + i)
            e1, e3 = step()
            check_all(worst, coeff, e1, e3)
            eager += 1
    torch.cuda.synchronize()
    worst.check(f"graph 1 ({replays} replays, {eager} eager steps)", rank, F32_TOL)
    expected = 3 * (3 + replays + eager)       # AllGather calls counted on the device (3 per step)
    got = ag.counters.tolist()
    if set(got) != {expected}:
        raise AssertionError(f"[rank {rank}] AllGather's call counters {sorted(set(got))}, expected {expected}")
    testing.say(f"[rank {rank}] OK: graphs: graph 1 (AllGather x3 with and without out=, AllReduce, ReduceScatter) "
                f"replayed {replays} times, {eager} eager steps between, {worst.n} results checked "
                f"({time.time() - t0:.0f} s)")
    for op in (ag, ar, rs):
        op.close()


def graph2(info, dev, replays):
    """AllToAll, Broadcast, Reduce, AllReduce x2 (two calls of one op) in one graph."""
    import torch

    rank, W = info.rank, info.world_size
    ops = tilescale.ops
    rows, cols = 8 * W, 64
    a2a = ops.AllToAll((rows, cols), torch.float32)
    bc = ops.Broadcast((3000,), torch.float32, W - 1)       # rooted at the last rank, in place
    red = ops.Reduce((5000,), torch.float32, 0)
    ar = ops.AllReduce((1001,), torch.float32)              # padded: staged through scratch
    ins = {k: Inputs(n, s, W, dev) for k, n, s in (("a2a", rows * cols, 11), ("bc", 3000, 12), ("red", 5000, 13),
                                                   ("ar1", 1001, 14), ("ar2", 1001, 15))}
    x = {k: torch.empty(v.bases.shape[1], device=dev) for k, v in ins.items()}
    bc_buf, red_out = torch.empty(3000, device=dev), torch.empty(5000, device=dev)
    a2a_out = torch.empty(rows, cols, device=dev)
    ar1, ar2 = torch.empty(1001, device=dev), torch.empty(1001, device=dev)

    def fill(i):
        a, b, c = coeffs(i)
        for k, v in ins.items():
            v.mine(rank, a, b, c, x[k])
        bc_buf.copy_(x["bc"])
        return a, b, c

    def step():
        a2a(x["a2a"].view(rows, cols), out=a2a_out)
        bc(bc_buf)                                           # in place: the root's tensor everywhere
        red(x["red"], out=red_out)
        ar(x["ar1"], out=ar1)
        ar(x["ar2"], out=ar2)

    def check_all(worst, coeff):
        a, b, c = coeff
        every = ins["a2a"].gathered(a, b, c).view(W, W, rows // W, cols)   # [sender, block for receiver]
        worst.add(a2a_out, every[:, rank].reshape(rows, cols))
        worst.add(bc_buf, ins["bc"].gathered(a, b, c)[W - 1])
        if rank == 0:
            worst.add(red_out, ins["red"].summed(a, b, c))
        worst.add(ar1, ins["ar1"].summed(a, b, c))
        worst.add(ar2, ins["ar2"].summed(a, b, c))

    worst = Worst(dev)
    for i in range(3):
        coeff = fill(20_000_000 + i)
        step()
        check_all(worst, coeff)
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=MODE):
        step()
    eager = 0
    t0 = time.time()
    for i in range(replays):
        coeff = fill(30_000_000 + i)
        for t in (a2a_out, red_out, ar1, ar2):
            t.fill_(float("nan"))
        graph.replay()
        check_all(worst, coeff)
        if i % 20 == 10:
            coeff = fill(40_000_000 + i)
            step()
            check_all(worst, coeff)
            eager += 1
    torch.cuda.synchronize()
    worst.check(f"graph 2 ({replays} replays, {eager} eager steps)", rank, F32_TOL)
    testing.say(f"[rank {rank}] OK: graphs: graph 2 (AllToAll, Broadcast, Reduce, AllReduce x2, staged and padded "
                f"inputs) replayed {replays} times, {eager} eager steps between, {worst.n} results checked "
                f"({time.time() - t0:.0f} s)")
    for op in (a2a, bc, red, ar):
        op.close()


def replay_host_work(info, dev, n):
    """A captured AllGather of 1 MiB per rank replays with no host work in tilescale: during `n` replays, each with
    new inputs and a poisoned output and every result checked, no Python function of tilescale's modules is
    entered on this thread (sys.setprofile: testing.PythonCalls); the same count over `n` eager calls of the op,
    made the same way, sees at least one entry per call (so the check can fail)."""
    import torch

    rank, W = info.rank, info.world_size
    n_ag = (1 << 20) // 4                           # 1 MiB per rank (fp32)
    ag = tilescale.ops.AllGather((n_ag,), torch.float32)
    ins = Inputs(n_ag, 31, W, dev)
    x, out = torch.empty(n_ag, device=dev), torch.empty(W * n_ag, device=dev)

    def fill(i):
        a, b, c = coeffs(i)
        ins.mine(rank, a, b, c, x)
        out.fill_(float("nan"))
        return a, b, c

    worst = Worst(dev)
    for i in range(3):                              # eager warm-up
        coeff = fill(70_000_000 + i)
        ag(x, out=out)
        worst.add(out, ins.gathered(*coeff))
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=MODE):
        ag(x, out=out)

    def counted(call, seed):
        with testing.PythonCalls() as calls:
            for i in range(n):
                coeff = fill(seed + i)
                call()
                worst.add(out, ins.gathered(*coeff))
        return calls

    replayed = counted(graph.replay, 80_000_000)
    eager = counted(lambda: ag(x, out=out), 90_000_000)
    torch.cuda.synchronize()
    worst.check(f"captured AllGather 1 MiB ({n} replays, {n} eager calls)", rank, F32_TOL)
    if replayed.count:
        raise AssertionError(f"[rank {rank}] {replayed.count} Python calls into tilescale during {n} replays of a "
                             f"captured AllGather (expected none): {replayed.top()}")
    if eager.count < n:
        raise AssertionError(f"[rank {rank}] the count saw {eager.count} Python calls into tilescale during {n} eager "
                             f"calls of AllGather (expected at least one per call): it cannot see a replay's either")
    got, expected = ag.counters.tolist(), 3 + 2 * n     # the device counted every call, replays included
    if set(got) != {expected}:
        raise AssertionError(f"[rank {rank}] AllGather's call counters {sorted(set(got))}, expected {expected}")
    testing.say(f"[rank {rank}] OK: graphs: a captured AllGather of 1 MiB per rank replayed {n} times with no Python "
                f"call into tilescale ({eager.count} in {n} eager calls: {eager.top(4)}), {worst.n} results checked")
    del graph
    ag.close()


def distributed_calls(info, dev, replays):
    """torch.distributed calls through tilescale.distributed (every built-in plan preferred), captured: served
    by tilescale's kernels, not NCCL (which the shared-GPU mode does not have), and correct on replay."""
    import torch

    import tilescale.distributed as tdist

    rank, W = info.rank, info.world_size
    tdist._enable({"prefer": "tilescale"}, info.shared_gpu)
    n = 2048 * W
    ins = {k: Inputs(nn, s, W, dev) for k, nn, s in (("ar", n, 21), ("ag", n // W, 22), ("rs", n, 23))}
    t_ar, t_ag, t_rs = (torch.empty(v.bases.shape[1], device=dev) for v in ins.values())
    ag_out, rs_out = torch.empty(n, device=dev), torch.empty(n // W, device=dev)

    def fill(i):
        a, b, c = coeffs(i)
        for v, t in zip(ins.values(), (t_ar, t_ag, t_rs), strict=True):
            v.mine(rank, a, b, c, t)
        return a, b, c

    def step():
        tdist.all_reduce(t_ar)
        tdist.all_gather_into_tensor(ag_out, t_ag)
        tdist.reduce_scatter_tensor(rs_out, t_rs)

    worst = Worst(dev)
    for i in range(2):
        a, b, c = fill(50_000_000 + i)
        step()
        worst.add(t_ar, ins["ar"].summed(a, b, c))
    torch.cuda.synchronize()
    tilescale.barrier()
    before = dict(tdist.stats())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=MODE):
        step()
    after = tdist.stats()
    for i in range(replays):
        a, b, c = fill(60_000_000 + i)
        ag_out.fill_(float("nan"))
        rs_out.fill_(float("nan"))
        graph.replay()
        worst.add(t_ar, ins["ar"].summed(a, b, c))
        worst.add(ag_out, ins["ag"].gathered(a, b, c))
        worst.add(rs_out, ins["rs"].summed(a, b, c).view(W, -1)[rank])
    torch.cuda.synchronize()
    worst.check(f"tilescale.distributed captured ({replays} replays)", rank, F32_TOL)
    testing.say(f"[rank {rank}] OK: graphs: tilescale.distributed calls captured and replayed {replays} times, served "
                f"by tilescale (stats during capture: {_diff(before, after)})")


def _diff(before, after):
    out = {}
    for coll, served in after.items():
        for who, k in served.items():
            d = k - before.get(coll, {}).get(who, 0)
            if d:
                out[f"{coll}:{who}"] = d
    if any(k.endswith(":nccl") for k in out):
        raise AssertionError(f"captured calls went to NCCL: {out}")
    return out


def run(info):
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    r1 = int(os.environ.get("GRAPHS_REPLAYS", "1000"))
    r2 = int(os.environ.get("GRAPHS_REPLAYS2", "200"))
    t0 = time.time()
    graph1(info, dev, r1)
    graph2(info, dev, r2)
    replay_host_work(info, dev, int(os.environ.get("GRAPHS_HOST_REPLAYS", "100")))
    distributed_calls(info, dev, 50)
    testing.say(f"[rank {info.rank}] OK: graphs on {info.world_size} ranks ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
