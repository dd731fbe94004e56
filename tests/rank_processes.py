"""Rank processes for the CPU tests of tilescale.distributed: a script run as `nranks` Python processes (RANK,
WORLD_SIZE, INIT: a file:// store in the test's folder), each printing ``RESULT <json>``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_ranks(tmp_path: Path, code: str, nranks: int = 2, timeout: float = 90,
              drop_env: tuple = ("TILESCALE_DIST_PREFER",)) -> list[dict]:
    """Each rank's RESULT; a rank that failed or printed none fails the test with every failed rank's output (one
    rank's error is often another's cause), a hang with every rank's."""
    script = tmp_path / "rank.py"
    script.write_text(code)
    env = dict(os.environ, WORLD_SIZE=str(nranks), INIT=f"file://{tmp_path / 'store'}", PYTHONPATH=str(REPO_ROOT),
               TILESCALE_PLAN_DIR=str(tmp_path / "plans"))
    for k in drop_env:
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**env, "RANK": str(r)}) for r in range(nranks)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        pytest.fail("ranks did not finish (hang?):\n" + "\n".join(q.communicate()[0][-3000:] for q in procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    failed = [f"rank {r} failed (exit {p.returncode}):\n{o[-4000:]}" for r, (p, o) in
              enumerate(zip(procs, outs, strict=True)) if p.returncode != 0 or "RESULT " not in o]
    assert not failed, "\n".join(failed)
    return [json.loads(o.split("RESULT ", 1)[1].splitlines()[0]) for o in outs]
