"""torch.ops.tilescale.* (tilescale/pytorch/torch_ops.py) on a machine without a GPU: fake (meta) impls under
FakeTensorMode, torch.library.opcheck, torch.compile(fullgraph=True) of a TP MLP (and of the async-TP drop-ins), the
autograd formulas in a simulated world (W threads, one per rank, with collectives over shared memory:
tests/torch_worlds.py), ag_gemm / gemm_rs of any rows, the fallbacks, and the checks of
example_tp_layer.py's CUDA graph section (its capture replaced by reruns of the step, in the simulated world). The
async-TP drop-ins themselves: tests/test_async_tp_cpu.py. The same ops on GPUs (opcheck, the layer against
torch, the drop-in against torch.ops.symm_mem, the TP step replayed from a CUDA graph):
examples/distributed/example_tp_layer.py."""
import importlib
import os

import pytest

torch = pytest.importorskip("torch")


def _cache_dirs() -> set:
    """torch.compile's cache directories in the temporary directory (torch._dynamo creates one at import)."""
    import glob
    import tempfile

    return set(glob.glob(os.path.join(tempfile.gettempdir(), "torchinductor_*")))


_EXISTED_BEFORE = _cache_dirs()   # before torch_ops imports torch._dynamo

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch_worlds import MirrorWorld, ThreadWorld, randn, world_fixture  # noqa: E402,F401  (the fixture `world`)

from tilescale import runtime  # noqa: E402
from tilescale.ops import async_tp, checks, torch_ops  # noqa: E402

ag_gemm_mod = importlib.import_module("tilescale.ops.allgather_gemm")
gemm_rs_mod = importlib.import_module("tilescale.ops.gemm_reduce_scatter")
ops = torch.ops.tilescale


@pytest.fixture(scope="module", autouse=True)
def _no_compiler_cache_left():
    """Importing torch._dynamo (torch_ops does) creates torch.compile's cache directory in the temporary
    directory; the compile tests here (backends eager / aot_eager) write nothing into it. Remove it after,
    if it appeared with this module and is still empty."""
    yield
    for d in _cache_dirs() - _EXISTED_BEFORE:
        try:
            os.rmdir(d)             # only an empty directory
        except OSError:
            pass


# --------------------------------------------------------------------------------------- registration
def test_ops_are_registered_with_schemas():
    names = ("all_gather", "reduce_scatter", "all_reduce", "all_reduce_", "all_to_all_single", "broadcast",
             "ag_gemm", "ag_gemm_gathered", "gemm_rs")
    for n in names:
        schema = str(getattr(ops, n).default._schema)
        assert schema.startswith(f"tilescale::{n}("), schema
    assert ops.all_reduce_.default._schema.arguments[0].alias_info.is_write     # declared mutation
    assert "!" not in str(ops.all_reduce.default._schema)
    assert "Int world_size" in str(ops.ag_gemm.default._schema)          # SymInt: an int argument


