"""The async-TP drop-ins (tilescale/pytorch/async_tp.py) and the switch that has Inductor's micro-pipeline TP pass run
on them (tilescale/pytorch/inductor_async_tp.py), on a machine without a GPU:

* layouts: the shape, dtype and strides of every result, for every gather_dim / scatter_dim of 3-D and 4-D
  operands, one and several Bs, with and without A, equal those of torch's own meta kernels of
  ``torch.ops.symm_mem`` (a fake process group of W ranks gives them the group's size), under FakeTensorMode (what
  torch.compile traces) and when run in a simulated world (tests/torch_worlds.py);
* values in a world of W threads against the gather / reduce-scatter of every rank's data; several Bs are one
  fused call;
* argument checks (the op, the argument, what was received, what was expected) and the fallbacks to torch's op;
* the switch: installed and removed (the dispatcher's kernels, the pass's setting, the group's mark); calls of
  ``torch.ops.symm_mem`` reaching tilescale (its CPU kernels, in the simulated world) and, for what tilescale does not
  serve, torch's kernel; an Inductor compile of examples/distributed/example_inductor_async_tp.py's block with the
  pass on, whose code calls the fused ops, which reach tilescale, with Inductor's checks of their outputs' shapes
  and strides passing.

The same on GPUs against torch.ops.symm_mem (PyTorch's own test cases): tests/test_async_tp_gpu.py and the example."""
import functools
import importlib.util
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch_worlds import MirrorWorld, ThreadWorld, randn, world_fixture  # noqa: E402,F401  (the fixture `world`)

import tilescale  # noqa: E402
from tilescale import compat, runtime  # noqa: E402
from tilescale.errors import NotInitializedError, OpArgumentError, OpArgumentTypeError  # noqa: E402
from tilescale.pytorch import async_tp, inductor_async_tp, torch_ops  # noqa: E402

compat.symm_mem_module()            # torch.ops.symm_mem.* registered
AG, RS = async_tp.AG, async_tp.RS
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "distributed" / "example_inductor_async_tp.py"


@pytest.fixture
def fake_group():
    """init(W) -> the name of a torch.distributed world of W ranks in this process, rank 0 of it (torch's fake
    backend: collectives do nothing): where torch's meta kernels of the symm_mem ops read the group's size."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(W):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=W)
        return dist.group.WORLD.group_name

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def no_switch():
    """The switch is removed after the test, whatever happened (and was not installed before it)."""
    assert inductor_async_tp.installed() is None
    yield
    left = inductor_async_tp.installed()
    if left is not None:
        left.remove()


def layout(t):
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def layouts(result):
    """The layouts of a fused op's results: (A, [outputs]) or a tensor."""
    if isinstance(result, torch.Tensor):
        return layout(result)
    A, outs = result
    return layout(A), [layout(o) for o in outs]


# --------------------------------------------------------------------------------------------- layouts
AG_DIMS = [((8, 64, 32), 0), ((8, 64, 32), 1), ((8, 64, 32), 2), ((4, 8, 12, 32), 0), ((4, 8, 12, 32), 1),
           ((4, 8, 12, 32), 2), ((4, 8, 12, 32), 3)]      # (the gathered A's shape, gather_dim)


def ag_inputs(full, gather_dim, W, n_bs, dtype):
    shape = list(full)
    shape[gather_dim] //= W
    return randn(*shape, seed=1, dtype=dtype), [randn(full[-1], 8 * (i + 1), seed=10 + i, dtype=dtype)
                                                for i in range(n_bs)]


