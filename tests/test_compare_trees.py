"""Old tree vs new tree benchmarks on CPU: benchmarks/compare_runs.py on small JSONs in the format the benchmark
scripts write (commit 7fb3089's and today's write the same keys), benchmarks/old_tree.sh's folder, and
tests/gpu/compare_trees.sh's check that each tree imports its own tilescale."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent
COMPARE = REPO / "benchmarks" / "compare_runs.py"
OLD_TREE = REPO / "benchmarks" / "old_tree.sh"
COMPARE_TREES = REPO / "tests" / "gpu" / "compare_trees.sh"

sys.path.insert(0, str(REPO / "benchmarks"))
import compare_runs  # noqa: E402


def _cfg(bm=128, bn=256, bk=64, st=3, th=256, sw=10):
    return dict(block_m=bm, block_n=bn, block_k=bk, stages=st, threads=th, swizzle=sw)


def gemm_configs_json():
    """bench_gemm_configs.py's report(): the same GEMM at W=2 and W=4 (ag_gemm) repeats its timings."""
    ranked = [dict(config=_cfg(), us=100.0, tflops=1.0, ratio=0.9, tiles=64, wave_eff=0.5),
              dict(config=_cfg(128, 128, 64, 4), us=110.0, tflops=1.0, ratio=0.8, tiles=128, wave_eff=0.9)]
    rows = []
    for w in (2, 4):
        rows.append(dict(op="ag_gemm", world_size=w, M=4096, N=2048, K=8192, epilogue="tma", cublas_us=90.0,
                         cublas_tflops=1.0, best=_cfg(), best_us=100.0, best_tflops=1.0, ratio=0.9, default_us=100.0,
                         default_ratio=0.9, ranked=copy.deepcopy(ranked), notes={}))
    rows.append(dict(op="gemm_rs", world_size=2, M=8192, N=8192, K=4096, epilogue="stores", cublas_us=300.0,
                     cublas_tflops=1.0, best=_cfg(), best_us=320.0, best_tflops=1.0, ratio=0.94, default_us=320.0,
                     default_ratio=0.94, ranked=[dict(config=_cfg(), us=320.0, tflops=1.0, ratio=0.94, tiles=1,
                                                      wave_eff=1.0)], notes={}))
    return dict(gpu="NVIDIA H100 80GB HBM3", date="2026-11-24", reps=7, rows=rows, skipped=[])


def build_modes_json():
    rows = [dict(variant="tilelang", backend="tvm_ffi", mode="-", ms=1.5, tflops=700.0, vs_tilelang=1.0, err=0.002),
            dict(variant="inlined", backend="cython", mode="inlined", ms=1.6, tflops=680.0, vs_tilelang=0.97,
                 err=0.002),
            dict(variant="cuBLAS", backend="cuBLAS", mode="-", ms=1.4, tflops=720.0, vs_tilelang=1.03, err=None)]
    return dict(size=8192, rows=rows)


def fused_json():
    def row(op, M, K, N, base):
        return dict(op=op, M=M, K=K, N=N, nccl=base, cublas=base * 2, nccl_cublas=base * 3, tilescale=base * 2.5,
                    ts_gemm=base * 2.2, ideal=base * 2, ratio_to_ideal=1.25, gemm_eff=0.9, speedup_vs_nccl_cublas=1.2)

    return dict(env=dict(gpu="NVIDIA H100 80GB HBM3", torch="2.9", world_size=1), dtype="bfloat16",
                rows=[row("ag_gemm", 4096, 8192, 2048, 100.0), row("gemm_rs", 8192, 8192, 8192, 300.0)])


MAKERS = {"gemm_configs": gemm_configs_json, "build_modes": build_modes_json, "fused": fused_json}


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def _run(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(COMPARE), *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def _table_rows(out: str) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "key":
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_same_runs_match_every_row(tmp_path, kind):
    old = MAKERS[kind]()
    new = json.loads(json.dumps(old).replace(".0,", ".5,"))   # sub-percent noise on the round numbers
    assert compare_runs.detect_kind(old) == kind
    r = _run(_write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new), "--all", "--fail-if-moved")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _table_rows(r.stdout)
    assert rows and all(v[3] == "same" for v in rows.values()), r.stdout
    n = {"gemm_configs": 5, "build_modes": 3, "fused": 10}[kind]   # gemm: 2 cuBLAS + 3 configs (W deduplicated)
    assert len(rows) == n
    assert re.search(rf"summary {kind}: {n} rows, 0 moved .*0 in one run only", r.stdout), r.stdout


