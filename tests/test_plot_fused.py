"""benchmarks/plot_fused.py: the README's chart of the fused ops is drawn from the committed results file, bar for
bar, and the committed PNG is what the script writes (same size; regenerate it with the command in its docstring)."""
import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
pytest.importorskip("matplotlib")
import plot_fused  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "4xH200"
DOUBTFUL = frozenset({"ag_gemm:4096x8192x2048", "ag_gemm:8192x4096x2752"})


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_chart_is_drawn_from_the_results_file(tmp_path):
    env, rows = plot_fused.load(str(RESULTS / "fused.json"))
    assert env["world_size"] == 4 and f"commit {env['commit'][:7]}" in (REPO / "README.md").read_text()
    assert [(r["op"], plot_fused.shape(r)) for r in rows][:2] == [("ag_gemm", "4096x8192x2048"),
                                                                  ("ag_gemm", "4096x8192x7168")]
    assert len(rows) == 10 and all(r["M"] >= 4096 for r in rows)
    out = tmp_path / "fused.png"
    fig = plot_fused.plot(env, rows, str(out), DOUBTFUL)
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 3 * len(rows)
    for j, (key, _, _) in enumerate(plot_fused.COLUMNS):          # bars of one column, row by row
        heights = [b.get_height() for b in bars[j * len(rows):(j + 1) * len(rows)]]
        assert heights == pytest.approx([r[key] / r["nccl_cublas"] for r in rows]), key
    hatched = [plot_fused.shape(r) for r, b in zip(rows, bars[len(rows):2 * len(rows)], strict=True) if b.get_hatch()]
    assert hatched == ["4096x8192x2048", "8192x4096x2752"]
    assert _png_size(out) == _png_size(RESULTS / "fused.png")     # the committed chart is this script's


def test_the_command_line_writes_the_png(tmp_path):
    out = tmp_path / "chart.png"
    assert plot_fused.main([str(RESULTS / "fused.json"), "--out", str(out), "--min-m", "0"]) == 0
    assert _png_size(out)[0] > 0