def assert_torchs_layouts(op, args, kwargs, group_name):
    """`op` of tilescale (traced under FakeTensorMode, and run) gives the layouts torch's meta kernel gives."""
    fns = {AG: async_tp.fused_all_gather_matmul, RS: async_tp.fused_matmul_reduce_scatter}
    with FakeTensorMode() as mode:
        fake = [[mode.from_tensor(t) for t in a] if isinstance(a, list) else
                mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        want = layouts(getattr(torch.ops.symm_mem, op)(*fake, group_name, **kwargs))
        traced = layouts(fns[op](*fake, group_name, **kwargs))
    ran = layouts(fns[op](*args, group_name, **kwargs))
    assert traced == want, f"traced {traced}, torch's {want}"
    assert ran == want, f"ran {ran}, torch's {want}"


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("full,gather_dim", AG_DIMS)
@pytest.mark.parametrize("n_bs,dtype", [(1, torch.bfloat16), (3, torch.bfloat16), (2, torch.float32)])
@pytest.mark.parametrize("return_A", [True, False])
def test_all_gather_matmul_layouts_are_torchs(world, fake_group, W, full, gather_dim, n_bs, dtype, return_A):
    gn = fake_group(W)
    world(MirrorWorld(W)).world_names.add(gn)
    A, Bs = ag_inputs(full, gather_dim, W, n_bs, dtype)
    assert_torchs_layouts(AG, (A, Bs, gather_dim), {"return_A": return_A}, gn)


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("shape,scatter_dim", [((8, 16, 32), 0), ((8, 16, 32), 1), ((8, 16, 32), 2),
                                               ((4, 8, 12, 32), 0), ((4, 8, 12, 32), 1), ((4, 8, 12, 32), 2),
                                               ((4, 8, 12, 32), 3)])
@pytest.mark.parametrize("reduce_op,dtype", [("sum", torch.bfloat16), ("avg", torch.float32)])
def test_matmul_reduce_scatter_layouts_are_torchs(world, fake_group, W, shape, scatter_dim, reduce_op, dtype):
    """Contiguous, as torch's, for every scatter_dim (scatter_dim 1 and 2 were strided views of the GEMM+RS result:
    strides (64, 1, 512) where torch's are (2048, 32, 1))."""
    gn = fake_group(W)
    world(MirrorWorld(W)).world_names.add(gn)
    A, B = randn(*shape, seed=1, dtype=dtype), randn(shape[-1], 16, seed=2, dtype=dtype)
    assert_torchs_layouts(RS, (A, B, reduce_op, scatter_dim), {}, gn)


def test_layouts_of_strided_operands_are_torchs(world, fake_group):
    """A_shard laid out as Inductor's pass passes it (``A.movedim(dim, 0)`` contiguous), B transposed (an
    nn.Linear weight's .t())."""
    gn = fake_group(2)
    world(MirrorWorld(2)).world_names.add(gn)
    A = randn(16, 8, 32, seed=1, dtype=torch.bfloat16).transpose(0, 1)      # (8, 16, 32), dim 1 outermost
    Bt = randn(24, 32, seed=2, dtype=torch.bfloat16).t()
    assert_torchs_layouts(AG, (A, [Bt, Bt], 1), {"return_A": True}, gn)
    assert_torchs_layouts(RS, (A, Bt, "sum", 1), {}, gn)


# ---------------------------------------------------------------------------------------------- values
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("shape,gather_dim", [((4, 6, 16), 0), ((4, 6, 16), 1), ((4, 6, 16), -1),
                                              ((2, 3, 4, 16), 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_all_gather_matmul_matches_torch_semantics(world, W, shape, gather_dim, dtype):
    w = world(ThreadWorld(W))
    shards = [randn(*shape, seed=r, dtype=dtype) for r in range(W)]
    K = shape[-1] * (W if gather_dim == -1 else 1)
    Bs = [randn(K, 8, seed=100, dtype=dtype), randn(K, 16, seed=101, dtype=dtype)]
    A_ref = torch.cat(shards, dim=gather_dim)
    tol = {} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}

    def rank(r):
        return async_tp.fused_all_gather_matmul(shards[r], Bs, gather_dim, "world")

    for A, outs in w.run(rank):
        torch.testing.assert_close(A, A_ref)
        for o, B in zip(outs, Bs, strict=True):
            torch.testing.assert_close(o.float(), A_ref.float() @ B.float(), **tol)
    if dtype == torch.bfloat16 and gather_dim != -1:   # the gather overlapped with both GEMMs: one call, N = 8 + 16
        assert w.ag_gemm_ns == [24]
    A, outs = w.run(lambda r: async_tp.fused_all_gather_matmul(shards[r], Bs[:1], gather_dim, "world",
                                                                return_A=False))[0]
    assert A is None and len(outs) == 1
    torch.testing.assert_close(outs[0].float(), A_ref.float() @ Bs[0].float(), **tol)


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("scatter_dim,reduce_op", [(0, "sum"), (1, "avg"), (-1, "sum"), (2, "avg")])
def test_fused_matmul_reduce_scatter_matches_torch_semantics(world, W, scatter_dim, reduce_op):
    w = world(ThreadWorld(W))
    As = [randn(2 * W, 3 * W, 16, seed=r) for r in range(W)]
    B = randn(16, 4 * W, seed=100)
    full = sum(a @ B for a in As)
    if reduce_op == "avg":
        full = full / W
    want = full.chunk(W, dim=scatter_dim)
    for r, got in enumerate(w.run(lambda r: async_tp.fused_matmul_reduce_scatter(As[r], B, reduce_op, scatter_dim,
                                                                                   "world"))):
        torch.testing.assert_close(got, want[r])
        assert got.is_contiguous()


# ------------------------------------------------------------------------------------ arguments, fallbacks
@pytest.mark.parametrize("call,match", [
    (lambda a, b: async_tp.fused_all_gather_matmul(a[0], [b], 0, "world"),
     r"fused_all_gather_matmul: A_shard: got a float32 tensor of shape \(8,\) on cpu, expected a tensor of at least 2"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [], 0, "world"),
     r"fused_all_gather_matmul: Bs: got an empty list, expected at least one B"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [b, b[None]], 0, "world"),
     r"fused_all_gather_matmul: Bs\[1\]: got a float32 tensor of shape \(1, 8, 4\) on cpu, expected a 2-D tensor"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [b[:4]], 0, "world"),
     r"Bs\[0\]: got a float32 tensor of shape \(4, 4\) on cpu, expected 8 rows: the last dim of A = "
     r"all_gather\(A_shard of shape \(4, 8\), dim=0\) over 2 ranks"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [b], -1, "world"),
     r"Bs\[0\]: got .* expected 16 rows: the last dim of A = all_gather\(A_shard of shape \(4, 8\), dim=-1\)"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [b], 2, "world"),
     r"fused_all_gather_matmul: gather_dim: got 2, expected a dim of the 2-D A_shard, in \[-2, 2\)"),
    (lambda a, b: async_tp.fused_all_gather_matmul(a, [b], True, "world"),
     r"gather_dim: got True, expected a dim of the 2-D A_shard"),
    (lambda a, b: async_tp.fused_matmul_reduce_scatter(a, b.t(), "sum", 0, "world"),
     r"fused_matmul_reduce_scatter: B: got a float32 tensor of shape \(4, 8\) on cpu, expected 8 rows \(the last "
     r"dim of A, of shape \(4, 8\)\)"),
    (lambda a, b: async_tp.fused_matmul_reduce_scatter(a, b[None], "sum", 0, "world"),
     r"fused_matmul_reduce_scatter: B: got .* shape \(1, 8, 4\) on cpu, expected a 2-D tensor"),
    (lambda a, b: async_tp.fused_matmul_reduce_scatter(a, b, "sum", -3, "world"),
     r"fused_matmul_reduce_scatter: scatter_dim: got -3, expected a dim of the 2-D A, in \[-2, 2\)"),
    (lambda a, b: async_tp.fused_matmul_reduce_scatter(a[:3], b, "sum", 0, "world"),
     r"scatter_dim: got 0, expected a dim of A @ B whose size \(3 here\) is a multiple of the world size 2"),
    (lambda a, b: async_tp.fused_matmul_reduce_scatter(a, b[:, :3], "avg", 1, "world"),
     r"scatter_dim: got 1, expected a dim of A @ B whose size \(3 here\) is a multiple of the world size 2"),
])
def test_arguments_are_checked(world, call, match):
    world(MirrorWorld(2))
    with pytest.raises(OpArgumentError, match=match):
        call(randn(4, 8), randn(8, 4))


