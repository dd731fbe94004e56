"""GEMM+RS's two paths on a machine without a GPU (tilescale/ops/gemm_reduce_scatter.py): which one a job takes,
the kernels each builds, and the push kernel's protocol as generated (its warps' roles: X and W loaded by TMA, the
GEMM and the add, the sums' waits, loads, pushes into rank me - 1's slab through its view and counts, one per
tile; my rows into C). Their GPU tests: examples/distributed/example_gemm_reducescatter.py (both paths at 2
and 4 ranks), tests/test_graphs_gpu.py (CUDA graphs), tests/test_gpu_remote.py (pull, across emulated nodes)."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_codegen import kernel_function, lower_source  # noqa: E402

from tilescale import runtime  # noqa: E402
from tilescale.ops import gemm_reduce_scatter as grs  # noqa: E402
from tilescale.ops.gemm import DEFAULT, GemmConfig  # noqa: E402


@pytest.fixture
def no_runtime(monkeypatch):
    monkeypatch.delenv("TILESCALE_NODE_SIZE", raising=False)
    monkeypatch.setattr(runtime, "is_initialized", lambda: False)


def test_one_node_pushes_other_nodes_and_large_jobs_pull(no_runtime, monkeypatch):
    assert [grs.default_path(w) for w in (1, 2, 4, 8)] == ["push"] * 4
    assert grs.default_path(grs.MAX_PUSH_RANKS + 1) == "pull"          # one NVLink domain: at most 8 ranks
    monkeypatch.setenv("TILESCALE_NODE_SIZE", "2")                    # nodes of 2 ranks: a peer on another node
    assert grs.default_path(4) == "pull" and grs.default_path(2) == "push"


def test_k_the_push_kernel_cannot_load_takes_the_pull_path(no_runtime):
    """At world size > 1 the push kernel loads rows of X by TMA (whole 16 bytes: K_local a multiple of 8 in 16-bit
    types): another K takes the pull path by default, and asking for push names K_local."""
    assert grs.push_takes(2, 256) and not grs.push_takes(2, 260) and grs.push_takes(1, 260)
    assert grs.default_path(2, 260) == "pull" and grs.default_path(2, 264) == "push"
    assert grs.default_path(1, 260) == "push"                             # world size 1: the plain grid
    (g, _), (r, _) = grs.kernels(4096, 2048, 260, 2, "bfloat16")
    assert (g, r) == (grs.gemm_rs_gemm_kernel, grs.gemm_rs_reduce_kernel)


def test_push_kernel_multiplies_with_one_or_two_warpgroups():
    """Its multiplying warpgroups take 232 registers each beside warpgroup 0 (40): three would not fit the SM's
    65536 (setmaxnreg would wait for ever), so a config of 384 threads cannot run it (the pull path's GEMM can)."""
    from tilescale.ops.gemm import check

    wide = GemmConfig(128, 192, 64, 4, 384, 16)
    assert check(wide, 8192, 3072, 2048, world_size=4, op="gemm_rs") is None
    assert check(wide, 8192, 3072, 2048, world_size=1, op="gemm_rs_push") is None        # world size 1: a grid
    why = check(wide, 8192, 3072, 2048, world_size=4, op="gemm_rs_push")
    assert why and why.startswith("threads=384: the push kernel multiplies with 1 or 2 warpgroups"), why
    with pytest.raises(ValueError, match="threads=384"):
        grs.kernels(8192, 3072, 2048, 4, "bfloat16", config=wide, path="push")
    assert 128 * 40 + 256 * 232 <= 65536 < 128 * 40 + 384 * 232


def test_ranks_sharing_a_gpu_through_mps_pull(no_runtime, monkeypatch, tmp_path):
    """Waiting tiles of one rank could hold every SM of a GPU shared through MPS (module docstring)."""
    from types import SimpleNamespace

    info = SimpleNamespace(local_world_size=2, world_size=2)
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)
    monkeypatch.setattr(runtime, "current", lambda: SimpleNamespace(info=info))
    monkeypatch.setattr(runtime, "shares_gpu", lambda: True)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "absent"))
    assert grs.default_path(2) == "push"                              # time-sliced: the peers' tiles get the GPU
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert grs.default_path(2) == "pull"
    monkeypatch.setattr(runtime, "shares_gpu", lambda: False)
    assert grs.default_path(2) == "push"                              # MPS on distinct GPUs: nothing shared


