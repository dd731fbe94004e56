"""The hierarchical collectives and the topology-aware selector on a machine without a GPU: both kernels compile
and link for sm_90a and make the calls their protocols need (no bound guard skips a signal; RS sums in fp32;
both count their calls on the device, T.call_number, and the AllGather takes its slot and its flag values from
that count: no call number passed from the host, so CUDA graphs replay them correctly);
their docstrings give the torch equivalent and the protocol in numbered steps; the built-in choice across nodes
is the cost model's rule (docs/multinode_model.py) for (world size, node size, bytes), also under
TILESCALE_NODE_SIZE emulation through tilescale.distributed; one node is refused or declined.
Their GPU test: tests/test_hierarchical.py (4 ranks, emulated nodes of 2)."""
import re
from pathlib import Path

import build_pool
import pytest

torch = pytest.importorskip("torch")

from tilescale import topology  # noqa: E402
from tilescale.ops import allgather_hierarchical as agh  # noqa: E402
from tilescale.ops import gemm_multinode, registry  # noqa: E402
from tilescale.ops import reduce_scatter_hierarchical as rsh  # noqa: E402
from tilescale.plan import builtin, multinode, selector  # noqa: E402
from tilescale.plan import registry as plan_registry  # noqa: E402
from tilescale.plan.selector import Request  # noqa: E402

MiB = 1 << 20
CASES = {   # id: (jit function, args: 8 ranks in nodes of 2 or 4 (forward rows exist), tilescale:: calls)
    "allgather_hierarchical": (agh.allgather_hierarchical_kernel, (8, 2, 4, "bfloat16"),
                               {"tilescale::put_signal", "tilescale::wait_until", "tilescale::call_number"}),
    "reduce_scatter_hierarchical": (rsh.reduce_scatter_hierarchical_kernel, (8, 4, 16, "float16"),
                                    {"tilescale::put_signal", "tilescale::wait_until", "tilescale::call_number"}),
}
COUNTED = {   # id: (blocks of the grid: one call counter each, the kernel's only scalar parameter: its run-time size)
    "allgather_hierarchical": (4 * 8, "int n"),
    "reduce_scatter_hierarchical": (16, "int sv"),
}


@pytest.fixture(scope="module")
def builds():
    from build_pool import build_all

    return build_all({k: (fn, args) for k, (fn, args, _) in CASES.items()}).wait()


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_builds_for_sm90(case, builds):
    fn, args, want = CASES[case]
    r = builds[case]
    assert r.spec.distributed and Path(r.library).is_file()
    assert want <= set(re.findall(r"tilescale::[a-z_]+", r.source))
    # a put_signal inside a bound check of its chunk (blockIdx.x: the chunk) would not signal for an empty chunk,
    # and the peer would wait forever; role and peer conditions (blockIdx.y, the rank) are the protocol's
    guards = [c for c in build_pool.enclosing_conditions(r.source, "tilescale::put_signal") if "blockIdx.x" in c]
    assert not guards, f"a put/signal is behind a bound guard (empty chunks would not signal): {guards}"
    nested = "if (a) {\n  for (;;) {\n    tilescale::put_signal(x);\n  }\n}"
    assert build_pool.enclosing_conditions(nested, "put_signal") == ["a"]
    if fn is rsh.reduce_scatter_hierarchical_kernel:
        assert "float acc[" in r.source and "float* part" in r.source, "partials and sums in fp32"


def _kernel_signature(source: str, name: str) -> list[str]:
    m = re.search(rf'^extern "C" __global__ void __launch_bounds__[^\n]* {name}_kernel\(([^)]*)\) \{{$', source, re.M)
    assert m, f"no definition of {name}_kernel in the built source"
    return [p.strip() for p in m.group(1).split(",")]


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_counts_its_calls_on_the_device(case, builds):
    """CUDA graphs: the call number comes from the device (``T.call_number``: one counter per block, bound once,
    before any branch), never from a host scalar, which a replayed graph would keep at its capture's value."""
    src = builds[case].source
    blocks, scalar = COUNTED[case]
    params = _kernel_signature(src, case)
    assert "int64_t* counters" in params, params
    assert [p for p in params if "*" not in p] == [scalar], f"a host-passed call number or epoch: {params}"
    assert src.count("tilescale::call_number(") == 1, "one call number per launch"
    m = re.search(rf"^  uint64_t (\w+) = tilescale::call_number\(\(&\(counters\[0\]\)\), {blocks}\);$", src, re.M)
    assert m, "the call number is not bound once from the counters of every block"
    assert build_pool.enclosing_conditions(src, "tilescale::call_number") == [], "called inside a branch"


