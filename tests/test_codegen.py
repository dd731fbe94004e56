"""Generated CUDA of distributed kernels: tilescale's post-processing, golden snapshots of each op
family, one nvcc build of every op for sm_90a, and coherent loads after a wait (PTX).

Snapshots live in tests/golden/<family>.cu (the kernel function, whitespace-normalised);
``UPDATE_GOLDEN=1 python -m pytest tests/test_codegen.py`` rewrites them."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import tilescale
import tilescale.language as T
from tilescale import codegen, discovery

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
SM90 = {"kind": "cuda", "arch": "sm_90a"}
N = 256
W = 4  # world size the kernels are written for


# ------------------------------------------------------------------------------------ op families
@tilescale.jit
def fam_put_get(n: int = N, world_size: int = W):
    @T.prim_func
    def put_get(src: T.Tensor((n,), "float32"), dst: T.Tensor((world_size, n), "float32"),
                tile: T.Tensor((64, 64), "float16"), peer_tile: T.Tensor((64, 128), "float16"),
                ranks: T.Tensor((2,), "int32")):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            npes = T.get_num_ranks()
            nxt = (me + 1) % npes
            s = T.alloc_shared((n,), "float32")
            T.copy(src, s)
            T.put_block(s, dst[me, :], dst_pe=nxt)
            T.put_block_nbi(src, dst[me, :], dst_pe=nxt)
            T.put_warp(src[0:32], dst[me, 0:32], dst_pe=nxt)
            T.put_warp_nbi(src[0:32], dst[me, 32:64], dst_pe=nxt)
            T.put_thread(src[8], dst[me, 8], size=4, dst_pe=0)
            T.put_thread_nbi(src[16], dst[me, 16], size=4, dst_pe=0)
            T.put_block(tile, peer_tile[0:64, 64:128], dst_pe=nxt)           # 64 rows of 128 bytes
            T.get_block(dst[me, :], s, src_pe=nxt)
            T.get_block_nbi(dst[me, :], src, src_pe=nxt)
            T.get_warp(dst[me, 0:32], src[0:32], src_pe=nxt)
            T.get_warp_nbi(dst[me, 0:32], src[32:64], src_pe=nxt)
            T.get_thread(dst[me, 0], src[0], size=8, src_pe=1)
            T.get_thread_nbi(dst[me, 8], src[8], size=8, src_pe=1)
            ranks[0] = me
            ranks[1] = npes

    return put_get


@tilescale.jit
def fam_signal_wait(n: int = N, world_size: int = W):
    @T.prim_func
    def signal_wait(src: T.Tensor((n,), "float32"), dst: T.Tensor((world_size, n), "float32"),
                    sig: T.Tensor((world_size,), "uint64"), cnt: T.Tensor((4,), "int32"), epoch: T.uint64):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            nxt = (me + 1) % world_size
            T.put_signal_block(src, dst[me, :], sig[me], value=epoch, dst_pe=nxt)
            T.put_signal_warp(src[0:32], dst[me, 0:32], sig[me], value=1, sig_op="add", dst_pe=nxt)
            T.put_signal_thread(src[0], dst[me, 0], sig[me], size=4, value=2, dst_pe=nxt)
            T.signal_op(sig[me], value=epoch, op="set", dst_pe=nxt)
            T.signal_set(sig[me], 5, dst_pe=0)
            T.signal_add(sig[me], 1, dst_pe=1)
            T.wait_until(sig[(me + world_size - 1) % world_size], cmp="eq", value=epoch)
            T.wait_ge(sig[0], 1)
            T.wait_ne(cnt[0], 0)
            T.wait_lt(cnt[1], 3)

    return signal_wait


@tilescale.jit
def fam_ld_st_atomics():
    @T.prim_func
    def ld_st_atomics(flag: T.Tensor((8,), "int32"), word: T.Tensor((4,), "uint64"), acc: T.Tensor((4,), "float32"),
                      out: T.Tensor((8,), "int64")):
        with T.Kernel(1, threads=32):
            a = T.ld(flag[0], scope="sys", sem="acquire")
            b = T.ld(flag[1], scope="gpu", sem="relaxed", src_pe=1)
            c = T.ld(word[0], scope="cta", sem="volatile")
            T.st(flag[2], a + b, scope="sys", sem="release")
            T.st(flag[3], 7, scope="sys", sem="release", dst_pe=2)
            T.st(word[1], c, scope="gpu", sem="relaxed")
            d = T.atom_add(flag[4], 1, scope="gpu", sem="relaxed")
            e = T.atom_add(acc[0], 1.5, scope="sys", sem="acq_rel", dst_pe=3)
            f = T.atom_cas(word[2], 0, 1, scope="sys", sem="acquire")
            g = T.atom_cas(flag[5], 0, 9, scope="sys", sem="release", dst_pe=1)
            out[0] = T.cast(d, "int64")
            out[1] = T.cast(e, "int64")
            out[2] = T.cast(f, "int64")
            out[3] = T.cast(g, "int64")

    return ld_st_atomics


@tilescale.jit
def fam_order_barrier(n: int = N):
    @T.prim_func
    def order_barrier(src: T.Tensor((n,), "float32"), dst: T.Tensor((n,), "float32")):
        with T.Kernel(2, threads=128):
            T.put_block_nbi(src, dst, dst_pe=1)
            T.fence()
            T.put_block_nbi(src, dst, dst_pe=1)
            T.quiet()
            T.barrier_all()
            T.barrier_all(scope="warp")
            T.barrier_all(scope="thread")
            T.sync_all()
            T.sync_all(scope="warp")
            T.barrier_all(scope="grid")

    return order_barrier


@tilescale.jit
def fam_remote_copy(n: int = 64, world_size: int = W):
    @T.prim_func
    def remote_copy(buf: T.Tensor((n, n), "float16"), out: T.Tensor((n, n), "float16")):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            s = T.alloc_shared((n, n), "float16")
            T.copy(T.remote(buf, pe=(me + 1) % world_size), s)      # read a peer's copy
            T.copy(s, T.remote(out, pe=(me + world_size - 1) % world_size))  # write into another's
            peer = T.remote(buf, pe=0)
            out[0, 0] = peer[1, 1]

    return remote_copy


FAMILIES = {
    "put_get": fam_put_get,
    "signal_wait": fam_signal_wait,
    "ld_st_atomics": fam_ld_st_atomics,
    "order_barrier": fam_order_barrier,
    "remote_copy": fam_remote_copy,
}


@tilescale.jit
def every_op(n: int = N, world_size: int = W):
    """Every op family in one kernel: compiled by nvcc once."""
    @T.prim_func
    def every_op(src: T.Tensor((n,), "float32"), dst: T.Tensor((world_size, n), "float32"),
                 sig: T.Tensor((world_size,), "uint64"), flag: T.Tensor((8,), "int32"),
                 acc: T.Tensor((4,), "float32"), tile: T.Tensor((64, 64), "float16"),
                 peer_tile: T.Tensor((64, 128), "float16"), out: T.Tensor((8,), "int64"), epoch: T.uint64):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            nxt = (me + 1) % T.get_num_ranks()
            s = T.alloc_shared((n,), "float32")
            ts = T.alloc_shared((64, 64), "float16")
            T.copy(src, s)
            T.put_block(s, dst[me, :], dst_pe=nxt)
            T.put_warp_nbi(src[0:32], dst[me, 0:32], dst_pe=nxt)
            T.put_thread(src[8], dst[me, 8], size=4, dst_pe=0)
            T.put_block(tile, peer_tile[0:64, 64:128], dst_pe=nxt)
            T.get_block(dst[me, :], s, src_pe=nxt)
            T.get_warp(dst[me, 0:32], src[0:32], src_pe=nxt)
            T.get_thread_nbi(dst[me, 8], src[8], size=8, src_pe=1)
            T.fence()
            T.quiet()
            T.put_signal_block(src, dst[me, :], sig[me], value=epoch, dst_pe=nxt)
            T.put_signal_warp(src[0:32], dst[me, 0:32], sig[me], value=1, sig_op="add", dst_pe=nxt)
            T.signal_op(sig[me], value=epoch, op="set", dst_pe=nxt)
            T.wait_until(sig[me], cmp="ge", value=epoch)
            T.wait_ne(flag[7], 0)
            a = T.ld(flag[0], scope="sys", sem="acquire")
            b = T.ld(flag[1], scope="gpu", sem="relaxed", src_pe=1)
            T.st(flag[2], a + b, scope="sys", sem="release")
            T.st(flag[3], 7, scope="sys", sem="release", dst_pe=2)
            d = T.atom_add(flag[4], 1)
            e = T.atom_add(acc[0], 1.5, scope="sys", sem="acq_rel", dst_pe=3)
            g = T.atom_cas(flag[5], 0, 9, scope="sys", sem="release", dst_pe=1)
            T.copy(T.remote(tile, pe=nxt), ts)
            T.copy(ts, T.remote(peer_tile, pe=nxt)[0:64, 0:64])
            T.barrier_all()
            T.sync_all(scope="warp")
            T.release_stores(flag[6], 2, scope="gpu")
            landed = T.alloc_shared((1,), "uint64", scope="shared")
            padded = T.alloc_shared((64, 72), "float16")
            T.init_barrier(landed)
            if T.get_thread_binding() < 32:
                T.load_async(tile[0:64, 0:64], padded[0:64, 0:64], barrier=landed)
            T.wait_barrier(landed, 0)
            if T.get_thread_binding() < 32:
                T.store_async(padded[0:64, 0:64], T.remote(peer_tile, pe=nxt)[0:64, 0:64])
            if T.get_thread_binding() == 32:
                T.arrive_barrier(landed)
            T.wait_barrier(landed, 1)
            if T.get_thread_binding() < 32:
                T.store_async(padded[0:64, 0:64], tile[0:64, 0:64], wait="written")
            if T.get_thread_binding() >= 64:
                T.store_tile(padded[0:64, 0:64], T.remote(peer_tile, pe=nxt)[0:64, 64:128], threads=(64, 64))
            out[0] = T.cast(d, "int64")
            out[1] = T.cast(e, "int64")
            out[2] = T.cast(g, "int64")
            out[3] = T.cast(s[3], "int64")

    return every_op


# ------------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def module_env():
    with pytest.MonkeyPatch.context() as mp:
        for name in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM",
                     "TILESCALE_USE_DISTRIBUTED", "TILELANG_USE_DISTRIBUTED"):
            mp.delenv(name, raising=False)
        discovery.clear_cache()
        yield mp
    discovery.clear_cache()


def lower_source(func, build_mode: str = "inlined", distributed: bool = True) -> str:
    """Device source as tilescale.build generates it, without nvcc: lowering only."""
    from tilelang import tvm
    from tilelang.engine.lower import lower
    from tvm.target import Target

    tgt = Target(SM90, "c")
    ctx = codegen.distributed_build(build_mode) if distributed else _null()
    with ctx, tvm.transform.PassContext(opt_level=3), tgt:
        return lower(func, target=tgt).kernel_source


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


_KERNEL_DEF = re.compile(r'^extern "C" __global__ void __launch_bounds__[^\n]*\{$', re.M)


def kernel_function(src: str) -> str:
    """The `__global__` kernel definition (signature and body) of tilelang's generated source."""
    m = _KERNEL_DEF.search(src)
    assert m, "no kernel definition found in:\n" + src[:3000]
    end = src.index("\n}\n", m.start())
    return src[m.start():end + 2]


