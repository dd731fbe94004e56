"""A tensor-parallel transformer MLP block with tilescale's fused ops as torch operators: forward and backward,
eager and under ``torch.compile(fullgraph=True)``, plus the async-TP drop-in.

    GPUS=2 bash launch.sh examples/distributed/example_tp_layer.py [--rows 200 --hidden 512 --ffn 1024]

The block (sequence parallel: every rank holds `rows` tokens of the T = W x rows; W1 split by columns, W2
by rows; LayerNorm weight replicated)::

    y = x + gemm_rs(gelu(ag_gemm(layer_norm(x), W1_r)), W2_r)
      = x + reduce_scatter(gelu(all_gather(layer_norm(x)) @ W1_r) @ W2_r)

``tilescale.ops.torch_ops.ag_gemm`` / ``gemm_rs`` are ``torch.ops.tilescale.*`` operators: the backward
runs GEMM+RS for dx and AG+GEMM for the gradient of the row-parallel input (tilescale/ops/torch_ops.py).
The default rows per rank (200) are not a multiple of 128: the fused ops pad them (the tail).

Every rank checks, in bf16, against the same block computed in fp32 on one rank with plain torch (weights
and inputs from seeds, identical on every rank; the LayerNorm weight's gradient all-reduced over ranks):
the output and the gradients of x, W1 and W2 must be within a relative error (Frobenius norm of the
difference / norm of the reference) of 2e-2 (bf16 rounding of the operands and of the GEMM outputs: ~5e-3
measured), the LayerNorm weight's gradient (a sum over all T tokens whose terms largely cancel: ~1.3e-2
measured) within 5e-2; eager and compiled (``--backend``, default inductor).

Then ``torch.library.opcheck`` of every operator, and the async-TP drop-in
(``tilescale.ops.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, 3-D inputs, gather and
scatter along dim 1, two B matrices) against ``torch.ops.symm_mem``'s ops where the ranks have GPUs of their
own; where they share a GPU (torch's symmetric memory needs one GPU per rank) that comparison is skipped
with a note, and the drop-in is checked against plain torch on data rebuilt from every rank's seed.
"""
import argparse

from tilescale import testing

try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

TOL = 2e-2          # bf16 vs the fp32 reference: relative Frobenius error
TOL_LN = 5e-2       # the LayerNorm weight's gradient (a sum over every token, with cancellation)


# ------------------------------------------------------------------------------------------ the block
def block(x, ln_w, w1, w2):
    """This rank's tokens x (rows, H) -> (rows, H); ln_w (H,), w1 (H, F/W), w2 (F/W, H): its shards."""
    import torch.nn.functional as F

    from tilescale.ops import torch_ops  # torch.ops.tilescale.* (imported here: it imports torch._dynamo)

    h = F.layer_norm(x, (x.shape[-1],), ln_w)
    h = F.gelu(torch_ops.ag_gemm(h, w1), approximate="tanh")   # column-parallel: (T, F/W)
    return x + torch_ops.gemm_rs(h, w2)                          # row-parallel: (rows, H)


def reference_block(x, ln_w, w1, w2):
    import torch.nn.functional as F

    return x + F.gelu(F.layer_norm(x, (x.shape[-1],), ln_w) @ w1, approximate="tanh") @ w2


def full_data(T: int, H: int, Fd: int, device):
    """Input, output gradient and weights of the whole block, the same on every rank (fp32)."""
    import torch

    g = torch.Generator(device=device).manual_seed(2025)
    x = torch.randn(T, H, device=device, generator=g)
    dy = torch.randn(T, H, device=device, generator=g)
    ln_w = 1 + 0.1 * torch.randn(H, device=device, generator=g)
    w1 = torch.randn(H, Fd, device=device, generator=g) / H ** 0.5
    w2 = torch.randn(Fd, H, device=device, generator=g) / Fd ** 0.5
    return x, dy, ln_w, w1, w2


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(what: str, got: dict, want: dict, rank: int) -> None:
    for k, w in want.items():
        tol = TOL_LN if k == "dln_w" else TOL
        g = got[k]
        if g.shape != w.shape:
            raise AssertionError(f"[rank {rank}] {what} {k}: shape {tuple(g.shape)} != {tuple(w.shape)}")
        if not g.float().isfinite().all():
            raise AssertionError(f"[rank {rank}] {what} {k}: non-finite values")
        e = rel_err(g, w)
        if not e <= tol:
            raise AssertionError(f"[rank {rank}] {what} {k}: relative error {e:.3g} > {tol}")


