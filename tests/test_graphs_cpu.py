"""CUDA graphs on CPU (tilescale/ops/capture.py): the device call counter ``T.call_number`` (lowering and
errors), every collective's kernel counting its calls on the device (no epoch scalar left; the hierarchical
ones included), the fused ops' kernels (GEMM+RS counting on the device, AG+GEMM's flags set to 1), capture
refused by an op that counts on the host and by construction, accepted by the collectives and fused ops without
stream-order changes, the slot of AllGather and AllGatherHierarchical by the device's parity, tilescale.distributed's
routing of captured calls, and no new host work per eager call. The GPU side (1,000 replays against references):
tests/gpu/graphs_main.py, tests/gpu/fused_graphs_main.py; the hierarchical AllGather's:
tests/gpu/hierarchical_main.py."""
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tilescale  # noqa: E402
import tilescale.language as T  # noqa: E402
from tilescale import errors  # noqa: E402
from tilescale.ops import all_to_all, allgather, allreduce, base, capture, checks, reduce_scatter  # noqa: E402
from tilescale.ops import allgather_gemm as ag_gemm  # noqa: E402
from tilescale.ops import allgather_hierarchical as agh  # noqa: E402
from tilescale.ops import broadcast_from_root as broadcast  # noqa: E402
from tilescale.ops import gemm_reduce_scatter as gemm_rs  # noqa: E402
from tilescale.ops import reduce_scatter_hierarchical as rsh  # noqa: E402
from tilescale.ops import reduce_to_root as reduce  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_codegen import kernel_function, lower_source  # noqa: E402

KERNELS = {   # every collective's kernel: (jit function, args, blocks of its grid)
    "allgather": (allgather.allgather_kernel, (4, 8, "bfloat16"), 32),
    "allreduce_one_shot": (allreduce.allreduce_one_shot_kernel, (4, 16, "bfloat16"), 16),
    "allreduce_two_shot": (allreduce.allreduce_two_shot_kernel, (4, 32, "float32"), 32),
    "reduce_scatter": (reduce_scatter.reduce_scatter_kernel, (4, 16, "float16"), 16),
    "all_to_all": (all_to_all.all_to_all_kernel, (4, 4), 16),
    "broadcast": (broadcast.broadcast_kernel, (4, 8), 8),
    "reduce": (reduce.reduce_kernel, (4, 16, "bfloat16"), 16),
    "allgather_hierarchical": (agh.allgather_hierarchical_kernel, (8, 2, 4, "bfloat16"), 32),
    "reduce_scatter_hierarchical": (rsh.reduce_scatter_hierarchical_kernel, (8, 4, 16, "float16"), 16),
}
GRAPH_SAFE_OPS = (allgather.AllGather, allreduce.AllReduce, reduce_scatter.ReduceScatter, all_to_all.AllToAll,
                  broadcast.Broadcast, reduce.Reduce, agh.AllGatherHierarchical, rsh.ReduceScatterHierarchical)
SLOTTED = (allgather.AllGather, agh.AllGatherHierarchical)   # a call's result is one of two slots




@pytest.fixture
def lowering(monkeypatch):
    """The environment test_codegen lowers in: no NVSHMEM / build-mode settings of this shell."""
    from tilescale import discovery

    for name in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM",
                 "TILESCALE_USE_DISTRIBUTED", "TILELANG_USE_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    discovery.clear_cache()
    yield
    discovery.clear_cache()


# ------------------------------------------------------------------------------- T.call_number
def _first_statement(src: str) -> str:
    body = kernel_function(src).split("{", 1)[1]
    decl = re.compile(r"(float|int) \w+\[\d+\];")   # register arrays come first
    lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not decl.match(ln.strip())]
    return lines[0]


def test_call_number_lowers_to_one_call_before_any_branch(lowering):
    @T.prim_func
    def counted(x: T.Tensor((8,), "float32"), counters: T.Tensor((4,), "int64"), sig: T.Tensor((4,), "uint64")):
        with T.Kernel(4, threads=128) as b:
            e = T.call_number(counters)
            if T.get_thread_binding() == 0:
                T.wait_until(sig[b], cmp="ge", value=e)
            x[b * 2 + T.cast(e % 2, "int32")] = T.cast(T.max(e, 2) - 2, "float32")

    src = lower_source(counted)
    assert _first_statement(src) == "uint64_t e = tilescale::call_number((&(counters[0])), 4);", kernel_function(src)
    assert src.count("tilescale::call_number(") == 1     # bound once, used three times
    assert "int64_t* counters" in kernel_function(src)   # writable