def test_registered_on_first_use_of_torch_ops():
    import subprocess
    import sys

    code = ("import sys, tilescale; assert 'torch' not in sys.modules\n"
            "import tilescale.ops; assert 'tilescale.ops.torch_ops' not in sys.modules, 'registered at import'\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "import torch; assert not hasattr(torch.ops.tilescale, 'ag_gemm')\n"
            "tilescale.ops.fused_all_gather_matmul; assert torch.ops.tilescale.ag_gemm.default; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# ---------------------------------------------------------------------------------------- fake impls
@pytest.mark.parametrize("W", [2, 4])
def test_fake_impls_shapes_without_a_gpu(W):
    with FakeTensorMode():
        x = torch.empty(8, 6, 3, dtype=torch.bfloat16)
        a = torch.empty(5, 64, dtype=torch.float16)
        b = torch.empty(64, 24, dtype=torch.float16)
        assert ops.all_gather(x, W).shape == (8 * W, 6, 3) and ops.all_gather(x, W).dtype == torch.bfloat16
        assert ops.reduce_scatter(x, W).shape == (8 // W, 6, 3)
        assert ops.all_reduce(x).shape == x.shape and ops.broadcast(x, 1).shape == x.shape
        assert ops.all_reduce_(x) is None
        assert ops.all_to_all_single(x, [], []).shape == x.shape
        assert ops.all_to_all_single(x, [3] * W, [2] * (W - 1) + [8 - 2 * (W - 1)]).shape == (3 * W, 6, 3)
        c = ops.ag_gemm(a, b, W)
        assert c.shape == (5 * W, 24) and c.dtype == torch.float16 and c.is_contiguous()
        af, c = ops.ag_gemm_gathered(a, b, W)
        assert af.shape == (5 * W, 64) and c.shape == (5 * W, 24)
        y = ops.gemm_rs(torch.empty(4 * W, 64, dtype=torch.float16), b, W)
        assert y.shape == (4, 24) and y.dtype == torch.float16
        with pytest.raises(Exception, match="multiple of the world size"):
            ops.gemm_rs(torch.empty(4 * W + 1, 64, dtype=torch.float16), b, W)
        with pytest.raises(Exception, match="inner sizes differ"):
            ops.ag_gemm(a, torch.empty(32, 24, dtype=torch.float16), W)


def test_fake_impls_need_no_backend(monkeypatch):
    class Nothing:
        def __getattr__(self, name):
            raise AssertionError(f"the fake impl called the backend ({name})")

    monkeypatch.setattr(torch_ops, "_BACKEND", Nothing())
    with FakeTensorMode():
        ops.gemm_rs(torch.empty(256, 128, dtype=torch.bfloat16), torch.empty(128, 256, dtype=torch.bfloat16), 2)
        ops.ag_gemm(torch.empty(100, 128, dtype=torch.bfloat16), torch.empty(128, 256, dtype=torch.bfloat16), 2)


# -------------------------------------------------------------------------------------------- opcheck
def _opcheck_cases():
    bf = torch.bfloat16
    a, b = randn(40, 64, seed=1, dtype=bf), randn(64, 128, seed=2, dtype=bf)
    x = randn(64, 32, seed=3)
    return [
        ("all_gather", (x, 2)),
        ("reduce_scatter", (x, 2)),
        ("all_reduce", (x,)),
        ("all_reduce_", (x.clone(),)),
        ("all_to_all_single", (x, [], [])),
        ("all_to_all_single", (x, [24, 24], [24, 40])),
        ("broadcast", (x, 1)),
        ("ag_gemm", (a, b, 2)),
        ("ag_gemm_gathered", (a, b, 2)),
        ("gemm_rs", (randn(64, 64, seed=4, dtype=bf), b, 2)),
        ("ag_gemm", (randn(40, 64, seed=5), randn(64, 12, seed=6), 2)),         # fp32: not fused
        ("gemm_rs", (randn(64, 64, seed=7), randn(64, 12, seed=8), 2)),
    ]


@pytest.mark.parametrize("name,args", _opcheck_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_opcheck(world, name, args):
    world(MirrorWorld(2))
    torch.library.opcheck(getattr(ops, name), args)


@pytest.mark.parametrize("name", ["ag_gemm", "ag_gemm_gathered", "gemm_rs", "all_gather", "reduce_scatter"])
def test_opcheck_with_gradients(world, name):
    world(MirrorWorld(2))
    a = randn(32, 64, seed=1).requires_grad_()
    b = randn(64, 16, seed=2).requires_grad_()
    args = {"ag_gemm": (a, b, 2), "ag_gemm_gathered": (a, b, 2), "gemm_rs": (randn(64, 64, seed=3).requires_grad_(),
            b, 2), "all_gather": (a, 2), "reduce_scatter": (a, 2)}[name]
    torch.library.opcheck(getattr(ops, name), args)


# ---------------------------------------------------------------------------------------- torch.compile
def tp_mlp(x, w1, w2):
    h = torch.nn.functional.gelu(torch_ops.ag_gemm(x, w1))
    return torch_ops.gemm_rs(h, w2)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_traces_a_tp_mlp(world, backend):
    w = world(MirrorWorld(2))
    bf = torch.bfloat16
    x, w1, w2 = randn(64, 256, seed=1, dtype=bf), randn(256, 256, seed=2, dtype=bf), randn(256, 256, seed=3, dtype=bf)
    params = [t.clone().requires_grad_() for t in (x, w1, w2)]
    want = tp_mlp(*params)
    want.float().square().sum().backward()
    grads = [p.grad for p in params]
    w.calls.clear()
    compiled = torch.compile(tp_mlp, fullgraph=True, backend=backend)
    params = [t.clone().requires_grad_() for t in (x, w1, w2)]
    got = compiled(*params)
    got.float().square().sum().backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(params, grads, strict=False):
        torch.testing.assert_close(p.grad, g)
    assert {"ag_gemm", "gemm_rs"} <= set(w.calls)


def test_compile_fullgraph_traces_the_drop_ins_and_collectives(world):
    world(MirrorWorld(2))

    def f(a, b1, b2, x, y):
        A, (c1, c2) = async_tp.fused_all_gather_matmul(a, [b1, b2], 1, "world")
        z = async_tp.fused_matmul_reduce_scatter(x, b1.t(), "avg", 0, "world")
        t = torch_ops.all_reduce(y) + torch_ops.broadcast(y, 1) + torch_ops.all_to_all_single(y)
        return A.sum() + c1.sum() + c2.sum() + z.sum() + torch_ops.reduce_scatter(torch_ops.all_gather(t)).sum()

    args = (randn(2, 8, 64, seed=1), randn(64, 32, seed=2), randn(64, 8, seed=3), randn(4, 6, 32, seed=4),
            randn(8, 16, seed=5))
    want = f(*args)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    torch.testing.assert_close(got, want)


# ------------------------------------------------------------------------- a real world in threads: autograd
def full_mlp(T, H, Fd, dtype):
    x, w1, w2 = randn(T, H, seed=11), randn(H, Fd, seed=12) / H ** 0.5, randn(Fd, H, seed=13) / Fd ** 0.5
    dy = randn(T, H, seed=14)
    return [t.to(dtype) for t in (x, w1, w2, dy)]


@pytest.mark.parametrize("W,T,H,dtype", [(2, 40, 64, torch.float32), (4, 36, 64, torch.float32),
                                         (2, 16, 256, torch.bfloat16), (4, 24, 256, torch.bfloat16)])
def test_tp_mlp_gradients_match_torch(world, W, T, H, dtype):
    """Sequence-parallel x (rows), W1 by columns (AG+GEMM), W2 by rows (GEMM+RS): output and every
    gradient of every rank equal the single-process MLP's slices; bf16 runs the fused ops forward and
    backward, fp32 the collective + torch GEMM (not fusable)."""
    Fd = 256
    w = world(ThreadWorld(W))
    x, w1, w2, dy = full_mlp(T, H, Fd, dtype)
    ref = [t.float().clone().requires_grad_() for t in (x, w1, w2)]
    y = torch.nn.functional.gelu(ref[0] @ ref[1]) @ ref[2]
    y.backward(dy.float())
    t, f = T // W, Fd // W

    def rank(r):
        xs = x[r * t:(r + 1) * t].clone().requires_grad_()
        w1s = w1[:, r * f:(r + 1) * f].contiguous().requires_grad_()
        w2s = w2[r * f:(r + 1) * f].clone().requires_grad_()
        ys = tp_mlp(xs, w1s, w2s)
        ys.backward(dy[r * t:(r + 1) * t])
        return ys.detach(), xs.grad, w1s.grad, w2s.grad

    for r, (ys, dx, dw1, dw2) in enumerate(w.run(rank)):
        for got, want in ((ys, y.detach()[r * t:(r + 1) * t]), (dx, ref[0].grad[r * t:(r + 1) * t]),
                          (dw1, ref[1].grad[:, r * f:(r + 1) * f]), (dw2, ref[2].grad[r * f:(r + 1) * f])):
            assert got.dtype == dtype and got.shape == want.shape
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            else:   # bf16: relative error of the whole tensor (elements near 0 are off by rounding)
                assert ((got.float() - want).norm() / want.norm()).item() < 2e-2
    # forward: ag_gemm, gemm_rs; backward of gemm_rs: ag_gemm_gathered (AG+GEMM, keeps the gathered dY);
    # backward of ag_gemm: gemm_rs (GEMM+RS) and a gather of x for dW1
    if dtype == torch.bfloat16:
        assert sorted(w.calls) == sorted(["ag_gemm", "gemm_rs", "ag_gemm", "gemm_rs", "all_gather"])
    else:   # not fusable (fp32): each fused op is its collective and torch's GEMM
        assert sorted(w.calls) == sorted(["all_gather", "reduce_scatter"] * 2 + ["all_gather"])


def test_ag_gemm_gathered_gradient_through_both_outputs(world):
    W, rows, K, N = 2, 8, 16, 12
    w = world(ThreadWorld(W))
    a = randn(W * rows, K, seed=1)
    b = randn(K, N, seed=2)
    ref_a = a.clone().requires_grad_()
    ref_b = b.clone().requires_grad_()
    # every rank: loss_r = sum(A_full * 1.5) + sum((A_full @ B_r) ** 2), B_r = b * (r + 1)
    total = sum((ref_a * 1.5).sum() + (ref_a @ (ref_b * (r + 1))).square().sum() for r in range(W))
    total.backward()

    def rank(r):
        ar = a[r * rows:(r + 1) * rows].clone().requires_grad_()
        br = (b * (r + 1)).requires_grad_()
        A, c = torch_ops.ag_gemm_gathered(ar, br)
        ((A * 1.5).sum() + c.square().sum()).backward()
        return ar.grad, br.grad

    for r, (da, db) in enumerate(w.run(rank)):
        torch.testing.assert_close(da, ref_a.grad[r * rows:(r + 1) * rows])
        torch.testing.assert_close(db, (ref_a.detach().t() @ (2 * ref_a.detach() @ (b * (r + 1)))))


def test_collectives_in_threads(world):
    W = 4
    w = world(ThreadWorld(W))
    xs = [randn(8, 3, seed=r) for r in range(W)]

    def rank(r):
        x = xs[r]
        y = x.clone()
        torch_ops.all_reduce_(y)
        splits_in = [r + 1, 1, 1, 5 - r]           # rank r sends splits_in[p] rows to p
        a2a = torch_ops.all_to_all_single(x, [p + 1 if r == 0 else (1 if r in (1, 2) else 5 - p) for p in range(W)],
                                          splits_in)
        return torch_ops.all_gather(x), torch_ops.reduce_scatter(x), torch_ops.all_reduce(x), y, \
            torch_ops.broadcast(x, 2), a2a

    for r, (ag, rs, ar, ar_, bc, a2a) in enumerate(w.run(rank)):
        torch.testing.assert_close(ag, torch.cat(xs))
        torch.testing.assert_close(rs, sum(xs).chunk(W)[r])
        torch.testing.assert_close(ar, sum(xs))
        torch.testing.assert_close(ar_, sum(xs))
        torch.testing.assert_close(bc, xs[2])
        want = torch.cat([xs[p].split([p + 1, 1, 1, 5 - p])[r] for p in range(W)])
        torch.testing.assert_close(a2a, want)


# ------------------------------------------------------------------------------- fused or not, fallbacks
def test_why_not_fused():
    bf = torch.bfloat16
    assert torch_ops.why_not_fused("ag_gemm", 4100, 1024, 512, bf, 2) is None       # any rows
    assert torch_ops.why_not_fused("gemm_rs", 100, 1024, 512, bf, 4) is None
    assert "dtype" in torch_ops.why_not_fused("ag_gemm", 128, 1024, 512, torch.float32, 2)
    assert "multiples of 8" in torch_ops.why_not_fused("ag_gemm", 128, 1020, 512, bf, 2)
    assert "multiple of 128" in torch_ops.why_not_fused("gemm_rs", 128, 1000, 512, bf, 2)


def test_not_fused_runs_collective_then_gemm(world, caplog):
    w = world(MirrorWorld(2))
    import logging

    with caplog.at_level(logging.DEBUG, logger="tilescale.ops"):
        c = torch_ops.ag_gemm(randn(8, 16, seed=1), randn(16, 4, seed=2))
        y = torch_ops.gemm_rs(randn(8, 16, seed=1), randn(16, 4, seed=2))
    assert w.calls == ["all_gather", "reduce_scatter"] and c.shape == (16, 4) and y.shape == (4, 4)
    assert "not fused (dtype torch.float32" in caplog.text
    w.calls.clear()
    torch_ops.ag_gemm(randn(8, 16, seed=1, dtype=torch.bfloat16), randn(256, 16, seed=2, dtype=torch.bfloat16).t())
    assert w.calls == ["ag_gemm"]


# --------------------------------------------------------------------------- tails of ag_gemm / gemm_rs
class FakeRuntime:
    def __init__(self, W):
        self.info = runtime.DistInfo(rank=0, world_size=W, local_rank=0, local_world_size=W)

    def all_gather_object(self, obj):
        return [obj] * self.info.world_size


class FakeAGGemm:
    """An AGGemm of a bound of rows per rank (a power of two, at least 128) taking any rows up to it, mirror world:
    its gathered A is its buffer after a call of the bound's rows (the function returns a copy), else a copy."""

    def __init__(self, M, N, K, dtype, *, config=None, split=True, group=None):
        W = runtime.current().info.world_size
        assert M % W == 0 and (M // W) & (M // W - 1) == 0 and M // W >= 128 and not split, (M, W, split)
        self.M, self.W, self.a_full = M, W, torch.empty(M, K, dtype=dtype)
        self.rows = self.m = M // W       # the bound of rows per rank, the last call's
        self.fused = True

    def __call__(self, a, b):
        assert a.shape[0] <= self.rows
        self.m = a.shape[0]
        self.a_full[:self.W * self.m] = torch.cat([a] * self.W)
        return self.a_full[:self.W * self.m] @ b

    def gathered(self):
        return self.a_full if self.m == self.rows else self.a_full[:self.W * self.m].clone()


class FakeGemmRS:
    """A GemmRS of a bound of rows per rank (a power of two, at least 128) taking any rows up to it, mirror world."""

    def __init__(self, M, N, K, dtype, *, config=None, group=None):
        W = runtime.current().info.world_size
        assert M % W == 0 and (M // W) & (M // W - 1) == 0 and M // W >= 128, (M, W)
        self.M, self.W = M, W

    def __call__(self, x, w):
        assert x.shape[0] <= self.M and x.is_contiguous()
        return ((x @ w) * self.W)[:x.shape[0] // self.W]


@pytest.mark.parametrize("W,rows", [(2, 4100), (4, 100), (2, 256)])
def test_ag_gemm_and_gemm_rs_take_any_rows(monkeypatch, W, rows):
    monkeypatch.setattr(runtime, "current", lambda: FakeRuntime(W))
    monkeypatch.setattr(checks, "this_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ag_gemm_mod, "AGGemm", FakeAGGemm)
    ag_gemm_mod._cached.cache_clear()
    monkeypatch.setattr(gemm_rs_mod, "GemmRS", FakeGemmRS)
    monkeypatch.setattr(gemm_rs_mod, "default_path", lambda W, K=None, team=None: "push")
    gemm_rs_mod._cached.cache_clear()
    bf = torch.bfloat16
    a, b = randn(rows, 64, seed=1, dtype=bf), randn(64, 32, seed=2, dtype=bf)
    c, af = ag_gemm_mod.ag_gemm(a, b, return_gathered=True)
    assert c.shape == (W * rows, 32) and af.shape == (W * rows, 64)
    torch.testing.assert_close(c, torch.cat([a] * W) @ b)
    torch.testing.assert_close(af, torch.cat([a] * W))
    [op] = ag_gemm_mod._cached.entries.values()
    assert af.data_ptr() != op.a_full.data_ptr()             # a copy: the op's buffer is the next call's
    ag_gemm_mod._cached.cache_clear()
    x = randn(W * rows, 64, seed=3, dtype=bf)
    y = gemm_rs_mod.gemm_rs(x, b)
    assert y.shape == (rows, 32)
    torch.testing.assert_close(y, ((x @ b) * W)[:rows])   # rank 0's rows of the mirror world's sum
    with pytest.raises(ValueError, match="multiple of the world size"):
        gemm_rs_mod.gemm_rs(randn(W * rows + 1, 64, dtype=bf), b)
    assert len(gemm_rs_mod._cached) == 1
    gemm_rs_mod._cached.cache_clear()


# ------------------------------------------------------------ example_tp_layer's CUDA graph section, in threads
def _tp_layer_example():
    """examples/distributed/example_tp_layer.py, loaded from its file (no sys.path change)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "distributed" / "example_tp_layer.py"
    spec = importlib.util.spec_from_file_location("example_tp_layer_for_cpu_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rerun_capture(fault=None):
    """What the graph section's CPU runs use in place of a CUDA graph: the step run once, its outputs kept as
    the static outputs, and every replay running the step again and writing into them; `fault` makes it wrong:
    "nothing" (a replay that writes nothing), "dw2" (one output left unwritten), "stale" (a replay writes the
    results of the step before: one call behind)."""

    def capture(step):
        outs = step()
        prev = {k: v.clone() for k, v in outs.items()}

        def replay():
            nonlocal prev
            if fault == "nothing":
                return
            new = step()
            for k, v in outs.items():
                if not (fault == "dw2" and k == "dw2"):
                    v.copy_((prev if fault == "stale" else new)[k])
            prev = {k: v.clone() for k, v in new.items()}

        return outs, replay

    return capture


GRAPH_CPU = {"W": 2, "rows": 12, "H": 128, "Fd": 256}


def _graph_section(w, ex, replays, fault=None, **kw):
    W, rows, H, Fd = (GRAPH_CPU[k] for k in ("W", "rows", "H", "Fd"))
    return w.run(lambda r: ex.graph_section(r, W, rows, H, Fd, torch.device("cpu"), replays,
                                            capture=_rerun_capture(fault), **kw))


def test_tp_layer_graph_section_checks_every_replay(world):
    """The example's CUDA graph section (new inputs and weights per step, poisoned outputs, references, eager
    steps between replays), its capture replaced by reruns of the step, in a simulated world of 2 ranks: every
    step within the example's tolerances, the counts as said."""
    ex = _tp_layer_example()
    w = world(ThreadWorld(GRAPH_CPU["W"]))
    for r in _graph_section(w, ex, 12, check_every=5, eager_every=4, warmups=2):
        assert (r["replays"], r["eager"], r["warmups"]) == (12, 3, 2)
        for k, e in (*r["worst"].items(), *r["worst_eager"].items()):
            assert 0 < e <= ex.tol_of(k) / 2, (k, e)     # bf16 against fp32: some error, well within bounds


def test_tp_layer_graph_inputs_differ_per_step_and_agree_across_ranks():
    """Step i's inputs come from seeds alone (every rank the same), and consecutive steps' references differ by
    far more than the tolerances (a replay that ran on old inputs is caught)."""
    ex = _tp_layer_example()
    W, rows, H, Fd = (GRAPH_CPU[k] for k in ("W", "rows", "H", "Fd"))
    a, b = (ex.StepData(r, W, rows, H, Fd, torch.device("cpu")) for r in range(W))
    assert a.coeffs(7) == b.coeffs(7) != a.coeffs(8)
    for x, y in zip(a.full(a.coeffs(3)), b.full(b.coeffs(3)), strict=True):
        assert torch.equal(x, y)
    w0, w1 = a.want(a.full(a.coeffs(0))), a.want(a.full(a.coeffs(1)))
    for k in ex.GRAPH_KEYS:
        assert ex.rel_err(w1[k], w0[k]) > 5 * ex.tol_of(k), k


@pytest.mark.parametrize("fault,match", [("nothing", r"y nan > .*dx nan"), ("dw2", r": dw2 nan > 0.02 \(nan"),
                                         ("stale", r"largest relative error over 5 checked steps: y ")])
def test_tp_layer_graph_section_fails_on_a_wrong_replay(world, fault, match):
    """A replay that wrote nothing, left one output poisoned, or wrote the step before's results fails, at the
    first read-back."""
    ex = _tp_layer_example()
    w = world(ThreadWorld(GRAPH_CPU["W"]))
    with pytest.raises(AssertionError, match=match):
        _graph_section(w, ex, 12, fault=fault, check_every=5, eager_every=4, warmups=1)
