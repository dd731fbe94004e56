"""Timing of distributed ops: CUDA events per rank, the slowest rank reported; host time per call
(:func:`host_us_per_call`, :func:`host_stats`); tables and JSON."""
import json
import math
import os
import statistics
import sys
import time


def time_op(fn, warmup: int = 5, iters: int = 20, repeats: int = 3) -> float:
    """Microseconds per call of `fn` (median over repeats of the mean over `iters`), max over ranks.
    Ranks start each repeat together (a barrier) so that skew does not count."""
    return time_ops({"fn": fn}, warmup, iters, repeats)["fn"]


def round_us(fn, iters: int) -> float:
    """Microseconds per call over `iters` back-to-back calls of `fn` between CUDA events (this rank)."""
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def time_ops(fns: dict, warmup: int = 5, iters: int = 20, repeats: int = 5) -> dict:
    """{name: microseconds per call} of each of `fns` ({name: fn}), timed in turns: every repeat times `iters`
    calls of each fn, one fn after the other (the median over repeats of each, max over ranks). Timing one fn's
    repeats all before the next fn's (:func:`time_op` per fn) lets the GPU's clock differ between them: a GPU
    that has run GEMMs for a while at its power limit runs the next ones at a lower clock, so whatever is timed
    last looks slower. Turns give every fn the same conditions on average, not per fn: the fn timed right after a
    light one (a short collective) starts on a cooler GPU; :func:`time_interleaved` removes that."""
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    _warm_up(fns, warmup)
    res = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            dist.barrier()      # ranks start each round together, so that skew does not count
            torch.cuda.synchronize()
            res[name].append(round_us(fn, iters))
    return _slowest_rank({name: statistics.median(v) for name, v in res.items()}, dist)


def _warm_up(fns: dict, warmup: int) -> None:
    """`warmup` calls of each fn, then a device synchronize."""
    import torch

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()


def _slowest_rank(values: dict, dist) -> dict:
    """`values` ({name: float}) with each value the largest over the ranks of `dist`'s group (None: this rank's)."""
    if dist is None:
        return values
    import torch

    t = torch.tensor(list(values.values()), device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.tolist(), strict=True))


def time_interleaved(fns: dict, warmup: int = 5, iters: int = 20, repeats: int = 5, align: bool = True) -> dict:
    """{name: microseconds per call} of each of `fns` ({name: fn}), their calls interleaved: every repeat makes
    `iters` passes over the fns, one call of each per pass (the order rotated by one fn each pass, so that each fn
    follows every other equally often), every call between CUDA events of its own; a fn's time is the median over
    repeats of its calls' mean (max over ranks when a process group exists: ranks start each repeat together).

    Why: in turns (:func:`time_ops`) a fn's `iters` calls run back to back, so the fn timed after a light one (a
    short collective) starts on a GPU that has cooled and clocks higher than the one timed after a heavy one (the
    same kernels measure 0.92 or 0.99 of cuBLAS by the order of the columns); interleaved calls share the GPU's
    power and thermal state. Each call's events measure its GPU time: the host's time between calls is not counted
    while the GPU's queue stays ahead of the host, which holds for the GEMM-sized calls it is used for. ``_idle``
    (the share of a round the GPU spent between calls, the largest over repeats and ranks) shows a host-bound fn.

    `align` (NCCL groups): every call starts on every rank together: a one-element NCCL all-reduce on the stream
    before its start event. Without it a call's events also measure how long its first wait for a peer takes,
    that is how far the ranks drifted apart in the calls before it (a GEMM ends at different times on different
    GPUs), which made a 2-8 MiB AllGather read 133-302 us from row to row where the same AllGather alone takes
    50-114 us. The all-reduce's own time is outside the events (it counts in ``_idle``)."""
    import torch

    dist = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from tilescale import staged_collectives

        dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU
    names = list(fns)
    _warm_up(fns, warmup)
    token = None
    if align and dist is torch.distributed:     # NCCL serves the group (staged_collectives.for_cuda)
        token = torch.zeros(1, device="cuda")
    res = {name: [] for name in names}
    idle = 0.0
    for _ in range(repeats):
        if dist is not None:
            dist.barrier()
        torch.cuda.synchronize()
        marks = []
        for i in range(iters):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if token is not None:
                    torch.distributed.all_reduce(token)
                s.record()
                fns[name]()
                e.record()
                marks.append((name, s, e))
        marks[-1][2].synchronize()
        per = dict.fromkeys(names, 0.0)
        for name, s, e in marks:
            per[name] += s.elapsed_time(e) * 1e3
        for name in names:
            res[name].append(per[name] / iters)
        span = marks[0][1].elapsed_time(marks[-1][2]) * 1e3
        idle = max(idle, 1.0 - sum(per.values()) / span if span > 0 else 0.0)
    out = {name: statistics.median(v) for name, v in res.items()}
    out["_idle"] = idle
    return _slowest_rank(out, dist)


