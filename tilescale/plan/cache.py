"""The plan cache: one JSON file per plan, ``<root>/plans/<collective>/<id>.json``, root =
``$TILESCALE_PLAN_DIR`` (default: the tilescale cache directory).

A file is trusted only if it parses and equals, field for field, the record that compiling would write
(same id, same hashed inputs, and an id that is the hash of those inputs); anything else (torn, edited,
written by another version) is rebuilt. Writers take an exclusive lock (``<id>.json.lock``), write a
temporary file in the same directory, fsync it and rename it into place, so a reader sees either no
file or a whole one, and concurrent writers of the same plan leave one valid file.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from ..errors import TileScaleError
from .ids import canonical_json, hash_id

log = logging.getLogger("tilescale.plan")


def root() -> Path:
    from ..env import settings

    return settings.plan_dir


def path_for(collective: str, plan_id: str) -> Path:
    return root() / "plans" / collective / f"{plan_id}.json"


def encode(record: dict) -> bytes:
    """The bytes of a plan file: canonical JSON, so identical plans give identical files."""
    return (canonical_json(record) + "\n").encode()


def why_invalid(path: Path, expected: dict) -> str | None:
    """None if `path` holds exactly `expected`; else what is wrong with it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e})"
    try:
        rec = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"corrupt ({e.__class__.__name__}: {e})"
    if not isinstance(rec, dict):
        return f"corrupt (a JSON {type(rec).__name__}, expected an object)"
    if rec.get("schema_version") != expected["schema_version"]:
        return f"schema version {rec.get('schema_version')!r}, expected {expected['schema_version']}"
    if rec.get("id") != expected["id"]:
        return f"id {rec.get('id')!r}, expected {expected['id']}"
    inputs = rec.get("inputs")
    try:
        if hash_id(inputs) != rec["id"]:
            return "its id is not the hash of its inputs"
    except (TypeError, ValueError):
        return "corrupt inputs"
    if rec != expected:
        diff = sorted(k for k in set(rec) | set(expected) if rec.get(k) != expected.get(k))
        return f"mismatched field(s) {diff}"
    return None


def store(record: dict, *, rebuild: bool = False) -> Path:
    """Make the plan file of `record` valid; returns its path. Rewrites it when `rebuild` is set or the
    file on disk is missing, corrupt or different (cache_files.write_once: lock, temporary file, rename)."""
    from ..compilation.cache_files import write_once

    path = path_for(record["collective"], record["id"])
    if not rebuild and why_invalid(path, record) is None:
        return path
    try:
        write_once(path, encode(record), check=lambda p: why_invalid(p, record), record=False,
                   rewrite_because="rebuild=True" if rebuild else None, lock_timeout_s=60.0,
                   on_rewrite=lambda why: log.warning("plan cache: rebuilding %s: %s", path, why))
    except OSError as e:
        raise TileScaleError(f"cannot write the plan {path}: {e}; set TILESCALE_PLAN_DIR (or TILESCALE_CACHE_DIR) "
                             "to a writable directory") from e
    return path
