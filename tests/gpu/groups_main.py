"""Ops over process groups (issue 41 item 1): a world of W ranks split into two groups of W / 2, the groups of
consecutive ranks (TP groups of a DP x TP job: [0, 1], [2, 3]) and then the groups of every other rank ([0, 2],
[1, 3]). Both groups run side by side; every rank checks each op against torch.distributed over its group (NCCL, or
gloo on host copies where ranks share a GPU) on random data, outputs poisoned (NaN) before each call, two calls
back to back: AllGather, ReduceScatter, AllReduce (one-shot, two-shot), Broadcast, Reduce, AllToAll (equal and
uneven splits), AGGemm (fused), GemmRS, the cached functions, the torch operators and the async-TP drop-ins with the
group's name. Run by tests/test_groups_cpu.py at 4 ranks.

    GPUS=4 bash launch.sh tests/gpu/groups_main.py
"""
import tilescale
from tilescale import testing

ROWS, N, K = 256, 1024, 2048        # rows per rank; N; K (GEMM+RS: K split over the group's ranks)


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def layouts(W: int) -> dict:
    half = W // 2
    return {"consecutive": [list(range(half)), list(range(half, W))],
            "every other": [list(range(0, W, 2)), list(range(1, W, 2))]}


def run(info):
    import torch
    import torch.distributed as dist

    from tilescale.ops import torch_ops
    from tilescale.pytorch import async_tp, staged_collectives

    rank, W = info.rank, info.world_size
    if W < 4 or W % 2:
        raise SystemExit(f"groups_main.py needs an even world of 4 ranks or more, got {W}")
    bf16 = torch.bfloat16

    def check(what, got, want, tol=2e-2):
        torch.cuda.synchronize()
        err = rel_err(got, want)
        if not err < tol:   # NaN (a tile never written, or from another group's rows) fails too
            raise AssertionError(f"[rank {rank}] {what}: relative error {err:.3g}")

    for name, groups in layouts(W).items():
        pgs = [dist.new_group(g) for g in groups]            # every rank makes every group, in the same order
        mine = next(i for i, g in enumerate(groups) if rank in g)
        pg, members = pgs[mine], groups[mine]
        ref = staged_collectives.for_cuda(pg)
        G = len(members)
        where = f"{name} groups {groups}, group {members}"
        for call in range(2):
            gen = torch.Generator(device="cuda").manual_seed(1000 * call + rank)
            a = torch.randn(ROWS, K, device="cuda", generator=gen).to(bf16)
            gb = torch.Generator(device="cuda").manual_seed(call)      # B: the same on every rank
            b = (torch.randn(K, N, device="cuda", generator=gb) / K ** 0.5).to(bf16)
            a_full = torch.empty(G * ROWS, K, device="cuda", dtype=bf16)
            ref.all_gather_into_tensor(a_full, a, group=pg)

            got = tilescale.ops.all_gather(a, group=pg)
            if not torch.equal(got, a_full):
                raise AssertionError(f"[rank {rank}] all_gather, {where}: differs from torch's")
            x = torch.randn(G * ROWS, N, device="cuda", generator=gen).to(bf16)
            want = torch.empty(ROWS, N, device="cuda", dtype=torch.float32)
            ref.reduce_scatter_tensor(want, x.float(), group=pg)
            out = torch.full((ROWS, N), float("nan"), device="cuda", dtype=bf16)
            check(f"reduce_scatter_tensor call {call}, {where}",
                  tilescale.ops.reduce_scatter_tensor(out, x, group=pg), want)

            for algo in ("one_shot", "two_shot"):
                t = torch.randn(ROWS, N, device="cuda", generator=gen).to(bf16)
                want = t.float()
                ref.all_reduce(want, group=pg)
                ar = tilescale.ops.AllReduce(t.shape, bf16, algo=algo, group=pg)
                out = torch.full_like(t, float("nan"))
                ar(t, out=out)
                check(f"AllReduce ({algo}) call {call}, {where}", out, want)
                ar.close()
            t = torch.randn(ROWS, N, device="cuda", generator=gen).to(bf16)
            want = t.float()
            ref.all_reduce(want, group=pg)
            check(f"all_reduce call {call}, {where}", tilescale.ops.all_reduce(t, group=pg), want)

            root = members[-1]          # (a world rank: the functions take torch's src / dst)
            t = torch.randn(ROWS, N, device="cuda", generator=gen).to(bf16)
            want = t.clone()
            ref.broadcast(want, src=root, group=pg)
            got = tilescale.ops.broadcast(t.clone(), root, group=pg)
            if not torch.equal(got, want):
                raise AssertionError(f"[rank {rank}] broadcast from {root}, {where}: differs from torch's")
            want = t.float()
            ref.all_reduce(want, group=pg)       # (the sum every rank has; reduce's lands on the root only)
            got = tilescale.ops.reduce(t.clone(), root, group=pg)
            if rank == root:
                check(f"reduce to {root} call {call}, {where}", got, want)
            elif not torch.equal(got, t):
                raise AssertionError(f"[rank {rank}] reduce to {root}, {where}: changed a tensor not the root's")

            gr = members.index(rank)
            for splits in (None, [1 + (gr + j) % G for j in range(G)]):   # equal; rows to (and from) group rank j
                x = torch.randn(G * 4 if splits is None else sum(splits), N, device="cuda", generator=gen).to(bf16)
                want = torch.empty_like(x)
                ref.all_to_all_single(want, x, splits, splits, group=pg)
                got = torch.full_like(x, float("nan"))
                tilescale.ops.all_to_all_single(got, x, splits, splits, group=pg)
                if not torch.equal(got, want):
                    raise AssertionError(f"[rank {rank}] all_to_all_single (splits {splits}), {where}: differs")

            op = tilescale.ops.AGGemm(G * ROWS, N, K, bf16, group=pg, fused=True)
            c = torch.full((G * ROWS, N), float("nan"), device="cuda", dtype=bf16)
            op(a, b, out=c)
            check(f"AGGemm ({op.protocol}) call {call}, {where}", c, a_full.float() @ b.float())
            op.close()
            check(f"ag_gemm call {call}, {where}", tilescale.ops.ag_gemm(a, b, group=pg), a_full.float() @ b.float())

            kl = K // G
            xs = torch.randn(G * ROWS, kl, device="cuda", generator=gen).to(bf16)
            ws = (torch.randn(kl, N, device="cuda", generator=gen) / kl ** 0.5).to(bf16)
            want = torch.empty(ROWS, N, device="cuda", dtype=torch.float32)
            ref.reduce_scatter_tensor(want, (xs.float() @ ws.float()).contiguous(), group=pg)
            rs = tilescale.ops.GemmRS(G * ROWS, N, kl, bf16, group=pg)
            out = torch.full((ROWS, N), float("nan"), device="cuda", dtype=bf16)
            rs(xs, ws, out=out)
            check(f"GemmRS ({rs.path}) call {call}, {where}", out, want)
            rs.close()
            check(f"gemm_rs call {call}, {where}", tilescale.ops.gemm_rs(xs, ws, group=pg), want)
            check(f"torch_ops.gemm_rs call {call}, {where}", torch_ops.gemm_rs(xs, ws, group=pg), want)
            check(f"torch_ops.ag_gemm call {call}, {where}", torch_ops.ag_gemm(a, b, group=pg),
                  a_full.float() @ b.float())

            A, (c1,) = async_tp.fused_all_gather_matmul(a, [b], 0, pg.group_name)
            if not torch.equal(A, a_full):
                raise AssertionError(f"[rank {rank}] fused_all_gather_matmul, {where}: A differs from torch's")
            check(f"fused_all_gather_matmul call {call}, {where}", c1, a_full.float() @ b.float())
            y = async_tp.fused_matmul_reduce_scatter(xs, ws, "sum", 0, pg.group_name)
            check(f"fused_matmul_reduce_scatter call {call}, {where}", y, want)
    print(f"[rank {rank}] OK: collectives and fused ops over groups of {W // 2} ranks match torch", flush=True)


