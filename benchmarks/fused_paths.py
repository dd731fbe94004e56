"""Writes tilescale/ops/fused_paths.json (where a fused op takes the unfused path) from bench_fused.py's JSONs:

    python benchmarks/fused_paths.py benchmarks/results/*/fused.json --out tilescale/ops/fused_paths.json

Each AG+GEMM row becomes [M, N, K, path]: "unfused" where the fused kernel (``ts_fused``, the op forced fused, or
``tilescale`` when the op ran fused) was slower than NCCL-then-cuBLAS of the same run, else "fused". Keyed by the
run's GPU model and world size (its ``env``); a later file of the same GPU and world size replaces an earlier one.
"""
import argparse
import json
from pathlib import Path

OPS = ("ag_gemm",)


def rows_of(result: dict) -> tuple[str, int, dict]:
    env = result["env"]
    by_op = {}
    for r in result["rows"]:
        if r["op"] not in OPS:
            continue
        fused = r.get("ts_fused", r["tilescale"])
        path = "unfused" if fused > r["nccl_cublas"] else "fused"
        by_op.setdefault(r["op"], []).append([r["M"], r["N"], r["K"], path])
    return env["gpu"], int(env["world_size"]), by_op


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="bench_fused.py --json files")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tables, sources = {}, []
    for f in a.results:
        result = json.loads(Path(f).read_text())
        gpu, world, by_op = rows_of(result)
        tables.setdefault(gpu, {})[str(world)] = {op: sorted(rows) for op, rows in by_op.items()}
        sources.append(f"{f} (commit {result['env'].get('commit', '?')[:12]}, {result['env'].get('date', '?')})")
    out = {"note": "written by benchmarks/fused_paths.py from " + "; ".join(sources), "tables": tables}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
