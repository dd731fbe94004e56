"""`tilescale run` / `python -m tilescale run` (tilescale/launch.py), the launcher installed with the package: its
help, its options (which win over the variables launch.sh reads), the torchrun path on CPU ranks. What every way a
job ends leaves behind is tests/test_launch_sh.py's (launch.sh starts this launcher)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_launch_sh import FAKE_PYTHON, GLOO_SUM

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("GPUS", "PORT", "MASTER_PORT", "TILESCALE_RANKS_PER_GPU")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "tilescale", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=str(REPO))


def test_help_lists_the_options_and_the_variables():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    for word in ("usage: tilescale run [-n N]", "-m MODULE", "--ranks-per-gpu", "--mps", "--port", "--skip-doctor",
                 "-n / GPUS", "TILESCALE_RANKS_PER_GPU", "NVSHMEM_SYMMETRIC_SIZE", "without GPUs"):
        assert word in r.stdout, (word, r.stdout)
    top = subprocess.run([sys.executable, "-m", "tilescale", "--help"], capture_output=True, text=True, timeout=60)
    assert re.search(r"^\s+run\s+start a program on N ranks", top.stdout, re.M), top.stdout


@pytest.mark.skipif(shutil.which("tilescale", path=os.path.dirname(sys.executable)) is None,
                    reason="tilescale is not installed in this environment (pip install -e .)")
def test_the_installed_command_is_the_launcher():
    cmd = shutil.which("tilescale", path=os.path.dirname(sys.executable))
    r = subprocess.run([cmd, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: tilescale run" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("args,env,message", [
    (("-n", "0", "x.py"), {}, "-n 0: expected a positive integer"),
    (("x.py",), {"GPUS": "two"}, "GPUS=two: expected a positive integer"),
    (("--ranks-per-gpu", "x", "x.py"), {}, "--ranks-per-gpu x: expected a positive integer"),
    (("-n", "2", "nope.py"), {}, "nope.py: no such file (expected the Python script to run)"),
    (("-n", "2"), {}, "no program"),
])
def test_bad_arguments_are_named(args, env, message):
    r = _run(*args, env=env)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr


def test_options_start_the_ranks_and_win_over_the_variables(tmp_path):
    """-n 2 over GPUS=3; the ranks find each other (a gloo all-reduce) through torchrun's own port."""
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    script = tmp_path / "gloo_sum.py"
    script.write_text(GLOO_SUM)
    r = _run("-n", "2", "--skip-doctor", str(script), env={"GPUS": "3", "PYTHON": str(py), "TMPDIR": str(tmp_path)},
             timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--nproc_per_node=2" in r.stdout and "--standalone" in r.stdout, r.stdout
    assert len(re.findall(r"\[rank \d\] SUM 3 ", r.stdout)) == 2, r.stdout + r.stderr
