"""GPU tier: CUDA graphs of the collectives on 2 and 4 ranks (tests/gpu/graphs_main.py): 1,000 replays of a
captured AllGather x3 + AllReduce + ReduceScatter step with new inputs and poisoned outputs, a second graph of
AllToAll, Broadcast, Reduce and AllReduce x2, eager calls between replays, 100 replays of a captured AllGather
of 1 MiB per rank that enter no Python function of tilescale (eager calls of it do), and captured
tilescale.distributed calls served by tilescale; then AG+GEMM with GEMM+RS captured together
(tests/gpu/fused_graphs_main.py: 300 replays against torch, eager calls between). The CPU side:
tests/test_graphs_cpu.py."""
import re
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


def replays_by_rank(out: str, what: str) -> dict:
    """{rank: N} of the "[rank R] OK: <what>: ... replayed N times" lines (ranks printing side by side may
    join two of them on one line: each is found by its rank)."""
    line = rf"\[rank (\d+)\] OK: {re.escape(what)}\b.*?replayed (\d+) times"
    return {int(r): int(n) for r, n in re.findall(line, out)}


def test_replays_are_found_per_rank_on_joined_lines():
    out = ("[rank 1] OK: fused graphs: x, replayed 300 times y (node size 1)[rank 0] OK: fused graphs: x, replayed 300 "
           "times y\n[rank 2] OK: fused graphs: x, replayed 299 times\n")
    assert replays_by_rank(out, "fused graphs") == {0: 300, 1: 300, 2: 299}


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_collectives_replay_from_cuda_graphs(nranks):
    testing.skip_unless_ranks(nranks)   # fewer GPUs than ranks: the ranks share GPUs
    proc = testing.launch(GPU / "graphs_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: graphs on")
    out = proc.stdout
    assert replays_by_rank(out, "graphs: graph 1") == {r: 1000 for r in range(nranks)}, out[-4000:]
    assert out.count("OK: graphs: graph 2") == nranks, out[-4000:]
    assert out.count("OK: graphs: tilescale.distributed calls captured") == nranks, out[-4000:]
    # replays of a captured AllGather of 1 MiB enter no Python function of tilescale (eager calls do)
    assert len(re.findall(r"OK: graphs: a captured AllGather of 1 MiB per rank replayed 100 times with no Python "
                          r"call into tilescale", out)) == nranks, out[-4000:]


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_fused_ops_replay_from_cuda_graphs(nranks):
    testing.skip_unless_ranks(nranks)   # fewer GPUs than ranks: the ranks share GPUs
    proc = testing.launch(GPU / "fused_graphs_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: fused graphs")
    assert replays_by_rank(proc.stdout, "fused graphs") == {r: 300 for r in range(nranks)}, proc.stdout[-4000:]
