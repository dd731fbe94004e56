"""An example's compile-only run (what launch.sh does on a machine without GPUs) builds its kernels as one batch:
one progress line while they are built, and nothing about kernels when the cache holds them all (it printed
``built <path>`` per kernel, cache hit or not); rank 1 of a job prints nothing about them."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "distributed" / "example_allreduce.py"   # two kernels


def compile_only(cache: Path, rank: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "TILESCALE_COMPILE_ONLY": "1", "WORLD_SIZE": "2", "RANK": str(rank),
           "TILESCALE_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, env=env, timeout=900, cwd=str(REPO))
    # as bytes: text mode would turn the \r that redraws the progress line into a new line
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def test_compile_only_shows_one_progress_line_and_nothing_for_cache_hits(tmp_path):
    first = compile_only(tmp_path / "cache")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout == f"compiled every kernel of {EXAMPLE.name} for world size 2 (no GPU: not run)\n"
    progress = [ln for ln in first.stderr.split("\n") if "tilescale: building" in ln]   # redrawn after \r
    assert len(progress) == 1 and progress[0].split("\r")[-1].startswith("tilescale: building kernels 2/2 ["), \
        first.stderr
    again = compile_only(tmp_path / "cache")
    assert again.returncode == 0 and again.stdout == first.stdout
    assert "tilescale" not in again.stderr and "built" not in again.stderr, again.stderr
    other = compile_only(tmp_path / "cache2", rank=1)          # builds, silently
    assert other.returncode == 0 and "tilescale: building" not in other.stderr, other.stderr
    assert len(list((tmp_path / "cache2" / "kernels").glob("*/kernel_lib.so"))) == 2
