"""GEMM tile configurations of the fused kernels (tilescale/ops/gemm.py), on CPU: the selection from a
tuning table (exact shape, nearest M, per-op constraints, fallbacks), the sweep's conversion to a table
(benchmarks/bench_gemm_configs.py), and that non-default configurations build for sm_90a inside the
fused kernels and inside the sweep's kernel."""
import importlib.util
import json
import re
from pathlib import Path

import pytest

import tilescale
import tilescale.language as T
from tilescale.ops import allgather_gemm, gemm, gemm_reduce_scatter
from tilescale.ops.gemm import DEFAULT, GemmConfig, check, gemm_config

REPO = Path(__file__).resolve().parent.parent

BIG_M = GemmConfig(256, 128, 64, 3, 256, 4)
N192 = GemmConfig(128, 192, 64, 4, 256, 10)
SMALL = GemmConfig(64, 256, 64, 4, 128, 0)


def _sweep():
    """benchmarks/bench_gemm_configs.py, the sweep script (loaded from its file: no sys.path change)."""
    spec = importlib.util.spec_from_file_location("bench_gemm_configs", REPO / "benchmarks" / "bench_gemm_configs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(jobs) -> list:
    return [args for _, args in jobs]


def write_table(path: Path, entries) -> Path:
    path.write_text(json.dumps({"format": 1, "source": "test", "entries": [
        {"op": op, "M": M, "N": N, "K": K, "configs": [c.to_dict() for c in cfgs]} for op, M, N, K, cfgs in entries]}))
    return path


@pytest.fixture
def table(tmp_path):
    return write_table(tmp_path / "t.json", [
        ("ag_gemm", 8192, 2048, 8192, [BIG_M, N192, DEFAULT]),
        ("gemm_rs", 8192, 8192, 4096, [N192, SMALL, DEFAULT]),
        ("ag_gemm", 8192, 8192, 4096, [SMALL]),
    ])


def test_no_table_gives_the_default(tmp_path):
    assert gemm_config(8192, 2048, 8192, table=tmp_path / "missing.json") == DEFAULT
    assert gemm_config(8192, 2048, 8192, world_size=4, op="ag_gemm", table=tmp_path / "missing.json") == DEFAULT


def test_exact_shape_takes_the_fastest_config_the_op_can_run(table):
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=table) == BIG_M
    # 8192 rows over 64 ranks: 128 per rank, not a multiple of block_m=256 -> the next one (192 columns is fine)
    assert gemm_config(8192, 2048, 8192, world_size=64, op="ag_gemm", table=table) == N192
    # GEMM+RS counts whole tiles of N: 8192 is not a multiple of 192 -> next (SMALL)
    assert gemm_config(8192, 8192, 4096, world_size=2, op="gemm_rs", table=table) == SMALL


def test_entries_of_another_op_are_not_used(table):
    # the gemm_rs entry's shape, asked for by ag_gemm: the ag_gemm entry of that shape wins
    assert gemm_config(8192, 8192, 4096, world_size=2, op="ag_gemm", table=table) == SMALL
    # an ag_gemm-only shape asked for by gemm_rs: nothing of gemm_rs -> default
    assert gemm_config(8192, 2048, 8192, world_size=2, op="gemm_rs", table=table) == DEFAULT


def test_unlisted_m_takes_the_entry_with_the_same_n_and_k(table):
    assert gemm_config(16384, 2048, 8192, world_size=2, op="ag_gemm", table=table) == BIG_M
    assert gemm_config(4096, 2048, 8192, world_size=4, op="ag_gemm", table=table) == BIG_M
    # 1024 rows over 8 ranks = 128 per rank: BIG_M does not fit, N192 does
    assert gemm_config(1024, 2048, 8192, world_size=8, op="ag_gemm", table=table) == N192
    assert gemm_config(8192, 2048, 4096, world_size=2, op="ag_gemm", table=table) == DEFAULT   # other K
    assert gemm_config(8192, 1024, 8192, world_size=2, op="ag_gemm", table=table) == DEFAULT   # other N


def test_nothing_that_fits_gives_the_default(tmp_path):
    t = write_table(tmp_path / "t.json", [("ag_gemm", 4096, 2048, 8192, [BIG_M])])
    assert gemm_config(4096, 2048, 8192, world_size=32, op="ag_gemm", table=t) == DEFAULT