def test_allgather_takes_its_slot_and_flag_values_from_the_call_number(builds):
    """Every put / signal and every wait of the hierarchical AllGather addresses the slot s = (e - 1) % 2 of
    this call's number e and uses the flag value r = (e + 1) // 2 (the kernel gets both slots and both flag
    arrays: the device, not the host, picks one)."""
    src = builds["allgather_hierarchical"].source
    e = re.search(r"uint64_t (\w+) = tilescale::call_number\(", src).group(1)
    slot = f"(({e} - (uint64_t)1) & (uint64_t)1)"
    rounds = f"(({e} + (uint64_t)1) >> (uint64_t)1)"
    puts = [ln for ln in src.splitlines() if "tilescale::put_signal" in ln]
    waits = [ln for ln in src.splitlines() if "tilescale::wait_until" in ln]
    assert len(puts) == 2 and len(waits) == 3, (len(puts), len(waits))   # steps 1-2: a put, a wait; 3: a put, 2 waits
    for ln in puts:   # the destination slot of out and of the flags (and the forwarded source): all of slot s
        assert ln.count(slot) >= 2 and rounds in ln, ln[:400]
    for ln in waits:
        assert slot in ln and rounds in ln, ln[:400]
    assert "out[" in "".join(puts) and "flags[" in "".join(waits)


@pytest.mark.parametrize("mod", [agh, rsh])
def test_docstrings_show_torch_and_numbered_protocol(mod):
    doc = mod.__doc__
    assert "torch equivalent" in doc and "torch.distributed." in doc
    steps = [int(n) for n in re.findall(r"^(\d)\. ", doc, re.M)]
    assert steps[:6] == list(range(1, 7)), steps
    assert "Why no handshake" in doc and "wait forever" in doc


def _pick(world, node_size, nbytes, collective):
    req = Request(collective=collective, msg_bytes=nbytes, world_size=world, nranks_per_node=node_size,
                  hints={"prefer": "tilescale"}, dtype="bfloat16", device="cuda")
    p = selector.choose(req).plan
    return p and p.name.rpartition(".")[2]


@pytest.fixture
def plans(tmp_path, monkeypatch):
    from tilescale import runtime

    monkeypatch.setenv("TILESCALE_PLAN_DIR", str(tmp_path / "plans"))
    monkeypatch.delenv("TILESCALE_TUNING_FILE", raising=False)
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)
    plan_registry.clear()
    selector.clear_selector()
    yield
    plan_registry.clear()


@pytest.mark.parametrize("world,node_size", [(4, 2), (8, 4), (16, 8), (32, 8), (64, 8), (128, 8), (8, 1), (4, 4)])
@pytest.mark.parametrize("collective,flat", [("allgather", "push"), ("reduce_scatter", "direct")])
def test_selector_choice_is_the_models_rule(plans, world, node_size, collective, flat):
    model = multinode.model()
    top = multinode.flat_max_bytes(collective, world, node_size)
    sizes = {0, 1024, 64 << 10, MiB, 16 * MiB, 1 << 30, top, top + 1} - {-1}
    for nbytes in sorted(s for s in sizes if 0 <= s < 1 << 62):
        want = model.rule(collective.replace("allgather", "all_gather"), nbytes, world, node_size)
        got = _pick(world, node_size, nbytes, collective)
        assert got == (flat if want == model.FLAT_DIRECT else "hierarchical"), (world, node_size, nbytes, want)


def test_selector_choice_in_numbers(plans):
    """docs/multinode.md's crossovers, as the selector applies them (8 ranks per node; 4 ranks as 2 x 2)."""
    assert _pick(16, 8, 16 * 20 << 10, "allgather") == "push"          # shard 20 KiB on 2 nodes: flat
    assert _pick(16, 8, 16 * 21 << 10, "allgather") == "hierarchical"  # 21 KiB: hierarchical
    assert _pick(32, 8, 32 * 4 << 10, "reduce_scatter") == "direct"
    assert _pick(32, 8, 32 * 5 << 10, "reduce_scatter") == "hierarchical"
    assert _pick(128, 8, 128, "allgather") == "hierarchical"           # 16 nodes: hierarchical from 1 B a shard
    assert _pick(4, 2, 2 * MiB, "allgather") == "hierarchical" and _pick(4, 2, 64 << 10, "allgather") == "push"
    assert _pick(4, 4, 1 << 30, "allgather") == "push"                 # one node: never hierarchical
    assert _pick(4, 2, MiB, "allreduce") == "one_shot"                 # no hierarchical variant: the flat one
    assert all(p.constraints["nranks_per_node"] == 2 for p in builtin.catalog(4, 2))


