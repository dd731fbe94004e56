"""The hierarchical collectives on emulated nodes: AllGatherHierarchical, ReduceScatterHierarchical and the
cross-node AG+GEMM / GEMM+RS (tilescale.ops.gemm_multinode) against torch references on random data, several
dtypes and shapes (empty chunks, padded slices included), outputs poisoned, 4 calls back to back per case, every
rank checked; and the plan selector's built-in choice under the emulation (hierarchical for a 2 MiB gather, flat
for 16 KiB), run through the chosen plan.

    GPUS=4 TILESCALE_NODE_SIZE=2 bash launch.sh tests/gpu/hierarchical_main.py      # tests/test_hierarchical.py

References need no communication: every rank draws every rank's inputs from the same seeds.
"""
import torch

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


def draw(shape, dtype, rank: int, call: int, tag: int):
    g = torch.Generator(device="cuda").manual_seed(1000 * tag + 10 * call + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, device="cuda", generator=g, dtype=dtype)


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


def run(info):
    topo = topology.current()
    if not (topo.emulated and topo.nodes >= 2):
        raise AssertionError(f"[rank {info.rank}] expected emulated nodes (TILESCALE_NODE_SIZE), got {topo}")
    prebuild.on_local_rank0(jobs(info.world_size, topo.node_size, vectors.sm_count()))
    check_allgather(info)
    check_reduce_scatter(info)
    check_gemms(info)
    check_selector(info)
    testing.say(f"[rank {info.rank}] OK: hierarchical collectives on {topo.nodes} emulated nodes of {topo.node_size}")


def build(world_size: int) -> None:
    for fn, args in jobs(world_size, 2, 132):
        fn.build(*args)


if __name__ == "__main__":
    testing.example_main(run, build)
