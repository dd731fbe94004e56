"""GEMM+RS's two paths on a machine without a GPU (tilescale/ops/gemm_reduce_scatter.py): which one a job takes,
the kernels each builds, and the push kernel's protocol as generated (the sum in loaded while the GEMM runs, or
after it once counted; the sum out pushed into rank me - 1's slab through its view, one count per tile on its
word; my rows into C). Their GPU tests: examples/distributed/example_gemm_reducescatter.py (both paths at 2
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
    assert fn is grs.gemm_rs_push_kernel and args[:5] == (4096, 2048, 4096, 4, "bfloat16")
    assert GemmConfig(*args[5:]) == DEFAULT      # no tuning entries of its own: the default config
    (g, _), (r, _) = grs.kernels(4096, 2048, 1024, 4, "bfloat16", path="pull")
    assert (g, r) == (grs.gemm_rs_gemm_kernel, grs.gemm_rs_reduce_kernel)


def test_short_k_pushes_from_a_persistent_kernel_on_every_sm(no_runtime):
    """At most PERSISTENT_MAX_K_TILES steps of K per tile: the persistent kernel, one block per SM (`sms`)."""
    assert grs.PERSISTENT_MAX_K_TILES * DEFAULT.block_k == 2048
    [(fn, args)] = grs.kernels(4096, 2048, 2048, 4, "bfloat16", sms=114)
    assert fn is grs.gemm_rs_push_kernel and GemmConfig(*args[5:11]) == DEFAULT and args[11:] == (114,)
    assert grs.kernels(4096, 2048, 2112, 4, "bfloat16")[0][1][11:] == ()          # 33 steps: the grid
    assert grs.kernels(4096, 2048, 1024, 1, "bfloat16")[0][1][11:] == ()          # world size 1: the GEMM alone
    assert not grs.persistent_push(1024, 1, DEFAULT) and grs.persistent_push(64, 2, DEFAULT)


def test_persistent_kernel_rasterizes_in_equal_panels():
    """16 rows of tiles per rank in panels of 10 and 6 ran at half speed (RESULTS.md run 28): the persistent kernel
    takes the largest panel <= the config's swizzle that divides its rows."""
    from tilescale.ops.gemm import even_panel

    assert [even_panel(rows, 10) for rows in (8, 16, 32, 12, 7)] == [8, 8, 8, 6, 7]
    assert even_panel(16, 0) == 0 and even_panel(16, 16) == 16
    # in the kernel: 16 rows of tiles per rank (M = 8192 at 4 ranks): swizzle 10 rasterizes as 8 does, not as 16

    def src(swizzle):
        return kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(8192, 8192, 512, 4, "bfloat16", 128, 256,
                                                                             64, 3, 256, swizzle, persistent=132)))

    assert src(10) == src(8) != src(16)


