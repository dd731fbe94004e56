"""The repository conftest.py: GPU tiers are skipped with a reason where the GPUs are missing, and a run
in which every test was skipped fails."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

INI = """[pytest]
markers =
    gpu: needs one CUDA GPU
    multigpu: needs 2-4 GPUs
addopts = -ra -p no:cacheprovider
"""


def _pytest(tmp_path: Path, tests: str, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_sample.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if k != "TILESCALE_WAIT_TIMEOUT_S"}  # conftest sets it
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, env=env)


SAMPLE = """
import pytest

@pytest.mark.gpu
def test_needs_one_gpu():
    pass

@pytest.mark.multigpu
def test_needs_two_gpus():
    pass

def test_cpu():
    pass

def test_env_default():
    import os
    assert os.environ["TILESCALE_WAIT_TIMEOUT_S"] == "30"
"""


def test_gpu_tests_are_skipped_with_a_reason(tmp_path):
    from tilescale import testing

    if testing.gpu_count() >= 1:
        import pytest

        pytest.skip("this machine has a GPU")
    r = _pytest(tmp_path, SAMPLE)
    assert r.returncode == 0, r.stdout
    assert "2 passed, 2 skipped" in r.stdout, r.stdout
    assert "'multigpu' test needs a CUDA GPU (2 rank(s), which may share it); torch sees none" in r.stdout
    assert "'gpu' test needs a CUDA GPU (1 rank(s), which may share it); torch sees none" in r.stdout


RANKED = """
import pytest

@pytest.mark.gpu
def test_one():
    pass

@pytest.mark.multigpu
def test_fixed_two():
    pass

@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_sized(nranks):
    pass

def test_cpu():
    pass
"""


def test_ranks_option_selects_gpu_tests_by_world_size(tmp_path):
    """`--ranks 4` keeps the 4-rank cases (and every CPU test); `--ranks 1,2` the one-GPU and 2-rank ones."""
    r = _pytest(tmp_path, RANKED, "--co", "--ranks", "4")
    assert "test_sized[4]" in r.stdout and "test_sized[2]" not in r.stdout, r.stdout
    assert "test_fixed_two" not in r.stdout and "test_one" not in r.stdout and "test_cpu" in r.stdout, r.stdout
    assert "3 deselected" in r.stdout, r.stdout
    r = _pytest(tmp_path, RANKED, "--co", "--ranks", "1,2")
    for name in ("test_one", "test_fixed_two", "test_sized[2]", "test_cpu"):
        assert name in r.stdout, r.stdout
    assert "test_sized[4]" not in r.stdout, r.stdout


def test_a_run_where_everything_is_skipped_fails(tmp_path):
    r = _pytest(tmp_path, SAMPLE + "\n\ndef test_skipped():\n    pytest.skip('nothing to do here')\n",
                "-k", "skipped")
    assert r.returncode == 1, r.stdout
    assert "no test passed and 1 were skipped" in r.stdout


def test_a_run_with_a_pass_and_skips_passes(tmp_path):
    r = _pytest(tmp_path, SAMPLE + "\n\ndef test_skipped():\n    pytest.skip('nothing to do here')\n",
                "-k", "skipped or cpu")
    assert r.returncode == 0, r.stdout
    assert "1 passed, 1 skipped" in r.stdout


def test_shard_option_splits_gpu_tests(tmp_path):
    """`--shard I/K` keeps every K-th gpu / multigpu test (and every CPU test); the shards cover each once."""
    seen = []
    for i in (1, 2):
        r = _pytest(tmp_path, RANKED, "--co", "--shard", f"{i}/2")
        got = [t for t in ("test_one", "test_fixed_two", "test_sized[2]", "test_sized[4]") if t in r.stdout]
        assert "test_cpu" in r.stdout and len(got) == 2, r.stdout
        seen += got
    assert sorted(seen) == sorted(["test_one", "test_fixed_two", "test_sized[2]", "test_sized[4]"])
    r = _pytest(tmp_path, RANKED, "--co", "--shard", "3/2")
    assert r.returncode != 0 and "expected I/K" in r.stdout, r.stdout


def test_failures_are_kept_at_once_in_the_test_log_dir(tmp_path, monkeypatch):
    """TILESCALE_TEST_LOG_DIR (the GPU tier): each failure's report goes to failures.log when it happens, so a
    part stopped at its time limit (no summary printed) still leaves what failed and why."""
    logs = tmp_path / "logs"
    sample = "def test_ok():\n    pass\n\ndef test_broken():\n    assert 1 + 1 == 3, 'arithmetic is off'\n"
    monkeypatch.setenv("TILESCALE_TEST_LOG_DIR", str(logs))
    r = _pytest(tmp_path, sample)
    assert r.returncode == 1, r.stdout
    text = (logs / "failures.log").read_text()
    assert "FAILED test_sample.py::test_broken (call," in text and "arithmetic is off" in text, text
    assert "test_ok" not in text


def test_a_run_has_temporary_folders_of_its_own(tmp_path):
    """tmp_path lies in a folder of the run's own, removed at its end, not in pytest-of-<user>, where each run
    deletes all but the newest three runs' folders, a run's still going beside it too (two runs side by side:
    one's tests found their tmp_path gone). --basetemp still chooses."""
    import re

    r = _pytest(tmp_path, "def test_where(tmp_path):\n    print('TMP', tmp_path)\n", "-s")
    assert r.returncode == 0, r.stdout
    where = Path(re.search(r"TMP (\S+)", r.stdout).group(1))
    assert "pytest-of-" not in str(where) and where.name == "test_where0", where
    assert not where.parent.parent.exists(), f"{where.parent.parent} left behind"
    chosen = tmp_path / "chosen"
    r = _pytest(tmp_path, "def test_where(tmp_path):\n    print('TMP', tmp_path)\n", "-s", f"--basetemp={chosen}")
    assert f"TMP {chosen / 'test_where0'}" in r.stdout, r.stdout


def test_an_inductor_compile_leaves_nothing_in_the_temporary_folder(tmp_path):
    """torch.compile on CPU under the conftest leaves the temporary folder as it found it: the inductor cache is the
    run's own, and no precompiled C++ headers go to <tmp>/torchinductor_<user> (torch puts them there whatever
    TORCHINDUCTOR_CACHE_DIR says; .ci/run fails on anything left in /tmp)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    body = ("import torch\n\ndef test_compile():\n"
            "    f = torch.compile(lambda x: (x * 2 + 1).relu())\n"
            "    x = torch.randn(64)\n"
            "    assert torch.equal(f(x), (x * 2 + 1).relu())\n")
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_sample.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TILESCALE_WAIT"))}
    env["TMPDIR"] = str(tmp)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout
    assert sorted(p.name for p in tmp.iterdir()) == [], r.stdout