def test_check_names_the_reason():
    assert check(DEFAULT, 8192, 8192, 8192, world_size=4, op="ag_gemm") is None
    assert "world_size x block_m" in check(BIG_M, 4096, 2048, 8192, world_size=32, op="ag_gemm")
    assert "N=8192" in check(N192, 8192, 8192, 4096, world_size=2, op="gemm_rs")
    assert check(N192, 8192, 8192, 4096, world_size=2, op="ag_gemm") is None
    assert "shared memory" in check(GemmConfig(128, 256, 128, 3, 256), 8192, 8192, 8192)
    assert "warpgroups" in check(GemmConfig(threads=192), 8192, 8192, 8192)
    with pytest.raises(ValueError, match="op: got 'rs'"):
        check(DEFAULT, 1, 1, 1, op="rs")


def test_bad_tables_are_refused(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="not a GEMM tuning table"):
        gemm_config(1, 1, 1, table=p)
    p.write_text(json.dumps({"format": 1, "entries": [{"M": 1, "N": 1, "K": 1, "configs": [{"block_mm": 64}]}]}))
    with pytest.raises(ValueError, match="unknown field"):
        gemm_config(1, 1, 1, table=p)


def assert_valid_entries(entries):
    """Each entry of a loaded table names a known op and ranks configs of which one runs on 2 ranks."""
    for op, M, N, K, cfgs, _gpu in entries:
        assert op in gemm.OPS and cfgs, (op, M, N, K)
        assert all(isinstance(c, GemmConfig) for c in cfgs), (op, M, N, K)
        assert any(check(c, M, N, K, world_size=2, op=op) is None for c in cfgs), (op, M, N, K)


def test_load_table_reads_a_written_table(table):
    entries = gemm.load_table(table)
    assert [e[:4] for e in entries] == [("ag_gemm", 8192, 2048, 8192), ("gemm_rs", 8192, 8192, 4096),
                                        ("ag_gemm", 8192, 8192, 4096)]
    assert list(entries[0][4]) == [BIG_M, N192, DEFAULT] and list(entries[2][4]) == [SMALL]
    assert_valid_entries(entries)


def test_table_validation_catches_a_bad_entry(tmp_path):
    # every config of this entry is refused for its shape on 2 ranks (N=8192 is no multiple of 192)
    t = write_table(tmp_path / "t.json", [("gemm_rs", 8192, 8192, 4096, [N192])])
    with pytest.raises(AssertionError):
        assert_valid_entries(gemm.load_table(t))


def test_shipped_table_is_valid_or_absent(monkeypatch, tmp_path):
    """The table in the package (tilescale/ops/gemm_tuning.json, written by benchmarks/bench_gemm_configs.py
    on a GPU machine): absent, every shape gets the default; present, it has entries and each is valid."""
    entries = gemm.load_table()
    if not gemm.TUNING_FILE.exists():
        assert entries == ()
        assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm") == DEFAULT
    else:
        assert entries, f"{gemm.TUNING_FILE} has no entries"
        assert_valid_entries(entries)
    # the loader reads the shipped path when no table is given
    monkeypatch.setattr(gemm, "TUNING_FILE", write_table(tmp_path / "shipped.json", [("ag_gemm", 8192, 2048, 8192,
                                                                                       [BIG_M])]))
    assert gemm.load_table() == gemm.load_table(gemm.TUNING_FILE) and len(gemm.load_table()) == 1
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm") == BIG_M


