"""How long kernels take to build, cold (fresh caches), on this machine: no GPU needed (compile-only builds,
tilescale.build_all), so it runs on a build machine and on a GPU host alike.

    python benchmarks/build_time.py                      # one AG+GEMM kernel, then a batch at 1 and at C workers
    python benchmarks/build_time.py --phases             # also the CPU seconds of each nvcc phase of that kernel
    python benchmarks/build_time.py --kernels 8 --workers 1 2 4 8

1. one AG+GEMM kernel (the GEMM of the other ranks' rows, M x N x K = 4096 x 2048 x 8192 over 4 ranks, bf16):
   seconds for tilescale.build, and with --phases each nvcc phase run on its own from ``nvcc --dryrun`` (CPU seconds:
   a shared machine's other load does not count);
2. a batch of AG+GEMM kernels (distinct shapes), built by tilescale.build_all with each --workers count, each time
   into fresh caches: N kernels on C workers should take about N / C times one.

Prints a table; --json FILE also writes the numbers. Each build goes to a temporary cache that is removed after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def fresh_caches() -> str:
    d = tempfile.mkdtemp(prefix="tilescale-build-time-")
    os.environ["TILESCALE_CACHE_DIR"] = os.path.join(d, "ts")
    os.environ["TILELANG_CACHE_DIR"] = os.path.join(d, "tl")
    return d


def jobs(n: int) -> list:
    """n distinct AG+GEMM kernels (the others' rows GEMM of n shapes)."""
    from tilescale.ops import allgather_gemm as agm

    return [agm.kernels(4096 + 512 * i, 2048, 8192, 4, "bfloat16")[1] for i in range(n)]


def one_kernel(phases: bool) -> dict:
    import tilescale

    d = fresh_caches()
    try:
        t0 = time.monotonic()
        [r] = tilescale.build_all(jobs(1), target=SM90, progress=False)
        out = {"seconds": round(time.monotonic() - t0, 1)}
        if phases:
            out["nvcc_phases_cpu_s"] = nvcc_phases(Path(r.library).with_suffix(".cu"), r.flags)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


def nvcc_phases(source: Path, flags) -> dict:
    """CPU seconds of each phase of tilelang's nvcc command for `source`, run one by one (nvcc --dryrun)."""
    from tilelang.contrib.nvcc import get_nvcc_compiler
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    work = Path(tempfile.mkdtemp(prefix="tilescale-phases-"))
    try:
        src = work / "kernel.cu"
        shutil.copyfile(source, src)
        cmd = [get_nvcc_compiler(), "-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo", "--shared",
               str(src), "-lcuda", "-gencode", "arch=compute_90a,code=sm_90a", "--compiler-options", "-fPIC",
               "-I" + CUTLASS_INCLUDE_DIR, "-I" + TILELANG_TEMPLATE_PATH, *flags, "-o", str(work / "kernel.so")]
        dry = subprocess.run([*cmd, "--dryrun", "--keep", "--keep-dir", str(work)], capture_output=True, text=True)
        env_lines, totals = [], {}
        for line in (ln[3:] for ln in dry.stderr.splitlines() if ln.startswith("#$ ")):
            m = re.match(r"^([A-Za-z_]+)=(.*)$", line)
            if m:
                env_lines.append(f'export {m.group(1)}="{m.group(2).replace(chr(34), "")}"')
                continue
            tool = line.split()[0].strip('"').rsplit("/", 1)[-1]
            if tool == "rm":
                continue
            name = {"gcc": "host compiler", "g++": "link", "cudafe++": "cudafe++ (host front end)",
                    "cicc": "cicc (device front end + NVVM)"}.get(tool, tool)
            if tool == "gcc":
                name = ("preprocessor, device pass" if "-D__CUDA_ARCH__" in line else "preprocessor, host pass") \
                    if " -E " in line else "host compiler"
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run(["bash", "-c", "\n".join([*env_lines, line])], capture_output=True, text=True)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode:
                raise RuntimeError(f"nvcc phase failed: {line[:200]}\n{p.stderr[-2000:]}")
            totals[name] = round(totals.get(name, 0) + (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), 2)
        totals["total"] = round(sum(totals.values()), 2)
        return totals
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    ap.add_argument("--phases", action="store_true", help="the CPU seconds of each nvcc phase of the one kernel")
    ap.add_argument("--kernels", type=int, default=None, help="kernels in the batch (default: 2 x the cores)")
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (default: 1 and the cores)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tilescale.batch import workers_for

    cores = workers_for(1 << 20)
    n = a.kernels or 2 * cores
    counts = a.workers or sorted({1, cores})
    res = {"machine": f"{platform.node()} ({os.cpu_count()} CPUs, TILESCALE_BUILD_JOBS default {cores})",
           "load_average_before": os.getloadavg()[0], "one_kernel": one_kernel(a.phases), "batch": {}}
    print(f"one AG+GEMM kernel, cold: {res['one_kernel']['seconds']} s")
    for name, s in res["one_kernel"].get("nvcc_phases_cpu_s", {}).items():
        print(f"    {name:34s} {s:6.2f} s CPU")
    for w in counts:
        res["batch"][w] = batch(n, w)
        print(f"{n} kernels on {w} worker(s): {res['batch'][w]} s  ({res['batch'][w] / n:.1f} s per kernel)")
    res["load_average_after"] = os.getloadavg()[0]
    print(f"load average: {res['load_average_before']:.1f} before, {res['load_average_after']:.1f} after "
          "(other work on the machine slows every number)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
