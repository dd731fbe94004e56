"""GPU tier: how a job ends. A normal exit, an exception on every rank or on one rank, and Ctrl-C must end
every process of the job in bounded time, and print no error from freeing symmetric memory or shutting
NVSHMEM down. Each test runs tests/gpu/teardown_main.py on 2 ranks through launch.sh (see its docstring
for the modes); the CPU side of the same (torchrun, signals, leftovers) is in tests/test_launch_sh.py."""
import os
import re
import signal
import time
from pathlib import Path

import jobs
import pytest

from tilescale import shm_leftovers, testing

MAIN = Path(__file__).resolve().parent / "gpu" / "teardown_main.py"
SIZES = [2, 4]   # ranks per job (sharing GPUs where there are fewer)


def need(n):
    testing.skip_unless_ranks(n)   # fewer GPUs than ranks: the ranks share GPUs


def start(mode: str, nranks: int, **env) -> tuple:
    """The job, once every rank has printed RUNNING, and every pid it had then (ranks, torchrun, launch.sh)."""
    job = jobs.Job(MAIN, mode, gpus=nranks, env=env)
    try:
        lines = job.wait_for(r"\[rank \d+\] RUNNING pid=", nranks, timeout=400)   # first run: compiles
    except AssertionError:
        job.kill()
        raise
    job.rank_pids = [int(m) for ln in lines for m in re.findall(r"pid=(\d+)", ln)]
    if testing.shared_gpus(nranks):   # NVSHMEM's inter-process event files (tilescale/shm_leftovers.py) exist...
        assert shm_leftovers.files_of(job.rank_pids), f"no /dev/shm/cuda.shm.* file of ranks {job.rank_pids}"
    return job, job.rank_pids + jobs.session_members(job.sid)


def finish(job, pids, timeout: float) -> int:
    """launch.sh's exit code once it ended (within `timeout` s), after checking that nothing is left."""
    rc = job.wait(timeout)
    left = [p for p in pids if jobs.alive(p)] + job.leftovers(grace=15)
    if rc is None or left:
        desc = job.describe(left)
        job.kill(pids + left)
        raise AssertionError(f"the job did not end within {timeout:.0f} s (exit code {rc}); still running:\n{desc}\n"
                             f"--- output ---\n{job.output[-5000:]}")
    shm = shm_leftovers.files_of(job.rank_pids)   # ...and none is left however the job ended
    assert not shm, f"left in /dev/shm: {[str(p) for p in shm]}"
    return rc


def assert_no_teardown_errors(out: str) -> None:
    bad = jobs.teardown_errors(out)
    assert not bad, "errors at teardown:\n" + "\n".join(bad[:20]) + f"\n--- output ---\n{out[-5000:]}"


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
@pytest.mark.parametrize("mode", ["normal", "atexit"])
def test_normal_exit_is_clean(mode, nranks):
    """example_main's finalize, or tilescale's at-exit hook: exit 0, symmetric memory freed without a word."""
    need(nranks)
    job, pids = start(mode, nranks)
    rc = finish(job, pids, timeout=120)
    out = job.output
    assert rc == 0, out[-5000:]
    assert out.count(f"OK: {mode} exit") == nranks, out[-5000:]
    assert "Traceback" not in out and "Error" not in out, out[-5000:]
    assert "destroy_process_group() was not called" not in out, out[-5000:]
    assert_no_teardown_errors(out)


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
def test_exception_on_every_rank(nranks):
    """Every rank raises: each prints its traceback, the job exits non-zero at once, nothing is left."""
    need(nranks)
    job, pids = start("raise_all", nranks)
    rc = finish(job, pids, timeout=90)
    out = job.output
    assert rc != 0, out[-5000:]
    for r in range(nranks):
        assert f"RuntimeError: teardown_main: intentional failure on rank {r}" in out, out[-5000:]
    assert_no_teardown_errors(out)


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
@pytest.mark.parametrize("mode", ["raise_one", "raise_one_bare"])
def test_exception_on_one_rank(mode, nranks):
    """Rank 1 raises while rank 0 waits in a kernel for it (no wait timeout: production settings). Rank 1
    must not wait for rank 0 in a collective teardown: it exits, torchrun stops rank 0, the job ends."""
    need(nranks)
    job, pids = start(mode, nranks, TILESCALE_WAIT_TIMEOUT_S="0")
    t0 = time.monotonic()
    rc = finish(job, pids, timeout=90)
    out = job.output
    assert rc != 0, out[-5000:]
    assert "RuntimeError: teardown_main: intentional failure on rank 1" in out, out[-5000:]
    assert "UNEXPECTED" not in out, out[-5000:]
    assert time.monotonic() - t0 < 60, f"the job took {time.monotonic() - t0:.0f} s to end\n{out[-5000:]}"
    assert_no_teardown_errors(out)


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
def test_ctrl_c_ends_every_process(nranks):
    """Ctrl-C while the ranks run collectives: launch.sh exits 130 within seconds, every process is gone
    (ranks, torchrun, launch.sh), and nothing reports an error of freeing symmetric memory."""
    need(nranks)
    job, pids = start("loop", nranks)
    time.sleep(2)                                   # collectives in flight
    t0 = time.monotonic()
    job.interrupt()
    rc = finish(job, pids, timeout=60)
    took = time.monotonic() - t0
    out = job.output
    assert rc == 130, f"exit code {rc}\n{out[-5000:]}"
    assert took < 30, f"launch.sh took {took:.0f} s to end after Ctrl-C\n{out[-5000:]}"
    assert "UNEXPECTED" not in out
    assert_no_teardown_errors(out)