def test_fused_kernel_args_follow_the_table(tmp_path, monkeypatch):
    ag_gemm, gemm_rs = allgather_gemm, gemm_reduce_scatter

    t = write_table(tmp_path / "t.json", [("ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                          ("gemm_rs", 8192, 8192, 4096, [SMALL])])
    monkeypatch.setattr(gemm, "TUNING_FILE", t)
    own, peers = _args(ag_gemm.kernels(8192, 2048, 8192, 2, "bfloat16"))   # its two GEMMs: one config
    assert own[5:13] == (256, 128, 64, 3, 256, 4, False, True)   # ..., profile, own, (sms: a split grid's)
    assert peers[5:13] == (256, 128, 64, 3, 256, 4, False, False)
    plan = ag_gemm.grid_plan(8192, 2048, 8192, 2, 256, 128, 64, 132, True)
    assert own[13:] == ((132,) if plan.split > 1 else (0,))
    # the pull path (GEMM + reduction) follows the table's "gemm_rs" entries
    g, r = _args(gemm_rs.kernels(8192, 8192, 4096, 2, "bfloat16", path="pull"))
    assert g[4:] == (64, 256, 64, 4, 128, 0)  # (N, K, W, dtype, config: the rows are the calls')
    assert r[2] == 8192 // 256               # completion count per row block: one per column tile
    assert r[5:] == (64, 256)             # the reduction's row block follows block_m
    g, r = _args(gemm_rs.kernels(8192, 8192, 4096, 2, "bfloat16", config=BIG_M, path="pull"))
    assert r[5:] == (256, 128)            # 256-row blocks: 128 columns per reduction tile (fp32 accumulator)
    # the push path (one node, no runtime here: the default) is one kernel; it has entries of its own
    # ("gemm_rs_push"), none in this table: the default config, not the pull path's tuned one
    assert gemm_rs.default_path(2) == "push"
    (push,) = _args(gemm_rs.kernels(8192, 8192, 4096, 2, "bfloat16"))
    d = DEFAULT
    assert push[4:10] == (d.block_m, d.block_n, d.block_k, d.stages, d.threads, d.swizzle) != g[4:]
    (push,) = _args(gemm_rs.kernels(8192, 8192, 4096, 2, "bfloat16", config=SMALL, path="push"))
    assert push[4:10] == (64, 256, 64, 4, 128, 0)   # an explicit config is taken on either path
    for path in gemm_rs.PATHS:
        with pytest.raises(ValueError, match="config: .*block_n=192"):
            gemm_rs.kernels(8192, 8192, 4096, 2, "bfloat16", config=N192, path=path)
    # AG+GEMM takes its rows at run time: 128 rows per rank run in 256-row tiles (half of one masked off)
    assert _args(ag_gemm.kernels(4096, 2048, 8192, 32, "bfloat16", config=BIG_M))[0][5] == 256
    with pytest.raises(ValueError, match="M: got 4097, expected a multiple of world_size = 32"):
        ag_gemm.kernels(4097, 2048, 8192, 32, "bfloat16", config=BIG_M)


# ------------------------------------------------------------------ the sweep (bench_gemm_configs.py)
def test_sweep_candidates_and_problems():
    b = _sweep()

    probs = b.problems()
    assert len(probs) == 3 * (len(b.AG_SHAPES) + len(b.RS_SHAPES))        # W = 2, 4 and 8
    assert ("gemm_rs", 8, (8192, 8192, 28672 // 8)) in probs
    assert ("gemm_rs", 4, (8192, 8192, 28672 // 4)) in probs and ("ag_gemm", 4, (8192, 2752, 4096)) in probs
    for e in b.EPILOGUES:
        cs = b.candidates(e)
        assert DEFAULT in cs and len(set(cs)) == len(cs)
        assert all(check(c, 1 << 20, 1 << 20, 1 << 20) is None for c in cs)
    assert all(8192 % c.block_n == 0 for c in b.candidates("signal"))
    for op, W, (M, N, K) in probs:
        ok = [c for c in b.candidates(b.epilogue_of(op)) if check(c, M, N, K, world_size=W, op=op) is None]
        assert 8 <= len(ok) <= 20, (op, W, M, N, K, len(ok))


def _sweep_row(op, W, M, N, K, ranked):
    return dict(op=op, world_size=W, M=M, N=N, K=K, cublas_tflops=700.0,
                ranked=[dict(config=c.to_dict(), us=us, tflops=2.0 * M * N * K / us / 1e6) for c, us in ranked])


def test_write_tuning_round_trip(tmp_path):
    b = _sweep()

    sweep = {"gpu": "NVIDIA H200", "date": "2026-11-23", "rows": [
        _sweep_row("ag_gemm", 2, 8192, 2048, 8192, [(BIG_M, 400.0), (N192, 410.0), (SMALL, 420.0), (DEFAULT, 450.0)]),
        _sweep_row("ag_gemm", 4, 8192, 2048, 8192, [(BIG_M, 401.0), (DEFAULT, 451.0)]),   # same GEMM: first row wins
        _sweep_row("gemm_rs", 2, 8192, 8192, 4096, [(SMALL, 300.0), (DEFAULT, 310.0)]),
    ]}
    src = tmp_path / "sweep.json"
    src.write_text(json.dumps(sweep))
    out = tmp_path / "tuning.json"
    b.main(["--write-tuning", str(out), "--from", str(src), "--keep", "2"])
    t = json.loads(out.read_text())
    assert t["format"] == 1 and "NVIDIA H200" in t["source"] and len(t["entries"]) == 2
    ag = t["entries"][0]
    assert [GemmConfig.from_dict(c) for c in ag["configs"]] == [BIG_M, N192, DEFAULT]   # top 2 + the default
    assert ag["tflops"][0] > ag["tflops"][-1]
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=out) == BIG_M
    assert gemm_config(8192, 2048, 8192, world_size=64, op="ag_gemm", table=out) == N192
    assert gemm_config(8192, 8192, 4096, world_size=2, op="gemm_rs", table=out) == SMALL

# ------------------------------------------------------------- one table, several GPU models (entries' "gpu")
H200, H100, A100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def write_gpu_table(path: Path, entries) -> Path:
    """A table of (gpu or None, op, M, N, K, configs) entries, in this order (None: no "gpu", any GPU)."""
    path.write_text(json.dumps({"format": 1, "source": "test", "entries": [
        {"op": op, **({"gpu": g} if g else {}), "M": M, "N": N, "K": K, "configs": [c.to_dict() for c in cfgs]}
        for g, op, M, N, K, cfgs in entries]}))
    return path


@pytest.fixture
def no_gpu(monkeypatch):
    """torch sees no GPU (as in CI), whatever this machine has."""
    import torch

    gemm._device_name.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield
    gemm._device_name.cache_clear()


def test_selection_prefers_the_current_gpus_entry(tmp_path):
    t = write_gpu_table(tmp_path / "t.json", [(H200, "ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                              (H100, "ag_gemm", 8192, 2048, 8192, [N192]),
                                              (H100, "ag_gemm", 4096, 7168, 8192, [SMALL]),
                                              (H200, "ag_gemm", 8192, 7168, 8192, [DEFAULT])])
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H200) == BIG_M
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == N192
    assert gemm_config(16384, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == N192   # nearest M
    # this GPU's entry of the nearest M before another GPU's of the exact shape
    assert gemm_config(8192, 7168, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == SMALL
    assert gemm_config(8192, 7168, 8192, world_size=2, op="ag_gemm", table=t, gpu=H200) == DEFAULT


def test_selection_falls_back_to_other_gpus_entries(tmp_path):
    t = write_gpu_table(tmp_path / "t.json", [(A100, "ag_gemm", 8192, 2048, 8192, [N192]),
                                              (H200, "ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                              (H200, "gemm_rs", 8192, 8192, 4096, [SMALL]),
                                              (H100, "ag_gemm", 8192, 7168, 8192, [BIG_M]),
                                              (H200, "ag_gemm", 8192, 7168, 8192, [N192])])
    # no H100 entry of this N and K: the other GPUs' entries, the one listed first on a tie
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == N192
    assert gemm_config(8192, 8192, 4096, world_size=2, op="gemm_rs", table=t, gpu=H100) == SMALL
    assert gemm_config(16384, 8192, 4096, world_size=2, op="gemm_rs", table=t, gpu=H100) == SMALL   # nearest M
    # an H100 entry whose configs cannot run it (8192 rows over 64 ranks: block_m 256 does not fit): the H200's
    assert gemm_config(8192, 7168, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == BIG_M
    assert gemm_config(8192, 7168, 8192, world_size=64, op="ag_gemm", table=t, gpu=H100) == N192
    assert gemm_config(8192, 1024, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == DEFAULT   # no N, K


def test_legacy_entries_match_any_gpu(tmp_path):
    t = write_gpu_table(tmp_path / "t.json", [(H200, "ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                              (None, "ag_gemm", 8192, 2048, 8192, [N192]),
                                              (H100, "ag_gemm", 4096, 2048, 8192, [SMALL])])
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=A100) == N192   # the untagged
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H200) == BIG_M  # own tag first
    # an untagged entry of the exact shape counts as this GPU's: it beats the H100's nearest M
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == N192
    assert gemm.load_table(t)[1][5] is None and gemm.load_table(t)[0][5] == H200


def test_no_gpu_uses_every_entry_in_file_order(tmp_path, no_gpu):
    assert gemm.current_gpu() is None
    first = write_gpu_table(tmp_path / "a.json", [(H200, "ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                                  (H100, "ag_gemm", 8192, 2048, 8192, [N192]),
                                                  (H100, "ag_gemm", 8192, 7168, 8192, [SMALL])])
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=first) == BIG_M
    assert gemm_config(8192, 7168, 8192, world_size=2, op="ag_gemm", table=first) == SMALL   # H100's only
    last = write_gpu_table(tmp_path / "b.json", [(H100, "ag_gemm", 8192, 2048, 8192, [N192]),
                                                 (H200, "ag_gemm", 8192, 2048, 8192, [BIG_M])])
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=last) == N192


def test_current_gpu_is_read_when_asked_and_cached_per_device(tmp_path, no_gpu, monkeypatch):
    import torch

    calls = []
    names = {0: H100, 1: H200}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: calls.append(i) or names[i])
    t = write_gpu_table(tmp_path / "t.json", [(H200, "ag_gemm", 8192, 2048, 8192, [BIG_M]),
                                              (H100, "ag_gemm", 8192, 2048, 8192, [N192])])
    device = 0
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t) == N192
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t) == N192
    device = 1
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t) == BIG_M
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=t, gpu=H100) == N192   # given: taken
    assert calls == [0, 1]                                                   # once per device index

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "current_device", broken)
    assert gemm.current_gpu() is None                                        # no error: as without a GPU


def test_tuning_table_writes_the_sweeps_gpu():
    sweep = {"gpu": H100, "date": "2026-12-01", "rows": [
        _sweep_row("ag_gemm", 2, 8192, 2752, 4096, [(GemmConfig(128, 256, 64), 300.0), (DEFAULT, 310.0)]),
        _sweep_row("gemm_rs", 2, 8192, 8192, 4096, [(SMALL, 300.0), (DEFAULT, 310.0)])]}
    t = gemm.tuning_table(sweep)
    assert [e["gpu"] for e in t["entries"]] == [H100, H100] and H100 in t["source"]
    assert list(t["entries"][0])[:3] == ["op", "gpu", "M"]
    del sweep["gpu"]
    assert all("gpu" not in e for e in gemm.tuning_table(sweep)["entries"])   # no GPU named: any GPU


def test_bad_gpu_is_refused(tmp_path):
    p = tmp_path / "bad.json"
    for bad in ("", "  ", 90, ["NVIDIA H200"]):
        p.write_text(json.dumps({"format": 1, "entries": [
            {"op": "ag_gemm", "gpu": H200, "M": 1, "N": 1, "K": 1, "configs": []},
            {"op": "ag_gemm", "gpu": bad, "M": 1, "N": 1, "K": 1, "configs": []}]}))
        with pytest.raises(ValueError, match=re.escape(f"{p}: entries[1].gpu: got {bad!r}, expected a non-empty")):
            gemm.load_table(p)


def test_shipped_table_names_its_gpu():
    """Every entry of the shipped table names the GPU it was measured on (the first listed is what kernels
    compiled without a GPU follow)."""
    if not gemm.TUNING_FILE.exists():
        pytest.skip("no shipped table")
    data = json.loads(gemm.TUNING_FILE.read_text())
    gpus = [e[5] for e in gemm.load_table()]
    assert all(gpus) and gpus[0] == H200 and all(g in data["source"] for g in set(gpus))
    assert gemm.TUNING_FILE.read_text() == json.dumps(data, indent=1) + "\n"   # the layout --write-tuning writes


def test_write_tuning_merge_round_trip(tmp_path, capsys):
    b = _sweep()

    def sweep_file(name, gpu, date, ranked):
        p = tmp_path / name
        p.write_text(json.dumps({"gpu": gpu, "date": date, "rows": [
            _sweep_row("ag_gemm", 2, 8192, 2048, 8192, ranked), _sweep_row("gemm_rs", 2, 8192, 8192, 4096, ranked)]}))
        return str(p)

    out = tmp_path / "tuning.json"
    b.main(["--write-tuning", str(out), "--from", sweep_file("h200.json", H200, "2026-11-25",
                                                               [(SMALL, 300.0), (DEFAULT, 310.0)])])
    b.main(["--write-tuning", str(out), "--from", sweep_file("h100.json", H100, "2026-12-01",
                                                               [(DEFAULT, 300.0), (SMALL, 310.0)]),
            "--merge", str(out)])
    assert f"4 entries: 2 of {H200}, 2 of {H100}" in capsys.readouterr().out
    t = json.loads(out.read_text())
    assert [e["gpu"] for e in t["entries"]] == [H200, H200, H100, H100]
    assert t["source"].count("bench_gemm_configs.py on") == 2 and H200 in t["source"] and H100 in t["source"]
    for gpu, cfg in ((H200, SMALL), (H100, DEFAULT), (A100, SMALL)):       # A100: none of its own, H200's first
        assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=out, gpu=gpu) == cfg, gpu
        assert gemm_config(8192, 8192, 4096, world_size=2, op="gemm_rs", table=out, gpu=gpu) == cfg, gpu
    # a new sweep of a GPU already listed replaces its entries where they were
    b.main(["--write-tuning", str(out), "--from", sweep_file("h200b.json", H200, "2026-12-02", [(DEFAULT, 1.0)]),
            "--merge", str(out)])
    t = json.loads(out.read_text())
    assert [e["gpu"] for e in t["entries"]] == [H200, H200, H100, H100] and "2026-11-25" not in t["source"]
    assert gemm_config(8192, 2048, 8192, world_size=2, op="ag_gemm", table=out, gpu=H200) == DEFAULT
    # legacy entries (no gpu): kept for any GPU, or tagged with --legacy-gpu (then replaced if it is the sweep's)
    legacy = write_table(tmp_path / "legacy.json", [("ag_gemm", 8192, 2048, 8192, [BIG_M])])
    h100 = sweep_file("h100b.json", H100, "2026-12-03", [(SMALL, 1.0)])
    b.main(["--write-tuning", str(out), "--from", h100, "--merge", str(legacy)])
    assert "3 entries: 1 of any GPU, 2 of NVIDIA H100" in capsys.readouterr().out
    assert "gpu" not in json.loads(out.read_text())["entries"][0]
    b.main(["--write-tuning", str(out), "--from", h100, "--merge", str(legacy), "--legacy-gpu", H200])
    assert [e["gpu"] for e in json.loads(out.read_text())["entries"]] == [H200, H100, H100]
    b.main(["--write-tuning", str(out), "--from", h100, "--merge", str(legacy), "--legacy-gpu", H100])
    assert [e["gpu"] for e in json.loads(out.read_text())["entries"]] == [H100, H100]
    with pytest.raises(SystemExit):
        b.main(["--write-tuning", str(out), "--from", h100, "--legacy-gpu", H200])   # --legacy-gpu needs --merge
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "entries": [{"op": "ag_gemm", "gpu": "", "M": 1, "N": 1, "K": 1,
                                                          "configs": []}]}))
    with pytest.raises(ValueError, match=re.escape(f"{bad}: entries[0].gpu")):
        b.main(["--write-tuning", str(out), "--from", h100, "--merge", str(bad)])