def test_keys_name_shape_op_config_and_mode():
    g = compare_runs.rows_gemm_configs(gemm_configs_json())
    assert set(g) == {"ag_gemm 4096x2048x8192 cuBLAS", "ag_gemm 4096x2048x8192 128x256x64 s3 t256 sw10 (default)",
                      "ag_gemm 4096x2048x8192 128x128x64 s4 t256 sw10", "gemm_rs 8192x8192x4096 cuBLAS",
                      "gemm_rs 8192x8192x4096 128x256x64 s3 t256 sw10 (default)"}
    assert g["ag_gemm 4096x2048x8192 cuBLAS"].reference
    assert not g["ag_gemm 4096x2048x8192 128x128x64 s4 t256 sw10"].shown
    b = compare_runs.rows_build_modes(build_modes_json())
    assert b["8192^3 inlined [cython/inlined]"].us == pytest.approx(1600.0)      # ms -> us
    assert b["8192^3 cuBLAS"].reference and not b["8192^3 tilelang [tvm_ffi]"].reference
    f = compare_runs.rows_fused(fused_json())
    assert f["W=1 gemm_rs 8192x8192x8192 tilescale"].us == 750.0 and f["W=1 ag_gemm 4096x8192x2048 nccl"].reference
    groups = {**fused_json(), "group_size": 2}      # bench_fused.py --group-size 2: matches a world of 2
    groups["env"] = {**groups["env"], "world_size": 4}
    assert "W=2 gemm_rs 8192x8192x8192 tilescale" in compare_runs.rows_fused(groups)


def test_a_moved_row_is_flagged_and_fails_only_when_asked(tmp_path):
    old, new = fused_json(), fused_json()
    new["rows"][1]["tilescale"] *= 1.10
    po, pn = _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new)
    r = _run(po, pn)
    assert r.returncode == 0, r.stderr
    rows = _table_rows(r.stdout)
    assert rows["W=1 gemm_rs 8192x8192x8192 tilescale"] == ["750.0", "825.0", "1.100", "moved"]
    assert sum(v[3] == "moved" for v in rows.values()) == 1
    assert "10 rows, 1 moved (> 3.0%), 0 in one run only; tilescale's: 4 rows, 1 moved, max |change| 10.0%" in r.stdout
    assert _run(po, pn, "--fail-if-moved").returncode == 1
    assert _run(po, pn, "--fail-if-moved", "--tol", "12%").returncode == 0    # within a wider tolerance
    assert _run(po, pn, "--fail-if-moved", "--tol", "0.12").returncode == 0


def test_a_moved_config_not_shown_still_counts(tmp_path):
    old, new = gemm_configs_json(), gemm_configs_json()
    for r in new["rows"][:2]:
        r["ranked"][1]["us"] = 150.0     # a non-default config: hidden without --all
    r = _run(_write(tmp_path / "o.json", old), _write(tmp_path / "n.json", new), "--fail-if-moved")
    assert r.returncode == 1
    assert "128x128x64 s4" not in r.stdout.split("summary")[0].split("more rows")[0]
    assert "(1 more rows not shown (--all shows them), 1 of them moved)" in r.stdout
    assert "5 rows, 1 moved" in r.stdout
    assert _table_rows(_run(tmp_path / "o.json", tmp_path / "n.json", "--all").stdout)[
        "ag_gemm 4096x2048x8192 128x128x64 s4 t256 sw10"][3] == "moved"


