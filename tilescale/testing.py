"""Helpers for examples and tests: the examples' entry point, launching N ranks, checking results.

Every example under ``examples/distributed`` ends with::

    if __name__ == "__main__":
        tilescale.testing.example_main(run, build)

* under ``launch.sh`` / torchrun it initialises the runtime, calls ``run(info)`` and finalises;
* with ``TILESCALE_COMPILE_ONLY=1`` (what ``launch.sh`` does on a machine without GPUs) it calls
  ``build(world_size)``, which compiles and links every kernel of the example without loading it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCH_SH = REPO_ROOT / "launch.sh"


def example_main(run: Callable, build: Callable[[int], None]) -> None:
    from .env import settings

    if settings.compile_only:
        ws = int(os.environ.get("WORLD_SIZE", "4"))
        build(ws)
        print(f"compiled every kernel of {Path(sys.argv[0]).name} for world size {ws} (no GPU: not run)")
        return
    import tilescale

    info = tilescale.init_distributed()
    try:
        run(info)
    except BaseException as e:
        if isinstance(e, SystemExit) and e.code in (None, 0):
            tilescale.finalize()
        else:  # this rank may fail alone: a collective teardown would wait for the others forever
            from .runtime.diagnostics import failing

            failing.set()                    # report this rank's own error before any watchdog stops it
            tilescale.runtime.abandon(e)     # and tell the other ranks
        raise
    tilescale.finalize()


def say(text: str) -> None:
    """Print one line in a single write: ranks share the launcher's stdout, and print() may write a message
    and its newline separately, so two ranks' lines could run together."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (text + "\n").encode())


