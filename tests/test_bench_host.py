"""benchmarks/bench_host.py (host time per eager call, a captured AllGather's replays) and its helpers in
benchmarks/timing.py, on CPU: the batched per-call timing, the statistics, the table and the verdicts, the
arguments, the kernels it builds, and its registration in tests/gpu/run_gpu_tier.sh. The measurement itself
needs GPUs (``bash tests/gpu/run_gpu_tier.sh OUTDIR host``)."""
import importlib.util
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
TIER = REPO / "tests" / "gpu" / "run_gpu_tier.sh"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def timing():
    return _load("timing")


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("torch")
    return _load("bench_host")


# ------------------------------------------------------------------------------------------ timing.py
def test_host_us_per_call_times_each_call_in_batches_between_syncs(timing):
    events = []
    samples = timing.host_us_per_call(lambda: events.append("call"), calls=45, batch=20, warmup=2,
                                      sync=lambda: events.append("sync"))
    assert len(samples) == 60                       # whole batches: 45 calls rounded up to 3 x 20
    assert all(s >= 0 for s in samples)
    assert events.count("call") == (2 + 3) * 20     # the warm-up batches are made, not kept
    assert events[0] == "sync" and events[-1] == "sync"
    runs = "".join("c" if e == "call" else "s" for e in events).split("s")
    assert all(len(r) in (0, 20) for r in runs)     # never more than a batch between two syncs
    with pytest.raises(ValueError):
        timing.host_us_per_call(lambda: None, calls=0, sync=lambda: None)


def test_host_us_per_call_measures_the_call(timing):
    import time

    samples = timing.host_us_per_call(lambda: time.sleep(0.002), calls=4, batch=2, warmup=0, sync=lambda: None)
    assert len(samples) == 4 and min(samples) >= 2000      # microseconds


def test_quantile_and_host_stats(timing):
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert timing.quantile(xs, 0.5) == 3.0 and timing.quantile(xs, 0.0) == 1.0 and timing.quantile(xs, 1.0) == 5.0
    assert timing.quantile(xs, 0.1) == pytest.approx(1.4)                 # numpy's linear interpolation
    data = [float(v) for v in range(1, 101)]
    assert timing.quantile(data, 0.9) == pytest.approx(statistics.quantiles(data, n=10, method="inclusive")[-1])
    with pytest.raises(ValueError):
        timing.quantile([], 0.5)
    flat = timing.host_stats([2.0] * 40, batch=20)
    assert flat["median"] == flat["p10"] == flat["p90"] == 2.0 and flat["growth"] == 1.0
    assert flat["last_in_batch"] == 1.0 and flat["n"] == 40
    growing = timing.host_stats([1.0] * 10 + [3.0] * 10 + [3.0] * 10 + [2.0] * 10)
    assert growing["first_quarter"] == 1.0 and growing["last_quarter"] == 2.0 and growing["growth"] == 2.0
    assert "last_in_batch" not in growing
    waiting = timing.host_stats([1.0, 1.0, 1.0, 5.0] * 10, batch=4)      # the last call of each batch waits
    assert waiting["last_in_batch"] == 5.0
    assert timing.target_status(2.9, 3.0) == "MET" and timing.target_status(3.1, 3.0) == "MISSED"
    assert timing.target_status(3.0, 3.0) == "MET" and timing.target_status(9.0, None) == "-"


class _FakeGpu:
    """A GPU clock for timing.time_interleaved on CPU: a fn's call advances it by the fn's duration; a fn may
    leave the GPU idle after its call (the host late with the next one): the clock jumps by that gap at the event
    recorded after the call's end event; an event records the clock; ``elapsed_time`` is in ms, as torch's."""

    def __init__(self):
        self.now, self.gap, self.pending, self.calls = 0.0, 0.0, 0.0, []

    def event(self, enable_timing=False):
        gpu = self

        class Event:
            def record(self):
                gpu.now += gpu.gap      # the GPU waited for the host since the last event
                gpu.gap, gpu.pending = gpu.pending, 0.0
                self.t = gpu.now

            def elapsed_time(self, other):
                return other.t - self.t

            def synchronize(self):
                pass

        return Event()

    def fn(self, name, ms, gap=0.0):
        def call():
            self.calls.append(name)
            self.now += ms
            self.pending = gap
        return call


