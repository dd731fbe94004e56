"""Building and linking distributed kernels for sm_90a on a machine without a GPU or libcuda:
the ring example in both build modes, and against the NVSHMEM 3.4.5 headers of the GPU machines."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import tilescale
from tilescale import discovery

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "distributed"))
from example_ring_put import ring_put_kernel  # noqa: E402

SM90 = {"kind": "cuda", "arch": "sm_90a"}
# NVSHMEM 3.4.5 (the GPU machines' version): .ci/run unpacks the wheel and sets TILESCALE_TEST_NVSHMEM_345.
NV345 = Path(os.environ.get("TILESCALE_TEST_NVSHMEM_345", "/tmp/nv345/nvidia/nvshmem"))


def _readelf_dynamic(lib: str) -> str:
    return subprocess.run(["readelf", "-d", lib], stdout=subprocess.PIPE, text=True, check=True).stdout


def _nm(lib: str, *opts: str) -> str:
    return subprocess.run(["nm", *opts, lib], stdout=subprocess.PIPE, text=True, check=True).stdout


def _exported(lib: str) -> set[str]:
    out = set()
    for line in _nm(lib, "-D", "--defined-only").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWw":
            out.add(parts[2])
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Build products (tilelang writes them to the temp dir) go to a private folder."""
    d = tmp_path_factory.mktemp("builds")
    old = tempfile.tempdir
    tempfile.tempdir = str(d)
    yield d
    tempfile.tempdir = old


@pytest.fixture(scope="module")
def clean_env():
    with pytest.MonkeyPatch.context() as mp:
        for n in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM"):
            mp.delenv(n, raising=False)
        discovery.clear_cache()
        yield mp
    discovery.clear_cache()


@pytest.fixture(scope="module")
def ring_tir():
    return ring_put_kernel.get_tir(64, 256, 4)


@pytest.fixture(scope="module", params=["inlined", "rdc"])
def ring_build(request, clean_env, workdir, ring_tir):
    return tilescale.build(ring_tir, target=SM90, build_mode=request.param)


def test_ring_builds_and_links(ring_build):
    r = ring_build
    mode = r.spec.build_mode
    assert r.spec.distributed and r.spec.name == "cython"
    lib = Path(r.library)
    assert lib.is_file() and lib.stat().st_size > 0 and lib.suffix == ".so"
    dyn = _readelf_dynamic(r.library)
    assert "NEEDED" in dyn and "[libnvshmem_host.so.3]" in dyn
    assert "libcuda" not in dyn, "the stub libcuda must not become a run-time dependency"
    nv = discovery.find_nvshmem()
    assert f"[{nv.lib_dir}]" in dyn, "RUNPATH must point at the NVSHMEM that was linked"
    exported = _exported(r.library)
    for sym in ("tilescale_module_init", "tilescale_module_finalize", "tilescale_module_mode",
                "tilescale_module_nvshmem_version", "call", "init"):
        assert sym in exported, f"{sym} not exported by the {mode} module"
    flags = " ".join(r.flags)
    assert "-DTILESCALE_NVSHMEM=3.8.0" in flags
    assert "-DTILESCALE_WAIT_TIMEOUT_NS=" in flags
    if mode == "rdc":
        assert "-rdc=true" in r.flags and "-lnvshmem_device" in r.flags
        assert "-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING" not in r.flags
        # the device library is linked in, and kept private to the module
        assert "nvshmemi_init_thread" in _nm(r.library)
        leaked = [s for s in exported if s.startswith(("nvshmem", "_Z")) and "nvshmem" in s]
        assert not leaked, f"libnvshmem_device symbols exported by the module: {leaked[:5]}"
    else:
        assert "-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING" in r.flags and "-rdc=true" not in r.flags
        assert "nvshmemi_init_thread" not in _nm(r.library)


def test_ring_source(ring_build):
    src = ring_build.source
    assert src.startswith("#include <tilescale/tilescale.cuh>\n")
    assert "nvshmem_my_pe()" in src and "tilescale::put_signal<2>" in src and "tilescale::wait_until<" in src


def test_builds_against_nvshmem_345(clean_env, workdir, ring_tir):
    if not (NV345 / "include" / "nvshmem.h").is_file():
        pytest.skip(f"NVSHMEM 3.4.5 not unpacked at {NV345} (set TILESCALE_TEST_NVSHMEM_345; .ci/run does)")
    clean_env.setenv("NVSHMEM_HOME", str(NV345))
    discovery.clear_cache()
    try:
        nv = discovery.find_nvshmem()
        assert (nv.source, nv.version) == ("NVSHMEM_HOME", "3.4.5")
        r = tilescale.build(ring_tir, target=SM90, build_mode="inlined")
        assert "-DTILESCALE_NVSHMEM=3.4.5" in r.flags
        dyn = _readelf_dynamic(r.library)
        assert "[libnvshmem_host.so.3]" in dyn and f"[{nv.lib_dir}]" in dyn
        assert "tilescale_module_init" in _exported(r.library)
    finally:
        clean_env.delenv("NVSHMEM_HOME")
        discovery.clear_cache()


def test_build_error_is_explained(clean_env, workdir):
    """An nvcc failure of a distributed kernel is a BuildError naming the kernel, mode and NVSHMEM."""
    import tilescale.language as T

    @tilescale.jit
    def broken():
        @T.prim_func
        def main(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=32):
                T.put_block(A, B, dst_pe=1)
                T.evaluate(T.call_extern("handle", "tilescale::no_such_function"))

        return main

    with pytest.raises(tilescale.errors.BuildError) as ei:
        tilescale.build(broken.get_tir(), target=SM90)
    msg = str(ei.value)
    assert "'main'" in msg and "inlined mode" in msg and "NVSHMEM 3.8.0" in msg
    assert isinstance(ei.value.__cause__, RuntimeError)       # tilelang's error, with the command, is chained
    # (nvcc's own diagnostics are not in the message: tilelang does not capture nvcc's output; reported)
