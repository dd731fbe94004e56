"""Every primitives example in one job (one launch per world size for the GPU tier):
local rank 0 compiles all their kernels in parallel first, then each example runs and checks itself.

    GPUS=2 bash launch.sh tests/gpu/primitives_main.py
"""
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "examples" / "distributed" / "primitives"))

import tilescale  # noqa: E402
from tilescale import testing  # noqa: E402
from tilescale.ops import prebuild  # noqa: E402

EXAMPLES = ["example_put_get", "example_signal_wait", "example_ld_st_atomic", "example_sync", "example_remote_view"]


def run(info):
    mods = [importlib.import_module(m) for m in EXAMPLES]
    prebuild.on_local_rank0([j for m in mods for j in m.jobs(info.world_size)])
    for m in mods:
        m.run(info)
        tilescale.barrier()
    print(f"[rank {info.rank}] OK: all {len(mods)} primitives examples", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
