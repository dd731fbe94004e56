"""launch.sh across nodes, emulated on this host: two launch.sh with NNODES=2, NODE_RANK=0 and 1, one
MASTER_ADDR (127.0.0.1) and one fixed PORT, each with GPUS=2, form one job of 4 ranks. On CPU: the fake
interpreter of tests/test_launch_sh.py reports 2 GPUs, so launch.sh takes its torchrun path (docs/multinode.md,
"Launching on several nodes")."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from test_launch_sh import FAKE_PYTHON, LAUNCH

from tilescale import testing

NODES, GPUS = 2, 2
WORLD = NODES * GPUS

# Each message ends with ";" so that it can be found however the ranks' output interleaves (print() writes
# the text and its newline separately). Rank r contributes 10**r: the sum 1111 shows that each of the four
# ranks took part exactly once.
RANK_SCRIPT = r"""
import datetime, os
import torch
import torch.distributed as dist

keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT")
seen = " ".join(f"{k}={os.environ.get(k, '-')}" for k in keys)
print(f"[rank {os.environ['RANK']}] ENV {seen} pid={os.getpid()};", flush=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([10.0 ** dist.get_rank()], dtype=torch.float64)
dist.all_reduce(t)
print(f"[rank {dist.get_rank()}] SUM {t.item():.0f};", flush=True)
dist.destroy_process_group()
"""


def _env_lines(output: str) -> list[dict]:
    """The ENV messages of the ranks in `output`, each as {name: value} (with "pid")."""
    return [dict(kv.split("=", 1) for kv in m.group(1).split())
            for m in re.finditer(r"\[rank \d+\] ENV ([^;]*);", output)]


def test_two_launches_form_one_job(tmp_path):
    """Two launch.sh (node 1 started first, as on real nodes where the order is not controlled) join into
    one job of 4 ranks: distinct ranks 0-3, world size 4, local ranks 0-1 on each node, the node rank each
    launch was given, the same master address and port; a gloo all_reduce over the 4 ranks is right on every
    rank; both launch.sh exit 0 and no process of either is left."""
    import jobs

    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = testing.free_port()
    launched: list[jobs.Job] = []
    started: list[int] = []
    try:
        for node in (1, 0):
            env = {"PYTHON": str(py), "TMPDIR": str(tmp_path), "NNODES": str(NODES), "NODE_RANK": str(node),
                   "MASTER_ADDR": "127.0.0.1", "PORT": str(port)}
            launched.append(jobs.Job(script, gpus=GPUS, env=env))
            started += jobs.session_members(launched[-1].sid)          # launch.sh (and torchrun once up)
            if node == 1:
                time.sleep(1.0)
        for job in launched:
            job.wait_for(r"\[rank \d+\] SUM", GPUS, timeout=240)
            started += jobs.session_members(job.sid)
        codes = [job.wait(timeout=120) for job in launched]
        out = {node: job.output for node, job in zip((1, 0), launched, strict=False)}
        seen = {node: _env_lines(text) for node, text in out.items()}
        started += [int(e["pid"]) for lines in seen.values() for e in lines]
        everything = "\n".join(f"--- node {n} ---\n{t[-4000:]}" for n, t in out.items())

        assert codes == [0, 0], f"exit codes (node 1, node 0): {codes}\n{everything}"
        for node, lines in seen.items():
            assert f"--nnodes={NODES} --node_rank={node} --master_addr=127.0.0.1 --master_port={port}" in out[node], \
                everything                                                  # what launch.sh handed torchrun
            assert len(lines) == GPUS, everything
            assert sorted(int(e["LOCAL_RANK"]) for e in lines) == list(range(GPUS)), everything
            for e in lines:
                assert e["WORLD_SIZE"] == str(WORLD) and e["LOCAL_WORLD_SIZE"] == str(GPUS), e
                assert e["GROUP_RANK"] == str(node) and e["NODE_RANK"] == str(node), e
                assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(port), e
                assert int(e["RANK"]) // GPUS == node, f"rank {e['RANK']} placed on node {node}: {e}"
        ranks = sorted(int(e["RANK"]) for lines in seen.values() for e in lines)
        assert ranks == list(range(WORLD)), everything
        sums = re.findall(r"\[rank (\d+)\] SUM (\d+);", "\n".join(out.values()))
        assert sorted(int(r) for r, _ in sums) == list(range(WORLD)), everything
        assert all(s == "1111" for _, s in sums), sums
    finally:
        left = [p for p in set(started) if jobs.alive(p)]
        for job in launched:
            left += job.leftovers(grace=5)
        if left:
            desc = launched[0].describe(left) if launched else str(left)
            for job in launched:
                job.kill(left)
            pytest.fail(f"processes of the two launches still running:\n{desc}")


def test_several_nodes_without_a_port_are_refused(tmp_path):
    """NNODES=2 without PORT (or MASTER_PORT): each node would pick a port of its own, so launch.sh refuses at
    once (exit 2, before looking for GPUs or starting anything), naming the setting to give."""
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in ("PORT", "MASTER_PORT")}
    e.update(NNODES="2", NODE_RANK="1", MASTER_ADDR="127.0.0.1", GPUS="2", PYTHON=str(py), TMPDIR=str(tmp_path),
             TILESCALE_SKIP_DOCTOR="1")
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(LAUNCH), "x.py"], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "NNODES=2: set PORT" in r.stderr and "the same free port on every node" in r.stderr, r.stderr
    assert "torch.distributed.run" not in r.stdout + r.stderr, r.stdout    # nothing was started
    assert time.monotonic() - t0 < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]     # and nothing was written


@pytest.mark.parametrize("what,env,message", [
    ("no MASTER_ADDR", dict(NNODES="2", NODE_RANK="1", PORT="29500"), "NNODES=2: set MASTER_ADDR"),
    ("NODE_RANK too large", dict(NNODES="2", NODE_RANK="2", PORT="29500", MASTER_ADDR="10.0.0.1"),
     "NODE_RANK=2 with NNODES=2: expected 0 to 1"),
    ("NODE_RANK not a number", dict(NNODES="2", NODE_RANK="one", PORT="29500", MASTER_ADDR="10.0.0.1"),
     "NODE_RANK=one: expected an integer"),
])
def test_several_nodes_need_an_address_and_a_node_rank_in_range(tmp_path, what, env, message):
    """A node with no MASTER_ADDR would wait for a rendezvous on itself (127.0.0.1) until torchrun's timeout;
    a NODE_RANK outside 0..NNODES-1 would never be joined: refused at once, naming the setting."""
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in ("PORT", "MASTER_PORT", "MASTER_ADDR", "NODE_RANK")}
    e.update(env, GPUS="2", PYTHON=str(py), TMPDIR=str(tmp_path), TILESCALE_SKIP_DOCTOR="1")
    r = subprocess.run(["bash", str(LAUNCH), "x.py"], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 2, (what, r.stdout + r.stderr)
    assert message in r.stderr, (what, r.stderr)
    assert "torch.distributed.run" not in r.stdout + r.stderr, r.stdout