def test_call_number_rejects_a_wrong_counters_buffer(lowering):
    for dtype, shape in (("uint64", (4,)), ("int32", (4,)), ("int64", (2, 2))):
        with pytest.raises(errors.LanguageError, match=r"T.call_number: counters: buffer 'c' is a .* expected a 1-D "
                                                       r"int64 buffer in global memory"):
            @T.prim_func
            def bad(c: T.Tensor(shape, dtype)):
                with T.Kernel(4, threads=128):
                    T.call_number(c)


def test_the_device_function_counts_atomically_per_block():
    src = (__import__("pathlib").Path(tilescale.__file__).parent / "include" / "tilescale" / "ops.cuh").read_text()
    fn = src[src.index("uint64_t count_call("):src.index("end of call numbers")]   # count_call, both call numbers
    assert "atomicAdd(" in fn and "__shared__" in fn and "__syncthreads()" in fn and "wait_timed_out(" in fn
    assert "blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)" in fn


# ------------------------------------------------------------------- the collectives' kernels
@pytest.mark.parametrize("name", list(KERNELS))
def test_collective_kernels_count_calls_on_the_device(lowering, name):
    fn, args, blocks = KERNELS[name]
    func = fn.get_tir(*args)
    scalars = [p.name for p in func.params if p not in func.buffer_map]
    assert not [s for s in scalars if "epoch" in s or "round" in s], f"a host call count is a parameter: {scalars}"
    bufs = {func.buffer_map[p].name: func.buffer_map[p] for p in func.params if p in func.buffer_map}
    c = bufs.get("counters")
    assert c is not None and str(c.dtype) == "int64" and [int(d) for d in c.shape] == [blocks], bufs
    src = lower_source(func)
    assert src.count("tilescale::call_number(") == 1
    assert re.fullmatch(rf"uint64_t \w+ = tilescale::call_number\(\(&\(counters\[0\]\)\), {blocks}\);",
                        _first_statement(src)), kernel_function(src)


def test_gemm_rs_kernels_count_calls_on_the_device(lowering):
    """Both kernels of GEMM+RS take their own call counters (one word per block) and the partials' two halves
    (of the op's bound: its row tiles are a run-time size, `row_blocks`), and no epoch from the host: the GEMM
    writes and the reduction reads the half of e % 2, and the reduction waits for e x per_block finished stores."""
    N, K, W, per_block, blocks = 512, 256, 2, 512 // 256, 4     # per_block: a count per column tile
    gemm = gemm_rs.gemm_rs_gemm_kernel.get_tir(N, K, W)
    red = gemm_rs.gemm_rs_reduce_kernel.get_tir(N, W, per_block, blocks)
    for func, n_counters in ((gemm, "2 * row_blocks"), (red, str(blocks))):
        assert [p.name for p in func.params if p not in func.buffer_map] == [], "a host call count is a parameter"
        bufs = {func.buffer_map[p].name: func.buffer_map[p] for p in func.params}
        assert [str(d) for d in bufs["counters"].shape] == [n_counters] and str(bufs["counters"].dtype) == "int64"
        assert [str(d) for d in bufs["P"].shape] == ["p_rows", str(N)]
        src = lower_source(func)
        assert src.count("tilescale::call_number(") == 1, kernel_function(src)
    gemm_src, red_src = kernel_function(lower_source(gemm)), kernel_function(lower_source(red))
    # the GEMM stores its tile (a TMA store) into the half of e % 2 (row M = 1024 further for odd calls), then counts
    # it once written...
    assert re.search(r"\(\(int\)\(e & \(uint64_t\)1\)\) \* row_blocks\)", gemm_src), gemm_src   # the half
    counted = gemm_src.index("tilescale::release_stores<2, unsigned long long, 0>(")   # every store written
    assert gemm_src.index("tl::tma_store(P_desc") < counted
    assert gemm_src.count("tilescale::release_stores<") == 1             # once per tile, by the storing warp
    # (compat.storing_warp; then tilelang's bounds checks of a run-time size)
    assert re.search(r"if \(\(\(\(int\)threadIdx.x\) >> 5\) == 8\) \{(\s*if \([^{]*\) \{)*\s*$", gemm_src[:counted])
    # ...the reduction waits for e x per_block finished stores of the row block
    assert re.search(rf"wait_until_pe<unsigned long long>\(.*done\[.*, \(e \* \(uint64_t\){per_block}\),", red_src)


