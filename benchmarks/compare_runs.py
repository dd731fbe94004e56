"""Two runs of the same benchmark side by side (an old tree and a new tree): did a number move?

    python benchmarks/compare_runs.py OLD.json NEW.json [--kind KIND] [--tol 0.03] [--all] [--fail-if-moved]
    python benchmarks/compare_runs.py --dirs OUT/old OUT/new [--out OUT/compare.md]   # every benchmark both hold

Reads the JSON that these write (`--json`), in the format of commit 7fb3089's scripts and of today's (the
same keys; microseconds or milliseconds as each wrote them):
  gemm_configs  benchmarks/bench_gemm_configs.py   rows per (op, W, MxNxK); a row per (op, MxNxK, tile config)
                                                  and per (op, MxNxK) for cuBLAS (W only filters configs)
  build_modes   benchmarks/bench_build_modes.py    a row per (size, variant, backend/mode); `ms` -> us
  fused         benchmarks/bench_fused.py          a row per (W, op, MxKxN, column: nccl, cublas, nccl_cublas,
                                                  async_tp, tilescale, ts_gemm); W of a --group-size run: the
                                                  group's size (it compares with a world of that size)
KIND is found from the JSON's rows when not given; with --dirs each folder holds <kind>.json (gemm_configs.json,
build_modes.json, fused.json), as tests/gpu/compare_trees.sh writes them.

Prints a markdown table per benchmark (key, old us, new us, new/old, verdict: "same" when |new/old - 1| <= --tol,
else "moved"; "only old" / "only new" for a row one run lacks) and a summary line: rows, how many moved, the
largest |change|, for tilescale's own rows and for the references (cuBLAS, NCCL, async-TP: not touched by a
tilescale change, so their changes show the machine's noise). gemm_configs shows the default config's and cuBLAS's
rows (--all: every config's); its summary counts every config. With --dirs a last table sums up every benchmark.

Exit status: 0 (also when rows moved), 2 on bad input; with --fail-if-moved, 1 when a row moved or is in one run only
(nothing shows that it did not move).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

KINDS = ("gemm_configs", "build_modes", "fused")
FUSED_COLUMNS = ("nccl", "cublas", "nccl_cublas", "async_tp", "tilescale", "ts_gemm")
FUSED_REFERENCES = {"nccl", "cublas", "nccl_cublas", "async_tp"}
DEFAULT_GEMM_CONFIG = dict(block_m=128, block_n=256, block_k=64, stages=3, threads=256, swizzle=10)


@dataclass
class Row:
    key: str
    us: float
    reference: bool = False     # cuBLAS / NCCL / async-TP: not tilescale's code
    shown: bool = True          # in the table by default (gemm_configs: default config and cuBLAS)


def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        return None
    return float(x)


def detect_kind(data: dict) -> str:
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError("expected a JSON object with a 'rows' list")
    for r in rows:
        if not isinstance(r, dict):
            continue
        if "variant" in r:
            return "build_modes"
        if "cublas_us" in r or "ranked" in r:
            return "gemm_configs"
        if "tilescale" in r and "op" in r:
            return "fused"
    raise ValueError("cannot tell which benchmark wrote this JSON (no rows, or rows of an unknown kind)")


def _cfg_short(c: dict) -> str:
    """GemmConfig.short() without importing tilescale (either tree's)."""
    sw = c.get("swizzle", 10)
    return (f"{c['block_m']}x{c['block_n']}x{c['block_k']} s{c['stages']} t{c['threads']}"
            f"{' sw' + str(sw) if sw else ' nosw'}")


def rows_gemm_configs(data: dict) -> dict[str, Row]:
    out: dict[str, Row] = {}
    default = {**DEFAULT_GEMM_CONFIG}
    for r in data["rows"]:
        shape = f"{r['op']} {r['M']}x{r['N']}x{r['K']}"
        us = _num(r.get("cublas_us"))
        if us is not None:
            out.setdefault(f"{shape} cuBLAS", Row(f"{shape} cuBLAS", us, reference=True))
        # the same GEMM at another W was timed once: its configs' times repeat (W only filters them)
        for x in r.get("ranked") or []:
            us = _num(x.get("us"))
            cfg = {**DEFAULT_GEMM_CONFIG, **(x.get("config") or {})}
            if us is None:
                continue
            is_default = cfg == default
            key = f"{shape} {_cfg_short(cfg)}{' (default)' if is_default else ''}"
            out.setdefault(key, Row(key, us, shown=is_default))
        d = _num(r.get("default_us"))    # the default config may be filtered out of `ranked` at this W
        key = f"{shape} {_cfg_short(default)} (default)"
        if d is not None and key not in out:
            out[key] = Row(key, d)
    return out


def rows_build_modes(data: dict) -> dict[str, Row]:
    out: dict[str, Row] = {}
    size = data.get("size", "?")
    for r in data["rows"]:
        us = _num(r.get("us"))
        if us is None and _num(r.get("ms")) is not None:
            us = r["ms"] * 1e3
        if us is None:
            continue
        v = r["variant"]
        how = "/".join(str(x) for x in (r.get("backend"), r.get("mode")) if x not in (None, "-", ""))
        key = f"{size}^3 {v}{f' [{how}]' if how and how != v else ''}"
        out[key] = Row(key, us, reference=v == "cuBLAS")
    return out


def rows_fused(data: dict) -> dict[str, Row]:
    out: dict[str, Row] = {}
    env = data.get("env") or {}
    w = data.get("group_size") or env.get("world_size", "?")   # (--group-size G: the ops' world is G ranks)
    for r in data["rows"]:
        shape = f"W={w} {r['op']} {r['M']}x{r['K']}x{r['N']}"
        for col in FUSED_COLUMNS:
            us = _num(r.get(col))
            if us is not None:
                key = f"{shape} {col}"
                out[key] = Row(key, us, reference=col in FUSED_REFERENCES)
    return out


READERS = {"gemm_configs": rows_gemm_configs, "build_modes": rows_build_modes, "fused": rows_fused}


def load(path: str, kind: str | None = None) -> tuple[str, dict[str, Row], dict]:
    with open(path) as f:
        data = json.load(f)
    k = kind or detect_kind(data)
    return k, READERS[k](data), data


@dataclass
class Compared:
    key: str
    old: float | None
    new: float | None
    reference: bool
    shown: bool

    @property
    def ratio(self) -> float | None:
        return None if self.old is None or self.new is None else self.new / self.old

    def verdict(self, tol: float) -> str:
        if self.old is None:
            return "only new"
        if self.new is None:
            return "only old"
        return "same" if abs(self.ratio - 1.0) <= tol + 1e-12 else "moved"


def compare(old: dict[str, Row], new: dict[str, Row]) -> list[Compared]:
    keys = list(old) + [k for k in new if k not in old]
    out = []
    for k in keys:
        o, n = old.get(k), new.get(k)
        ref = (o or n).reference
        shown = any(x.shown for x in (o, n) if x is not None)
        out.append(Compared(k, o.us if o else None, n.us if n else None, ref, shown))
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def summarize(rows: list[Compared], tol: float) -> dict:
    def part(rs):
        both = [r for r in rs if r.ratio is not None]
        ch = [abs(r.ratio - 1.0) for r in both]
        return dict(rows=len(rs), compared=len(both), moved=sum(r.verdict(tol) == "moved" for r in rs),
                    one_run=len(rs) - len(both), max_change=max(ch) if ch else None)

    return dict(ours=part([r for r in rows if not r.reference]), ref=part([r for r in rows if r.reference]))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary_line(s: dict, tol: float) -> str:
    o, r = s["ours"], s["ref"]
    line = (f"{o['rows'] + r['rows']} rows, {o['moved'] + r['moved']} moved (> {_pct(tol)}), "
            f"{o['one_run'] + r['one_run']} in one run only; tilescale's: {o['rows']} rows, {o['moved']} moved, "
            f"max |change| {_pct(o['max_change'])}")
    if r["rows"]:
        line += f"; references (cuBLAS/NCCL/async-TP): {r['rows']} rows, {r['moved']} moved, " \
                f"max |change| {_pct(r['max_change'])}"
    return line


def table(kind: str, rows: list[Compared], tol: float, show_all: bool, title_extra: str = "") -> str:
    shown = [r for r in rows if show_all or r.shown or r.verdict(tol) in ("only old", "only new")]
    lines = [f"### {kind}{title_extra}", "",
             "| key | old us | new us | new/old | verdict |", "|---|---:|---:|---:|---|"]
    for r in shown:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(f"| {r.key}{' (ref)' if r.reference else ''} | {_fmt(r.old)} | {_fmt(r.new)} | {ratio} | "
                     f"{r.verdict(tol)} |")
    hidden = len(rows) - len(shown)
    moved_hidden = sum(1 for r in rows if r not in shown and r.verdict(tol) == "moved")
    lines.append("")
    if hidden:
        lines.append(f"({hidden} more rows not shown (--all shows them), {moved_hidden} of them moved)")
    lines.append(f"summary {kind}: {summary_line(summarize(rows, tol), tol)}")
    return "\n".join(lines)


def _describe(data: dict) -> str:
    env = data.get("env") or {}
    gpu = data.get("gpu") or env.get("gpu")
    return f"{gpu}" if gpu else ""


def compare_files(old_path: str, new_path: str, kind: str | None, tol: float, show_all: bool):
    ko, old, dold = load(old_path, kind)
    kn, new, dnew = load(new_path, kind)
    if ko != kn:
        raise ValueError(f"{old_path} holds {ko}, {new_path} holds {kn}: not the same benchmark")
    rows = compare(old, new)
    gpus = {_describe(dold), _describe(dnew)} - {""}
    extra = f" ({' vs '.join(sorted(gpus))})" if gpus else ""
    return ko, rows, table(ko, rows, tol, show_all, extra)


def parse_tol(s: str) -> float:
    v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"--tol {s}: expected a fraction in [0, 1) such as 0.03, or 3%")
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", nargs="?", help="JSON of the old tree's run")
    ap.add_argument("new", nargs="?", help="JSON of the new tree's run")
    ap.add_argument("--dirs", nargs=2, metavar=("OLD_DIR", "NEW_DIR"), help="compare <kind>.json of each kind")
    ap.add_argument("--kind", choices=KINDS, help="which benchmark wrote the files (default: from their rows)")
    ap.add_argument("--tol", type=parse_tol, default=0.03, help="largest |new/old - 1| that is 'same' (0.03 or 3%%)")
    ap.add_argument("--all", action="store_true", help="gemm_configs: a row for every config, not only the default")
    ap.add_argument("--fail-if-moved", action="store_true", help="exit 1 when a row moved or is in one run only")
    ap.add_argument("--out", help="also write the tables (markdown) here")
    a = ap.parse_args(argv)
    pairs = []
    if a.dirs:
        if a.old or a.new:
            ap.error("give either OLD.json NEW.json or --dirs OLD_DIR NEW_DIR")
        for k in KINDS:
            po, pn = (os.path.join(d, f"{k}.json") for d in a.dirs)
            if os.path.exists(po) or os.path.exists(pn):
                pairs.append((k, po, pn))
        if not pairs:
            print(f"compare_runs: no {', '.join(k + '.json' for k in KINDS)} in {a.dirs[0]} or {a.dirs[1]}",
                  file=sys.stderr)
            return 2
    elif a.old and a.new:
        pairs.append((a.kind, a.old, a.new))
    else:
        ap.error("give OLD.json NEW.json, or --dirs OLD_DIR NEW_DIR")
    out, overall, bad = [], [], False
    for k, po, pn in pairs:
        missing = [p for p in (po, pn) if not os.path.exists(p)]
        if missing:
            out.append(f"### {k}\n\nnot compared: {', '.join(missing)} missing (that run failed or did not run)")
            overall.append((k, None))
            bad = True
            continue
        try:
            kind, rows, text = compare_files(po, pn, k, a.tol, a.all)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"compare_runs: {k or ''} {po} vs {pn}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        out.append(text)
        s = summarize(rows, a.tol)
        overall.append((kind, s))
        bad |= any(r.verdict(a.tol) != "same" for r in rows)
    if a.dirs:
        lines = [f"### all benchmarks (tolerance {_pct(a.tol)})", "",
                 "| benchmark | rows | moved | one run only | max abs change (tilescale) | max abs change (refs) |",
                 "|---|---:|---:|---:|---:|---:|"]
        for k, s in overall:
            if s is None:
                lines.append(f"| {k} | - | - | - | not compared | - |")
                continue
            o, r = s["ours"], s["ref"]
            lines.append(f"| {k} | {o['rows'] + r['rows']} | {o['moved'] + r['moved']} | {o['one_run'] + r['one_run']} "
                         f"| {_pct(o['max_change'])} | {_pct(r['max_change'])} |")
        out.append("\n".join(lines))
    text = "\n\n".join(out)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 1 if (a.fail_if_moved and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
