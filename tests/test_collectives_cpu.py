"""The collectives (AllReduce, ReduceScatter, AllToAll, Broadcast) on a machine without a GPU: every kernel
compiles and links for sm_90a, its source makes the expected tilescale:: calls (and no bound guard skips a
signal), the pure-Python planning (block tables, split tables, tuning ranges) is right, and bad arguments
raise clear errors before anything collective happens. Their GPU tests are the examples
(examples/distributed/example_{allreduce,reduce_scatter,all_to_all,broadcast}.py, marker multigpu)."""
import re
from pathlib import Path

import build_pool
import pytest

torch = pytest.importorskip("torch")

from tilescale.errors import CollectiveMismatchError  # noqa: E402
from tilescale.ops import all_to_all, allreduce, checks, prebuild, reduce_scatter, vectors  # noqa: E402
from tilescale.ops import broadcast_from_root as broadcast  # noqa: E402


def _calls(source: str) -> set[str]:
    return set(re.findall(r"tilescale::[a-z_]+", source))




SM90_CASES = {   # id: (jit function, args, tilescale:: calls its source must make)
    "allreduce_one_shot": (allreduce.allreduce_one_shot_kernel, (2, 16, "bfloat16"),
                           {"tilescale::put_signal", "tilescale::wait_until"}),
    "allreduce_two_shot": (allreduce.allreduce_two_shot_kernel, (4, 16, "float32"),
                           {"tilescale::put_signal", "tilescale::wait_until", "tilescale::st_pe", "tilescale::get"}),
    "reduce_scatter": (reduce_scatter.reduce_scatter_kernel, (8, 32, "float16"),
                       {"tilescale::put_signal", "tilescale::wait_until"}),
    "all_to_all": (all_to_all.all_to_all_kernel, (2, 4),
                   {"tilescale::st_pe", "tilescale::wait_until", "tilescale::put_signal"}),
    "broadcast": (broadcast.broadcast_kernel, (4, 8),
                  {"tilescale::put", "tilescale::get", "tilescale::st_pe", "tilescale::wait_until"}),
}


@pytest.fixture(scope="module")
def sm90_builds():
    """The five kernels, built side by side (as fn.build(*args) builds each)."""
    from build_pool import build_all

    return build_all({k: (fn, args) for k, (fn, args, _) in SM90_CASES.items()}).wait()


@pytest.mark.parametrize("case", list(SM90_CASES))
def test_kernel_builds_for_sm90(case, sm90_builds):
    fn, args, want = SM90_CASES[case]
    r = sm90_builds[case]
    assert r.spec.distributed and r.spec.build_mode == "inlined"
    assert Path(r.library).is_file()
    missing = want - _calls(r.source)
    assert not missing, f"missing calls {missing} in the generated source"
    # A signal that a bound guard could skip would hang the peer: tilelang's safe-memory pass wraps accesses
    # whose start may be past the end (an empty chunk) in `if (start < n)`; PASS_CONFIGS turns that off. Any
    # enclosing `if` on the chunk (blockIdx.x) counts, not only the line before the put.
    guards = [c for c in build_pool.enclosing_conditions(r.source, "tilescale::put") if "blockIdx.x" in c]
    assert not guards, f"a put/signal is behind a bound guard (empty chunks would not signal): {guards}"
    if fn in (allreduce.allreduce_one_shot_kernel, allreduce.allreduce_two_shot_kernel,
              reduce_scatter.reduce_scatter_kernel):
        assert "uint4" in r.source or "float4" in r.source, "the sums should load 16-byte vectors"
        assert "float acc[" in r.source, "the sums should accumulate in fp32 registers"


def test_blocks_tables_and_co_residency():
    sms = 132
    for nb in (1, 1 << 10, 1 << 20, 1 << 24, 1 << 28, 1 << 33):
        for W in (2, 4, 8):
            [(_, (ws, b, *_))] = allreduce.kernels(nb, W, "bfloat16", sms, "one_shot")
            assert ws == W and 1 <= b <= sms
            [(_, (_, b2, *_))] = allreduce.kernels(nb, W, "bfloat16", sms, "two_shot")
            assert 1 <= b2 <= sms                         # one wave
            [(_, (_, b3, *_))] = reduce_scatter.kernels(nb, W, "bfloat16", sms)
            assert 1 <= b3 <= sms
            [(_, (_, bpp, _))] = all_to_all.kernels(nb, W, None, sms)
            assert W <= bpp and bpp * W <= max(sms, W * W)  # blocks (b < W, 0) do the final waits
            [(_, (_, b4, _))] = broadcast.kernels(nb, W, None, sms)
            assert 1 <= b4 <= sms
    assert vectors.blocks_for(1 << 30, ((10, 4), (1 << 62, 500)), 132) == 132
    assert vectors.blocks_for(5, ((10, 4), (1 << 62, 500)), 132) == 4