def reference(rank: int, W: int, rows: int, H: int, Fd: int, device) -> dict:
    """The block on every token, fp32, one rank, plain torch; this rank's slices."""
    x, dy, ln_w, w1, w2 = (t.clone().requires_grad_() for t in full_data(W * rows, H, Fd, device))
    y = reference_block(x, ln_w, w1, w2)
    y.backward(dy.detach())
    ts, fs = slice(rank * rows, (rank + 1) * rows), slice(rank * Fd // W, (rank + 1) * Fd // W)
    return {"y": y.detach()[ts], "dx": x.grad[ts], "dln_w": ln_w.grad, "dw1": w1.grad[:, fs], "dw2": w2.grad[fs]}


def tp_step(fn, rank: int, W: int, rows: int, H: int, Fd: int, device) -> dict:
    """Forward + backward of this rank's part with `fn` (the block, eager or compiled), bf16."""
    import torch

    from tilescale.ops import torch_ops

    x, dy, ln_w, w1, w2 = full_data(W * rows, H, Fd, device)
    ts, fs = slice(rank * rows, (rank + 1) * rows), slice(rank * Fd // W, (rank + 1) * Fd // W)
    bf = torch.bfloat16
    p = {"x": x[ts].to(bf), "ln_w": ln_w.to(bf), "w1": w1[:, fs].to(bf).contiguous(), "w2": w2[fs].to(bf).contiguous()}
    for t in p.values():
        t.requires_grad_()
    y = fn(p["x"], p["ln_w"], p["w1"], p["w2"])
    y.backward(dy[ts].to(bf))
    dln_w = torch_ops.all_reduce(p["ln_w"].grad.float())   # replicated weight: its gradient summed over ranks
    return {"y": y.detach(), "dx": p["x"].grad, "dln_w": dln_w, "dw1": p["w1"].grad, "dw2": p["w2"].grad}


# -------------------------------------------------------------------------------------------- opcheck
def opcheck_all(rank: int, W: int, rows: int, H: int, Fd: int, device) -> list:
    """torch.library.opcheck of every torch.ops.tilescale operator (every rank makes the same calls)."""
    import torch

    def t(seed, *shape, dtype=torch.bfloat16, grad=False):
        g = torch.Generator(device=device).manual_seed(seed + 1000 * rank)
        return torch.randn(*shape, device=device, generator=g).to(dtype).requires_grad_(grad)

    ops = torch.ops.tilescale
    fl = Fd // W
    splits = [p + 1 for p in range(W)]                       # rank r sends p + 1 rows to rank p
    cases = [
        (ops.all_gather, (t(1, 64, 32), W)),
        (ops.reduce_scatter, (t(2, 16 * W, 32), W)),
        (ops.all_reduce, (t(3, 64, 32, dtype=torch.float32),)),
        (ops.all_reduce_, (t(4, 64, 32),)),
        (ops.all_to_all_single, (t(5, 8 * W, 32), [], [])),
        (ops.all_to_all_single, (t(6, sum(splits), 32), [rank + 1] * W, splits)),
        (ops.broadcast, (t(7, 64, 32), W - 1)),
        (ops.ag_gemm, (t(8, rows, H, grad=True), t(9, H, fl, grad=True), W)),
        (ops.ag_gemm_gathered, (t(10, rows, H, grad=True), t(11, H, fl, grad=True), W)),
        (ops.gemm_rs, (t(12, W * rows, fl, grad=True), t(13, fl, H, grad=True), W)),
    ]
    done = []
    for op, args in cases:
        torch.library.opcheck(op, args)
        done.append(op._qualified_op_name.split("::")[-1])
    return done


# ------------------------------------------------------------------------------------ async-TP drop-in
def drop_in(rank: int, W: int, rows: int, H: int, Fd: int, device, compile_backend: str) -> str:
    """tilescale.ops.fused_* against torch.ops.symm_mem.fused_* (distinct GPUs) and plain torch."""
    import torch
    import torch.distributed as dist

    import tilescale
    from tilescale import staged_collectives

    bf = torch.bfloat16
    fl = Fd // W
    group_name = dist.group.WORLD.group_name

    def a_shard(r):          # (2, rows / 2, H): gathered along dim 1
        g = torch.Generator(device=device).manual_seed(300 + r)
        return torch.randn(2, rows // 2, H, device=device, generator=g).to(bf)

    def rs_input(r):         # (2, W * rows / 2, F / W): scattered along dim 1
        g = torch.Generator(device=device).manual_seed(400 + r)
        return torch.randn(2, W * rows // 2, fl, device=device, generator=g).to(bf)

    def weights(r):
        g = torch.Generator(device=device).manual_seed(500 + r)
        return ((torch.randn(H, fl, device=device, generator=g) / H ** 0.5).to(bf),
                (torch.randn(H, 64, device=device, generator=g) / H ** 0.5).to(bf),
                (torch.randn(fl, H, device=device, generator=g) / fl ** 0.5).to(bf))

    def both(A, Bs, X, B2):
        ag = tilescale.ops.fused_all_gather_matmul(A, Bs, 1, group_name, return_A=True)
        rs = tilescale.ops.fused_matmul_reduce_scatter(X, B2, "sum", 1, group_name)
        return ag, rs

    b1, b1x, b2 = weights(rank)
    A, X = a_shard(rank), rs_input(rank)
    (A_full, (c1, c2)), y = both(A, [b1, b1x], X, b2)
    (A_c, (c1_c, c2_c)), y_c = torch.compile(both, fullgraph=True, backend=compile_backend)(A, [b1, b1x], X, b2)
    # plain torch, fp32, on every rank's data rebuilt from its seed
    A_ref = torch.cat([a_shard(r).float() for r in range(W)], dim=1)
    y_ref = sum(rs_input(r).float() @ weights(r)[2].float() for r in range(W)).chunk(W, dim=1)[rank]
    testing.check_close("drop-in gathered A", A_full, A_ref.to(bf), rank)
    for what, (ag, ys) in (("eager", ((A_full, c1, c2), y)), ("compiled", ((A_c, c1_c, c2_c), y_c))):
        compare(f"drop-in {what}", {"A": ag[0], "c1": ag[1], "c2": ag[2], "y": ys},
                {"A": A_ref, "c1": A_ref @ b1.float(), "c2": A_ref @ b1x.float(), "y": y_ref}, rank)
    if staged_collectives.needs_staging():
        note = "torch.ops.symm_mem comparison skipped: ranks share a GPU (torch's symmetric memory needs one each)"
        print(f"[rank {rank}] note: {note}", flush=True)
        return "matches plain torch (torch.ops.symm_mem comparison skipped: ranks share a GPU)"
    import torch.distributed._symmetric_memory as symm_mem

    try:   # the reference: a failure of torch's op is reported, not taken for one of tilescale's
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(group_name)
        t_A, (t_c1, t_c2) = torch.ops.symm_mem.fused_all_gather_matmul(A, [b1, b1x], 1, group_name, return_A=True)
        t_y = torch.ops.symm_mem.fused_matmul_reduce_scatter(X, b2, "sum", 1, group_name)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"[rank {rank}] note: torch.ops.symm_mem failed ({type(e).__name__}: {str(e)[:300]}); the drop-in "
              "was compared with plain torch only", flush=True)
        return "matches plain torch (torch.ops.symm_mem failed: see the note)"
    testing.check_close("drop-in gathered A vs torch.ops.symm_mem", A_full, t_A, rank)
    compare("drop-in vs torch.ops.symm_mem", {"c1": c1, "c2": c2, "y": y}, {"c1": t_c1, "c2": t_c2, "y": t_y}, rank)
    return "matches plain torch and torch.ops.symm_mem"


# ------------------------------------------------------------------------------------------------ run
def fused_jobs(W: int, rows: int, H: int, Fd: int) -> list:
    """(jit kernel, args) of the fused kernels the block runs (rows padded to whole 128-row tiles)."""
    from tilescale.ops import prebuild
    from tilescale.ops.gemm import padded_rows

    M = W * padded_rows(rows)
    return prebuild.unique(prebuild.ag_gemm_jobs([(M, H, Fd // W)], W) + prebuild.gemm_rs_jobs([(M, Fd, H)], W))


def run(info, rows: int, H: int, Fd: int, compile_backend: str) -> None:
    import torch

    from tilescale.ops import prebuild

    rank, W = info.rank, info.world_size
    if rows % 2 or Fd % W:
        raise SystemExit(f"--rows {rows} must be even and --ffn {Fd} divisible by the world size {W}")
    device = torch.device("cuda", torch.cuda.current_device())
    prebuild.on_local_rank0(fused_jobs(W, rows, H, Fd))
    want = reference(rank, W, rows, H, Fd, device)
    compare("eager", tp_step(block, rank, W, rows, H, Fd, device), want, rank)
    compiled = torch.compile(block, fullgraph=True, backend=compile_backend)
    compare(f"torch.compile({compile_backend}, fullgraph=True)", tp_step(compiled, rank, W, rows, H, Fd, device),
            want, rank)
    checked = opcheck_all(rank, W, rows, H, Fd, device)
    how = drop_in(rank, W, rows, H, Fd, device, compile_backend)
    print(f"[rank {rank}] OK: TP MLP block fwd/bwd, T={W * rows} (tail: {rows} rows per rank) H={H} F={Fd}, eager "
          f"and torch.compile({compile_backend}, fullgraph=True) match fp32 torch within {TOL} ({TOL_LN} for the "
          f"LayerNorm weight's gradient); opcheck passed for {', '.join(checked)}; async-TP drop-in {how} over {W} "
          "ranks", flush=True)


def build(world_size: int, rows: int = 200, H: int = 512, Fd: int = 1024) -> None:
    """Compile-only (no GPU): the fused kernels of the block (the collectives build on first use)."""
    for fn, args in fused_jobs(world_size, rows, H, Fd):
        print(f"built {fn.build(*args).library}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200, help="tokens per rank (a tail when not a multiple of 128)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.rows, a.hidden, a.ffn, a.backend),
                         lambda ws: build(ws, a.rows, a.hidden, a.ffn))


# ------------------------------------------------------------------------------------------ tests
def test_tp_layer_kernels_compile_for_sm90():
    """The fused kernels of the block, padded tail shapes, for 2 ranks (compile and link, no GPU)."""
    from tilescale.ops.allgather_gemm import ag_gemm_kernel
    from tilescale.ops.gemm_reduce_scatter import gemm_rs_gemm_kernel, gemm_rs_reduce_kernel

    jobs = fused_jobs(2, 200, 512, 1024)
    assert [fn for fn, _ in jobs] == [ag_gemm_kernel, gemm_rs_gemm_kernel, gemm_rs_reduce_kernel]
    assert all(args[0] == 2 * 256 for _, args in jobs)       # M: 200 rows per rank padded to 256
    for fn, args in jobs:
        r = fn.build(*args)
        assert r.spec.distributed and ("wgmma" in r.source) == (fn is not gemm_rs_reduce_kernel)


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_tp_layer_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, timeout=440, env={"TILESCALE_DIST_DEBUG": "1"})
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    main()