def test_a_non_tensor_is_a_type_error(world):
    world(MirrorWorld(2))
    with pytest.raises(OpArgumentTypeError, match=r"fused_matmul_reduce_scatter: A: got list \[1, 2\], expected"):
        async_tp.fused_matmul_reduce_scatter([1, 2], randn(8, 4), "sum", 0, "world")


def test_drop_ins_fall_back_to_torch(world, monkeypatch, caplog):
    world(MirrorWorld(2))
    seen = []

    class SymmMem:
        def fused_all_gather_matmul(self, *a, **k):
            seen.append(("ag", a[3], k))
            return None, []

        def fused_matmul_reduce_scatter(self, *a):
            seen.append(("rs", a[2], a[4]))
            return a[0]

    monkeypatch.setattr(torch.ops, "symm_mem", SymmMem(), raising=False)
    a, b = randn(4, 8), randn(8, 4)
    with caplog.at_level(logging.DEBUG, logger="tilescale.ops"):
        async_tp.fused_all_gather_matmul(a, [b], 0, "tp_subgroup")
        async_tp.fused_matmul_reduce_scatter(a, b, "max", 0, "world")
        async_tp.fused_matmul_reduce_scatter(a.double(), b.double(), "sum", 0, "world")
        async_tp.fused_all_gather_matmul(a.half(), [b], 0, "world", return_A=False)
    assert seen == [("ag", "tp_subgroup", {"return_A": True}), ("rs", "max", "world"), ("rs", "sum", "world"),
                    ("ag", "world", {"return_A": False})]
    assert "group 'tp_subgroup' is not the whole world" in caplog.text and "reduce_op 'max'" in caplog.text
    assert "torch.ops.symm_mem.fused_all_gather_matmul (group 'tp_subgroup'" in caplog.text
    assert "dtype torch.float64" in caplog.text and "dtype torch.float32" in caplog.text


