"""Tuning tables: where tilescale's built-in collectives beat NCCL, per GPU model and world size.

A table is JSON written by the collective benchmarks::

    {"gpu": "NVIDIA H200", "world_size": 4,
     "collectives": {"allreduce": {"algo": "one_shot", "ranges": [[0, 262144]]},
                     "allgather": [{"algo": "push", "ranges": [[4194304, 1073741824]]}]}}

``ranges`` are inclusive message sizes in bytes (Request.msg_bytes) where the algorithm beat NCCL by
at least 3% (:func:`table` computes them from measurements); a collective may list several algorithms.
``algo`` is a built-in's short name ("one_shot") or full name ("tilescale.allreduce.one_shot"). Tables ship in
``tilescale/plan/tuning/*.json``; ``TILESCALE_TUNING_FILE`` names one to use instead. Where no table matches
the machine, no built-in plan is registered and NCCL serves every call (tilescale is never chosen where it was
not measured to win).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from ..ops.registry import find
from .plan import canonical_collective

TUNING_DIR = Path(__file__).resolve().parent / "tuning"
log = logging.getLogger("tilescale.plan")


def full_name(collective: str, algo: str, where: str = "algo") -> str:
    """'one_shot' (of allreduce) -> 'tilescale.allreduce.one_shot', the built-in plan's name; checks that
    the collective has that algorithm (tilescale.ops.registry)."""
    c = find(collective)
    prefix = f"tilescale.{collective}."
    name = algo if algo.startswith("tilescale.") else prefix + algo
    if c is None or c.name != collective or not name.startswith(prefix) or name.removeprefix(prefix) not in c.algos:
        have = [prefix + a for a in (c.algos if c is not None and c.name == collective else ())]
        raise ValueError(f"{where}: got {algo!r}, expected a built-in {collective} algorithm: {', '.join(have)}")
    return name


def normalize_gpu(name: str) -> str:
    """'NVIDIA H200' and 'h200' compare equal; 'H100 NVL' and 'H100' do not."""
    return re.sub(r"\s+", " ", re.sub(r"^nvidia\s+", "", name.strip().lower()))


def validate(table, where: str) -> dict:
    """The table in canonical form: {"gpu", "world_size", "collectives": {collective: [(algo, [(lo, hi)])]}};
    a clear ValueError naming `where` and the field when it is malformed."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: got a JSON {type(table).__name__}, expected an object with gpu, world_size, "
                         "collectives")
    gpu, ws, colls = table.get("gpu"), table.get("world_size"), table.get("collectives")
    if not isinstance(gpu, str) or not gpu.strip():
        raise ValueError(f"{where}: gpu: got {gpu!r}, expected the GPU's name, e.g. 'NVIDIA H200'")
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise ValueError(f"{where}: world_size: got {ws!r}, expected an integer >= 1")
    if not isinstance(colls, dict):
        raise ValueError(f"{where}: collectives: got {colls!r}, expected an object {{collective: {{algo, ranges}}}}")
    out: dict[str, list] = {}
    for cname, entries in colls.items():
        coll = canonical_collective(cname, f"{where}: collectives[{cname!r}]")
        for i, e in enumerate(entries if isinstance(entries, list) else [entries]):
            at = f"{where}: collectives[{cname!r}]" + (f"[{i}]" if isinstance(entries, list) else "")
            if not isinstance(e, dict) or not isinstance(e.get("algo"), str):
                raise ValueError(f"{at}: got {e!r}, expected {{'algo': name, 'ranges': [[lo, hi], ...]}}")
            algo = full_name(coll, e["algo"], at + ".algo")
            ranges = e.get("ranges", [])
            ok = isinstance(ranges, list) and all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                            for x in r) and r[0] <= r[1] for r in ranges)
            if not ok:
                raise ValueError(f"{at}.ranges: got {ranges!r}, expected a list of [lo, hi] byte sizes with "
                                 "0 <= lo <= hi")
            out.setdefault(coll, []).append((algo, [tuple(r) for r in ranges]))
    return {"gpu": gpu, "world_size": ws, "collectives": out}


WIN = 1.03          # "tilescale wins" means at least 3% faster than NCCL


def win_ranges(rows: list[dict], ratio: float = WIN) -> list[list[int]]:
    """[[lo, hi], ...]: runs of consecutive measured sizes (rows' ``bytes``) with ``speedup`` >= ratio."""
    out, cur = [], None
    for r in sorted(rows, key=lambda r: r["bytes"]):
        if r["speedup"] >= ratio:
            cur = [r["bytes"], r["bytes"]] if cur is None else [cur[0], r["bytes"]]
        elif cur is not None:
            out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return out


def table(rows: list[dict], gpu: str, world_size: int) -> dict:
    """The tuning table of measurements (rows of ``collective``, ``algo``, ``bytes`` (Request.msg_bytes),
    ``tilescale_us`` and ``speedup`` over NCCL; benchmarks/bench_collectives.py writes them): per collective,
    each algorithm's message ranges where it is the fastest of the collective's algorithms and beats NCCL
    by >= 3% (one algorithm: ``{"algo", "ranges"}``; several: a list of them)."""
    out = {}
    for coll in dict.fromkeys(r["collective"] for r in rows):
        rs = [r for r in rows if r["collective"] == coll]
        best: dict = {}
        for r in rs:                                  # the fastest algorithm per size (the first on a tie)
            if r["bytes"] not in best or r["tilescale_us"] < best[r["bytes"]]["tilescale_us"]:
                best[r["bytes"]] = r
        entries = [{"algo": a, "ranges": win_ranges([r if r["algo"] == a else dict(r, speedup=0.0)
                                                     for r in best.values()])}
                   for a in dict.fromkeys(r["algo"] for r in rs)]
        out[coll] = entries[0] if len(entries) == 1 else entries
    return {"gpu": gpu, "world_size": world_size, "collectives": out}


def _read(path: Path) -> dict:
    try:
        return validate(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def load(gpu_name: str, world_size: int) -> dict | None:
    """The validated table for this GPU model and world size, or None."""
    from ..env import settings

    if settings.tuning_file:
        path = Path(settings.tuning_file).expanduser()
        if not path.is_file():
            raise ValueError(f"TILESCALE_TUNING_FILE={settings.tuning_file!r}: no such file; expected a tuning "
                             "table (JSON)")
        paths = [path]
    else:
        paths = sorted(TUNING_DIR.glob("*.json"))
    for path in paths:
        table = _read(path)
        if normalize_gpu(table["gpu"]) == normalize_gpu(gpu_name) and table["world_size"] == world_size:
            log.info("tuning table %s for %s x %d", path, gpu_name, world_size)
            table["path"] = str(path)
            return table
    log.info("no tuning table for %s x %d (looked at %s): NCCL serves every call by default",
             gpu_name, world_size, ", ".join(map(str, paths)) or TUNING_DIR)
    return None
