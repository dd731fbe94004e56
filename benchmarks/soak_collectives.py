"""Soak of every tilescale op: GEMM+ReduceScatter, AllGather+GEMM, AllGather, AllReduce (one-shot and
two-shot), ReduceScatter, AllToAll and Broadcast, each called many times back to back, checked against a
reference every few hundred calls, with memory required to stay flat; then a back-to-back stream of calls
of random sizes through the torch-like functions (tilescale.ops.all_gather ...), every result checked.

    GPUS=4 bash launch.sh benchmarks/soak_collectives.py [--iters 10000] [--check-every 500] [--json soak.json]
    GPUS=4 TILESCALE_RANKS_PER_GPU=4 bash launch.sh benchmarks/soak_collectives.py     # 4 ranks on one GPU
    ... --ops all_reduce_one_shot,random --random-calls 500

Per op (small shapes: a correctness and leak soak, fine on a shared GPU): the op is built once, then called
--iters times with no host synchronisation between calls, on new inputs every call: each rank rotates
among 3 seeded input sets (Broadcast also rotates the root), so two consecutive calls, and two calls of
the same buffer parity, never see the same data. Every --check-every calls, the output of that call
(poisoned with NaN before it where the op writes into a tensor of ours) is compared with a reference
computed locally: every rank rebuilds every rank's inputs from their seeds, no collective is involved.

* AllGather, AllToAll, Broadcast move bytes: the result must be exactly the reference;
* AllReduce and ReduceScatter sum in fp32, in rank order 0..W-1, and round once (their docstrings): the
  reference is that sum (torch, fp32, same order) rounded to the dtype, and the result must be exact;
* GemmRS and AGGemm round fp32 tile sums to the dtype (partials too, for GemmRS): the reference is the
  fp32 product, and max |C - ref| / max |ref| must stay below 2e-2 (as in the examples).

At every check each rank reads torch.cuda.memory_allocated(), the symmetric heap in use (bytes of live
tilescale.symm allocations) and its process RSS; the first check is the baseline, and the op fails if a
later one exceeds it by more than --alloc-tolerance-mib, --symm-tolerance-mib (default 0: calls must not
allocate symmetric memory) or --rss-tolerance-mib, on any rank.

Random stream (--random-calls, default 200): calls of all_gather, all_reduce (auto / one-shot / two-shot),
reduce_scatter_tensor, broadcast (random root) and all_to_all_single (equal and random variable splits),
drawn from a seeded generator (the same on every rank), shapes drawn from a pool of --random-pool sizes
per function (odd sizes included: the staged paths), every result checked exactly, in batches, against
references rebuilt from seeds. After it, every live symmetric allocation made during the stream must
belong to an op still held by the functions' caches (none may be left behind by an evicted op).

A failure of any rank fails every rank (the checks are agreed over the control group); waits on the GPU are
bounded by TILESCALE_WAIT_TIMEOUT_S (set by the tests and the GPU tier); --budget-s bounds the whole soak
(each op stops at a check once its share of the budget is spent, and says so). Messages are fp16 by
default (--dtype) and small (--elems per rank; GEMMs --gemm-shape), which keeps the kernels few: with the
default sizes the soak builds 9 kernels per world size (the random sizes need no other), and at 4 ranks 4 of
them are kernels that other CPU-tier tests build too.
"""
import argparse
import math
import os
import random
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import environment, print_table, write_json  # noqa: E402

import tilescale  # noqa: E402

MIB = 1 << 20
OPS = ("gemm_rs", "ag_gemm", "all_gather", "all_reduce_one_shot", "all_reduce_two_shot", "reduce_scatter",
       "all_to_all", "broadcast")
ALL = OPS + ("random",)
NSETS = 3                 # input sets each rank rotates among (odd: calls e and e + 2 differ too)
GEMM_TOL = 2e-2           # max |C - ref| / max |ref| of the fused GEMM ops
GEMM_RS_REDUCE_BLOCKS = 8
AG_COLS = 1024            # AllGather shard: (elems / AG_COLS, AG_COLS)
A2A_COLS = 256            # AllToAll rows: A2A_COLS elements
STREAM_KINDS = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all", "all_to_all_v")
STREAM_MAX_ELEMS = 1 << 16   # elements per rank: keeps the stream on the main ops' kernels (block counts)
STREAM_A2A_MAX_ROWS = 32     # rows one rank sends one peer (variable splits)
DEVICE = "cuda"


