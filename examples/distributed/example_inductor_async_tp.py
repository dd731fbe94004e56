"""Inductor's micro-pipeline TP pass on tilescale: a tensor-parallel transformer block written with torch's
functional collectives, compiled with the pass on and ``tilescale.pytorch.use_for_inductor_async_tp()``
installed, so that the fused ops the pass puts in the graph run tilescale's AG+GEMM and GEMM+RS.

    GPUS=2 bash launch.sh examples/distributed/example_inductor_async_tp.py [--batch 2 --seq 1024 --hidden 1024
                                                                           --heads 16 --ffn 4096 --iters 20]

The block (sequence parallel, batch first: every rank holds x of shape (batch, seq / W, hidden); attention heads
and the FFN split over the ranks; :func:`block`)::

    h = all_gather(layer_norm(x), dim=1)                                  # (batch, seq, hidden)
    x = x + reduce_scatter(attention(h @ Wq_r, h @ Wk_r, h @ Wv_r) @ Wo_r, dim=1)
    h = all_gather(layer_norm(x), dim=1)
    y = x + reduce_scatter((silu(h @ W1_r) * (h @ W3_r)) @ W2_r, dim=1)

Inductor rewrites each all-gather and the matmuls that read it into one ``torch.ops.symm_mem.fused_all_gather_matmul``
(three Bs, then two: tilescale runs each as one AG+GEMM over the concatenated Bs) and each matmul + reduce-scatter
into ``fused_matmul_reduce_scatter`` (gather and scatter along dim 1). Every rank checks, in bf16:

1. the compiled block (pass on, tilescale's kernels) against the same block run eagerly with torch.distributed's
   collectives (NCCL; gloo on host copies where ranks share a GPU), within a relative error (Frobenius norm of the
   difference / norm of the reference) of 2e-2;
2. that the compiled block's fused ops ran on tilescale: two all-gather and two reduce-scatter calls per forward,
   none sent on to torch's kernels (the switch's call counts);
3. where every rank has a GPU of its own (torch's symmetric memory needs that): the same compiled graph with the
   switch removed (torch's own async-TP kernels), also against eager (a failure of torch's kernels is printed as a
   note, not raised).

Then it times (``--iters`` calls each, CUDA events, the median; the slowest rank's): the compiled block on tilescale's
kernels, on torch's async-TP kernels (one GPU per rank only) and the eager block, and prints them on rank 0.
Forward only. A CPU test (tests/test_async_tp_cpu.py) compiles this :func:`block` with the pass on, in a simulated
world of 2 ranks, and checks that the compiled code calls the fused ops and that they reach tilescale.
"""
import argparse
import statistics

from tilescale import testing

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

TOL = 2e-2          # bf16, compiled against eager: relative Frobenius error


# ------------------------------------------------------------------------------------------ the block
def funcol_collectives(group_name: str):
    """(gather, scatter): torch's functional all-gather / reduce-scatter (sum) over `group_name` along a dim, the
    collectives Inductor's micro-pipeline TP pass fuses with the matmuls next to them."""
    import torch.distributed._functional_collectives as funcol

    gather_fn = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor       # torch 2.14's names
    scatter_fn = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor

    def gather(t, dim):     # along dim 0, then chunk and cat: the pattern the pass matches for another dim (torch
        if dim == 0:        # 2.11's funcol does this in _maybe_view_chunk_cat, which Dynamo does not trace)
            return gather_fn(t, 0, group_name)
        import torch

        return torch.cat(gather_fn(t, 0, group_name).chunk(torch.distributed.get_world_size(), dim=0), dim=dim)

    def scatter(t, dim):
        return scatter_fn(t, "sum", dim, group_name)

    return gather, scatter


