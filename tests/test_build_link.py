"""Building and linking distributed kernels for sm_90a on a machine without a GPU or libcuda:
the ring example in both build modes, and against an NVSHMEM named by NVSHMEM_HOME (the GPU machines'
3.4.5 when .ci/run unpacked it, else the installed wheel). Expected versions come from what is installed."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import tilescale
import tilescale.language as T
from tilescale import codegen, discovery

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "distributed"))
from example_ring_put import ring_put_kernel  # noqa: E402
from nvshmem_versions import extra_install  # noqa: E402

SM90 = {"kind": "cuda", "arch": "sm_90a"}


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


_CLEARED = ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM")


@pytest.fixture(scope="module")
def clean_env():
    with pytest.MonkeyPatch.context() as mp:
        for n in _CLEARED:
            mp.delenv(n, raising=False)
        discovery.clear_cache()
        yield mp
    discovery.clear_cache()


@pytest.fixture(scope="module")
def ring_tir():
    return ring_put_kernel.get_tir(64, 256, 4)


@tilescale.jit
def broken():
    """A distributed kernel whose source nvcc refuses (an undefined device function)."""
    @T.prim_func
    def main(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=32):
            T.put_block(A, B, dst_pe=1)
            T.evaluate(T.call_extern("handle", "tilescale::no_such_function"))

    return main


# The ring built against NVSHMEM_HOME, in a process of its own (the variable is process-wide: the other
# builds run beside it); prints what discovery found and what was built.
_HOME_BUILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tilescale
from tilescale import discovery
from example_ring_put import ring_put_kernel
nv = discovery.find_nvshmem()
r = tilescale.build(ring_put_kernel.get_tir(64, 256, 4), target={"kind": "cuda", "arch": "sm_90a"},
                    build_mode="inlined")
print("RESULT " + json.dumps(dict(source=nv.source, root=str(nv.root), version=nv.version, lib_dir=str(nv.lib_dir),
                                  flags=list(r.flags), library=r.library)))
"""


def _home_install() -> tuple[Path, str]:
    """The NVSHMEM_HOME to build against: the GPU machines' 3.4.5 when .ci/run unpacked it
    (TILESCALE_TEST_NVSHMEM_345), else the installed wheel's tree."""
    extra = extra_install()
    if extra is not None:
        return extra
    wheel = discovery.find_nvshmem()
    return wheel.root, wheel.version


def _build_in_process_with_home(home: Path, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(NVSHMEM_HOME=str(home), TMPDIR=str(workdir),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run([sys.executable, "-c", _HOME_BUILD, str(REPO / "examples" / "distributed")], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, cwd=str(REPO))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def builds(clean_env, workdir, ring_tir):
    """Every build of this module, side by side: the ring in both modes, the broken kernel, and the ring
    against NVSHMEM_HOME (in a subprocess)."""
    from build_pool import build_all

    home, _ = _home_install()
    broken_tir = broken.get_tir()
    return build_all({
        "inlined": lambda: tilescale.build(ring_tir, target=SM90, build_mode="inlined"),
        "rdc": lambda: tilescale.build(ring_tir, target=SM90, build_mode="rdc"),
        "broken": lambda: tilescale.build(broken_tir, target=SM90),
        "home": lambda: _build_in_process_with_home(home, workdir),
    }).wait()


@pytest.fixture(params=["inlined", "rdc"])
def ring_build(request, builds):
    return builds[request.param]


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
    assert f"-DTILESCALE_NVSHMEM={nv.version}" in flags
    assert "-DTILESCALE_WAIT_TIMEOUT_NS=" in flags
    assert "--threads=2" in r.flags        # nvcc's two preprocessors side by side (docs/compile-time.md)
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
    first = "" if ring_build.spec.build_mode == "rdc" else codegen.NO_COLLECTIVES_LINE   # collectives left out
    assert src.startswith(first + "#include <tilescale/tilescale.cuh>\n")
    assert "nvshmem_my_pe()" in src and "tilescale::put_signal<2>" in src and "tilescale::wait_until<" in src


def test_builds_against_nvshmem_home(builds):
    """NVSHMEM_HOME wins over the wheel, and a kernel builds and links against it: the NVSHMEM 3.4.5 of the
    GPU machines when .ci/run unpacked it (TILESCALE_TEST_NVSHMEM_345), else the installed wheel's tree."""
    home, version = _home_install()
    r = builds["home"]
    assert (r["source"], Path(r["root"]), r["version"]) == ("NVSHMEM_HOME", home, version)
    assert f"-DTILESCALE_NVSHMEM={version}" in r["flags"]
    dyn = _readelf_dynamic(r["library"])
    assert "[libnvshmem_host.so.3]" in dyn and f"[{r['lib_dir']}]" in dyn
    assert "tilescale_module_init" in _exported(r["library"])


def test_build_error_is_explained(builds, workdir):
    """An nvcc failure of a distributed kernel is a BuildError naming the kernel, mode and NVSHMEM."""
    with pytest.raises(tilescale.errors.BuildError) as ei:
        builds["broken"]
    msg = str(ei.value)
    assert "'main'" in msg and "inlined mode" in msg and f"NVSHMEM {discovery.find_nvshmem().version}" in msg
    assert isinstance(ei.value.__cause__, RuntimeError)       # tilelang's error, with the command, is chained
    # (nvcc's own diagnostics are not in the message: tilelang does not capture nvcc's output; reported)
    # no build of this module, the failed one included, left its temporaries in the temporary directory
    assert sorted(p.name for p in workdir.iterdir()) == []
