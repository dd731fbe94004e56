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