def test_ag_gemm_kernel_waits_for_flags_set_to_one(lowering):
    """AG+GEMM's flags are set to 1 and reset (no call count at all): the GEMM has no scalar parameter (the rows are
    sizes of its buffers) and its tiles of other ranks' rows wait for arrived >= 1."""
    func = ag_gemm.ag_gemm_kernel.get_tir(512, 256, 2, 2)
    assert [p.name for p in func.params if p not in func.buffer_map] == []
    src = kernel_function(lower_source(func))
    assert "call_number" not in src
    waits = re.findall(r"tilescale::wait_until<unsigned long long>\(\(&\(arrived\[.*\]\)\), (\d), (.*?), \d+\);", src)
    assert waits == [("3", "(uint64_t)1")], waits      # cmp 3: >=


def test_graph_safety_is_declared_per_op_class():
    for cls in GRAPH_SAFE_OPS + (ag_gemm.AGGemm, gemm_rs.GemmRS):
        assert cls.GRAPH_SAFE is True, cls
    for cls in SLOTTED:   # one implementation of the slot by the device's parity (tilescale.ops.base)
        assert issubclass(cls, base.DoubleBuffered) and "_by_parity" not in vars(cls) and "out" not in vars(cls)
    assert base.Op.GRAPH_SAFE is False    # a new op refuses capture until it counts on the device


# ------------------------------------------------------------------------------ Op.begin
class Launched(Exception):
    pass


class _Order:
    handle = 5                  # the last eager call's stream

    def switch(self, handle):
        raise Launched(f"stream switch to {handle}")


def _op(cls, monkeypatch, capturing: bool, **attrs):
    """An op object without buffers or kernels (no GPU), as if the stream were (not) capturing."""
    monkeypatch.setattr(base, "_capturing", lambda: capturing)
    op = object.__new__(cls)
    op.device = torch.device("cpu")
    op._check = checks.CallCheck(cls.__name__)
    op._agreed = op._check.agreed
    op._stream = lambda: 7
    op._order = _Order()
    op.captured = False
    for k, v in attrs.items():
        setattr(op, k, v)
    return op


def test_fused_ops_capture_and_a_host_counting_op_refuses(monkeypatch):
    agg = _op(ag_gemm.AGGemm, monkeypatch, True, rows=64, K=32, N=48, M=128, dtype=torch.bfloat16, world_size=2)
    bf = torch.bfloat16
    assert agg.begin(torch.zeros(64, 32, dtype=bf), torch.zeros(32, 48, dtype=bf), None) == 7   # no switch
    assert agg.captured
    rs = _op(gemm_rs.GemmRS, monkeypatch, True, M=128, K=32, N=48, dtype=torch.float16, world_size=2)
    assert rs.begin(torch.zeros(128, 32, dtype=torch.float16), torch.zeros(32, 48, dtype=torch.float16), None) == 7

    class HostCounted(allreduce.AllReduce):
        GRAPH_SAFE = False
        NAME = "HostCounted"

    op = _op(HostCounted, monkeypatch, True, shape=(16,), dtype=torch.float32)
    with pytest.raises(errors.GraphCaptureError, match=r"HostCounted: called during CUDA graph capture, which it does "
                                                       r"not support"):
        op.begin(torch.zeros(16), None)


def test_collectives_capture_without_a_stream_order_change(monkeypatch):
    ar = _op(allreduce.AllReduce, monkeypatch, True, shape=(16,), dtype=torch.float32)
    assert ar.begin(torch.zeros(16), None) == 7            # the capture stream, no switch (it would raise)
    assert ar.captured and ar._check.exchanges == 1        # the call checks ran (agreed over gloo: host only)
    with pytest.raises(ValueError, match=r"AllReduce: x: got a float64 tensor"):
        ar.begin(torch.zeros(16, dtype=torch.float64), None)
    eager = _op(allreduce.AllReduce, monkeypatch, False, shape=(16,), dtype=torch.float32)
    with pytest.raises(Launched, match="stream switch to 7"):   # eager: the order is kept as before
        eager.begin(torch.zeros(16), None)
    assert not eager.captured


def test_construction_during_capture_is_refused_on_every_rank(monkeypatch):
    from tilescale import runtime

    seen = []

    class Rt:
        info = type("Info", (), {"world_size": 2, "rank": 0, "local_rank": 0})()

        def all_gather_object(self, obj):
            seen.append(obj)
            return [obj, obj]

    monkeypatch.setattr(runtime, "current", lambda: Rt())
    monkeypatch.setattr(capture, "is_capturing", lambda: True)
    with pytest.raises(errors.GraphCaptureError, match=r"AllReduce: constructed during CUDA graph capture .* make one "
                                                       r"eager call .* \[failed on rank\(s\) 0, 1 of 2"):
        allreduce.AllReduce((16,), torch.float32)
    assert seen and "constructed during CUDA graph capture" in str(seen[0])   # agreed before anyone raised