@pytest.mark.parametrize("W", [2, 4])
def test_persistent_push_kernel_protocol(W):
    """The persistent kernel (module docstring): one pipelined loop over (tile, K step) per block; the accumulator
    cleared by wgmma's scale-d, nothing fenced or selected in a step; the sum in loaded early or after one wait into
    the padded tile, added, the sum out written back into it and pushed from it by one bulk copy through rank
    me - 1's view; that tile counted at the block's next tile's epilogue before anything there waits, the last
    one after the loop; my rows from the registers."""
    M, N, K = 2048, 512, 256                  # 4 steps of K; (M / 128) x 2 tiles on 8 blocks: several per block
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(M, N, K, W, persistent=8)))
    assert "blockIdx.y" not in src and "blockIdx.z" not in src          # one block per SM, a 1-D grid
    consumer = src[src.index("tl::warpgroup_reg_alloc<"):]
    loop = consumer[consumer.index("for (int it_1 = 0;"):]
    step = loop[loop.index("mbarrier[(it_1 % 3)].wait("):loop.index("mbarrier[((it_1 % 3) + 3)].arrive();")]
    assert "fence_proxy_async" not in step and "broadcast_var" not in step and "sync_thread" not in step
    assert re.search(r"wgmma_ss<.*\(\(0 < ki\) \? 1 : \(\(\(it_1 % 4\) == 0\) \? 0 : 1\)\)\);", step), step
    # a tile's first step: the sum in started if counted already (one copy of the padded tile)
    first = loop[:loop.index("mbarrier[(it_1 % 3)].wait(")]
    assert first.index("tilescale::ld<1, 2, unsigned long long>((&(arrived[")< first.index("load_rows_async((&(R[")
    assert ", 1, 67584, 67584, 67584, (&(landed[0])));" in first
    # its last step: count the tile pushed before (before any wait), wait for the sum in, add it, push or store
    last = loop[loop.index("if ((it_1 & 3) == 3) {"):]
    count = last.index("tilescale::release_stores<2, unsigned long long, 0>((uint64_t)1, (&(Ap[pend[")
    assert count < last.index("tilescale::wait_until<unsigned long long>((&(arrived[")
    assert last.index("tilescale::wait_barrier((&(landed[0])), (loads[0] & 1));") < last.index("__bfloat1622float2")
    push = last.index("tilescale::store_rows_async((&(((bfloat16_t*)Rs)[0])), (&(Rp[")
    assert last.rindex("tl::fence_proxy_async();", 0, push) > last.index("__float22bfloat162_rn")  # written, fenced
    assert "pend[0] = " in last[push:] and "*(uint1*)(C + " in last                       # my rows: registers
    assert "tma_store" not in src and src.count("tilescale::release_stores<") == 2
    tail = consumer[consumer.rindex("tilescale::release_stores<"):]
    assert "it_1" not in tail                                              # the last count: after the loop


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