@pytest.fixture
def fake_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    gpu = _FakeGpu()
    monkeypatch.setattr(torch.cuda, "Event", gpu.event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    return gpu


def test_time_interleaved_rotates_the_calls_and_gives_each_fn_its_own_time(timing, fake_gpu):
    fns = {"a": fake_gpu.fn("a", 1.0), "b": fake_gpu.fn("b", 2.0), "c": fake_gpu.fn("c", 3.5)}
    t = timing.time_interleaved(fns, warmup=1, iters=3, repeats=2)
    assert t == {"a": 1000.0, "b": 2000.0, "c": 3500.0, "_idle": 0.0}
    # warm-up (each fn once, in order), then per repeat 3 passes, each rotated by one: every fn follows each other
    one = ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert fake_gpu.calls == ["a", "b", "c"] + one + one


def test_time_interleaved_reports_the_gpu_idle_between_calls(timing, fake_gpu):
    # "host" leaves the GPU idle 1 ms after each of its calls: not counted in any fn's time, reported as _idle
    fns = {"gemm": fake_gpu.fn("gemm", 3.0), "host": fake_gpu.fn("host", 1.0, gap=1.0)}
    t = timing.time_interleaved(fns, warmup=0, iters=4, repeats=1)
    assert (t["gemm"], t["host"]) == (3000.0, 1000.0)
    # passes gemm host | host gemm | gemm host | host gemm: 16 ms of calls, a 1 ms gap after each host call
    assert t["_idle"] == pytest.approx(1 - 16 / 20)


# --------------------------------------------------------------------------------------- bench_host.py
def _row(op, median, *, target=None, kind="tilescale", growth=1.0, last=1.0):
    return dict(op=op, world_size=2, median=median, p10=median * 0.9, p90=median * 1.2, growth=growth,
                target_us=target, kind=kind, slowest_rank=1, last_in_batch=last)


def test_table_and_verdicts(bench):
    rows = [_row("floor", 0.07, kind="floor", growth=3.0),
            _row("AllGather 1 MiB/rank: op ag(x)", 2.5, target=3.0),
            _row("AG+GEMM 8192x8192x2048: op(a, b, out=c)", 219.0, target=30.0, growth=1.5),
            _row("AllGather 1 MiB/rank: NCCL", 9.0, kind="torch", growth=2.0, last=3.0)]
    cells = bench.table_rows(rows)
    assert len(bench.HEADER) == 8 and all(len(c) == 8 for c in cells)
    assert cells[1] == ["AllGather 1 MiB/rank: op ag(x)", 2, "2.50", "2.25", "3.00", "1.00", "<= 3", "MET"]
    assert cells[2][-2:] == ["<= 30", "MISSED"] and cells[0][-2:] == ["-", "-"]
    lines = bench.summary_lines(rows)
    assert "target AllGather 1 MiB/rank: op ag(x): host time per call <= 3 us: 2.50 us (rank 1) MET" in lines
    assert any(ln.startswith("target AG+GEMM") and ln.endswith("MISSED") for ln in lines)
    grow = next(ln for ln in lines if ln.startswith("host time does not grow"))
    assert "MISSED at AG+GEMM 8192x8192x2048: op(a, b, out=c) (1.50x)" in grow
    assert "floor" not in grow and "NCCL" not in grow        # only tilescale's rows are held to it
    assert any(ln.startswith("warning:") and "AllGather 1 MiB/rank: NCCL" in ln for ln in lines)
    ok = bench.summary_lines([_row("AllGather 1 MiB/rank: op ag(x)", 2.5, target=3.0, growth=1.1)])
    assert ok[-1].endswith(": MET") and not any(ln.startswith("warning") for ln in ok)
    nan = bench.summary_lines([_row("x", 1.0, growth=float("nan"))])
    assert "MISSED" in nan[-1]                                 # a growth that is not a number is not "met"


def test_replay_line_and_mode(bench):
    g = dict(world_size=2, replays=100, median=1.23, p10=1.1, p90=1.5, replay_calls=0, eager_calls=900)
    assert bench.replay_status(g) == "MET"
    line = bench.replay_line(g)
    assert "graph.replay() 1.23 us host" in line and "during 100 replays: 0 (expected 0" in line
    assert "during 100 eager calls: 900" in line and line.endswith(": MET")
    assert bench.replay_status(dict(g, replay_calls=3)) == "MISSED"
    assert bench.replay_status(dict(g, eager_calls=0)).startswith("INVALID")
    shared = bench.mode_line(2, True, "NVIDIA H100")
    assert shared.startswith("mode:") and "SHARING" in shared and "no NCCL" in shared and "per-process" in shared
    own = bench.mode_line(2, False, "NVIDIA H200")
    assert own.startswith("mode:") and "a GPU each" in own


def test_measure_reports_the_slowest_rank_and_any_ranks_growth(bench, monkeypatch):
    """Host.measure: every rank's statistics gathered; the row is the rank of the largest median, its growth and
    its last-in-batch ratio the largest of any rank; the fused ops' batches and calls."""
    import types

    syncs = []
    monkeypatch.setattr(bench.tilescale, "synchronize", lambda: syncs.append(1))
    info = types.SimpleNamespace(world_size=3, rank=0)
    h = bench.Host(info, bench.parse_args(["--calls", "40", "--batch", "10", "--fused-calls", "6",
                                           "--fused-batch", "3"]))
    others = {1: dict(median=9.0, p10=8.0, p90=10.0, growth=1.0, last_in_batch=1.0),
              2: dict(median=1.0, p10=1.0, p90=1.0, growth=1.7, last_in_batch=2.5)}
    monkeypatch.setattr(h, "gather", lambda st: [st, dict(st, **others[1]), dict(st, **others[2])])
    calls = []
    row = h.measure("op", lambda: calls.append(1), target=3.0)
    assert len(calls) == (2 + 4) * 10 and len(syncs) == 2 + 4 + 1
    assert row["slowest_rank"] == 1 and row["median"] == 9.0 and row["p90"] == 10.0
    assert row["growth"] == 1.7 and row["last_in_batch"] == 2.5 and row["batch"] == 10
    assert row["medians"][1:] == [9.0, 1.0] and row["target_us"] == 3.0 and row["world_size"] == 3
    calls.clear()
    fused = h.measure("fused op", lambda: calls.append(1), fused=True, kind="torch")
    assert len(calls) == (2 + 2) * 3 and fused["batch"] == 3 and fused["kind"] == "torch"
    assert [r["op"] for r in h.rows] == ["op", "fused op"]


def test_arguments(bench):
    a = bench.parse_args([])
    assert (a.calls, a.batch, a.fused_calls, a.fused_batch, a.replays) == (1000, 20, 100, 5, 100)
    assert a.ag_shape == (8192, 8192, 2048) and a.rs_shape == (8192, 8192, 8192) and a.json is None
    assert bench.TARGET_AG_US == 3.0 and bench.TARGET_AG_GEMM_US == 30.0
    a = bench.parse_args(["--ag-shape", "4096x8192x2048", "--rs-shape", "8192,4096,2752", "--calls", "40"])
    assert a.ag_shape == (4096, 8192, 2048) and a.rs_shape == (8192, 4096, 2752) and a.calls == 40
    for bad in (["--batch", "0"], ["--ag-shape", "1,2"], ["--replays", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_kernels_are_the_ops_own(bench):
    from tilescale.ops import allgather

    for W in (1, 2, 4):
        names = sorted(getattr(fn, "func", fn).__name__ for fn, _ in bench.jobs(W))
        ag_gemm = ["ag_gemm_kernel"] * (2 if W > 1 else 1)    # the GEMM of the own rows, then of the others'
        assert names == sorted(["allgather_kernel", "allreduce_one_shot_kernel", "reduce_scatter_kernel",
                                *ag_gemm, "gemm_rs_push_kernel"])
        [(_, args)] = [j for j in bench.jobs(W) if getattr(j[0], "func", j[0]).__name__ == "allgather_kernel"]
        assert args[1] == allgather.default_blocks_per_peer(1 << 20, W)   # what AllGather of 1 MiB/rank builds


def test_scripts_compile():
    for path in (BENCH / "bench_host.py", BENCH / "timing.py", REPO / "tests" / "gpu" / "graphs_main.py"):
        subprocess.run([sys.executable, "-m", "py_compile", str(path)], check=True)


# ------------------------------------------------------------------------------------------- the tier
def test_run_gpu_tier_registers_host():
    text = TIER.read_text()
    subprocess.run(["bash", "-n", str(TIER)], check=True)
    case = re.search(r"^\s+host\) (.*?);;", text, re.S | re.M)
    assert case, "no 'host)' step in run_gpu_tier.sh"
    assert "launch.sh" in case.group(1) and "benchmarks/bench_host.py" in case.group(1)
    assert '--json "$OUTD/host.json"' in case.group(1) and 'GPUS="$hr"' in case.group(1)
    for script in re.findall(r"benchmarks/\w+\.py", text):     # every benchmark the tier runs exists
        assert (REPO / script).is_file(), script
    labels = re.findall(r"^    ([a-z_0-9]+)\) ", text, re.M)   # the steps; the error lists every one
    unknown = re.search(r"unknown step \$what \(([^)]*)\)", text).group(1)
    assert "host" in labels and set(labels) <= {s.strip() for s in unknown.split(",")}, (labels, unknown)


def test_run_one_gpu_names_its_steps_and_refuses_others(tmp_path):
    """benchmarks/run_one_gpu.sh (issue 15's one-GPU run): every benchmark it runs exists, each through launch.sh
    with GPUS=1; an unknown step stops it before anything runs, naming the steps it knows."""
    script = BENCH / "run_one_gpu.sh"
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    steps = re.findall(r"^    ([a-z0-9]+)\)", text, re.M)   # the steps' commands, in their order
    assert steps == ["sweep", "push", "modes", "ws1", "host", "profile"], steps
    for script_name in re.findall(r"benchmarks/\w+\.py", text):
        assert (REPO / script_name).is_file(), script_name
    assert text.count("GPUS=1 bash launch.sh benchmarks/") == 6
    r = subprocess.run(["bash", str(script), str(tmp_path / "out"), "sweep,nope"], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "STEP_TIMEOUT": "1"})
    assert r.returncode == 2 and "unknown step 'nope' (expected sweep, push, modes, ws1, host, profile)" in r.stderr, r
    assert not (tmp_path / "out").exists()      # refused before "sweep" ran


# ------------------------------------------------------------------------------- launch floors (issue 15)
def test_floor_line_is_ag_above_its_entry_point_per_rank(bench):
    rows = [dict(_row(bench.ROW_PYTHON, 0.1, kind="floor"), medians=[0.1, 0.1]),
            dict(_row(bench.ROW_AG, 9.0, target=3.0), medians=[8.0, 9.0]),
            dict(_row(bench.ROW_ENTRY, 6.5, kind="floor"), medians=[5.0, 6.5]),
            dict(_row(bench.ROW_EMPTY, 4.0, kind="floor"), medians=[3.5, 4.0])]
    assert bench.ROW_AG == "AllGather 1 MiB/rank: op ag(x)"          # the row of the target, named as before
    f = bench.floor_summary(rows)
    assert f == dict(python_us=3.0, ag_us=9.0, entry_us=6.5, empty_launch_us=4.0, python_call_us=0.1)  # rank 0: 8 - 5
    [line] = bench.floor_lines(rows)
    assert line.startswith("python overhead above the launch floor, ag(x): 3.00 us per call (ag(x) 9.00 us, its C "
                           "entry point alone 6.50 us")
    assert "cuLaunchKernel 4.00 us (the entry point above it: +2.50 us)" in line and "empty Python call) 0.10" in line
    assert bench.floor_lines(rows[:2]) == [] and bench.floor_summary(rows[:2]) is None   # no entry row: no line
    assert "empty_launch_us" not in bench.floor_summary(rows[1:3])
    assert not any("floor" in ln for ln in bench.summary_lines(rows) if ln.startswith("host time does not grow"))


def test_launch_floors_time_the_entry_point_alone_and_resync_the_op(bench, monkeypatch):
    """launch_floors: the entry point timed with exactly ag(x)'s arguments (the x pointer, the op's buffers, n, the
    stream), the op's host count set to the device's after (its result checked again), the empty kernel's row
    skipped on every rank, saying why, when it cannot be loaded."""
    import types

    import torch

    monkeypatch.setattr(bench.tilescale, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    checked = []
    monkeypatch.setattr(bench, "_check", lambda name, got, ref, rank, **k: checked.append((name, got)))

    def no_driver(stream):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(bench, "EmptyKernel", no_driver)
    launches = []
    counters = torch.zeros(4, dtype=torch.int64)

    def entry(*args):
        launches.append(args)
        counters.add_(1)          # the kernel counts its launches on the device
        return 0

    x = torch.zeros(64, dtype=torch.bfloat16)
    op_calls = []

    class Ag(types.SimpleNamespace):
        def __call__(self, t):
            op_calls.append(t)
            return "result"

    ag_fn = Ag(_direct=(entry, lambda: b""), _ptrs=(11, 22, 33), n=64, _stream=lambda: 7, counters=counters, calls=3,
               launch_path="direct")
    h = bench.Host(types.SimpleNamespace(world_size=1, rank=0), bench.parse_args(["--calls", "40", "--batch", "10"]))
    monkeypatch.setattr(h, "gather", lambda v: [v])
    bench.launch_floors(h, ag_fn, x, "ref", 0)
    assert [r["op"] for r in h.rows] == [bench.ROW_ENTRY] and h.rows[0]["kind"] == "floor"
    assert set(launches) == {(x.data_ptr(), 11, 22, 33, 64, 7)} and len(launches) == 1 + (2 + 4) * 10
    assert ag_fn.calls == len(launches) and op_calls == [x] and checked == [
        ("AllGather op after its entry point's launches", "result")]
    # a rank whose op launches through tilelang: no entry row on any rank
    h.rows.clear()
    ag_fn._direct, ag_fn.launch_path = None, "tilelang"
    bench.launch_floors(h, ag_fn, x, "ref", 0)
    assert h.rows == []


def test_empty_kernel_ptx_is_an_entry_without_parameters(bench):
    for version, target in bench.EmptyKernel.TARGETS:
        ptx = bench.EmptyKernel.PTX.format(v=version, t=target)
        assert ptx.startswith(f".version {version}\n.target {target}\n.address_size 64\n")
        assert ".visible .entry tilescale_empty()\n{\n\tret;\n}\n" in ptx