def torch_collectives():
    """(gather, scatter) along a dim with torch.distributed's all_gather_into_tensor / reduce_scatter_tensor (NCCL;
    gloo on host copies where ranks share a GPU): the eager reference's collectives."""
    import torch.distributed as dist

    from tilescale import staged_collectives

    d, W = staged_collectives.for_cuda(), dist.get_world_size()

    def gather(t, dim):
        t0 = t.movedim(dim, 0).contiguous()
        out = t0.new_empty((W * t0.shape[0], *t0.shape[1:]))
        d.all_gather_into_tensor(out, t0)
        return out.movedim(0, dim)

    def scatter(t, dim):
        t0 = t.movedim(dim, 0).contiguous()
        out = t0.new_empty((t0.shape[0] // W, *t0.shape[1:]))
        d.reduce_scatter_tensor(out, t0)
        return out.movedim(0, dim)

    return gather, scatter


def block(x, p: dict, gather, scatter, heads: int):
    """This rank's part of the block: x (batch, seq / W, hidden) -> the same shape; `p`: this rank's weights
    (``ln1``, ``ln2`` (hidden,); ``wq``, ``wk``, ``wv`` (hidden, heads * hd); ``wo`` (heads * hd, hidden); ``w1``,
    ``w3`` (hidden, ffn / W); ``w2`` (ffn / W, hidden)), `heads` of them here; gather / scatter along a dim."""
    import torch.nn.functional as F

    H = x.shape[-1]
    h = gather(F.layer_norm(x, (H,), p["ln1"]), 1)
    b, s = h.shape[:2]

    def split_heads(t):
        return t.view(b, s, heads, -1).transpose(1, 2)

    q, k, v = (split_heads(h @ p[w]) for w in ("wq", "wk", "wv"))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
    x = x + scatter(a @ p["wo"], 1)
    h = gather(F.layer_norm(x, (H,), p["ln2"]), 1)
    return x + scatter((F.silu(h @ p["w1"]) * (h @ p["w3"])) @ p["w2"], 1)


def weights(rank: int, W: int, H: int, heads: int, Fd: int, device, dtype) -> dict:
    """This rank's weights: the whole block's from a seed (the same on every rank), its slices."""
    import torch

    g = torch.Generator(device=device).manual_seed(1234)
    hd = H // heads
    full = {
        "ln1": 1 + 0.1 * torch.randn(H, device=device, generator=g),
        "ln2": 1 + 0.1 * torch.randn(H, device=device, generator=g),
        **{w: torch.randn(H, H, device=device, generator=g) / H ** 0.5 for w in ("wq", "wk", "wv", "wo")},
        "w1": torch.randn(H, Fd, device=device, generator=g) / H ** 0.5,
        "w3": torch.randn(H, Fd, device=device, generator=g) / H ** 0.5,
        "w2": torch.randn(Fd, H, device=device, generator=g) / Fd ** 0.5,
    }
    cols = slice(rank * heads // W * hd, (rank + 1) * heads // W * hd)     # this rank's heads
    ffn = slice(rank * Fd // W, (rank + 1) * Fd // W)
    part = {"ln1": full["ln1"], "ln2": full["ln2"], "wq": full["wq"][:, cols], "wk": full["wk"][:, cols],
            "wv": full["wv"][:, cols], "wo": full["wo"][cols], "w1": full["w1"][:, ffn], "w3": full["w3"][:, ffn],
            "w2": full["w2"][ffn]}
    return {k: v.to(dtype).contiguous() for k, v in part.items()}


def tokens(rank: int, W: int, batch: int, seq: int, H: int, device, dtype):
    """This rank's tokens: (batch, seq / W, H), from a seed per rank."""
    import torch

    g = torch.Generator(device=device).manual_seed(99 + rank)
    return torch.randn(batch, seq // W, H, device=device, generator=g).to(dtype)


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------------------------ run
def median_ms(fn, iters: int) -> float:
    """The median time of `iters` calls of fn() on this rank (CUDA events; a barrier first)."""
    import torch
    import torch.distributed as dist

    fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def slowest(ms: float) -> float:
    """The largest of every rank's `ms`."""
    import torch
    import torch.distributed as dist

    from tilescale import staged_collectives

    t = torch.tensor([ms], device="cuda")
    staged_collectives.for_cuda().all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def torch_async_tp(compiled, x, want, iters: int, rank: int) -> str:
    """The compiled block (its graph compiled with the pass) on torch's own async-TP kernels (the switch removed):
    checked against eager and timed; what to print. A failure of torch's kernels is reported, not raised (it is the
    comparison's, not tilescale's)."""
    try:
        got = compiled(x)
        e = rel_err(got, want)
        if not e <= TOL:
            raise AssertionError(f"relative error to eager {e:.3g} > {TOL}")
        ms = slowest(median_ms(lambda: compiled(x), iters))
    except Exception as err:  # noqa: BLE001
        testing.say(f"[rank {rank}] note: the compiled block on torch's async-TP failed ({type(err).__name__}: "
                    f"{str(err)[:300]})")
        return "failed (see the note)"
    return f"{ms:.3f} ms (relative error to eager {e:.1e})"


def run(info, batch: int, seq: int, H: int, heads: int, Fd: int, iters: int) -> None:
    import functools

    import torch
    import torch.distributed as dist

    import tilescale
    from tilescale import staged_collectives
    from tilescale.ops import prebuild

    rank, W = info.rank, info.world_size
    if seq % W or heads % W or Fd % W or H % heads:
        raise SystemExit(f"--seq {seq}, --heads {heads} and --ffn {Fd} must be multiples of the world size {W}, "
                         f"--hidden {H} of --heads")
    device, bf = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    prebuild.on_local_rank0(fused_jobs(W, batch, seq, H, heads, Fd))
    p = weights(rank, W, H, heads, Fd, device, bf)
    x = tokens(rank, W, batch, seq, H, device, bf)
    gather, scatter = funcol_collectives(dist.group.WORLD.group_name)      # what the pass fuses
    traced = functools.partial(block, p=p, gather=gather, scatter=scatter, heads=heads // W)
    gather, scatter = torch_collectives()
    reference = functools.partial(block, p=p, gather=gather, scatter=scatter, heads=heads // W)
    with torch.no_grad():
        want = reference(x)
        with tilescale.pytorch.use_for_inductor_async_tp() as switch:
            compiled = torch.compile(traced, fullgraph=True)
            got = compiled(x)
            served = dict(switch.calls)
            t_ts = slowest(median_ms(lambda: compiled(x), iters))
        expected = {"fused_all_gather_matmul": 2, "fused_matmul_reduce_scatter": 2}
        if served != expected:
            raise AssertionError(f"[rank {rank}] the compiled block's first call: fused calls {served}, expected "
                                 f"{expected} (Inductor's pass rewrote fewer collectives, or tilescale sent some on "
                                 "to torch's kernels)")
        e = rel_err(got, want)
        if not e <= TOL:
            raise AssertionError(f"[rank {rank}] compiled on tilescale vs eager: relative error {e:.3g} > {TOL}")
        t_eager = slowest(median_ms(lambda: reference(x), iters))
        torch_note = "not run: ranks share a GPU (torch's symmetric memory needs one each)"
        if not staged_collectives.needs_staging():
            torch_note = torch_async_tp(compiled, x, want, iters, rank)
    testing.say(f"[rank {rank}] OK: TP block (batch {batch}, seq {seq}, hidden {H}, {heads} heads, ffn {Fd}) "
                f"compiled with Inductor's micro-pipeline TP pass on tilescale: {served} fused calls, relative error "
                f"to eager {e:.1e}")
    if rank == 0:
        testing.say(f"[rank 0] timing (median of {iters}, slowest rank, {W} ranks): compiled on tilescale "
                    f"{t_ts:.3f} ms; compiled on torch's async-TP {torch_note}; eager {t_eager:.3f} ms")


def fused_jobs(W: int, batch: int, seq: int, H: int, heads: int, Fd: int) -> list:
    """(jit kernel, args) of the fused kernels the compiled block runs: AG+GEMM of the rows gathered along dim 1
    (batch * seq / W per rank, padded to whole 128-row tiles) with the concatenated q, k, v and w1, w3; GEMM+RS of
    the attention output and of the FFN (K split over the ranks)."""
    from tilescale.ops import prebuild
    from tilescale.ops.gemm import padded_rows

    M = W * padded_rows(batch * seq // W)
    qkv, ffn = 3 * H // W, 2 * Fd // W
    return prebuild.unique(prebuild.ag_gemm_jobs([(M, H, qkv), (M, H, ffn)], W)
                           + prebuild.gemm_rs_jobs([(M, H, H), (M, Fd, H)], W))


def build(world_size: int, batch: int = 2, seq: int = 1024, H: int = 1024, heads: int = 16, Fd: int = 4096) -> None:
    """Compile-only (no GPU): the fused kernels of the compiled block."""
    import tilescale

    tilescale.build_all(fused_jobs(world_size, batch, seq, H, heads, Fd))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024, help="tokens of a sequence (seq / W per rank)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20, help="timed calls of each variant")
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.batch, a.seq, a.hidden, a.heads, a.ffn, a.iters),
                         lambda ws: build(ws, a.batch, a.seq, a.hidden, a.heads, a.ffn))


# ------------------------------------------------------------------------------------------ tests
if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_inductor_async_tp_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, "--seq", "512", "--hidden", "512", "--heads", "8", "--ffn", "1024",
                              "--iters", "5", timeout=440)
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    main()
