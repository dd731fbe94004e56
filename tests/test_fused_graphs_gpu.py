"""GPU tier: CUDA graphs of the fused ops on 2 and 4 ranks (tests/gpu/fused_graphs_main.py): AG+GEMM and GEMM+RS
captured together, replayed with new inputs and poisoned outputs, eager calls between, against torch. The CPU
side (their kernels count on the device or wait for flags set to 1): tests/test_graphs_cpu.py."""
import re
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_fused_ops_replay_from_cuda_graphs(nranks):
    testing.skip_unless_ranks(nranks)   # fewer GPUs than ranks: the ranks share GPUs
    proc = testing.launch(GPU / "fused_graphs_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: fused graphs")
    replays = [int(m) for m in re.findall(r"OK: fused graphs: .* replayed (\d+) times", proc.stdout)]
    assert replays == [300] * nranks, proc.stdout[-4000:]
