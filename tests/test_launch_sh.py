"""launch.sh on a machine without GPUs: compiles instead of running, says so, exits 2; argument errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "launch.sh"


def _launch(args, gpus=None, timeout=300, tmpdir=None):
    e = dict(os.environ)
    if tmpdir is not None:
        e["TMPDIR"] = str(tmpdir)                      # the build products of the example land here
    e["PYTHON"] = sys.executable                       # the interpreter that has tilescale and torch
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e.pop("GPUS", None)
    if gpus is not None:
        e["GPUS"] = gpus
    return subprocess.run(["bash", str(LAUNCH), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, env=e, cwd=str(REPO))


@pytest.mark.skipif(testing.gpu_count() > 0, reason="this machine has GPUs: launch.sh would run the example")
def test_no_gpu_compiles_and_exits_2(tmp_path):
    r = _launch(["examples/distributed/example_ring_put.py"], gpus="2", timeout=600, tmpdir=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "needs 2 GPUs, found 0" in r.stderr, out
    assert "compiled" in r.stdout, out
    assert "for world size 2" in r.stdout, out        # WORLD_SIZE came from GPUS
    assert "built " in r.stdout and ".so" in r.stdout, out
    assert list(tmp_path.glob("*.so")), "no library was built"


def test_gpus_not_a_number():
    r = _launch(["x.py"], gpus="abc")
    assert r.returncode == 2
    assert "GPUS=abc" in r.stderr and "positive integer" in r.stderr


def test_gpus_zero():
    r = _launch(["x.py"], gpus="0")
    assert r.returncode == 2 and "positive integer" in r.stderr


def test_no_arguments_prints_usage():
    r = _launch([])
    assert r.returncode == 2
    assert "usage:" in r.stderr and "launch.sh" in r.stderr


@pytest.mark.skipif(testing.gpu_count() > 0, reason="this machine has GPUs")
def test_failing_script_reports_its_exit_code(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.exit(7)\n")
    r = _launch([str(bad)], gpus="2")
    assert r.returncode == 7
    assert "compiling failed (exit 7)" in r.stderr
