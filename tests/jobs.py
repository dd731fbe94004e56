"""A job started with launch.sh and watched from a test while it runs: its output as it comes, the
processes it started (every process of its session), Ctrl-C. Used by tests/test_launch_sh.py (CPU) and
tests/test_gpu_teardown.py (GPU)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from tilescale import testing

LAUNCH_SH = testing.LAUNCH_SH

# Lines that report a failure while freeing symmetric memory or shutting NVSHMEM / CUDA down, or a
# process dying of a fatal signal: none may appear however a job ends.
_TEARDOWN_TOPIC = re.compile(r"nvshmem|symm|\bfree|finaliz|cuda ?error|cudaError", re.I)
_TEARDOWN_BAD = re.compile(r"error|fail|fault|abort|warn", re.I)
_FATAL = re.compile(r"Segmentation fault|core dumped|\bAborted\b|terminate called|illegal memory access|"
                    r"double free|corrupted|SIGSEGV|SIGABRT")


def teardown_errors(out: str, allow: tuple[str, ...] = ()) -> list[str]:
    """Lines of `out` that report an error of freeing symmetric memory / shutting down, or a crash."""
    bad = []
    for ln in out.splitlines():
        if any(a in ln for a in allow):
            continue
        if (_TEARDOWN_TOPIC.search(ln) and _TEARDOWN_BAD.search(ln)) or _FATAL.search(ln):
            bad.append(ln)
    return bad


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, parent pid) of a process; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[3]), int(fields[1])


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent)."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Live processes below `pid` (children, their children...)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None and st[0] not in ("Z", "X"):
                kids.setdefault(st[2], []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None and st[1] == sid and st[0] not in ("Z", "X"):
                out.append(int(d))
    return out


class Job:
    """``bash launch.sh script args...`` in a session of its own, its output read as it comes."""

    def __init__(self, script, *args: str, gpus: int, env: dict | None = None):
        e = testing.launch_env(gpus, {"PYTHONUNBUFFERED": "1", **(env or {})})
        self.t0 = time.monotonic()
        self._log = testing.job_log(script, gpus)   # the GPU tier's record of every job (TILESCALE_TEST_LOG_DIR)
        self.proc = subprocess.Popen(["bash", str(LAUNCH_SH), str(script), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=e, start_new_session=True)
        self.sid = self.proc.pid
        self._lines: list[str] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self._lines.append(line)
                self._cv.notify_all()
            if self._log is not None:
                self._log.line(line)
        if self._log is not None:
            self._log.close(f"[jobs] output ended (exit {self.proc.wait()})")
        with self._cv:
            self._cv.notify_all()

    @property
    def output(self) -> str:
        with self._cv:
            return "".join(self._lines)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 300) -> list[str]:
        """The first `count` matches of `pattern` in the output, each with the rest of its line (up to the
        next match), once that many have appeared; raises AssertionError (with the output) on timeout or if
        the job ends first. Matches are counted in the whole output, not per line: ranks print
        concurrently, and print() writes a message and its newline separately, so two ranks' messages can
        share a line."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                text = "".join(self._lines)
                starts = [m.start() for m in rx.finditer(text)]
                hits = []
                for i, a in enumerate(starts):
                    end = starts[i + 1] if i + 1 < len(starts) else len(text)
                    hits.append(text[a:end].split("\n", 1)[0])
                if len(hits) >= count:
                    return hits[:count]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{count} line(s) matching {pattern!r} did not appear (exit code "
                                         f"{self.proc.poll()}):\n{''.join(self._lines)[-5000:]}")
                self._cv.wait(min(left, 1.0))

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to launch.sh's process group (what a terminal sends to its foreground job)."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout: float) -> int | None:
        """launch.sh's exit code, or None if it is still running after `timeout` s."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=10)
        return rc

    def leftovers(self, grace: float = 10.0) -> list[int]:
        """Processes of the job's session still alive `grace` s from now (polled; [] as soon as none)."""
        deadline = time.monotonic() + grace
        while True:
            left = session_members(self.sid)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill(self, pids=()) -> None:
        """End everything the job started (after a failed check), and nothing else: its session, every
        process below launch.sh (torchrun puts each rank in a session of its own) and `pids` (ranks
        already reparented), each with its process group."""
        for pid in {*session_members(self.sid), *descendants(self.sid), *pids}:
            if not alive(pid):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)

    def describe(self, pids: list[int]) -> str:
        rows = []
        for pid in pids:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                rows.append(f"  {pid}: {cmd[:200]}")
        return "\n".join(rows)
