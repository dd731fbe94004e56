"""Print (or, with --write, embed into docs/multinode.md) the tables of the multi-node cost model, which lives in
the package (tilescale/plan/multinode_model.py: the plan selector applies its rule).

    python docs/multinode_model.py            # print the markdown that docs/multinode.md embeds
    python docs/multinode_model.py --write    # rewrite that part of docs/multinode.md in place
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilescale.plan import multinode_model  # noqa: E402

if __name__ == "__main__":
    sys.exit(multinode_model.main(sys.argv))