def test_a_subgroup_runs_torchs_op(world, fake_group):
    """A group other than the whole world (a TP group of 2 in a world of 4) goes to torch.ops.symm_mem itself (here
    its meta kernel, under FakeTensorMode: gathered over the subgroup's 2 ranks), and to no tilescale op."""
    gn = fake_group(4)
    sub = dist.new_group([0, 1]).group_name
    w = world(MirrorWorld(4))
    w.world_names.add(gn)
    with FakeTensorMode() as mode:
        a, b = mode.from_tensor(randn(4, 6, 8)), mode.from_tensor(randn(8, 16))
        A, (c,) = async_tp.fused_all_gather_matmul(a, [b], 1, sub)
        y = async_tp.fused_matmul_reduce_scatter(a, b, "sum", 1, sub)
        assert A.shape == (4, 12, 8) and c.shape == (4, 12, 16) and y.shape == (4, 3, 16)
        A, (c,) = async_tp.fused_all_gather_matmul(a, [b], 1, gn)
        assert A.shape == (4, 24, 8)


def test_the_whole_world_is_the_runtimes_ranks(fake_group, monkeypatch):
    """TilescaleBackend.is_world_group: a group of every rank of tilescale's runtime, in order; not a subgroup, not
    a world of another size, not an unknown name; without tilescale's runtime, its error (what to call)."""
    gn = fake_group(4)
    sub = dist.new_group([0, 1]).group_name
    be = torch_ops.TilescaleBackend()
    with pytest.raises(NotInitializedError, match=r"init_distributed\(\)"):
        be.is_world_group(gn)

    class Runtime:
        def __init__(self, W):
            self.info = runtime.DistInfo(rank=0, world_size=W, local_rank=0, local_world_size=W)

    monkeypatch.setattr(runtime, "current", lambda: Runtime(4))
    assert be.is_world_group(gn) and be.is_world_group(None)
    assert not be.is_world_group(sub) and not be.is_world_group("no such group")
    monkeypatch.setattr(runtime, "current", lambda: Runtime(2))
    assert not be.is_world_group(gn)


# ------------------------------------------------------------------------------------------------- switch
def kernel_file(op: str, key: str) -> str | None:
    """The file that registered the kernel of symm_mem::<op> for dispatch key `key` (torch's dispatch table)."""
    for line in torch._C._dispatch_dump_table(f"symm_mem::{op}").splitlines():
        if line.startswith(f"{key}: registered at "):
            return line.split("registered at ", 1)[1].rsplit(":", 1)[0]
    return None


TORCHS = str(Path(compat.symm_mem_module().__file__))
OURS = str(Path(inductor_async_tp.__file__))


def test_switch_marks_the_tp_groups_given(fake_group, no_switch):
    """groups=: the TP groups (a ProcessGroup, a name) are marked for symmetric memory with the world's, so that the
    pass fuses their collectives too; a group not given stays unmarked."""
    from torch.distributed._symmetric_memory import is_symm_mem_enabled_for_group

    fake_group(4)                                     # (rank 0; every group made on every rank)
    tp, _, other, by_name = (dist.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [0, 3]))
    with inductor_async_tp.use_for_inductor_async_tp(groups=[tp, by_name.group_name]):
        assert all(is_symm_mem_enabled_for_group(g.group_name) for g in (tp, by_name))
        assert not is_symm_mem_enabled_for_group(other.group_name)


