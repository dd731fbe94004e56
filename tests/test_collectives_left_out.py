"""A distributed kernel that calls no NVSHMEM collective is built without NVSHMEM's collective API (codegen.py,
tilescale/module.cuh): about half of nvcc's time per kernel. Checked here: which kernels are, that the NVSHMEM in use
has the header layout module.cuh relies on, and that the device code nvcc makes is the same either way (PTX of the
AG+GEMM kernel, debug lines aside) while the collective headers are really left out."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tilescale import codegen, discovery

REPO = Path(__file__).resolve().parent.parent
MODULE_CUH = REPO / "tilescale" / "include" / "tilescale" / "module.cuh"
SM90 = {"kind": "cuda", "arch": "sm_90a"}
KERNEL = 'extern "C" __global__ void k(int* p) {\n  p[0] = %s;\n}\n'


def test_kernels_calling_only_the_languages_nvshmem_functions_leave_the_collectives_out():
    code = KERNEL % "nvshmem_my_pe() + nvshmem_n_pes(); nvshmem_quiet(); nvshmem_fence(); tilescale::put<2, false>()"
    assert codegen.transform(code, "inlined", True).startswith(codegen.NO_COLLECTIVES_LINE + codegen.INCLUDE_LINE)


@pytest.mark.parametrize("code, mode, separable", [
    (KERNEL % "nvshmem_int_sum_reduce(0, p, p, 1)", "inlined", True),   # the kernel calls NVSHMEM itself
    (KERNEL % "nvshmemx_barrier_all_block(), 0", "inlined", True),
    (KERNEL % "nvshmem_my_pe()", "rdc", True),                           # relocatable: the whole API, as before
    (KERNEL % "nvshmem_my_pe()", "inlined", False),                      # an NVSHMEM of another header layout
])
def test_other_kernels_keep_nvshmems_whole_api(code, mode, separable):
    out = codegen.transform(code, mode, separable)
    assert codegen.NO_COLLECTIVES_LINE not in out and codegen.INCLUDE_LINE in out


def test_the_language_emits_only_the_listed_nvshmem_functions():
    """A new NVSHMEM call in the language must be listed (and be no collective), or kernels using it fail to build."""
    emitted = set()
    for f in (REPO / "tilescale" / "language").glob("*.py"):
        emitted |= set(re.findall(r"""["'](nvshmem\w*)["']""", f.read_text()))
    assert emitted and emitted <= codegen.LANGUAGE_NVSHMEM_CALLS, emitted - codegen.LANGUAGE_NVSHMEM_CALLS


def test_module_header_defines_the_guards_that_discovery_checks():
    text = MODULE_CUH.read_text()
    block = text.split("#if defined(TILESCALE_NVSHMEM_NO_COLLECTIVES)", 2)[1].split("#endif", 1)[0]
    assert set(re.findall(r"#define (\w+)", block)) == set(discovery.COLLECTIVE_GUARDS.values())


def _copy_headers(src: Path, dst: Path) -> Path:
    for name in [*discovery.COLLECTIVE_GUARDS, "non_abi/device/coll/barrier.cuh"]:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dst / name)
    return dst


@pytest.mark.parametrize("change", [
    ("device/nvshmemx_coll_defines.cuh", "_NVSHMEMX_COLL_DEFINES_CUH_", "_NVSHMEMX_COLL_DEFINES_H_"),   # guard renamed
    ("device/nvshmem_coll_defines.cuh", "nvshmemi_sync_threadgroup<", "nvshmemi_sync_algo<"),          # another body
    ("non_abi/device/coll/barrier.cuh", "nvshmemi_barrier_threadgroup(", "nvshmemi_barrier_group("),  # template gone
])
def test_only_the_known_header_layout_is_separable(tmp_path, clean_ts_env, change):
    inc = discovery.find_nvshmem().include_dir
    assert discovery._collectives_separable(_copy_headers(inc, tmp_path / "same"))
    changed = _copy_headers(inc, tmp_path / "changed")
    f = changed / change[0]
    assert change[1] in f.read_text()
    f.write_text(f.read_text().replace(change[1], change[2]))
    assert not discovery._collectives_separable(changed)
    (changed / change[0]).unlink()
    assert not discovery._collectives_separable(changed)


def _nvcc(args: list[str], cwd: Path) -> str:
    from tilescale.toolchain import nvcc_path

    r = subprocess.run([nvcc_path(), *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _code(ptx: str) -> list[str]:
    """PTX without debug information and with the file-specific part of internal names removed; also without the
    one-byte objects of libcu++ (cuda::std's customisation points), declared by whichever headers were read."""
    ptx = ptx.split(".section\t.debug_str", 1)[0]
    ptx = re.sub(r"(_INTERNAL_|__N__)[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}", r"\1", ptx)
    return [ln for ln in ptx.splitlines() if not ln.strip().startswith((".loc", ".file", "//"))
            and not re.match(r"\.global \.align 1 \.b8 _ZN\d+_INTERNAL_\w*cuda3std\w*\[1\];$", ln)]


def test_device_code_is_the_same_without_the_collectives(tmp_path, clean_ts_env):
    """The AG+GEMM kernel's library source as tilescale builds it, through nvcc's device pass with and without
    the define: the same PTX; and the preprocessed source without it reads no collective header."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    import tilescale
    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    if not discovery.find_nvshmem().collectives_separable:
        pytest.skip(f"NVSHMEM {discovery.find_nvshmem().version}: not the header layout module.cuh relies on")
    clean_ts_env.setenv("TILESCALE_CACHE_DIR", str(tmp_path / "cache"))
    r = tilescale.build(ag_gemm_kernel.get_tir(512, 512, 4, 2, "float16"), target=SM90)
    lib = Path(r.library).with_suffix(".cu").read_text()
    assert lib.startswith(codegen.NO_COLLECTIVES_LINE)
    (tmp_path / "lean.cu").write_text(lib)                                   # names of one length: see _code
    (tmp_path / "full.cu").write_text(lib[len(codegen.NO_COLLECTIVES_LINE):])
    flags = ["-std=c++20", "-w", "-lineinfo", "-arch=sm_90a", f"-I{CUTLASS_INCLUDE_DIR}", f"-I{TILELANG_TEMPLATE_PATH}",
             *[f for f in r.flags if f.startswith(("-I", "-D", "-diag"))]]
    for name in ("lean", "full"):
        _nvcc([*flags, "-ptx", f"{name}.cu", "-o", f"{name}.ptx"], tmp_path)
    lean, full = (_code((tmp_path / f"{n}.ptx").read_text()) for n in ("lean", "full"))
    assert any(".entry ag_gemm_kernel" in ln for ln in lean) and lean == full
    read = {n: _nvcc([*flags, "-E", f"{n}.cu"], tmp_path) for n in ("lean", "full")}
    assert "coll/reduce.cuh" not in read["lean"] and "coll/reduce.cuh" in read["full"]