# --------------------------------------------------------------------- builds for sm_90a (no GPU)
def build_jobs() -> dict:
    """The fused kernels with non-default configs and the sweep's kernel, as build_pool jobs (also built
    ahead by tests/prebuild_cpu_tier.py)."""
    import tilescale
    from tilescale.toolchain import stub_libcuda_dir

    b = _sweep()
    _, ag = allgather_gemm.kernels(4096, 2048, 1024, 4, "bfloat16", config=BIG_M, sms=0)   # the others' rows, 2-D
    split = (allgather_gemm.ag_gemm_kernel,                  # own rows at W = 2 (352 tiles), split on 132 SMs
             (2752, 1024, 2, 0, "bfloat16", 128, 256, 64, 3, 256, 10, False, True, 132))
    [push] = gemm_reduce_scatter.kernels(4096, 2048, 4096, 2, "bfloat16", config=SMALL, path="push")
    _, red = gemm_reduce_scatter.kernels(4096, 2048, 1024, 2, "bfloat16", config=SMALL, path="pull")
    stub = stub_libcuda_dir()
    sweep_tir = b.gemm_kernel.get_tir(*b.kernel_key(SMALL, "signal"))
    return {
        "ag_gemm": ag,
        "ag_gemm_split": split,
        "gemm_rs": push,
        "gemm_rs_reduce": red,
        "sweep": lambda: tilescale.build(sweep_tir, compile_flags=[f"-L{stub}"] if stub else []),
    }


