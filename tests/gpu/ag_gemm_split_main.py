"""AG+GEMM on a shape whose last waves the plan splits along K (tilescale.ops.gemm.split_tile_loop): N = 2752 in 128x256
tiles, M = 8192 (SPLITS below). At 2 and 4 ranks sharing one GPU the peers' rows are pulled by copy kernels, which
end before the second GEMM starts (the op hung there before they did). Checked on every rank against torch on
random data with the output poisoned (NaN) before each call: 4 eager calls (the tail's counts carried from call to
call), then a CUDA graph of one call replayed 6 times with new inputs, an eager call after each replay. Run by
tests/test_gemm_config.py on 1, 2 and 4 ranks.

    GPUS=1 bash launch.sh tests/gpu/ag_gemm_split_main.py
"""
import tilescale
from tilescale import testing
from tilescale.ops.gemm import GemmConfig

CONFIG = GemmConfig(128, 256, 64, 3, 256, 10)
M, N, K = 8192, 2752, 1024
# the splits of the GEMMs of the own rows and the others' rows on 132 SMs: 704 tiles (660 whole + 44 x 3) at world
# size 1; 352 each (264 + 88 x 3) at 2; 176 (132 + 44 x 3) and 528 (4 whole waves) at 4
SPLITS = {1: [3], 2: [3, 3], 4: [3, 1]}


def jobs(W: int, sms: int = 132) -> list:
    from tilescale.ops import allgather_gemm

    try:
        return allgather_gemm.kernels(M, N, K, W, "bfloat16", config=CONFIG, sms=sms)
    except TypeError:   # an older tree (benchmarks/old_tree.sh): no split, no `sms`
        return allgather_gemm.kernels(M, N, K, W, "bfloat16", config=CONFIG)


def run(info):
    import torch

    from tilescale import staged_collectives
    from tilescale.ops import prebuild, vectors

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    rank, W = info.rank, info.world_size
    prebuild.on_local_rank0(jobs(W, vectors.sm_count()))
    bf16 = torch.bfloat16
    op = tilescale.ops.AGGemm(M, N, K, bf16, config=CONFIG)
    splits = [p.split for p in getattr(op, "plans", [])]   # an older tree (benchmarks/old_tree.sh): no plans
    if hasattr(op, "plans") and vectors.sm_count() == 132 and splits != SPLITS[W]:
        raise AssertionError(f"[rank {rank}] plans {op.plans}: expected splits {SPLITS[W]} at world size {W}")
    a = torch.empty(M // W, K, device="cuda", dtype=bf16)
    b = torch.empty(K, N, device="cuda", dtype=bf16)
    c = torch.empty(M, N, device="cuda", dtype=bf16)
    a_full = torch.empty(M, K, device="cuda", dtype=bf16)

    def fill(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed * 100 + rank)
        a.copy_(torch.randn(M // W, K, device="cuda", generator=g))
        gb = torch.Generator(device="cuda").manual_seed(seed)    # B: the same on every rank
        b.copy_(torch.randn(K, N, device="cuda", generator=gb) / K ** 0.5)
        c.fill_(float("nan"))

    def check(what: str, m: int = M // W):
        torch.cuda.synchronize()
        dist.all_gather_into_tensor(a_full[:W * m], a[:m])
        want = a_full[:W * m].float() @ b.float()
        err = ((c[:W * m].float() - want).abs().max() / want.abs().max()).item()
        if not err < 2e-2:   # NaN (a tile never written) fails too
            raise AssertionError(f"[rank {rank}] AG+GEMM {W * m}x{K}x{N}, split {splits}, {what}: relative error "
                                 f"{err:.3g}")

    for call in range(4):
        fill(call)
        op(a, b, out=c)
        check(f"eager call {call}")
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    fill(100)
    with torch.cuda.graph(graph):
        op(a, b, out=c)
    for i in range(6):
        fill(200 + i)
        graph.replay()
        check(f"replay {i}")
        fill(300 + i)
        op(a, b, out=c)
        check(f"eager call after replay {i}")
    # calls of fewer rows, each split as its own plan says (3 or 4 slices, other tail tiles; 1536 rows: none), in
    # turn with calls of the bound's: a tail tile's counts carried across calls of other splits (an older tree,
    # benchmarks/old_tree.sh: calls of the bound's rows only)
    fewer = (1536, 128, 1920 // W, 64, 1000 // W, M // W, 128) if hasattr(op, "_split_of") else ()
    for i, m in enumerate(fewer):
        fill(400 + i)
        op(a[:m], b, out=c[:W * m])
        check(f"a call of {m} rows (slices, tail: {op._split_of(m)})", m)
    op.close()
    print(f"[rank {rank}] OK: AG+GEMM on a split-tail shape (splits {splits}), {10 + len(fewer)} eager calls "
          f"({len(fewer)} of fewer rows) and 6 graph replays match torch", flush=True)


def build(world_size: int) -> None:
    for fn, args in jobs(world_size):
        print(fn.build(*args).library)


if __name__ == "__main__":
    testing.example_main(run, build)