def host_us_per_call(fn, calls: int = 1000, batch: int = 20, warmup: int = 2, sync=None) -> list[float]:
    """Host microseconds of each of `calls` calls of `fn` (rounded up to whole batches), in call order: the wall
    time of the Python call alone (``time.perf_counter_ns`` around it), the calls made in batches of `batch`
    with `sync` (default ``torch.cuda.synchronize``) between batches, outside the timed calls, so that the GPU
    queue never holds more than one batch (a call never waits for room in it). `warmup` batches first, not
    kept."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    if calls < 1 or batch < 1:
        raise ValueError(f"calls and batch: got {calls} and {batch}, expected >= 1")
    clock = time.perf_counter_ns
    out: list[int] = []
    for b in range(warmup + math.ceil(calls / batch)):
        sync()
        times = []
        for _ in range(batch):
            t0 = clock()
            fn()
            t1 = clock()
            times.append(t1 - t0)
        if b >= warmup:
            out += times
    sync()
    return [t / 1e3 for t in out]


def quantile(samples, q: float) -> float:
    """The `q` quantile (0..1) of `samples`, interpolated linearly between the closest ranks (numpy's default)."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("quantile of no samples")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def host_stats(samples, batch: int | None = None) -> dict:
    """Median, p10, p90 of per-call host times (in call order); ``growth``: the median of the last quarter of the
    calls over that of the first quarter (does host time grow with the number of calls?); with `batch` (the
    batch size they were taken in), ``last_in_batch``: the median of the calls last in their batch over that of
    the calls first in it (well above 1: the calls waited for room in the GPU queue)."""
    n = len(samples)
    q = max(1, n // 4)
    out = dict(n=n, median=quantile(samples, 0.5), p10=quantile(samples, 0.1), p90=quantile(samples, 0.9),
               first_quarter=statistics.median(samples[:q]), last_quarter=statistics.median(samples[-q:]))
    out["growth"] = out["last_quarter"] / out["first_quarter"] if out["first_quarter"] > 0 else float("nan")
    if batch and batch > 1 and n >= batch:
        first = statistics.median(samples[0::batch])
        last = statistics.median(samples[batch - 1::batch])
        out["last_in_batch"] = last / first if first > 0 else float("nan")
    return out


def target_status(value: float, target: float | None) -> str:
    """MET / MISSED for a value that must be at most `target` ("-" without a target)."""
    if target is None:
        return "-"
    return "MET" if value <= target else "MISSED"


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def print_table(title: str, header: list[str], rows: list[list]) -> str:
    """Print a markdown table under `title`; returns what it printed."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = [f"\n{title}", "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) + " |" for r in cells]
    text = "\n".join(lines)
    print(text)
    return text


def write_json(path: str | None, payload: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


def environment() -> dict:
    """The run's machine and provenance: GPU, torch, world size, UTC date, command, and the commit of the tree
    (BENCH_COMMIT, else ``git rev-parse HEAD`` where the tree is a checkout, else "unknown")."""
    import subprocess

    import torch

    commit = os.environ.get("BENCH_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError):
            commit = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]), "commit": commit}


def write_markdown(path: str, env: dict, tables: list[str]) -> None:
    """`tables` (as :func:`print_table` returned them) under a header naming the machine, command, commit and date:
    the latest result of a benchmark on a machine, kept at a fixed path beside its JSON."""
    head = (f"# {env['command']}\n\n{env['world_size']} x {env['gpu']}, torch {env['torch']}; commit "
            f"{env['commit']}; {env['date']}\n")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(head + "\n".join(tables) + "\n")
