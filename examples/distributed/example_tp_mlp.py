"""A tensor-parallel MLP, forward and backward, run with torch.distributed and with tilescale.distributed:
the same program gives the same results.

    GPUS=2 bash launch.sh examples/distributed/example_tp_mlp.py [--tokens 256 --hidden 1024 --ffn 4096]

The program (:func:`tp_mlp`) takes the ``dist`` module as an argument and uses only torch.distributed's
API, in two layouts of y = gelu(x @ W1) @ W2 with W1 split by columns and W2 by rows over the ranks:

* ``allreduce`` (Megatron): x replicated; y = all_reduce(gelu(x @ W1_r) @ W2_r); backward all-reduces dx;
* ``sequence`` (sequence parallel): x split by tokens; all_gather_into_tensor(x) before, and
  reduce_scatter_tensor(...) after; backward: all_gather of dy, reduce_scatter of dx.

Every rank runs it (fp32 and bf16) with ``torch.distributed`` (the reference), then with
``tilescale.distributed`` started with ``use_tilescale=True``: with the default selection (tuning
table; NCCL wherever tilescale was not measured to win: bitwise equal to the reference when every call
went to NCCL), and with ``hints={"prefer": "tilescale"}`` (every collective served by a tilescale kernel,
checked through ``dist.stats()``; equal to the reference within rounding). Then, with tilescale
preferred: async_op + wait(), broadcast, all_to_all_single, an explicit plan id, and calls that fall
back to NCCL (a split_group subgroup, op=MAX, float64) against torch. Outputs of every
collective are poisoned (NaN) before the call. The reference is also checked against the MLP computed
on one rank. ``--cpu`` runs the same on CPU tensors over gloo (no tilescale kernels: the passthrough).

With several ranks on one GPU (the shared-GPU mode, ``TILESCALE_RANKS_PER_GPU``) NCCL cannot run:
``init_process_group("nccl", ...)`` starts gloo instead, and both the reference and the calls that fall
back to "NCCL" run gloo on host copies of the CUDA tensors (:mod:`tilescale.staged_collectives`).
"""
import argparse
import os

from tilescale import testing

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None