# ----------------------------------------------------------------------------------------------- plan
def collective_shapes(W: int, elems: int) -> dict:
    """The shape each collective of the soak is built for, `elems` elements per rank."""
    return {"all_gather": (max(1, elems // AG_COLS), AG_COLS), "all_reduce": (elems,),
            "reduce_scatter": (elems - elems % W,), "all_to_all": (W * max(1, elems // (W * A2A_COLS)), A2A_COLS),
            "broadcast": (elems,)}


def stream_plan(W: int, args) -> tuple[dict, list]:
    """(pools, calls) of the random stream, the same on every rank: pools[kind] holds --random-pool shapes,
    calls[c] = (kind, index into its pool, extra) with extra the AllReduce algo, the Broadcast root or the
    AllToAll split matrix (rows rank s sends rank p)."""
    rng = random.Random(args.seed * 1_000_003 + 17 * W + 5)

    def n():   # log-uniform element count in [1, STREAM_MAX_ELEMS]: odd sizes are the rule
        return max(1, min(STREAM_MAX_ELEMS, int(math.exp(rng.uniform(0.0, math.log(STREAM_MAX_ELEMS))))))

    pools = {k: [] for k in STREAM_KINDS}
    for _ in range(args.random_pool):
        t = n()
        rows = rng.randint(1, min(t, 64))
        pools["all_gather"].append((rows, max(1, t // rows)))
        pools["all_reduce"].append(n())
        pools["reduce_scatter"].append(n())                         # elements of this rank's output
        pools["broadcast"].append(n())
        cols = rng.choice((1, 3, 8, 64, 100, 256))
        pools["all_to_all"].append((max(1, n() // (W * cols)), cols))  # (rows per peer, cols)
        pools["all_to_all_v"].append(rng.choice((1, 7, 64, 256)))    # cols
    calls = []
    for _ in range(args.random_calls):
        kind = rng.choice(STREAM_KINDS)
        k = rng.randrange(args.random_pool)
        extra = None
        if kind == "all_reduce":
            extra = rng.choice(("auto", "one_shot", "two_shot"))
        elif kind == "broadcast":
            extra = rng.randrange(W)
        elif kind == "all_to_all_v":   # every rank sends itself >= 1 row: no empty tensor anywhere
            extra = [[rng.randint(1 if s == p else 0, STREAM_A2A_MAX_ROWS) for p in range(W)] for s in range(W)]
        calls.append((kind, k, extra))
    return pools, calls


def a2a_capacity(matrix) -> int:
    """Rows of the AllToAll all_to_all_single builds for variable splits (tilescale/ops/all_to_all.py)."""
    most = max(sum(col) for col in zip(*matrix, strict=False))
    return 1 << max(0, (most - 1).bit_length())


def jobs(world_size: int, sms: int, args) -> list:
    """(jit function, args) of every kernel this soak builds at `world_size` on a GPU of `sms` SMs."""
    from tilescale.ops import (
        all_to_all,
        allgather,
        allgather_gemm,
        allreduce,
        broadcast_from_root,
        gemm_reduce_scatter,
        prebuild,
        reduce_scatter,
    )

    W, dt = world_size, args.dtype
    es = 4 if dt == "float32" else 2
    shp = collective_shapes(W, args.elems)
    out = []
    ops = set(args.ops)
    M, N, K = args.gemm_shape
    if "gemm_rs" in ops:
        out += gemm_reduce_scatter.kernels(M, N, K, W, dt, GEMM_RS_REDUCE_BLOCKS)     # K: GemmRS's K per rank
    if "ag_gemm" in ops:
        out += allgather_gemm.kernels(M, N, K, W, dt)
    ag_bytes, ar, rs, a2a, bc = [], [], [], [], []
    if "all_gather" in ops:
        ag_bytes.append(math.prod(shp["all_gather"]) * es)
    for algo in ("one_shot", "two_shot"):
        if f"all_reduce_{algo}" in ops:
            ar.append((algo, args.elems * es))
    if "reduce_scatter" in ops:
        rs.append(shp["reduce_scatter"][0] * es)
    if "all_to_all" in ops:
        a2a.append(math.prod(shp["all_to_all"]) * es)
    if "broadcast" in ops:
        bc.append(args.elems * es)
    if "random" in ops:
        pools, calls = stream_plan(W, args)
        for kind, k, extra in calls:
            p = pools[kind][k]
            if kind == "all_gather":
                ag_bytes.append(p[0] * p[1] * es)
            elif kind == "all_reduce":
                ar.append((extra, p * es))
            elif kind == "reduce_scatter":
                rs.append(W * p * es)
            elif kind == "broadcast":
                bc.append(p * es)
            elif kind == "all_to_all":
                a2a.append(W * p[0] * p[1] * es)
            else:
                a2a.append(a2a_capacity(extra) * p * es)
    out += [(allgather.allgather_kernel, (W, allgather.default_blocks_per_peer(nb, W), dt, 512)) for nb in ag_bytes]
    out += [job for algo, nb in ar for job in allreduce.kernels(nb, W, dt, sms, algo)]
    out += [job for nb in rs for job in reduce_scatter.kernels(nb, W, dt, sms)]
    out += [job for nb in a2a for job in all_to_all.kernels(nb, W, None, sms)]
    out += [job for nb in bc for job in broadcast_from_root.kernels(nb, W, None, sms)]
    return prebuild.unique(out)


# -------------------------------------------------------------------------------------------- helpers
def rand(key, shape, dtype, scale: float = 1.0, seed: int = 0):
    """A seeded random tensor: the same `key` gives the same values on every rank."""
    import torch

    s = (seed << 32) + zlib.crc32(repr(key).encode())
    g = torch.Generator(device=DEVICE).manual_seed(s)
    t = torch.randn(*shape, device=DEVICE, generator=g)
    return (t * scale).to(dtype) if scale != 1.0 else t.to(dtype)


def rank_sum(parts, dtype):
    """The sum of `parts` in fp32, in list (rank) order, rounded once: what the reducing kernels compute."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(dtype)


def abs_err(got, ref) -> float:
    """max |got - ref| (inf if got holds a NaN / inf that ref does not, or the shapes differ)."""
    import torch

    if got.shape != ref.shape:
        return float("inf")
    if got.numel() == 0:
        return 0.0
    g, r = got.float(), ref.float()
    if not torch.isfinite(g).all():
        return float("inf")
    return (g - r).abs().max().item()


def rel_err(got, ref) -> float:
    e = abs_err(got, ref)
    return e / max(ref.float().abs().max().item(), 1e-30) if math.isfinite(e) else e


def live_symm_bases() -> set:
    from tilescale import runtime, symm

    return set(symm._registry(runtime.current()).by_base)


def symm_live_bytes() -> int:
    from tilescale import runtime, symm

    return symm._registry(runtime.current()).live_bytes


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak instead
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory() -> dict:
    import torch

    return {"allocated_mib": torch.cuda.memory_allocated() / MIB, "symm_mib": symm_live_bytes() / MIB,
            "rss_mib": rss_bytes() / MIB}


def gather(obj) -> list:
    """Every rank's `obj` (control group, gloo on the host: works with shared GPUs, no GPU work)."""
    from tilescale import runtime

    return runtime.current().all_gather_object(obj)


# ------------------------------------------------------------------------------------------ the cases
class Case:
    """One op under soak: ``call(i)`` is call number i (inputs of set i % NSETS), ``poison(i)`` runs before a
    checked call, ``error(i)`` compares the output of call i with the reference (after a synchronize)."""

    name = "?"
    shape = ""
    tol = 0.0
    metric = "max abs err"

    def poison(self, i: int) -> None:
        pass

    def close(self) -> None:
        self.op.close()


class GemmRSCase(Case):
    name, tol, metric = "gemm_rs", GEMM_TOL, "max rel err"

    def __init__(self, ctx):
        import torch

        M, N, K = ctx.gemm_shape
        W, me, dt = ctx.W, ctx.rank, ctx.dtype
        kl = K                  # per rank: the full K is W x K
        self.shape = f"M={M} N={N} K={W * K} (K/W={kl})"
        self.op = tilescale.ops.GemmRS(M, N, kl, dt, reduce_blocks=GEMM_RS_REDUCE_BLOCKS)
        rows = slice(me * (M // W), (me + 1) * (M // W))
        ws = [rand(("gemm_rs.w", r), (kl, N), dt, kl ** -0.5, ctx.seed) for r in range(W)]
        self.x, self.refs = [], []
        for j in range(NSETS):
            xs = [rand(("gemm_rs.x", r, j), (M, kl), dt, 1.0, ctx.seed) for r in range(W)]
            self.refs.append(sum(xs[r][rows].float() @ ws[r].float() for r in range(W)))
            self.x.append(xs[me])
        self.w = ws[me]
        self.out = torch.empty(M // W, N, device=DEVICE, dtype=dt)

    def call(self, i):
        self.op(self.x[i % NSETS], self.w, out=self.out)

    def poison(self, i):
        self.out.fill_(float("nan"))

    def error(self, i):
        return rel_err(self.out, self.refs[i % NSETS])


class AGGemmCase(Case):
    name, tol, metric = "ag_gemm", GEMM_TOL, "max rel err"

    def __init__(self, ctx):
        import torch

        M, N, K = ctx.gemm_shape
        W, me, dt = ctx.W, ctx.rank, ctx.dtype
        self.shape = f"M={M} N={N} K={K}"
        self.op = tilescale.ops.AGGemm(M, N, K, dt)
        self.b = rand(("ag_gemm.b", me), (K, N), dt, K ** -0.5, ctx.seed)
        self.a, self.refs = [], []
        for j in range(NSETS):
            shards = [rand(("ag_gemm.a", r, j), (M // W, K), dt, 1.0, ctx.seed) for r in range(W)]
            self.refs.append(torch.cat(shards).float() @ self.b.float())
            self.a.append(shards[me])
        self.out = torch.empty(M, N, device=DEVICE, dtype=dt)

    def call(self, i):
        self.op(self.a[i % NSETS], self.b, out=self.out)

    def poison(self, i):
        self.out.fill_(float("nan"))

    def error(self, i):
        return rel_err(self.out, self.refs[i % NSETS])


class AllGatherCase(Case):
    """``ag(x)``: the output is the op's slot of this call (symmetric: not poisoned, peers write it; a stale
    slot would hold call i - 2's data, another input set)."""
    name = "all_gather"

    def __init__(self, ctx):
        import torch

        shp = collective_shapes(ctx.W, ctx.elems)["all_gather"]
        self.shape = f"{shp} per rank"
        self.op = tilescale.ops.AllGather(shp, ctx.dtype)
        self.x, self.refs = [], []
        for j in range(NSETS):
            shards = [rand(("all_gather", r, j), shp, ctx.dtype, 1.0, ctx.seed) for r in range(ctx.W)]
            self.refs.append(torch.cat(shards))
            self.x.append(shards[ctx.rank])
        self.last = None

    def call(self, i):
        self.last = self.op(self.x[i % NSETS])

    def error(self, i):
        return abs_err(self.last, self.refs[i % NSETS])


class AllReduceCase(Case):
    def __init__(self, ctx, algo: str):
        import torch

        self.name = f"all_reduce_{algo}"
        n = ctx.elems
        self.shape = f"({n},)"
        self.op = tilescale.ops.AllReduce((n,), ctx.dtype, algo=algo)
        assert self.op.algo == algo, (self.op.algo, algo)
        self.x, self.refs = [], []
        for j in range(NSETS):
            xs = [rand(("all_reduce", r, j), (n,), ctx.dtype, 1.0, ctx.seed) for r in range(ctx.W)]
            self.refs.append(rank_sum(xs, ctx.dtype))
            self.x.append(xs[ctx.rank])
        self.out = torch.empty(n, device=DEVICE, dtype=ctx.dtype)

    def call(self, i):
        self.op(self.x[i % NSETS], out=self.out)

    def poison(self, i):
        self.out.fill_(float("nan"))

    def error(self, i):
        return abs_err(self.out, self.refs[i % NSETS])


class ReduceScatterCase(Case):
    name = "reduce_scatter"

    def __init__(self, ctx):
        import torch

        (n,) = collective_shapes(ctx.W, ctx.elems)["reduce_scatter"]
        W, me = ctx.W, ctx.rank
        s = n // W
        self.shape = f"({n},) -> ({s},)"
        self.op = tilescale.ops.ReduceScatter((n,), ctx.dtype)
        self.x, self.refs = [], []
        for j in range(NSETS):
            xs = [rand(("reduce_scatter", r, j), (n,), ctx.dtype, 1.0, ctx.seed) for r in range(W)]
            self.refs.append(rank_sum([x[me * s:(me + 1) * s] for x in xs], ctx.dtype))
            self.x.append(xs[me])
        self.out = torch.empty(s, device=DEVICE, dtype=ctx.dtype)

    def call(self, i):
        self.op(self.x[i % NSETS], out=self.out)

    def poison(self, i):
        self.out.fill_(float("nan"))

    def error(self, i):
        return abs_err(self.out, self.refs[i % NSETS])


class AllToAllCase(Case):
    name = "all_to_all"

    def __init__(self, ctx):
        import torch

        shp = collective_shapes(ctx.W, ctx.elems)["all_to_all"]
        W, me = ctx.W, ctx.rank
        rows = shp[0] // W
        self.shape = f"{shp}"
        self.op = tilescale.ops.AllToAll(shp, ctx.dtype)
        self.x, self.refs = [], []
        for j in range(NSETS):
            xs = [rand(("all_to_all", r, j), shp, ctx.dtype, 1.0, ctx.seed) for r in range(W)]
            self.refs.append(torch.cat([x[me * rows:(me + 1) * rows] for x in xs]))
            self.x.append(xs[me])
        self.out = torch.empty(shp, device=DEVICE, dtype=ctx.dtype)

    def call(self, i):
        self.op(self.x[i % NSETS], out=self.out)

    def poison(self, i):
        self.out.fill_(float("nan"))

    def error(self, i):
        return abs_err(self.out, self.refs[i % NSETS])


class BroadcastCase(Case):
    """One Broadcast per root, built once; call i broadcasts from root i % W, in place (the fast path): the
    root passes its input set, every other rank its receive tensor."""
    name = "broadcast"

    def __init__(self, ctx):
        import torch

        n, W = ctx.elems, ctx.W
        self.W, self.rank = W, ctx.rank
        self.shape = f"({n},), roots 0..{W - 1} in turn"
        self.ops = [tilescale.ops.Broadcast((n,), ctx.dtype, src) for src in range(W)]
        self.data = [[rand(("broadcast", r, j), (n,), ctx.dtype, 1.0, ctx.seed) for j in range(NSETS)]
                     for r in range(W)]
        self.mine = [t.clone() for t in self.data[ctx.rank]]
        self.recv = torch.empty(n, device=DEVICE, dtype=ctx.dtype)

    def _which(self, i):
        return i % self.W, (i // self.W) % NSETS

    def call(self, i):
        src, j = self._which(i)
        self.ops[src](self.mine[j] if src == self.rank else self.recv)

    def poison(self, i):
        self.recv.fill_(float("nan"))

    def error(self, i):
        src, j = self._which(i)
        return abs_err(self.mine[j] if src == self.rank else self.recv, self.data[src][j])

    def close(self):
        for op in self.ops:
            op.close()


CASES = {"gemm_rs": GemmRSCase, "ag_gemm": AGGemmCase, "all_gather": AllGatherCase,
         "all_reduce_one_shot": lambda ctx: AllReduceCase(ctx, "one_shot"),
         "all_reduce_two_shot": lambda ctx: AllReduceCase(ctx, "two_shot"),
         "reduce_scatter": ReduceScatterCase, "all_to_all": AllToAllCase, "broadcast": BroadcastCase}


# ------------------------------------------------------------------------------------------- the soak
def soak(case, ctx, args, budget_s: float) -> dict:
    """--iters calls of `case`, checked every --check-every; returns its record (every rank the same)."""
    W = ctx.W
    checks = []
    failures = []
    i, t_start = 0, time.monotonic()
    truncated = False
    while i < args.iters:
        nxt = min(i + args.check_every, args.iters)
        t0 = time.monotonic()
        for k in range(i, nxt - 1):
            case.call(k)
        case.poison(nxt - 1)
        case.call(nxt - 1)
        tilescale.synchronize()
        block_s = time.monotonic() - t0
        err = case.error(nxt - 1)
        every = gather({"err": err, **memory(), "elapsed_s": time.monotonic() - t_start,
                        "us_per_call": block_s * 1e6 / (nxt - i)})
        i = nxt
        worst = max(every, key=lambda r: r["err"] if math.isfinite(r["err"]) else math.inf)
        merged = {"call": i, "err": max((r["err"] for r in every), key=lambda e: e if math.isfinite(e) else math.inf),
                  "per_rank": [{k: r[k] for k in ("allocated_mib", "symm_mib", "rss_mib")} for r in every],
                  "us_per_call": max(r["us_per_call"] for r in every),
                  "elapsed_s": max(r["elapsed_s"] for r in every)}
        for k in ("allocated_mib", "symm_mib", "rss_mib"):
            merged[k] = max(r[k] for r in every)
        checks.append(merged)
        if ctx.rank == 0 and not args.quiet:
            print(f"soak {case.name}: call {i:6d}/{args.iters}: {case.metric} {merged['err']:.3g}, allocated "
                  f"{merged['allocated_mib']:.1f} MiB, symmetric {merged['symm_mib']:.2f} MiB, RSS "
                  f"{merged['rss_mib']:.0f} MiB, {merged['us_per_call']:.1f} us/call", flush=True)
        if not merged["err"] <= case.tol:
            bad = [r for r, e in enumerate(every) if not e["err"] <= case.tol]
            failures.append(f"{case.name}: call {i}: {case.metric} {merged['err']:.3g} > tolerance {case.tol:g} on "
                            f"rank(s) {bad} (worst {worst['err']:.3g})")
            break   # a wrong op: no point soaking it further
        if budget_s > 0 and merged["elapsed_s"] >= budget_s and i < args.iters:
            truncated = True
            break
    wall = time.monotonic() - t_start
    base = checks[0]["per_rank"]
    drift = {k: max(c["per_rank"][r][k] - base[r][k] for c in checks for r in range(W))
             for k in ("allocated_mib", "symm_mib", "rss_mib")}
    tols = {"allocated_mib": args.alloc_tolerance_mib, "symm_mib": args.symm_tolerance_mib,
            "rss_mib": args.rss_tolerance_mib}
    grew = {k: v for k, v in drift.items() if v > tols[k] + 1e-9}
    if grew:
        failures.append(f"{case.name}: memory grew after the first check (call {checks[0]['call']}) by more than the "
                        "tolerance: " + ", ".join(f"{k} {v:+.2f} MiB (tolerance {tols[k]})" for k, v in grew.items()))
    return dict(op=case.name, shape=case.shape, calls=i, checks=checks, n_checks=len(checks),
                max_err=max((c["err"] for c in checks), key=lambda e: e if math.isfinite(e) else math.inf),
                metric=case.metric, tolerance=case.tol, drift_mib=drift, wall_s=wall, truncated=truncated,
                failures=failures)


# ---------------------------------------------------------------------------------------- random stream
def orphans(baseline: set) -> list:
    """Live symmetric allocations made since `baseline` that no op held by the functions' caches owns."""
    import torch

    from tilescale import runtime, symm
    from tilescale.ops import op_cache

    reg = symm._registry(runtime.current())
    owned = set()

    def visit(v, depth=0):
        if isinstance(v, torch.Tensor):
            if v.numel():
                a = reg.find(v.data_ptr())
                if a is not None:
                    owned.add(a.base)
        elif isinstance(v, (list, tuple)) and depth < 2:
            for u in v:
                visit(u, depth + 1)

    for cache in op_cache._CACHES:
        for op in list(cache.entries.values()):
            for v in vars(op).values():
                visit(v)
    return [reg.by_base[b] for b in sorted(set(reg.by_base) - baseline - owned)]


def random_stream(ctx, args) -> dict:
    import torch

    F = tilescale.ops     # the torch-like functions: all_gather, all_reduce, reduce_scatter_tensor, ...
    W, me, dt = ctx.W, ctx.rank, ctx.dtype
    pools, calls = stream_plan(W, args)

    def data(c, r, shape):
        return rand(("stream", c, r), shape, dt, 1.0, ctx.seed)

    baseline = live_symm_bases()
    before = memory()
    pending, failures, counts = [], [], {}
    max_err, t0 = 0.0, time.monotonic()

    def check_pending():
        nonlocal max_err
        tilescale.synchronize()
        errs = []
        for c, _kind, desc, got, ref in pending:
            e = abs_err(got, ref())
            errs.append((e if math.isfinite(e) else math.inf, c, desc))
        pending.clear()
        worst = max(errs, default=(0.0, -1, ""))
        every = gather(worst)
        w = max(every)
        max_err = max(max_err, w[0])
        if w[0] > 0:
            bad = [r for r, e in enumerate(every) if e[0] > 0]
            failures.append(f"random stream: call {w[1]} ({w[2]}): max abs err {w[0]:.3g} (exact expected) on rank(s) "
                            f"{bad}")

    for c, (kind, k, extra) in enumerate(calls):
        p = pools[kind][k]
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "all_gather":
            got = F.all_gather(data(c, me, p))
            pending.append((c, kind, f"all_gather {p}", got,
                            lambda c=c, p=p: torch.cat([data(c, r, p) for r in range(W)])))
        elif kind == "all_reduce":
            t = data(c, me, (p,))
            F.all_reduce(t, algo=extra)
            pending.append((c, kind, f"all_reduce ({p},) {extra}", t,
                            lambda c=c, p=p: rank_sum([data(c, r, (p,)) for r in range(W)], dt)))
        elif kind == "reduce_scatter":
            out = torch.full((p,), float("nan"), device=DEVICE, dtype=dt)
            F.reduce_scatter_tensor(out, data(c, me, (W * p,)))
            pending.append((c, kind, f"reduce_scatter_tensor ({W * p},)", out,
                            lambda c=c, p=p: rank_sum([data(c, r, (W * p,))[me * p:(me + 1) * p] for r in range(W)],
                                                      dt)))
        elif kind == "broadcast":
            t = data(c, me, (p,)) if me == extra else torch.full((p,), float("nan"), device=DEVICE, dtype=dt)
            F.broadcast(t, extra)
            pending.append((c, kind, f"broadcast ({p},) src={extra}", t, lambda c=c, p=p, s=extra: data(c, s, (p,))))
        elif kind == "all_to_all":
            rows, cols = p
            out = torch.full((W * rows, cols), float("nan"), device=DEVICE, dtype=dt)
            F.all_to_all_single(out, data(c, me, (W * rows, cols)))
            pending.append((c, kind, f"all_to_all_single ({W * rows}, {cols})", out,
                            lambda c=c, rows=rows, cols=cols: torch.cat(
                                [data(c, r, (W * rows, cols))[me * rows:(me + 1) * rows] for r in range(W)])))
        else:   # variable splits: matrix[s][p] rows from rank s to rank p
            cols, m = p, extra
            send = m[me]
            recv = [m[s][me] for s in range(W)]
            out = torch.full((sum(recv), cols), float("nan"), device=DEVICE, dtype=dt)
            F.all_to_all_single(out, data(c, me, (sum(send), cols)), recv, send)

            def ref(c=c, cols=cols, m=m):
                parts = []
                for s in range(W):
                    lo = sum(m[s][:me])
                    parts.append(data(c, s, (sum(m[s]), cols))[lo:lo + m[s][me]])
                return torch.cat(parts)
            pending.append((c, kind, f"all_to_all_single splits recv={recv} cols={cols}", out, ref))
        if len(pending) >= args.random_check_every:
            check_pending()
            if failures:
                break
    if pending:
        check_pending()
    wall = time.monotonic() - t0
    torch.cuda.synchronize()
    after = memory()
    left = orphans(baseline)
    every = gather((len(left), sum(a.nbytes for a in left), [f"{a.shape} {a.dtype} at {a.where}" for a in left[:3]]))
    n_orphans = max(e[0] for e in every)
    if n_orphans:
        failures.append(f"random stream: {n_orphans} symmetric allocation(s) ({max(e[1] for e in every)} bytes) made "
                        f"during the stream are owned by no cached op (left behind by evicted ops?): "
                        f"{next(e[2] for e in every if e[0])}")
    mem = gather((before, after))
    from tilescale.ops import op_cache

    return dict(op="random", shape=f"{len(calls)} calls, {args.random_pool} shapes per function", calls=len(calls),
                n_checks=-(-len(calls) // args.random_check_every), max_err=max_err, metric="max abs err",
                tolerance=0.0, wall_s=wall, counts=counts, orphans=n_orphans,
                cached_ops=sum(len(c) for c in op_cache._CACHES),
                before=[b for b, _ in mem], after=[a for _, a in mem], failures=failures, truncated=False)


# ------------------------------------------------------------------------------------------------ run
class Ctx:
    pass


def run(info, args):
    import torch

    from tilescale.ops import prebuild
    from tilescale.ops.vectors import sm_count

    ctx = Ctx()
    ctx.W, ctx.rank, ctx.seed = info.world_size, info.rank, args.seed
    ctx.dtype = getattr(torch, args.dtype)
    ctx.elems, ctx.gemm_shape = args.elems, args.gemm_shape
    t_start = time.monotonic()
    prebuild.on_local_rank0(jobs(ctx.W, sm_count(), args))
    records = []
    todo = [o for o in ALL if o in args.ops]
    for n, name in enumerate(todo):
        if name == "random":
            records.append(random_stream(ctx, args))
            continue
        spent = max(gather(time.monotonic() - t_start))
        weight = len([o for o in todo[n:] if o != "random"]) + (0.5 if "random" in todo[n:] else 0.0)
        budget = max(1.0, (args.budget_s - spent) / weight) if args.budget_s > 0 else 0.0
        before = memory()
        case = CASES[name](ctx)
        case.call(0)          # the first call agrees the signature across ranks (host collectives)
        tilescale.synchronize()
        rec = soak(case, ctx, args, budget)
        rec["before_build"] = gather(before)
        case.close()
        records.append(rec)
        if rec["truncated"] and ctx.rank == 0:
            print(f"soak {name}: stopped at call {rec['calls']} of {args.iters}: its share of --budget-s "
                  f"{args.budget_s:g} ({budget:.0f} s) is spent", flush=True)
    wall = time.monotonic() - t_start
    failures = [f for r in records for f in r["failures"]]
    if ctx.rank == 0:
        rows = []
        for r in records:
            if r["op"] == "random":
                b = max(x["allocated_mib"] for x in r["before"]), max(x["symm_mib"] for x in r["before"])
                a = max(x["allocated_mib"] for x in r["after"]), max(x["symm_mib"] for x in r["after"])
                rs = max(x["rss_mib"] for x in r["before"]), max(x["rss_mib"] for x in r["after"])
                mem = [f"{b[0]:.1f} / {a[0]:.1f}", f"{b[1]:.2f} / {a[1]:.2f}", f"{rs[0]:.0f} / {rs[1]:.0f}"]
                us = "-"
            else:
                c0, c1 = r["checks"][0], r["checks"][-1]
                mem = [f"{c0[k]:.{p}f} / {c1[k]:.{p}f}" for k, p in (("allocated_mib", 1), ("symm_mib", 2),
                                                                     ("rss_mib", 0))]
                us = f"{sum(c['us_per_call'] for c in r['checks']) / len(r['checks']):.1f}"
            rows.append([r["op"], r["shape"], r["calls"] if not r["truncated"] else f"{r['calls']} (budget)",
                         r["n_checks"], f"{r['max_err']:.3g} ({'exact' if r['tolerance'] == 0 else r['tolerance']})",
                         *mem, f"{r['wall_s']:.1f}", us, "FAIL" if r["failures"] else "ok"])
        print_table(f"soak of tilescale ops, {args.dtype}, {ctx.W} ranks on {environment()['gpu']}"
                    f"{' (ranks share GPUs)' if tilescale.runtime.shares_gpu() else ''}: {wall:.0f} s; figures: max "
                    "over ranks; memory at the first / last check (random: before / after the stream)",
                    ["op", "shape", "calls", "checks", "max err (tol)", "allocated MiB", "symmetric MiB", "RSS MiB",
                     "wall s", "us/call", "verdict"], rows)
        for f in failures:
            print(f"FAIL {f}", flush=True)
        write_json(args.json, dict(env=environment(), shared_gpu=tilescale.runtime.shares_gpu(), args={
            k: v for k, v in vars(args).items() if k != "json"}, wall_s=wall, ops=records, failures=failures,
            ok=not failures))
    if failures:
        raise AssertionError(f"[rank {ctx.rank}] soak failed: " + "; ".join(failures))
    main = [r for r in records if r["op"] != "random"]
    rnd = [r for r in records if r["op"] == "random"]
    done = ", ".join(f"{r['op']} x{r['calls']}" for r in main)
    stream = f", random stream of {rnd[0]['calls']} calls" if rnd else ""
    print(f"[rank {ctx.rank}] OK: soak of {len(main)} op(s) ({done}){stream} over {ctx.W} ranks: results match the "
          "references, memory flat", flush=True)


def build(world_size: int, args) -> None:
    """Compile every kernel of the soak for `world_size` ranks (sm_90a, 132 SMs), without a GPU."""
    import concurrent.futures as cf

    js = jobs(world_size, 132, args)
    t0 = time.monotonic()
    tirs = [(fn, fn.get_tir(*a)) for fn, a in js]      # elaborated in this thread, compiled in threads
    opts = lambda fn: dict(target=fn.target, pass_configs=fn.pass_configs, compile_flags=fn.compile_flags,  # noqa: E731
                           build_mode=fn.build_mode, wait_timeout_s=fn.wait_timeout_s)
    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        for r in ex.map(lambda t: tilescale.build(t[1], **opts(t[0])), tirs):
            print(f"built {r.library}")
    print(f"soak_collectives: {len(js)} kernels for world size {world_size} in {time.monotonic() - t0:.0f} s")


def parse_shape(s: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {s!r}, expected MxNxK, e.g. 1024x512x512") from None
    return M, N, K


def parse_ops(s: str) -> tuple:
    ops = tuple(o.strip() for o in s.split(",") if o.strip())
    bad = [o for o in ops if o not in ALL]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"got {s!r}, expected a comma-separated subset of {','.join(ALL)}")
    return ops


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10000, help="calls of each op (default 10000)")
    ap.add_argument("--check-every", type=int, default=500, help="calls between checks (default 500)")
    ap.add_argument("--ops", type=parse_ops, default=ALL, help=f"subset of {','.join(ALL)} (default: all)")
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    ap.add_argument("--elems", type=int, default=1 << 16, help="elements per rank of the collectives (default 65536)")
    ap.add_argument("--gemm-shape", type=parse_shape, default=(1024, 512, 512),
                    help="MxNxK of AGGemm (M: gathered rows) and GemmRS (K: its K per rank, the full K is W x K) "
                         "(default 1024x512x512)")
    ap.add_argument("--random-calls", type=int, default=200, help="calls of the random stream (default 200)")
    ap.add_argument("--random-pool", type=int, default=12,
                    help="shapes per function in the random stream (default 12: below the caches' 16 ops; above "
                         "16 the caches evict, and all_gather's cache drops evicted ops without freeing their "
                         "symmetric buffers (close_evicted=False), which the stream's leak check reports)")
    ap.add_argument("--random-check-every", type=int, default=20, help="stream calls between checks (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alloc-tolerance-mib", type=float, default=1.0,
                    help="allowed growth of torch.cuda.memory_allocated after the first check (default 1)")
    ap.add_argument("--symm-tolerance-mib", type=float, default=0.0,
                    help="allowed growth of the symmetric heap in use after the first check (default 0)")
    ap.add_argument("--rss-tolerance-mib", type=float, default=32.0,
                    help="allowed growth of the process RSS after the first check (default 32)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="wall-time budget of the whole soak: each op stops at a check once its share is spent "
                         "(0: none)")
    ap.add_argument("--quiet", action="store_true", help="no line per check")
    ap.add_argument("--json")
    return ap


def parse_args(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    if min(a.iters, a.check_every, a.elems, a.random_pool, a.random_check_every) < 1 or a.random_calls < 0:
        ap.error("--iters, --check-every, --elems, --random-pool and --random-check-every must be positive, "
                 "--random-calls non-negative")
    return a


if __name__ == "__main__":
    a = parse_args()
    tilescale.testing.example_main(lambda info: run(info, a), lambda ws: build(ws, a))
