"""Is the communication of AG+GEMM hidden? A trace of every rank, a timeline picture, and what profiling costs.

    GPUS=2 bash launch.sh benchmarks/profile_ag_gemm.py --out DIR [--shape 8192,8192,2048] [--calls 3]

--shape is M,K,N (bf16; A: M/W x K per rank, B: K x N), as in bench_fused.py. Writes, on rank 0:

  DIR/trace.json            every rank's events merged (DIR/trace_rank<R>.json: one per rank); open it
                            in https://ui.perfetto.dev or chrome://tracing. Per rank: host calls and
                            launches, the GEMM kernel and the copy-engine chunks per stream, and per SM
                            each tile's wait for its chunk ("signal observed") and its compute.
  DIR/timeline.png          per rank, the last profiled call: chunks pulled by the copy engines (comm),
                            and per SM when each tile waited, saw its chunk arrive, and ran (compute)
  DIR/profile_ag_gemm.json  the summary below and the overheads

Overheads (microseconds per call, slowest rank, median over rounds that alternate off and on):
  host events   1 MiB AllGather, a session recording its call + launch events vs none (target <= 2 %;
                at least 41 rounds of 200 calls each way: the target is ~0.13 us on a ~6 us call)
  timestamps    the AG+GEMM kernel built with in-kernel timestamps vs without, every chunk already
                arrived, so only the instrumentation differs; launched alternately, each launch timed
                (target <= 5 %; the JSON also keeps the two timed in separate batches)
  whole op      AG+GEMM with everything recorded (events, CUDA events, timestamps) vs not profiled
                (reported; no target)
Every profiled call is checked against torch (all_gather_into_tensor, then matmul).
Without a GPU (launch.sh on a build machine) it compiles the kernels it needs and exits.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilescale  # noqa: E402
from tilescale import testing  # noqa: E402

TARGET_HOST = 0.02
TARGET_KERNEL = 0.05
AG_BYTES = 1 << 20
AG_ROUNDS, AG_ITERS = 41, 200   # host events: off/on rounds (at least), calls per timed batch


# ------------------------------------------------------------------------------ reading a trace
def _by_rank(trace: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") in ("X", "i"):
            out.setdefault(e["pid"], []).append(e)
    return out


def call_events(trace: dict, rank: int, call: int = -1) -> dict:
    """The events of one FUSED call of `rank` (default: the last), by type: FUSED, LAUNCH, KERNEL, COPY,
    WAIT, TILE, STATE (lists of trace events), found through the parent ids."""
    events = _by_rank(trace).get(rank, [])
    calls = sorted((e for e in events if e["args"].get("type") == "FUSED"), key=lambda e: e["ts"])
    if not calls:
        raise ValueError(f"rank {rank}: no FUSED call in the trace")
    root = calls[call]["args"]["id"]
    children: dict = {}
    for e in events:
        children.setdefault(e["args"].get("parent"), []).append(e)
    found = {"FUSED": [calls[call]]}
    todo = [root]
    while todo:
        for e in children.get(todo.pop(), []):
            found.setdefault(e["args"]["type"], []).append(e)
            todo.append(e["args"]["id"])
    return found


def summarize_call(trace: dict, rank: int, call: int = -1) -> dict:
    """Is the communication of one call hidden? Kernel span, copy span, how much of the copies ran
    under the kernel, and how long tiles waited for their chunks."""
    ev = call_events(trace, rank, call)
    kernels = ev.get("KERNEL", [])
    copies = ev.get("COPY", [])
    waits = ev.get("WAIT", [])
    tiles = ev.get("TILE", [])
    out = {"rank": rank, "call_us": ev["FUSED"][0]["dur"], "tiles": len(tiles), "tiles_waited": len(waits)}
    if kernels:
        k0 = min(e["ts"] for e in kernels)
        k1 = max(e["ts"] + e["dur"] for e in kernels)
        out["kernel_us"] = k1 - k0
    if copies:
        c0 = min(e["ts"] for e in copies)
        c1 = max(e["ts"] + e["dur"] for e in copies)
        out["copy_us"] = c1 - c0
        if kernels:
            out["copy_under_kernel"] = max(0.0, min(c1, k1) - max(c0, k0)) / max(c1 - c0, 1e-9)
            out["last_chunk_before_kernel_end_us"] = k1 - c1
    if tiles:
        busy = sum(e["dur"] for e in tiles)
        wait = sum(e["dur"] for e in waits)
        out["tile_us_mean"] = busy / len(tiles)
        out["wait_us_total"] = wait
        out["wait_share"] = wait / max(busy + wait, 1e-9)   # of the SMs' time in this kernel: waiting
        out["sms"] = len({e["args"].get("sm", e["tid"]) for e in tiles})
    return out


# ------------------------------------------------------------------------------------- the picture
def plot_timeline(trace: dict, path: str, call: int = -1) -> str:
    """Per rank, two panels: above, the streams (the GEMM kernel, and the copy-engine chunks of the call:
    comm); below, per SM, each tile's wait for its chunk (ending at the 'signal observed' tick) and its
    compute. Times in microseconds from the earliest chunk copy or kernel start of that call over all
    ranks (ranks of one node share the host clock)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(_by_rank(trace))
    per = {r: call_events(trace, r, call) for r in ranks}
    starts = [e["ts"] for r in ranks for e in per[r].get("KERNEL", []) + per[r].get("COPY", [])]
    t0 = min(starts) if starts else min(e["ts"] for r in ranks for e in per[r]["FUSED"])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    colors = {"COPY": "#2ca02c", "KERNEL": "#999999", "WAIT": "#d62728", "TILE": "#1f77b4"}
    layout = []
    for r in ranks:
        ev = per[r]
        streams = sorted({e["tid"] for e in ev.get("KERNEL", []) + ev.get("COPY", [])})
        sms = sorted({e["tid"] for e in ev.get("TILE", []) + ev.get("WAIT", [])})
        layout.append((r, streams, sms))
    ratios = []
    for _, streams, sms in layout:
        ratios += [max(len(streams), 1) * 3, max(len(sms), 4)]
    fig, axes = plt.subplots(len(ratios), 1, sharex=True, squeeze=False,
                             figsize=(13, 1.0 + 0.045 * sum(ratios) + 0.9 * len(ranks)),
                             gridspec_kw={"height_ratios": ratios})
    for n, (r, streams, sms) in enumerate(layout):
        ev = per[r]
        for ax, tids, kinds in ((axes[2 * n, 0], streams, ("KERNEL", "COPY")),
                                (axes[2 * n + 1, 0], sms, ("WAIT", "TILE"))):
            rows = {tid: i for i, tid in enumerate(tids)}
            for kind in kinds:
                by_row: dict[int, list] = {}
                for e in ev.get(kind, []):
                    by_row.setdefault(rows[e["tid"]], []).append((e["ts"] - t0, max(e["dur"], 0.05)))
                for y, bars in by_row.items():
                    ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colors[kind], edgecolors="white",
                                   linewidth=0.3 if kind == "COPY" else 0)
            step = max(1, len(tids) // 12)
            shown = [t for i, t in enumerate(tids) if i % step == 0]
            ax.set_yticks([rows[t] for t in shown])
            ax.set_yticklabels([names.get((r, t), str(t)) for t in shown], fontsize=7)
            ax.set_ylim(len(tids) - 0.5, -0.5)
            ax.grid(axis="x", alpha=0.3)
        sm_rows = {tid: i for i, tid in enumerate(sms)}
        obs = [(e["ts"] - t0, sm_rows[e["tid"]]) for e in ev.get("STATE", []) if e["tid"] in sm_rows]
        if obs:
            axes[2 * n + 1, 0].scatter([x for x, _ in obs], [y for _, y in obs], marker="|", s=14, color="black",
                                       linewidths=0.7)
        s = summarize_call(trace, r, call)
        title = f"rank {r}: AG+GEMM call {s['call_us']:.0f} us"
        if "kernel_us" in s:
            title += f", GEMM kernel {s['kernel_us']:.0f} us"
        if "copy_us" in s:
            title += f", copies {s['copy_us']:.0f} us ({100 * s.get('copy_under_kernel', 0):.0f}% under the kernel)"
        if "wait_share" in s:
            title += f"; SM time waiting for chunks: {100 * s['wait_share']:.1f}%"
        axes[2 * n, 0].set_title(title, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("microseconds from the first chunk copy or kernel start of the call (all ranks)")
    fig.legend(handles=[Patch(color=colors["COPY"], label="copy-engine chunk (comm)"),
                        Patch(color=colors["KERNEL"], label="GEMM kernel"),
                        Patch(color=colors["WAIT"], label="tile waits for its chunk"),
                        Patch(color=colors["TILE"], label="tile computed"),
                        plt.Line2D([], [], color="black", marker="|", linestyle="",
                                   label="signal observed (chunk arrived)")],
               fontsize=8, loc="upper center", ncol=5, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ the run
def _jobs(M, K, N, W):
    from tilescale.ops.allgather_gemm import ag_gemm_kernel, kernels
    from tilescale.profiler.device_timeline import stamp_kernel_jit

    jobs = []
    for _, args in kernels(M, N, K, W, "bfloat16"):   # the GEMM of the own rows, then (W > 1) of the others'
        # the same kernel with profile=True (its 12th argument), as AGGemm builds it with `profile`
        jobs += [(ag_gemm_kernel, args), (ag_gemm_kernel, args[:11] + (True,) + args[12:])]
    try:  # the AllGather of the overhead measurement (what its constructor will build)
        from tilescale.ops.allgather import allgather_kernel, default_blocks_per_peer

        jobs.append((allgather_kernel, (W, default_blocks_per_peer(AG_BYTES, W), "bfloat16", 512)))
    except Exception as e:  # noqa: BLE001  (its constructor builds it then)
        print(f"prebuild: AllGather kernel left to its constructor ({e})")
    return jobs, stamp_kernel_jit()


def build(world_size: int, shape=(8192, 8192, 2048)) -> None:
    """No GPU: compile and link the AG+GEMM kernel with and without timestamps, and the clock kernel."""
    from tilescale.toolchain import stub_libcuda_dir

    jobs, stamp = _jobs(*shape, world_size)
    for (fn, args), what in zip(jobs[:2], ("without", "with"), strict=False):
        r = fn.build(*args)
        print(f"built {r.library} ({what} timestamps)")
    d = stub_libcuda_dir()
    r = tilescale.build(stamp.get_tir(), compile_flags=[f"-L{d}"] if d else [])
    print(f"built {r.library} (clock stamp)")


def _median_rounds(fn_off, fn_on, rounds: int) -> tuple[float, float]:
    import statistics

    off, on = [], []
    for _ in range(rounds):
        off.append(fn_off())
        on.append(fn_on())
    return statistics.median(off), statistics.median(on)


def _interleaved_us(fn_off, fn_on, pairs: int = 30, warmup: int = 3) -> tuple[float, float]:
    """Microseconds per launch of `fn_off` and `fn_on` launched alternately on one stream (off, on, off, ...),
    each between two CUDA events: median per kind, max over ranks. Both kinds run under the same clocks,
    power and L2 state; timing one kind's batch after the other's let the GPU's state differ between them
    (+13.8 % for an instrumented kernel whose SASS differs from the plain one by a few stores per block
    outside the mainloop, while the same kernel inside the profiled op measured 358-360 us against 355)."""
    import statistics

    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()
    for _ in range(warmup):
        fn_off()
        fn_on()
    torch.cuda.synchronize()
    dist.barrier()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(2 * pairs + 1)]
    evs[0].record()
    for i in range(pairs):
        fn_off()
        evs[2 * i + 1].record()
        fn_on()
        evs[2 * i + 2].record()
    evs[-1].synchronize()
    dt = [a.elapsed_time(b) * 1e3 for a, b in zip(evs, evs[1:], strict=False)]
    v = torch.tensor([statistics.median(dt[0::2]), statistics.median(dt[1::2])], device="cuda")
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return v[0].item(), v[1].item()


def _cpu_us(fn, n: int = 100) -> float:
    """Host microseconds per call of `fn` issued back to back (max over ranks)."""
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) * 1e6 / n
    torch.cuda.synchronize()
    v = torch.tensor([dt], device="cuda")
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return v.item()


def run(info, a) -> None:
    import torch
    from timing import environment, print_table, time_op, write_json

    import tilescale.profiler as tp
    from tilescale import staged_collectives
    from tilescale.ops import prebuild
    from tilescale.ops.allgather import AllGather
    from tilescale.ops.allgather_gemm import AGGemm

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    t_begin = time.time()
    rank, W = info.rank, info.world_size
    M, K, N = a.shape
    out_dir = os.path.abspath(a.out)
    dtype = torch.bfloat16
    jobs, stamp = _jobs(M, K, N, W)
    prebuild.on_local_rank0(jobs + [(stamp, ())])
    t_built = time.time()

    # data and reference
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    x_a = torch.randn(M // W, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / math.sqrt(K)
    a_full = torch.empty(M, K, device="cuda", dtype=dtype)
    dist.all_gather_into_tensor(a_full, x_a)
    ref = (a_full.float() @ b.float())

    def check(c, what):
        err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-2:  # also catches NaN (poisoned output left unwritten)
            raise AssertionError(f"[rank {rank}] {what}: relative error {err:.3g} vs torch")

    op = AGGemm(M, N, K, dtype, profile=True)
    c = torch.empty(M, N, device="cuda", dtype=dtype)
    c.fill_(float("nan"))
    op(x_a, b, out=c)
    torch.cuda.synchronize()
    check(c, "AG+GEMM (not profiled)")

    # the profiled calls: trace + picture
    with tp.profile(out_dir, mask="all", name=f"AG+GEMM {M}x{K}x{N} bf16, {W} ranks") as session:
        for i in range(a.calls):
            with tp.group(f"iteration {i}"):
                c.fill_(float("nan"))
                op(x_a, b, out=c)
        torch.cuda.synchronize()
        check(c, "AG+GEMM (profiled, timestamps in the kernel)")
    clock = session.clock.describe() if session.clock is not None else None
    mine = [e for e in session.profiler.events() if e["type"] == "TILE"] if hasattr(session.profiler, "events") else []
    tiles = sum(op.tiles[:2 if W > 1 else 1])   # the tiles of its two GEMMs (one at world size 1)
    if len(mine) != a.calls * tiles:
        raise AssertionError(f"[rank {rank}] expected {a.calls} x {tiles} TILE events, got {len(mine)}")
    dist.barrier()  # rank 0 has merged the trace (profile() waits for every rank's file)
    t_profiled = time.time()

    # overheads
    rows_ag = AG_BYTES // (2 * 1024)
    ag = AllGather((rows_ag, 1024), dtype)
    xg = torch.randn(rows_ag, 1024, device="cuda", dtype=dtype, generator=g)
    ref_ag = torch.empty(W * rows_ag, 1024, device="cuda", dtype=dtype)
    dist.all_gather_into_tensor(ref_ag, xg)
    got = ag(xg)
    torch.cuda.synchronize()
    testing.check_close("AllGather 1 MiB", got, ref_ag, rank)

    def ag_on():
        with tp.profile(None, mask="host", merge=False):
            return time_op(lambda: ag(xg), iters=AG_ITERS)

    # a 2 % target on ~6-10 us calls: more rounds and calls than the other rows (each round ~3 ms of calls; with 9
    # rounds of 50 calls, the same code measured +4.3% once and -4.2% another time)
    ag_off_us, ag_on_us = _median_rounds(lambda: time_op(lambda: ag(xg), iters=AG_ITERS), ag_on,
                                         max(a.rounds, AG_ROUNDS))
    cpu_off = _cpu_us(lambda: ag(xg), 1000)
    with tp.profile(None, mask="host", merge=False):
        cpu_on = _cpu_us(lambda: ag(xg), 1000)

    # the in-kernel timestamps: the GEMM of the own rows (it waits for nothing), plain and instrumented
    buf = torch.zeros(op.tiles[0] * 8, device="cuda", dtype=torch.int64).view(torch.uint64)
    plain, stamped = op.kernel_own, op.kernels_prof[0]
    k_off, k_on = _interleaved_us(lambda: plain.launch(x_a, b, c, *op.tail[0]),
                                  lambda: stamped.launch(x_a, b, c, *op.tail[0], buf), pairs=10 * a.rounds)
    k_batch = _median_rounds(lambda: time_op(lambda: plain.launch(x_a, b, c, *op.tail[0])),
                             lambda: time_op(lambda: stamped.launch(x_a, b, c, *op.tail[0], buf)), a.rounds)

    def fused_on():
        with tp.profile(None, mask="all", merge=False):
            return time_op(lambda: op(x_a, b, out=c), warmup=2, iters=10, repeats=2)

    f_off, f_on = _median_rounds(lambda: time_op(lambda: op(x_a, b, out=c), warmup=2, iters=10, repeats=2),
                                 fused_on, a.rounds)
    torch.cuda.synchronize()
    check(c, "AG+GEMM (after the overhead runs)")
    t_end = time.time()

    over = {
        "allgather_1MiB_host_events": dict(off_us=ag_off_us, on_us=ag_on_us, overhead=ag_on_us / ag_off_us - 1,
                                           target=TARGET_HOST, cpu_off_us=cpu_off, cpu_on_us=cpu_on),
        "ag_gemm_kernel_timestamps": dict(off_us=k_off, on_us=k_on, overhead=k_on / k_off - 1, target=TARGET_KERNEL,
                                          method="interleaved launches, median per launch",
                                          batched_off_us=k_batch[0], batched_on_us=k_batch[1]),
        "ag_gemm_op_everything": dict(off_us=f_off, on_us=f_on, overhead=f_on / f_off - 1, target=None),
    }
    if rank == 0:
        trace_path = os.path.join(out_dir, "trace.json")
        with open(trace_path) as f:
            trace = json.load(f)
        summary = [summarize_call(trace, r) for r in range(W)]
        png = os.path.join(out_dir, "timeline.png")
        try:
            plot_timeline(trace, png)
        except ImportError as e:
            png = None
            print(f"timeline.png not drawn ({e}): python {__file__} --plot-from {trace_path} draws it "
                  "where matplotlib is installed")
        env = environment()
        print_table(f"Is the communication hidden? AG+GEMM {M}x{K}x{N} bf16, {W} x {env['gpu']}, last profiled call",
                    ["rank", "call us", "kernel us", "copies us", "copies under kernel", "tiles", "tiles waited",
                     "SM time waiting"],
                    [[s["rank"], f"{s['call_us']:.0f}", f"{s.get('kernel_us', 0):.0f}", f"{s.get('copy_us', 0):.0f}",
                      f"{100 * s.get('copy_under_kernel', 0):.0f}%", s["tiles"], s["tiles_waited"],
                      f"{100 * s.get('wait_share', 0):.2f}%"] for s in summary])
        rows = []
        for name, o in over.items():
            status = "-" if o["target"] is None else ("MET" if o["overhead"] <= o["target"] else "MISSED")
            rows.append([name, f"{o['off_us']:.1f}", f"{o['on_us']:.1f}", f"{100 * o['overhead']:+.2f}%",
                         "-" if o["target"] is None else f"<= {100 * o['target']:.0f}%", status])
        print_table("Profiler overheads (us per call, slowest rank, median of rounds)",
                    ["what", "off", "on", "overhead", "target", "status"], rows)
        print(f"host cost of one AllGather call issued back to back: {cpu_off:.1f} us off, {cpu_on:.1f} us on")
        print(f"GEMM kernel timed in separate batches: {k_batch[0]:.1f} us off, {k_batch[1]:.1f} us "
              "with timestamps")
        if clock:
            print(f"GPU clock -> host clock: offset {clock['offset_ns']} ns, error <= {clock['error_ns']} ns, "
                  f"drift {clock.get('drift_ns_per_s', float('nan')):.1f} ns/s")
        print(f"wrote {trace_path} and {png}; seconds: build {t_built - t_begin:.0f}, profile "
              f"{t_profiled - t_built:.0f}, overheads {t_end - t_profiled:.0f}")
        write_json(a.json or os.path.join(out_dir, "profile_ag_gemm.json"),
                   dict(op="ag_gemm", shape=dict(M=M, K=K, N=N), kernel_args=list(op.args), tiles_per_call=tiles,
                        env=env, calls=a.calls, summary=summary,
                        overheads=over, clock=clock, trace=trace_path, png=png,
                        seconds=dict(build=t_built - t_begin, profile=t_profiled - t_built,
                                     overheads=t_end - t_profiled)))
    ag.close()
    op.close()
    print(f"[rank {rank}] OK: profiled {a.calls} AG+GEMM calls ({len(mine)} tiles), overheads measured", flush=True)


def _shape(text: str) -> tuple[int, int, int]:
    try:
        M, K, N = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape: got {text!r}, expected M,K,N such as 8192,8192,2048") from None
    return M, K, N


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="profile_ag_gemm", help="output folder (trace.json, timeline.png, JSON)")
    ap.add_argument("--shape", type=_shape, default=(8192, 8192, 2048), help="M,K,N (default 8192,8192,2048)")
    ap.add_argument("--calls", type=int, default=3, help="profiled AG+GEMM calls")
    ap.add_argument("--rounds", type=int, default=3, help="off/on rounds of each overhead measurement")
    ap.add_argument("--json", default=None, help="summary JSON (default OUT/profile_ag_gemm.json)")
    ap.add_argument("--plot-from", default=None, help="only draw OUT/timeline.png from this trace.json (no GPU)")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            print(plot_timeline(json.load(f), os.path.join(args.out, "timeline.png")))
        raise SystemExit(0)
    testing.example_main(lambda info: run(info, args), lambda ws: build(ws, args.shape))