# --------------------------------------------------------------------------- the program under test
def _autograd_ops():
    import torch

    class CopyToTP(torch.autograd.Function):
        """forward: identity; backward: all_reduce of the gradient (Megatron's f)."""

        @staticmethod
        def forward(ctx, x, dist):
            ctx.dist = dist
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous().clone()
            ctx.dist.all_reduce(g)
            return g, None

    class ReduceFromTP(torch.autograd.Function):
        """forward: all_reduce; backward: identity (Megatron's g)."""

        @staticmethod
        def forward(ctx, x, dist):
            y = x.contiguous().clone()
            dist.all_reduce(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return g, None

    def gather(dist, x):
        W = dist.get_world_size()
        out = torch.full((W * x.shape[0], *x.shape[1:]), float("nan"), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        return out

    def scatter(dist, x):
        W = dist.get_world_size()
        out = torch.full((x.shape[0] // W, *x.shape[1:]), float("nan"), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, x.contiguous())
        return out

    class GatherSeq(torch.autograd.Function):
        """forward: all_gather_into_tensor over tokens; backward: reduce_scatter_tensor."""

        @staticmethod
        def forward(ctx, x, dist):
            ctx.dist = dist
            return gather(dist, x)

        @staticmethod
        def backward(ctx, g):
            return scatter(ctx.dist, g), None

    class ScatterSeq(torch.autograd.Function):
        """forward: reduce_scatter_tensor over tokens; backward: all_gather_into_tensor."""

        @staticmethod
        def forward(ctx, x, dist):
            ctx.dist = dist
            return scatter(dist, x)

        @staticmethod
        def backward(ctx, g):
            return gather(ctx.dist, g), None

    return CopyToTP, ReduceFromTP, GatherSeq, ScatterSeq


def tp_mlp(dist, x, w1, w2, layout: str):
    """y = gelu(x @ W1) @ W2 with W1 (H, F/W) and W2 (F/W, H) this rank's shards; see the module docstring."""
    import torch.nn.functional as F

    CopyToTP, ReduceFromTP, GatherSeq, ScatterSeq = _autograd_ops()
    if layout == "allreduce":
        h = F.gelu(CopyToTP.apply(x, dist) @ w1)
        return ReduceFromTP.apply(h @ w2, dist)
    h = F.gelu(GatherSeq.apply(x, dist) @ w1)
    return ScatterSeq.apply(h @ w2, dist)


# ------------------------------------------------------------------------------------------- data
def full_params(H: int, Fdim: int, device):
    """The unsharded weights and the whole input, the same on every rank (fp32)."""
    import torch

    g = torch.Generator(device=device).manual_seed(2024)
    w1 = torch.randn(H, Fdim, device=device, generator=g) / H ** 0.5
    w2 = torch.randn(Fdim, H, device=device, generator=g) / Fdim ** 0.5
    return w1, w2


def full_data(T: int, H: int, device):
    import torch

    g = torch.Generator(device=device).manual_seed(7)
    return torch.randn(T, H, device=device, generator=g), torch.randn(T, H, device=device, generator=g)


def step(dist, layout, dtype, rank, W, T, H, Fdim, device) -> dict:
    """One forward + backward of this rank's part; returns the output and the gradients."""
    w1f, w2f = full_params(H, Fdim, device)
    xf, dyf = full_data(T, H, device)
    fs = slice(rank * Fdim // W, (rank + 1) * Fdim // W)
    ts = slice(rank * T // W, (rank + 1) * T // W) if layout == "sequence" else slice(None)
    x = xf[ts].to(dtype).requires_grad_()
    w1 = w1f[:, fs].to(dtype).contiguous().requires_grad_()
    w2 = w2f[fs].to(dtype).contiguous().requires_grad_()
    y = tp_mlp(dist, x, w1, w2, layout)
    y.backward(dyf[ts].to(dtype))
    return {"y": y.detach(), "dx": x.grad, "dw1": w1.grad, "dw2": w2.grad}


def single_rank_reference(layout, rank, W, T, H, Fdim, device) -> dict:
    """The same step computed on one rank without communication, in float64."""
    import torch.nn.functional as F

    w1f, w2f = (t.double() for t in full_params(H, Fdim, device))
    xf, dyf = (t.double() for t in full_data(T, H, device))
    x, w1, w2 = (t.clone().requires_grad_() for t in (xf, w1f, w2f))
    y = F.gelu(x @ w1) @ w2
    y.backward(dyf)
    fs = slice(rank * Fdim // W, (rank + 1) * Fdim // W)
    ts = slice(rank * T // W, (rank + 1) * T // W) if layout == "sequence" else slice(None)
    return {"y": y.detach()[ts], "dx": x.grad[ts], "dw1": w1.grad[:, fs], "dw2": w2.grad[fs]}


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(what, got: dict, want: dict, rank, tol: float) -> None:
    for k in want:
        if got[k].shape != want[k].shape:
            raise AssertionError(f"[rank {rank}] {what} {k}: shape {tuple(got[k].shape)} != {tuple(want[k].shape)}")
        if not got[k].isfinite().all():
            raise AssertionError(f"[rank {rank}] {what} {k}: non-finite values (a collective left its poison?)")
        if tol == 0:
            testing.check_close(f"{what} {k}", got[k], want[k], rank)
        elif not rel_err(got[k], want[k]) <= tol:
            raise AssertionError(f"[rank {rank}] {what} {k}: relative error {rel_err(got[k], want[k]):.3g} > {tol}")


# --------------------------------------------------------------------------------------------- run
def collective_jobs(W: int, T: int, H: int, dtypes=("float32", "bfloat16"), sms: int = 132) -> list:
    """(jit kernel, args) of the tilescale kernels this program launches when tilescale is preferred:
    compiled ahead in parallel (prebuild) instead of one after the other on first use."""
    from tilescale.ops import all_to_all, allgather, allreduce, prebuild, reduce_scatter
    from tilescale.ops import broadcast_from_root as broadcast
    from tilescale.ops.vectors import blocks_for

    one, two = allreduce.allreduce_one_shot_kernel, allreduce.allreduce_two_shot_kernel
    jobs = []
    for d in dtypes:
        nb = T * H * (4 if d == "float32" else 2)          # the (T, H) tensors of the MLP
        if nb <= allreduce.ONE_SHOT_MAX_BYTES:
            jobs.append((one, (W, blocks_for(nb, allreduce.ONE_SHOT_BLOCKS, sms), d)))
        else:
            jobs.append((two, (W, blocks_for(nb, allreduce.TWO_SHOT_BLOCKS, sms), d)))
        jobs.append((reduce_scatter.reduce_scatter_kernel, (W, blocks_for(nb, reduce_scatter.BLOCKS, sms), d)))
        jobs.append((allgather.allgather_kernel, (W, allgather.default_blocks_per_peer(nb // W, W, sms), d)))
        # extras: a 4096-element all_reduce with either algorithm
        small = 4096 * (4 if d == "float32" else 2)
        jobs.append((one, (W, blocks_for(small, allreduce.ONE_SHOT_BLOCKS, sms), d)))
        jobs.append((two, (W, blocks_for(small, allreduce.TWO_SHOT_BLOCKS, sms), d)))
    nb = 64 * H * 4                                         # broadcast and all_to_all of 64 x H floats
    jobs.append((broadcast.broadcast_kernel, (W, blocks_for(nb, broadcast.BLOCKS, sms))))
    jobs.append((all_to_all.all_to_all_kernel, (W, all_to_all.blocks_per_peer_for(nb, W, sms))))
    return prebuild.unique(jobs)


def run(rank: int, W: int, T: int, H: int, Fdim: int, device) -> None:
    import torch
    import torch.distributed as td

    import tilescale.distributed as dist
    from tilescale import staged_collectives
    from tilescale.plan import builtin

    on_gpu = device.type == "cuda"
    # the reference: torch.distributed (on GPUs: NCCL, or gloo on host copies where ranks share a GPU)
    ref_dist = staged_collectives.for_cuda() if on_gpu else td
    dtypes = (torch.float32, torch.bfloat16) if on_gpu else (torch.float32,)
    layouts = ("allreduce", "sequence")
    # 1. the reference: torch.distributed; itself checked against the MLP on one rank
    ref = {}
    for layout in layouts:
        for dt in dtypes:
            ref[layout, dt] = step(ref_dist, layout, dt, rank, W, T, H, Fdim, device)
        compare(f"torch.distributed {layout} fp32 vs one rank", ref[layout, torch.float32],
                single_rank_reference(layout, rank, W, T, H, Fdim, device), rank, tol=1e-4)
    # 2. tilescale.distributed, default selection
    dist.reset_stats()
    for (layout, dt), want in ref.items():
        got = step(dist, layout, dt, rank, W, T, H, Fdim, device)
        all_nccl = all(set(v) == {"nccl"} for v in dist.stats().values())
        compare(f"tilescale.distributed (default) {layout} {dt}", got, want, rank,
                tol=0 if all_nccl else (1e-5 if dt == torch.float32 else 2e-2))
    default_stats = dist.stats()
    # 3. tilescale preferred: tilescale kernels serve every collective of the MLP
    if on_gpu:
        from tilescale.ops import prebuild

        prebuild.on_local_rank0(collective_jobs(W, T, H))
    dist.set_hints({"prefer": "tilescale"})
    for (layout, dt), want in ref.items():
        dist.reset_stats()
        got = step(dist, layout, dt, rank, W, T, H, Fdim, device)
        st = dist.stats()
        if on_gpu:
            used = {"allreduce"} if layout == "allreduce" else {"allgather", "reduce_scatter"}
            bad = {c: v for c, v in st.items() if c in used and (set(v) & {"nccl"} or not v)}
            if set(st) != used or bad:
                raise AssertionError(f"[rank {rank}] {layout} {dt}: not every collective went to tilescale: {st}")
        compare(f"tilescale.distributed (tilescale) {layout} {dt}", got, want, rank,
                tol=1e-5 if dt == torch.float32 else 2e-2)
    extras(dist, ref_dist, builtin, rank, W, H, device, on_gpu)
    dist.set_hints(None)
    print(f"[rank {rank}] OK: TP MLP fwd/bwd ({', '.join(layouts)}; {', '.join(str(d)[6:] for d in dtypes)}) "
          f"with tilescale.distributed matches torch.distributed over {W} ranks; default selection "
          f"{default_stats}", flush=True)


def extras(dist, ref_dist, builtin, rank, W, H, device, on_gpu) -> None:
    """async_op, broadcast, all_to_all_single, explicit plan, and calls that fall back to NCCL (`ref_dist`: the
    reference collectives)."""
    import torch

    from tilescale import staged_collectives

    def data(seed, *shape):
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(*shape, device=device, generator=g)

    def served(coll, want_tilescale, what):
        st = dist.stats().get(coll, {})
        got = bool(set(st) - {"nccl"})
        if on_gpu and got != want_tilescale:
            raise AssertionError(f"[rank {rank}] {what}: expected {'tilescale' if want_tilescale else 'NCCL'}, "
                                 f"stats {st}")

    for dt in (torch.float32, torch.bfloat16) if on_gpu else (torch.float32,):
        x = data(100 + rank, 4096).to(dt)
        want = x.clone()
        ref_dist.all_reduce(want)
        # async work object
        dist.reset_stats()
        t = x.clone()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        testing.check_close(f"async all_reduce {dt}", t, want, rank, atol=1e-5 if dt == torch.float32 else 2e-2,
                            rtol=1e-5 if dt == torch.float32 else 2e-2)
        served("allreduce", True, "async all_reduce")
        # explicit plan: the two-shot kernel on a small message (default range: one-shot)
        if on_gpu:
            from tilescale import topology  # the plan is for this job's nodes (TILESCALE_NODE_SIZE: emulated ones)

            two = [p for p in builtin.catalog(W, topology.current().node_size, "allreduce")
                   if p.name.endswith("two_shot")][0]
            dist.reset_stats()
            t = x.clone()
            dist.all_reduce(t, plan=two.id)
            testing.check_close(f"explicit two_shot {dt}", t, want, rank, atol=1e-5 if dt == torch.float32 else 2e-2,
                                rtol=1e-5 if dt == torch.float32 else 2e-2)
            if dist.stats()["allreduce"] != {two.name: 1}:
                raise AssertionError(f"[rank {rank}] explicit plan not used: {dist.stats()}")
    # broadcast from the last rank (others poisoned)
    dist.reset_stats()
    root = W - 1
    b = data(300, 64, H) if rank == root else torch.full((64, H), float("nan"), device=device)
    dist.broadcast(b, src=root)
    testing.check_close("broadcast", b, data(300, 64, H), rank)
    served("broadcast", True, "broadcast")
    # all_to_all_single, equal splits
    dist.reset_stats()
    a_in = data(400 + rank, 64, H)
    a_out = torch.full_like(a_in, float("nan"))
    a_ref = torch.empty_like(a_in)
    dist.all_to_all_single(a_out, a_in)
    ref_dist.all_to_all_single(a_ref, a_in)
    testing.check_close("all_to_all_single", a_out, a_ref, rank)
    served("all_to_all", True, "all_to_all_single")
    # fall back to NCCL: a subgroup, op=MAX, float64 (no built-in kernel)
    halves = [list(range(W // 2)), list(range(W // 2, W))] if W > 1 else [[0]]
    if on_gpu and not staged_collectives.needs_staging():   # split_group needs NCCL: not where ranks share GPUs
        sub = dist.split_group(split_ranks=halves)
    else:
        groups = [dist.new_group(ranks=h) for h in halves]
        sub = groups[0] if rank in halves[0] else groups[-1]
    mine = halves[0] if rank in halves[0] else halves[-1]
    dist.reset_stats()
    s = data(500 + rank, 1000)
    dist.all_reduce(s, group=sub)
    testing.check_close("subgroup all_reduce", s, sum(data(500 + r, 1000) for r in mine), rank, atol=1e-5, rtol=1e-5)
    m = data(600 + rank, 1000)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    testing.check_close("all_reduce MAX", m, torch.stack([data(600 + r, 1000) for r in range(W)]).amax(0), rank)
    f64 = data(700 + rank, 1000).double()
    dist.all_reduce(f64)
    testing.check_close("float64 all_reduce", f64, sum(data(700 + r, 1000).double() for r in range(W)), rank,
                        atol=1e-12, rtol=1e-12)
    if dist.stats().get("allreduce", {}) != {"nccl": 3}:
        raise AssertionError(f"[rank {rank}] subgroup / MAX / float64: expected 3 NCCL calls, got {dist.stats()}")


def build(world_size: int) -> None:
    """Compile-only (no GPU): every tilescale kernel the program launches, for the default sizes."""
    import tilescale

    tilescale.build_all(collective_jobs(world_size, 256, 1024))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--cpu", action="store_true", help="CPU tensors over gloo (the passthrough; no GPU needed)")
    a = ap.parse_args(argv)
    from tilescale.env import settings

    if settings.compile_only and not a.cpu:
        build(int(os.environ.get("WORLD_SIZE", "4")))
        return
    import datetime

    import torch

    import tilescale.distributed as dist

    rank, W = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.tokens % W or a.ffn % W:
        raise SystemExit(f"--tokens {a.tokens} and --ffn {a.ffn} must be divisible by the world size {W}")
    if a.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", use_tilescale=True, timeout=datetime.timedelta(seconds=120))
    else:
        from tilescale import runtime

        # a GPU per rank; where ranks share GPUs (TILESCALE_RANKS_PER_GPU), the one tilescale gives this rank
        # (and then init_process_group starts gloo instead of NCCL, which refuses two ranks on one GPU)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", W))
        gpus = runtime.device_map(local_world, torch.cuda.device_count(), settings.ranks_per_gpu)
        device = torch.device("cuda", gpus[int(os.environ.get("LOCAL_RANK", rank))])
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", use_tilescale=True, device_id=device)
    try:
        run(rank, W, a.tokens, a.hidden, a.ffn, device)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ tests
def test_tp_mlp_cpu_gloo(tmp_path):
    """The program on CPU over gloo, 2 ranks: the passthrough, and the program's own checks."""
    import subprocess
    import sys

    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(testing.free_port()),
               TILESCALE_PLAN_DIR=str(tmp_path), PYTHONPATH=str(testing.REPO_ROOT))
    env.pop("TILESCALE_COMPILE_ONLY", None)
    procs = [subprocess.Popen([sys.executable, __file__, "--cpu", "--tokens", "64", "--hidden", "64", "--ffn", "128"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = "\n".join(outs)
    testing.assert_all_ranks_ok(subprocess.CompletedProcess([], max(p.returncode for p in procs), out), 2)


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_tp_mlp_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, timeout=600, env={"TILESCALE_DIST_DEBUG": "1"})
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    main()
