"""The NVSHMEM wheels of an install: this environment's, or those of a `pip install --dry-run --report FILE`.
Prints them and exits 1 unless there is exactly one (two would share nvidia/nvshmem; see constraints/cu12.txt).

    python .ci/nvshmem_wheels.py                  # this environment
    python .ci/nvshmem_wheels.py --report r.json  # what that resolution would install
"""
import argparse
import importlib.metadata as md
import json
import sys


def wheels(report: str | None) -> list[str]:
    if report is None:
        dists = [(d.metadata["Name"], d.version) for d in md.distributions()]
    else:
        with open(report) as f:
            dists = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(f)["install"]]
    return sorted(f"{n}=={v}" for n, v in dists if n.lower().replace("_", "-").startswith("nvidia-nvshmem"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", help="a pip --report JSON file (default: the installed distributions)")
    found = wheels(p.parse_args().report)
    print("NVSHMEM wheels:", ", ".join(found) or "none")
    return 0 if len(found) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
