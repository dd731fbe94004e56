"""The fused ops' kernels that take the rows at run time run the code of kernels built for the rows (one build per M,
as before issue 37): each block's tile, rank, slice and K range computed once, in registers (tilescale.ops.gemm, NOTE
[registers]), so that neither the loops over K nor a split tile's fix-up compute anything of the call's rows, and
each call's grid is the one its own rows' plan gives. On 2 H200s the kernels that recomputed them ran AG+GEMM's split
shapes at 1.25-1.8x and GEMM+RS at 0.87 of the static kernels' speed. No GPU: the kernels are lowered to CUDA, not
run; on GPUs, the same calls against torch: tests/gpu/ag_gemm_split_main.py, tests/gpu/rows_main.py."""
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from test_codegen import kernel_function, lower_source  # noqa: E402

from tilescale.ops import allgather_gemm as agm  # noqa: E402
from tilescale.ops import gemm_reduce_scatter as grs  # noqa: E402
from tilescale.ops.gemm import DEFAULT, GemmConfig  # noqa: E402

ROWS = "(m + "     # the call's rows in an expression (``((m + 127) >> 7)``: its row tiles)


def _block(src: str, head: str, start: int = 0) -> str:
    """The statement of `src` that begins with `head` (at or after `start`), up to its closing brace."""
    i = src.index(head, start)
    depth = 0
    for j in range(src.index("{", i), len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[i:j + 1]
    raise AssertionError(f"no end of {head!r}")


def _loops(src: str) -> tuple:
    """(the producer's loop over K, the consumers' loop over K, what the consumers do after it) of a kernel of the
    tile loop (tilescale.ops.gemm.main_loop, warp-specialised by tilelang)."""
    producer = _block(src, "for (int ko = 0;", src.index("if (((int)threadIdx.x) < 128) {"))
    consumers = src.index("tl::warpgroup_reg_alloc<")
    loop = _block(src, "for (int ko_1 = 0;", consumers)
    return producer, loop, src[src.index(loop) + len(loop):]


def _source(fn, args) -> str:
    return kernel_function(lower_source(fn.get_tir(*args)))


@pytest.mark.parametrize("shape", [(4096, 8192, 7168), (8192, 4096, 2752)])   # M x K x N: split at W = 2
def test_a_split_grid_computes_nothing_of_the_rows_per_step_or_element(shape):
    """AG+GEMM's split grids (both GEMMs at W = 2, as benchmarked): the K loops of the producer and the consumers
    and every access of the fix-up's workspace are free of the call's rows; no check of the partial sums' indices
    per element (clamped to the workspace: only its being there, the same for all); the producer reads no copy of a
    local buffer (tilelang's copy of one it reads alone is uninitialised); the consumers keep their registers."""
    M, K, N = shape
    jobs = agm.kernels(M, N, K, 2, "bfloat16", sms=132)
    assert [agm.kernel_plan(a, M).split > 1 for _, a in jobs] == [True, True]   # (both split at the bound)
    for fn, args in jobs:
        src = _source(fn, args)
        assert "_producer_ws" not in src and "tl::warpgroup_reg_alloc<240>();" in src
        producer, loop, after = _loops(src)
        for part in (producer, loop):
            assert ROWS not in part and "slices" not in part and "tail" not in part, part[:2000]
        assert "tl::tma_load(A_desc" in producer and "wgmma" in loop
        uses = [ln for ln in after.splitlines() if "work + " in ln or "tail_arrived[" in ln or "tail_fixed[" in ln]
        assert len(uses) >= 4 and not [ln for ln in uses if ROWS in ln], uses[:3]
        store = _block(after, "for (int i_3 = 0; i_3 < 64; ++i_3) {")        # a slice's partial sum into work
        assert "*(float2*)(work + " in store and "if (" not in store, store[:1500]
        fixup = _block(after, "for (int i_4 = 0; i_4 < 64; ++i_4) {")        # the last slice adds them
        checks = fixup.replace("if ((1 <= work_tiles))", "")
        assert fixup.count("*(float2*)(work + ") == 1 and ROWS not in fixup and "if (" not in checks, fixup[:1500]
        wait = after.index("tilescale::wait_until<unsigned long long>((&(tail_arrived[")
        assert "(tail_fixed[" in after[wait:wait + 400] and "((slices * 8) - 8))" in after[wait:wait + 600]


def test_the_plain_grid_of_the_peers_rows_loads_without_dividing():
    """The GEMM of the other ranks' rows on a plain grid (8192 x 8192 x 2048 at W = 2, as benchmarked): a block's
    row tile and source rank (divisions by the call's row tiles) computed once, not in every TMA load of the
    producer's loop."""
    _, (fn, args) = agm.kernels(8192, 2048, 8192, 2, "bfloat16", sms=132)
    assert agm.kernel_plan(args, 8192).split == 1                    # (plain at the bound)
    src = _source(fn, args)
    producer, loop, _ = _loops(src)
    assert "tl::tma_load(A_desc" in producer and ROWS not in producer and ROWS not in loop, producer[:2000]
    assert "_producer_ws" not in src


def test_the_pull_gemm_of_gemm_rs_loads_without_dividing():
    """GEMM+RS's pull path GEMM: a block's row tile and source rank (divisions by the bound's row tiles per rank)
    computed once, not in every TMA load of the producer's loop."""
    (fn, args), _ = grs.kernels(8192, 8192, 4096, 2, "bfloat16", path="pull")
    src = _source(fn, args)
    producer, loop, _ = _loops(src)
    assert "tl::tma_load(X_desc" in producer and "row_blocks" not in producer and "row_blocks" not in loop
    assert "_producer_ws" not in src


def test_each_call_runs_its_own_rows_plan():
    """A split grid runs each call as the kernel built for its rows would (grid_plan of the call's rows: other
    split factors, other tail tiles, or none), within one workspace for every call up to the bound; the op passes
    that plan's slices and tail tiles with each call."""
    cfg = GemmConfig(128, 256, 64, 3, 256, 10)
    for W, M, N, K in ((1, 8192, 2752, 1024), (2, 8192, 2752, 1024), (2, 4096, 7168, 8192), (4, 2048, 2048, 8192)):
        jobs = agm.kernels(M, N, K, W, "bfloat16", config=cfg, sms=132)
        for m in range(1, M // W + 1, 7):                  # the kernels' grids
            for _, args in jobs:
                want = agm.grid_plan(W * m, N, K, W, 128, 256, 64, 132, args[12])
                assert agm.kernel_plan(args, W * m) == (want if agm.kernel_plan(args, M).split > 1 else
                                                        agm.grid_plan(W * m, N, K, W, 128, 256, 64, 0, args[12])), m
        op = SimpleNamespace(world_size=W, _job_args=[a for _, a in jobs], _splits={},
                             _sizes=[agm.split_space(a, M) if a[-1] else () for _, a in jobs])
        seen = set()
        for m in range(1, M // W + 1, 7):
            split = agm.AGGemm._split_of(op, m)
            for (_, args), z, got in zip(jobs, op._sizes, split, strict=True):
                want = agm.grid_plan(W * m, N, K, W, 128, 256, 64, 132, args[12])
                if not z:                                  # a plain grid at the bound: plain for every call
                    assert got == ()
                    continue
                assert got == ((want.split, want.tail) if want.split > 1 else (1, 0))
                assert want.tail * (want.split - 1) <= z[0] and (want.split == 1 or want.tail <= z[1])
                seen.add(want.split)
        assert len(seen) >= 2, (W, M, seen)                # (the calls split in several ways)


def test_one_workspace_serves_the_plans():
    """The workspace of split grids: the most partial sums (tail x (split - 1) tiles) and tail tiles of any plan it
    serves, tiles of (block_m, block_n) in fp32, its counts zeroed."""
    from tilescale.ops import gemm

    plans = [gemm.split_plan(352, 132, 16), gemm.split_plan(11, 132, 64), gemm.split_plan(528, 132, 64)]
    assert [(p.split, p.tail) for p in plans] == [(3, 88), (8, 11), (1, 0)]
    assert gemm.split_sizes(plans) == (max(88 * 2, 11 * 7), 88) and gemm.split_sizes(plans[2:]) == (1, 1)
    work, arrived, fixed = gemm.split_workspace(gemm.split_sizes(plans), DEFAULT.block_m, DEFAULT.block_n)
    assert work.shape == (176, 128, 256) and arrived.shape == fixed.shape == (88,) and not arrived.any()