def test_rows_in_one_run_are_listed(tmp_path):
    old, new = build_modes_json(), build_modes_json()
    del new["rows"][1]                                   # 'inlined' missing from the new run
    new["rows"].append(dict(variant="rdc", backend="cython", mode="rdc", ms=2.0, tflops=1.0, vs_tilelang=1.0))
    po, pn = _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new)
    r = _run(po, pn)
    assert r.returncode == 0
    rows = _table_rows(r.stdout)
    assert rows["8192^3 inlined [cython/inlined]"] == ["1600", "-", "-", "only old"]
    assert rows["8192^3 rdc [cython/rdc]"] == ["-", "2000", "-", "only new"]
    assert "4 rows, 0 moved (> 3.0%), 2 in one run only" in r.stdout
    assert _run(po, pn, "--fail-if-moved").returncode == 1


def test_mode_change_does_not_match(tmp_path):
    old, new = build_modes_json(), build_modes_json()
    new["rows"][1]["backend"], new["rows"][1]["mode"] = "cython", "rdc"   # the same variant built another way
    rows = _table_rows(_run(_write(tmp_path / "o.json", old), _write(tmp_path / "n.json", new)).stdout)
    assert rows["8192^3 inlined [cython/inlined]"][3] == "only old"
    assert rows["8192^3 inlined [cython/rdc]"][3] == "only new"