def test_each_path_builds_its_own_kernels(no_runtime):
    [(fn, args)] = grs.kernels(4096, 2048, 4096, 4, "bfloat16")
    assert fn is grs.gemm_rs_push_kernel and args[:4] == (2048, 4096, 4, "bfloat16")   # (no M: the calls' rows)
    assert GemmConfig(*args[4:10]) == DEFAULT    # no tuning entries of its own: the default config
    (g, _), (r, _) = grs.kernels(4096, 2048, 1024, 4, "bfloat16", path="pull")
    assert (g, r) == (grs.gemm_rs_gemm_kernel, grs.gemm_rs_reduce_kernel)


def test_push_kernel_runs_one_block_per_sm(no_runtime):
    """The push kernel at more than one rank: one block per SM of the GPU (`sms`), at any K."""
    for K in (1024, 2048, 8192):
        [(fn, args)] = grs.kernels(4096, 2048, K, 4, "bfloat16", sms=114)
        assert fn is grs.gemm_rs_push_kernel and GemmConfig(*args[4:10]) == DEFAULT and args[10:] == (114,)
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(2048, 8192, 4, sms=114)))
    assert "__launch_bounds__(384, 1)" in src and "blockIdx.y" not in src   # 1-D: 114 blocks (the launch)
    # tiles b, b + 114, ... of the call's 4 steps of ceil(m / 128) x 8 tiles (none: a block past them), each role
    head = "for (int j = 0; j < (((((((m + 127) >> 7) * 32) + 113) - ((int)blockIdx.x)) / 114)"
    assert src.count("for (int j") == 3 and head in src
    # warp 0: each tile's place once, then its 128 steps of K (no division by the call's tiles per step)
    load = src[src.index("for (int j = 0;"):src.index("for (int j_1 = 0;")]
    steps = load[load.index("for (int ko = 0; ko < 128; ++ko) {"):]
    assert "/ (((m + 127) >> 7)" in load[:load.index("for (int ko")] and "(m + 127)" not in steps


def test_persistent_kernel_rasterizes_in_equal_panels():
    """16 rows of tiles per rank in panels of 10 and 6 ran at half speed: the persistent kernel
    takes the largest panel <= the config's swizzle that divides its rows."""
    from tilescale.ops.gemm import even_panel

    assert [even_panel(rows, 10) for rows in (8, 16, 32, 12, 7)] == [8, 8, 8, 6, 7]
    assert even_panel(16, 0) == 0 and even_panel(16, 16) == 16
    # in the kernel the rows of tiles per rank are the call's: the panel is computed once from them, the largest
    # of 10 .. 1 that divides them (a chain of selects, last one first)
    import tilelang.language as TL
    from tilelang import tvm

    rows = tvm.tirx.Var("rows", "int32")
    panel = even_panel(rows, 10)
    ana = tvm.arith.Analyzer()
    for r in (8, 16, 32, 12, 7, 1, 10, 30):
        assert ana.simplify(tvm.tirx.stmt_functor.substitute(panel, {rows: TL.int32(r)})) == even_panel(r, 10)
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(8192, 512, 4, "bfloat16", 128, 256, 64, 3, 256,
                                                                         10, 132)))
    head = src[:src.index("pnl[0] = ")]                       # the selects, once, before the roles
    assert src.count("pnl[0] = ") == 1 and all(f" = {p};" in head for p in range(2, 11))