class PythonCalls:
    """``with PythonCalls() as calls: ...``: counts the Python function entries of this thread, inside the block,
    whose code lies under `root` (default: the tilescale package), by ``sys.setprofile`` (restored after).
    ``calls.count``; ``calls.functions``: how many entries per ``file:function``. Not counted: other threads'
    calls (the watchdog's polls), code outside `root` (torch's ``graph.replay()``), C functions, and this
    class's own ``__exit__``. How tests/gpu/graphs_main.py and benchmarks/bench_host.py show that replaying a
    captured AllGather runs no tilescale host code (zero entries), where an eager call runs several."""

    def __init__(self, root: str | Path | None = None):
        here = Path(root) if root is not None else Path(__file__).parent
        # as the code objects name their files (the import path), and resolved (symbolic links)
        self.roots = tuple({os.path.join(str(here), ""), os.path.join(str(here.resolve()), "")})
        self.count = 0
        self.functions: dict[str, int] = {}
        self._previous = None

    def _hook(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(self.roots) and code is not PythonCalls.__exit__.__code__:
            self.count += 1
            key = f"{Path(code.co_filename).name}:{code.co_name}"
            self.functions[key] = self.functions.get(key, 0) + 1

    def __enter__(self) -> PythonCalls:
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)

    def top(self, n: int = 8) -> str:
        """The `n` functions entered most often, for a message."""
        ranked = sorted(self.functions.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{k} x{v}" for k, v in ranked) or "none"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def ranks_per_gpu_for(nranks: int, gpus: int | None = None) -> int:
    """How many ranks one GPU must hold to run `nranks` ranks on this machine's GPUs (1: a GPU each)."""
    gpus = gpu_count() if gpus is None else gpus
    return max(1, -(-nranks // max(gpus, 1)))


def skip_unless_ranks(nranks: int) -> None:
    """For tests of `nranks` ranks: skip (pytest) only when no GPU is visible. With fewer GPUs than ranks the
    test still runs, the ranks sharing GPUs (:func:`launch` sets ``TILESCALE_RANKS_PER_GPU``)."""
    import pytest

    found = gpu_count()
    if found < 1:
        pytest.skip(f"needs a CUDA GPU for its {nranks} rank(s) (they may share it); torch sees none")


def shared_gpus(nranks: int) -> bool:
    """Whether :func:`launch` runs `nranks` ranks with GPUs shared (fewer GPUs visible than ranks)."""
    return ranks_per_gpu_for(nranks) > 1


def launch_env(nranks: int, env: dict | None = None) -> dict:
    """The environment of a launch.sh job of `nranks` ranks that a test starts: this one without PORT and
    MASTER_PORT (launch.sh then lets torchrun pick a port as it binds it, so jobs side by side never collide),
    GPUS, no doctor, bounded waits unless set, ranks sharing GPUs when there are fewer, then `env` on top."""
    e = {k: v for k, v in os.environ.items() if k not in ("PORT", "MASTER_PORT")}
    e.update({"GPUS": str(nranks), "TILESCALE_SKIP_DOCTOR": "1"})
    e.setdefault("TILESCALE_WAIT_TIMEOUT_S", "30")
    if shared_gpus(nranks):
        e["TILESCALE_RANKS_PER_GPU"] = str(ranks_per_gpu_for(nranks))
    e.update(env or {})
    return e


def launch(script: str | Path, nranks: int, *args: str, timeout: float = 300.0, env: dict | None = None
           ) -> subprocess.CompletedProcess:
    """Run `script` on `nranks` ranks through launch.sh (bounded by `timeout`); never raises on failure.
    With fewer GPUs than ranks the ranks share GPUs (``TILESCALE_RANKS_PER_GPU``), unless `env` says otherwise.
    With ``TILESCALE_TEST_LOG_DIR`` set, the whole output, each line stamped with the seconds since the start,
    is also written there (one file per job, complete even when the test is stopped): the GPU tier's record."""
    import threading

    e = launch_env(nranks, env)
    cmd = ["bash", str(LAUNCH_SH), str(script), *args]
    log = job_log(script, nranks)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                            start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for ln in proc.stdout:
            lines.append(ln)
            if log is not None:
                log.line(ln)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            proc.wait(timeout=timeout)
            reader.join(30)
            rc, tail = proc.returncode, ""
        except subprocess.TimeoutExpired:
            # launch.sh, torchrun (launch.sh gives it a process group of its own) and every rank share the
            # session started here: end all of it, and nothing else.
            with contextlib.suppress(FileNotFoundError):
                subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(30)
            rc, tail = 124, f"\n[tilescale.testing] TIMEOUT after {timeout:.0f} s\n"
    finally:
        if log is not None:
            log.close(f"[tilescale.testing] exit {proc.returncode}")
    return subprocess.CompletedProcess(cmd, rc, "".join(lines) + tail)


class JobLog:
    """One job's output in a file, each line stamped with the seconds since the job started."""

    def __init__(self, path: Path):
        self._t0 = time.monotonic()
        self._f = open(path, "w")   # closed by close()

    def line(self, text: str) -> None:
        self._f.write(f"[{time.monotonic() - self._t0:7.1f}s] {text}")
        self._f.flush()

    def close(self, last: str) -> None:
        self.line(last + "\n")
        self._f.close()


def job_log(script, nranks: int) -> JobLog | None:
    """A :class:`JobLog` under TILESCALE_TEST_LOG_DIR for one job's output, named after the running test, or
    None when the variable is unset."""
    d = os.environ.get("TILESCALE_TEST_LOG_DIR")
    if not d:
        return None
    import re

    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].rpartition("::")[2] or Path(script).stem
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{time.strftime('%H%M%S')}-{test}-{nranks}r")[:120]
    Path(d).mkdir(parents=True, exist_ok=True)
    return JobLog(Path(d) / f"{name}.log")


def assert_all_ranks_ok(proc: subprocess.CompletedProcess, nranks: int, marker: str = "OK") -> None:
    """The job exited 0 and every rank printed ``[rank R] OK``."""
    out = proc.stdout
    missing = [r for r in range(nranks) if f"[rank {r}] {marker}" not in out]
    if proc.returncode != 0 or missing:
        raise AssertionError(f"exit code {proc.returncode}; ranks without '[rank R] {marker}': {missing}\n"
                             f"--- output (last 6000 chars) ---\n{out[-6000:]}")


def check_close(name: str, got, want, rank: int, atol: float = 0.0, rtol: float = 0.0) -> None:
    """Raise with a useful message unless `got` matches `want` (exactly by default)."""
    import torch

    if got.shape != want.shape:
        raise AssertionError(f"[rank {rank}] {name}: shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    if atol == 0 and rtol == 0:
        bad = (got != want).nonzero()
    else:
        bad = (~torch.isclose(got.float(), want.float(), atol=atol, rtol=rtol)).nonzero()
    if bad.numel():
        i = tuple(bad[0].tolist())
        raise AssertionError(f"[rank {rank}] {name}: {bad.shape[0]} of {got.numel()} elements differ; first at {i}: "
                             f"got {got[i].item()}, expected {want[i].item()}")
