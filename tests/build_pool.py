"""Compile-only builds of several kernels at once, for the CPU tier (nvcc is single-threaded: on a 2-core
CI machine, two builds side by side take the time of one).

    builds = build_all({"one_shot": (allreduce.allreduce_one_shot_kernel, (2, 16, "bfloat16")), ...})
    builds["one_shot"]          # the BuildResult, or re-raises what that build raised

Like tilescale.ops.prebuild: kernels are elaborated (``get_tir``) here, in one thread, and only lowered and
compiled (``tilescale.build``) in the worker threads. Each build is what ``jit_fn.build(*args)`` does.
A job may also be a plain callable (run in a worker as it is): e.g. a build in a subprocess with its own
environment.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import re
from collections.abc import Callable
from typing import Any

WORKERS = max(1, len(os.sched_getaffinity(0)))     # the cores (tilescale.batch's default)


class Builds:
    """Results by key; a failed build re-raises its exception where its result is asked for."""

    def __init__(self, futures: dict[str, cf.Future]):
        self._futures = futures

    def __getitem__(self, key: str) -> Any:
        return self._futures[key].result()

    def exception(self, key: str) -> BaseException | None:
        return self._futures[key].exception()

    def __contains__(self, key: str) -> bool:
        return key in self._futures

    def cancel(self) -> None:
        """Drop the builds that have not started (running ones finish: nothing is left half-built)."""
        for f in self._futures.values():
            f.cancel()

    def wait(self) -> Builds:
        """Wait for every build (so that no lowering runs beside the caller's next test)."""
        cf.wait(list(self._futures.values()))
        return self


def _build_job(fn, args) -> Callable[[], Any]:
    pf = fn.get_tir(*args)                       # elaborate in this (the calling) thread
    return lambda: fn.build_tir(pf)


def build_all(jobs: dict[str, tuple | Callable[[], Any]], workers: int = WORKERS) -> Builds:
    """Start every job; `jobs` maps a key to ``(jit_fn, args)`` or a callable. Returns at once; results wait
    for their build."""
    calls = {k: (j if callable(j) else _build_job(*j)) for k, j in jobs.items()}
    pool = cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls))), thread_name_prefix="test-build")
    futures = {k: pool.submit(c) for k, c in calls.items()}
    pool.shutdown(wait=False)
    return Builds(futures)


def enclosing_conditions(source: str, call: str) -> list[str]:
    """The conditions of the ``if`` blocks that enclose each `call` in the generated CUDA source."""
    out, stack = [], []
    for line in source.splitlines():
        if call in line:
            out += [c for c in stack if c is not None]
        for ch in line:
            if ch == "{":
                m = re.match(r"\s*(?:\} else )?if \((.*)\) \{\s*$", line)
                stack.append(m.group(1) if m else None)
            elif ch == "}" and stack:
                stack.pop()
    return out
