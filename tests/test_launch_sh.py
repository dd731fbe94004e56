"""launch.sh on a machine without GPUs: compiles instead of running, says so, exits 2; argument errors; how a
job ends (Ctrl-C, a failing rank, a normal exit) leaves no process behind."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "launch.sh"


def _launch(args, gpus=None, timeout=300, tmpdir=None, cache_dir=None):
    e = dict(os.environ)
    if tmpdir is not None:
        e["TMPDIR"] = str(tmpdir)                      # nothing of the build may be left here
    if cache_dir is not None:
        e["TILESCALE_CACHE_DIR"] = str(cache_dir)      # compile-only builds are kept in <cache>/kernels/<key>/
    e["PYTHON"] = sys.executable                       # the interpreter that has tilescale and torch
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e.pop("GPUS", None)
    if gpus is not None:
        e["GPUS"] = gpus
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, timeout=timeout, env=e,
                          cwd=str(REPO))


@pytest.mark.skipif(testing.gpu_count() > 0, reason="this machine has GPUs: launch.sh would run the example")
def test_no_gpu_compiles_and_exits_2(tmp_path):
    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    r = _launch(["examples/distributed/example_ring_put.py"], gpus="2", timeout=600, tmpdir=tmp, cache_dir=cache)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "needs 2 GPUs, found 0" in r.stderr, out
    assert "compiled" in r.stdout, out
    assert "for world size 2" in r.stdout, out        # WORLD_SIZE came from GPUS
    libs = sorted((cache / "kernels").glob("*/kernel_lib.so"))   # where tilescale.build keeps its libraries
    assert libs, f"no library was built in {cache}/kernels\n{out}"
    assert all(lib.stat().st_size > 0 for lib in libs)
    assert not list(tmp.iterdir()), f"the build left files in TMPDIR: {sorted(tmp.iterdir())}"


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
    # TMPDIR: torchrun keeps each run's logs in a torchelastic_* directory there and leaves it behind
    job = jobs.Job(script, mode, gpus=2, env={"PYTHON": str(py), "TMPDIR": str(tmp_path)})
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
def test_job_end_leaves_no_process_behind(tmp_path, mode, expect_rc, monkeypatch):
    """Every rank exits (0), or one fails (the job's exit code is non-zero, the other rank is stopped):
    launch.sh returns and nothing the job started is left running, the ranks' own children included. With
    TILESCALE_TEST_LOG_DIR (the GPU tier), the job's whole output is kept there, stamped, with its exit code."""
    monkeypatch.setenv("TILESCALE_TEST_LOG_DIR", str(tmp_path / "logs"))
    job, started = _torchrun_job(tmp_path, mode)
    rc = job.wait(timeout=90)
    _assert_all_ended(job, started)
    assert rc is not None, "launch.sh did not end"
    if expect_rc is not None:
        assert rc == expect_rc, f"exit code {rc}\n{job.output[-3000:]}"
    else:
        assert rc != 0, job.output[-3000:]
    (log,) = (tmp_path / "logs").glob("*.log")
    text = log.read_text()
    assert "test_job_end_leaves_no_process_behind" in log.name and log.name.endswith("-2r.log"), log.name
    assert re.search(r"^\[\s*\d+\.\ds\] ", text, re.M) and len(re.findall(r"\[rank \d\] RUNNING", text)) == 2, text
    assert text.rstrip().endswith(f"[jobs] output ended (exit {rc})"), text[-500:]


def test_sighup_ends_every_process(tmp_path):
    """SIGHUP to launch.sh (its terminal closed): it exits 129 and the job, the ranks' children included, ends."""
    job, started = _torchrun_job(tmp_path, "loop")
    os.kill(job.proc.pid, signal.SIGHUP)
    rc = job.wait(timeout=40)
    _assert_all_ended(job, started)
    assert rc == 129, f"exit code {rc}\n{job.output[-3000:]}"


# ------------------------------------------------------------------ the shared-GPU mode (TILESCALE_RANKS_PER_GPU)
def _fake_gpus(tmp_path, n: int, name: str = "python") -> Path:
    py = tmp_path / name
    py.write_text(FAKE_PYTHON.replace("echo 2", f"echo {n}").format(python=sys.executable))
    py.chmod(0o755)
    return py


def test_more_ranks_than_gpus_without_the_setting_is_an_error(tmp_path):
    py = _fake_gpus(tmp_path, 1)
    x = tmp_path / "x.py"
    x.write_text("")
    e = {k: v for k, v in os.environ.items() if k != "TILESCALE_RANKS_PER_GPU"}
    e.update(PYTHON=str(py), GPUS="4", TILESCALE_SKIP_DOCTOR="1")
    r = subprocess.run(["bash", str(LAUNCH), str(x)], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "GPUS=4 but this node has only 1 visible GPU(s)" in r.stderr, r.stderr
    assert "TILESCALE_RANKS_PER_GPU=4" in r.stderr, r.stderr               # names the way out
    e["TILESCALE_RANKS_PER_GPU"] = "3"                                      # 4 ranks do not fit 3 per GPU
    r = subprocess.run(["bash", str(LAUNCH), str(x)], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 2 and "TILESCALE_RANKS_PER_GPU=4" in r.stderr, r.stdout + r.stderr


def test_bad_ranks_per_gpu_value(tmp_path):
    py = _fake_gpus(tmp_path, 1)
    r = subprocess.run(["bash", str(LAUNCH), "x.py"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": str(py), "GPUS": "2", "TILESCALE_RANKS_PER_GPU": "two"})
    assert r.returncode == 2 and "TILESCALE_RANKS_PER_GPU=two: expected a positive integer" in r.stderr, r.stderr


SHOW_ENV = r"""
import os
print(f"[rank {os.environ['RANK']}] RUNNING rpg={os.environ.get('TILESCALE_RANKS_PER_GPU')} "
      f"mps={os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '-')}", flush=True)
"""


def _run_shared(tmp_path, gpus_found: int, ranks: int, extra: dict | None = None, path_dir: Path | None = None):
    py = _fake_gpus(tmp_path, gpus_found, name="py with space")     # also: PYTHON with a space is quoted
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV)
    e = {**os.environ, "PYTHON": str(py), "GPUS": str(ranks), "TILESCALE_SKIP_DOCTOR": "1",
         "PORT": str(testing.free_port()), "TMPDIR": str(tmp_path)}
    if path_dir is not None:
        e["PATH"] = f"{path_dir}{os.pathsep}{e['PATH']}"
    e.update(extra or {})
    return subprocess.run(["bash", str(LAUNCH), str(script)], capture_output=True, text=True, timeout=120, env=e)


GLOO_SUM = r"""
import os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"[rank {dist.get_rank()}] SUM {t.item():.0f} port={os.environ['MASTER_PORT']}", flush=True)
dist.destroy_process_group()
"""


def test_one_node_without_a_port_lets_torchrun_pick_it(tmp_path):
    """No PORT on one node: torchrun --standalone binds a port the OS picks (no free port chosen beforehand
    for another job to take); the ranks still find each other (a gloo all-reduce)."""
    py = _fake_gpus(tmp_path, 2)
    script = tmp_path / "gloo_sum.py"
    script.write_text(GLOO_SUM)
    e = {k: v for k, v in os.environ.items() if k not in ("PORT", "MASTER_PORT")}
    e.update({"PYTHON": str(py), "GPUS": "2", "TILESCALE_SKIP_DOCTOR": "1", "TMPDIR": str(tmp_path)})
    r = subprocess.run(["bash", str(LAUNCH), str(script)], capture_output=True, text=True, timeout=120, env=e)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--standalone" in r.stdout + r.stderr and "--master_port" not in r.stdout + r.stderr
    ports = set(re.findall(r"SUM 3 port=(\d+)", r.stdout))
    assert len(re.findall(r"\[rank \d\] SUM 3", r.stdout)) == 2 and len(ports) == 1, r.stdout + r.stderr


def test_shared_gpu_mode_starts_every_rank(tmp_path):
    r = _run_shared(tmp_path, 1, 3, {"TILESCALE_RANKS_PER_GPU": "4"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shared-GPU mode: 3 ranks on 1 GPU(s), up to 3 per GPU" in r.stdout, r.stdout
    for rank in range(3):
        assert f"[rank {rank}] RUNNING rpg=4 mps=-" in r.stdout, r.stdout     # no MPS unless asked


FAKE_MPS = r"""#!/usr/bin/env bash
# a stand-in for nvidia-cuda-mps-control: `-d` starts a "daemon"; `quit` on stdin stops it
log={log}
if [ "${{1:-}}" = -d ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
  (exec -a "nvidia-cuda-mps-control -d" sleep 300) </dev/null >/dev/null 2>&1 &
  exit 0
fi
read -r cmd
echo "$cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
# the daemon ends a moment after quit (a real one first ends its servers): the launcher waits for it
[ "$cmd" = quit ] && (sleep 1; pkill -f "^nvidia-cuda-mps-control -d") </dev/null >/dev/null 2>&1 &
exit 0
"""


def _mps_daemons() -> list[str]:
    r = subprocess.run(["pgrep", "-f", "^nvidia-cuda-mps-control -d"], capture_output=True, text=True)
    return r.stdout.split()


@pytest.mark.skipif(bool(_mps_daemons()), reason="an MPS daemon (or a stand-in) already runs on this machine")
def test_mps_started_only_when_asked_and_stopped_after(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mps.log"
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(FAKE_MPS.format(log=log))
    fake.chmod(0o755)
    try:
        r = _run_shared(tmp_path, 1, 2, {"TILESCALE_RANKS_PER_GPU": "2", "TILESCALE_MPS": "1"}, path_dir=bin_dir)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "started the MPS daemon for this job" in r.stdout, r.stdout
        calls = log.read_text().splitlines()
        assert calls[0].startswith("start pipe=") and calls[-1].startswith("quit pipe="), calls
        pipe = calls[0].split("=", 1)[1]
        assert pipe.startswith(str(tmp_path)) and calls[-1].endswith(pipe), calls   # its own pipe dir, quit there
        assert f"mps={pipe}" in r.stdout, r.stdout                                   # the ranks see it
        assert not _mps_daemons(), "the MPS daemon launch.sh started is still running"
        assert "did not stop on quit" not in r.stderr, r.stderr                     # it waited for it to end
        assert not list(tmp_path.glob("tilescale-mps.*")), "launch.sh left its MPS directory behind"
        # a daemon that already runs is used as it is, never stopped
        subprocess.run([str(fake), "-d"], check=True, timeout=30)
        log.write_text("")
        r = _run_shared(tmp_path, 1, 2, {"TILESCALE_RANKS_PER_GPU": "2", "TILESCALE_MPS": "1"}, path_dir=bin_dir)
        assert r.returncode == 0 and "an MPS daemon of this user already serves" in r.stdout, r.stdout + r.stderr
        assert log.read_text() == "" and _mps_daemons(), "launch.sh touched a daemon it did not start"
        # without TILESCALE_MPS, or with one rank per GPU, nothing is started
        subprocess.run(["pkill", "-f", "^nvidia-cuda-mps-control -d"], timeout=30)
        r = _run_shared(tmp_path, 2, 2, {"TILESCALE_MPS": "1"}, path_dir=bin_dir)
        assert r.returncode == 0 and log.read_text() == "", r.stdout + r.stderr
    finally:
        subprocess.run(["pkill", "-f", "^nvidia-cuda-mps-control -d"], timeout=30)


def test_several_nodes_need_a_port(tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in ("PORT", "MASTER_PORT")}
    e.update(NNODES="2", GPUS="1")
    r = subprocess.run(["bash", str(LAUNCH), "x.py"], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 2 and "NNODES=2: set PORT" in r.stderr, r.stderr


# ------------------------------------------------------------------ arguments, the compile-only run, MPS's end
def test_help_prints_the_settings_and_runs_nothing(tmp_path):
    """--help is launch.sh's own: its usage and settings, exit 0; not handed to Python (which then said "needs 4
    GPUs")."""
    py = tmp_path / "python"
    py.write_text("#!/usr/bin/env bash\necho CALLED >> " + str(tmp_path / "calls") + "\nexit 1\n")
    py.chmod(0o755)
    for arg in ("--help", "-h"):
        r = subprocess.run(["bash", str(LAUNCH), arg], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": str(py)})
        assert r.returncode == 0, r.stdout + r.stderr
        assert "GPUS=4 bash launch.sh" in r.stdout and "TILESCALE_RANKS_PER_GPU" in r.stdout, r.stdout
        assert "found 0" not in r.stdout + r.stderr and "compiling" not in r.stdout
    assert not (tmp_path / "calls").exists(), "launch.sh ran the interpreter for --help"


def test_a_missing_script_is_named_before_anything_runs(tmp_path):
    """The launcher (`tilescale run`, which launch.sh starts) names the missing script before it asks for GPUs,
    compiles or starts torchrun: the interpreter runs nothing but the launcher."""
    py = tmp_path / "python"
    py.write_text(f"#!/usr/bin/env bash\necho \"$*\" >> {tmp_path / 'calls'}\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    r = subprocess.run(["bash", str(LAUNCH), str(tmp_path / "nope.py")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": str(py), "GPUS": "2"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{tmp_path / 'nope.py'}: no such file (expected the Python script to run)" in r.stderr, r.stderr
    assert "compiling" not in r.stdout + r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"-m tilescale run {tmp_path / 'nope.py'}"], f"the interpreter ran more than the launcher: {calls}"


COMPILING = r"""
import os, subprocess, sys, tempfile
# stands for a compile-only run: tilelang writes its source to TMPDIR and runs nvcc, which takes a while
src = tempfile.NamedTemporaryFile(suffix=".cu", delete=False)
child = subprocess.Popen(["sleep", "300"])
print(f"COMPILING pid={os.getpid()} child={child.pid} tmp={src.name}", flush=True)
child.wait()
"""


def test_sigterm_during_the_compile_only_run_ends_it_and_leaves_no_temporaries(tmp_path):
    """On a machine without GPUs launch.sh compiles instead of running: SIGTERM then ends the compile and what it
    started (not left running under PID 1), launch.sh exits 143 and the compile's temporaries are gone."""
    import jobs

    py = _fake_gpus(tmp_path, 0)
    script = tmp_path / "compiling.py"
    script.write_text(COMPILING)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    e = {**os.environ, "PYTHON": str(py), "GPUS": "2", "TMPDIR": str(tmp)}
    p = subprocess.Popen(["bash", str(LAUNCH), str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=e, start_new_session=True)
    try:
        line = ""
        for line in p.stdout:
            if line.startswith("COMPILING"):
                break
        m = re.search(r"pid=(\d+) child=(\d+) tmp=(\S+)", line)
        assert m, line
        pid, child, made = int(m.group(1)), int(m.group(2)), Path(m.group(3))
        assert made.exists() and made.is_relative_to(tmp), made
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    left = [q for q in (pid, child) if jobs.alive(q)]
    for q in left:
        os.kill(q, signal.SIGKILL)
    assert rc == 143, rc
    assert not left, f"the compile (or what it started) outlived launch.sh: {left}"
    assert not made.exists() and list(tmp.iterdir()) == [], sorted(tmp.rglob("*"))


FAKE_MPS_STUCK = r"""#!/usr/bin/env bash
# a stand-in for nvidia-cuda-mps-control: `-d` starts a "daemon" that logs, and does not stop on `quit`
log={log}
if [ "${{1:-}}" = -d ]; then
  [ -n "${{FAIL_START:-}}" ] && {{ echo "cannot start" > "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 1; }}
  echo "daemon up" > "$CUDA_MPS_LOG_DIRECTORY/control.log"
  (exec -a "nvidia-cuda-mps-control -d" sleep 300) </dev/null >/dev/null 2>&1 &
  exit 0
fi
read -r cmd
echo "$cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
exit 0
"""


@pytest.mark.skipif(bool(_mps_daemons()), reason="an MPS daemon (or a stand-in) already runs on this machine")
@pytest.mark.parametrize("fail", ["stop", "start"])
def test_mps_log_is_kept_when_its_start_or_stop_fails(tmp_path, fail):
    """A daemon that does not start, or that does not stop on quit: launch.sh says so and keeps its log (it removed
    it, while pointing to it); a daemon of its own that outlives quit is stopped by pid, not by name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(FAKE_MPS_STUCK.format(log=tmp_path / "mps.log"))
    fake.chmod(0o755)
    extra = {"TILESCALE_RANKS_PER_GPU": "2", "TILESCALE_MPS": "1"}
    if fail == "start":
        extra["FAIL_START"] = "1"
    # another user's MPS server on the host (not this job's: no pipe directory of it): neither waited for nor stopped
    foreign = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-server sleep 300"],
                               env={k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")})
    try:
        r = _run_shared(tmp_path, 1, 2, extra, path_dir=bin_dir)
        assert foreign.poll() is None and str(foreign.pid) not in r.stderr, r.stderr
        out = r.stdout + r.stderr
        (mps_dir,) = tmp_path.glob("tilescale-mps.*")
        logs = sorted((mps_dir / "log").iterdir())
        assert logs and f"kept in {mps_dir}/log" in r.stderr, out
        if fail == "start":
            assert r.returncode == 2 and "could not start the MPS daemon" in r.stderr, out
            assert (mps_dir / "log" / "control.log").read_text() == "cannot start\n"
        else:
            assert r.returncode == 0, out
            assert "did not stop on quit" in r.stderr, out
            assert not _mps_daemons(), "the daemon launch.sh started is still running"
    finally:
        foreign.kill()
        foreign.wait(10)
        for pid in _mps_daemons():
            os.kill(int(pid), signal.SIGKILL)
