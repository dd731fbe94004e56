"""The README's quickstart is the code a newcomer copies first: its kernel is the one the quickstart example
runs (so the example's tests cover it), and on GPUs the block itself runs, as written, on 2 ranks."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent


def quickstart_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "no python block under ## Quickstart"
    return m.group(1)


def _function(src: str, name: str) -> str:
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.dump(fn, include_attributes=False)


def test_quickstart_kernel_is_the_examples():
    block = quickstart_block()
    example = (REPO / "examples" / "distributed" / "example_quickstart.py").read_text()
    assert _function(block, "ring") == _function(example, "ring"), "README's ring() differs from the example's"
    for line in ("info = tilescale.init_distributed()", "tilescale.finalize()", "tilescale.synchronize()"):
        assert line in block, line


@pytest.mark.multigpu
def test_quickstart_block_runs_as_written(tmp_path):
    testing.skip_unless_ranks(2)
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_block())
    proc = testing.launch(script, 2, timeout=300)
    testing.assert_all_ranks_ok(proc, 2)


@pytest.mark.skipif(testing.gpu_count() > 0, reason="this machine has GPUs: the block would run")
def test_quickstart_block_compiles_without_gpus(tmp_path):
    """Saved as a file and started as the README says (tilescale run -n 2), on a machine without GPUs: its kernel is
    built, the run stops where it reads GPU data, and the launcher says it needs 2 GPUs (exit 2)."""
    assert "tilescale run -n 2 quickstart.py" in (REPO / "README.md").read_text()
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_block())
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "TILESCALE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("GPUS", None)
    r = subprocess.run([sys.executable, "-m", "tilescale", "run", "-n", "2", "quickstart.py"], capture_output=True,
                       text=True, timeout=600, env=env, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "quickstart.py needs 2 GPUs, found 0: kernels compiled" in r.stderr, out
    built = re.findall(r"^compile-only: built ring for world size 2: (\S+)$", r.stdout, re.M)
    assert len(built) == 1 and Path(built[0]).is_relative_to(tmp_path / "cache") and Path(built[0]).is_file(), out
    assert re.search(r"^compile-only: stopped at quickstart.py:\d+: assert recv", r.stdout, re.M), out
    assert not list((tmp_path / "tmp").iterdir()), "the compile left files in TMPDIR"


def test_the_install_lines_are_what_ci_checks():
    """.ci/run installs exactly the README's CUDA 13 line and resolves its CUDA 12 line."""
    text = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert '    pip install -e ".[cu13,test]"' in text and 'pip install -q -e ".[cu13,test]"' in ci
    cu12 = re.search(r"^    pip install (-e \"\.\[cu12,test\]\" -c (\S+) --extra-index-url (\S+))$", text, re.M)
    assert cu12, "no CUDA 12 install line"
    assert (REPO / cu12.group(2)).is_file()
    assert f'CU12_INSTALL=(-e ".[cu12,test]" -c {cu12.group(2)} --extra-index-url "$TORCH_CU12")' in ci
    assert f"TORCH_CU12={cu12.group(3)}" in ci


def test_the_results_table_is_the_results_file():
    """Every number of the README's 4 x H200 table is the committed results file's, rounded."""
    import json

    text = (REPO / "README.md").read_text()
    rows = json.loads((REPO / "benchmarks" / "results" / "4xH200" / "fused.json").read_text())["rows"]
    by_key = {(r["op"], f"{r['M']}x{r['K']}x{r['N']}"): r for r in rows}
    table = re.findall(r"^\| (AG\+GEMM|GEMM\+RS) \| (\d+x\d+x\d+) \| (\d+) us \| (\d+) us \| (\d+) us \| ([\d.]+) \|$",
                       text, re.M)
    assert len(table) == 10, table
    for op, shape, nccl_cublas, async_tp, ts, ideal in table:
        r = by_key[({"AG+GEMM": "ag_gemm", "GEMM+RS": "gemm_rs"}[op], shape)]
        assert (int(nccl_cublas), int(async_tp), int(ts)) == (round(r["nccl_cublas"]), round(r["async_tp"]),
                                                               round(r["tilescale"])), (op, shape)
        assert ideal == f"{r['ratio_to_ideal']:.2f}", (op, shape)
    assert "![The fused ops on 4 x H200" in text and "(benchmarks/results/4xH200/fused.png)" in text


def test_the_readme_is_a_front_door():
    """At most 250 lines; every local link and image exists; no lab-notebook labels (run numbers, issue items)."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [ln for ln in links if not ln.startswith(("http://", "https://"))]
    assert local and not [ln for ln in local if not (REPO / ln).exists()], local
    labels = re.findall(r"\b(?:runs? \d+|RESULTS\.md run|[Ii]ssue \d+|\b[JMN]\d+\b)", text)
    assert not labels, labels


def test_the_docs_say_what_the_job_trusts_and_who_shares_the_host_lock():
    """Two limits a user must know, said where they look: the job's store has no authentication (the README: the job
    trusts its host and its network), and the shared-GPU mode's host lock is host-wide, any local process can hold
    it, and its error names the holder (docs/shared-gpu.md)."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "The job trusts its host and its network" in readme and "MASTER_ADDR:PORT" in readme
    assert "without authentication" in readme
    shared = " ".join((REPO / "docs" / "shared-gpu.md").read_text().split())
    assert "The lock is host-wide" in shared and "shared by every user and container" in shared
    assert "names the holder (pid and uid)" in shared
