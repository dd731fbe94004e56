"""tilescale.shm_leftovers: which /dev/shm files are removed (a folder of fakes stands for /dev/shm), and launch.sh's
removal, when a shared-GPU job ends, of the files of its own ended ranks only (the real /dev/shm, on CPU)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilescale import shm_leftovers as shm
from tilescale import testing

LAUNCH = Path(__file__).resolve().parent.parent / "launch.sh"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _make(root, pid, n=0):
    f = root / f"cuda.shm.0.{pid:x}.{n}"
    f.write_bytes(b"x")
    return f


def _job_dir(tmp_path, *pids):
    d = tmp_path / "job"
    d.mkdir(mode=0o700)
    for p in pids:
        shm.record_rank(d) if p == os.getpid() else (d / str(p)).write_text("")
    return d


def test_own_files_are_removed_and_nothing_else(tmp_path):
    mine, other = _make(tmp_path, os.getpid(), 1), _make(tmp_path, os.getppid(), 1)
    unrelated = tmp_path / f"mps_shm_{os.getpid():x}"
    unrelated.write_bytes(b"x")
    link = tmp_path / f"cuda.shm.0.{os.getpid():x}.2"
    link.symlink_to(unrelated)
    assert shm.files_of([os.getpid()], tmp_path) == [mine]
    assert shm.remove_own(tmp_path) == 1
    assert not mine.exists() and other.exists() and unrelated.exists() and link.is_symlink()


def test_only_files_of_this_jobs_ended_ranks_are_removed(tmp_path):
    """/dev/shm may be shared with other containers, whose live ranks' pids this host cannot see (they look ended):
    a file is removed only if its pid is one of the ranks this job recorded, and that rank has ended."""
    root = tmp_path / "shm"
    root.mkdir()
    ended_rank, other_jobs = _dead_pid(), _dead_pid()
    job = _job_dir(tmp_path, ended_rank, os.getpid())
    assert shm.recorded_pids(job) == sorted([ended_rank, os.getpid()])
    gone, live, foreign = _make(root, ended_rank), _make(root, os.getpid()), _make(root, other_jobs)
    assert shm.remove_ended(job, root) == 1
    assert not gone.exists() and live.exists() and foreign.exists()


def test_a_job_directory_others_could_write_is_not_trusted(tmp_path):
    root = tmp_path / "shm"
    root.mkdir()
    ended = _dead_pid()
    job = _job_dir(tmp_path, ended)
    f = _make(root, ended)
    job.chmod(0o777)        # anyone could have planted pids in it
    with pytest.raises(PermissionError, match="only it can write"):
        shm.remove_ended(job, root)
    assert f.exists()
    r = subprocess.run([sys.executable, "-m", "tilescale.shm_leftovers", "--job-dir", str(job)], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 1 and "not removing" in r.stderr, r.stderr
    job.chmod(0o700)
    r = subprocess.run([sys.executable, "-m", "tilescale.shm_leftovers"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 2 and "--job-dir" in r.stderr      # no sweep of every ended process's files


def test_record_rank_uses_the_launchs_directory_when_set(tmp_path, monkeypatch):
    monkeypatch.delenv("TILESCALE_JOB_DIR", raising=False)
    shm.record_rank()                                   # not under launch.sh: nothing to record, no error
    d = tmp_path / "job"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TILESCALE_JOB_DIR", str(d))
    shm.record_rank()
    assert shm.recorded_pids(d) == [os.getpid()]


RANK = r"""
import os, signal
from pathlib import Path
from tilescale import shm_leftovers
shm_leftovers.record_rank()                       # as tilescale.init_distributed does in the shared-GPU mode
Path(f"/dev/shm/cuda.shm.0.{os.getpid():x}.7").write_bytes(b"x")   # the driver's file, left by a rank that ends
print(f"[rank {os.environ['RANK']}] RUNNING pid={os.getpid()}", flush=True)
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)         # killed: never reaches finalize
"""

FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in *device_count*) echo 1; exit 0 ;; esac
exec {python} "$@"
"""


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_launch_sh_removes_the_files_of_its_own_ranks_only(tmp_path):
    """A shared-GPU job (2 ranks, 1 "GPU") whose ranks end without finalize (one killed with -9): launch.sh removes
    their /dev/shm files and its job directory, and keeps a file of an ended process that is not one of its ranks
    (another container's, say)."""
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    foreign = Path(f"/dev/shm/cuda.shm.0.{_dead_pid():x}.7")
    foreign.write_bytes(b"x")
    made = [foreign]
    try:
        e = {**os.environ, "PYTHON": str(py), "GPUS": "2", "TILESCALE_RANKS_PER_GPU": "2", "TILESCALE_SKIP_DOCTOR": "1",
             "PORT": str(testing.free_port()), "TMPDIR": str(tmp_path)}
        e.pop("TILESCALE_MPS", None)
        r = subprocess.run(["bash", str(LAUNCH), str(script)], capture_output=True, text=True, timeout=300, env=e)
        out = r.stdout + r.stderr
        pids = [int(p) for p in re.findall(r"RUNNING pid=(\d+)", r.stdout)]
        made += [Path(f"/dev/shm/cuda.shm.0.{p:x}.7") for p in pids]
        assert len(pids) == 2, out
        assert not any(p.exists() for p in made[1:]), f"files of the job's ranks were left\n{out}"
        assert foreign.exists(), f"launch.sh removed a file that is not of its ranks\n{out}"
        assert not list(tmp_path.glob("tilescale-job.*")), "launch.sh left its job directory"
    finally:
        for p in made:
            p.unlink(missing_ok=True)


# one write per line: the ranks share the launcher's stdout, and print() may write a line and its newline apart,
# so that two ranks' lines run together
SHOW_JOB_DIR = r"""
import os
os.write(1, f"[rank {os.environ['RANK']}] JOB_DIR={os.environ.get('TILESCALE_JOB_DIR', '-')}\n".encode())
"""


@pytest.mark.parametrize("gpus_found,shared", [(1, True), (2, False)])
def test_launch_sh_passes_its_job_directory_in_shared_mode_only(tmp_path, gpus_found, shared):
    """The ranks of a shared-GPU job (2 ranks, 1 "GPU") get the launch's private job directory, which is gone when it
    ends; with a GPU per rank there is none."""
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.replace("echo 1", f"echo {gpus_found}").format(python=sys.executable))
    py.chmod(0o755)
    script = tmp_path / "show.py"
    script.write_text(SHOW_JOB_DIR)
    e = {k: v for k, v in os.environ.items() if k not in ("TILESCALE_MPS", "TILESCALE_JOB_DIR")}
    e.update(PYTHON=str(py), GPUS="2", TILESCALE_RANKS_PER_GPU="2", TILESCALE_SKIP_DOCTOR="1", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", str(LAUNCH), str(script)], capture_output=True, text=True, timeout=300, env=e)
    assert r.returncode == 0, r.stdout + r.stderr
    dirs = set(re.findall(r"JOB_DIR=([^\s\[]+)", r.stdout))
    assert len(re.findall(r"\[rank \d\] JOB_DIR=", r.stdout)) == 2, r.stdout
    if shared:
        (d,) = dirs
        assert Path(d).parent == tmp_path and Path(d).name.startswith("tilescale-job."), d
        assert not Path(d).exists(), "the job directory outlived the launch"
    else:
        assert dirs == {"-"}, r.stdout