def test_split_sizes_refuse_capture(monkeypatch):
    from tilescale import runtime

    def no_runtime():   # nothing is exchanged before the refusal
        raise errors.NotInitializedError("no runtime")

    monkeypatch.setattr(runtime, "current", no_runtime)
    monkeypatch.setattr(capture, "is_capturing", lambda: True)
    t = torch.zeros(4, 2)
    monkeypatch.setattr(checks, "this_device", lambda: torch.device("cpu"))
    with pytest.raises(errors.GraphCaptureError, match=r"all_to_all_single: split sizes during CUDA graph capture"):
        all_to_all.all_to_all_single(t, t, [2, 2], [2, 2])


# ------------------------------------------------------------- AllGather's (and the hierarchical one's) slot
def _slotted(cls, count: int, captured: bool = True):
    ag = object.__new__(cls)
    ag._slots = torch.stack([torch.full((4, 3), 10.0), torch.full((4, 3), 20.0)])
    ag.buffers = (ag._slots[0], ag._slots[1])
    ag.counters = torch.full((8,), count, dtype=torch.int64)
    ag.captured, ag.calls = captured, 0
    return ag


@pytest.mark.parametrize("cls", SLOTTED)
def test_allgather_takes_the_slot_by_the_device_parity(cls):
    for count, want in ((1, 10.0), (2, 20.0), (3, 10.0), (1000, 20.0)):   # call e wrote slot (e - 1) % 2
        ag = _slotted(cls, count)
        assert ag._by_parity(None).eq(want).all()
        out = torch.zeros(4, 3)
        assert ag._by_parity(out) is out and out.eq(want).all()
        strided = torch.zeros(3, 4).t()
        assert ag._by_parity(strided).eq(want).all()
    ag = _slotted(cls, 1)
    with pytest.raises(RuntimeError, match=rf"{cls.NAME}: out is one of this op's slots"):
        ag._by_parity(ag.buffers[1])
    for prop in ("out", "next_out"):
        with pytest.raises(RuntimeError, match=rf"{cls.NAME}.{prop}: a call of this op was captured"):
            getattr(ag, prop)
    ag.captured = False
    assert ag.next_out is ag.buffers[0] and ag.out is ag.buffers[0]


@pytest.mark.parametrize("cls", SLOTTED)
def test_slotted_calls_capture_and_launch_the_same_arguments(cls, monkeypatch):
    """A call of AllGather / AllGatherHierarchical: accepted during capture; its launch passes the same arguments
    on every call (both slots, the flags, the call counters, the size: no call number from the host); during and
    after a capture the result is the slot of the device's parity, before it the slot of the host's count."""
    for capturing in (False, True):
        launched = []
        ag = _op(cls, monkeypatch, capturing, shape=(2, 3), out_shape=(4, 3), dtype=torch.float32, n=6,
                 _direct=(lambda *a, seen=launched: seen.append(a) or 0, None))
        slots = _slotted(cls, 0, captured=False)
        ag._slots, ag.buffers, ag.counters, ag.calls = slots._slots, slots.buffers, slots.counters, 0
        ag._ptrs = (ag._slots.data_ptr(), 111, ag.counters.data_ptr())
        ag._order.handle = 7                         # the current stream: no stream switch
        x = torch.zeros(2, 3)
        if not capturing:                            # eager, never captured: the host's count (calls 1, 2, 3)
            assert ag(x) is ag.buffers[0] and ag(x) is ag.buffers[1] and ag.out is ag.buffers[1]
            t = torch.zeros(4, 3)
            assert ag(x, out=t) is t and t.eq(10.0).all() and ag.next_out is ag.buffers[1]
            assert not ag.captured and len(launched) == 3
        else:
            for count, want in ((5, 10.0), (6, 20.0)):   # the kernel has counted the call: e = count
                ag.counters.fill_(count)
                got = ag(x)
                assert ag.captured and got.data_ptr() not in (b.data_ptr() for b in ag.buffers) and got.eq(want).all()
            assert len(launched) == 2
        assert set(launched) == {(x.data_ptr(), ag._slots.data_ptr(), 111, ag.counters.data_ptr(), 6, 7)}, launched


