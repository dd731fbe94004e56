"""GEMM+RS's two paths on a machine without a GPU (tilescale/ops/gemm_reduce_scatter.py): which one a job takes,
the kernels each builds, and the push kernel's protocol as generated (pushes into the peers' slabs through their
views, one count per consumer warp on the owner's word, my rows waiting for e x (W - 1) x warps and adding W - 1
slots of this call's half). Their GPU tests: examples/distributed/example_gemm_reducescatter.py (both paths at 2
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
    assert grs.default_path(grs.MAX_PUSH_RANKS + 1) == "pull"          # one TMA view per peer: at most 7 peers
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
    [(fn, args)] = grs.kernels(4096, 2048, 1024, 4, "bfloat16")
    assert fn is grs.gemm_rs_push_kernel and args[:5] == (4096, 2048, 1024, 4, "bfloat16")
    assert GemmConfig(*args[5:]) == DEFAULT      # no tuning entries of its own: the default config
    (g, _), (r, _) = grs.kernels(4096, 2048, 1024, 4, "bfloat16", path="pull")
    assert (g, r) == (grs.gemm_rs_gemm_kernel, grs.gemm_rs_reduce_kernel)


@pytest.mark.parametrize("W", [2, 4, 8])
def test_push_kernel_protocol(W):
    M, N, K = 1024 * max(W // 4, 1), 512, 256
    func = grs.gemm_rs_push_kernel.get_tir(M, N, K, W)
    bufs = [func.buffer_map[p] for p in func.params]
    assert tuple(b.name for b in bufs) == grs.PUSH_PARAMS            # what GemmRS launches it with
    rows, slots = M // W, W - 1
    assert [int(d) for d in bufs[3].shape] == [2 * slots * rows, N]            # two halves of W - 1 slots
    src = kernel_function(lower_source(func))
    assert src.count("tilescale::call_number(") == 1
    # a tile of rank me + d: stored into that rank's slab (view R<d>), into this call's half, then counted there
    for d in range(1, W):
        store = src.index(f"tl::tma_store(R{d}_desc")
        count = src.index(f"tilescale::release_stores<2, unsigned long long, 0>((uint64_t)1, (&(A{d}[")
        assert store < count
    assert f"R{W}_desc" not in src and f"A{W}[" not in src                     # the unused views are not touched
    assert re.search(r"tma_store\(R1_desc, .*\(\(int\)\(e & \(uint64_t\)1\)\) \* " + str(slots * rows), src), src
    # my rows: wait for e x (W - 1) x 8 consumer warps' counts, add W - 1 slots, then the TMA store into C
    wait = re.search(r"tilescale::wait_until<unsigned long long>\(\(&\(arrived\[.*\]\)\), 3, "
                     r"\(+e \* \(uint64_t\)(\d+)\)(?: \* \(uint64_t\)(\d+)\))?, ", src)
    assert wait and int(wait[1]) * int(wait[2] or 1) == (W - 1) * 8, src
    fold = src[wait.end():src.index("tl::tma_store(C_desc")]
    assert "*(uint4*)(R + " in fold                                  # coalesced loads of the slots
    assert W == 2 or re.search(r"for \(int j = 0; j < " + str(W - 1) + r"; \+\+j\)", fold)
    assert wait.end() < src.index("tl::tma_store(C_desc")
    assert "peer_ptr" not in src and "nvshmem_ptr" not in src      # peers through their views: no call in the kernel


def test_push_kernel_at_world_size_1_is_the_gemm_alone():
    src = kernel_function(lower_source(grs.gemm_rs_push_kernel.get_tir(1024, 512, 256, 1)))
    assert src.count("tl::tma_store(") == 1 and "tl::tma_store(C_desc" in src
    assert "wait_until" not in src and "release_stores" not in src


def test_loopback_kernel_is_the_push_kernel_on_one_gpu():
    """bench_gemm_configs --push and bench_fused time it as the push path's GEMM: the same tiles, its pushes into
    its own slab and counted in its own words; its parameter `ranks` is not a world size the job must match."""
    from tilescale.compiler import WORLD_SIZE_PARAMS

    src = kernel_function(lower_source(grs.gemm_rs_push_loopback_kernel.get_tir(1024, 512, 256, 4)))
    assert "tl::tma_store(R_desc" in src and "R1_desc" not in src
    assert "tilescale::release_stores<2, unsigned long long, 0>((uint64_t)1, (&(arrived[" in src
    assert "ranks" not in WORLD_SIZE_PARAMS
