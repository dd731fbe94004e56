"""Building several kernels at once: side by side in threads, up to the cores this process may use, with one
progress line for the batch.

    kernels = tilescale.compile_all([(ring, (1024, 4)), (ag_gemm_kernel, args)])   # compiled and loaded (GPU)
    results = tilescale.build_all(jobs)            # compiled and linked, not loaded (any machine with nvcc)

A job is ``(jit function, args)`` or ``(jit function, args, kwargs)``: what ``fn(*args, **kwargs)`` compiles; a
kernel compiled here is the one ``fn(*args, **kwargs)`` returns later in this process (TileScaleJITImpl.compile).
A plain callable is run in a worker as it is. Kernels are elaborated (``get_tir``) in the calling thread, then
lowered and compiled in the workers: nvcc, most of a build, runs outside the GIL; lowering holds it.

Workers: ``TILESCALE_BUILD_JOBS`` (default: the cores this process may use), at most one per job. Progress: rank 0
of a job (or a process outside one) shows one line for the batch, ``tilescale: building kernels 3/12
[00:21<00:45]`` (count, elapsed, estimate: tqdm), on stderr, from the moment a kernel is really being built (its
code generated: tilescale.codegen.on_generate); a batch served from the kernel caches prints nothing, and other
ranks print nothing.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .. import logs
from . import codegen


def workers_for(n_jobs: int, workers: int | None = None) -> int:
    """Threads for `n_jobs` builds: `workers`, else TILESCALE_BUILD_JOBS; at most one per job, at least one."""
    from ..env import settings

    return max(1, min(n_jobs, workers or settings.build_jobs))


def unique(jobs: Iterable) -> list:
    """`jobs` without repeats of the same (jit function, args, kwargs), in order (callables are kept)."""
    seen, out = set(), []
    for j in jobs:
        if callable(j):
            out.append(j)
            continue
        key = (id(j[0]), j[1], tuple(sorted((j[2] if len(j) > 2 else {}).items())))
        try:
            if key in seen:
                continue
            seen.add(key)
        except TypeError:   # unhashable arguments: kept
            pass
        out.append(j)
    return out


class Progress:
    """One progress line for a batch of `total` builds, started by :meth:`building` (a kernel is really being
    built), advanced by :meth:`done`; shown only where `show` (rank 0)."""

    def __init__(self, total: int, label: str, show: bool):
        self.total, self.label, self.show = total, label, show
        self.finished = 0
        self.bar = None
        self._lock = threading.Lock()

    def building(self) -> None:
        with self._lock:
            if self.bar is not None or not self.show:
                return
            from tqdm.auto import tqdm

            tty = getattr(sys.stderr, "isatty", lambda: False)()
            self.bar = tqdm(total=self.total, initial=self.finished, desc=f"tilescale: building {self.label}",
                            bar_format="{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]", file=sys.stderr,
                            mininterval=0.5 if tty else 30.0, dynamic_ncols=True, leave=True)

    def done(self) -> None:
        with self._lock:
            self.finished += 1
            if self.bar is not None:
                self.bar.update(1)

    def close(self) -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.close()


def compiled(fn, args: tuple, kwargs: dict):
    """The kernel ``fn(*args, **kwargs)`` already compiled in this process (TileScaleJITImpl.compile_tir), or
    None."""
    memo, key_of = getattr(fn, "_compiled", None), getattr(fn, "memo_key", None)
    if memo is None or key_of is None:
        return None
    key = key_of(args, kwargs)
    return None if key is None else memo.get(key)


def _call(job, make: Callable, lookup: Callable | None) -> Callable[[], Any]:
    """A zero-argument call that builds `job` (elaborated now, in this thread), or returns what `lookup` found."""
    if callable(job):
        return job
    fn, args = job[0], tuple(job[1])
    kwargs = dict(job[2]) if len(job) > 2 else {}
    done = lookup(fn, args, kwargs) if lookup is not None else None
    if done is not None:
        return lambda: done
    pf = fn.get_tir(*args, **kwargs)
    return lambda: make(fn, pf, args, kwargs)


def run(jobs: Iterable, make: Callable, *, label: str = "kernels", workers: int | None = None,
        progress: bool | None = None, lookup: Callable | None = None) -> list:
    """Build every job with ``make(fn, prim_func, args, kwargs)`` in threads; returns, in job order, each job's
    result or the exception it raised (nothing is raised here). `progress`: show the batch's line (default: on
    rank 0 only); `lookup(fn, args, kwargs)`: a job's result found without building it, or None."""
    jobs = list(jobs)
    if not jobs:
        return []
    logs.apply()
    codegen.install()
    calls = [_call(j, make, lookup) for j in jobs]
    show = logs.is_rank0() if progress is None else progress
    bar = Progress(len(calls), label, show)

    device = _callers_device()

    def one(call):
        try:
            with codegen.on_generate(bar.building), _on_device(device):
                return call()
        except BaseException as e:  # noqa: BLE001  (returned: the caller decides)
            return e
        finally:
            bar.done()

    try:
        if len(calls) == 1:
            return [one(calls[0])]
        ex = cf.ThreadPoolExecutor(workers_for(len(calls), workers), thread_name_prefix="tilescale-build")
        try:
            return list(ex.map(one, calls))
        finally:   # interrupted: the builds not started are dropped (running ones end on their own)
            ex.shutdown(wait=False, cancel_futures=True)
    finally:
        bar.close()


def _callers_device() -> int | None:
    """The CUDA device current in the calling thread, where CUDA is initialized in this process (else None: nothing
    to carry, and nothing here initializes CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


@contextlib.contextmanager
def _on_device(device: int | None):
    """The block run with `device` current in this thread. The current CUDA device is per thread and a new thread's
    is device 0, while a worker that compiles a kernel also loads it (its module, its shared-memory attribute, its
    NVSHMEM state) on the current device: a rank of GPU 2 would get kernels loaded on GPU 0, whose launch on GPU 2
    fails with an invalid argument."""
    if device is None:
        yield
        return
    import torch

    with torch.cuda.device(device):
        yield


def raise_first(results: list) -> list:
    """`results` of :func:`run`, or the first exception among them raised."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def compile_job(fn, pf, args, kwargs):
    """What :func:`compile_all` does with each job: ``fn(*args, **kwargs)``'s compile, remembered for that call."""
    return fn.compile_tir(pf, args, kwargs)


def compile_all(jobs: Iterable, *, workers: int | None = None, label: str = "kernels",
                progress: bool | None = None) -> list:
    """Compile and load every job (``fn(*args)``'s kernel: a GPU is needed to load); the kernels in job order.
    Raises the first job's error once every build has ended."""
    return raise_first(run(jobs, compile_job, label=label, workers=workers, progress=progress, lookup=compiled))


def build_all(jobs: Iterable, *, target=None, workers: int | None = None, label: str = "kernels",
              progress: bool | None = None) -> list:
    """Compile and link every job without loading it (``fn.build(*args)``: no GPU needed); the
    :class:`tilescale.compiler.BuildResult` of each, in job order. Raises the first job's error once every build
    has ended."""
    def make(fn, pf, args, kwargs):
        return fn.build_tir(pf, target=target)

    return raise_first(run(jobs, make, label=label, workers=workers, progress=progress))
