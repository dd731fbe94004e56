"""benchmarks/bench_fused.py on CPU: each row's target (the fused ops' goals on several GPUs), the table and the
results file it writes beside its JSON (machine, command, commit, date), and timing's alignment of ranks."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
pytest.importorskip("torch")
import bench_fused  # noqa: E402
import timing  # noqa: E402


def _row(op, M, K, N, ts, nccl=200.0, cublas=180.0, nccl_cublas=370.0, async_tp=260.0):
    r = dict(op=op, M=M, K=K, N=N, nccl=nccl, cublas=cublas, nccl_cublas=nccl_cublas, tilescale=ts, ts_gemm=cublas)
    if async_tp is not None:
        r["async_tp"] = async_tp
    r["ratio_to_ideal"] = ts / max(nccl, cublas)
    return r


@pytest.mark.parametrize("row,met", [
    (_row("ag_gemm", 4096, 8192, 2048, 240.0), True),       # 1.20 x ideal, faster than both
    (_row("ag_gemm", 4096, 8192, 2048, 255.0), False),      # 1.28 x ideal
    (_row("ag_gemm", 4096, 8192, 2048, 250.0, async_tp=245.0), False),   # async-TP faster
    (_row("ag_gemm", 4096, 8192, 7168, 215.0), True),       # 1.075 x ideal
    (_row("ag_gemm", 4096, 8192, 7168, 225.0), False),      # 1.125 x ideal: N = 7168 wants 1.10
    (_row("ag_gemm", 512, 8192, 2048, 265.0), True),        # small M: within 3% of the best unfused (260)
    (_row("ag_gemm", 512, 8192, 2048, 270.0), False),
    (_row("gemm_rs", 8192, 8192, 8192, 220.0, async_tp=250.0), True),
    (_row("gemm_rs", 8192, 8192, 8192, 230.0, async_tp=250.0), False),    # 1.15 x ideal but only 1.09x async-TP
    (_row("gemm_rs", 8192, 8192, 8192, 220.0, async_tp=None), False),     # no async-TP to beat: not met
])
def test_each_row_is_judged_by_its_target(row, met):
    assert bench_fused.target(row)[1] is met


def test_report_and_results_file(tmp_path, capsys):
    rows = [_row("ag_gemm", 4096, 8192, 2048, 240.0), _row("ag_gemm", 512, 8192, 2048, 300.0)]
    text = bench_fused.report(rows, 4, "AG+GEMM bfloat16, 4 x GPU (us)")
    assert capsys.readouterr().out.split() == text.split()     # what it printed
    assert "targets met on 1 of 2 rows" in text and "| MISSED (<= 1.03 x best unfused) |" in text
    assert [r["target_met"] for r in rows] == [True, False]
    env = dict(gpu="NVIDIA H200", torch="2.11", world_size=4, date="2026-11-27T00:00:00Z",
               command="bench_fused.py --json x.json", commit="abc123")
    path = tmp_path / "4xH200" / "fused.md"
    timing.write_markdown(str(path), env, [text])
    got = path.read_text()
    assert got.startswith("# bench_fused.py --json x.json\n\n4 x NVIDIA H200, torch 2.11; commit abc123; "
                          "2026-11-27T00:00:00Z\n") and text in got


def test_interleaved_timing_aligns_ranks_before_each_call(monkeypatch):
    """With NCCL serving the group, every timed call is preceded by a one-element all-reduce (the ranks start it
    together); without a process group nothing is added."""
    torch = pytest.importorskip("torch")
    calls = []

    class Event:
        def __init__(self, **k):
            pass

        def record(self):
            calls.append("record")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.001

    from tilescale import staged_collectives

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: "token")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, **k: calls.append(("all_reduce", t)))
    monkeypatch.setattr(staged_collectives, "for_cuda", lambda group=None: torch.distributed)
    monkeypatch.setattr(timing, "_slowest_rank", lambda values, dist: values)
    fn = lambda: calls.append("fn")  # noqa: E731
    timing.time_interleaved({"a": fn}, warmup=0, iters=2, repeats=1)
    assert calls == [("all_reduce", "token"), "record", "fn", "record"] * 2
    calls.clear()
    timing.time_interleaved({"a": fn}, warmup=0, iters=2, repeats=1, align=False)
    assert calls == ["record", "fn", "record"] * 2


@pytest.mark.parametrize("rank", [0, 3])
def test_group_size_splits_the_world_into_groups_of_consecutive_ranks(rank):
    """--group-size 2 in a world of 4: this rank's group of 2 consecutive ranks (torch.distributed's fake backend,
    every group made on every rank), its rank in it; world rank 0 alone reports. 0: the world as it is; a size that
    does not divide the world stops the benchmark."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
    try:
        info = SimpleNamespace(world_size=4, rank=rank)
        g = bench_fused.grouped(info, 2)
        assert (g.world_size, g.rank, g.first) == (2, rank % 2, rank == 0)
        assert dist.get_process_group_ranks(g.group) == ([0, 1] if rank < 2 else [2, 3])
        w = bench_fused.grouped(info, 0)
        assert (w.world_size, w.rank, w.group) == (4, rank, None)
        with pytest.raises(SystemExit, match="--group-size 3: expected a divisor of the world size 4"):
            bench_fused.grouped(info, 3)
    finally:
        dist.destroy_process_group()


