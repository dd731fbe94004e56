"""The fused ops take their rows at run time (issue 37): a call of any rows up to an op's bound builds nothing new,
and the cached functions (``tilescale.ops.ag_gemm`` / ``gemm_rs``, the torch ops on them) build an op per doubling
of the rows and kernels only for each config the tuning table picks. No GPU: the ops are stand-ins that record the
kernels the real ops compile (their ``kernels()``), and the kernels themselves are lowered, not run. On GPUs, the
same calls against torch: tests/gpu/rows_main.py."""
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tilescale import runtime  # noqa: E402
from tilescale.ops import allgather_gemm as agm  # noqa: E402
from tilescale.ops import checks, gemm, op_cache  # noqa: E402
from tilescale.ops import gemm_reduce_scatter as grs  # noqa: E402
from tilescale.pytorch import torch_ops  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SWEEP = (136, 264, 520, 1000, 2048, 3000, 4096, 8192)   # batch sizes (gathered rows), as issue 37 asks


@pytest.fixture
def world(monkeypatch):
    """A runtime of `W` ranks as the cached functions see it (rank 0), their op caches empty, and the ops replaced
    by stand-ins recording what the real ops would compile: ``world(W).built`` lists them."""
    def make(W):
        built = []
        info = SimpleNamespace(world_size=W, rank=0, local_world_size=W)        # (one node: GEMM+RS pushes)
        monkeypatch.setattr(runtime, "current", lambda: SimpleNamespace(info=info))
        monkeypatch.setattr(runtime, "shares_gpu", lambda: False)
        monkeypatch.setattr(runtime, "is_initialized", lambda: True)
        monkeypatch.setattr(agm, "_fn_check", lambda *a: None)     # (the checks of a CUDA tensor)

        class FakeAGGemm:
            def __init__(self, M, N, K, dtype, *, config=None, split=True, group=None):
                self.M, self.rows, self.a_full = M, M // W, torch.empty(0)
                self.jobs = agm.kernels(M, N, K, W, checks.dtype_name(dtype), config=config, sms=132 if split else 0)
                built.append(self)

            def __call__(self, a, b):
                assert a.shape[0] <= self.rows
                return torch.cat([a] * W) @ b

            def gathered(self):
                return torch.empty(0)

        class FakeGemmRS:
            def __init__(self, M, N, K, dtype, *, config=None, group=None):
                self.M, self.rows = M, M // W
                self.jobs = grs.kernels(M, N, K, W, checks.dtype_name(dtype), config=config, sms=132)
                built.append(self)

            def __call__(self, x, w):
                assert x.shape[0] <= self.M
                return ((x @ w) * W)[:x.shape[0] // W]

        monkeypatch.setattr(agm, "AGGemm", FakeAGGemm)
        monkeypatch.setattr(grs, "GemmRS", FakeGemmRS)
        monkeypatch.setattr(grs, "_fn_check", lambda *a: None)
        monkeypatch.setattr(checks, "runtime_or_none", lambda: None)
        agm._cached.cache_clear()
        grs._cached.cache_clear()
        return SimpleNamespace(W=W, built=built)

    yield make
    agm._cached.cache_clear()
    grs._cached.cache_clear()


def _kernels(built) -> set:
    return {(id(fn), args) for op in built for fn, args in op.jobs}


def _top_level_args(text: str) -> list:
    depth, args, cur = 0, [], ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            args, cur = args + [cur], ""
        else:
            cur += ch
    return args + [cur]


def _bf16(rows, cols):
    return torch.randn(rows, cols).to(torch.bfloat16)


# ----------------------------------------------------------------------------------------- AG+GEMM
def test_ag_gemm_kernels_take_the_rows_at_run_time():
    """Neither of AG+GEMM's GEMMs has the rows in its arguments: ``m`` (and the gathered buffer's slot rows) are
    sizes of its buffers, C is seen as (W, m, N) (a tile stores its rank's rows only: TMA clips at m), and the
    grid's rows are ceil(m / block_m) per rank."""
    from test_codegen import kernel_function, lower_source

    for own in (True, False):
        pf = agm.ag_gemm_kernel.get_tir(2048, 1024, 4, 0, "bfloat16", own=own)
        shapes = {b.name: [str(d) for d in b.shape] for b in pf.buffer_map.values()}
        assert shapes["C"] == ["4", "m", "2048"], shapes
        assert shapes["A"] == (["m", "1024"] if own else ["4", "slot_rows", "1024"])
        src = kernel_function(lower_source(pf))
        [store] = {ln.strip() for ln in src.splitlines() if "tl::tma_store(C_desc" in ln}
        assert len(_top_level_args(store[len("tl::tma_store("):-2])) == 5    # desc, tile, column, row, rank
        assert ", int m)" in src.split("{", 1)[0]
    one = dict(config=gemm.DEFAULT, sms=0)      # (plain grids; the split of the last wave is chosen at the bound)
    assert agm.kernels(512, 2048, 1024, 4, "bfloat16", **one) == agm.kernels(65536, 2048, 1024, 4, "bfloat16", **one)


def test_two_row_counts_under_one_bound_build_one_op(world):
    w = world(2)
    b = _bf16(1024, 2048)
    for rows in (68, 100, 128, 1, 127):
        c = agm.ag_gemm(_bf16(rows, 1024), b)
        assert c.shape == (2 * rows, 2048)
    assert len(w.built) == 1 and w.built[0].rows == 128     # the rows' power of two, at least 128
    assert len(_kernels(w.built)) == 2                      # the GEMM of the own rows, then of the others'
    agm.ag_gemm(_bf16(200, 1024), b)                        # above the bound: an op of 256 rows, the same kernels
    assert [op.rows for op in w.built] == [128, 256] and len(_kernels(w.built)) == 2
    agm.ag_gemm(_bf16(100, 1024), b)                        # below the largest bound of this config: that op
    assert len(w.built) == 2


def test_a_sweep_of_batch_sizes_builds_the_tables_configs_only(world):
    """8 batch sizes through torch_ops.ag_gemm: an op per doubling of the rows at most, and the kernels of as many
    configs as the tuning table picks for their bounds (the shipped table lists 3 for this N, K per GPU)."""
    W, N, K = 2, 2048, 8192
    w = world(W)
    b = _bf16(K, N)
    for M in SWEEP:
        c = torch_ops.ag_gemm(_bf16(M // W, K), b)
        assert c.shape == (M // W * W, N)
    bounds = {op_cache.row_bound(M // W) for M in SWEEP}
    picked = {gemm.gemm_config(r * W, N, K, world_size=W, op="ag_gemm") for r in bounds}
    listed = {c for e in gemm.load_table() if e[0] == "ag_gemm" and e[2:4] == (N, K) for c in e[4]}
    assert len(w.built) <= len(bounds) and picked <= listed | {gemm.DEFAULT}
    assert len(_kernels(w.built)) == 2 * len(picked) <= 2 * len(listed)
    assert {op.jobs[0][1][5:11] for op in w.built} == {(c.block_m, c.block_n, c.block_k, c.stages, c.threads,
                                                        c.swizzle) for c in picked}


# ------------------------------------------------------------------------------------------ on GPUs
@pytest.mark.gpu
def test_rows_under_one_bound_on_one_gpu():
    from tilescale import testing

    testing.skip_unless_ranks(1)
    proc = testing.launch(REPO / "tests" / "gpu" / "rows_main.py", 1, timeout=300)
    testing.assert_all_ranks_ok(proc, 1, marker="OK: AG+GEMM and GEMM+RS with rows")


@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [2, 4])
def test_rows_under_one_bound_on_gpus(nranks):
    from tilescale import testing

    testing.skip_unless_ranks(nranks)
    proc = testing.launch(REPO / "tests" / "gpu" / "rows_main.py", nranks, timeout=400)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: AG+GEMM and GEMM+RS with rows")


# ----------------------------------------------------------------------------------------- GEMM+RS
def test_gemm_rs_kernels_take_the_rows_at_run_time():
    """The push kernel and the pull path's GEMM and reduction have neither the rows nor the op's bound in their
    arguments: X is (W, m, K), C (m, N), the buffers of the bound (R, arrived, P, done) of run-time sizes."""
    func = grs.gemm_rs_push_kernel.get_tir(2048, 1024, 4, "bfloat16")
    shapes = {b.name: [str(d) for d in b.shape] for b in func.buffer_map.values()}
    assert shapes["X"] == ["4", "m", "1024"] and shapes["C"] == ["m", "2048"] and shapes["arrived"] == ["words"]
    assert shapes["R"] == ["r_rows", "264"] and shapes["pushed"] == ["words"]
    one_rank = grs.gemm_rs_push_kernel.get_tir(2048, 1024, 1)
    shapes = {b.name: [str(d) for d in b.shape] for b in one_rank.buffer_map.values()}
    assert shapes["X"] == ["m", "1024"] and shapes["C"] == ["m", "2048"]
    g, r = (fn.get_tir(*args) for fn, args in grs.kernels(4096, 2048, 1024, 4, "bfloat16", path="pull"))
    assert {b.name: [str(d) for d in b.shape] for b in g.buffer_map.values()}["X"] == ["4", "m", "1024"]
    assert {b.name: [str(d) for d in b.shape] for b in r.buffer_map.values()}["C"] == ["m", "2048"]
    for path in grs.PATHS:
        one = dict(config=gemm.DEFAULT, path=path)
        assert grs.kernels(512, 2048, 1024, 4, "bfloat16", **one) == \
            grs.kernels(65536, 2048, 1024, 4, "bfloat16", **one)


def test_gemm_rs_two_row_counts_under_one_bound_build_one_op(world):
    w = world(2)
    b = _bf16(1024, 2048)
    for rows in (68, 100, 128, 1, 127):
        y = grs.gemm_rs(_bf16(2 * rows, 1024), b)
        assert y.shape == (rows, 2048)
    assert len(w.built) == 1 and w.built[0].rows == 128 and len(_kernels(w.built)) == 1   # the push kernel
    grs.gemm_rs(_bf16(400, 1024), b)                  # 200 rows per rank: an op of 256, the same kernel
    assert [op.rows for op in w.built] == [128, 256] and len(_kernels(w.built)) == 1


def test_gemm_rs_sweep_of_batch_sizes_builds_the_tables_configs_only(world):
    """8 batch sizes through torch_ops.gemm_rs: an op per doubling of the rows at most, and the kernels of as many
    configs as the tuning table picks for their bounds."""
    W, N, K = 2, 8192, 4096                       # K: the full K (2048 per rank)
    w = world(W)
    wt = _bf16(K // W, N)
    for M in SWEEP:
        y = torch_ops.gemm_rs(_bf16(M // W * W, K // W), wt)
        assert y.shape == (M // W, N)
    bounds = {op_cache.row_bound(M // W) for M in SWEEP}
    picked = {gemm.gemm_config(r * W, N, K // W, world_size=W, op="gemm_rs_push") for r in bounds}
    listed = {c for e in gemm.load_table() if e[0] in ("gemm_rs", "gemm_rs_push") and e[2:4] == (N, K // W)
              for c in e[4]}
    assert len(w.built) <= len(bounds) and picked <= listed | {gemm.DEFAULT}
    assert len(_kernels(w.built)) == len(picked) <= max(len(listed), 1)
