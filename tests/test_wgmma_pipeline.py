"""The debug-mode waits must not slow the GEMM down: any call (or printf) in a kernel makes ptxas serialise
its wgmma pipeline (warning C7510), which cost the AG+GEMM GEMM up to a quarter of its speed on H200 while
TILESCALE_WAIT_TIMEOUT_S was on. Builds AG+GEMM with a wait timeout and checks ptxas's verbose report.
tilelang's build does not capture nvcc's output, so the build runs in a child process whose stderr is read,
with an empty kernel cache of its own (a library found in the cache would be returned without running ptxas)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

BUILD = textwrap.dedent("""
    import tilescale
    from tilescale.ops.allgather_gemm import kernels
    _, (ag_gemm_kernel, args) = kernels(2048, 2048, 1024, 2, "bfloat16")   # the GEMM whose tiles wait
    pf = ag_gemm_kernel.get_tir(*args)
    tilescale.build(pf, compile_flags=["-Xptxas=-v"], wait_timeout_s=30)
""")


def ptxas_report(tmp_path, code: str, *argv: str) -> str:
    """What a child Python running `code` (a build with -Xptxas=-v) prints, with an empty kernel cache of its own."""
    env = dict(os.environ, TILESCALE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    return r.stdout


def test_wait_timeout_keeps_the_wgmma_pipeline_of_ag_gemm(tmp_path):
    out = ptxas_report(tmp_path, BUILD)
    assert "Compiling entry function 'ag_gemm_kernel'" in out, "ptxas -v output not seen:\n" + out[-2000:]
    assert "C7510" not in out, "the wgmma pipeline is serialised:\n" + \
        "\n".join(ln for ln in out.splitlines() if "C75" in ln or "stack frame" in ln)
    assert "0 bytes stack frame" in out   # no call left behind in the kernel


RDC_BUILD = textwrap.dedent("""
    import sys
    import tilescale
    from tilescale.ops import allgather_gemm, gemm_reduce_scatter
    if sys.argv[1] == "ag_gemm":
        _, (fn, args) = allgather_gemm.kernels(2048, 2048, 1024, 2, "bfloat16")   # the GEMM whose tiles wait
    else:
        ((fn, args),) = gemm_reduce_scatter.kernels(2048, 1024, 512, 4, "bfloat16", path="push")
    tilescale.build(fn.get_tir(*args), build_mode="rdc", compile_flags=["-Xptxas=-v"])
""")


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])   # GEMM+RS: its push kernel
def test_fused_gemms_make_no_nvshmem_call_in_the_rdc_mode(tmp_path, op):
    """Under -rdc=true a call into libnvshmem_device serialises the kernel's wgmma (C7509): the GEMM with T.quiet ran
    at 0.80 of tilelang, the same GEMM with a flag store (no call, C7504 only) at 0.97 (docs/rdc-lto.md). The fused
    ops' GEMM kernels signal with tilescale's own inline primitives, so the rdc mode keeps their pipeline."""
    out = ptxas_report(tmp_path, RDC_BUILD, op)
    assert "Compiling entry function" in out, "ptxas -v output not seen:\n" + out[-2000:]
    notes = "\n".join(ln for ln in out.splitlines() if "C75" in ln)
    assert "C7509" not in out and "C7510" not in out, f"{op}: wgmma serialised in the rdc mode:\n{notes}"
