"""The fused ops against their peers, as a chart, from a results file of bench_fused.py (--json):

    python benchmarks/plot_fused.py benchmarks/results/4xH200/fused.json --out benchmarks/results/4xH200/fused.png \
        --doubtful ag_gemm:4096x8192x2048,ag_gemm:8192x4096x2752

One group of bars per shape (rows with at least --min-m rows, 4096 by default: the README's table): the time of
NCCL then cuBLAS, of PyTorch's async-TP and of tilescale, each divided by NCCL then cuBLAS's (lower is faster),
with the ideal (max(NCCL alone, cuBLAS alone)) marked. --doubtful hatches async-TP bars that are not credible
(op:MxKxN, comma-separated), as the README says of two cells of the 4 x H200 run. Needs matplotlib (the test extra).
"""
from __future__ import annotations

import argparse
import json

COLUMNS = (("nccl_cublas", "NCCL then cuBLAS", "#9e9e9e"), ("async_tp", "PyTorch async-TP", "#e69f00"),
           ("tilescale", "tilescale", "#0072b2"))
OPS = {"ag_gemm": "AG+GEMM", "gemm_rs": "GEMM+RS"}


def shape(row: dict) -> str:
    return f"{row['M']}x{row['K']}x{row['N']}"


def load(path: str, min_m: int = 4096) -> tuple[dict, list[dict]]:
    """(the run's env, its rows with M >= min_m), in the file's order."""
    with open(path) as f:
        data = json.load(f)
    return data["env"], [r for r in data["rows"] if r["M"] >= min_m]


def plot(env: dict, rows: list[dict], out: str, doubtful: frozenset = frozenset()):
    """Write the chart to `out` (PNG); returns the figure (its axes' bars are in COLUMNS order, row by row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width, top = 0.27, 1.3
    fig, ax = plt.subplots(figsize=(11, 4.6))
    for j, (key, label, color) in enumerate(COLUMNS):
        xs = [i + (j - 1) * width for i in range(len(rows))]
        heights = [r[key] / r["nccl_cublas"] if r.get(key) is not None else 0.0 for r in rows]
        bars = ax.bar(xs, heights, width, label=label, color=color)
        for bar, r, h in zip(bars, rows, heights, strict=True):
            if key == "async_tp" and f"{r['op']}:{shape(r)}" in doubtful:
                bar.set_hatch("//")
                bar.set_alpha(0.45)
            if h > top:   # cut at the top of the chart: its value written there
                ax.text(bar.get_x() + width / 2, top * 0.98, f"{h:.2f}", ha="center", va="top", fontsize=7,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    for i, r in enumerate(rows):
        ax.hlines(r["ideal"] / r["nccl_cublas"], i - 1.5 * width, i + 1.5 * width, colors="black", lw=1.2,
                  label="ideal: max(NCCL, cuBLAS)" if i == 0 else None)
    ax.set_xticks(range(len(rows)), [f"{OPS.get(r['op'], r['op'])}\n{r['M']}x{r['K']}\nx{r['N']}" for r in rows],
                  fontsize=8)
    ax.set_ylim(0, top)
    ax.set_ylabel("time / NCCL then cuBLAS (lower is faster)")
    gpus = f"{env.get('world_size', '?')} x {str(env.get('gpu', 'GPU')).replace('NVIDIA ', '')}"
    note = ", hatched: not credible" if doubtful else ""
    ax.set_title(f"Fused ops, bf16, {gpus} (commit {str(env.get('commit', '?'))[:7]}{note})", fontsize=10)
    ax.axhline(1.0, color="gray", lw=0.6, ls=":")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a results file of bench_fused.py --json")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--min-m", type=int, default=4096, help="rows with at least this many rows M (default 4096)")
    ap.add_argument("--doubtful", default="", help="async-TP cells to hatch: op:MxKxN,... (ag_gemm:4096x8192x2048)")
    a = ap.parse_args(argv)
    env, rows = load(a.json, a.min_m)
    plot(env, rows, a.out, frozenset(filter(None, a.doubtful.split(","))))
    print(f"wrote {a.out} ({len(rows)} rows of {a.json})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