def test_auto_algo_switches_at_one_shot_max_bytes():
    m = allreduce.ONE_SHOT_MAX_BYTES
    assert 256 << 10 <= m <= 1 << 20
    assert allreduce.resolve_algo("auto", m, 4) == "one_shot"
    assert allreduce.resolve_algo("auto", m + 1, 4) == "two_shot"
    assert allreduce.resolve_algo("auto", 1 << 30, 1) == "one_shot"
    assert allreduce.resolve_algo("two_shot", 16, 4) == "two_shot"


def test_vector_width_and_dtype_check():
    assert vectors.vector_width(torch.bfloat16) == 8
    assert vectors.vector_width(torch.float16) == 8
    assert vectors.vector_width(torch.float32) == 4
    vectors.check_dtype("AllReduce", torch.float32)
    with pytest.raises(ValueError, match=r"AllReduce: dtype: got torch.int32, expected one of torch.bfloat16"):
        vectors.check_dtype("AllReduce", torch.int32)
    with pytest.raises(ValueError, match=r"shape: got \(4, -1\), expected sizes >= 0"):
        vectors.as_shape("ReduceScatter", (4, -1))
    with pytest.raises(ValueError, match=r"shape: got 7, expected a sequence of ints"):
        vectors.as_shape("ReduceScatter", 7)
    t = torch.zeros(4, 8)
    assert vectors.vector_view(t, (8, 4)).shape == (8, 4)
    assert vectors.vector_view(t.t(), (8, 4)) is None          # not contiguous: staged
    assert vectors.vector_view(t.view(-1)[1:29], (7, 4)) is None  # not 16-byte aligned: staged


def test_split_table_offsets():
    # rows rank s sends to rank p (W = 3), with empty splits
    m = [[2, 0, 1],
         [0, 3, 4],
         [5, 1, 0]]
    rb = 6  # bytes per row
    send_off, counts, recv_off = all_to_all.split_table(m[1], m, 1, rb)
    assert send_off == [0, 0, 3 * rb]                 # rank 1's rows for ranks 0, 1, 2 start at 0, 0, 3
    assert counts == [0, 3 * rb, 4 * rb]
    assert recv_off == [2 * rb, 0, 1 * rb]            # at rank p, after the rows of rank 0
    send_off, counts, recv_off = all_to_all.split_table(m[2], m, 2, rb)
    assert recv_off == [2 * rb, 3 * rb, 5 * rb]       # after ranks 0 and 1
    assert send_off == [0, 5 * rb, 6 * rb] and counts == [5 * rb, 1 * rb, 0]


def _every(m, row=(4,), dtype="torch.bfloat16", errs=None):
    W = len(m)
    return [dict(send=m[r], recv=[m[s][r] for s in range(W)], err=(errs or {}).get(r), row=row, dtype=dtype)
            for r in range(W)]


def test_check_splits_consistent_and_mismatched():
    m = [[1, 2], [0, 3]]
    all_to_all.check_splits(_every(m), 0)
    bad = _every(m)
    bad[1]["recv"] = [1, 3]          # rank 1 expects 1 row from rank 0, which sends 2
    for rank in (0, 1):              # every rank raises, naming the pair
        with pytest.raises(CollectiveMismatchError, match=r"rank 0 sends 2 rows to rank 1 .* rank 1 expects 1"):
            all_to_all.check_splits(bad, rank)
    rows = _every(m)
    rows[1]["row"] = (5,)
    with pytest.raises(CollectiveMismatchError, match="row shape"):
        all_to_all.check_splits(rows, 0)
    errs = _every(m, errs={1: "input_split_sizes: got [1], expected 2 non-negative ints (rows per rank)"})
    with pytest.raises(ValueError, match=r"all_to_all_single: input_split_sizes: got \[1\]"):
        all_to_all.check_splits(errs, 1)
    with pytest.raises(CollectiveMismatchError, match="invalid arguments on other ranks"):
        all_to_all.check_splits(errs, 0)