# ----------------------------------------------------------------------- tilescale.distributed
def test_distributed_captures_graph_safe_builtin_plans_only(monkeypatch):
    import tilescale.distributed as dist
    from tilescale.plan import builtin

    # every built-in algorithm, the hierarchical ones included (their ops count calls on the device)
    assert builtin.GRAPH_SAFE == set(builtin.ALGOS)
    assert {"tilescale.allgather.hierarchical", "tilescale.reduce_scatter.hierarchical"} <= builtin.GRAPH_SAFE
    assert agh.AllGatherHierarchical.GRAPH_SAFE and rsh.ReduceScatterHierarchical.GRAPH_SAFE
    assert "CUDA graph capture" not in str(dist._why_not(None, [torch.ones(4)]))
    plan = type("P", (), {"tags": frozenset({"tilescale", "builtin"}), "name": "tilescale.allreduce.one_shot"})()
    assert dist._graph_safe(plan)
    plan.name = "tilescale.allreduce.hier"         # a built-in algorithm not declared graph-safe
    assert not dist._graph_safe(plan)
    plan.tags, plan.name = frozenset({"user"}), "tilescale.allreduce.one_shot"   # a user's plan of that name
    assert not dist._graph_safe(plan)


# ----------------------------------------------------------------- host work per eager call
def test_eager_call_does_no_new_host_work(monkeypatch):
    """The Python functions an eager AllReduce call runs (a signature agreed before, the direct launch): the
    capture check is one function, no other work was added to the call path."""
    launched = []
    ar = _op(allreduce.AllReduce, monkeypatch, False, shape=(16,), dtype=torch.float32, padded=False,
             _direct=(lambda *a: launched.append(a) or 0, None), _ptrs=(1, 2, 3), _dim=4, vshape=(4, 4))
    ar._order.handle = 7
    x, out = torch.zeros(16), torch.zeros(16)
    ar(x, out=out)                                       # first call: agrees on the signature
    names = []

    def prof(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        ar(x, out=out)
    finally:
        sys.setprofile(None)
    assert launched[-1] == (x.data_ptr(), out.data_ptr(), 1, 2, 3, 4, 7)   # no epoch: the counters are in _ptrs
    assert sorted(names) == sorted(["__call__", "begin", "<lambda>", "call_key", "<lambda>",     # (ordered_stream:
                                    "launch_vectors", "launch_direct", "<lambda>"]), names      # inline in begin)


def test_python_calls_counts_the_entries_into_tilescale_of_an_eager_call(monkeypatch):
    """testing.PythonCalls, the count behind graphs_main's and bench_host's 'replays run no tilescale Python': an
    eager AllGather call enters tilescale's functions (counted; this file's mocks are not), a call outside
    tilescale counts nothing, the counter's own __exit__ is not counted, and the previous profile function is
    restored."""
    from tilescale import testing
    from tilescale.profiler import session as profiling

    monkeypatch.setattr(profiling, "current", None)
    launched = []
    ag = _op(allgather.AllGather, monkeypatch, False, shape=(4,), dtype=torch.float32, n=4, calls=0,
             _direct=(lambda *a: launched.append(a) or 0, None), _ptrs=(1, 2, 3))
    ag._order.handle = 7
    ag.buffers = (torch.zeros(8), torch.zeros(8))
    x = torch.zeros(4)
    ag(x)                                                # first call: agrees on the signature
    with testing.PythonCalls() as calls:
        ag(x)
    assert len(launched) == 2
    # (AllGather's call runs Op.begin's steps, its direct launch and slot_result's inline when its signature was
    # agreed before and nothing is captured, profiled or passed as out: issue 15's host time)
    assert calls.functions == {"allgather.py:__call__": 1}, calls.functions
    assert calls.count == 1 and "allgather.py:__call__ x1" in calls.top()
    ag(x, out=torch.zeros(8))                            # out=: the general path (Op.begin, its checks, slot_result)
    with testing.PythonCalls() as general:
        ag(x, out=torch.zeros(8))
    assert general.functions == {"allgather.py:__call__": 1, "base.py:begin": 1, "base.py:call_key": 1,
                                 "base.py:slot_result": 1}, general.functions

    def outside():
        return sum(range(3))

    before = sys.getprofile()
    with testing.PythonCalls() as none:
        outside()
        torch.zeros(2).add_(1)
    assert none.count == 0 and none.functions == {} and none.top() == "none"
    assert sys.getprofile() is before

    seen = []

    def outer(frame, event, arg):
        seen.append(event)

    sys.setprofile(outer)
    try:
        with testing.PythonCalls() as inner:
            testing.ranks_per_gpu_for(4, 2)              # a tilescale function: one entry
        assert sys.getprofile() is outer                 # restored
    finally:
        sys.setprofile(None)
    assert inner.count == 1 and inner.functions == {"testing.py:ranks_per_gpu_for": 1}
    elsewhere = testing.PythonCalls(root=Path(__file__).parent)   # another root: this file's functions
    with elsewhere:
        outside()
    assert elsewhere.functions == {"test_graphs_cpu.py:outside": 1}