def test_switch_installs_and_removes(fake_group, no_switch):
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import is_symm_mem_enabled_for_group

    gn = fake_group(2)
    assert [kernel_file(op, "CUDA") for op in (AG, RS)] == [TORCHS, TORCHS]
    assert not inductor_config._micro_pipeline_tp
    sw = tilescale.pytorch.use_for_inductor_async_tp()
    assert inductor_async_tp.installed() is sw and sw.installed
    assert [kernel_file(op, k) for op in (AG, RS) for k in ("CUDA", "Meta", "CPU")] == [OURS, TORCHS, None] * 2
    assert inductor_config._micro_pipeline_tp and is_symm_mem_enabled_for_group(gn)
    with pytest.raises(RuntimeError, match="use_for_inductor_async_tp: already installed"):
        inductor_async_tp.use_for_inductor_async_tp()
    sw.remove()
    assert [kernel_file(op, "CUDA") for op in (AG, RS)] == [TORCHS, TORCHS]
    assert not inductor_config._micro_pipeline_tp and inductor_async_tp.installed() is None and not sw.installed
    sw.remove()                                   # a second removal does nothing
    with inductor_async_tp.use_for_inductor_async_tp(enable_pass=False) as sw:
        assert kernel_file(AG, "CUDA") == OURS and not inductor_config._micro_pipeline_tp
    assert kernel_file(AG, "CUDA") == TORCHS and inductor_async_tp.installed() is None


def test_switch_overrides_torchs_python_kernels_where_impl_refuses_by_default(fake_group, no_switch, monkeypatch):
    """torch 2.11's ``Library.impl`` refuses to replace a kernel registered from Python unless
    ``allow_override=True`` (2.14's default): torch's own symm_mem CUDA kernels are such (4 H200s, torch 2.11:
    'already a kernel registered from python overriding fused_all_gather_matmul's behavior')."""
    impl = torch.library.Library.impl

    def impl_211(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=False):
        return impl(self, op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=allow_override)

    monkeypatch.setattr(torch.library.Library, "impl", impl_211)
    # torch 2.11 registers its kernels with Library.impl, which notes them (2.14 registers them otherwise)
    monkeypatch.setattr(torch.library, "_impls", set(torch.library._impls) | {f"symm_mem/{op}/CUDA" for op in (AG, RS)})
    fake_group(2)
    with inductor_async_tp.use_for_inductor_async_tp(enable_pass=False):
        assert [kernel_file(op, "CUDA") for op in (AG, RS)] == [OURS, OURS]
    assert [kernel_file(op, "CUDA") for op in (AG, RS)] == [TORCHS, TORCHS]


def test_switch_takes_one_device_type_or_a_sequence(fake_group, no_switch):
    """A device type alone is one type (not its letters); an empty or non-string one is refused, naming it."""
    fake_group(2)
    with inductor_async_tp.use_for_inductor_async_tp(enable_pass=False, device_types="cpu") as sw:
        assert sw.device_types == ("cpu",) and kernel_file(AG, "CPU") == OURS
    for bad in ((), ["cuda", 3]):
        with pytest.raises(TypeError, match=r"use_for_inductor_async_tp: device_types: got .*expected a device type"):
            inductor_async_tp.use_for_inductor_async_tp(enable_pass=False, device_types=bad)
        assert inductor_async_tp.installed() is None


def test_switch_puts_back_the_pass_setting_it_found(fake_group, no_switch):
    import torch._inductor.config as inductor_config

    fake_group(2)
    with inductor_config.patch(_micro_pipeline_tp=True):
        with inductor_async_tp.use_for_inductor_async_tp():
            pass
        assert inductor_config._micro_pipeline_tp


def test_switch_with_the_pass_needs_torch_distributed(no_switch):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"torch.distributed is not initialised: call tilescale.init_distributed"):
        inductor_async_tp.use_for_inductor_async_tp()
    assert inductor_async_tp.installed() is None and kernel_file(AG, "CUDA") == TORCHS


def test_switch_routes_the_symm_mem_ops_to_tilescale(world, no_switch):
    """torch.ops.symm_mem.* (what Inductor's compiled code calls) run tilescale's drop-ins while the switch is
    installed: torch has no CPU kernel of them, so their CPU calls fail before and after, and give tilescale's
    results (W ranks as threads) in between."""
    W = 2
    w = world(ThreadWorld(W))
    shards = [randn(2, 4, 16, seed=r, dtype=torch.bfloat16) for r in range(W)]
    Bs = [randn(16, 8, seed=100, dtype=torch.bfloat16), randn(16, 16, seed=101, dtype=torch.bfloat16)]
    ag, rs = torch.ops.symm_mem.fused_all_gather_matmul, torch.ops.symm_mem.fused_matmul_reduce_scatter

    def rank(r):
        A, outs = ag(shards[r], Bs, 1, "world", return_A=True)
        return A, outs, rs(shards[r], Bs[1], "avg", 1, "world")

    with pytest.raises(NotImplementedError, match="symm_mem::fused_all_gather_matmul"):
        rank(0)
    with inductor_async_tp.use_for_inductor_async_tp(enable_pass=False, device_types=("cpu",)) as sw:
        results = w.run(rank)
    A_ref = torch.cat(shards, dim=1)
    y_ref = (sum(s.float() @ Bs[1].float() for s in shards) / W).chunk(W, dim=1)
    for r, (A, outs, y) in enumerate(results):
        torch.testing.assert_close(A, A_ref)
        for o, B in zip(outs, Bs, strict=True):
            torch.testing.assert_close(o.float(), A_ref.float() @ B.float(), atol=5e-2, rtol=2e-2)
        torch.testing.assert_close(y.float(), y_ref[r], atol=5e-2, rtol=2e-2)
    assert w.ag_gemm_ns == [24] and sw.calls[AG] > 0 and sw.calls[RS] > 0 and sw.calls[f"{AG} (torch)"] == 0
    with pytest.raises(NotImplementedError, match="symm_mem::fused_all_gather_matmul"):
        rank(0)


