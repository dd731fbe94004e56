"""The hierarchical collectives on emulated nodes: AllGatherHierarchical, ReduceScatterHierarchical and the
cross-node AG+GEMM / GEMM+RS (tilescale.ops.gemm_multinode) against torch references on random data, several
dtypes and shapes (empty chunks, padded slices included), outputs poisoned, 4 calls back to back per case, every
rank checked; the plan selector's built-in choice under the emulation (hierarchical for a 2 MiB gather, flat
for 16 KiB), run through the chosen plan; and CUDA graphs of the hierarchical AllGather (as tests/gpu/graphs_main.py
does for the flat collectives): a step of two ops (4 calls, with and without out=) and the hierarchical plan
captured, replayed HIER_GRAPH_REPLAYS times (default 200) with new inputs copied in and the outputs poisoned before
each replay, eager steps in between, every result checked against every rank's seeded inputs.

    GPUS=4 TILESCALE_NODE_SIZE=2 bash launch.sh tests/gpu/hierarchical_main.py      # tests/test_hierarchical.py

References need no communication: every rank draws every rank's inputs from the same seeds.
"""
import os
import time

import torch

import tilescale
from tilescale import runtime, testing, topology
from tilescale.ops import allgather, gemm_multinode, prebuild, vectors
from tilescale.ops import allgather_hierarchical as agh
from tilescale.ops import reduce_scatter_hierarchical as rsh
from tilescale.plan import selector

CALLS = 4
AG_CASES = [((1, 8), torch.bfloat16), ((3, 40), torch.bfloat16), ((64, 1024), torch.bfloat16),
            ((5, 33), torch.float32), ((7, 9), torch.int32)]
RS_CASES = [(3, 40, torch.bfloat16), (5, 3, torch.bfloat16), (64, 512, torch.bfloat16), (3, 40, torch.float32),
            (16, 24, torch.float16)]      # (rows per rank, cols, dtype)
GEMM = (64, 256, 128)                       # rows per rank, K, N
SELECT = (2 << 20, 16 << 10)                # gathered bytes: hierarchical, flat (the model's crossover: 623 KiB)
GRAPH_OPS = (((64, 1024), torch.bfloat16), ((5, 33), torch.float32))   # two of AG_CASES: kernels prebuilt
# torch.cuda.graph's default; "thread_local" if another thread's CUDA calls (NVSHMEM's proxy) break a capture
MODE = os.environ.get("GRAPHS_CAPTURE_ERROR_MODE", "global")


def draw(shape, dtype, rank: int, call: int, tag: int):
    g = torch.Generator(device="cuda").manual_seed(1000 * tag + 10 * call + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, device="cuda", generator=g, dtype=dtype)


def graph_input(shape, dtype, rank: int, step: int, k: int):
    """Rank `rank`'s input `k` of graph step `step` (replays 0, 1, ...; warm-up and eager steps above), from a seed
    of its own (``draw``'s seeds would collide for step numbers this large)."""
    g = torch.Generator(device="cuda").manual_seed((1 << 40) + (step << 8) + (k << 4) + rank)
    return torch.randn(shape, device="cuda", generator=g).to(dtype)


def poison(shape, dtype):
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, device="cuda", dtype=dtype)


def jobs(W: int, g: int, sms: int) -> list:
    esize = lambda dt: torch.empty((), dtype=dt).element_size()  # noqa: E731
    out = [j for shape, dt in AG_CASES for j in agh.kernels(W * shape[0] * shape[1] * esize(dt), W, g,
                                                               vectors.dtype_name(dt))]
    out += [j for r, c, dt in RS_CASES for j in rsh.kernels(W * r * c * esize(dt), W, g, vectors.dtype_name(dt), sms)]
    rows, K, N = GEMM
    out += agh.kernels(W * rows * K * 2, W, g, "bfloat16") + rsh.kernels(W * rows * N * 2, W, g, "bfloat16", sms)
    out += agh.kernels(SELECT[0], W, g, "bfloat16") + allgather.kernels(SELECT[1], W, "bfloat16")   # the picks
    return prebuild.unique(out)


def check_allgather(info) -> None:
    W, me = info.world_size, info.rank
    for tag, (shape, dt) in enumerate(AG_CASES):
        op = agh.AllGatherHierarchical(shape, dt)
        outs = [poison((W * shape[0], shape[1]), dt) for _ in range(CALLS)]
        for call in range(CALLS):                                     # back to back, no sync in between
            op(draw(shape, dt, me, call, tag), out=outs[call])
        slot = op(draw(shape, dt, me, CALLS, tag))                    # the op's own slot
        torch.cuda.synchronize()
        for call, got in enumerate([*outs, slot]):
            want = torch.cat([draw(shape, dt, r, call, tag) for r in range(W)])
            testing.check_close(f"AllGatherHierarchical {shape} {dt} call {call}", got, want, me)
        op.close()
    testing.say(f"[rank {me}] OK: hierarchical allgather, {len(AG_CASES)} cases x {CALLS + 1} calls")