def kernel_params(src: str) -> list[str]:
    """Parameter declarations of every `extern "C" __global__` line (declarations and definitions)."""
    out = []
    for line in src.splitlines():
        if line.startswith('extern "C" __global__ void'):
            out.append(line[line.index("(", line.index("void")) + 1:line.rindex(")")])
    return out


def normalise(text: str) -> str:
    from tilescale.language.distributed import WAIT_SITES

    # wait sites are hashes of this file's line numbers: edits above a kernel must not break its snapshot
    for site, loc in WAIT_SITES.items():
        if os.path.basename(loc.rpartition(":")[0]) == os.path.basename(__file__):
            text = re.sub(rf"\b{site}\b", "<site>", text)
    lines = [" ".join(ln.split()) for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if ln) + "\n"


# ------------------------------------------------------------------------------------------ golden
@pytest.mark.parametrize("family", list(FAMILIES))
def test_golden(module_env, family):
    func = FAMILIES[family].get_tir()
    spec = tilescale.resolve_backend(func)
    assert spec.distributed and spec.build_mode == "inlined"
    src = lower_source(func, spec.build_mode)
    got = normalise(kernel_function(src))
    path = GOLDEN / f"{family}.cu"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no snapshot {path}: run UPDATE_GOLDEN=1 python -m pytest {__file__}"
    want = normalise(path.read_text())
    if got != want:
        import difflib

        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{family}.cu",
                                            "generated"))
        pytest.fail(f"generated CUDA of family '{family}' differs from its snapshot "
                    f"(UPDATE_GOLDEN=1 to accept):\n{diff}")


