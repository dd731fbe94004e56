"""A tensor-parallel transformer MLP block with tilescale's fused ops as torch operators: forward and backward,
eager and under ``torch.compile(fullgraph=True)``, the async-TP drop-in, and the whole TP step (forward and
backward) captured in a CUDA graph and replayed.

    GPUS=2 bash launch.sh examples/distributed/example_tp_layer.py [--rows 200 --hidden 512 --ffn 1024]
                                                                    [--graph-replays 1000]

The block (sequence parallel: every rank holds `rows` tokens of the T = W x rows; W1 split by columns, W2
by rows; LayerNorm weight replicated)::

    y = x + gemm_rs(gelu(ag_gemm(layer_norm(x), W1_r)), W2_r)
      = x + reduce_scatter(gelu(all_gather(layer_norm(x)) @ W1_r) @ W2_r)

``tilescale.ops.torch_ops.ag_gemm`` / ``gemm_rs`` are ``torch.ops.tilescale.*`` operators: the backward
runs GEMM+RS for dx and AG+GEMM for the gradient of the row-parallel input (tilescale/pytorch/torch_ops.py).
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

Last, the CUDA graph section (:func:`graph_section`): one TP step -- the block's forward and
``torch.autograd.grad`` of it (dx, dW1, dW2, and the LayerNorm weight's gradient, all-reduced) on static input
tensors -- is captured with ``torch.cuda.graph`` after three eager steps on a side stream (PyTorch's rule for
capturing autograd; every op of these shapes was built by the sections above, as tilescale/ops/capture.py
requires), then replayed ``--graph-replays`` times (default ``TP_GRAPH_REPLAYS``, else 1000; the test runs 1000)
on the stream of the eager calls. Before replay i, step i's inputs -- x, dy and new weights, mixtures of seeded
bases with coefficients from a host RNG seeded by i, the same on every rank (:class:`StepData`) -- are copied
into the static inputs, and the static outputs are filled with NaN; after it, the output and the four gradients
are checked against the fp32 reference of step i's inputs with the tolerances above (the worst relative errors
kept on the GPU, read back every 100 replays and at the end: a NaN, i.e. an output the replay did not write,
fails). After one replay in 100 (the 51st, 151st, ...) an eager step of the same ops on new inputs runs and is
checked the same way: the ops count their calls on the device, and this checks that eager calls and replays
interleaved keep their buffers and signals in step. ``GRAPHS_CAPTURE_ERROR_MODE`` (default ``global``) sets the
capture's error mode. Prints ``[rank R] OK: TP step captured in a CUDA graph, replayed N times ...`` with the
largest errors seen. The section's checks themselves run on a machine without a GPU, with the capture replaced
by reruns of the step, in a simulated world (tests/test_torch_ops_cpu.py: within tolerance; and a replay that
writes nothing, leaves one output poisoned, or lags one step behind fails); there the largest errors over 200
steps at the test's shapes, 4 ranks, were about 5.6e-3 (y), 7.7e-3 (dx), 6.9e-3 (dW1), 5.1e-3 (dW2) and 1.5e-2
(the LayerNorm weight's gradient).
"""
import argparse
import contextlib
import os
import random
import re
import time

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


def rel_err_tensor(a, b):
    """Frobenius norm of a - b over that of b (float64, a 0-d tensor on their device: no host sync; NaN where a
    holds a NaN)."""
    a, b = a.double(), b.double()
    return (a - b).norm() / b.norm().clamp_min(1e-30)


def rel_err(a, b) -> float:
    return rel_err_tensor(a, b).item()


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