def _roles(src: str) -> dict:
    """The branches of the push kernel's roles (module docstring): {"load": warp 0, "sums": warps 1-3, "mma": warps
    4 ..}, from the generated kernel; warpgroup 0 gives up its registers once, before its warps take their roles."""
    group0 = src.index("if (((int)threadIdx.x) < 128) {")
    assert src[group0:].index("tl::warpgroup_reg_dealloc<40>();") < src[group0:].index("if (((int)threadIdx.x) < 32) {")
    assert src.count("tl::warpgroup_reg_dealloc<") == 1 and src.count("tl::warpgroup_reg_alloc<232>();") == 1
    load = src.index("if (((int)threadIdx.x) < 32) {")
    sums = src.index("} else {\n      for (int j_1 = 0;", load)    # the rest of warpgroup 0: warps 1-3
    mma = src.index("tl::warpgroup_reg_alloc<232>();")
    assert group0 < load < sums < mma
    return {"load": src[load:sums], "sums": src[sums:mma], "mma": src[mma:]}


@pytest.mark.parametrize("W", [2, 4, 8])
def test_push_kernel_protocol(W):
    """The push kernel (module docstring, protocol 1-3), as generated: warp 0 loads X and W by TMA for every tile of
    the block; warp 1 waits for each sum in (acquire, system scope) and loads it by one bulk copy (or arrives: step
    1); warps 1-3 wait for the sum out and push it by their plain stores into rank me - 1's slab through its view,
    which warp 1 counts there (one release a tile), or warp 1 stores my rows into C, written before the block ends;
    the multiplying warps wait for nothing but their stages and the tile, add, write the sum out, fence and arrive:
    no named barrier in the loop over K, nothing of the network."""
    M, N, K = 1024 * max(W // 4, 1), 512, 256
    func = grs.gemm_rs_push_kernel.get_tir(N, K, W, sms=8)
    bufs = [func.buffer_map[p] for p in func.params]
    assert tuple(b.name for b in bufs) == grs.PUSH_PARAMS[:9]        # what GemmRS launches it with (then the sizes)
    assert [str(d) for d in bufs[3].shape] == ["r_rows", "264"] and [str(d) for d in bufs[4].shape] == ["words"]
    slots, tiles = W - 1, (M // W // 128) * (N // 256)              # at a bound of M rows: 2 halves of W - 1 slots
    assert grs.push_shapes(M, N, W, 128, 256) == ((2 * slots * tiles * 128, 264), (slots * tiles,))   # of tiles
    src = kernel_function(lower_source(func))
    r = _roles(src)
    # 1: warp 0, TMA loads of X and W into the stage after waiting for it to be free, for every (tile, K step)
    assert r["load"].count("tl::tma_load(X_desc") == 1 and "tl::tma_load(Wt_desc" in r["load"]
    assert r["load"].index("empty[(((j * 4) + ko) % 3)].wait((((((j * 4) + ko) / 3) & 1) ^ 1));") < \
        r["load"].index("tl::tma_load(X_desc")
    assert r["load"].index("tl::tma_load(Wt_desc") < r["load"].index("full[(((j * 4) + ko) % 3)].arrive();")
    assert "tilescale::" not in r["load"]
    # 2: the call number, known to every thread before the roles (the sums warps' every use of it)
    sums = r["sums"]
    assert src.count("tilescale::call_number(") == 1 and "tilescale::call_number_warp(" not in src
    assert src.index("tilescale::call_number(") < src.index("if (((int)threadIdx.x) < 128) {")
    # warps 1-3: warp 1 alone waits for the sum in and loads it (or arrives), all three wait for the sum out
    warp1 = sums.index("if (((int)threadIdx.x) < 64) {")
    wait = sums.index("tilescale::wait_until<unsigned long long>((&(arrived[")          # acquire, system scope
    load = sums.index("tilescale::load_rows_async((&(R[")
    assert warp1 < wait < load < sums.index("tilescale::arrive_barrier((&(landed[0])));")  # else: step 1, Rs free
    assert re.search(r"if \(\(\(int\)threadIdx.x\) == 32\) \{\s*tilescale::arrive_barrier", sums)  # 1 arrival
    assert "tilescale::init_barrier((&(landed[0])), 1);" in src                # of 1 expected
    assert ", 1, 67584, 67584, 67584, (&(landed[0])));" in sums      # one copy: the tile's 128 padded rows
    summed = sums.index("summed[0].wait((j_1 & 1));")
    assert re.search(r"\}\s*\}\s*\}\s*summed\[0\]\.wait\(\(j_1 & 1\)\);", sums), "all three wait (not in warp 1's if)"
    push = sums.index("tilescale::store_tile((&(((bfloat16_t*)Rs)[0])), (&(Rp[")
    # counted up to the call number: the calls since this rank last pushed the tile (its own `pushed`), then noted
    count = sums.index("tilescale::release_stores<2, unsigned long long, 0>((e[0] - pushed[at[(int64_t)1]]), (&(Ap[")
    assert sums.count("pushed[at[(int64_t)1]] = e[0];") == 1 and sums.index("pushed[at[(int64_t)1]] = e[0];") > count
    assert load < summed < push < count
    assert ", 1, 67584, 67584, 67584, 32, 96);" in sums[push:count], "the padded tile, by threads 32 .. 127"
    guards = r"(\s*if \([^{]*\) \{)*"    # (tilelang's bounds checks of buffers of a run-time size)
    assert re.search(r"32, 96\);[\s}]*if \(\(\(int\)threadIdx.x\) < 64\) \{" + guards + r"\s*tilescale::release_stores",
                     sums[push:]), \
        "counted once, by warp 1, after the group met"
    mine = (r"if \(\(\(int\)threadIdx.x\) < 64\) \{(\s*if \([^{]*\) \{)*\s*tilescale::store_rows_async\("
            r"\(&\(\(\(bfloat16_t\*\)Rs\)\[0\]\)\), \(&\(C\[.*, min\(128, \(m - at\[2\]\)\), 512, 528, 1024, 1\);")
    assert re.search(mine, sums[summed:push]), "my rows: into C by warp 1, written"
    half = r"\(\(int64_t\)\(e\[0\] & \(uint64_t\)1\)\) \* \(\(int64_t\)pnl\[\(int64_t\)1\]\)\) \* \(int64_t\)" + str(
        slots * 128 * 264)
    assert re.search(half, sums[push:count]), "this call's half of the slab (the layout's tiles: the bound's)"
    assert src.count("tilescale::release_stores<") == 1 and src.count("tilescale::wait_until<") == 1
    assert src.count("tilescale::store_tile(") == 1 and src.count("tilescale::store_rows_async(") == 1
    # 3: the multiplying warps: stages, then the tile's sum in, add, sum out, fence, arrive
    mma = r["mma"]
    loop = mma[mma.index("for (int ko_1 = 0;"):mma.index("tilescale::wait_barrier((&(landed[0])), (j_2 & 1));")]
    assert "sync_thread" not in loop and "fence_proxy_async" not in loop and "tilescale::" not in loop
    assert loop.index("full[(((j_2 * 4) + ko_1) % 3)].wait(((((j_2 * 4) + ko_1) / 3) & 1));") < loop.index(
        "wgmma_ss<") < loop.index("empty[(((j_2 * 4) + ko_1) % 3)].arrive();")    # the same step as warp 0's
    assert re.search(r"wgmma_ss<.*\(\(0 < ki\) \? 1 : \(\(ko_1 == 0\) \? 0 : 1\)\)\);", loop), "scale-d clears"
    tail = mma[mma.index("tilescale::wait_barrier((&(landed[0])), (j_2 & 1));"):]
    assert tail.index("__bfloat1622float2") < tail.index("__float22bfloat162_rn") < tail.rindex(
        "tl::fence_proxy_async();") < tail.index("summed[0].arrive();")
    assert "peer_ptr" not in src and "nvshmem_ptr" not in src      # the peer through its view: no call in the kernel


def test_push_configs_leave_room_for_the_sum_in():
    """The push kernel's tile of partial sums has shared memory of its own (live through the GEMM's loop): a
    config that fills shared memory with its pipeline fits the pull path's GEMM, not the push kernel at W > 1."""
    from tilescale.ops.gemm import SMEM_LIMIT, check

    deep = GemmConfig(256, 128, 64, 4)                                  # 192 KiB of stages + 68 KiB of sums in
    assert check(deep, 8192, 8192, 2048, world_size=4, op="gemm_rs") is None
    assert check(deep, 8192, 8192, 2048, world_size=1, op="gemm_rs_push") is None       # no sums at W = 1
    why = check(deep, 8192, 8192, 2048, world_size=4, op="gemm_rs_push")
    assert why == f"needs 266240 bytes of shared memory, more than {SMEM_LIMIT}", why
    assert check(DEFAULT, 8192, 8192, 2048, world_size=4, op="gemm_rs_push") is None   # 144 + 66 KiB
    with pytest.raises(ValueError, match="266240 bytes of shared memory"):
        grs.kernels(8192, 8192, 2048, 4, "bfloat16", config=deep, path="push")


def _warp_of_store_and_counts(src: str, desc: str) -> tuple:
    """(the threads of the elect that issues the TMA store into `desc`, the warps that call_number / load / count
    in), from the generated kernel: the store is issued under ``tl::tl_shuffle_elect<threads>()``."""
    store = src.index(f"tl::tma_store({desc}")
    elect = int(re.findall(r"tl::tl_shuffle_elect<(\d+)>\(\)", src[:store])[-1])
    warps = {int(w) for w in re.findall(r"if \(\(\(\(int\)threadIdx.x\) >> 5\) == (\d+)\) \{", src)}
    return elect, warps


@pytest.mark.parametrize("cfg", [DEFAULT, GemmConfig(64, 256, 64, 4, 128, 0)], ids=["t256", "t128"])
def test_the_warp_that_stores_a_tile_counts_it(cfg):
    """Only the thread that issued a TMA store can wait for it to be written, so the warp of tilelang's elected lane
    (compat.storing_warp) is the one that counts the tile (the pull path's GEMM). tilelang's election
    (tl_shuffle_elect<n>: an elected lane of the warps whose index in the block is a multiple of n / 32), with its
    producer warpgroup first (warps 0-3): exactly one consumer warp qualifies."""
    from tilescale.compat import storing_warp

    N, K, W = 2048, 1024, 4
    args = (N, K, W, "bfloat16", cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads, cfg.swizzle)
    src = kernel_function(lower_source(grs.gemm_rs_gemm_kernel.get_tir(*args)))
    assert "if (((int)threadIdx.x) < 128) {" in src                      # the producer warpgroup first
    elect, warps = _warp_of_store_and_counts(src, "P_desc")
    assert elect == cfg.threads
    consumers = range(4, 4 + cfg.threads // 32)
    elected = [w for w in consumers if w % (elect // 32) == 0]
    assert warps == set(elected) == {4 + storing_warp(cfg.threads)}, (warps, elected)


def test_push_kernel_at_world_size_1_is_the_gemm_alone():
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(512, 256, 1)))
    assert src.count("tl::tma_store(") == 1 and "tl::tma_store(C_desc" in src
    assert "wait_until" not in src and "release_stores" not in src


def test_loopback_kernel_is_the_push_kernel_on_one_gpu():
    """bench_gemm_configs --push and bench_fused time it as the push path's GEMM: the same tiles, its pushes into
    its own slab and counted in its own words; its parameter `ranks` is not a world size the job must match."""
    from tilescale.compiler import WORLD_SIZE_PARAMS

    src = kernel_function(lower_source(grs.gemm_rs_push_loopback_kernel.get_tir(512, 256, 4, sms=8)))
    assert "tilescale::store_tile((&(((bfloat16_t*)Rs)[0])), (&(R[" in src and "Rp[" not in src
    assert "tilescale::release_stores<2, unsigned long long, 0>((e[0] - pushed[" in src and "(&(arrived[" in src
    assert "Ap[" not in src
    assert "tilescale::load_rows_async((&(R[" in src
    assert "ranks" not in WORLD_SIZE_PARAMS