@pytest.fixture(scope="module")
def gemm_builds():
    """The kernels of build_jobs(), built side by side."""
    from build_pool import build_all

    return build_all(build_jobs()).wait()


def test_non_default_configs_build_in_the_fused_kernels(gemm_builds):
    r = gemm_builds["ag_gemm"]
    assert "tl::rasterization2DRow<4>" in r.source and "wait_until" in r.source
    r = gemm_builds["gemm_rs"]                                      # the push kernel (one node), one block per SM
    assert "blockIdx.y" not in r.source                                          # a 1-D grid: one block per SM
    assert "__launch_bounds__(256" in r.source                     # 128 multiplying threads + 4 warps of roles
    assert "empty[0].init(128);" in r.source and "summed[0].init(128);" in r.source
    assert "tilescale::store_tile((&(((bfloat16_t*)Rs)[0])), (&(Rp[" in r.source    # pushed by warps 1-3, counted
    assert r.source.count("tilescale::release_stores<2") == 1 and "tma_store" not in r.source
    assert "atom_add" not in r.source                                             # (not one release per thread)
    r = gemm_builds["gemm_rs_reduce"]
    assert "wait_until_pe" in r.source


def test_split_plan_splits_only_a_short_last_wave():
    from tilescale.ops.gemm import SplitPlan, split_plan

    p = split_plan(704, 132, 64)                  # 8192x2752 in 128x256 tiles: 5 waves + 44 tiles
    assert p == SplitPlan(704, 660, 3) and p.tail == 44 and p.blocks == 660 + 132
    assert split_plan(352, 132, 64) == SplitPlan(352, 264, 3)
    assert split_plan(88, 132, 16) == SplitPlan(88, 0, 3)        # less than a wave: every tile split
    assert split_plan(528, 132, 64).split == 1                   # whole waves: nothing to split
    assert split_plan(1792, 132, 128).split == 1                 # 76 tail tiles of 14 waves: not worth it
    assert split_plan(3584, 132, 128).split == 1                 # 20 of 28 waves: gains < 2%
    assert split_plan(704, 132, 8).split == 2 and split_plan(704, 132, 7).split == 1   # 4 K tiles per slice at least
    assert split_plan(704, 132, 64, min_gain=0.5).split == 1
    with pytest.raises(ValueError, match="tiles=0"):
        split_plan(0, 132, 64)