def test_switch_sends_what_tilescale_does_not_serve_to_torchs_kernel(world, monkeypatch, no_switch):
    w = world(MirrorWorld(2))
    seen = []

    def torchs(op):
        def kernel(*args, **kwargs):
            seen.append((op, args[2:], kwargs))
            return (None, [args[0]]) if op == AG else args[0]

        return kernel

    monkeypatch.setattr(compat, "symm_mem_kernel", torchs)
    a, b = randn(4, 8), randn(8, 4)
    with inductor_async_tp.use_for_inductor_async_tp(enable_pass=False, device_types=("cpu",)) as sw:
        torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, "tp_subgroup", return_A=False)
        torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "max", 0, "world")
        torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, "world")    # served
    assert seen == [(AG, (0, "tp_subgroup"), {"return_A": False}), (RS, ("max", 0, "world"), {})]
    assert sw.calls == {AG: 1, f"{AG} (torch)": 1, RS: 2, f"{RS} (torch)": 1}
    assert w.calls == ["reduce_scatter"]     # the served call (fp32: torch's GEMM, then tilescale's reduce_scatter)


def _example():
    spec = importlib.util.spec_from_file_location("example_inductor_async_tp_for_cpu_tests", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_inductor_compiles_the_example_block_onto_tilescale(world, fake_group, no_switch):
    """The example's TP block compiled by Inductor (CPU) with the switch on, in a mirror world of 2 ranks (every rank
    holds the same tokens): the pass rewrote its 2 all-gathers (3 and 2 Bs, gathered along dim 1) and 2
    reduce-scatters (dim 1) into the fused ops, which ran tilescale's drop-ins (its CPU kernels; each all-gather one
    fused call of its Bs concatenated); Inductor's checks of the fused ops' output shapes, strides and dtypes (in the
    generated code) passed; the output equals the block with the mirror world's collectives."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    ex = _example()
    W, batch, seq, H, heads, Fd = 2, 2, 64, 64, 4, 128
    gn = fake_group(W)
    w = world(MirrorWorld(W))
    w.world_names.add(gn)
    cpu, bf = torch.device("cpu"), torch.bfloat16
    p = ex.weights(0, W, H, heads, Fd, cpu, bf)
    x = ex.tokens(0, W, batch, seq, H, cpu, bf)
    gather, scatter = ex.funcol_collectives(gn)
    fn = functools.partial(ex.block, p=p, gather=gather, scatter=scatter, heads=heads // W)
    with inductor_config.patch(compile_threads=1), torch.no_grad():
        want = ex.block(x, p, lambda t, d: torch.cat([t] * W, d), lambda t, d: (t * W).chunk(W, d)[0], heads // W)
        with inductor_async_tp.use_for_inductor_async_tp(device_types=("cpu",)) as sw:
            got, code = run_and_get_code(torch.compile(fn, fullgraph=True), x)
    code = "\n".join(code)
    calls = [ln.strip() for ln in code.splitlines() if "= torch.ops.symm_mem." in ln]
    assert len(calls) == 4 and sum(f"{AG}.default(" in c for c in calls) == 2, calls
    if torch.__version__ >= (2, 14):     # Inductor checks the fused ops' outputs (with the strides) in its code
        assert "assert_tensor_metadata(" in code
    assert sw.calls == {AG: 2, RS: 2}, sw.calls
    assert w.ag_gemm_ns == [3 * H // W, 2 * Fd // W]     # q, k, v in one call; w1, w3 in another
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-2
