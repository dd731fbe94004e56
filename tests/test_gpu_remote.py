"""GPU tier: every op on its remote path. ``TILESCALE_NODE_SIZE=k`` makes nodes of k ranks on one host, so a
peer of another node is reached only through NVSHMEM's API; tests/gpu/remote_main.py runs every op and the
language primitives against recomputed references on every rank. Skipped without GPUs (the ranks share
GPUs when there are fewer)."""
import re
from pathlib import Path

import pytest

from tilescale import testing

GPU = Path(__file__).resolve().parent / "gpu"


@pytest.mark.multigpu
@pytest.mark.parametrize(("nranks", "node_size"), [(2, 1), (4, 1), (4, 2)], ids=["2r-k1", "4r-k1", "4r-k2"])
def test_every_op_on_the_remote_path(nranks, node_size):
    testing.skip_unless_ranks(nranks)
    proc = testing.launch(GPU / "remote_main.py", nranks, timeout=520, env={"TILESCALE_NODE_SIZE": str(node_size)})
    testing.assert_all_ranks_ok(proc, nranks, marker=f"OK: remote path, TILESCALE_NODE_SIZE={node_size}: every op")
    out = proc.stdout
    for what in ("AllGather", "AllReduce one_shot", "AllReduce two_shot", "ReduceScatter", "AllToAll",
                 "Broadcast and Reduce, root 0", "AGGemm", "GemmRS"):
        # ranks print side by side: a line may end where another rank's starts
        ok = [r for r in range(nranks) if re.search(rf"\[rank {r}\] OK: {re.escape(what)}(\n|\[rank |$)", out)]
        assert ok == list(range(nranks)), f"'{what}' OK only on ranks {ok}\n{out[-4000:]}"
    for r in range(nranks):
        want = [int(p // node_size == r // node_size) for p in range(nranks)]
        assert f"[rank {r}] OK: peer_reachable {want}" in out, out[-4000:]
