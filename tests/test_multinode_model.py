"""The multi-node cost model (tilescale/plan/multinode_model.py, run by docs/multinode_model.py): it runs,
docs/multinode.md holds exactly what it prints,
and its predictions have the properties docs/multinode.md draws from them."""
from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "docs" / "multinode_model.py"
DOC = REPO / "docs" / "multinode.md"


@pytest.fixture(scope="module")
def model():
    from tilescale.plan import multinode_model

    return multinode_model


def test_script_runs_and_the_doc_is_its_output(model):
    """`python docs/multinode_model.py` prints the tables quickly, and docs/multinode.md embeds that output
    unchanged (regenerate with `--write` after changing the model)."""
    # CPU seconds, not the clock's: another job on the machine slows the clock, not the work
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime < 30
    t1 = time.process_time()
    text = model.report()
    assert time.process_time() - t1 < 1.0, "the model takes a second or more"
    assert r.stdout == text
    for heading in ("#### AllGather", "#### AG+GEMM", "#### GEMM+RS", "#### Crossovers", "#### Calibration"):
        assert heading in text
    assert model.embedded(DOC.read_text()) == text, \
        "docs/multinode.md is not the script's output: run `python docs/multinode_model.py --write`"


def test_write_replaces_only_the_generated_part(model, tmp_path):
    doc = f"intro\n{model.BEGIN}\nold table\n{model.END}\noutro\n"
    new = model.embed(doc, "new table\n")
    assert new == f"intro\n{model.BEGIN}\nnew table\n{model.END}\noutro\n"
    assert model.embedded(new) == "new table\n"
    with pytest.raises(ValueError, match="markers"):
        model.embed("no markers here", "x")


def test_hierarchical_allgather_beats_flat_across_nodes_for_large_messages(model):
    for n in model.NODES[1:]:
        for size in (16 << 20, 256 << 20, 1 << 30):
            s = size / (n * model.P0.g)
            t = {v: model.collective_time("ag", v, n, s) for v in model.VARIANTS}
            hier = t[model.INTER_INTRA]
            assert hier < t[model.FLAT_DIRECT] and hier < t[model.FLAT_RING], (n, size, t)
            assert hier < t[model.INTRA_INTER], (n, size, t)          # each shard crosses the network once
            rs = {v: model.collective_time("rs", v, n, s) for v in model.VARIANTS}
            assert model.best(rs) == model.INTRA_INTER, (n, size, rs)  # reduce on NVLink first


def test_times_grow_with_node_count(model):
    """With the gathered size (AllGather) or the per-rank GEMM (fused ops) fixed, more nodes never make a
    variant faster: more of the data crosses the network."""
    nodes = model.NODES
    for op in ("ag", "rs"):
        for size in model.AG_SIZES:
            for v in model.VARIANTS:
                ts = [model.collective_time(op, v, n, size / (n * model.P0.g)) for n in nodes]
                ts = [t for t in ts if t is not None]
                assert all(a <= b + 1e-12 for a, b in zip(ts, ts[1:], strict=False)), (op, size, v, ts)
    for op, shapes in (("ag_gemm", model.AG_GEMM_SHAPES), ("gemm_rs", model.GEMM_RS_SHAPES)):
        for shape in shapes:
            for v in model.VARIANTS:
                ts = [f.time for f in (model.fused(op, v, shape, n) for n in nodes) if f is not None]
                assert all(a <= b + 1e-9 for a, b in zip(ts, ts[1:], strict=False)), (op, shape, v, ts)


def test_selector_rule_agrees_with_the_model(model):
    """`rule` (what tilescale/plan/selector.py should apply, from ranks per node, message size and node count)
    picks the model's fastest variant everywhere except within a factor 1.5 of its size threshold, and never
    the flat ring."""
    for g in (2, 4, 8):
        p = model.Params(g=g)
        for op, coll in (("ag", "all_gather"), ("rs", "reduce_scatter")):
            for n in (2, 4, 8, 16, 32, 64):
                thr = model.flat_threshold(n, g, p)
                for e in range(6, 31):
                    size, world = 1 << e, n * g
                    s = size / world
                    picked = model.rule(coll, size, world, g, p)
                    assert picked != model.FLAT_RING
                    if thr > 0 and 1 / 1.5 < s / thr < 1.5:
                        continue
                    t = {v: model.collective_time(op, v, n, s, p) for v in model.VARIANTS}
                    assert picked == model.best(t), (g, coll, n, size, picked, t)
    assert model.rule("all_gather", 1 << 30, 8, 8) == model.FLAT_DIRECT          # one node: today's kernels
    assert model.rule("gemm_rs", 1 << 30, 64, 8) == model.INTRA_INTER
    assert model.rule("ag_gemm", 1 << 30, 64, 8) == model.INTER_INTRA
    assert model.rule("all_gather", 1 << 10, 16, 8) == model.FLAT_DIRECT         # tiny, 2 nodes
    assert model.flat_threshold(2) > model.flat_threshold(4) > model.flat_threshold(8) >= model.flat_threshold(16) == 0


def test_fused_ops_pick_hierarchical_and_hide_wide_gemms(model):
    """Across nodes every fused shape of issue 18 picks the hierarchical order, and a GEMM about 2,200 wide
    (N for AG+GEMM, K for GEMM+RS) hides the network with it while the flat direct variant needs several times
    that."""
    for n in model.NODES[1:]:
        for op, shapes, good in (("ag_gemm", model.AG_GEMM_SHAPES, model.INTER_INTRA),
                                 ("gemm_rs", model.GEMM_RS_SHAPES, model.INTRA_INTER)):
            for shape in shapes:
                f = {v: model.fused(op, v, shape, n) for v in model.VARIANTS}
                pick = model.best({v: x.time for v, x in f.items()}, {v: x.comm for v, x in f.items()})
                assert pick == good, (n, op, shape, pick)
                assert f[good].hidden > 0.85, (n, op, shape, f[good])
        hier = model.hide_threshold("ag_gemm", n, model.INTER_INTRA)
        flat = model.hide_threshold("ag_gemm", n, model.FLAT_DIRECT)
        assert 1500 <= hier <= 3000 and flat >= 3 * hier, (n, hier, flat)


def test_model_is_close_to_the_runs_on_two_h200(model):
    """The same formulas with 2 GPUs per node stay within 25% of what runs 5 and 7 measured."""
    two = model.Params(g=2)
    for name, measured, f in model.CALIBRATION:
        assert 0.75 <= f(two) / measured <= 1.25, (name, measured, f(two))