def test_split_size_validation():
    assert all_to_all._splits("input_split_sizes", None, 8, 4) == ([2, 2, 2, 2], None)
    assert all_to_all._splits("input_split_sizes", [3, 0, 5], 8, 3) == ([3, 0, 5], None)
    for sizes, rows, W, msg in ((None, 7, 2, "divisible by the world size 2"),
                                ([1, 2], 4, 2, r"sum 3\), expected sizes summing to dim 0 = 4"),
                                ([1, -1, 2], 2, 3, "non-negative"),
                                ([1, 2, 3], 6, 2, "expected 2 non-negative ints"),
                                ("ab", 2, 2, "expected a list of 2 ints")):
        got, err = all_to_all._splits("input_split_sizes", sizes, rows, W)
        assert got is None and re.search(msg, err), err


def test_functions_reject_bad_arguments_before_any_collective():
    cpu = torch.zeros(8)
    with pytest.raises(ValueError, match=r"all_reduce: op: got 'max', expected 'sum'"):
        allreduce.all_reduce(cpu, op="max")
    with pytest.raises(ValueError, match=r"all_reduce: algo: got 'ring'"):
        allreduce.all_reduce(cpu, algo="ring")
    want = r"all_reduce: tensor: got a float32 tensor of shape \(8,\) on cpu, expected a CUDA tensor"
    with pytest.raises(ValueError, match=want):
        allreduce.all_reduce(cpu)
    with pytest.raises(ValueError, match=r"reduce_scatter_tensor: op: got 'avg'"):
        reduce_scatter.reduce_scatter_tensor(cpu, cpu, op="avg")
    with pytest.raises(ValueError, match=r"reduce_scatter_tensor: output: got a float32 tensor of shape \(8,\) on cpu"):
        reduce_scatter.reduce_scatter_tensor(cpu, cpu)
    with pytest.raises(ValueError, match=r"broadcast: tensor: got list"):
        broadcast.broadcast([1, 2], 0)
    with pytest.raises(ValueError, match=r"all_to_all_single: output: got a float32 tensor"):
        all_to_all.all_to_all_single(cpu, cpu)
    import torch.distributed as dist

    checks.check_op("f", dist.ReduceOp.SUM)
    with pytest.raises(ValueError, match="op: got"):
        checks.check_op("f", dist.ReduceOp.MAX)


class _FakeRuntime:
    """Enough of tilescale.runtime.Runtime for the op constructors' checks (one rank of `world_size`;
    the other ranks passed `others`)."""

    def __init__(self, world_size=2, rank=0, others=None):
        self.info = type("Info", (), {"world_size": world_size, "rank": rank, "local_rank": rank})()
        self._others = others

    def all_gather_object(self, obj):
        return [obj if r == self.info.rank or self._others is None else self._others
                for r in range(self.info.world_size)]


@pytest.fixture
def fake_runtime(monkeypatch):
    from tilescale import runtime

    def use(**kw):
        rt = _FakeRuntime(**kw)
        monkeypatch.setattr(runtime, "current", lambda: rt)
        return rt

    return use


def test_constructors_validate_arguments(fake_runtime):
    fake_runtime(world_size=4)
    with pytest.raises(ValueError, match=r"AllReduce: algo: got 'ring', expected one of 'auto', 'one_shot'"):
        allreduce.AllReduce((8,), torch.bfloat16, algo="ring")
    with pytest.raises(ValueError, match=r"AllReduce: dtype: got torch.int64"):
        allreduce.AllReduce((8,), torch.int64)
    with pytest.raises(ValueError, match=r"ReduceScatter: shape: got \(6, 3\), expected \(rows, ...\) with rows "
                                         r"divisible by the world size 4"):
        reduce_scatter.ReduceScatter((6, 3), torch.float16)
    with pytest.raises(ValueError, match=r"AllToAll: shape: got \(10, 2\), expected \(rows, ...\) with rows "
                                         r"divisible by the world size 4"):
        all_to_all.AllToAll((10, 2), torch.float32)
    with pytest.raises(ValueError, match=r"AllToAll: dtype: got 'bf16', expected a torch.dtype"):
        all_to_all.AllToAll((8, 2), "bf16")
    with pytest.raises(ValueError, match=r"Broadcast: src: got 4, expected a rank in 0..3"):
        broadcast.Broadcast((8,), torch.float32, 4)
    with pytest.raises(ValueError, match=r"Broadcast: src: got True"):
        broadcast.Broadcast((8,), torch.float32, True)
    with pytest.raises(ValueError, match=r"AllReduce: blocks: got 0, expected a positive int"):
        allreduce.AllReduce((8,), torch.bfloat16, blocks=0)
    with pytest.raises(ValueError, match=r"ReduceScatter: threads: got 100, expected a multiple of 32"):
        reduce_scatter.ReduceScatter((8,), torch.bfloat16, threads=100)