def test_ag_gemm_splits_its_tail_in_the_kernel(gemm_builds):
    """The split GEMM of AG+GEMM (own rows at W = 2): a 1-D grid of 264 whole tiles + 88 x 3 slices at the bound
    (8192 rows); a call of fewer rows splits as its own plan says (the split factor and tail tiles are arguments of
    the call); slices count their partial sums (release at GPU scope), the last slice waits for this call's count
    on top of the fix-ups before, stores, then counts what it took."""
    from tilescale.ops import allgather_gemm as agm
    from tilescale.ops.gemm import SplitPlan

    assert agm.grid_plan(8192, 2752, 1024, 2, 128, 256, 64, 132, True).blocks == 264 + 88 * 3   # the build below
    jobs = agm.kernels(8192, 2752, 1024, 2, "bfloat16", config=DEFAULT)
    assert [agm.kernel_plan(a, 8192).split for _, a in jobs] == [3, 3]
    assert jobs[0][1] == (2752, 1024, 2, 0, "bfloat16", 128, 256, 64, 3, 256, 10, False, True, 132)
    assert [agm.kernel_plan(a, 8192).split for _, a in agm.kernels(8192, 2752, 1024, 4, "bfloat16", config=DEFAULT)] \
        == [3, 1]
    [(_, ws1)] = agm.kernels(8192, 2752, 1024, 1, "bfloat16", config=DEFAULT)
    for rows in (8192, 2048, 256, 1920):        # each call as a kernel built for its rows alone: grid_plan
        assert agm.kernel_plan(ws1, rows) == agm.grid_plan(rows, 2752, 1024, 1, 128, 256, 64, 132, True)
    assert agm.kernel_plan(ws1, 8192).blocks == 660 + 44 * 3 and agm.kernel_plan(ws1, 2048).blocks == 132 + 44 * 3
    assert agm.kernel_plan(ws1, 256) == SplitPlan(22, 0, 4)   # less than a wave: in 4 slices, not the bound's 3
    # one workspace for every call: the most partial sums and tail tiles any call up to the bound takes
    tiles, words = agm.split_space(ws1, 8192)
    plans = [agm.grid_plan(r * 128, 2752, 1024, 1, 128, 256, 64, 132, True) for r in range(1, 65)]
    assert (tiles, words) == (max(p.tail * (p.split - 1) for p in plans), max(p.tail for p in plans if p.split > 1))
    [(_, plain)] = agm.kernels(8192, 2752, 1024, 1, "bfloat16", config=DEFAULT, sms=0)
    assert agm.kernel_plan(plain, 8192).split == 1
    src = gemm_builds["ag_gemm_split"].source
    assert "rasterization2D" not in src
    assert "int slices, int tail" in src                   # the call's split factor and tail tiles
    assert "tilescale::release_stores<1" in src                                 # slices: counted at GPU scope
    wait = src.index("tilescale::wait_until<unsigned long long>((&(tail_arrived")
    assert src.index("tilescale::release_stores<1") < wait
    assert "(tail_fixed[" in src[wait:wait + 400] and "((slices * 8) - 8)" in src[wait:wait + 600]   # + (s - 1) x 8
    assert wait < src.rindex("tl::tma_store(") < src.index("] = (tail_fixed[")   # counted after the tile's store


