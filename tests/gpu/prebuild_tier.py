"""Compile, once and side by side, the kernels the GPU tier's tests launch, for each world size: run by
run_gpu_tier.sh before a part's tests, so the jobs load them from tilelang's kernel cache instead of
compiling them while the GPU and the CPUs are shared with the other tests.

    python tests/gpu/prebuild_tier.py 2 4        # the multi-rank tests of world sizes 2 and 4
    python tests/gpu/prebuild_tier.py 1          # the one-GPU tests

The lists below name each test's kernels with the arguments it uses, and the device-wait bound its job runs
with (it is part of a distributed kernel's cache key: the fault tests run with 0, 3 or 5 s, the rest with the
tier's 30 s). A kernel left out, or listed with other arguments, is still compiled by its test, only later
(and once per job: the ranks of a job take turns, tilescale.compile). Needs a GPU (tilelang's load step)."""
import dataclasses
import importlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "distributed"
for d in (EXAMPLES, EXAMPLES / "primitives", ROOT / "tests" / "gpu", ROOT / "benchmarks"):
    sys.path.insert(0, str(d))

TIER_TIMEOUT_S = float(os.environ.get("TILESCALE_WAIT_TIMEOUT_S", "30"))   # what the tier's jobs run with


def jit_jobs(world_size: int) -> list:
    """(jit function, args) of the multi-rank tests that run with the tier's wait bound."""
    from tilescale import compiler
    from tilescale.ops import prebuild
    from tilescale.ops.allgather import allgather_kernel, default_blocks_per_peer

    jobs = [(compiler.barrier_jit(), (world_size,))]                      # behind every tilescale.barrier()
    for name in ("example_allreduce", "example_all_to_all", "example_broadcast", "example_reduce_scatter",
                 "example_reduce", "example_put_get", "example_ld_st_atomic", "example_sync", "example_remote_view"):
        jobs += importlib.import_module(name).jobs(world_size)
    jobs += importlib.import_module("example_signal_wait").jobs(world_size, shared_gpu=shared(world_size))
    jobs.append((importlib.import_module("example_quickstart").ring, (1024, world_size)))
    for dt in ("bfloat16", "float16"):                                   # example_allgather: 512 x 384 rows
        for bpp in sorted({default_blocks_per_peer(512 * 384 * 2, world_size), 2, 8}):
            jobs.append((allgather_kernel, (world_size, bpp, dt)))
        for cached in (False, True):                                     # (M, K, N) of its test: op and function
            jobs += prebuild.ag_gemm_jobs([(1024 * world_size, 2048, 1024)], world_size, dt, cached=cached)
        for cached in (False, True):
            jobs += prebuild.gemm_rs_jobs([(512 * world_size, 2048, 1024)], world_size, dt, cached=cached)
    # tests/gpu/graphs_main.py's replay_host_work: AllGather of 1 MiB per rank, fp32
    jobs.append((allgather_kernel, (world_size, default_blocks_per_peer(1 << 20, world_size), "float32")))
    fg = importlib.import_module("fused_graphs_main")                   # tests/test_graphs_gpu.py's fused test
    jobs += prebuild.ag_gemm_jobs([(fg.ROWS * world_size, fg.K, fg.N)], world_size)
    jobs += prebuild.gemm_rs_jobs([(fg.ROWS * world_size, fg.K * world_size, fg.N)], world_size)
    jobs += importlib.import_module("example_tp_mlp").collective_jobs(world_size, 256, 1024)
    jobs += importlib.import_module("example_tp_layer").fused_jobs(world_size, 200, 512, 1024)
    jobs += importlib.import_module("gemm_configs_main").jobs(world_size)
    jobs += importlib.import_module("rows_main").jobs(world_size)
    soak = importlib.import_module("soak_collectives")                  # tests/test_soak.py's arguments
    jobs += soak.jobs(world_size, sms(), soak.parser().parse_args(["--iters", "600", "--random-calls", "60"]))
    bad = importlib.import_module("bad_input_main")                       # its kernels of its own
    jobs += [(bad.put_kernel, (1024, world_size)), (bad.put_kernel, (1024, world_size + 1))]
    jobs.append((importlib.import_module("teardown_main").ring_kernel, (1 << 16, world_size)))   # normal, loop ...
    if world_size >= 4 and world_size % 2 == 0:                           # tests/test_groups_cpu.py's GPU test
        jobs += importlib.import_module("groups_main").jobs(world_size, sms())
    if world_size == 2:                                                   # tests/test_profiler.py: 2 ranks only
        prof, stamp = importlib.import_module("profile_ag_gemm")._jobs(2048, 1024, 1024, world_size)
        jobs += prof + [(stamp, ())]
    return prebuild.unique(jobs)