def test_launch_shape_checks():
    vectors.check_launch("Op", None, 512, 8)
    vectors.check_launch("Op", 64, 32, 8, lambda: 132)
    with pytest.raises(ValueError, match=r"Op: blocks: got 200, expected at most 132 \(all blocks must be co-resident"):
        vectors.check_launch("Op", 200, 512, 8, lambda: 132)
    with pytest.raises(ValueError, match=r"Op: blocks: got 'x'"):
        vectors.check_launch("Op", "x", 512, 8)
    with pytest.raises(ValueError, match=r"Op: threads: got 32, expected .* at least the world size 64"):
        vectors.check_launch("Op", None, 32, 64)


def test_constructors_detect_cross_rank_mismatch(fake_runtime):
    # the other ranks passed another src / dtype / algo: every rank raises CollectiveMismatchError first
    fake_runtime(world_size=2, others={"shape": (8,), "dtype": "torch.float32", "src": 1, "blocks": None,
                                           "threads": 512})
    with pytest.raises(CollectiveMismatchError, match=r"Broadcast: argument\(s\) src differ across ranks"):
        broadcast.Broadcast((8,), torch.float32, 0)
    fake_runtime(world_size=2, others={"shape": (8,), "dtype": "torch.float16", "algo": "auto", "blocks": None,
                                           "threads": 512})
    with pytest.raises(CollectiveMismatchError, match=r"AllReduce: argument\(s\) dtype differ"):
        allreduce.AllReduce((8,), torch.bfloat16)
    fake_runtime(world_size=2, others={"shape": (16,), "dtype": "torch.bfloat16", "blocks": None, "threads": 512})
    with pytest.raises(CollectiveMismatchError, match=r"ReduceScatter: argument\(s\) shape differ"):
        reduce_scatter.ReduceScatter((8,), torch.bfloat16)


def test_prebuild_collective_jobs_match_what_the_ops_build():
    jobs = prebuild.collective_jobs(2, [1 << 10, 1 << 20, 256 << 20], ("bfloat16", "float32"))
    keys = {(getattr(fn, "func", fn).__name__ if hasattr(fn, "func") else str(fn), args) for fn, args in jobs}
    assert len(keys) == len(jobs)                      # no duplicates
    for algo in ("one_shot", "two_shot"):
        [(fn, args)] = allreduce.kernels(256 << 20, 2, "float32", 132, algo)
        assert any(f is fn and a == args for f, a in jobs)
    [(fn, args)] = broadcast.kernels(1 << 10, 2, None, 132)
    assert any(f is fn and a == args for f, a in jobs)


def test_tuning_table_from_measurements():
    from tilescale.plan import tuning

    rows = [dict(collective="reduce_scatter", algo="direct", bytes=1 << k, speedup=s, tilescale_us=1.0)
            for k, s in zip(range(10, 22, 2), (0.9, 1.05, 1.2, 1.01, 1.5, 1.04), strict=True)]
    assert tuning.win_ranges(rows) == [[1 << 12, 1 << 14], [1 << 18, 1 << 20]]
    assert tuning.win_ranges([]) == []
    one = [dict(collective="allreduce", algo="one_shot", bytes=1 << k, speedup=s, tilescale_us=t)
           for k, s, t in ((10, 2.0, 10.0), (12, 2.0, 10.0), (14, 0.5, 50.0))]
    two = [dict(collective="allreduce", algo="two_shot", bytes=1 << k, speedup=s, tilescale_us=t)
           for k, s, t in ((10, 1.0, 20.0), (12, 1.0, 20.0), (14, 1.1, 20.0))]
    t = tuning.table(rows + one + two, "NVIDIA H200", 2)
    assert t["gpu"] == "NVIDIA H200" and t["world_size"] == 2
    assert t["collectives"]["reduce_scatter"] == {"algo": "direct",
                                                  "ranges": [[1 << 12, 1 << 14], [1 << 18, 1 << 20]]}
    assert t["collectives"]["allreduce"] == [{"algo": "one_shot", "ranges": [[1 << 10, 1 << 12]]},
                                             {"algo": "two_shot", "ranges": [[1 << 14, 1 << 14]]}]
    canon = tuning.validate(t, "bench_collectives")   # the plan selector accepts it
    assert canon["collectives"]["allreduce"] == [("tilescale.allreduce.one_shot", [(1 << 10, 1 << 12)]),
                                                 ("tilescale.allreduce.two_shot", [(1 << 14, 1 << 14)])]
