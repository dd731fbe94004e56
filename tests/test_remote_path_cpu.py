"""The remote path of every op, on a machine without a GPU: ``TILESCALE_NODE_SIZE`` is a build flag of
every distributed kernel (and so in its cache key); the scalar peer ops (ld/st/atom/wait with a PE) have an
NVSHMEM path that never stops the kernel; ``T.peer_reachable`` picks a path per peer; every op's kernels
build and link under ``TILESCALE_NODE_SIZE=1``; the host side refuses peer views of another node and has
the on-stream get AG+GEMM pulls with. Their GPU test: tests/test_gpu_remote.py."""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import tilescale
import tilescale.language as T
from tilescale import build_only, discovery, kernel_build
from tilescale.errors import LanguageError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SM90 = {"kind": "cuda", "arch": "sm_90a"}


@tilescale.jit
def remote_scalars(world_size: int = 4):
    """Every scalar op with a peer, on each dtype family, and a per-peer choice of T.remote vs get."""
    @T.prim_func
    def remote_scalars(w32: T.Tensor((8,), "int32"), w64: T.Tensor((8,), "uint64"), s64: T.Tensor((8,), "int64"),
                       f32: T.Tensor((8,), "float32"), f64: T.Tensor((8,), "float64"),
                       tile: T.Tensor((64, 64), "float16"), staging: T.Tensor((64, 64), "float16"),
                       out: T.Tensor((16,), "float64")):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            p = (me + 1) % world_size
            a = T.ld(w32[0], scope="sys", sem="acquire", src_pe=p)
            b = T.ld(w64[0], scope="gpu", sem="relaxed", src_pe=p)
            c = T.ld(f64[0], scope="sys", sem="volatile", src_pe=p)
            T.st(w32[1], a + 1, scope="sys", sem="release", dst_pe=p)
            T.st(s64[1], 7, scope="sys", sem="relaxed", dst_pe=p)
            T.st(f32[1], 1.5, scope="sys", sem="release", dst_pe=p)
            d = T.atom_add(w32[2], 1, scope="sys", sem="acq_rel", dst_pe=p)
            e = T.atom_add(s64[2], -3, scope="sys", sem="release", dst_pe=p)
            f = T.atom_add(f32[2], 2.5, scope="sys", sem="relaxed", dst_pe=p)
            g = T.atom_cas(w64[3], 0, 9, scope="sys", sem="acquire", dst_pe=p)
            h = T.atom_cas(w32[3], 0, 9, scope="sys", sem="relaxed", dst_pe=p)
            T.wait_until(w64[4], cmp="ge", value=1, src_pe=p)
            T.wait_until(w32[4], cmp="ne", value=0, src_pe=p)
            if T.peer_reachable(tile, pe=p):
                out[8] = T.cast(T.remote(tile, pe=p)[1, 1], "float64")
            else:
                T.get_block(tile, staging, src_pe=p)
                out[8] = T.cast(staging[1, 1], "float64")
            for i, v in enumerate((a, b, c, d, e, f, g, h)):
                out[i] = T.cast(v, "float64")

    return remote_scalars


def _lower(func) -> str:
    return build_only.lower_source(func, SM90)


def _flags_and_key(func, monkeypatch, node_size):
    if node_size is None:
        monkeypatch.delenv("TILESCALE_NODE_SIZE", raising=False)
    else:
        monkeypatch.setenv("TILESCALE_NODE_SIZE", node_size)
    spec = tilescale.resolve_backend(func)
    flags = kernel_build.prepare_distributed(func, spec, None, None)
    from tvm.target import Target

    return flags, build_only._build_key(func, Target(SM90, "c"), {}, flags, spec)


# --------------------------------------------------------------------------- the flag and the key
def test_node_size_is_a_build_flag_and_changes_the_cache_key(monkeypatch):
    func = remote_scalars.get_tir()
    keys = {}
    for k in (None, "1", "2"):
        flags, keys[k] = _flags_and_key(func, monkeypatch, k)
        assert [f for f in flags if f.startswith("-DTILESCALE_NODE_SIZE=")] == [f"-DTILESCALE_NODE_SIZE={k or 0}"]
    assert len(set(keys.values())) == 3, keys