def other_bound_jobs(world_size: int) -> list:
    """(jit function, args, wait bound) of the tests that run with another bound (tests/test_gpu_runtime.py,
    tests/test_gpu_teardown.py)."""
    from tilescale import compiler

    barrier, ring = compiler.barrier_jit(), importlib.import_module("teardown_main").ring_kernel
    hang = importlib.import_module("hang_main").never_signalled
    jobs = [(barrier, (world_size,), 3.0), (hang, (world_size,), 3.0)]   # the injected hang
    for bound in (0.0, 5.0):                  # raise_one*; never_barrier, caught_exit, kill9
        jobs += [(barrier, (world_size,), bound), (ring, (1 << 16, world_size), bound)]
    return jobs


def one_gpu_jobs() -> list:
    lazy = importlib.import_module("lazy_main")
    return [(lazy.consumer_kernel, (4096,)), (lazy.producer_kernel, (4096,))]


def shared(world_size: int) -> bool:
    from tilescale import testing

    return testing.shared_gpus(world_size)


def sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def _compile(fn, pf, args, bound: float):
    """What ``fn(*args)`` compiles in a job whose TILESCALE_WAIT_TIMEOUT_S is `bound` (the bound is in the key)."""
    if fn.wait_timeout_s is None:
        fn = dataclasses.replace(fn, wait_timeout_s=bound)   # the same jit function, bounded as that job is
    return fn.compile_tir(pf, args)


def all_jobs(sizes: list[int]) -> list:
    """Every (label, zero-argument compile) for these world sizes; elaborated here, in this thread."""
    from example_ring_put import ring_put_kernel

    import tilescale

    work = []
    for ws in sizes:
        listed = [(fn, args, TIER_TIMEOUT_S) for fn, args in (one_gpu_jobs() if ws == 1 else jit_jobs(ws))]
        listed += [] if ws == 1 else other_bound_jobs(ws)
        for fn, args, bound in listed:
            pf = fn.get_tir(*args)
            work.append((f"{getattr(fn, 'func', fn).__name__}{args} bound {bound:g} s",
                         lambda fn=fn, pf=pf, args=args, bound=bound: _compile(fn, pf, args, bound)))
        if ws > 1:                                                       # example_ring_put: both build modes
            pf = ring_put_kernel.get_tir(64, 256, ws)
            for mode in ("inlined", "rdc"):
                work.append((f"ring_put({ws}) {mode}",
                             lambda pf=pf, mode=mode, ws=ws: tilescale.compile(pf, build_mode=mode, world_size=ws)))
    return work


def main(sizes: list[int]) -> int:
    t0 = time.time()
    work = all_jobs(sizes)
    from tilescale import batch

    failed = 0      # side by side up to the cores (TILESCALE_BUILD_JOBS), one progress line
    for (label, _), r in zip(work, batch.run([fn for _, fn in work], None, label="the tier's kernels"), strict=True):
        if isinstance(r, BaseException):       # its test compiles it again and reports the error
            failed += 1
            print(f"prebuild_tier: {label}: {type(r).__name__}: {r}", flush=True)
    print(f"prebuild_tier: {len(work) - failed} of {len(work)} kernels for world sizes {sizes} in "
          f"{time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [2, 4]))
