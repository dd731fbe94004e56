"""benchmarks/build_time.py's step table, on CPU without building: every step of the installed nvcc's command for a
library (``nvcc --dryrun``) is named, and the lowering's TVM passes are read from tvm's pass timing report. The
measurement itself: ``python benchmarks/build_time.py --steps`` (docs/compile-time.md)."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("build_time", REPO / "benchmarks" / "build_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_nvcc_step_of_a_library_build_is_named(bench, tmp_path):
    from tilescale.toolchain import nvcc_path

    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    cmd = [nvcc_path(), "-std=c++20", "-lineinfo", "--shared", "k.cu", "-gencode", "arch=compute_90a,code=sm_90a",
           "--compiler-options", "-fPIC", "--threads=2", "-o", "k.so", "--dryrun"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True)
    _, steps = bench.dryrun_steps(r.stderr)
    names = {name for name, _ in steps}
    assert names == {"host pass: preprocessor", "host pass: cudafe++", "host pass: host compiler",
                     "device pass: preprocessor", "device pass: cicc", "device pass: ptxas", "fatbinary", "nvlink",
                     "host link"}


def test_top_level_passes_are_summed(bench, monkeypatch):
    report = ("tl.LayoutInference: 150000us [150000us] (8.07%; 8.07%)\ntl.LowerTileOp: 200000us [199000us] (1%; 1%)\n"
              "\ttl.Simplify: 1000us [1000us] (0.02%; 0.11%)\npass_fn: 650us [650us] (0.05%; 0.05%)\n")
    assert bench.top_level_pass_seconds(report) == pytest.approx(0.35065)
