"""The shared-GPU mode on CPU: how ranks map to GPUs, the gloo-only torch.distributed group, the error without
the setting, and the test harness sharing GPUs by itself (launch.sh's side: tests/test_launch_sh.py)."""
import re

import pytest

from tilescale import env, errors, runtime, testing


@pytest.mark.parametrize("ranks,gpus,rpg,want", [
    (2, 2, 1, [0, 1]),                  # enough GPUs: one rank each, the setting does not matter
    (4, 8, 1, [0, 1, 2, 3]),
    (2, 1, 2, [0, 0]),
    (4, 1, 4, [0, 0, 0, 0]),
    (4, 2, 2, [0, 0, 1, 1]),            # evenly, neighbours together
    (3, 2, 2, [0, 0, 1]),
    (8, 3, 3, [0, 0, 0, 1, 1, 1, 2, 2]),
    (4, 1, 8, [0, 0, 0, 0]),            # a larger allowance is an allowance, not a target
])
def test_device_map(ranks, gpus, rpg, want):
    got = runtime.device_map(ranks, gpus, rpg)
    assert got == want
    assert max(got.count(d) for d in set(got)) <= rpg


def test_more_ranks_than_gpus_without_the_setting_is_an_error():
    with pytest.raises(errors.TileScaleError) as e:
        runtime.device_map(4, 1, 1)
    msg = str(e.value)
    assert "4 ranks on this node but only 1 visible GPU(s)" in msg and "TILESCALE_RANKS_PER_GPU=4" in msg, msg
    with pytest.raises(errors.TileScaleError, match="TILESCALE_RANKS_PER_GPU=2"):
        runtime.device_map(4, 2, 1)
    with pytest.raises(errors.TileScaleError, match="no visible GPU"):
        runtime.device_map(2, 0, 4)


def test_process_group_is_gloo_only_when_gpus_are_shared():
    assert runtime.process_group_args(True, 0) == {"backend": "gloo"}
    distinct = runtime.process_group_args(False, 1)
    assert distinct["backend"] == "cpu:gloo,cuda:nccl" and str(distinct["device_id"]) == "cuda:1"


def test_ranks_per_gpu_setting(monkeypatch):
    monkeypatch.delenv("TILESCALE_RANKS_PER_GPU", raising=False)
    assert env.settings.ranks_per_gpu == 1
    monkeypatch.setenv("TILESCALE_RANKS_PER_GPU", "4")
    assert env.settings.ranks_per_gpu == 4
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("TILESCALE_RANKS_PER_GPU", bad)
        with pytest.raises(ValueError, match="TILESCALE_RANKS_PER_GPU"):
            _ = env.settings.ranks_per_gpu


def test_shares_gpu_is_false_before_init():
    assert runtime.shares_gpu() is False


def test_harness_shares_gpus_when_there_are_fewer_than_ranks(monkeypatch):
    assert testing.ranks_per_gpu_for(4, 1) == 4
    assert testing.ranks_per_gpu_for(4, 2) == 2
    assert testing.ranks_per_gpu_for(3, 2) == 2
    assert testing.ranks_per_gpu_for(2, 4) == 1
    seen = {}

    class FakePopen:
        def __init__(self, cmd, env, **kw):
            seen.update(env)
            self.returncode, self.pid, self.stdout = 0, 0, iter(["[rank 0] OK\n"])

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(testing.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(testing, "gpu_count", lambda: 1)
    monkeypatch.delenv("TILESCALE_RANKS_PER_GPU", raising=False)
    assert testing.launch("x.py", 4).stdout == "[rank 0] OK\n"
    assert seen["GPUS"] == "4" and seen["TILESCALE_RANKS_PER_GPU"] == "4"
    seen.clear()
    monkeypatch.setattr(testing, "gpu_count", lambda: 4)
    testing.launch("x.py", 4)
    assert "TILESCALE_RANKS_PER_GPU" not in seen     # distinct GPUs: NCCL references stay in use


def test_launch_writes_a_stamped_job_log_when_asked(tmp_path, monkeypatch):
    """TILESCALE_TEST_LOG_DIR: every job's output, line by line with its time, and the exit code."""
    script = tmp_path / "job.sh"
    monkeypatch.setattr(testing, "LAUNCH_SH", script)
    script.write_text("echo one; echo two; exit 3\n")
    monkeypatch.setenv("TILESCALE_TEST_LOG_DIR", str(tmp_path / "logs"))
    proc = testing.launch("x.py", 2)
    assert proc.returncode == 3 and proc.stdout == "one\ntwo\n"
    (log,) = (tmp_path / "logs").glob("*.log")
    text = log.read_text()
    assert "test_launch_writes_a_stamped_job_log_when_asked-2r" in log.name
    assert re.search(r"^\[\s*\d+\.\ds\] one$", text, re.M)
    assert re.search(r"\] \[tilescale.testing\] exit 3$", text, re.M)
