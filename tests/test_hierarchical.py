"""GPU tier: the hierarchical collectives, the cross-node AG+GEMM / GEMM+RS, the selector's choice and CUDA graphs
of the hierarchical AllGather (200 replays) on 4 ranks in emulated nodes of 2 (TILESCALE_NODE_SIZE=2: peers on the
other node reached through NVSHMEM's API); every rank checks itself against torch (tests/gpu/hierarchical_main.py).
Skipped without a GPU (the 4 ranks may share one). CPU side: tests/test_hierarchical_cpu.py."""
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [4])          # the GPU tier's --ranks 4 part selects it
def test_hierarchical_collectives_on_emulated_nodes(nranks):
    testing.skip_unless_ranks(nranks)
    proc = testing.launch(GPU / "hierarchical_main.py", nranks, timeout=400, env={"TILESCALE_NODE_SIZE": "2",
                                                                                  "HIER_GRAPH_REPLAYS": "200"})
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: hierarchical collectives on 2 emulated nodes of 2")
    out = proc.stdout
    for part in ("hierarchical allgather,", "hierarchical reduce_scatter", "hierarchical ag_gemm and gemm_rs",
                 "selector picked tilescale.allgather.hierarchical", "hierarchical allgather graph replayed 200 times"):
        assert out.count(f"OK: {part}") == nranks, f"'{part}' not OK on every rank\n{out[-4000:]}"
