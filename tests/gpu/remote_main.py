"""Every op on its remote path: run with ``TILESCALE_NODE_SIZE=k`` so that ranks of one host form nodes of k
ranks, and a peer of another node is reached only through NVSHMEM's API (put/get/signal/atomics, the
on-stream get of AG+GEMM). Every op runs on random data (small integers: sums and products are exact in
any order) against a recomputed reference, back to back (no host synchronisation between calls), into
poisoned outputs, checked on every rank; then the language primitives' examples (ld/st/atom/put/get/wait
with a remote PE), and ``T.peer_reachable`` against the topology.

    TILESCALE_NODE_SIZE=1 GPUS=2 bash launch.sh tests/gpu/remote_main.py
"""
import importlib
import sys
import zlib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "examples" / "distributed" / "primitives"))

import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402
from tilescale import testing, topology  # noqa: E402
from tilescale.ops import prebuild  # noqa: E402
from tilescale.ops.all_to_all import AllToAll  # noqa: E402
from tilescale.ops.allgather import AllGather  # noqa: E402
from tilescale.ops.allgather_gemm import AGGemm  # noqa: E402
from tilescale.ops.allreduce import AllReduce  # noqa: E402
from tilescale.ops.broadcast_from_root import Broadcast  # noqa: E402
from tilescale.ops.gemm_reduce_scatter import GemmRS  # noqa: E402
from tilescale.ops.reduce_scatter import ReduceScatter  # noqa: E402
from tilescale.ops.reduce_to_root import Reduce  # noqa: E402

# the primitives' examples whose kernels reach peers through put/get/signals/atomics (example_remote_view
# uses T.remote, which has no path to another node by design)
PRIMITIVES = ["example_put_get", "example_signal_wait", "example_ld_st_atomic", "example_sync"]
CALLS = 3          # back to back
F16 = torch.float16
ROWS, COLS, N_ELEMS = 48, 40, 3000                       # the collectives' shapes
G_ROWS, G_N, G_K, G_K_LOCAL = 128, 256, 256, 128         # the GEMMs': rows per rank, N, K (AG+GEMM), K_local (RS)


