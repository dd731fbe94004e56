"""benchmarks/soak_collectives.py: the soak of every op (GemmRS, AGGemm, AllGather, AllReduce one-shot and
two-shot, ReduceScatter, AllToAll, Broadcast) and the random-size stream of the torch-like functions.

CPU tier: the soak's plan (the kernels it builds, the random stream, the same on every rank) and the build
of its kernels for sm_90a at 4 ranks (most of them are the kernels other CPU tests build: a warm cache
makes this test cheap). GPU tier: a short soak on 2 and 4 ranks (sharing GPUs when there are fewer)."""
import importlib.util
import json
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "soak_collectives.py"


@pytest.fixture(scope="module")
def soak():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("soak_collectives", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _names(jobs) -> list[str]:
    return [getattr(fn, "func", fn).__name__ for fn, _ in jobs]


def test_soak_plan_is_deterministic_and_stays_on_the_ops_kernels(soak):
    a = soak.parse_args([])
    assert a.iters == 10000 and a.check_every == 500 and a.ops == soak.ALL
    for W in (2, 4, 8):
        pools, calls = soak.stream_plan(W, a)
        assert (pools, calls) == soak.stream_plan(W, soak.parse_args([]))      # the same on every rank
        assert len(calls) == a.random_calls and {k for k, _, _ in calls} == set(soak.STREAM_KINDS)
        assert all(len(p) == a.random_pool for p in pools.values())
        assert a.random_pool < 16     # below the functions' cache sizes: no op is evicted by default
        for kind, _, extra in calls:
            if kind == "all_to_all_v":
                assert len(extra) == W and all(extra[r][r] >= 1 for r in range(W))
        # the random sizes need no kernel beyond the soaked ops' own: one build of each op's kernel
        everything = soak.jobs(W, 132, a)
        without_stream = soak.jobs(W, 132, soak.parse_args(["--ops", ",".join(soak.OPS)]))
        assert everything == without_stream
        assert sorted(_names(everything)) == sorted([
            "gemm_rs_push_kernel", *["ag_gemm_kernel"] * (2 if W > 1 else 1),
            "allgather_kernel",
            "allreduce_one_shot_kernel", "allreduce_two_shot_kernel", "reduce_scatter_kernel", "all_to_all_kernel",
            "broadcast_kernel"])
    assert soak.stream_plan(4, soak.parse_args(["--seed", "1"])) != soak.stream_plan(4, a)
    assert _names(soak.jobs(4, 132, soak.parse_args(["--ops", "broadcast"]))) == ["broadcast_kernel"]
    assert "gemm_rs_push_kernel" not in _names(soak.jobs(4, 132, soak.parse_args(["--ops", "broadcast,random"])))
    with pytest.raises(SystemExit):
        soak.parse_args(["--ops", "all_reduce"])          # not an op name of the soak
    with pytest.raises(SystemExit):
        soak.parse_args(["--check-every", "0"])


def test_soak_kernels_build_for_sm90(soak):
    from build_pool import build_all

    jobs = soak.jobs(4, 132, soak.parse_args([]))
    builds = build_all({f"{i}:{n}": j for i, (n, j) in enumerate(zip(_names(jobs), jobs, strict=False))}).wait()
    for key in [f"{i}:{n}" for i, n in enumerate(_names(jobs))]:
        r = builds[key]
        assert r.spec.distributed and Path(r.library).is_file(), key


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_soak_on_gpus(nranks, tmp_path):
    testing.skip_unless_ranks(nranks)
    out = tmp_path / "soak.json"
    proc = testing.launch(SCRIPT, nranks, "--iters", "600", "--check-every", "200", "--random-calls", "60",
                          "--quiet", "--json", str(out), timeout=420)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: soak")
    res = json.loads(out.read_text())
    assert res["ok"] and not res["failures"]
    ops = {r["op"]: r for r in res["ops"]}
    assert sorted(ops) == sorted(["gemm_rs", "ag_gemm", "all_gather", "all_reduce_one_shot", "all_reduce_two_shot",
                                  "reduce_scatter", "all_to_all", "broadcast", "random"]), sorted(ops)
    for name, r in ops.items():
        if name == "random":
            assert r["calls"] == 60 and r["orphans"] == 0
        else:
            assert r["calls"] == 600 and r["n_checks"] == 3 and not r["truncated"], name