def test_sweep_kernel_builds_with_the_signal_epilogue(gemm_builds):
    r = gemm_builds["sweep"]   # GEMM+RS's epilogue: a TMA store, then each consumer warp counts it
    assert "tma_store" in r.source and "tma_load" in r.source and "tilescale::release_stores<2" in r.source


def test_push_benchmark_diagnostics_change_one_thing_each():
    """bench_gemm_configs --push splits what GEMM+RS's kernels cost: "signal_gpu" is "signal" with its count released
    at GPU scope instead of system scope; "tma_cn" is "tma" after a T.call_number."""
    from test_codegen import kernel_function, lower_source

    b = _sweep()
    src = {e: kernel_function(lower_source(b.gemm_kernel.get_tir(*b.kernel_key(SMALL, e))))
           for e in ("signal", "signal_gpu")}
    assert "release_stores<2," in src["signal"] and "tl::tma_store(C_desc" in src["signal"]
    assert "release_stores<1," in src["signal_gpu"] and "release_stores<2," not in src["signal_gpu"]
    assert src["signal_gpu"].replace("release_stores<1,", "release_stores<2,") == src["signal"]
    cn = kernel_function(lower_source(b.gemm_call_number_kernel.get_tir(*b.kernel_key(SMALL, "tma")[:6])))
    tma = kernel_function(lower_source(b.gemm_kernel.get_tir(*b.kernel_key(SMALL, "tma"))))
    assert cn.index("tilescale::call_number(") < cn.index("wgmma") and "call_number" not in tma   # tma_cn: tma + it
    assert cn.count("tl::tma_store(") == tma.count("tl::tma_store(") and "release_stores" not in cn
    with pytest.raises(ValueError, match="epilogue"):
        b.gemm_kernel.get_tir(*b.kernel_key(SMALL, "signal_cta"))