def test_emulated_nodes_through_tilescale_distributed(tmp_path):
    """4 gloo ranks on one host with TILESCALE_NODE_SIZE=2: tilescale.distributed's requests say 2 ranks per
    node, and the built-in choice for a 2 MiB gather is the hierarchical plan (64 KiB: the flat one)."""
    from test_distributed_cpu import PRELUDE, _run_ranks

    code = PRELUDE + r"""
import tilescale.plan as P
from tilescale import runtime
from tilescale.plan import selector
dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=W, use_tilescale=True)
seen = []
P.set_selector(lambda plans, req: seen.append(req) or None)
x = torch.full((1024,), float(rank))
o = torch.empty(W * 1024)
dist.all_gather_into_tensor(o, x)
out["gathered"] = bool(torch.equal(o, torch.arange(W).float().repeat_interleave(1024)))
out["per_node"] = [r.nranks_per_node for r in seen]
P.clear_selector()
runtime.is_initialized = lambda: True
pick = lambda n: selector.choose(selector.Request("allgather", n, W, seen[0].nranks_per_node,
                                                  {"prefer": "tilescale"}, "bfloat16", "cuda")).plan.name
out["picks"] = [pick(2 << 20), pick(64 << 10)]
dist.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
"""
    import os

    os.environ["TILESCALE_NODE_SIZE"] = "2"
    try:
        results = _run_ranks(tmp_path, code, nranks=4, timeout=180)
    finally:
        del os.environ["TILESCALE_NODE_SIZE"]
    for res in results:
        assert res["gathered"] and res["per_node"] == [2], res
        assert res["picks"] == ["tilescale.allgather.hierarchical", "tilescale.allgather.push"], res


def test_one_node_is_refused_or_declined(monkeypatch):
    from tilescale.errors import OpArgumentError

    one = topology.Topology(4, 4)
    with pytest.raises(OpArgumentError, match=r"topology: got 1 node of 4 ranks, expected a job on several nodes "
                                              r"\(real ones, or emulated with TILESCALE_NODE_SIZE\)"):
        agh.several_nodes("AllGatherHierarchical", one)
    agh.several_nodes("AllGatherHierarchical", topology.Topology(4, 2))
    monkeypatch.setattr(topology, "current", lambda: one)
    x = torch.zeros(8)
    with pytest.raises(registry.PlanUnsupportedError, match="hierarchical allgather on 1 node"):
        agh.run_hierarchical(torch.zeros(32), x)
    with pytest.raises(registry.PlanUnsupportedError, match="hierarchical reduce_scatter on 1 node"):
        rsh.run_hierarchical(torch.zeros(2), x)
    assert not any(n.endswith("hierarchical") for n in builtin.default_ranges())   # not in the one-node catalog


def test_multinode_gemm_variant_choice(monkeypatch):
    monkeypatch.setattr(topology, "current", lambda: topology.Topology(16, 8))
    assert gemm_multinode.pick("auto") == "hierarchical"      # the flat fused kernels need load/store mappings
    assert gemm_multinode.pick("flat") == "flat"
    monkeypatch.setattr(topology, "current", lambda: topology.Topology(8, 8))
    assert gemm_multinode.pick("auto") == "flat"
    assert gemm_multinode.pick("hierarchical") == "hierarchical"   # the op then refuses one node, on every rank
    from tilescale.errors import OpArgumentError

    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(OpArgumentError, match=r"variant: got 'ring', expected one of 'auto', 'flat', 'hierarchical'"):
        gemm_multinode._operands("ag_gemm_multinode", "a_local", a, "b", torch.zeros(8, 2, dtype=torch.bfloat16),
                                 "ring")


def test_block_counts_are_the_flat_ops():
    """The hierarchical ops size their grids as AllGather and ReduceScatter do (kept apart: no import cycle)."""
    from tilescale.ops import allgather, reduce_scatter

    assert rsh.BLOCKS == reduce_scatter.BLOCKS
    for W in (2, 4, 8, 16, 64, 256):
        for k in range(0, 34):
            assert agh.blocks_per_peer(1 << k, W) == allgather.default_blocks_per_peer(1 << k, W), (k, W)
            assert agh.blocks_per_peer((1 << k) + 3, W) == allgather.default_blocks_per_peer((1 << k) + 3, W)