@pytest.mark.parametrize("op", ["barrier_all", "sync_all"])
def test_grid_scope_meets_the_whole_grid_around_the_first_blocks_barrier(module_env, op):
    """scope="grid": every block meets (grid sync), block 0 runs the barrier of all ranks, every block meets
    again. Without the grid syncs the other blocks would read peers' data before it arrives."""
    @T.prim_func
    def grid_scope(x: T.Tensor((128,), "float32")):
        with T.Kernel(4, threads=128) as b:
            getattr(T, op)(scope="grid")
            x[b] = 1.0

    body = kernel_function(lower_source(grid_scope))
    sync = "cooperative_groups::this_grid().sync();"
    i = body.index("tilescale::barrier_all_first_block();")
    assert body.count(sync) == 2, body
    assert body.index(sync) < i < body.rindex(sync), body


def test_golden_snapshots_have_no_stale_files():
    expected = {f"{f}.cu" for f in FAMILIES}
    present = {p.name for p in GOLDEN.glob("*.cu")}
    assert present == expected, f"unexpected or missing snapshots: {present ^ expected}"


def test_normalise_ignores_whitespace_only():
    assert normalise("a  b\n\n   c\t d \n") == normalise("a b\nc d")
    assert normalise("a b") != normalise("ab")


# ---------------------------------------------------------------------- one nvcc build of every op
@pytest.fixture(scope="module")
def every_op_build(module_env, tmp_path_factory):
    d = tmp_path_factory.mktemp("every_op")
    old = tempfile.tempdir
    tempfile.tempdir = str(d)
    try:
        yield tilescale.build(every_op.get_tir(), target=SM90, build_mode="inlined")
    finally:
        tempfile.tempdir = old