def rand(tag: str, rank: int, step: int, shape, dtype=F16):
    """The same tensor on every rank for (tag, rank, step): integers in [-2, 2]."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{rank}/{step}".encode()))
    return torch.randint(-2, 3, tuple(shape), generator=g).to(dtype).cuda()


def poison(shape, dtype=F16):
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device="cuda")


@tilescale.jit
def reachable_kernel(world_size: int):
    @T.prim_func
    def reachable(buf: T.Tensor((16,), "int32"), out: T.Tensor((world_size,), "int32")):
        with T.Kernel(1, threads=32) as _:
            if T.get_thread_binding() == 0:
                for p in T.serial(world_size):
                    out[p] = T.if_then_else(T.peer_reachable(buf, pe=p), 1, 0)

    return reachable


def ok(rank: int, what: str) -> None:
    print(f"[rank {rank}] OK: {what}", flush=True)


def check_reachable(rank, W, topo):
    buf = tilescale.symm.zeros((16,), dtype=torch.int32)
    out = torch.full((W,), -1, dtype=torch.int32, device="cuda")
    reachable_kernel(W)(buf, out)
    torch.cuda.synchronize()
    want = [int(topo.same_node(rank, p)) for p in range(W)]
    assert out.tolist() == want, f"[rank {rank}] T.peer_reachable: got {out.tolist()}, expected {want} ({topo})"
    tilescale.symm.free(buf)
    ok(rank, f"peer_reachable {want}")


def run_calls(op, make_x, make_out, want, name, rank, check=None):
    """CALLS calls of `op` back to back into poisoned outputs, then every result against `want(step)`."""
    xs = [make_x(s) for s in range(CALLS)]
    outs = [make_out() for _ in range(CALLS)]
    for x, o in zip(xs, outs, strict=True):
        op(x, out=o)
    torch.cuda.synchronize()
    for s, o in enumerate(outs):
        (check or testing.check_close)(f"{name} call {s}", o, want(s), rank)


def op_jobs(W: int) -> list:
    """The kernels the ops below build (compiled side by side first: one at a time they would take minutes)."""
    from tilescale.ops import (
        all_to_all,
        allgather,
        allreduce,
        broadcast_from_root,
        reduce_scatter,
        reduce_to_root,
        vectors,
    )

    sms, half = vectors.sm_count(), W * ROWS * COLS * 2
    jobs = [*allgather.kernels(half, W, "float16"), *reduce_scatter.kernels(half, W, "float16", sms),
            *all_to_all.kernels(half, W, None, sms), *broadcast_from_root.kernels(N_ELEMS * 2, W, None, sms),
            *reduce_to_root.kernels(N_ELEMS * 4, W, "float32", sms)]
    jobs += [j for algo in ("one_shot", "two_shot") for j in allreduce.kernels(N_ELEMS * 4, W, "float32", sms, algo)]
    M = W * G_ROWS
    return jobs + prebuild.ag_gemm_jobs([(M, G_K, G_N)], W, "float16") + prebuild.gemm_rs_jobs(
        [(M, W * G_K_LOCAL, G_N)], W, "float16")


def check_collectives(rank, W):
    rows, cols, n = ROWS, COLS, N_ELEMS
    ag = AllGather((rows, cols), F16)
    run_calls(ag, lambda s: rand("ag", rank, s, (rows, cols)), lambda: poison((W * rows, cols)),
              lambda s: torch.cat([rand("ag", p, s, (rows, cols)) for p in range(W)]), "AllGather", rank)
    ag.close()
    ok(rank, "AllGather")

    for algo in ("one_shot", "two_shot"):
        ar = AllReduce((n,), torch.float32, algo=algo)
        run_calls(ar, lambda s: rand("ar", rank, s, (n,), torch.float32), lambda: poison((n,), torch.float32),
                  lambda s: sum(rand("ar", p, s, (n,), torch.float32) for p in range(W)), f"AllReduce {algo}", rank)
        ar.close()
        ok(rank, f"AllReduce {algo}")

    rs = ReduceScatter((W * rows, cols), F16)
    run_calls(rs, lambda s: rand("rs", rank, s, (W * rows, cols)), lambda: poison((rows, cols)),
              lambda s: sum(rand("rs", p, s, (W * rows, cols)) for p in range(W))[rank * rows:(rank + 1) * rows],
              "ReduceScatter", rank)
    rs.close()
    ok(rank, "ReduceScatter")

    a2a = AllToAll((W * rows, cols), F16)
    run_calls(a2a, lambda s: rand("a2a", rank, s, (W * rows, cols)), lambda: poison((W * rows, cols)),
              lambda s: torch.cat([rand("a2a", p, s, (W * rows, cols))[rank * rows:(rank + 1) * rows]
                                   for p in range(W)]), "AllToAll", rank)
    a2a.close()
    ok(rank, "AllToAll")

    for root in sorted({0, W - 1}):
        bc = Broadcast((n,), F16, root)
        xs = [rand("bc", root, s, (n,)) if rank == root else poison((n,)) for s in range(CALLS)]
        for x in xs:                                  # in place, back to back
            assert bc(x) is x
        torch.cuda.synchronize()
        for s, x in enumerate(xs):
            testing.check_close(f"Broadcast root {root} call {s}", x, rand("bc", root, s, (n,)), rank)
        bc.close()

        red = Reduce((n,), torch.float32, root)

        def untouched_or_sum(name, got, want, r, root=root):
            if r == root:
                testing.check_close(name, got, want, r)
            else:
                assert torch.isnan(got).all(), f"[rank {r}] {name}: a rank other than the root wrote its out"

        run_calls(red, lambda s: rand("red", rank, s, (n,), torch.float32), lambda: poison((n,), torch.float32),
                  lambda s: sum(rand("red", p, s, (n,), torch.float32) for p in range(W)), f"Reduce to {root}", rank,
                  check=untouched_or_sum)
        red.close()
        ok(rank, f"Broadcast and Reduce, root {root}")


def check_gemms(rank, W):
    rows, N, K, K_local = G_ROWS, G_N, G_K, G_K_LOCAL
    M = W * rows
    b = [rand("b", 0, s, (K, N)) for s in range(CALLS)]       # the same B on every rank
    ag = AGGemm(M, N, K, F16)
    step = iter(range(CALLS))
    run_calls(lambda a, out: ag(a, b[next(step)], out=out), lambda s: rand("a", rank, s, (rows, K)),
              lambda: poison((M, N)),
              lambda s: (torch.cat([rand("a", p, s, (rows, K)) for p in range(W)]).float() @ b[s].float()).to(F16),
              "AGGemm", rank)
    ag.close()
    ok(rank, "AGGemm")

    rs = GemmRS(M, N, K_local, F16)
    ws = [rand("w", rank, s, (K_local, N)) for s in range(CALLS)]
    step = iter(range(CALLS))
    run_calls(lambda x, out: rs(x, ws[next(step)], out=out), lambda s: rand("x", rank, s, (M, K_local)),
              lambda: poison((rows, N)),
              lambda s: sum(rand("x", p, s, (M, K_local)).float() @ rand("w", p, s, (K_local, N)).float()
                            for p in range(W))[rank * rows:(rank + 1) * rows].to(F16), "GemmRS", rank)
    rs.close()
    ok(rank, "GemmRS")


def run(info):
    rank, W = info.rank, info.world_size
    topo = topology.current()
    assert topo.emulated, "run with TILESCALE_NODE_SIZE set (the remote path)"
    mods = [importlib.import_module(m) for m in PRIMITIVES]
    prebuild.on_local_rank0([(reachable_kernel, (W,)), *op_jobs(W), *(j for m in mods for j in m.jobs(W))])
    check_reachable(rank, W, topo)
    check_collectives(rank, W)
    tilescale.barrier()
    check_gemms(rank, W)
    tilescale.barrier()
    for m in mods:
        m.run(info)
        tilescale.barrier()
    ok(rank, f"remote path, TILESCALE_NODE_SIZE={topo.node_size}: every op")


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
