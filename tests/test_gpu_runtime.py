"""GPU tier: runtime behaviour that needs real GPUs (bad input on every rank, injected hang, lazy
loading). Each test launches a script under tests/gpu with launch.sh; skipped without enough GPUs."""
import collections
import os
import re
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


def need(n):
    testing.skip_unless_ranks(n)   # fewer GPUs than ranks: the ranks share GPUs


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_bad_input_matrix(nranks):
    need(nranks)
    proc = testing.launch(GPU / "bad_input_main.py", nranks, timeout=500)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: bad-input matrix")
    out = proc.stdout
    m = re.search(r"\[rank 0\] OK: bad-input matrix, (\d+) cases", out)
    assert m and int(m.group(1)) >= 30, out[-4000:]
    cases = collections.Counter(re.findall(r"\[rank \d+\] OK: ([^:\n\[]+): ", out))
    wrong = {c: n for c, n in cases.items() if n != nranks}
    assert not wrong, f"cases not OK once per rank: {wrong}\n{out[-4000:]}"
    assert len(cases) >= 30, sorted(cases)
    for case in ("init_distributed twice", "different sizes", "non-symmetric", "peer index", "world size differs",
                 "symmetric heap exhausted", "freeing twice", "AllGather shape differs", "AllGather dtype differs",
                 "AGGemm shape differs", "AGGemm dtype differs", "AllGather int shape", "AGGemm int8", "GemmRS K=0",
                 "symm.empty float size", "AGGemm out shape", "AGGemm b not contiguous", "AllGather x on the CPU",
                 "all_gather on the CPU", "AllGather out bad on rank 1 only"):
        assert out.count(f"OK: {case}") == nranks, f"case '{case}' not OK on every rank\n{out[-4000:]}"
    assert out.count("OK: kernel built for sm_") == 2 * nranks, "two other GPU archs on every rank\n" + out[-4000:]
    assert out.count("OK: good calls after the matrix") == nranks, out[-4000:]


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_injected_hang_times_out_with_diagnostics(nranks):
    need(nranks)
    proc = testing.launch(GPU / "hang_main.py", nranks, timeout=240, env={"TILESCALE_WAIT_TIMEOUT_S": "3"})
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "RAISED WaitTimeoutError" in out and "rank 0, block" in out and "hang_main.py" in out, out[-3000:]
    assert "it was 0" in out and "== 12345" in out, out[-3000:]
    for r in range(1, nranks):
        assert f"rank {r} stops: rank 0 failed" in out, out[-3000:]
    assert "UNEXPECTED" not in out


@pytest.mark.gpu
def test_spin_wait_with_lazy_module_loading():
    need(1)
    proc = testing.launch(GPU / "lazy_main.py", 1, timeout=240, env={"CUDA_MODULE_LOADING": "LAZY"})
    testing.assert_all_ranks_ok(proc, 1)
    assert "CUDA_MODULE_LOADING=LAZY" in proc.stdout


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_all_primitives(nranks):
    need(nranks)
    proc = testing.launch(GPU / "primitives_main.py", nranks, timeout=500)
    node_size = int(os.environ.get("TILESCALE_NODE_SIZE") or nranks)   # emulated nodes split the remote view's ring
    testing.assert_all_ranks_ok(proc, nranks, marker=f"OK: all {5 if nranks <= node_size else 4} primitives examples")
