"""launch.sh on a machine without GPUs: compiles instead of running, says so, exits 2; argument errors; how a
job ends (Ctrl-C, a failing rank, a normal exit) leaves no process behind."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
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


# ------------------------------------------------------------------ how a job ends (torchrun path, on CPU)
# launch.sh takes the torchrun path when its interpreter reports GPUs: a wrapper reports 2 and hands
# everything else to this interpreter, so the real launch.sh starts the real torchrun with 2 CPU ranks.

FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in *device_count*) echo 2; exit 0 ;; esac
exec {python} "$@"
"""

RANK_SCRIPT = r"""
import os, signal, subprocess, sys, time
rank, mode = int(os.environ["RANK"]), sys.argv[1]
if mode == "stubborn" and rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)      # a rank that does not end on SIGTERM
child = subprocess.Popen(["sleep", "300"])               # a process a rank started (a compiler, a helper)
print(f"[rank {rank}] RUNNING pid={os.getpid()} child={child.pid}", flush=True)
if mode == "fail" and rank == 1:
    time.sleep(0.5)
    sys.exit(3)
if mode == "exit":
    sys.exit(0)
time.sleep(300)
"""


def _torchrun_job(tmp_path, mode):
    import jobs

    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    job = jobs.Job(script, mode, gpus=2, env={"PYTHON": str(py)})
    try:
        lines = job.wait_for(r"\[rank \d\] RUNNING", 2, timeout=120)
    except AssertionError:
        job.kill()
        raise
    started = [int(p) for ln in lines for p in re.findall(r"(?:pid|child)=(\d+)", ln)]
    started += jobs.session_members(job.sid)              # launch.sh and torchrun
    return job, started


def _assert_all_ended(job, started):
    import jobs

    left = [p for p in started if jobs.alive(p)] + job.leftovers(grace=5)
    if left:
        desc = job.describe(left)
        job.kill(started + left)
        raise AssertionError(f"processes of the job still running:\n{desc}\n--- output ---\n{job.output[-3000:]}")


@pytest.mark.parametrize("mode", ["loop", "stubborn"])
def test_ctrl_c_ends_every_process(tmp_path, mode):
    """Ctrl-C (SIGINT to launch.sh's process group): launch.sh exits 130 within seconds, and the ranks,
    what they started, and torchrun are all gone, also a rank that ignores SIGTERM."""
    job, started = _torchrun_job(tmp_path, mode)
    t0 = time.monotonic()
    job.interrupt()
    rc = job.wait(timeout=40)
    took = time.monotonic() - t0
    _assert_all_ended(job, started)
    assert rc == 130, f"exit code {rc}\n{job.output[-3000:]}"
    assert took < 20, f"launch.sh took {took:.1f} s to end after Ctrl-C"


@pytest.mark.parametrize("mode,expect_rc", [("exit", 0), ("fail", None)])
def test_job_end_leaves_no_process_behind(tmp_path, mode, expect_rc):
    """Every rank exits (0), or one fails (the job's exit code is non-zero, the other rank is stopped):
    launch.sh returns and nothing the job started is left running, the ranks' own children included."""
    job, started = _torchrun_job(tmp_path, mode)
    rc = job.wait(timeout=90)
    _assert_all_ended(job, started)
    assert rc is not None, "launch.sh did not end"
    if expect_rc is not None:
        assert rc == expect_rc, f"exit code {rc}\n{job.output[-3000:]}"
    else:
        assert rc != 0, job.output[-3000:]