def test_the_header_reads_the_flag():
    """peer_ptr_or_null (what every op asks first) refuses a PE of another emulated node."""
    text = (Path(tilescale.__file__).parent / "include" / "tilescale" / "ops.cuh").read_text()
    body = text[text.index("void* peer_ptr_or_null("):]
    body = body[:body.index("\n}\n")]
    assert "same_node(pe)" in body and "nvshmem_ptr(p, pe)" in body
    same = text[text.index("bool same_node(int pe)"):]
    assert "pe / TILESCALE_NODE_SIZE == nvshmem_my_pe() / TILESCALE_NODE_SIZE" in same[:same.index("\n}\n")]


# ---------------------------------------------------------------------- the language primitive
def test_peer_reachable_picks_the_path_per_peer():
    src = _lower(remote_scalars.get_tir())
    m = re.search(r"if \(tilescale::peer_reachable\(\(&\(tile\[0\]\)\), [^\n]*\)\) \{", src)
    assert m, src
    then, rest = src[m.end():].split("} else {", 1)
    assert "tilescale::peer_ptr(" in then and "tilescale::get<2, false>" not in then
    assert "tilescale::get<2, false>" in rest[:rest.index("}")] and "peer_ptr" not in rest[:rest.index("}")]
    for call in ("ld_pe<1, 2, int>", "ld_pe<0, 1, unsigned long long>", "ld_pe<4, 2, double>",
                 "st_pe<2, 2, int>", "st_pe<0, 2, long long>", "st_pe<2, 2, float>", "atom_add_pe<3, 2, int>",
                 "atom_add_pe<2, 2, long long>", "atom_add_pe<0, 2, float>", "atom_cas_pe<1, 2, unsigned long long>",
                 "atom_cas_pe<0, 2, int>", "wait_until_pe<unsigned long long>", "wait_until_pe<int>"):
        assert f"tilescale::{call}" in src, call


def test_peer_reachable_checks_its_arguments():
    with pytest.raises(LanguageError, match=r"T.peer_reachable: buf: buffer 's' is in shared"):
        @T.prim_func
        def bad(x: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=32):
                s = T.alloc_shared((64,), "float32")
                if T.peer_reachable(s, pe=1):
                    x[0] = 1.0
    with pytest.raises(LanguageError, match=r"T.peer_reachable: pe"):
        @T.prim_func
        def bad_pe(x: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=32):
                if T.peer_reachable(x, pe=1.5):
                    x[0] = 1.0


def test_peer_reachable_marks_its_buffer_symmetric():
    from tilescale.analysis import symmetric_params

    assert "tile" in symmetric_params(remote_scalars.get_tir())


# ------------------------------------------------------- the scalar peer ops never stop the kernel
def _ptx(folder: Path, name: str, src: str, node_size: int):
    import tilelang.env as tl_env

    from tilescale.backend import INCLUDE_DIR
    from tilescale.toolchain import nvcc_path

    nv = discovery.find_nvshmem()
    cu = folder / f"{name}.cu"
    cu.write_text(src)
    cmd = [nvcc_path(), "-ptx", "-std=c++20", "-w", "-arch=sm_90a", f"-I{tl_env.CUTLASS_INCLUDE_DIR}",
           f"-I{tl_env.TILELANG_TEMPLATE_PATH}", f"-I{INCLUDE_DIR}", f"-I{nv.include_dir}",
           "-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING", "-DTILESCALE_BUILD_MODE_INLINED", "-DTILESCALE_WAIT_TIMEOUT_NS=0ull",
           f"-DTILESCALE_NODE_SIZE={node_size}", str(cu), "-o", str(cu.with_suffix(".ptx"))]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cu.with_suffix(".ptx")


@pytest.fixture
def own_tmp():
    """A temporary folder of this test's own (pytest's numbered ones may be pruned by another pytest run)."""
    with tempfile.TemporaryDirectory(prefix="tilescale-remote-") as d:
        yield Path(d)