@pytest.mark.parametrize("W", [2, 4, 8])
def test_push_kernel_protocol(W):
    M, N, K = 1024 * max(W // 4, 1), 512, 256
    func = grs.gemm_rs_push_kernel.get_tir(M, N, K, W)
    bufs = [func.buffer_map[p] for p in func.params]
    assert tuple(b.name for b in bufs) == grs.PUSH_PARAMS            # what GemmRS launches it with
    slots, tiles = W - 1, (M // W // 128) * (N // 256)
    assert [int(d) for d in bufs[3].shape] == [2 * slots * tiles * 128, 256 + 8]   # 2 halves of W - 1 slots of
    assert [int(d) for d in bufs[4].shape] == [slots * tiles]                      # tiles; a count per slot, tile
    assert grs.push_shapes(M, N, W, 128, 256) == (tuple(bufs[3].shape), tuple(bufs[4].shape))
    src = kernel_function(lower_source(func))
    # the call number: counted by the consumer warp that uses it, before the loop, nothing else waiting for it
    assert "tilescale::call_number(" not in src and src.count("tilescale::call_number_warp(") == 1
    assert src.index("tl::warpgroup_reg_alloc<") < src.index("tilescale::call_number_warp(")
    # launched step by step: the grid's z is the step, the last one (z = W - 1) my rows
    assert "if (((int)blockIdx.z) == " + str(W - 1) + ") {" in src
    # step d > 1, step 1: before the GEMM's loop, in the consumer branch, the count read once and, if there, the
    # sum in started; no fence or sync added inside the loop
    consumer = src[src.index("tl::warpgroup_reg_alloc<"):]
    loop = consumer.index("for (int ko_1 = 0;")
    first = consumer[:loop]
    probe = first.index("tilescale::ld<1, 2, unsigned long long>((&(arrived[")        # acquire, system scope
    load = first.index("tilescale::load_rows_async((&(R[")
    assert "if (0 < ((int)blockIdx.z)) {" in first                   # steps 2 .. W
    assert first.index("if ((((int)threadIdx.x) >> 5) == 8) {") < first.index("e[0] = tilescale::call_number_warp(")
    assert probe < load and "started[0] = 1;" in first[load:] and "(e[0] <= tilescale::ld<" in first  # 1 a call
    assert ", 1, 67584, 67584, 67584, (&(landed[0])));" in first     # one copy: the tile's 128 padded rows
    body = consumer[loop:consumer.index("mbarrier[((ko_1 % 3) + 3)].arrive();")]
    assert "fence_proxy_async" not in body and "sync_thread" not in body and "load_rows" not in body
    # after the loop: else wait for it, then load; every consumer thread waits for the copy, then adds
    after = consumer[consumer.index("if (started[0] == 0) {"):]
    wait = after.index("tilescale::wait_until<unsigned long long>((&(arrived[")
    assert wait < after.index("tilescale::load_rows_async((&(R[")
    assert after.index("tilescale::load_rows_async((&(R[")< after.index("tilescale::wait_barrier(")
    assert re.search(r"wait_until<unsigned long long>\(\(&\(arrived\[.*\]\)\), 3, e\[0\], ", after)
    assert after.index("tilescale::wait_barrier(") < after.index("__bfloat1622float2") < after.index("tma_store(")
    # step 2: the sum out into rank me - 1's slab (view Rp), this call's half, then counted there (view Ap)
    store = src.index("tl::tma_store(Rp_desc")
    count = src.index("tilescale::release_stores<2, unsigned long long, 0>((uint64_t)1, (&(Ap[")
    assert store < count and "tl::tma_store(C_desc" in src
    # one count per tile, by the warp whose elected lane issued the store (below)
    assert src.count("tilescale::release_stores<") == 1
    assert re.search(r"tma_store\(Rp_desc, .*\(\(int\)\(e\[0\] & \(uint64_t\)1\)\) \* " + str(slots * tiles * 128),
                     src), src
    assert "peer_ptr" not in src and "nvshmem_ptr" not in src      # the peer through its view: no call in the kernel


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
    (compat.storing_warp) is the one that counts the tile; the push kernel's call number and sum in are that warp's
    too. tilelang's election (tl_shuffle_elect<n>: an elected lane of the warps whose index in the block is a
    multiple of n / 32), with its producer warpgroup first (warps 0-3): exactly one consumer warp qualifies."""
    from tilescale.compat import storing_warp

    M, N, K, W = 4096, 2048, 1024, 4
    args = (M, N, K, W, "bfloat16", cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads, cfg.swizzle)
    for src, desc in ((kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(*args))), "Rp_desc"),
                      (kernel_function(lower_source(grs.gemm_rs_gemm_kernel.get_tir(*args))), "P_desc")):
        assert "if (((int)threadIdx.x) < 128) {" in src                  # the producer warpgroup first
        elect, warps = _warp_of_store_and_counts(src, desc)
        assert elect == cfg.threads
        consumers = range(4, 4 + cfg.threads // 32)
        elected = [w for w in consumers if w % (elect // 32) == 0]
        assert warps == set(elected) == {4 + storing_warp(cfg.threads)}, (warps, elected)


def test_push_kernel_at_world_size_1_is_the_gemm_alone():
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(1024, 512, 256, 1)))
    assert src.count("tl::tma_store(") == 1 and "tl::tma_store(C_desc" in src
    assert "wait_until" not in src and "release_stores" not in src


def test_loopback_kernel_is_the_push_kernel_on_one_gpu():
    """bench_gemm_configs --push and bench_fused time it as the push path's GEMM: the same tiles, its pushes into
    its own slab and counted in its own words; its parameter `ranks` is not a world size the job must match."""
    from tilescale.compiler import WORLD_SIZE_PARAMS

    src = kernel_function(lower_source(grs.gemm_rs_push_loopback_kernel.get_tir(1024, 512, 256, 4)))
    assert "tl::tma_store(R_desc" in src and "Rp_desc" not in src
    assert "tilescale::release_stores<2, unsigned long long, 0>((uint64_t)1, (&(arrived[" in src
    assert "tilescale::load_rows_async((&(R[" in src
    assert "ranks" not in WORLD_SIZE_PARAMS