def rs_reference(rows, cols, dt, W, me, call, tag):
    acc = sum(draw((W * rows, cols), dt, r, call, tag).float() for r in range(W))
    return acc[me * rows:(me + 1) * rows].to(dt)


def check_reduce_scatter(info) -> None:
    W, me = info.world_size, info.rank
    for tag, (rows, cols, dt) in enumerate(RS_CASES, start=50):
        op = rsh.ReduceScatterHierarchical((W * rows, cols), dt)
        outs = [poison((rows, cols), dt) for _ in range(CALLS)]
        for call in range(CALLS):
            op(draw((W * rows, cols), dt, me, call, tag), out=outs[call])
        fresh = op(draw((W * rows, cols), dt, me, CALLS, tag))       # out=None: a new tensor
        torch.cuda.synchronize()
        tol = 1e-5 if dt == torch.float32 else 2e-2
        for call, got in enumerate([*outs, fresh]):
            testing.check_close(f"ReduceScatterHierarchical {(rows, cols)} {dt} call {call}", got,
                                rs_reference(rows, cols, dt, W, me, call, tag), me, atol=tol, rtol=tol)
        op.close()
    testing.say(f"[rank {me}] OK: hierarchical reduce_scatter, {len(RS_CASES)} cases x {CALLS + 1} calls")


def check_gemms(info) -> None:
    W, me = info.world_size, info.rank
    rows, K, N = GEMM
    b = draw((K, N), torch.bfloat16, 0, 0, 90)
    cs = [gemm_multinode.ag_gemm_multinode(draw((rows, K), torch.bfloat16, me, call, 91), b, variant="hierarchical")
          for call in range(CALLS)]
    ys = [gemm_multinode.gemm_rs_multinode(draw((W * rows, K), torch.bfloat16, me, call, 92), b,
                                           variant="hierarchical") for call in range(CALLS)]
    torch.cuda.synchronize()
    for call in range(CALLS):
        a = torch.cat([draw((rows, K), torch.bfloat16, r, call, 91) for r in range(W)])
        testing.check_close(f"ag_gemm_multinode call {call}", cs[call], a @ b, me, atol=1e-2, rtol=1e-2)
        parts = sum((draw((W * rows, K), torch.bfloat16, r, call, 92) @ b).float() for r in range(W))
        want = parts[me * rows:(me + 1) * rows].to(torch.bfloat16)
        testing.check_close(f"gemm_rs_multinode call {call}", ys[call], want, me, atol=5e-2, rtol=2e-2)
    testing.say(f"[rank {me}] OK: hierarchical ag_gemm and gemm_rs, {CALLS} calls each")


def check_selector(info) -> None:
    W, me = info.world_size, info.rank
    g = topology.current().node_size
    names = []
    for tag, nbytes in enumerate(SELECT, start=95):
        req = selector.Request("allgather", nbytes, W, g, {"prefer": "tilescale"}, "bfloat16", "cuda")
        plan = selector.resolve(req, group=runtime.current().ctrl_group).plan    # agreed by every rank
        names.append(plan.name)
        n = nbytes // 2 // W
        out = poison((W * n,), torch.bfloat16)
        for call in range(CALLS):
            plan(out, draw((n,), torch.bfloat16, me, call, tag))
        torch.cuda.synchronize()
        want = torch.cat([draw((n,), torch.bfloat16, r, CALLS - 1, tag) for r in range(W)])
        testing.check_close(f"{plan.name} of {nbytes} bytes", out, want, me)
    if names != ["tilescale.allgather.hierarchical", "tilescale.allgather.push"]:
        raise AssertionError(f"[rank {me}] the selector picked {names} under TILESCALE_NODE_SIZE={g}")
    testing.say(f"[rank {me}] OK: selector picked {names[0]} for {SELECT[0]} bytes, {names[1]} for {SELECT[1]}")


class Mismatches:
    """Elements of each checked result that differ from their reference, counted on the GPU (no host sync between
    replays; a NaN of the poison counts)."""

    def __init__(self, names):
        self.names = list(names)
        self.bad = torch.zeros(len(self.names), dtype=torch.int64, device="cuda")
        self.n = 0

    def add(self, name, got, want):
        self.bad[self.names.index(name)] += (got.reshape(-1) != want.reshape(-1)).sum()
        self.n += 1

    def check(self, what, rank):
        bad = dict(zip(self.names, self.bad.tolist(), strict=True))
        if any(bad.values()):
            raise AssertionError(f"[rank {rank}] {what}: elements differing from the reference, per result, over "
                                 f"{self.n} checked results: {bad}")