def test_scalar_peer_ops_take_nvshmem_atomics_instead_of_trapping(own_tmp):
    """Under TILESCALE_NODE_SIZE=1 the peer of every scalar op is on another node: the ops must fall back to
    NVSHMEM's atomics, not to peer_ptr (which prints and traps). Control: the same kernel with its T.remote
    branch kept does trap, so the check can see a trap."""
    src = _lower(remote_scalars.get_tir())
    without_view = re.sub(r"if \(tilescale::peer_reachable[^\n]*\{.*?\} else \{(.*?)\n\s*\}\n", r"{\1\n}\n", src,
                          count=1, flags=re.S)
    assert "peer_ptr" not in without_view and "tilescale::get<2, false>" in without_view
    jobs = {"ops": _ptx(own_tmp, "ops", without_view, 1), "control": _ptx(own_tmp, "control", src, 1)}
    ptx = {}
    for name, (p, path) in jobs.items():
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-4000:]
        ptx[name] = path.read_text()
    assert "trap;" in ptx["control"] and "vprintf" in ptx["control"], "control lost its trap: the check proves nothing"
    assert "trap;" not in ptx["ops"] and "vprintf" not in ptx["ops"]


# ------------------------------------------------ every op's kernels under TILESCALE_NODE_SIZE=1
# (jit function, args) of every op's kernels that call a peer op. The GEMM kernels of AG+GEMM and GEMM+RS
# call none (checked below): the flag cannot change their code, so they are not built again here.
OP_KERNELS = """
from tilescale import compiler
from tilescale.ops import all_to_all, allgather, allreduce, broadcast_from_root, gemm_reduce_scatter
from tilescale.ops import reduce_scatter, reduce_to_root
JOBS = {
    "allgather": (allgather.allgather_kernel, (4, 16, "bfloat16")),
    "allreduce_one_shot": (allreduce.allreduce_one_shot_kernel, (4, 16, "bfloat16")),
    "allreduce_two_shot": (allreduce.allreduce_two_shot_kernel, (4, 16, "float32")),
    "reduce_scatter": (reduce_scatter.reduce_scatter_kernel, (4, 32, "float16")),
    "all_to_all": (all_to_all.all_to_all_kernel, (4, 4)),
    "broadcast": (broadcast_from_root.broadcast_kernel, (4, 8)),
    "reduce": (reduce_to_root.reduce_kernel, (4, 8, "bfloat16")),
    "gemm_rs_reduce": (gemm_reduce_scatter.gemm_rs_reduce_kernel, (512, 4, 512, 8, "float16")),
    "barrier": (compiler.barrier_jit(), (4,)),
}
"""