# ----------------------------------------------------------------------- the fault matrix (bounded ends)
FAULT_BOUND_S = 5          # TILESCALE_WAIT_TIMEOUT_S of these jobs: every wait and barrier gives up after it


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
def test_never_completing_barrier(nranks):
    """Rank 0 skips a barrier the others enter: their barrier gives up after the bound with a record naming
    it, every rank (rank 0 too) is stopped, the job ends within the bound + 30 s, nothing is left."""
    need(nranks)
    job, pids = start("never_barrier", nranks, TILESCALE_WAIT_TIMEOUT_S=str(FAULT_BOUND_S))
    t0 = time.monotonic()
    rc = finish(job, pids, timeout=FAULT_BOUND_S + 60)
    out = job.output
    assert rc != 0, out[-5000:]
    assert "a barrier of all ranks" in out and "WaitTimeoutError" in out, out[-5000:]
    assert "rank 0 stops: rank" in out, out[-5000:]            # the rank that skipped is stopped, told who failed
    assert "UNEXPECTED" not in out, out[-5000:]
    assert time.monotonic() - t0 < FAULT_BOUND_S + 30, f"took {time.monotonic() - t0:.0f} s\n{out[-3000:]}"


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
@pytest.mark.parametrize("mode", ["caught_exit", "kill9"])
def test_rank_leaves_while_others_wait(mode, nranks):
    """Rank 1 leaves (catches an error and exits normally, or is killed with -9) while the others wait in
    kernels for its signal: every rank ends within the bound (+ 30 s), with an error naming what happened."""
    need(nranks)
    job, pids = start(mode, nranks, TILESCALE_WAIT_TIMEOUT_S=str(FAULT_BOUND_S))
    t0 = time.monotonic()
    rc = finish(job, pids, timeout=FAULT_BOUND_S + 60)
    out = job.output
    took = time.monotonic() - t0
    assert rc != 0, out[-5000:]
    assert "UNEXPECTED" not in out, out[-5000:]
    assert took < FAULT_BOUND_S + 30, f"took {took:.0f} s\n{out[-3000:]}"
    if mode == "caught_exit":
        assert "caught teardown_main: an error rank 1 catches" in out, out[-5000:]
        assert "gave up" in out, out[-5000:]                    # a wait record: the ranks that waited for rank 1
    else:
        assert "-9" in out or "SIGKILL" in out, out[-5000:]     # the launcher names the killed rank


def _placed(placement: str, nranks: int) -> dict:
    """The environment of a job whose ranks have a GPU each (``distinct``: skipped with fewer GPUs) or all share
    GPU 0 (``shared``)."""
    if placement == "shared":
        return {"CUDA_VISIBLE_DEVICES": "0", "TILESCALE_RANKS_PER_GPU": str(nranks)}
    if testing.gpu_count() < nranks:
        pytest.skip(f"distinct GPUs for {nranks} ranks: {testing.gpu_count()} visible")
    return {}


