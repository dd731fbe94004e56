"""tilescale.ops.registry on a machine without a GPU: every collective that an op module registers is known,
with no other edit, to tilescale.plan (names, built-in plans, tuning tables), tilescale.distributed (the
torch function it serves), tilescale.ops.prebuild (its kernels) and benchmarks/bench_collectives.py (its
cases), and tilescale.ops exports its module's names without hiding the module."""
import importlib.util
import inspect
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tilescale.distributed as dist  # noqa: E402
import tilescale.ops  # noqa: E402
import tilescale.plan as P  # noqa: E402
from tilescale.ops import prebuild, registry  # noqa: E402
from tilescale.plan import builtin, tuning  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COLLECTIVES = registry.collectives()


def _bench():
    spec = importlib.util.spec_from_file_location("bench_collectives", REPO / "benchmarks" / "bench_collectives.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_collectives_of_the_ops_are_registered():
    names = {c.name for c in COLLECTIVES}
    assert {"allreduce", "allgather", "reduce_scatter", "all_to_all", "broadcast"} <= names
    assert P.COLLECTIVES == tuple(sorted(names))
    assert registry.canonical("All_Reduce") == "allreduce" and registry.canonical("all_gather") == "allgather"
    with pytest.raises(ValueError, match=r"collective: got 'gossip', expected one of all_to_all, allgather"):
        registry.canonical("gossip")


@pytest.mark.parametrize("c", COLLECTIVES, ids=[c.name for c in COLLECTIVES])
def test_a_registered_collective_is_known_everywhere(c):
    for s in c.spellings():                                           # plan names and tuning tables
        assert P.plan.canonical_collective(s) == c.name
    assert set(P.registry.by_collective()) == {x.name for x in COLLECTIVES}
    for a, alg in c.algos.items():
        full = f"tilescale.{c.name}.{a}"
        assert builtin.ALGOS[full] == (c.name, alg.run) and tuning.full_name(c.name, a) == full
        assert builtin.default_ranges().get(full) == (None if alg.nodes == "several" else list(alg.ranges))
        # in its op file (a hierarchical variant: in its own, e.g. tilescale.ops.allgather_hierarchical)
        assert (alg.run.__module__ == c.module or alg.nodes == "several") and inspect.signature(alg.run).parameters
    routed = getattr(dist, c.torch_name)                              # tilescale.distributed
    assert routed is not getattr(torch.distributed, c.torch_name) and c.torch_name in dist.__all__
    params = inspect.signature(routed).parameters
    assert list(params)[-2:] == ["plan", "hints"] and set(c.tensors) <= set(params)
    jobs = prebuild.collective_jobs(4, [1 << 20], ("bfloat16",), 132, ops=[c.torch_name])   # prebuild
    assert jobs and all(j in jobs for j in c.kernels(1 << 20, 4, "bfloat16", 132))
    assert all(hasattr(fn, "get_tir") and isinstance(args, tuple) for fn, args in jobs)
    cases = [(name, a) for name, x, a in _bench().cases(nodes=2) if x is c]   # the benchmark (on several nodes)
    assert [a for _, a in cases] == list(c.algos) and len({n for n, _ in cases}) == len(c.algos)
    mod = importlib.import_module(c.module)                           # tilescale.ops.<module> is the module
    assert getattr(tilescale.ops, mod.__name__.rpartition(".")[2]) is mod and mod.COLLECTIVE is c
    for name in mod.__all__:                                         # and its names are tilescale.ops's
        assert getattr(tilescale.ops, name) is getattr(mod, name) and name in tilescale.ops.__all__


def test_every_op_module_is_reachable_beside_its_function():
    for m in registry.modules():
        leaf = m.__name__.rpartition(".")[2]
        assert getattr(tilescale.ops, leaf) is m, leaf                # no exported name hides a module
    assert callable(tilescale.ops.broadcast) and tilescale.ops.broadcast_from_root.broadcast is tilescale.ops.broadcast
    assert tilescale.ops.ag_gemm is tilescale.ops.allgather_gemm.ag_gemm
    assert tilescale.ops.gemm_rs is tilescale.ops.gemm_reduce_scatter.gemm_rs


def test_a_name_taken_by_another_module_is_refused():
    c = COLLECTIVES[0]
    fields = dict(torch_name="gossip_single", algos={}, tensors=("tensor",), serve=c.serve, kernels=c.kernels,
                  bench=c.bench, busbw=c.busbw, exact=True, module="tilescale.ops.not_a_module")
    with pytest.raises(ValueError, match=rf"\['{c.name}'\] already mean '{c.name}'"):
        registry.collective(c.name, **fields)
    with pytest.raises(ValueError, match=r"already mean"):
        registry.collective("gossip", **{**fields, "aliases": (c.torch_name.upper(),)})
    assert registry.find("gossip") is None


def test_serve_maps_torch_calls_to_plan_calls():
    W = 2
    x, out = torch.zeros(8), torch.zeros(4)
    rs = registry.find("reduce_scatter").serve(W, output=out, input=x, op=None, group=None, async_op=False)
    assert (rs.out, rs.args, rs.key, rs.msg_bytes, dict(rs.kwargs)) == (out, (x,), x, 32, {"op": "sum"})
    assert registry.find("reduce_scatter").serve(W, output=x, input=x) == "input size is not world_size x output size"
    bc = registry.find("broadcast").serve(W, tensor=x, src=None, group_src=1)
    assert bc.args == (1,) and bc.msg_bytes == 32
    assert registry.find("broadcast").serve(W, tensor=x, src=2, group_src=None) == "src 2"
    a2a = registry.find("all_to_all")
    assert a2a.serve(W, output=x, input=x, output_split_sizes=[4, 4], input_split_sizes=None) == "split sizes given"


def test_finding_the_collectives_leaves_the_torch_operators_alone():
    """The registry imports the op modules, not torch_ops / async_tp: those register torch.ops.tilescale.* and
    import torch._dynamo (slow, and it makes a cache directory in the temporary directory), which
    `import tilescale.distributed` and the plans must not pay for."""
    import subprocess
    import sys

    code = ("import sys; from tilescale.ops import registry; registry.collectives(); "
            "print(sorted(m for m in ('tilescale.ops.torch_ops', 'tilescale.ops.async_tp', 'torch._dynamo') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
