"""Compile-only runs of scripts that are not examples (tilescale.compilation.compile_only): the kernels a script
reaches are built, then the run stops where it needs a GPU and says where; a real error still fails. The README's
Quickstart, saved as a file and started by the launcher, is tests/test_readme.py's."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tilescale import testing

pytestmark = pytest.mark.skipif(testing.gpu_count() > 0, reason="this machine has GPUs: scripts would run")

SCRIPT = '''
import sys
import torch
import tilescale
import tilescale.language as T


@tilescale.jit(out_idx=[1])
def double(n: int):
    @T.prim_func
    def kernel(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(n):
                y[i] = x[i] * 2.0
    return kernel


mode = sys.argv[1]
info = tilescale.init_distributed()
print(f"RANK {info.rank} OF {info.world_size} LOCAL {info.local_world_size}", flush=True)
if mode == "ops":
    tilescale.ops.AllGather((1024,), torch.bfloat16)          # STOP ops
x = torch.ones(128, device="cuda")
buf = tilescale.symm.zeros((4, 8), dtype=torch.bfloat16)
print(f"META {x.device} {tuple(buf.shape)} {buf.dtype} {buf.device}", flush=True)
if mode == "error":
    undefined_name                                             # a bug of the script: not a stop
y = double(128)(x)
print(f"OUT {tuple(y.shape)} {y.dtype} {y.device}", flush=True)
tilescale.synchronize()
tilescale.barrier()
if mode == "sync":
    torch.cuda.synchronize()                                   # STOP sync
print(y.sum().item())                                          # STOP data
'''


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "TMPDIR": str(tmp_path / "tmp"),
           "TILESCALE_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "tilescale.compilation.compile_only", str(script), mode],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))


def _stop_line(mode: str) -> int:
    return next(i for i, ln in enumerate(SCRIPT.splitlines(), 1) if ln.rstrip().endswith(f"# STOP {mode}"))


@pytest.mark.parametrize("mode,what", [("data", "reading a tensor's data (tensor.item())"),
                                       ("sync", "CUDA's initialisation (torch.cuda)")])
def test_a_script_builds_what_it_reaches_and_stops_where_it_needs_a_gpu(tmp_path, mode, what):
    r = _run(tmp_path, mode)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "RANK 0 OF 4 LOCAL 2" in r.stdout, out                       # rank 0 of WORLD_SIZE, nothing started
    assert "META meta (4, 8) torch.bfloat16 meta" in r.stdout, out      # CUDA and symmetric tensors: meta
    assert "OUT (128,) torch.float32 meta" in r.stdout, out             # the kernel's out_idx output, as meta
    built = [ln for ln in r.stdout.splitlines() if ln.startswith("compile-only: built double for world size 4: ")]
    assert len(built) == 1, out
    lib = built[0].rsplit(": ", 1)[1]
    assert lib.startswith(str(tmp_path / "cache" / "kernels")) and os.path.getsize(lib) > 0, lib
    stop = f"compile-only: stopped at {tmp_path / 'script.py'}:{_stop_line(mode)}: "
    assert stop in r.stdout and f"{what} needs a GPU" in r.stdout and "(1 kernel(s) built before it)" in r.stdout, out
    assert not list((tmp_path / "tmp").iterdir()), "the build left files in TMPDIR"


def test_the_ops_stop_the_run_where_they_need_the_runtime(tmp_path):
    r = _run(tmp_path, "ops")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"stopped at {tmp_path / 'script.py'}:{_stop_line('ops')}: " in r.stdout, r.stdout
    assert "the tilescale runtime" in r.stdout and "(0 kernel(s) built before it)" in r.stdout, r.stdout


def test_a_bug_of_the_script_still_fails(tmp_path):
    r = _run(tmp_path, "error")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NameError: name 'undefined_name' is not defined" in r.stderr and "stopped at" not in r.stdout


def test_a_module_and_bad_invocations(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "prog.py").write_text("import sys, tilescale\ninfo = tilescale.init_distributed()\n"
                                 "print('MODULE', sys.argv[1:], info.world_size)\n")
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "tilescale.compilation.compile_only", *args], capture_output=True,
                              text=True, timeout=120, env=env, cwd=str(tmp_path))

    r = run("-m", "pkg.prog", "a", "b")
    assert r.returncode == 0 and "MODULE ['a', 'b'] 2" in r.stdout, r.stdout + r.stderr
    r = run("-u", "x.py")
    assert r.returncode == 2 and "interpreter option '-u'" in r.stderr, r.stderr
    r = run()
    assert r.returncode == 2 and "usage: python -m tilescale.compilation.compile_only" in r.stderr, r.stderr
