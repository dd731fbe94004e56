"""tilescale/launch_job.py's end of a job's processes: SIGTERM, SIGKILL after the grace, and back only once every
process of the job is gone (also one whose environment can no longer be read while it exits); nothing else touched."""
import os
import signal
import subprocess
import sys
import time

from tilescale import launch_job

STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(120)")
POLITE = "import time; print('ready', flush=True); time.sleep(120)"


def _start(code: str, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env}, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def _ended(proc: subprocess.Popen) -> int | None:
    """Its exit status if it is gone (a zombie of this test counts as gone: nothing runs)."""
    return None if launch_job._start_time(proc.pid) is not None else proc.wait(timeout=5)


def test_a_process_that_ignores_sigterm_is_killed_before_the_end_returns():
    job = launch_job.Job()
    stubborn = _start(STUBBORN, {launch_job.MARK: job.id})
    polite = _start(POLITE, {launch_job.MARK: job.id})
    other = _start(POLITE, {launch_job.MARK: "another-job"})
    try:
        t0 = time.monotonic()
        job.end_processes(grace_s=1.0)
        assert _ended(stubborn) == -signal.SIGKILL and _ended(polite) == -signal.SIGTERM
        assert time.monotonic() - t0 < 10
        assert _ended(other) is None            # not this job's
    finally:
        for p in (stubborn, polite, other):
            p.kill()
            p.wait()


def test_a_process_whose_mark_can_no_longer_be_read_is_followed_until_gone(monkeypatch):
    """An exiting process has no environment to read while the kernel tears it down: once its mark was seen, the
    end follows it by pid and start time (before: the end returned as soon as no environment showed the mark)."""
    job = launch_job.Job()
    stubborn = _start(STUBBORN, {launch_job.MARK: job.id})
    calls = []
    real = launch_job._pids_with

    def first_scan_only(entry):
        calls.append(entry)
        return real(entry) if len(calls) == 1 else []

    monkeypatch.setattr(launch_job, "_pids_with", first_scan_only)
    try:
        job.end_processes(grace_s=0.5)
        assert _ended(stubborn) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()


def test_the_start_time_names_a_running_process_only():
    """A running process has a start time (the same at each read); one gone has none: a pid seen before names
    another process once its start time differs, and the end does not signal it."""
    proc = _start(POLITE, {})
    try:
        t = launch_job._start_time(proc.pid)
        assert isinstance(t, int) and launch_job._start_time(proc.pid) == t
        proc.kill()
        proc.wait()
        assert launch_job._start_time(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def _fake_mps_daemon(pipe: str | None, user: int | None = None) -> subprocess.Popen:
    """A process named nvidia-cuda-mps-control (argv[0]), with `pipe` as its CUDA_MPS_PIPE_DIRECTORY (None: unset),
    run as `user` (None: this user)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
    if pipe is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    proc = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-control sleep 60"], env=env,
                            preexec_fn=(lambda: os.setuid(user)) if user is not None else None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:           # until the exec named it
        try:
            if open(f"/proc/{proc.pid}/cmdline", "rb").read().startswith(b"nvidia-cuda-mps-control"):
                return proc
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("the stand-in daemon did not start")


def test_only_this_users_mps_daemon_of_this_pipe_directory_is_used(tmp_path):
    mine = _fake_mps_daemon(str(tmp_path / "pipe"))
    procs = [mine]
    try:
        assert launch_job.own_mps_daemon(str(tmp_path / "pipe")) == mine.pid
        assert launch_job.own_mps_daemon(str(tmp_path / "other")) is None
        if os.getuid() == 0:                     # another user's daemon on the same pipe directory is not used
            mine.kill()
            mine.wait()
            theirs = _fake_mps_daemon(str(tmp_path / "pipe"), user=65534)
            procs.append(theirs)
            assert launch_job.own_mps_daemon(str(tmp_path / "pipe")) is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