def jobs(world_size: int, sms: int = 132) -> list:
    """(jit function, args) of the kernels this test's ops build, for every group of both layouts (each group builds
    kernels of its own: the team is a compile-time argument), for tests/gpu/prebuild_tier.py. A kernel missed here
    is still compiled by the test, only later."""
    from tilescale.ops import (
        all_to_all,
        allgather,
        allreduce,
        broadcast_from_root,
        prebuild,
        reduce_scatter,
        reduce_to_root,
    )
    from tilescale.runtime.team import of_ranks

    G, bf16, out = world_size // 2, "bfloat16", []
    for groups in layouts(world_size).values():
        for members in groups:
            team = of_ranks("groups_main", members, world_size)
            msg = ROWS * N * 2                                          # AllReduce, Broadcast, Reduce: (ROWS, N)
            out.append((allgather.allgather_kernel,
                        (G, allgather.default_blocks_per_peer(ROWS * K * 2, G), bf16, 512, team)))
            out += reduce_scatter.kernels(G * msg, G, bf16, sms, 512, team)
            for algo in ("one_shot", "two_shot"):
                out += allreduce.kernels(msg, G, bf16, sms, algo, 512, team)
            out += broadcast_from_root.kernels(msg, G, None, sms, 512, team)
            out += reduce_to_root.kernels(msg, G, bf16, sms, 512, team)
            for rows in (G * 4, G * (G + 1) // 2):                      # AllToAll: equal and uneven splits
                out += all_to_all.kernels(rows * N * 2, G, None, sms, 512, team)
            for cached in (False, True):
                out += prebuild.ag_gemm_jobs([(G * ROWS, K, N)], G, bf16, cached=cached, team=team)
                out += prebuild.gemm_rs_jobs([(G * ROWS, K, N)], G, bf16, cached=cached, team=team)
    return prebuild.unique(out)


def build(world_size: int) -> None:
    """The fused ops' kernels of the first group of consecutive ranks (compile-only runs)."""
    from tilescale.ops import allgather_gemm, gemm_reduce_scatter
    from tilescale.runtime.team import Team

    G = world_size // 2
    team = Team(0, 1, G)
    for fn, args in (allgather_gemm.kernels(G * ROWS, N, K, G, "bfloat16", team=team)
                     + gemm_reduce_scatter.kernels(G * ROWS, N, K // G, G, "bfloat16", team=team)):
        print(fn.build(*args).library)


if __name__ == "__main__":
    testing.example_main(run, build)
