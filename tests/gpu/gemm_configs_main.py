"""AG+GEMM and GEMM+RS built with non-default tile configurations (what the tuning table of
tilescale/ops/gemm.py may pick: 256-row tiles, one consumer warpgroup, three consumer warpgroups, no
swizzle, other panels), checked on every rank against torch on random data, outputs poisoned (NaN) before
each call, three calls each (both buffer parities). Run by tests/test_gemm_config.py on 2 and 4 GPUs.

    GPUS=2 bash launch.sh tests/gpu/gemm_configs_main.py
"""
import tilescale
from tilescale import testing
from tilescale.ops.gemm import GemmConfig, check

CONFIGS = [GemmConfig(256, 128, 64, 3, 256, 4), GemmConfig(64, 256, 64, 4, 128, 0),
           GemmConfig(128, 192, 64, 4, 384, 16), GemmConfig(128, 128, 128, 3, 256, 10)]
DTYPE = "bfloat16"


def shapes(W: int) -> tuple[int, int, int]:
    return 512 * W, 1024, 2048    # M (gathered / reduced rows), N, K (full K; GEMM+RS splits it over ranks)


def jobs(W: int) -> list:
    from tilescale.ops import allgather_gemm, gemm_reduce_scatter

    M, N, K = shapes(W)
    out = []
    for cfg in CONFIGS:
        if check(cfg, M, N, K, world_size=W, op="ag_gemm") is None:
            out += allgather_gemm.kernels(M, N, K, W, DTYPE, config=cfg)
        if check(cfg, M, N, K // W, world_size=W, op="gemm_rs") is None:
            out += gemm_reduce_scatter.kernels(M, N, K // W, W, DTYPE, config=cfg)
    return out


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def run(info):
    import torch

    from tilescale import staged_collectives
    from tilescale.ops import prebuild

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    rank, W = info.rank, info.world_size
    M, N, K = shapes(W)
    kl = K // W
    prebuild.on_local_rank0(jobs(W))
    bf16 = torch.bfloat16
    done = []
    for cfg in CONFIGS:
        if check(cfg, M, N, K, world_size=W, op="ag_gemm") is None:
            op = tilescale.ops.AGGemm(M, N, K, bf16, config=cfg)
            for call in range(3):
                g = torch.Generator(device="cuda").manual_seed(7000 * call + rank)
                a = torch.randn(M // W, K, device="cuda", generator=g).to(bf16)
                b = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).to(bf16)
                a_full = torch.empty(M, K, device="cuda", dtype=bf16)
                dist.all_gather_into_tensor(a_full, a)
                c = torch.full((M, N), float("nan"), device="cuda", dtype=bf16)
                op(a, b, out=c)
                torch.cuda.synchronize()
                err = rel_err(c, a_full.float() @ b.float())
                if not err < 2e-2:
                    raise AssertionError(f"[rank {rank}] ag_gemm {cfg.short()} call {call}: relative error {err:.3g}")
            op.close()
            done.append(f"ag_gemm {cfg.short()}")
        if check(cfg, M, N, kl, world_size=W, op="gemm_rs") is None:
            op = tilescale.ops.GemmRS(M, N, kl, bf16, config=cfg)
            for call in range(3):
                g = torch.Generator(device="cuda").manual_seed(9000 * call + rank)
                x = torch.randn(M, kl, device="cuda", generator=g).to(bf16)
                w = (torch.randn(kl, N, device="cuda", generator=g) / kl ** 0.5).to(bf16)
                partial = (x.float() @ w.float())
                want = torch.empty(M // W, N, device="cuda", dtype=torch.float32)
                dist.reduce_scatter_tensor(want, partial)       # fp32 sum over ranks
                out = torch.full((M // W, N), float("nan"), device="cuda", dtype=bf16)
                op(x, w, out=out)
                torch.cuda.synchronize()
                err = rel_err(out, want)
                if not err < 2e-2:
                    raise AssertionError(f"[rank {rank}] gemm_rs {cfg.short()} call {call}: relative error {err:.3g}")
            op.close()
            done.append(f"gemm_rs {cfg.short()}")
    print(f"[rank {rank}] OK: fused ops with {len(done)} non-default configs match torch: {'; '.join(done)}",
          flush=True)


def build(world_size: int) -> None:
    for fn, args in jobs(world_size):
        print(fn.build(*args).library)


if __name__ == "__main__":
    testing.example_main(run, build)