def _gone(pids, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(jobs.alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(jobs.alive(p) for p in pids)


@pytest.mark.multigpu
@pytest.mark.parametrize("placement", ["distinct", "shared"])
@pytest.mark.parametrize("nranks", SIZES)
@pytest.mark.parametrize("fault", ["skips_a_call", "sigstop"])
def test_ag_gemm_peer_fault_ends_every_other_rank(fault, nranks, placement):
    """AG+GEMM's stream waits are bounded (tilescale/runtime/stream_waits.py): rank 1 skips one call, or is SIGSTOPped
    mid-call (its host stops, its watchdog too; its GPU ends what was queued). Every other rank ends within the bound
    (+ the watchdog's polls and STOP_GRACE_S), with a record naming the op and the flag rank 1 sets (said by the
    watchdog of a rank whose stream wait gave up, or added to the record of its GEMM's wait for a chunk that the
    stream brings, or the record of that wait alone where rank 1 pushes the chunks: the line it quotes names the
    flag); then the job ends and nothing is left (the stopped rank: killed by the launcher)."""
    need(nranks)
    env = _placed(placement, nranks)
    mode = "ag_skip" if fault == "skips_a_call" else "ag_loop"
    job = jobs.Job(MAIN, mode, gpus=nranks, env={"TILESCALE_WAIT_TIMEOUT_S": str(FAULT_BOUND_S), **env})
    try:
        lines = job.wait_for(r"\[rank \d+\] AGGEMM pid=", nranks, timeout=400)   # first run: compiles
    except AssertionError:
        job.kill()
        raise
    ranks = dict(tuple(map(int, re.search(r"rank (\d+)\] AGGEMM pid=(\d+)", ln).groups())) for ln in lines)
    job.rank_pids = list(ranks.values())      # finish() looks for their /dev/shm files
    pids = list(ranks.values()) + jobs.session_members(job.sid)
    if fault == "sigstop":
        time.sleep(1)                                # calls in flight
        os.kill(ranks[1], signal.SIGSTOP)
    t0 = time.monotonic()
    others = [p for r, p in ranks.items() if r != 1]
    ended = _gone(others, FAULT_BOUND_S + 30)
    took = time.monotonic() - t0
    rc = finish(job, pids, timeout=120)
    out = job.output
    assert ended, f"ranks other than 1 still ran {FAULT_BOUND_S + 30} s after the fault\n{out[-5000:]}"
    assert took < FAULT_BOUND_S + 20, f"the other ranks took {took:.0f} s to end\n{out[-5000:]}"
    assert rc != 0, out[-5000:]
    assert "UNEXPECTED" not in out, out[-5000:]
    # a stream wait of AG+GEMM's protocol (pull: ready / freed; push: freed), or its second GEMM's wait for a chunk
    # (push: rank 1's copies bring them; pull: a copy stream, whose pending wait the record then names too)
    stream_wait = re.search(r"AGGemm's stream wait for flag (ready|freed)\[1\] \(set by rank 1\)", out)
    chunk_wait = re.search(r"T\.wait_until at \S*allgather_gemm\.py:\d+ gave up.*The wait: T\.wait_until\(arrived\[",
                           out)
    assert stream_wait or chunk_wait, out[-5000:]


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", SIZES)
def test_sighup_ends_every_process(nranks):
    """SIGHUP to launch.sh (its terminal closed) while the ranks run collectives: exit 129 within seconds,
    every process gone."""
    need(nranks)
    job, pids = start("loop", nranks)
    time.sleep(2)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGHUP)
    rc = finish(job, pids, timeout=60)
    out = job.output
    assert rc == 129, f"exit code {rc}\n{out[-5000:]}"
    assert time.monotonic() - t0 < 30, out[-3000:]
    assert "UNEXPECTED" not in out


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2])
def test_jobs_sharing_a_gpu_start_and_stop_side_by_side(nranks):
    """Four jobs that share the GPU(s) start and stop at the same moment, three times: NVSHMEM names its
    per-GPU slab of the multi-process-per-GPU mode once per host, so without tilescale's host lock
    (tilescale/runtime/mpg_lock.py) one job unlinks another's slab ("Failed to open shared memory slab")."""
    need(nranks)
    for _ in range(3):
        batch = [jobs.Job(MAIN, "normal", gpus=nranks) for _ in range(4)]
        for job in batch:
            rc = job.wait(300)
            if rc is None:
                for j in batch:
                    j.kill()
            out = job.output
            assert rc == 0, out[-5000:]
            assert out.count("OK: normal exit") == nranks, out[-5000:]
            assert "shared memory slab" not in out, out[-5000:]
