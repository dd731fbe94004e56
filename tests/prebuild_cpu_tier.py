"""The kernels of the CPU tier's compile tests, compiled ahead in a background process at the lowest priority:
conftest.py starts it with the ids of the tests a run selects. Most of the CPU tier's time is nvcc, and most of
the time the tests leave a core idle (a test runs one nvcc, or none). Built here meanwhile, a test finds its
kernel in the kernel cache (TILESCALE_CACHE_DIR/kernels; tilelang's for tilescale.compile), or waits for the
one being built (toolchain.build_once's lock) instead of building it a second time.

    python tests/prebuild_cpu_tier.py IDS_FILE        # one test id a line: path::function

The lists below name each test's kernels with the arguments it builds them with. They only save time: a kernel
left out, or listed with other arguments than its test's (another cache key), is built by its test, only later.
Nothing here checks anything; a build that fails here is built again, and reported, by its test."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def _ring_tir():
    from example_ring_put import ring_put_kernel

    return ring_put_kernel.get_tir(64, 256, 4)


def _build(pf, **opts):
    import tilescale

    return lambda: tilescale.build(pf, **opts)


def abort():
    from tilescale import compiler

    return [(compiler.barrier_jit(), (2,))]


def allgather_cpu():
    from tilescale.ops.allgather import allgather_kernel

    return [(allgather_kernel, (4, 16, "bfloat16"))]


def build_link():
    tir = _ring_tir()
    return [_build(tir, target=SM90, build_mode="inlined"), _build(tir, target=SM90, build_mode="rdc")]


def codegen_every_op():
    from test_codegen import every_op

    return [_build(every_op.get_tir(), target=SM90, build_mode="inlined")]


def codegen_ring_compile():
    import tilescale

    tir = _ring_tir()
    return [lambda: tilescale.compile(tir)]         # tilelang's kernel cache (the JIT path), loaded without a GPU


def collectives():
    from test_collectives_cpu import SM90_CASES

    return [(fn, args) for fn, args, _ in SM90_CASES.values()]


def hierarchical():
    from test_hierarchical_cpu import CASES

    return [(fn, args) for fn, args, _ in CASES.values()]


def gemm_config():
    from test_gemm_config import build_jobs

    return list(build_jobs().values())


def profiler_timer():
    from test_profiler import timer_only

    from tilescale.toolchain import stub_libcuda_dir

    d = stub_libcuda_dir()
    return [_build(timer_only.get_tir(), target=SM90, compile_flags=[f"-L{d}"] if d else [])]


def profiler_ag_gemm():
    from test_profiler import AG_ARGS

    from tilescale.env import setting
    from tilescale.ops.allgather_gemm import ag_gemm_kernel as fn

    timeout = setting("TILESCALE_WAIT_TIMEOUT_S").default()   # its test clears the variable: the default bound
    pf = fn.get_tir(*AG_ARGS, profile=True)
    return [lambda: dataclasses.replace(fn, wait_timeout_s=timeout).build_tir(pf, target=SM90)]


def soak():
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak_collectives", ROOT / "benchmarks" / "soak_collectives.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.jobs(4, 132, mod.parse_args([])))


def example(module: str, kernel: str, *args):
    """The jobs of an example's test_*_compiles_for_sm90: `kernel` of tilescale.ops.`module` with its arguments."""
    def make():
        import importlib

        return [(getattr(importlib.import_module(f"tilescale.ops.{module}"), kernel), args)]

    make.__name__ = kernel
    return make


def ring_put_example():
    return [_build(_ring_tir(), target=SM90)]


def tp_layer():
    from example_tp_layer import fused_jobs

    return fused_jobs(2, 200, 512, 1024)


