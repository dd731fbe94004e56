"""Where a fused op takes the unfused path (tilescale/ops/fused_paths.py): the rule over the committed table, the
table written from the committed benchmark results, and AGGemm's unfused call (NCCL's AllGather, then matmul)."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tilescale.ops import fused_paths

REPO = Path(__file__).resolve().parent.parent
TABLE = {"GPU X": {"4": {"ag_gemm": [[512, 2048, 8192, "unfused"], [1024, 2048, 8192, "unfused"],
                                     [4096, 2048, 8192, "fused"], [512, 7168, 8192, "fused"]]}}}


def info(W=4, shared=False, local=None):
    return SimpleNamespace(world_size=W, shared_gpu=shared, local_world_size=W if local is None else local)


@pytest.mark.parametrize("M,N,K,gpu,W,want", [
    (512, 2048, 8192, "GPU X", 4, "unfused"),
    (768, 2048, 8192, "GPU X", 4, "unfused"),     # between 512 and 1024: both unfused
    (1536, 2048, 8192, "GPU X", 4, "unfused"),    # log-nearest is 1024 (1.5x) rather than 4096 (2.7x)
    (2048, 2048, 8192, "GPU X", 4, "unfused"),    # tie between 1024 and 4096: the smaller M decides
    (3072, 2048, 8192, "GPU X", 4, "fused"),
    (65536, 2048, 8192, "GPU X", 4, "fused"),
    (512, 7168, 8192, "GPU X", 4, "fused"),       # measured fused
    (512, 4096, 8192, "GPU X", 4, "fused"),       # N never measured
    (512, 2048, 4096, "GPU X", 4, "fused"),       # K never measured
    (512, 2048, 8192, "GPU X", 2, "fused"),       # world size never measured
    (512, 2048, 8192, "GPU Y", 4, "fused"),       # another GPU
    (512, 2048, 8192, None, 4, "fused"),          # no GPU name
])
def test_the_nearest_measured_row_of_the_same_gpu_world_n_and_k_decides(M, N, K, gpu, W, want):
    assert fused_paths.lookup("ag_gemm", M, N, K, W, gpu, TABLE) == want


def test_shared_gpus_several_nodes_and_one_rank_run_fused(monkeypatch):
    monkeypatch.setattr(fused_paths, "_load", lambda path: TABLE)
    assert fused_paths.choose("ag_gemm", 512, 2048, 8192, info(), "GPU X") == "unfused"
    assert fused_paths.choose("ag_gemm", 512, 2048, 8192, info(shared=True), "GPU X") == "fused"
    assert fused_paths.choose("ag_gemm", 512, 2048, 8192, info(local=2), "GPU X") == "fused"
    assert fused_paths.choose("ag_gemm", 512, 2048, 8192, info(W=1), "GPU X") == "fused"


def test_the_committed_table_is_written_from_the_committed_results(tmp_path):
    """tilescale/ops/fused_paths.json is what benchmarks/fused_paths.py makes of the results it names: a rerun of the
    benchmark that moved a row changes the results, and this test, until the table is written again."""
    committed = json.loads(fused_paths.TABLE.read_text())
    sources = [s.split(" (")[0] for s in committed["note"].split(" from ", 1)[1].split("; ")]
    assert sources and all((REPO / s).is_file() for s in sources), sources
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "fused_paths.py"), *sources, "--out", str(out)],
                   cwd=REPO, check=True, timeout=120)
    assert json.loads(out.read_text()) == committed
    for worlds in committed["tables"].values():
        for rows in (r for ops in worlds.values() for r in ops.values()):
            assert all(r[3] in fused_paths.PATHS for r in rows)


def test_the_unfused_call_is_nccl_then_matmul(monkeypatch):
    """AGGemm(fused=False): the AllGather into the op's buffer, then torch.matmul into `out`; gathered() is that
    buffer."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from tilescale.ops import allgather_gemm as agm

    W, rows, K, N = 2, 4, 8, 6
    shards = [torch.randn(rows, K) for _ in range(W)]
    calls = []

    def all_gather(out, inp, group=None):
        calls.append(inp)
        out.copy_(torch.cat([shards[0], inp]))
    monkeypatch.setattr(dist, "all_gather_into_tensor", all_gather)
    op = object.__new__(agm.AGGemm)
    op.M, op.N, op.K, op.dtype, op.fused, op._full, op.world_size = W * rows, N, K, torch.float32, False, None, W
    op.rows = rows
    b, out = torch.randn(K, N), torch.full((W * rows, N), float("nan"))
    assert op._call_unfused(shards[1], b, out) is out
    torch.testing.assert_close(out, torch.cat(shards) @ b)
    assert op.gathered() is op._full and torch.equal(op._full, torch.cat(shards))
    op._call_unfused(shards[1].t().contiguous().t(), b, None)     # a non-contiguous shard: gathered contiguous
    assert calls[-1].is_contiguous()


def test_an_unfused_call_of_fewer_rows_gathers_into_the_first_rows_of_the_buffer(monkeypatch):
    """A call of m rows per rank below the op's bound: the AllGather fills the first W x m rows of the op's buffer
    (of M rows, kept for calls up to the bound) and C has W x m rows; gathered() is those rows. A call of no rows
    gathers nothing and returns an empty C."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from tilescale.ops import allgather_gemm as agm

    W, rows, K, N, m = 2, 4, 8, 6, 3
    shards = [torch.randn(m, K) for _ in range(W)]
    sizes = []

    def all_gather(out, inp, group=None):
        sizes.append(tuple(out.shape))
        out.copy_(torch.cat([shards[0], inp]))
    monkeypatch.setattr(dist, "all_gather_into_tensor", all_gather)
    op = object.__new__(agm.AGGemm)
    op.M, op.N, op.K, op.dtype, op.fused, op._full, op.world_size = W * rows, N, K, torch.float32, False, None, W
    op.rows = rows
    b = torch.randn(K, N)
    c = op._call_unfused(shards[1], b, None)
    assert sizes == [(W * m, K)] and c.shape == (W * m, N) and op._full.shape == (W * rows, K)
    torch.testing.assert_close(c, torch.cat(shards) @ b)
    g = op.gathered()
    assert g.data_ptr() == op._full.data_ptr() and torch.equal(g, torch.cat(shards))
    assert op._call_unfused(shards[1][:0], b, None).shape == (0, N) and len(sizes) == 1


@pytest.mark.parametrize("M,N,K", [(4096.0, 2048, 8192), ("512", 2048, 8192), (0, 2048, 8192), (512, -1, 8192),
                                   (True, 2048, 8192)])
def test_sizes_the_op_will_refuse_run_fused_without_an_error(M, N, K):
    """The path is decided before the op checks its arguments (so that ranks agree on it): a bad size gets no
    error here (the op's checks name it) and no table row."""
    assert fused_paths.lookup("ag_gemm", M, N, K, 4, "GPU X", TABLE) == "fused"