def test_dirs_compare_every_benchmark_and_report_a_missing_run(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    for k, make in MAKERS.items():
        _write(tmp_path / "old" / f"{k}.json", make())
        if k != "fused":
            _write(tmp_path / "new" / f"{k}.json", make())
    out = tmp_path / "compare.md"
    r = _run("--dirs", tmp_path / "old", tmp_path / "new", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "### gemm_configs" in r.stdout and "### build_modes" in r.stdout
    assert re.search(r"\| fused \| - \| - \| - \| not compared \|", r.stdout)
    assert re.search(r"\| build_modes \| 3 \| 0 \| 0 \| 0.0% \| 0.0% \|", r.stdout)
    assert out.read_text().strip() == r.stdout.strip()
    assert _run("--dirs", tmp_path / "old", tmp_path / "new", "--fail-if-moved").returncode == 1
    (tmp_path / "old" / "fused.json").unlink()
    assert _run("--dirs", tmp_path / "old", tmp_path / "new", "--fail-if-moved").returncode == 0


def test_bad_input_exits_2(tmp_path):
    po = _write(tmp_path / "o.json", build_modes_json())
    pn = _write(tmp_path / "n.json", fused_json())
    r = _run(po, pn)
    assert r.returncode == 2 and "not the same benchmark" in r.stderr
    assert _run(po, _write(tmp_path / "x.json", {"rows": []})).returncode == 2
    assert _run(po).returncode == 2


@pytest.mark.parametrize("script,keys", [
    ("bench_gemm_configs.py", ["op=", "M=", "N=", "K=", "cublas_us=", "default_us=", "ranked=", "config=", "us="]),
    ("bench_build_modes.py", ["variant=", "backend=", "mode=", "ms=", "size="]),
    ("bench_fused.py", ["op=", "M=", "K=", "N=", *(f"{c}=" for c in ("nccl", "cublas", "nccl_cublas", "tilescale",
                                                                        "ts_gemm")), '"async_tp"', "world_size"]),
])
def test_benchmarks_still_write_the_keys_compared(script, keys):
    """compare_runs.py reads these keys; a benchmark that renames one would make its rows vanish."""
    src = (REPO / "benchmarks" / script).read_text() + (REPO / "benchmarks" / "timing.py").read_text()
    missing = [k for k in keys if k not in src]
    assert not missing, f"{script} no longer writes {missing}: update benchmarks/compare_runs.py"


# ---------------------------------------------------------------------------------------------- the old tree
def _env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO)          # as the device prelude sets it: the repo root (the new tree) on the path
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["PYTHON"] = sys.executable
    e.pop("GPUS", None)
    e.update(extra)
    return e


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory):
    dest = tmp_path_factory.mktemp("bench") / "old"
    r = subprocess.run(["bash", str(OLD_TREE), "HEAD", str(dest)], capture_output=True, text=True, timeout=120,
                       cwd=str(REPO), env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return dest, r.stdout


def test_old_tree_archive(old_tree):
    dest, out = old_tree
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    assert (dest / "BENCH_REV").read_text().split()[0] == head
    for p in ("launch.sh", "tilescale/__init__.py", "benchmarks/bench_fused.py", "benchmarks/timing.py"):
        assert (dest / p).is_file(), p
    assert not (dest / ".git").exists() and not (dest / "benchmarks" / "results").exists()
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    assert size < 20 * 1024 * 1024
    assert re.search(r"in .*old: \d+ files, \d+ KiB", out)


def test_old_tree_imports_its_own_tilescale(old_tree):
    dest, _ = old_tree
    # the command of the GPU session: from the old folder, its folder first on PYTHONPATH
    probe = "import tilescale; print(tilescale.__file__)"
    r = subprocess.run(["bash", "-c", f'cd "{dest}" && PYTHONPATH="$PWD:$PYTHONPATH" "$PYTHON" -c "{probe}"'],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.stdout.strip() == str(dest / "tilescale" / "__init__.py"), r.stdout + r.stderr


@pytest.mark.skipif(testing.gpu_count() > 0, reason="a GPU here: launch.sh would run the probe under torchrun")
def test_old_tree_launch_sh_runs_its_own_tilescale(old_tree, tmp_path):
    """The old tree's launch.sh (compile-only on a machine without GPUs) runs a program that imports the old tilescale
    even with the repo root on PYTHONPATH: what `cd .bench-old && GPUS=1 bash launch.sh benchmarks/...` runs."""
    dest, _ = old_tree
    probe = tmp_path / "probe.py"
    probe.write_text("import tilescale\nprint('TILESCALE_FILE', tilescale.__file__)\n")
    r = subprocess.run(["bash", "launch.sh", str(probe)], capture_output=True, text=True, timeout=300, cwd=dest,
                       env=_env(GPUS="1", TILESCALE_SKIP_DOCTOR="1"))
    assert f"TILESCALE_FILE {dest / 'tilescale' / '__init__.py'}" in r.stdout, r.stdout + r.stderr


def _compare_trees(args, old, tmp_path, **env):
    e = _env(OLD_TREE=str(old), CACHE_ROOT=str(tmp_path / "c"), **env)
    return subprocess.run(["bash", str(COMPARE_TREES), str(tmp_path / "out"), *args], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO), env=e)


def test_compare_trees_check_each_tree_imports_its_own(old_tree, tmp_path):
    dest, _ = old_tree
    r = _compare_trees(["check"], dest, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"old tree imports {dest / 'tilescale' / '__init__.py'}" in r.stdout
    assert f"new tree imports {REPO / 'tilescale' / '__init__.py'}" in r.stdout
    assert "check@old: ok" in r.stdout and "check@new: ok" in r.stdout


def test_compare_trees_check_fails_without_the_old_tilescale(old_tree, tmp_path):
    """The check is not vacuous: an old folder without its tilescale must not pass on the new tree's."""
    dest, _ = old_tree
    broken = tmp_path / "broken"
    (broken / "benchmarks").mkdir(parents=True)
    for f in ("launch.sh", "BENCH_REV"):
        (broken / f).write_text((dest / f).read_text())
    r = _compare_trees(["check"], broken, tmp_path)
    assert "check@old: FAILED" in r.stdout and "check@new: ok" in r.stdout, r.stdout + r.stderr


def test_compare_trees_refuses_without_old_tree_or_with_unknown_step(tmp_path, old_tree):
    r = _compare_trees(["check"], tmp_path / "nothing", tmp_path)
    assert r.returncode == 2 and "no old tree" in r.stderr
    r = _compare_trees(["bogus"], old_tree[0], tmp_path)
    assert r.returncode == 2 and "unknown step bogus" in r.stderr


def test_compare_trees_prints_the_tables_of_json_there(old_tree, tmp_path):
    out = tmp_path / "out"
    for side in ("old", "new"):
        (out / side).mkdir(parents=True)
        _write(out / side / "build_modes.json", build_modes_json())
    r = _compare_trees(["compare"], old_tree[0], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "summary build_modes: 3 rows, 0 moved" in r.stdout and (out / "compare.md").is_file()
