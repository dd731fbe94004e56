"""What tilescale and tilelang print while tilescale builds and runs kernels.

:func:`apply` is called where tilescale compiles, builds or starts its runtime; it reads ``TILESCALE_LOG`` each time
(never at import) and sets:

* the ``tilescale`` logger's level (``warning``, ``info``, ``debug``); when neither it nor the root logger has a
  handler, one of tilescale's own on stderr, so that ``info`` and ``debug`` records are shown at all (Python's
  last-resort handler shows warnings only);
* tilelang's logger (``tilelang`` and its children, one tqdm handler of tilelang's own) to the same level: tilelang
  logs an INFO line per kernel it compiles, which ``warning`` hides. A level set by the user
  (``tilelang.set_log_level``) is left alone;
* a filter on tilelang's handlers: records below that level dropped (some of tilelang's child loggers set
  levels of their own), each warning of tilelang once per process, however many kernels and calls
  repeat it (e.g. its note that a kernel was found in its memory cache, which every rank would print per build);
  numbers and quoted names are left out when two warnings are compared.

In a job of several ranks (torchrun's ``RANK`` and ``WORLD_SIZE``) both loggers' lines start with ``[rank R]``.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading

LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
TILELANG_DEFAULT_LEVEL = logging.INFO    # what tilelang sets at import (tilelang/__init__.py: _init_logger)

_lock = threading.Lock()
_tilelang_level_set: int | None = None   # the level apply() last gave tilelang's logger


def job_rank() -> int | None:
    """This process's rank in a job of several ranks (torchrun's RANK, WORLD_SIZE > 1), else None."""
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


def rank_prefix() -> str:
    """``"[rank R] "`` in a job of several ranks, else ``""`` (read when a line is written)."""
    r = job_rank()
    return "" if r is None else f"[rank {r}] "


def is_rank0() -> bool:
    """Whether this process prints what one rank prints for all (rank 0, or not in a job of several ranks)."""
    r = job_rank()
    return r is None or r == 0


class RankFormatter(logging.Formatter):
    """``%(message)s`` behind the rank prefix."""

    def format(self, record: logging.LogRecord) -> str:
        return rank_prefix() + super().format(record)


_NUMBERS_AND_NAMES = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`|0x[0-9a-fA-F]+|\d+(\.\d+)?")


class TilelangFilter(logging.Filter):
    """On tilelang's handlers, for tilelang's records only: a record below `level` is dropped (a child logger of
    tilelang's may have a level of its own: its kernel cache logs at DEBUG), and so is a warning whose text (numbers
    and quoted names aside) was shown already in this process; every record shown gets the rank prefix."""

    def __init__(self):
        super().__init__("tilescale")
        self.seen: set[tuple[str, str]] = set()
        self.level = logging.WARNING

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "tilelang" and not record.name.startswith("tilelang."):
            return True                  # a handler tilelang's logger shares with others (the root's): theirs pass
        decided = getattr(record, "_tilescale_shown", None)
        if decided is not None:          # the same record at another of tilelang's handlers: the same answer
            return decided
        shown = record.levelno >= self.level
        if shown and logging.WARNING <= record.levelno < logging.ERROR:
            key = (record.name, _NUMBERS_AND_NAMES.sub("#", str(record.msg)))
            with _lock:
                shown = key not in self.seen
                self.seen.add(key)
        if shown:
            record.msg = rank_prefix() + str(record.msg)
        record._tilescale_shown = shown
        return shown


_FILTER = TilelangFilter()
_HANDLER: logging.Handler | None = None


def level() -> int:
    """The logging level of TILESCALE_LOG (read now)."""
    from .env import settings

    return LEVELS[settings.log_level]


def apply() -> None:
    """Apply TILESCALE_LOG to the tilescale and tilelang loggers (cheap; idempotent; see the module docstring)."""
    global _HANDLER, _tilelang_level_set
    lvl = level()
    ours = logging.getLogger("tilescale")
    ours.setLevel(lvl)
    with _lock:
        if _HANDLER is None and not ours.handlers and not logging.getLogger().handlers:
            _HANDLER = logging.StreamHandler(sys.stderr)
            _HANDLER.setFormatter(RankFormatter("%(message)s"))
            ours.addHandler(_HANDLER)
        _FILTER.level = lvl
        tl = logging.getLogger("tilelang")
        if tl.level in (TILELANG_DEFAULT_LEVEL, _tilelang_level_set, logging.NOTSET):
            tl.setLevel(lvl)
            _tilelang_level_set = lvl
        for h in tl.handlers:
            if _FILTER not in h.filters:
                h.addFilter(_FILTER)
