"""tilescale.shm_leftovers: which /dev/shm files are removed (a folder of fakes stands for /dev/shm)."""
import os
import subprocess
import sys

from tilescale import shm_leftovers as shm


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _make(root, pid, n=0):
    f = root / f"cuda.shm.0.{pid:x}.{n}"
    f.write_bytes(b"x")
    return f


def test_own_files_are_removed_and_nothing_else(tmp_path):
    mine, other = _make(tmp_path, os.getpid(), 1), _make(tmp_path, os.getppid(), 1)
    unrelated = tmp_path / f"mps_shm_{os.getpid():x}"
    unrelated.write_bytes(b"x")
    link = tmp_path / f"cuda.shm.0.{os.getpid():x}.2"
    link.symlink_to(unrelated)
    assert shm.files_of([os.getpid()], tmp_path) == [mine]
    assert shm.remove_own(tmp_path) == 1
    assert not mine.exists() and other.exists() and unrelated.exists() and link.is_symlink()


def test_files_of_ended_processes_are_removed_live_ones_kept(tmp_path):
    dead, live = _make(tmp_path, _dead_pid()), _make(tmp_path, os.getpid())
    assert shm.remove_dead(tmp_path) == 1
    assert not dead.exists() and live.exists()


def test_launch_sh_cleans_up_in_shared_mode_only():
    from tilescale import testing

    text = testing.LAUNCH_SH.read_text()
    assert "cleanup() { end_job; stop_mps; clean_shm; }" in text
    assert '[ "$SHARED" = 1 ] || return 0' in text and "-m tilescale.shm_leftovers" in text
