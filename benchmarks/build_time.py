"""How long kernels take to build, cold (fresh caches), on this machine, and where the time goes. No GPU needed
(compile-only builds: tilescale.build, tilescale.build_all), so it runs on a build machine and on a GPU host alike.

    python benchmarks/build_time.py                          # one AG+GEMM kernel, then a batch at 1 and at C workers
    python benchmarks/build_time.py --steps --repeat 3       # each step of an AG+GEMM and a GEMM+RS kernel's build
    python benchmarks/build_time.py --steps --collectives --rdc   # also nvcc with NVSHMEM's collectives, and rdc
    python benchmarks/build_time.py --kernels 8 --workers 1 2 4 8

1. one AG+GEMM kernel (the GEMM of the other ranks' rows, M x N x K = 4096 x 2048 x 8192 over 4 ranks, bf16,
   sm_90a): seconds for tilescale.build;
2. with --steps, that kernel and GEMM+RS's first kernel of the same problem, the median of --repeat builds:
   * wall seconds in Python: elaboration (get_tir); tilelang's lowering, split into its TVM passes (tvm's
     PassTimingInstrument, top-level passes) and the rest (CUDA code generation and tilelang's Python around the
     passes); the whole tilescale.build (lowering, host wrapper, nvcc, caches);
   * CPU seconds of each step of tilelang's nvcc command for the kernel's library source, run one by one from
     ``nvcc --dryrun`` (the other load of a shared machine does not count): the host pass (preprocessor, cudafe++,
     host compiler: the cython wrapper and launch stubs), the device pass (preprocessor, cicc: C++ front end and
     NVVM, ptxas), fatbinary, the links (nvlink; the host link, with libnvshmem_host). --collectives: the same
     source with NVSHMEM's collective API in (as before codegen.py left it out of kernels that call none); --rdc:
     the kernel built in the rdc mode (its nvlink links libnvshmem_device.a);
   * loading: dlopen of the library in a fresh process (its static constructors). Loading it on a GPU
     (cudaFuncSetAttribute, tilescale_module_init) needs one and is not measured here;
3. a batch of AG+GEMM kernels (distinct shapes), built by tilescale.build_all with each --workers count, each time
   into fresh caches: N kernels on C workers should take about N / C times one.

Prints tables; --json FILE also writes the numbers. Each build goes to a temporary cache that is removed after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SM90 = {"kind": "cuda", "arch": "sm_90a"}
M, N, K, W = 4096, 2048, 8192, 4


def fresh_caches() -> str:
    d = tempfile.mkdtemp(prefix="tilescale-build-time-")
    os.environ["TILESCALE_CACHE_DIR"] = os.path.join(d, "ts")
    os.environ["TILELANG_CACHE_DIR"] = os.path.join(d, "tl")
    return d


def jobs(n: int) -> list:
    """n distinct AG+GEMM kernels (the others' rows GEMM of n shapes)."""
    from tilescale.ops import allgather_gemm as agm

    return [agm.kernels(M + 512 * i, N, K, W, "bfloat16")[1] for i in range(n)]


def step_kernels() -> dict:
    from tilescale.ops import allgather_gemm as agm
    from tilescale.ops import gemm_reduce_scatter as grs

    return {"AG+GEMM": agm.kernels(M, N, K, W, "bfloat16")[1], "GEMM+RS": grs.kernels(M, N, K // W, W, "bfloat16")[0]}


def one_kernel() -> float:
    import tilescale

    d = fresh_caches()
    try:
        t0 = time.monotonic()
        tilescale.build_all(jobs(1), target=SM90, progress=False)
        return round(time.monotonic() - t0, 1)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def lowering_seconds(func) -> tuple[float, float]:
    """(seconds in tilelang's top-level TVM passes, seconds in the rest of its lowering) of distributed `func`,
    lowered as tilescale.build lowers it."""
    from tilelang import tvm
    from tvm.ir.instrument import PassTimingInstrument
    from tvm.target import Target

    from tilescale import compat
    from tilescale.compilation import codegen

    tgt = Target(SM90, "c")
    timing = PassTimingInstrument()
    with codegen.distributed_build("inlined"), tvm.transform.PassContext(opt_level=3, instruments=[timing]), tgt:
        t0 = time.monotonic()
        compat.lower(func, tgt)
        total = time.monotonic() - t0
        report = timing.render()
    passes = top_level_pass_seconds(report)
    return passes, total - passes


def top_level_pass_seconds(report: str) -> float:
    """Seconds of the top-level passes (lines not indented) of a PassTimingInstrument report."""
    return sum(int(us) for us in re.findall(r"^[^\t\n][^\n]*?: (\d+)us \[", report, re.M)) / 1e6


_STEP = {"cudafe++": "host pass: cudafe++", "cicc": "device pass: cicc", "ptxas": "device pass: ptxas",
         "fatbinary": "fatbinary", "nvlink": "nvlink", "g++": "host link"}


def _step_name(line: str) -> str | None:
    tool = line.split()[0].strip('"').rsplit("/", 1)[-1]
    if tool == "gcc":
        if " -E " in line:
            return "device pass: preprocessor" if "-D__CUDA_ARCH__" in line else "host pass: preprocessor"
        return "host pass: host compiler" if "cudafe1.cpp" in line else "host link"
    return None if tool == "rm" else _STEP.get(tool, tool)


def dryrun_steps(stderr: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(shell lines setting nvcc's variables, [(step name, command)]) of ``nvcc --dryrun``'s output."""
    env_lines, steps = [], []
    for line in (ln[3:] for ln in stderr.splitlines() if ln.startswith("#$ ")):
        m = re.match(r"^([A-Za-z_]+)=(.*)$", line)
        if m:
            env_lines.append(f'export {m.group(1)}="{m.group(2).replace(chr(34), "")}"')
        elif (name := _step_name(line)) is not None:
            steps.append((name, line))
    return env_lines, steps


def nvcc_steps(source: Path, flags, strip: str = "") -> dict:
    """CPU seconds of each step of tilelang's nvcc command (jit/adapter/libgen.py) for `source` (less its first
    line if that is `strip`) with `flags`, run one by one (nvcc --dryrun)."""
    from tilelang.contrib.nvcc import get_cuda_library_dirs, get_nvcc_compiler
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    work = Path(tempfile.mkdtemp(prefix="tilescale-steps-"))
    try:
        src = work / "kernel.cu"
        text = source.read_text()
        src.write_text(text[len(strip):] if strip and text.startswith(strip) else text)
        cmd = [get_nvcc_compiler(), "-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo", "--shared",
               str(src), *[f"-L{d}" for d in get_cuda_library_dirs()], "-lcuda", "-gencode",
               "arch=compute_90a,code=sm_90a", "--compiler-options", "-fPIC", "-I" + CUTLASS_INCLUDE_DIR,
               "-I" + TILELANG_TEMPLATE_PATH, *flags, "-o", str(work / "kernel.so")]
        # nvcc's temporaries, and the files its steps write their output to (--threads), in `work` (removed after)
        dry = subprocess.run([*cmd, "--dryrun", "--keep", "--keep-dir", str(work)], capture_output=True, text=True,
                             env={**os.environ, "TMPDIR": str(work)})
        env_lines, steps = dryrun_steps(dry.stderr)
        totals = defaultdict(float)
        for name, line in steps:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run(["bash", "-c", "\n".join([*env_lines, line])], capture_output=True, text=True)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode:
                raise RuntimeError(f"nvcc step failed: {line[:200]}\n{p.stderr[-2000:]}")
            totals[name] += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        totals["all nvcc steps"] = sum(totals.values())
        return dict(totals)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def dlopen_seconds(library: str) -> float:
    code = f"import ctypes, time; t = time.perf_counter(); ctypes.CDLL({library!r}); print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def kernel_steps(fn, args, repeat: int, collectives: bool, rdc: bool) -> dict:
    """{step: [wall or CPU seconds of each of `repeat` cold builds]} of ``fn(*args)``."""
    import tilescale
    from tilescale.compilation import codegen

    rows = defaultdict(list)
    for _ in range(repeat):
        d = fresh_caches()
        try:
            t0 = time.monotonic()
            func = fn.get_tir(*args)
            rows["elaboration (wall)"].append(time.monotonic() - t0)
            passes, rest = lowering_seconds(func)
            rows["lowering: TVM passes (wall)"].append(passes)
            rows["lowering: CUDA code generation and the rest (wall)"].append(rest)
            t0 = time.monotonic()
            r = fn.build_tir(func, target=SM90)
            rows["tilescale.build, cold (wall)"].append(time.monotonic() - t0)
            source = Path(r.library).with_suffix(".cu")
            for k, v in nvcc_steps(source, r.flags).items():
                rows[f"nvcc {k} (CPU)"].append(v)
            if collectives:
                for k, v in nvcc_steps(source, r.flags, strip=codegen.NO_COLLECTIVES_LINE).items():
                    rows[f"with NVSHMEM's collectives: nvcc {k} (CPU)"].append(v)
            if rdc:
                rr = tilescale.build(func, target=SM90, pass_configs=fn.pass_configs, compile_flags=fn.compile_flags,
                                     build_mode="rdc")
                for k, v in nvcc_steps(Path(rr.library).with_suffix(".cu"), rr.flags).items():
                    rows[f"rdc mode: nvcc {k} (CPU)"].append(v)
            rows["loading: dlopen (wall)"].append(dlopen_seconds(r.library))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return rows


def batch(n: int, workers: int) -> float:
    import tilescale

    d = fresh_caches()
    try:
        t0 = time.monotonic()
        tilescale.build_all(jobs(n), target=SM90, workers=workers, progress=False)
        return round(time.monotonic() - t0, 1)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", action="store_true", help="each step of an AG+GEMM and a GEMM+RS kernel's build")
    ap.add_argument("--repeat", type=int, default=1, help="builds per kernel for --steps (medians shown)")
    ap.add_argument("--collectives", action="store_true", help="--steps: also nvcc with NVSHMEM's collective API")
    ap.add_argument("--rdc", action="store_true", help="--steps: also nvcc of the rdc build mode")
    ap.add_argument("--kernels", type=int, default=None, help="kernels in the batch (default: 2 x the cores; 0: none)")
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (default: 1 and the cores)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tilescale.batch import workers_for

    cores = workers_for(1 << 20)
    n = 2 * cores if a.kernels is None else a.kernels
    counts = a.workers or sorted({1, cores})
    res = {"machine": f"{platform.node()} ({os.cpu_count()} CPUs, TILESCALE_BUILD_JOBS default {cores})",
           "load_average_before": os.getloadavg()[0], "one_kernel_s": one_kernel(), "steps": {}, "batch": {}}
    print(f"{res['machine']}\none AG+GEMM kernel, cold: {res['one_kernel_s']} s")
    if a.steps:
        for name, (fn, args) in step_kernels().items():
            rows = kernel_steps(fn, args, a.repeat, a.collectives, a.rdc)
            res["steps"][name] = {k: [round(x, 3) for x in v] for k, v in rows.items()}
        names = list(res["steps"])
        print(f"\nmedian of {a.repeat} cold build(s), seconds  | " + " | ".join(f"{x:>8s}" for x in names))
        for step in res["steps"][names[0]]:
            meds = [statistics.median(res["steps"][x][step]) if step in res["steps"][x] else float("nan")
                    for x in names]
            print(f"  {step:62s} | " + " | ".join(f"{m:8.2f}" for m in meds))
    for w in counts if n else []:
        res["batch"][w] = batch(n, w)
        print(f"{n} kernels on {w} worker(s): {res['batch'][w]} s  ({res['batch'][w] / n:.1f} s per kernel)")
    res["load_average_after"] = os.getloadavg()[0]
    print(f"load average: {res['load_average_before']:.1f} before, {res['load_average_after']:.1f} after "
          "(other work on the machine slows every wall number)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
