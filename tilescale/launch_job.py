"""The processes and files of one ``tilescale run`` (:mod:`tilescale.launch`), and how they end.

torchrun starts each rank in a session of its own, so no process group holds a whole job: every process the launch
starts carries ``TILESCALE_LAUNCH_JOB_ID=<id>`` in its environment instead (the ranks, what they start, also once
reparented), and :meth:`Job.cleanup` ends the processes that carry it (SIGTERM, then SIGKILL after 10 s) and waits
until they are gone. The CUDA MPS daemon is stopped only when this launch started it, and found by its pipe
directory, never by name.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "TILESCALE_LAUNCH_JOB_ID"


def say(text: str, err: bool = False) -> None:
    print(f"tilescale run: {text}", file=sys.stderr if err else sys.stdout, flush=True)


class Stop(BaseException):  # noqa: N818  (a signal, not an error)
    """A signal ended the launch; `code` is its exit status (128 + the signal)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class LaunchError(Exception):
    """Something the launch needs could not be set up (the MPS daemon): said in one line, exit 2."""


def _pids_with(entry: bytes) -> list[int]:
    """Processes whose environment holds `entry` (NAME=value), this one excluded."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0"):
            found.append(int(d))
    return found


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), while it runs; None once it is gone
    or a zombie. A pid with the start time seen before is the same process (pids are reused)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"     # the MPS pipe directory where CUDA_MPS_PIPE_DIRECTORY is not set


def own_mps_daemon(pipe: str) -> int | None:
    """The pid of an MPS control daemon of this user that serves the pipe directory `pipe` (its
    CUDA_MPS_PIPE_DIRECTORY, or the default), else None: another user's daemon, or one of another pipe directory,
    cannot serve this job's ranks."""
    uid, want = os.getuid(), os.path.realpath(pipe)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid != uid:
                continue
            argv0 = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0", 1)[0].split(b" ", 1)[0]
            if os.path.basename(argv0) != b"nvidia-cuda-mps-control":
                continue
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        theirs = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")),
                      MPS_DEFAULT_PIPE)
        if os.path.realpath(theirs) == want:
            return int(d)
    return None