def test_a_group_runs_prebuild_lists_every_groups_kernels():
    """--group-size 2 of 4 ranks: the prebuild (local rank 0) lists each group's fused kernels with its team (a group's
    kernels are its own), the world-of-2 kernels plus the team; the push path's loopback (_gemm_alone) takes none."""
    from tilescale.runtime.team import Team

    teams = bench_fused.group_teams(4, 2)
    assert teams == [Team(0, 1, 2), Team(2, 1, 2)]
    shapes = [(8192, 8192, 2048)]
    world = bench_fused.kernel_jobs("both", shapes, shapes, 2, "bfloat16", [None])
    groups = bench_fused.kernel_jobs("both", shapes, shapes, 2, "bfloat16", teams)
    name = lambda fn: getattr(fn, "func", fn).__name__   # noqa: E731
    for t in teams:
        mine = sorted((name(fn), a[:-1]) for fn, a in groups if a and a[-1] == t)
        assert mine == sorted((name(fn), a) for fn, a in world if "loopback" not in name(fn))
    assert [a for fn, a in groups if "loopback" in name(fn)] == [a for fn, a in world if "loopback" in name(fn)]
    assert len(world) == 4 and len(groups) == 7       # (AG+GEMM's two GEMMs, GEMM+RS push + loopback; per group)


def test_gemm_alone_of_a_groups_push_path_builds_the_loopback_kernel_without_the_team(monkeypatch):
    """GEMM+RS's GEMM-alone column on the push path runs the loopback kernel with the op's GEMM arguments but a
    group's team (the push kernel's last argument: the loopback reaches no peer)."""
    from types import SimpleNamespace

    import torch

    from tilescale.ops import gemm_reduce_scatter as grs
    from tilescale.runtime.team import Team

    seen = []
    monkeypatch.setattr(grs, "gemm_rs_push_loopback_kernel", lambda *a: seen.append(a) or (lambda *t: None))
    args = (1024, 512, 2, "bfloat16", 128, 256, 64, 3, 256, 10, 132)
    z = torch.zeros(4, dtype=torch.int64)
    for team in (None, Team(2, 1, 2)):
        op = SimpleNamespace(world_size=2, K=512, N=1024, dtype=torch.bfloat16, path="push", R=z, arrived=z,
                             gemm_counters=z, pushed=z, gemm_args=args + (() if team is None else (team,)))
        bench_fused._gemm_alone(op, torch.zeros(256, 512), torch.zeros(512, 1024))()
    assert seen == [args, args]
