"""require_same_on_all_ranks on 2 real processes (gloo on CPU): a collective called with different shapes
or dtypes on different ranks raises CollectiveMismatchError on every rank, naming the argument and every
rank's value, and no rank hangs. The ops' constructors check before they allocate anything. The
runtime is tilescale's own Runtime class, without NVSHMEM (its control-plane collectives are plain
torch.distributed over gloo, which is all that these checks use)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tilescale import testing

REPO = Path(__file__).resolve().parent.parent

WORKER = r"""
import datetime, json, os, sys
import torch
import torch.distributed as dist
from tilescale import runtime
from tilescale.errors import CollectiveMismatchError
from tilescale.ops.consistency import require_same_on_all_ranks

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
rt = object.__new__(runtime.Runtime)          # the real class; no GPU, no NVSHMEM
rt.info = runtime.DistInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
rt.ctrl_group, rt.closed = None, False
runtime._RT = rt

def case(name, fn):
    try:
        fn()
        res = {"case": name, "raised": None}
    except Exception as e:  # noqa: BLE001
        res = {"case": name, "raised": type(e).__name__, "msg": str(e),
               "mismatch": isinstance(e, CollectiveMismatchError)}
    print("RESULT " + json.dumps(res), flush=True)

def op(name):
    from tilescale import ops
    return getattr(ops, name)

case("same", lambda: require_same_on_all_ranks("Op", shape=(4, 8), dtype=torch.bfloat16, root=0))
case("shape", lambda: require_same_on_all_ranks("Op", shape=(4, 8 + rank), dtype=torch.bfloat16, root=0))
case("dtype", lambda: require_same_on_all_ranks(
    "Op", shape=(4, 8), dtype=torch.float32 if rank else torch.bfloat16, root=0))
case("both", lambda: require_same_on_all_ranks("Op", shape=[4, rank], dtype=str(rank), root=0))
# the ops' constructors: rank 1 passes something else; rank 1's M is not even valid for the op, which
# would raise a local ValueError on rank 1 alone (and leave rank 0 waiting) if checked first
case("AGGemm M", lambda: op("AGGemm")(4096 + 8 * rank, 2048, 1024, torch.bfloat16))
case("AGGemm dtype", lambda: op("AGGemm")(4096, 2048, 1024, torch.float16 if rank else torch.bfloat16))
case("GemmRS K_local", lambda: op("GemmRS")(4096, 2048, 1024 * (1 + rank), torch.bfloat16))
case("AllGather shape", lambda: op("AllGather")((1024, 8 + rank), torch.bfloat16))
case("AllGather dtype", lambda: op("AllGather")((1024, 8), torch.float32 if rank else torch.bfloat16))
case("same again", lambda: require_same_on_all_ranks("Op", shape=(1,), dtype=torch.int8))  # still in step
dist.destroy_process_group()
"""


def _run_two_ranks(timeout=240):
    port = str(testing.free_port())
    procs = []
    for r in range(2):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                 PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=e, cwd=str(REPO)))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outs, strict=False)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-4000:]}"
    return [{d["case"]: d for d in (json.loads(ln[len("RESULT "):]) for ln in out.splitlines()
                                    if ln.startswith("RESULT "))} for out in outs]


def test_mismatches_raise_on_every_rank():
    ranks = _run_two_ranks()

    def mismatch(name, *needles, absent=()):
        for r, res in enumerate(ranks):
            d = res.get(name)
            assert d is not None, f"rank {r}: case {name!r} did not run"
            assert d["raised"] == "CollectiveMismatchError" and d["mismatch"], (r, d)
            for n in needles:
                assert n in d["msg"], (r, name, n, d["msg"])
            for n in absent:
                assert n not in d["msg"].split("\n")[0], (r, name, n, d["msg"])
            assert f"(this is rank {r})" in d["msg"], d["msg"]

    for r, res in enumerate(ranks):
        assert res["same"]["raised"] is None, (r, res["same"])
        assert res["same again"]["raised"] is None, (r, res["same again"])
    mismatch("shape", "Op:", "shape", "rank 0: (4, 8)", "rank 1: (4, 9)", absent=("dtype", "root"))
    mismatch("dtype", "dtype", "rank 0: torch.bfloat16", "rank 1: torch.float32", absent=("shape",))
    mismatch("both", "shape", "dtype", "rank 0: (4, 0)", "rank 1: (4, 1)", absent=("root",))
    mismatch("AGGemm M", "AGGemm", "argument(s) M differ", "rank 0: 4096", "rank 1: 4104")
    mismatch("AGGemm dtype", "AGGemm", "argument(s) dtype differ", "torch.float16", "torch.bfloat16")
    mismatch("GemmRS K_local", "GemmRS", "argument(s) K_local differ", "rank 0: 1024", "rank 1: 2048")
    mismatch("AllGather shape", "AllGather", "shape", "rank 0: (1024, 8)", "rank 1: (1024, 9)")
    mismatch("AllGather dtype", "AllGather", "dtype", "torch.float32", "torch.bfloat16")