def test_every_op_compiles_for_sm90(every_op_build):
    r = every_op_build
    assert Path(r.library).is_file()
    dyn = subprocess.run(["readelf", "-d", r.library], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "[libnvshmem_host.so.3]" in dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", r.library], stdout=subprocess.PIPE, text=True).stdout
    assert re.search(r"\bT tilescale_module_init\b", syms)


def test_generated_source_of_distributed_kernel(every_op_build):
    src = every_op_build.source
    assert src.startswith(codegen.NO_COLLECTIVES_LINE + "#include <tilescale/tilescale.cuh>\n")  # language ops only
    assert src.count("#include <tilescale/tilescale.cuh>") == 1
    for call in ("nvshmem_my_pe()", "nvshmem_n_pes()", "tilescale::put<2, false>", "tilescale::get<1, false>",
                 "tilescale::put_signal<2>", "tilescale::signal_op(", "tilescale::wait_until<unsigned long long>",
                 "tilescale::ld_pe<", "tilescale::st_pe<", "tilescale::atom_add_pe<", "tilescale::atom_cas_pe<",
                 "tilescale::peer_ptr(", "nvshmem_fence()", "nvshmem_quiet()", "tilescale::barrier_all<2>()",
                 "tilescale::sync_all<1>()", "tilescale::release_stores<1, int, 0>(",
                 "tilescale::init_barrier((&(landed[0])), 1);", "tilescale::wait_barrier((&(landed[0])), 0);"):
        assert call in src, f"{call} missing"
    # 64 rows of 128 bytes, 128 bytes apart in `tile`, 144 apart in `padded`
    assert re.search(r"tilescale::load_rows_async\(\(&\(tile\[0\]\)\), \(&\(\(\(half_t\*\)padded\)\[0\]\)\), "
                     r"64, 128, 128, 144, \(&\(landed\[0\]\)\)\);", src), src
    # and back out to a peer's tile through its mapping: 64 rows of 128 bytes, 144 apart in `padded`, 256 in the peer's
    assert re.search(r"tilescale::store_rows_async\(\(&\(\(\(half_t\*\)padded\)\[0\]\)\), .*, 64, 128, 144, 256, 0\);",
                     src), src
    # then, once a thread arrived on the barrier without bytes, into this rank's tile, returning once written
    assert "tilescale::arrive_barrier((&(landed[0])));" in src
    assert re.search(r"tilescale::store_rows_async\(\(&\(\(\(half_t\*\)padded\)\[0\]\)\), \(&\(tile\[0\]\)\), "
                     r"64, 128, 144, 128, 1\);", src), src
    # and by the plain stores of warps 2 and 3 (threads 64 .. 127) into the peer's right half
    assert re.search(r"tilescale::store_tile\(\(&\(\(\(half_t\*\)padded\)\[0\]\)\), .*, 64, 128, 144, 256, 64, 64\);",
                     src), src
    params = kernel_params(src)
    assert params and all("__restrict__" not in p for p in params), params
    # inlined mode: no RDC re-basing of shared memory
    assert "align_dyn_smem" not in src and "rdc_launch_ex" not in src


# ------------------------------------------------------------------------------------ RDC mode
@tilescale.jit
def smem_kernel(n: int = 1024):
    @T.prim_func
    def smem(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((n,), "float32")
            s2 = T.alloc_shared((n,), "float32")
            T.copy(A, s)
            T.copy(C, s2)
            T.put_block(s, B, dst_pe=(T.get_rank() + 1) % T.get_num_ranks())
            T.put_block(s2, B, dst_pe=(T.get_rank() + 2) % T.get_num_ranks())

    return smem


def test_rdc_rebases_dynamic_shared_memory(module_env):
    func = smem_kernel.get_tir()
    plain = lower_source(func, distributed=False)
    assert "extern __shared__ __align__(1024) uchar buf_dyn_shmem[];" in plain  # what tilelang generates

    rdc = lower_source(func, "rdc")
    assert rdc.startswith("#include <tilescale/tilescale.cuh>\n")
    assert "uchar buf_dyn_shmem[]" not in rdc
    assert "extern __shared__ __align__(1024) uchar tilescale_dyn_shmem_raw[];" in rdc
    assert ("uchar* buf_dyn_shmem = reinterpret_cast<uchar*>(tilescale::align_dyn_smem(tilescale_dyn_shmem_raw));"
            in rdc)
    body = kernel_function(rdc)
    assert body.index("tilescale::align_dyn_smem") < body.index("buf_dyn_shmem +"), "re-based before first use"
    for macro in ("#define cudaFuncSetAttribute(f, a, v) ::tilescale::rdc_set_attr",
                  "#define cudaLaunchKernelEx(c, k, ...) ::tilescale::rdc_launch_ex",
                  "#define cudaLaunchCooperativeKernel("):
        assert macro in rdc, macro
    # the macros follow the kernel, so they apply to the launch code tilelang appends after it
    assert rdc.index("#define cudaLaunchKernelEx") > rdc.index(body)

    inlined = lower_source(func, "inlined")
    assert "buf_dyn_shmem[];" in inlined and "align_dyn_smem" not in inlined and "rdc_set_attr" not in inlined


@tilescale.jit
def single_smem_kernel(n: int = 1024):
    @T.prim_func
    def single_smem(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((n,), "float32")
            T.copy(A, s)
            T.put_block(s, B, dst_pe=(T.get_rank() + 1) % T.get_num_ranks())

    return single_smem


def test_rdc_rebases_a_single_shared_buffer(module_env):
    """One shared buffer keeps its own name and type in tilelang's source; it is re-based all the same."""
    func = single_smem_kernel.get_tir()
    plain = lower_source(func, distributed=False)
    decl = [ln.strip() for ln in plain.splitlines() if "extern __shared__ __align__(1024)" in ln]
    assert decl and "buf_dyn_shmem" not in decl[0], decl
    name = decl[0].split()[-1].rstrip("[];")
    rdc = lower_source(func, "rdc")
    assert decl[0] not in rdc
    assert f"float* {name} = reinterpret_cast<float*>(tilescale::align_dyn_smem(tilescale_dyn_shmem_raw));" in rdc
    assert "#define cudaLaunchKernelEx(c, k, ...) ::tilescale::rdc_launch_ex" in rdc


def test_rdc_without_dynamic_shared_memory_adds_no_macros(module_env):
    src = lower_source(fam_signal_wait.get_tir(), "rdc")
    assert src.startswith("#include <tilescale/tilescale.cuh>\n")
    assert "align_dyn_smem" not in src and "rdc_set_attr" not in src


def test_transform_is_idempotent():
    src = ('extern "C" __global__ void __launch_bounds__(128, 1) k(const float* __restrict__ a, '
           'float* __restrict__ b) {\n'
           '  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];\n}\n')
    once = codegen.transform(src, "rdc")
    assert "__restrict__" not in once.split("{")[0]
    assert codegen.transform(once, "rdc") == once


# -------------------------------------------------------------- the post-processor does not leak
@tilescale.jit
def plain_add(n: int = 2048):
    @T.prim_func
    def plain_add(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            for i in T.Parallel(128):
                C[bx * 128 + i] = A[bx * 128 + i] + B[bx * 128 + i]

    return plain_add


def test_plain_kernel_after_distributed_one_is_untouched(module_env, monkeypatch, tmp_path):
    import tilelang

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # tilelang's JIT keeps the .cu/.so it compiled there
    sys.path.insert(0, str(HERE.parent / "examples" / "distributed"))
    from example_ring_put import ring_put_kernel

    # a distributed compile (tilescale.compile: cython + NVSHMEM) and a distributed lowering in this process
    dk = tilescale.compile(ring_put_kernel.get_tir(64, 256, 4))
    assert isinstance(dk, tilescale.DistributedKernel) and dk.build_mode == "inlined"
    assert dk.get_kernel_source().startswith(codegen.NO_COLLECTIVES_LINE + "#include <tilescale/tilescale.cuh>")
    assert lower_source(smem_kernel.get_tir(), "rdc").startswith("#include <tilescale/tilescale.cuh>")

    func = plain_add.get_tir()
    tilelang.disable_cache()  # generate it now, in this process, after the distributed builds
    try:
        k = tilescale.compile(func)
    finally:
        tilelang.enable_cache()
    assert not isinstance(k, tilescale.DistributedKernel)
    assert k.execution_backend == "tvm_ffi"
    src = k.get_kernel_source()
    assert "tilescale" not in src and "nvshmem" not in src
    assert all("__restrict__" in p for p in kernel_params(src)), "tilelang's own code generation is kept"
    # and a plain lowering in this thread too
    assert "tilescale" not in lower_source(func, distributed=False)


# ------------------------------------------------------------ coherent loads after a wait (PTX)
@tilescale.jit
def wait_then_read(n: int = 1024):
    @T.prim_func
    def wait_then_read(data: T.Tensor((n,), "float32"), sig: T.Tensor((1,), "uint64"),
                       out: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            T.wait_until(sig[0], cmp="ge", value=1)
            for i in T.Parallel(n):
                out[i] = data[i] * 2.0

    return wait_then_read


def _ptx_command(cu: Path, flags) -> list[str]:
    import tilelang.env as tl_env

    from tilescale.toolchain import nvcc_path

    keep = [f for f in flags if f.startswith(("-I", "-D", "-diag"))]
    return [nvcc_path(), "-ptx", "-std=c++20", "-w", "-arch=sm_90a", f"-I{tl_env.CUTLASS_INCLUDE_DIR}",
            f"-I{tl_env.TILELANG_TEMPLATE_PATH}", *keep, str(cu), "-o", str(cu.with_suffix(".ptx"))]


def test_no_noncoherent_loads_after_a_wait(module_env, tmp_path):
    """A read-only parameter read after a wait may hold data a peer wrote during the kernel: it must not
    be read with ld.global.nc. Control: the same source with tilelang's __restrict__ put back does."""
    from tilescale.backend import nvshmem_compile_flags

    func = wait_then_read.get_tir()
    spec = tilescale.resolve_backend(func)
    src = lower_source(func, spec.build_mode)
    assert "const float* data" in src
    flags = nvshmem_compile_flags(spec, discovery.find_nvshmem())
    restrict = re.compile(r"^(extern \"C\" __global__ void[^\n]*)$", re.M)
    control = restrict.sub(lambda m: re.sub(r"(const \w+\*) (\w+)", r"\1 __restrict__ \2", m.group(1)), src)
    assert "const float* __restrict__ data" in control
    (tmp_path / "ours.cu").write_text(src)
    (tmp_path / "control.cu").write_text(control)
    procs = {name: subprocess.Popen(_ptx_command(tmp_path / f"{name}.cu", flags), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for name in ("ours", "control")}
    ptx = {}
    for name, p in procs.items():
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        text = (tmp_path / f"{name}.ptx").read_text()
        entry = text[text.index(".entry wait_then_read_kernel"):]
        ptx[name] = entry
    assert "ld.global.nc" in ptx["control"], "control lost its non-coherent loads: the check would prove nothing"
    assert "ld.global.nc" not in ptx["ours"]
