"""The fused ops with the rows at run time (issue 37): one AGGemm and one GemmRS per job, built for a bound of 1024 rows
per rank, called with rows under it one after the other (not multiples of the 128-row tile, one row per rank, the
bound itself, down and up again: each call sizes its copies and pulls anew), every rank checked against torch on
random data with the output poisoned (NaN) before each call (AGGemm fused, by push at two ranks on two GPUs, and
where the job may take it unfused); then the cached functions (``tilescale.ops.ag_gemm`` /
``gemm_rs``) over the same rows, which build one op per bound of rows and no kernel after the first call's. Run by
tests/test_rows_at_run_time_cpu.py on 1, 2 and 4 ranks.

    GPUS=2 bash launch.sh tests/gpu/rows_main.py
"""
import tilescale
from tilescale import testing

BOUND, N, K = 1024, 1024, 2048       # rows per rank of the ops' bound; N; K (full K: GEMM+RS splits it over ranks)
ROWS = (1000, 136, 1, 1024, 77, 512, 129)   # rows per rank of successive calls


def jobs(W: int) -> list:
    from tilescale.ops import prebuild

    return prebuild.unique(prebuild.ag_gemm_jobs([(W * BOUND, K, N)], W)
                           + prebuild.ag_gemm_jobs([(W * r, K, N) for r in ROWS], W, cached=True)
                           + prebuild.gemm_rs_jobs([(W * BOUND, K, N)], W)
                           + prebuild.gemm_rs_jobs([(W * r, K, N) for r in ROWS], W, cached=True))


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def run(info):
    import torch

    from tilescale.ops import allgather_gemm, prebuild
    from tilescale.ops.gemm import gemm_config
    from tilescale.ops.op_cache import row_bound
    from tilescale.pytorch import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    rank, W = info.rank, info.world_size
    prebuild.on_local_rank0(jobs(W))
    bf16 = torch.bfloat16

    def inputs(call: int, rows: int):
        g = torch.Generator(device="cuda").manual_seed(7000 * call + rank)
        a = torch.randn(rows, K, device="cuda", generator=g).to(bf16)
        gb = torch.Generator(device="cuda").manual_seed(call)       # B: the same on every rank
        b = (torch.randn(K, N, device="cuda", generator=gb) / K ** 0.5).to(bf16)
        return a, b

    def gathered(a):
        a_full = torch.empty(W * a.shape[0], K, device="cuda", dtype=bf16)
        dist.all_gather_into_tensor(a_full, a)
        return a_full

    # the fused op (push at two ranks on two GPUs, else pull), then where the job may take it (a GPU per rank, one
    # node: tilescale/ops/fused_paths.py) the unfused one (NCCL's AllGather into its buffer's first rows, matmul)
    unfused = W > 1 and not info.shared_gpu and info.local_world_size == W
    for fused in (True, False) if unfused else (True,):
        op = tilescale.ops.AGGemm(W * BOUND, N, K, bf16, fused=fused)
        what = (f"AGGemm ({getattr(op, 'protocol', 'unfused') if fused else 'unfused'}, bound {BOUND} rows, "
                f"splits {[p.split for p in getattr(op, 'plans', [])]})")
        for call, rows in enumerate(ROWS):
            a, b = inputs(call, rows)
            c = torch.full((W * rows, N), float("nan"), device="cuda", dtype=bf16)
            op(a, b, out=c)
            torch.cuda.synchronize()
            a_full = gathered(a)
            err = rel_err(c, a_full.float() @ b.float())
            if not err < 2e-2:   # NaN (a tile never written, or written from another rank's rows) fails too
                raise AssertionError(f"[rank {rank}] {what} call {call} of {rows} rows: relative error {err:.3g}")
            if W > 1 and not torch.equal(op.gathered(), a_full):
                raise AssertionError(f"[rank {rank}] {what} call {call} of {rows} rows: gathered() is not "
                                     "all_gather(a)")
        op.close()

    built = len(allgather_gemm._cached)
    for call, rows in enumerate(ROWS):
        a, b = inputs(100 + call, rows)
        c, g = tilescale.ops.ag_gemm(a, b, return_gathered=True)
        torch.cuda.synchronize()
        a_full = gathered(a)
        err = rel_err(c, a_full.float() @ b.float())
        if not err < 2e-2 or not torch.equal(g, a_full):
            raise AssertionError(f"[rank {rank}] ag_gemm of {rows} rows: relative error {err:.3g}, gathered "
                                 f"{'equal' if torch.equal(g, a_full) else 'different'}")
    ops = len(allgather_gemm._cached) - built
    configs = {gemm_config(W * row_bound(r), N, K, world_size=W, op="ag_gemm") for r in ROWS}
    if ops != len(configs):    # 1000 rows first: the op of 1024 rows, which every later row count of its config fits
        raise AssertionError(f"[rank {rank}] ag_gemm over rows {ROWS}: {ops} ops built, expected one per config "
                             f"({len(configs)})")
    kl = K // W
    rs = tilescale.ops.GemmRS(W * BOUND, N, kl, bf16)

    def rs_inputs(call: int, rows: int):
        g = torch.Generator(device="cuda").manual_seed(9000 * call + rank)
        x = torch.randn(W * rows, kl, device="cuda", generator=g).to(bf16)
        w = (torch.randn(kl, N, device="cuda", generator=g) / kl ** 0.5).to(bf16)
        want = torch.empty(rows, N, device="cuda", dtype=torch.float32)
        dist.reduce_scatter_tensor(want, (x.float() @ w.float()).contiguous())    # fp32 sum over ranks
        return x, w, want

    for call, rows in enumerate(ROWS + ROWS[::-1]):   # (down and up again: every tile's count carried over calls)
        x, w, want = rs_inputs(call, rows)
        out = torch.full((rows, N), float("nan"), device="cuda", dtype=bf16)
        rs(x, w, out=out)
        torch.cuda.synchronize()
        err = rel_err(out, want)
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] GemmRS ({rs.path}, bound {BOUND} rows) call {call} of {rows} rows: "
                                 f"relative error {err:.3g}")
    rs.close()
    from tilescale.ops import gemm_reduce_scatter

    built = len(gemm_reduce_scatter._cached)
    for call, rows in enumerate(ROWS):
        x, w, want = rs_inputs(100 + call, rows)
        err = rel_err(tilescale.ops.gemm_rs(x, w), want)
        if not err < 2e-2:
            raise AssertionError(f"[rank {rank}] gemm_rs of {rows} rows: relative error {err:.3g}")
    ops = len(gemm_reduce_scatter._cached) - built
    op = "gemm_rs_push" if gemm_reduce_scatter.default_path(W, kl) == "push" else "gemm_rs"
    configs = {gemm_config(W * row_bound(r), N, kl, world_size=W, op=op) for r in ROWS}
    if ops != len(configs):
        raise AssertionError(f"[rank {rank}] gemm_rs over rows {ROWS}: {ops} ops built, expected one per config "
                             f"({len(configs)})")
    print(f"[rank {rank}] OK: AG+GEMM and GEMM+RS with rows {ROWS} per rank under one bound match torch", flush=True)


def build(world_size: int) -> None:
    for fn, args in jobs(world_size):
        print(fn.build(*args).library)


if __name__ == "__main__":
    testing.example_main(run, build)
