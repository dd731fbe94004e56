"""Where the profiler's host events spend their time on this machine: the clock reads and the record, per call.

    GPUS=1 bash launch.sh benchmarks/probe_host_clock.py          # on a GPU machine: the clocks, then AllGather calls
    python benchmarks/probe_host_clock.py --clocks                # the clocks only (any machine)

Prints the kernel's clock source (a VM's kvm-clock or hpet makes every clock read a system call), what one read of
each Python clock costs (``time.perf_counter_ns`` is the profiler's), and, through launch.sh with a GPU, host
microseconds per call of a 1 MiB AllGather at world size 1 issued back to back: not profiled; in a host-events
session (``mask="host"``: the call timed and recorded by the runtime shim, ``ts_timed_call``); in such a session
with the record made in Python (the op's four ints, as a shim without timed calls does); and that with the op's clock
swapped for one that reads nothing (``int``), which splits the Python record's cost in clock reads and the rest.
Rounds alternate the four; medians.
"""
import argparse
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def clocks() -> dict:
    src = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
    try:
        with open(src) as f:
            source = f.read().strip()
    except OSError:
        source = "unknown"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    n = 200_000
    cost = {}
    for name in ("perf_counter_ns", "monotonic_ns", "time_ns", "process_time_ns"):
        fn = getattr(time, name)
        cost[name] = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e9
    fn, coarse = time.clock_gettime_ns, getattr(time, "CLOCK_MONOTONIC_COARSE", 6)   # Linux's number (Python < 3.13)
    cost["clock_gettime_ns(CLOCK_MONOTONIC_COARSE)"] = min(
        timeit.repeat(lambda: fn(coarse), number=n, repeat=5)) / n * 1e9
    cost["an empty lambda call (for scale)"] = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n * 1e9
    out = dict(clocksource=source, tsc_flags=sorted(f for f in flags if "tsc" in f), ns_per_call=cost)
    print(f"clock source: {source}; TSC flags: {' '.join(out['tsc_flags']) or '-'}")
    for k, v in cost.items():
        print(f"  {k:45s} {v:7.1f} ns per call")
    return out


def run(info, a) -> None:
    import torch

    import tilescale.profiler as tp
    from tilescale.ops import allgather as agmod
    from tilescale.ops.allgather import AllGather

    clocks()
    rows = (1 << 20) // (2 * 1024)
    ag = AllGather((rows, 1024), torch.bfloat16)
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    got = ag(x)
    torch.cuda.synchronize()
    assert torch.equal(got[:rows], x), "AllGather at world size 1: output differs from the input"

    def per_call(n=200) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            ag(x)
        dt = (time.perf_counter() - t) * 1e6 / n
        torch.cuda.synchronize()
        return dt

    real = agmod._now
    res = {"off": [], "on": [], "on, Python's record": [], "on, Python's record, clock reads nothing": []}
    for _ in range(a.rounds):
        res["off"].append(per_call())
        with tp.profile(None, mask="host", merge=False):      # the runtime shim's timed calls, when it has them
            res["on"].append(per_call())
        with tp.profile(None, mask="host", merge=False) as s:
            s.timed = None                                      # the record made in Python (four ints)
            res["on, Python's record"].append(per_call())
        agmod._now = int
        try:
            with tp.profile(None, mask="host", merge=False) as s:
                s.timed = None
                res["on, Python's record, clock reads nothing"].append(per_call())
        finally:
            agmod._now = real
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"AllGather 1 MiB, world size 1, host us per call (median of {a.rounds} rounds of 200 calls):")
    for k, v in med.items():
        print(f"  {k:42s} {v:6.2f} us  ({100 * (v / med['off'] - 1):+.1f}% vs off)")
    ag.close()


def build(world_size, a) -> None:
    print("probe_host_clock: no GPU here; the clocks only")
    clocks()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clocks", action="store_true", help="the clocks only (no GPU, no launch.sh)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the four variants")
    args = ap.parse_args()
    if args.clocks or "WORLD_SIZE" not in os.environ:
        clocks()
        raise SystemExit(0)
    from tilescale import testing

    testing.example_main(lambda info: run(info, args), lambda ws: build(ws, args))
