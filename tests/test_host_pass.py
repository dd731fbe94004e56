"""nvcc's host pass of a distributed kernel sees its kernels' signatures only (tilescale/compilation/codegen.py,
device_code_for_device_pass): tilelang's device-only headers and the kernel bodies are behind ``__CUDA_ARCH__``, so
the device pass compiles exactly tilelang's code and the host pass (cudafe++ and the host compiler) skips it.
Checked with the C preprocessor on the generated AG+GEMM source, both ways; the builds of the CPU tier compile
and link it."""
import re
import shutil
import subprocess

import pytest

from tilescale import codegen

SM90 = {"kind": "cuda", "arch": "sm_90a"}


def preprocess(src: str, device: bool) -> str:
    """`src` through the C preprocessor as nvcc's device pass (__CUDA_ARCH__ defined) or host pass sees it, its
    #include lines left out (they are checked apart)."""
    cpp = shutil.which("cpp") or pytest.skip("no C preprocessor")
    text = "\n".join(("// " + ln) if ln.lstrip().startswith("#include") else ln for ln in src.splitlines())
    args = [cpp, "-P", "-w", "-undef"] + (["-D__CUDA_ARCH__=900"] if device else [])
    r = subprocess.run(args, input=text, capture_output=True, text=True, check=True)
    return r.stdout


def includes(src: str, device: bool) -> list[str]:
    keep = "\n".join(ln if ln.lstrip().startswith("#") else "" for ln in src.splitlines())
    keep = keep.replace("#include", "INCLUDE")
    return re.findall(r"INCLUDE (<[^>]+>)", preprocess(keep, device))


def ag_gemm(guard: bool = True) -> str:
    from tilescale.compiler import lower_source
    from tilescale.ops.allgather_gemm import ag_gemm_kernel

    with pytest.MonkeyPatch.context() as mp:
        if not guard:
            mp.setattr(codegen, "device_code_for_device_pass", lambda code: code)
        return lower_source(ag_gemm_kernel.get_tir(512, 512, 4, 2, "float16"), target=SM90)


@pytest.fixture(scope="module")
def ag_gemm_source():
    return ag_gemm()


def test_host_pass_sees_signatures_and_device_pass_sees_tilelangs_code(ag_gemm_source):
    src = ag_gemm_source
    assert codegen.HOST_PASS_NOTE in src
    host, device = preprocess(src, False), preprocess(src, True)
    kernels = [ln for ln in src.splitlines() if ln.startswith('extern "C" __global__ void __launch_bounds__')
               and ln.endswith("{")]
    assert len(kernels) == 1
    assert kernels[0] + "}" in host                           # the launch stub's kernel: its signature, no body
    assert "wgmma" not in host and "tilescale::wait_until" not in host
    assert "wgmma" in device and "tilescale::wait_until" in device and codegen.HOST_PASS_NOTE not in device
    assert host.count("__global__") == 2 and device.count("__global__") == 2     # declaration and definition
    # the device pass compiles the same code as without the guard, includes apart (test_host_pass_includes_...)
    assert device == preprocess(ag_gemm(guard=False), True)
    common = "<tl_templates/cuda/common.h>"    # named for the host pass; the device pass had it from the others
    assert [h for h in includes(src, True) if h != common] == includes(ag_gemm(guard=False), True)


def test_host_pass_includes_the_types_only(ag_gemm_source):
    host, device = includes(ag_gemm_source, False), includes(ag_gemm_source, True)
    assert "<tilescale/tilescale.cuh>" in host and "<tl_templates/cuda/common.h>" in host
    assert not any("instruction" in h or "copy" in h or "reduce" in h for h in host), host
    assert {"<tl_templates/cuda/instruction/wgmma.h>", "<tl_templates/cuda/copy_sm90.h>"} <= set(device)
    assert set(host) < set(device)


@pytest.mark.parametrize("code", [
    '#include <a.h>\n__device__ int helper() { return 1; }\nextern "C" __global__ void k(int* p) {\n  p[0] = 1;\n}\n',
    '#include <a.h>\n__constant__ int table[4];\nextern "C" __global__ void k(int* p) {\n  p[0] = 1;\n}\n',
    '#include <a.h>\nextern "C" __global__ void k(int* p) {\n  p[0] = 1;\n',
])
def test_other_shapes_of_source_are_left_as_they_are(code):
    """A helper, a variable (the host pass may need them) or unbalanced braces: nothing is hidden."""
    assert codegen.device_code_for_device_pass(code) == code


def test_braces_in_strings_and_comments_do_not_count():
    code = ('#include <tl_templates/cuda/debug.h>\nextern "C" __global__ void k(int* p) {\n'
            '  printf("}}} %c", \'{\');  // }\n}\n')
    out = codegen.device_code_for_device_pass(code)
    assert 'extern "C" __global__ void k(int* p) {}' in preprocess(out, False)
    assert "#if defined(__CUDA_ARCH__)\n#include <tl_templates/cuda/debug.h>\n#endif" in out