# (the tests that build them, the function listing them), in the order pytest runs the tests
GROUPS = (
    (["tests/test_abort.py::test_barrier_module_builds_with_its_host_entry"], abort),
    (["tests/test_allgather_cpu.py::test_direct_entry_matches_the_built_wrapper"], allgather_cpu),
    ([f"tests/test_build_link.py::{t}" for t in ("test_ring_builds_and_links", "test_ring_source",
                                                  "test_builds_against_nvshmem_home", "test_build_error_is_explained")],
     build_link),
    ([f"tests/test_codegen.py::{t}" for t in ("test_every_op_compiles_for_sm90",
                                               "test_generated_source_of_distributed_kernel")], codegen_every_op),
    (["tests/test_codegen.py::test_plain_kernel_after_distributed_one_is_untouched"], codegen_ring_compile),
    (["tests/test_collectives_cpu.py::test_kernel_builds_for_sm90"], collectives),
    (["tests/test_hierarchical_cpu.py::test_kernel_builds_for_sm90"], hierarchical),
    ([f"tests/test_gemm_config.py::{t}" for t in ("test_non_default_configs_build_in_the_fused_kernels",
                                                   "test_sweep_kernel_builds_with_the_stores_epilogue")], gemm_config),
    (["tests/test_profiler.py::test_timer_kernel_compiles_with_nvcc"], profiler_timer),
    (["tests/test_profiler.py::test_ag_gemm_with_timestamps_compiles"], profiler_ag_gemm),
    (["tests/test_soak.py::test_soak_kernels_build_for_sm90"], soak),
    (["examples/distributed/example_all_to_all.py::test_all_to_all_compiles_for_sm90"],
     example("all_to_all", "all_to_all_kernel", 8, 16)),
    (["examples/distributed/example_allgather.py::test_allgather_compiles_for_sm90"],
     example("allgather", "allgather_kernel", 4, 8, "float16")),
    (["examples/distributed/example_allgather_gemm.py::test_ag_gemm_compiles_for_sm90",
      "tests/test_ag_gemm_host_cpu.py::test_the_gemm_takes_its_direct_entry"],
     example("allgather_gemm", "ag_gemm_kernel", 512, 512, 4, 2, "float16")),
    (["examples/distributed/example_allgather_gemm.py::test_ag_gemm_compiles_for_sm90",
      "tests/test_ag_gemm_host_cpu.py::test_the_gemm_takes_its_direct_entry"],    # the GEMM of the own rows
     example("allgather_gemm", "ag_gemm_kernel", 512, 512, 4, 2, "float16", 128, 256, 64, 3, 256, 10, False,
             True)),
    (["tests/test_ag_gemm_host_cpu.py::test_the_gemm_takes_its_direct_entry"],   # world size 1, the last wave split
     example("allgather_gemm", "ag_gemm_kernel", 2752, 1024, 1, 0, "float16", 128, 256, 64, 3, 256, 10, False,
             True, 3, 44)),
    (["examples/distributed/example_allreduce.py::test_allreduce_compiles_for_sm90"],
     example("allreduce", "allreduce_two_shot_kernel", 4, 32, "float16")),
    (["examples/distributed/example_broadcast.py::test_broadcast_compiles_for_sm90"],
     example("broadcast_from_root", "broadcast_kernel", 4, 32)),
    (["examples/distributed/example_gemm_reducescatter.py::test_gemm_rs_compiles_for_sm90"],
     example("gemm_reduce_scatter", "gemm_rs_reduce_kernel", 512, 4, 512, 8, "float16")),
    (["examples/distributed/example_gemm_reducescatter.py::test_gemm_rs_push_kernel_compiles_for_sm90"],
     example("gemm_reduce_scatter", "gemm_rs_push_kernel", 512, 256, 4, "float16", 128, 256, 64, 3, 256, 10, 8)),
    (["examples/distributed/example_reduce_scatter.py::test_reduce_scatter_compiles_for_sm90"],
     example("reduce_scatter", "reduce_scatter_kernel", 8, 64, "float32")),
    (["examples/distributed/example_ring_put.py::test_ring_put_compiles_for_sm90"], ring_put_example),
    (["examples/distributed/example_tp_layer.py::test_tp_layer_kernels_compile_for_sm90"], tp_layer),
)


def selected_jobs(wanted: set[str]) -> dict:
    """build_pool jobs of the groups whose tests are `wanted` (elaborated here, in this thread)."""
    jobs = {}
    for tests, make in GROUPS:
        if not wanted & set(tests):
            continue
        try:
            made = make()
        except Exception as e:  # noqa: BLE001  (its tests report it)
            print(f"prebuild: {make.__name__}: {type(e).__name__}: {e}", flush=True)
            continue
        jobs.update({f"{make.__name__}:{i}": j for i, j in enumerate(made)})
    return jobs


def main(ids_file: str) -> int:
    wanted = set(Path(ids_file).read_text().split())
    if not any(wanted & set(tests) for tests, _ in GROUPS):
        return 0
    os.nice(19)                # only the CPU the tests leave idle (nvcc inherits it)
    for d in (ROOT / "tests", ROOT / "examples" / "distributed", ROOT / "benchmarks"):
        sys.path.insert(0, str(d))
    from build_pool import WORKERS, build_all

    # conftest.py ends the run with SIGTERM: builds not started are dropped, running ones finish (nothing is
    # left half-built); the same when pytest is gone (no test needs them any more)
    stop, started = threading.Event(), []

    def end(*_) -> None:
        stop.set()
        for b in started:
            b.cancel()

    signal.signal(signal.SIGTERM, end)
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        end()

    threading.Thread(target=orphaned, daemon=True).start()
    t0 = time.monotonic()
    jobs = selected_jobs(wanted)
    if stop.is_set():
        return 0
    builds = build_all(jobs, workers=WORKERS)
    started.append(builds)
    if stop.is_set():
        builds.cancel()
    for key in jobs:
        try:
            builds[key]
            print(f"prebuild: {key} ok at {time.monotonic() - t0:.0f} s", flush=True)
        except cf.CancelledError:
            print(f"prebuild: {key} cancelled", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"prebuild: {key} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