_BUILD_ALL = OP_KERNELS + """
import json, sys
sys.path.insert(0, sys.argv[1])
from build_pool import build_all
from test_remote_path_cpu import remote_scalars
JOBS["remote_scalars"] = (remote_scalars, (4,))
builds = build_all(JOBS).wait()
out = {}
for k in JOBS:
    try:
        r = builds[k]
        out[k] = dict(library=r.library, flags=list(r.flags), source=r.source)
    except Exception as e:
        out[k] = dict(error=f"{type(e).__name__}: {e}"[:3000])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def node_size_1_builds():
    """Every op's kernels built under TILESCALE_NODE_SIZE=1, side by side, in a process of its own (the
    setting is process-wide: the other tests' builds run beside it). Its temporaries in a folder of its own,
    removed after (pytest's numbered folders may be pruned by another pytest run meanwhile)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE")}
    with tempfile.TemporaryDirectory(prefix="tilescale-node1-") as tmp:
        env.update(TILESCALE_NODE_SIZE="1", TMPDIR=tmp,
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
        r = subprocess.run([sys.executable, "-c", _BUILD_ALL, str(HERE)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=900, cwd=str(REPO))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def _op_jobs() -> dict:
    ns: dict = {}
    exec(OP_KERNELS, ns)  # noqa: S102  (the same list the subprocess builds)
    return ns["JOBS"]


@pytest.mark.parametrize("name", [*_op_jobs(), "remote_scalars"])
def test_kernel_builds_and_links_under_node_size_1(node_size_1_builds, name):
    r = node_size_1_builds[name]
    assert "error" not in r, r.get("error")
    assert Path(r["library"]).is_file()
    assert "-DTILESCALE_NODE_SIZE=1" in r["flags"]
    dyn = subprocess.run(["readelf", "-d", r["library"]], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "[libnvshmem_host.so.3]" in dyn


def test_gemm_kernels_call_no_peer_op():
    """The GEMMs of AG+GEMM and GEMM+RS wait and count on local words only: TILESCALE_NODE_SIZE cannot change
    their code (which is why the build above leaves them out). A peer op added to them fails this test."""
    from tilescale.ops.allgather_gemm import ag_gemm_kernel
    from tilescale.ops.gemm_reduce_scatter import gemm_rs_gemm_kernel

    for fn, args in ((ag_gemm_kernel, (512, 512, 4, 2, "float16")),
                     (gemm_rs_gemm_kernel, (512, 512, 4, "float16"))):
        calls = set(re.findall(r"tilescale::[a-z_]+", _lower(fn.get_tir(*args))))
        assert calls and calls <= {"tilescale::wait_until", "tilescale::atom_add", "tilescale::release_stores",
                                  "tilescale::call_number"}, calls


# ------------------------------------------------------------------------------------ host side
def test_peer_views_of_another_node_are_refused(monkeypatch):
    from types import SimpleNamespace

    from tilescale import heap, symm
    from tilescale.errors import TileScaleError
    from tilescale.heap import Allocation

    rt = SimpleNamespace(info=SimpleNamespace(world_size=4, rank=1, local_world_size=4), closed=False,
                         shim=SimpleNamespace(ts_ptr=lambda ptr, pe: 0x90000 + pe))
    monkeypatch.setattr(symm, "current", lambda: rt)
    heap.registry(rt).add(Allocation(base=0x10000, nbytes=64, shape=(64,), dtype="uint8", seq=0, where="test"))
    t = SimpleNamespace(is_cuda=True, data_ptr=lambda: 0x10000, numel=lambda: 16, element_size=lambda: 4)
    monkeypatch.delenv("TILESCALE_NODE_SIZE", raising=False)
    assert [symm.get_remote_ptr(t, p) for p in range(4)] == [0x90000 + p for p in range(4)]
    monkeypatch.setenv("TILESCALE_NODE_SIZE", "2")
    assert symm.get_remote_ptr(t, 0) == 0x90000
    with pytest.raises(TileScaleError, match=r"rank 2 is on node 1, rank 1 on node 0 \(TILESCALE_NODE_SIZE\): no "
                                             r"load/store path; use put/get"):
        symm.get_remote_ptr(t, 2)
    monkeypatch.setenv("TILESCALE_NODE_SIZE", "1")
    with pytest.raises(TileScaleError, match="rank 0 is on node 0, rank 1 on node 1"):
        symm.get_remote_ptr(t, 0)
    assert symm.get_remote_ptr(t, 1) == 0x90001


def test_the_runtime_shim_has_the_on_stream_get():
    """ts_getmem_on_stream: built into the shim (nvcc, against the installed NVSHMEM), source first."""
    from tilescale import runtime

    so = runtime._shim_path(discovery.find_nvshmem())
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], stdout=subprocess.PIPE, text=True).stdout
    assert re.search(r"\bT ts_getmem_on_stream\b", syms), syms
    import ctypes

    args, res = runtime._SIGS["ts_getmem_on_stream"]
    assert args == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p] and res is None
    src = runtime.SHIM_SOURCE.read_text()
    assert "void ts_getmem_on_stream(const void* src, void* dst, size_t n, int pe, void* stream)" in src
    assert "nvshmemx_getmem_on_stream(dst, src, n, pe, (cudaStream_t)stream);" in src