def parts(rank: int, W: int, rows: int, Fd: int):
    """This rank's slices of the tokens (rows of x, dy, y, dx) and of the FFN dimension (columns of w1, rows of w2)."""
    return slice(rank * rows, (rank + 1) * rows), slice(rank * Fd // W, (rank + 1) * Fd // W)


def reference_of(full, rank: int, W: int, rows: int, Fd: int) -> dict:
    """The block on every token, fp32, one rank, plain torch, for the whole block's (x, dy, ln_w, w1, w2)
    `full`; this rank's slices."""
    x, ln_w, w1, w2 = (t.detach().clone().requires_grad_() for t in (full[0], *full[2:]))
    y = reference_block(x, ln_w, w1, w2)
    y.backward(full[1].detach())
    ts, fs = parts(rank, W, rows, Fd)
    return {"y": y.detach()[ts], "dx": x.grad[ts], "dln_w": ln_w.grad, "dw1": w1.grad[:, fs], "dw2": w2.grad[fs]}


def reference(rank: int, W: int, rows: int, H: int, Fd: int, device) -> dict:
    """The block on every token of :func:`full_data`, fp32, one rank, plain torch; this rank's slices."""
    return reference_of(full_data(W * rows, H, Fd, device), rank, W, rows, Fd)


def shards(full, rank: int, W: int, rows: int, Fd: int) -> dict:
    """This rank's parts of the whole block's (x, dy, ln_w, w1, w2) `full` (views, their dtype)."""
    x, dy, ln_w, w1, w2 = full
    ts, fs = parts(rank, W, rows, Fd)
    return {"x": x[ts], "dy": dy[ts], "ln_w": ln_w, "w1": w1[:, fs], "w2": w2[fs]}


def tp_step(fn, rank: int, W: int, rows: int, H: int, Fd: int, device) -> dict:
    """Forward + backward of this rank's part with `fn` (the block, eager or compiled), bf16."""
    import torch

    from tilescale.ops import torch_ops

    p = {k: v.to(torch.bfloat16).contiguous() for k, v in shards(full_data(W * rows, H, Fd, device), rank, W, rows,
                                                                   Fd).items()}
    dy = p.pop("dy")
    for t in p.values():
        t.requires_grad_()
    y = fn(p["x"], p["ln_w"], p["w1"], p["w2"])
    y.backward(dy)
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


# ------------------------------------------------------------------------------------------ CUDA graph
GRAPH_KEYS = ("y", "dx", "dln_w", "dw1", "dw2")        # what a step gives: the output and the four gradients
GRAPH_OK = r"\[rank (\d+)\] OK: TP step captured in a CUDA graph, replayed (\d+) times"   # the section's OK line
# torch.cuda.graph's default; "thread_local" if another thread's CUDA calls (NVSHMEM's proxy) break a capture
CAPTURE_ERROR_MODE = os.environ.get("GRAPHS_CAPTURE_ERROR_MODE", "global")
WARMUP_SEED, EAGER_SEED = 10_000_000, 20_000_000       # step numbers of the warm-up and the eager steps


def graph_replays_default() -> int:
    """Replays of the captured step: TP_GRAPH_REPLAYS, default 1000 (the example's test runs the default)."""
    return int(os.environ.get("TP_GRAPH_REPLAYS", "1000"))


def tol_of(key: str) -> float:
    return TOL_LN if key == "dln_w" else TOL


class StepData:
    """Inputs of the graph section's steps, new for every step i, the same on every rank: bases drawn once from a
    seed (fp32, the whole block's: every token), mixed by coefficients from a host RNG seeded by i::

        x = a0 X + a1 X',  dy = a2 DY + a3 DY',  ln_w = a4 LN + a5 LN',  w1 = a6 W1 + a7 W1',  w2 = a8 W2 + a9 W2'

    (a0, a2, ... in [0.5, 2], a1, a3, ... in [-1, 1]: the LayerNorm of x changes too, not only its scale).
    ``static``: this rank's bf16 inputs of a step (``x``, ``ln_w``, ``w1``, ``w2``: leaves that require grad;
    ``dy``), allocated once; :meth:`fill` writes a step's values into them, on the stream."""

    def __init__(self, rank: int, W: int, rows: int, H: int, Fd: int, device):
        import torch

        g = torch.Generator(device=device).manual_seed(4242)
        T = W * rows

        def two(*shape, scale=1.0):
            return tuple(scale * torch.randn(*shape, device=device, generator=g) for _ in range(2))

        ln, ln2 = two(H, scale=0.1)
        self.bases = (two(T, H), two(T, H), (1 + ln, ln2), two(H, Fd, scale=H ** -0.5), two(Fd, H, scale=Fd ** -0.5))
        self.where = (rank, W, rows, Fd)
        self.static = {k: torch.empty(v.shape, dtype=torch.bfloat16, device=device)
                       for k, v in shards(self.full(self.coeffs(0)), *self.where).items()}
        for k in ("x", "ln_w", "w1", "w2"):
            self.static[k].requires_grad_()

    @staticmethod
    def coeffs(i: int) -> tuple:
        rng = random.Random(i)
        return tuple(v for _ in range(5) for v in (rng.uniform(0.5, 2.0), rng.uniform(-1.0, 1.0)))

    def full(self, c) -> tuple:
        """The whole block's (x, dy, ln_w, w1, w2) of coefficients `c` (fp32)."""
        return tuple(a * P + b * Q for (P, Q), a, b in zip(self.bases, c[0::2], c[1::2], strict=True))

    def fill(self, i: int) -> tuple:
        """Step i's values into ``static`` (this rank's shards, rounded to bf16); returns the whole block's."""
        import torch

        full = self.full(self.coeffs(i))
        with torch.no_grad():
            for k, v in shards(full, *self.where).items():
                self.static[k].copy_(v)
        return full

    def want(self, full) -> dict:
        return reference_of(full, *self.where)


def make_step(static: dict, fn=block):
    """One TP step on the tensors of `static`: the block's forward and backward (torch.autograd.grad: the
    gradients are new tensors, graph outputs once captured), the LayerNorm weight's gradient all-reduced.
    Every rank makes the same calls in the same order (AG+GEMM, GEMM+RS; backward: AG+GEMM keeping the gathered
    dY, GEMM+RS, AllGather; AllReduce)."""

    def step() -> dict:
        import torch

        from tilescale.ops import torch_ops

        x, ln_w, w1, w2 = (static[k] for k in ("x", "ln_w", "w1", "w2"))
        y = fn(x, ln_w, w1, w2)
        dx, dln_w, dw1, dw2 = torch.autograd.grad(y, (x, ln_w, w1, w2), grad_outputs=static["dy"])
        return {"y": y.detach(), "dx": dx, "dln_w": torch_ops.all_reduce(dln_w.float()), "dw1": dw1, "dw2": dw2}

    return step


class Worst:
    """The largest relative error of each result (GRAPH_KEYS) over the steps checked, kept on the device (no host
    sync per step); a NaN, i.e. a poisoned output that the step did not write, stays NaN and fails."""

    def __init__(self, device):
        import torch

        self.v = torch.zeros(len(GRAPH_KEYS), dtype=torch.float64, device=device)
        self.n = 0

    def add(self, got: dict, want: dict, rank: int) -> None:
        import torch

        for k in GRAPH_KEYS:
            if got[k].shape != want[k].shape:
                raise AssertionError(f"[rank {rank}] {k}: shape {tuple(got[k].shape)} != {tuple(want[k].shape)}")
        torch.maximum(self.v, torch.stack([rel_err_tensor(got[k], want[k]) for k in GRAPH_KEYS]), out=self.v)
        self.n += 1

    def check(self, what: str, rank: int) -> dict:
        """Raise unless every result was within its tolerance (reads the errors back: a host sync)."""
        worst = dict(zip(GRAPH_KEYS, self.v.tolist(), strict=True))
        bad = [f"{k} {e:.3g} > {tol_of(k)}" for k, e in worst.items() if not e <= tol_of(k)]
        if bad:
            raise AssertionError(f"[rank {rank}] {what}: largest relative error over {self.n} checked steps: "
                                 f"{', '.join(bad)} (nan: an output the step did not write)")
        return worst


def cuda_graph(step):
    """(static outputs, replay) of `step` captured in a CUDA graph (its allocations come from the graph's pool:
    the outputs stay valid, and are rewritten by every replay)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
        outs = step()
    return outs, graph.replay


def graph_section(rank: int, W: int, rows: int, H: int, Fd: int, device, replays: int, *, capture=cuda_graph,
                  check_every: int = 100, eager_every: int = 100, warmups: int = 3, say=None) -> dict:
    """A TP step (:func:`make_step`) captured once, replayed `replays` times: before each replay, step i's inputs
    (new x, dy and weights) copied into the static inputs and the static outputs poisoned (NaN); after it, every
    output checked against :func:`reference_of` of step i's inputs (errors kept on the device, read back every
    `check_every` replays and at the end). After every `eager_every`-th replay (offset by half), an eager step
    of the same ops on new inputs, checked the same way (the ops count their calls on the device: eager calls
    and replays interleave). Before the capture, `warmups` eager steps on a side stream (torch.cuda.graph's
    rule for capturing autograd), checked too. `capture(step)` -> (outputs, replay): a CUDA graph (the CPU test
    passes one that reruns the step). Returns the counts, the worst errors and the seconds the replays took."""
    import torch

    import tilescale

    cuda = device.type == "cuda"
    if cuda:   # a class attribute: every rank stops here alike
        from tilescale.ops.allgather_gemm import AGGemm
        from tilescale.ops.gemm_reduce_scatter import GemmRS

        refusing = [op.NAME for op in (AGGemm, GemmRS) if not op.GRAPH_SAFE]
        if refusing:
            raise RuntimeError(f"{' and '.join(refusing)} refuse CUDA graph capture in this tree (GRAPH_SAFE is "
                               "False): the graph section needs them to count their calls on the device")
    data = StepData(rank, W, rows, H, Fd, device)
    step = make_step(data.static)
    replayed, eager = Worst(device), Worst(device)

    def eager_step(i: int) -> None:
        full = data.fill(i)
        eager.add(step(), data.want(full), rank)

    # Warm-up: every op of these shapes exists already (the eager and compiled sections built them); torch wants
    # the eager iterations before a capture of autograd on a side stream.
    side = torch.cuda.Stream() if cuda else None
    if cuda:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
        for i in range(warmups):
            eager_step(WARMUP_SEED + i)
    if cuda:
        torch.cuda.current_stream().wait_stream(side)
        tilescale.barrier()
        tilescale.synchronize()
    eager.check(f"eager warm-up ({warmups} steps)", rank)

    outs, replay = capture(step)
    inputs = {t.untyped_storage().data_ptr() for t in data.static.values()}
    aliased = [k for k, v in outs.items() if v.untyped_storage().data_ptr() in inputs]
    if aliased:      # poisoning them would poison the step's inputs
        raise AssertionError(f"[rank {rank}] the captured step's outputs {aliased} share memory with its inputs")
    n_eager, t0 = 0, time.time()
    for i in range(replays):
        full = data.fill(i)
        for t in outs.values():
            t.fill_(float("nan"))
        replay()
        replayed.add(outs, data.want(full), rank)
        if i % eager_every == eager_every // 2:
            eager_step(EAGER_SEED + i)
            n_eager += 1
        if (i + 1) % check_every == 0 or i + 1 == replays:
            if cuda:   # a device wait that gave up (TILESCALE_WAIT_TIMEOUT_S) raises here, with its record
                tilescale.synchronize()
            replayed.check(f"CUDA graph replays 1-{i + 1}", rank)
            eager.check(f"eager steps between replays ({n_eager})", rank)
            if say is not None and rank == 0 and (i + 1) % (5 * check_every) == 0 and i + 1 < replays:
                say(f"[rank 0] CUDA graph: {i + 1} of {replays} replays checked ({time.time() - t0:.0f} s)")
    return {"replays": replays, "eager": n_eager, "warmups": warmups, "seconds": time.time() - t0,
            "worst": replayed.check(f"CUDA graph ({replays} replays)", rank),
            "worst_eager": eager.check(f"eager steps ({warmups} + {n_eager})", rank)}


# ------------------------------------------------------------------------------------------------ run
def fused_jobs(W: int, rows: int, H: int, Fd: int) -> list:
    """(jit kernel, args) of the fused kernels the block runs (the cached ops' of `rows` rows per rank)."""
    from tilescale.ops import prebuild

    return prebuild.unique(prebuild.ag_gemm_jobs([(W * rows, H, Fd // W)], W, cached=True)
                           + prebuild.gemm_rs_jobs([(W * rows, Fd, H)], W, cached=True))


def run(info, rows: int, H: int, Fd: int, compile_backend: str, graph_replays: int) -> None:
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
    if graph_replays <= 0:
        testing.say(f"[rank {rank}] note: the CUDA graph section was skipped (--graph-replays {graph_replays})")
        return
    r = graph_section(rank, W, rows, H, Fd, device, graph_replays, say=testing.say)
    worst = ", ".join(f"{k} {e:.1e}" for k, e in r["worst"].items())
    testing.say(f"[rank {rank}] OK: TP step captured in a CUDA graph, replayed {r['replays']} times (forward and "
                f"backward of the block: AG+GEMM, GEMM+RS, their backward, AllGather, AllReduce), new inputs and "
                f"weights copied in and outputs poisoned (NaN) before each replay, {r['eager']} eager steps between "
                f"and {r['warmups']} before: every output and gradient within {TOL} ({TOL_LN} for the LayerNorm "
                f"weight's gradient) of fp32 torch; largest relative errors over the replays: {worst} "
                f"({r['seconds']:.0f} s)")


def build(world_size: int, rows: int = 200, H: int = 512, Fd: int = 1024) -> None:
    """Compile-only (no GPU): the fused kernels of the block (the collectives build on first use)."""
    import tilescale

    tilescale.build_all(fused_jobs(world_size, rows, H, Fd))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200, help="tokens per rank (a tail when not a multiple of 128)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    ap.add_argument("--graph-replays", type=int, default=graph_replays_default(),
                    help="replays of the captured TP step (default: TP_GRAPH_REPLAYS, else 1000; 0 skips the section)")
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, a.rows, a.hidden, a.ffn, a.backend, a.graph_replays),
                         lambda ws: build(ws, a.rows, a.hidden, a.ffn))


# ------------------------------------------------------------------------------------------ tests
def test_tp_layer_kernels_compile_for_sm90():
    """The fused kernels of the block, padded tail shapes, for 2 ranks (compile and link, no GPU)."""
    from tilescale.ops.allgather_gemm import ag_gemm_kernel
    from tilescale.ops.gemm_reduce_scatter import gemm_rs_push_kernel

    jobs = fused_jobs(2, 200, 512, 1024)
    assert [fn for fn, _ in jobs] == [ag_gemm_kernel, ag_gemm_kernel, gemm_rs_push_kernel]   # one node: push
    assert [args[12] for _, args in jobs[:2]] == [True, False]   # the GEMMs take the rows at run time: no M
    for fn, args in jobs:
        r = fn.build(*args)
        assert r.spec.distributed and "wgmma" in r.source


if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks", [2, 4])
    def test_tp_layer_on_gpus(nranks):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, timeout=440, env={"TILESCALE_DIST_DEBUG": "1"})
        testing.assert_all_ranks_ok(proc, nranks)
        replays = graph_replays_default()   # the CUDA graph section: every rank replayed the step that often
        if replays > 0:
            got = sorted((int(r), int(n)) for r, n in re.findall(GRAPH_OK, proc.stdout))
            assert got == [(r, replays) for r in range(nranks)], proc.stdout[-6000:]


if __name__ == "__main__":
    main()