# ------------------------------------------------------------------------------------ on GPUs
@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_fused_ops_with_non_default_configs_on_gpus(nranks):
    from tilescale import testing

    testing.skip_unless_ranks(nranks)
    proc = testing.launch(REPO / "tests" / "gpu" / "gemm_configs_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: fused ops with 7 non-default configs")


@pytest.mark.gpu
def test_ag_gemm_with_a_split_tail_on_one_gpu():
    from tilescale import testing

    testing.skip_unless_ranks(1)
    proc = testing.launch(REPO / "tests" / "gpu" / "ag_gemm_split_main.py", 1, timeout=300)
    testing.assert_all_ranks_ok(proc, 1, marker="OK: AG+GEMM on a split-tail shape")


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_ag_gemm_with_a_split_tail_on_gpus(nranks):
    from tilescale import testing

    testing.skip_unless_ranks(nranks)
    proc = testing.launch(REPO / "tests" / "gpu" / "ag_gemm_split_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: AG+GEMM on a split-tail shape")


def test_persistent_kernel_counts_each_tile_before_the_next_store():
    """bench_gemm_configs --persistent: tile i is counted after tile i + 1's main loop and before tile i + 1's store
    (its write long done, no store in flight), the block's last tile once written; by the consumer warps only; tiles
    in the swizzled launch order; the C tile has shared memory of its own (not the pipeline's). `pending` outside
    0-7 is refused by name."""
    import sys

    from tilescale.errors import LanguageError

    sys.path.insert(0, str(REPO / "tests"))
    from test_codegen import kernel_function, lower_source

    b = _sweep()
    src = kernel_function(lower_source(b.gemm_persistent_kernel.get_tir(128, 256, 64, 3, 256, 10)))
    counts = [m.start() for m in re.finditer(r"tilescale::release_stores<2, unsigned long long, 0>\(", src)]
    assert len(counts) == 2 and "release_stores<2, unsigned long long, 1>" not in src
    deferred, last = counts
    assert src.index("wgmma") < deferred < src.index("tl::tma_store(C_desc") < last
    assert src.rfind("if (128 <= ((int)threadIdx.x))", 0, last) > deferred   # the last count: consumer threads only
    assert "min(10, (((m + 127) >> 7)" in src                             # panels of 10 rows of tiles (the last:
    plain = kernel_function(lower_source(b.gemm_persistent_kernel.get_tir(128, 256, 64, 3, 256, 0)))  # what is left)
    assert "min(" not in plain                                            # swizzle 0: row by row
    offsets = dict(re.findall(r"void\* (As|Bs|Cs) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", src))
    assert len(set(offsets.values())) == 3, offsets                      # C does not reuse the pipeline's buffers

    @tilescale.jit
    def bad():
        @T.prim_func
        def k(done: T.Tensor((4,), "uint64")):
            with T.Kernel(1, threads=32):
                T.release_stores(done[0], 1, pending=8)
        return k

    with pytest.raises(LanguageError, match=r"release_stores.*pending: got 8, expected an int from 0 to 7"):
        bad.get_tir()
