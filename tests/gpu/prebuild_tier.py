"""Compile, once and side by side, the kernels the GPU tier's multi-rank tests launch, for each world size:
run by run_gpu_tier.sh before its parts, so the tests load them from tilelang's kernel cache instead of each
job compiling its own (and every part compiling tilescale's barrier module) on first use.

    python tests/gpu/prebuild_tier.py 2 4

The lists below name each test's kernels with the shapes it uses; a kernel left out is still compiled by the
test itself, only later. Needs a GPU (tilelang's load step), not the distributed runtime."""
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "distributed"
for d in (EXAMPLES, EXAMPLES / "primitives", ROOT / "tests" / "gpu", ROOT / "benchmarks"):
    sys.path.insert(0, str(d))


def jobs_for(world_size: int) -> list:
    from tilescale import compiler
    from tilescale.ops import prebuild
    from tilescale.ops.allgather import allgather_kernel, default_blocks_per_peer

    jobs = [(compiler.barrier_jit(), (world_size,))]                      # behind every tilescale.barrier()
    for name in ("example_allreduce", "example_all_to_all", "example_broadcast", "example_reduce_scatter",
                 "example_put_get", "example_signal_wait", "example_ld_st_atomic", "example_sync",
                 "example_remote_view"):
        jobs += importlib.import_module(name).jobs(world_size)
    quickstart = importlib.import_module("example_quickstart")
    jobs.append((quickstart.ring, (1024, world_size)))
    for dt in ("bfloat16", "float16"):                                   # example_allgather: 512 x 384 rows
        for bpp in sorted({default_blocks_per_peer(512 * 384 * 2, world_size), 2, 8}):
            jobs.append((allgather_kernel, (world_size, bpp, dt)))
        jobs += prebuild.ag_gemm_jobs([(1024 * world_size, 2048, 1024)], world_size, dt)   # (M, K, N) of its test
        jobs += prebuild.gemm_rs_jobs([(512 * world_size, 2048, 1024)], world_size, dt)
    jobs += importlib.import_module("example_tp_mlp").collective_jobs(world_size, 256, 1024)
    jobs += importlib.import_module("example_tp_layer").fused_jobs(world_size, 200, 512, 1024)
    jobs += importlib.import_module("gemm_configs_main").jobs(world_size)
    soak = importlib.import_module("soak_collectives")                  # tests/test_soak.py's arguments
    jobs += soak.jobs(world_size, sms(), soak.parser().parse_args(["--iters", "600", "--random-calls", "60"]))
    return prebuild.unique(jobs)


def sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def main(sizes: list[int]) -> int:
    from tilescale.ops import prebuild

    t0 = time.time()
    jobs = [j for ws in sizes for j in jobs_for(ws)]
    prebuild.compile_all(jobs, workers=16)
    print(f"prebuild_tier: {len(jobs)} kernels for world sizes {sizes} in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [2, 4]))