def check_graph(info) -> None:
    """CUDA graphs of the hierarchical AllGather: two ops (one called 3 times a step, with and without out=, the
    other once) and the hierarchical plan of the selector, warmed up eagerly, captured, replayed with new inputs
    and poisoned outputs, eager steps between replays; the device call counters count every call."""
    W, me = info.world_size, info.rank
    g = topology.current().node_size
    replays = int(os.environ.get("HIER_GRAPH_REPLAYS", "200"))
    (big_shape, big_dt), (small_shape, small_dt) = GRAPH_OPS
    big = agh.AllGatherHierarchical(big_shape, big_dt)
    small = agh.AllGatherHierarchical(small_shape, small_dt)
    req = selector.Request("allgather", SELECT[0], W, g, {"prefer": "tilescale"}, "bfloat16", "cuda")
    plan = selector.resolve(req, group=runtime.current().ctrl_group).plan       # agreed by every rank
    if plan.name != "tilescale.allgather.hierarchical":
        raise AssertionError(f"[rank {me}] the selector picked {plan.name} for a {SELECT[0]}-byte gather")
    n_p = SELECT[0] // 2 // W
    shapes = {"big1": (big_shape, big_dt), "big2": (big_shape, big_dt), "big3": (big_shape, big_dt),
              "small": (small_shape, small_dt), "plan": ((n_p,), torch.bfloat16)}
    x = {k: torch.empty(shp, device="cuda", dtype=dt) for k, (shp, dt) in shapes.items()}   # the static inputs
    out_big1 = torch.empty(W * big_shape[0], *big_shape[1:], device="cuda", dtype=big_dt)
    out_plan = torch.empty(W * n_p, device="cuda", dtype=torch.bfloat16)

    def fill(step):
        for k, (shp, dt) in shapes.items():
            x[k].copy_(graph_input(shp, dt, me, step, list(shapes).index(k)))

    def run_step():
        big(x["big1"], out=out_big1)       # out=: a copy into a tensor of ours
        # before any capture big(x) returns its slot, valid only until the next call of big: keep a copy
        o_big2 = big(x["big2"]).clone()
        o_big3 = big(x["big3"])            # the last call of big in the step: its slot (eager, before capture) or
        o_small = small(x["small"])        # a copy by the device's parity (captured, and every call after)
        plan(out_plan, x["plan"])
        return {"big1": out_big1, "big2": o_big2, "big3": o_big3, "small": o_small, "plan": out_plan}

    def check_all(seen, step, outs):
        for k, got in outs.items():
            shp, dt = shapes[k]
            want = torch.cat([graph_input(shp, dt, r, step, list(shapes).index(k)) for r in range(W)])
            seen.add(k, got, want)

    seen = Mismatches(["big1", "big2", "big3", "small", "plan"])
    warm = 3
    for i in range(warm):                  # eager, before any capture (also agrees on the call signatures)
        fill(10_000_000 + i)
        check_all(seen, 10_000_000 + i, run_step())
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=MODE):
        outs = run_step()
    slots = {b.data_ptr() for op in (big, small) for b in op.buffers}
    if not (big.captured and small.captured) or {t.data_ptr() for t in outs.values()} & slots:
        raise AssertionError(f"[rank {me}] after capture: captured {big.captured, small.captured}, a result is a slot")
    for prop in ("out", "next_out"):
        try:
            getattr(big, prop)
        except RuntimeError:
            pass
        else:
            raise AssertionError(f"[rank {me}] AllGatherHierarchical.{prop} did not raise after a capture")
    eager, t0 = 0, time.time()
    for i in range(replays):
        fill(i)
        for t in outs.values():
            t.fill_(float("nan"))
        graph.replay()
        check_all(seen, i, outs)
        if i % 20 == 10:                   # eager steps between replays (the device counts both)
            fill(20_000_000 + i)
            check_all(seen, 20_000_000 + i, run_step())
            eager += 1
    torch.cuda.synchronize()
    seen.check(f"hierarchical AllGather graph ({replays} replays, {eager} eager steps)", me)
    steps = warm + replays + eager
    for op, per_step in ((big, 3), (small, 1)):
        got = set(op.counters.tolist())
        if got != {per_step * steps}:
            raise AssertionError(f"[rank {me}] AllGatherHierarchical{op.shape}'s call counters {sorted(got)}, "
                                 f"expected {per_step * steps} in every block")
    testing.say(f"[rank {me}] OK: hierarchical allgather graph replayed {replays} times, {eager} eager steps between, "
                f"{seen.n} results checked ({time.time() - t0:.0f} s)")
    big.close()
    small.close()


def run(info):
    topo = topology.current()
    if not (topo.emulated and topo.nodes >= 2):
        raise AssertionError(f"[rank {info.rank}] expected emulated nodes (TILESCALE_NODE_SIZE), got {topo}")
    prebuild.on_local_rank0(jobs(info.world_size, topo.node_size, vectors.sm_count()))
    check_allgather(info)
    check_reduce_scatter(info)
    check_gemms(info)
    check_selector(info)
    check_graph(info)
    testing.say(f"[rank {info.rank}] OK: hierarchical collectives on {topo.nodes} emulated nodes of {topo.node_size}")


def build(world_size: int) -> None:
    for fn, args in jobs(world_size, 2, 132):
        fn.build(*args)


if __name__ == "__main__":
    testing.example_main(run, build)
