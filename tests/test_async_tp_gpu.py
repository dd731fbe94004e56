"""GPU tier: PyTorch's own async-TP test cases against tilescale's drop-ins, at 2 and 4 ranks
(tests/gpu/async_tp_main.py: values against torch on every rank's data, layouts against torch's op, and where every
rank has a GPU of its own, torch.ops.symm_mem's results and a TP group of 2 sent to torch's op). The CPU side:
tests/test_async_tp_cpu.py. Inductor's pass on tilescale: examples/distributed/example_inductor_async_tp.py."""
import re
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"
CASES = 24          # the cases of async_tp_main.py, the subgroup's excluded


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_pytorch_async_tp_cases_on_the_drop_ins(nranks):
    testing.skip_unless_ranks(nranks)   # fewer GPUs than ranks: the ranks share GPUs (torch's op then not run)
    proc = testing.launch(GPU / "async_tp_main.py", nranks, timeout=500)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: async-TP cases")
    out = proc.stdout
    subgroup = nranks == 4 and not testing.shared_gpus(nranks)
    want = CASES + subgroup
    got = {int(r): int(n) for r, n in re.findall(r"\[rank (\d+)\] OK: async-TP cases, (\d+) cases", out)}
    assert got == {r: want for r in range(nranks)}, out[-4000:]
    if not testing.shared_gpus(nranks):     # distinct GPUs: every case also compared with torch.ops.symm_mem
        assert "torch.ops.symm_mem not run" not in out, out[-4000:]
