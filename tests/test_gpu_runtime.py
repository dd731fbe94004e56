"""GPU tier: runtime behaviour that needs real GPUs (bad input on every rank, injected hang, lazy
loading). Each test launches a script under tests/gpu with launch.sh; skipped without enough GPUs."""
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


def need(n):
    if testing.gpu_count() < n:
        pytest.skip(f"needs {n} GPUs, found {testing.gpu_count()}")


@pytest.mark.multigpu
def test_bad_input_matrix_two_ranks():
    need(2)
    proc = testing.launch(GPU / "bad_input_main.py", 2, timeout=300)
    testing.assert_all_ranks_ok(proc, 2, marker="OK: bad-input matrix")
    for case in ("init_distributed twice", "different sizes", "non-symmetric", "peer index", "world size differs",
                 "symmetric heap exhausted", "freeing twice", "AllGather shape differs", "AllGather dtype differs",
                 "AGGemm shape differs", "AGGemm dtype differs"):
        assert proc.stdout.count(f"OK: {case}") == 2, f"case '{case}' not OK on both ranks\n{proc.stdout[-4000:]}"
    assert proc.stdout.count("OK: kernel built for sm_") == 4, "two other GPU archs on both ranks\n" + proc.stdout[-4000:]


@pytest.mark.multigpu
def test_injected_hang_times_out_with_diagnostics():
    need(2)
    proc = testing.launch(GPU / "hang_main.py", 2, timeout=240, env={"TILESCALE_WAIT_TIMEOUT_S": "3"})
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "RAISED WaitTimeoutError" in out and "rank 0, block" in out and "hang_main.py" in out, out[-3000:]
    assert "it was 0" in out and "== 12345" in out, out[-3000:]
    assert "rank 1 stops: rank 0 failed" in out, out[-3000:]
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
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: all 5 primitives examples")
