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
from tilescale import testing, topology  # noqa: E402
from tilescale.ops import prebuild  # noqa: E402

EXAMPLES = ["example_put_get", "example_signal_wait", "example_ld_st_atomic", "example_sync", "example_remote_view"]


def examples(world_size: int, node_size: int) -> list[str]:
    """The examples that apply: example_remote_view's ring (rank -> rank + 1) loads and stores through peer
    views, which exist only within a node; with emulated nodes (TILESCALE_NODE_SIZE) that split the ring it is
    left out (T.remote refuses such a peer with a clear error: tests/gpu/remote_main.py checks that)."""
    ring_in_one_node = world_size <= node_size
    return [m for m in EXAMPLES if m != "example_remote_view" or ring_in_one_node]


def run(info):
    topo = topology.current()
    names = examples(info.world_size, topo.node_size)
    mods = [importlib.import_module(m) for m in names]
    prebuild.on_local_rank0([j for m in mods for j in m.jobs(info.world_size)])
    for m in mods:
        m.run(info)
        tilescale.barrier()
    left = sorted(set(EXAMPLES) - set(names))
    note = f" ({', '.join(left)} left out: its ring crosses emulated nodes of {topo.node_size})" if left else ""
    print(f"[rank {info.rank}] OK: all {len(mods)} primitives examples{note}", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