class Job:
    """One launch's processes, MPS daemon, temporary directories and shared-GPU job directory."""

    def __init__(self):
        self.id = f"{os.getpid()}-{time.time_ns()}"
        self.temps: list[str] = []
        self.mps_dir: str | None = None
        self.job_dir: str | None = None

    # ------------------------------------------------------------------------------------------ processes
    def run(self, cmd: list[str], env: dict | None = None, own_group: bool = False) -> int:
        """Run `cmd` as a process of the job and wait for it; its exit status. `own_group`: in a process group of
        its own (torchrun), so that Ctrl-C reaches the launcher alone, which then ends the job in order."""
        e = {**os.environ, **(env or {}), MARK: self.id}
        proc = subprocess.Popen(cmd, env=e, preexec_fn=os.setpgrp if own_group else None)
        rc = proc.wait()
        return 128 - rc if rc < 0 else rc   # killed by a signal: 128 + its number, as a shell says

    def end_processes(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process of the job, SIGKILL those still running after `grace_s`, and return once all are
        gone. A process is followed by its pid and start time from the moment its mark is seen: one that is exiting
        has no environment left to read (its memory is gone) while the kernel still tears it down, which on a busy
        machine takes seconds."""
        mark = f"{MARK}={self.id}".encode()
        seen: dict[int, int] = {}                  # pid -> start time

        def running() -> list[int]:
            for pid in _pids_with(mark):           # marked processes, those started meanwhile included
                t = _start_time(pid)
                if t is not None:
                    seen.setdefault(pid, t)
            return [pid for pid, t in seen.items() if _start_time(pid) == t]

        pids, termed = running(), set()
        deadline = time.monotonic() + grace_s      # by the clock: a scan of /proc on a busy machine takes a while
        while pids and time.monotonic() < deadline:
            _signal([p for p in pids if p not in termed], signal.SIGTERM)   # (one started meanwhile too)
            termed.update(pids)
            time.sleep(0.1)
            pids = running()
        if not pids:
            return
        print(f"tilescale run: killing processes that did not end on SIGTERM: {' '.join(map(str, pids))}",
              file=sys.stderr, flush=True)
        while pids and time.monotonic() < deadline + grace_s:
            _signal(pids, signal.SIGKILL)
            time.sleep(0.05)
            pids = [p for p in pids if _start_time(p) == seen[p]]

    # ---------------------------------------------------------------------------------------------- files
    def temp_dir(self, prefix: str) -> str:
        d = tempfile.mkdtemp(prefix=prefix)
        self.temps.append(d)
        return d

    def shm_dir(self) -> str:
        """The shared-GPU mode's job directory (TILESCALE_JOB_DIR): each rank records its pid there before NVSHMEM
        starts, so that the /dev/shm files of this job's ranks that were killed are removed at the end."""
        self.job_dir = tempfile.mkdtemp(prefix="tilescale-job.")
        return self.job_dir

    def _clean_shm(self) -> None:
        if self.job_dir is None:
            return
        from . import shm_leftovers

        try:
            stdout, sys.stdout = sys.stdout, sys.stderr
            shm_leftovers.main(["--job-dir", self.job_dir])
        except Exception as e:  # noqa: BLE001  (the cleanup goes on)
            print(f"tilescale run: removing /dev/shm files of ended ranks failed: {e}", file=sys.stderr)
        finally:
            sys.stdout = stdout
        shutil.rmtree(self.job_dir, ignore_errors=True)
        self.job_dir = None

    # ------------------------------------------------------------------------------------------------ MPS
    def start_mps(self) -> None:
        """Start the CUDA MPS daemon for this job unless one runs (then it is used as it is, and not stopped)."""
        if shutil.which("nvidia-cuda-mps-control") is None:
            raise LaunchError("TILESCALE_MPS=1 but nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA "
                              "driver); unset TILESCALE_MPS to run the ranks time-sliced")
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_DEFAULT_PIPE)
        pid = own_mps_daemon(pipe)
        if pid is not None:
            print(f"tilescale run: an MPS daemon of this user already serves CUDA_MPS_PIPE_DIRECTORY={pipe} (pid "
                  f"{pid}): using it as it is; not stopping it after", flush=True)
            return
        d = tempfile.mkdtemp(prefix="tilescale-mps.")
        os.makedirs(f"{d}/pipe")
        os.makedirs(f"{d}/log")
        os.environ.update(CUDA_MPS_PIPE_DIRECTORY=f"{d}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{d}/log")
        if subprocess.run(["nvidia-cuda-mps-control", "-d"]).returncode != 0:
            raise LaunchError("could not start the MPS daemon (nvidia-cuda-mps-control -d); its log is kept in "
                              f"{d}/log")
        self.mps_dir = d
        print(f"tilescale run: started the MPS daemon for this job (CUDA_MPS_PIPE_DIRECTORY={d}/pipe); stopped when "
              "it ends", flush=True)

    def _mps_pids(self) -> list[int]:
        """The MPS daemon and servers this launch started: nvidia-cuda-mps processes with its pipe directory."""
        out = []
        for pid in _pids_with(f"CUDA_MPS_PIPE_DIRECTORY={self.mps_dir}/pipe".encode()):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"nvidia-cuda-mps"):
                    out.append(pid)
            except OSError:
                pass
        return out

    def _stop_mps(self) -> None:
        """Quit, wait up to 10 s for its processes, else SIGTERM them; its directory goes, or stays for its log."""
        if self.mps_dir is None:
            return
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{self.mps_dir}/pipe"}
        try:
            ok = subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        pids = self._mps_pids()
        deadline = time.monotonic() + 10.0
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = self._mps_pids()
        if pids:
            print(f"tilescale run: the MPS daemon this job started did not stop on quit (pids "
                  f"{' '.join(map(str, pids))}): stopping it with SIGTERM", file=sys.stderr, flush=True)
            _signal(pids, signal.SIGTERM)
            ok = False
        if ok:
            shutil.rmtree(self.mps_dir, ignore_errors=True)
        else:
            print(f"tilescale run: stopping the MPS daemon failed; its log is kept in {self.mps_dir}/log",
                  file=sys.stderr, flush=True)
        self.mps_dir = None

    # -------------------------------------------------------------------------------------------- the end
    def cleanup(self) -> None:
        """End every process of the job, stop the MPS daemon it started, remove its files."""
        self.end_processes()
        self._stop_mps()
        self._clean_shm()
        for d in self.temps:
            shutil.rmtree(d, ignore_errors=True)
        self.temps.clear()
