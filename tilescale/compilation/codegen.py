"""Source-level adjustments of distributed kernels, through tilelang's public CUDA post-processing hook
(``tilelang.register_cuda_postproc``). They apply only while tilescale builds a distributed kernel
(:func:`distributed_build`), and chain to a post-processor registered before tilescale's. The same hook tells
:func:`on_generate`'s listeners that a kernel is being built (not taken from a cache).

1. ``#include <tilescale/tilescale.cuh>`` at the top (NVSHMEM for the build mode, module init, ops), after
   ``#define TILESCALE_NVSHMEM_NO_COLLECTIVES`` in the inlined mode for a kernel that calls no NVSHMEM function but
   those tilescale's language emits: NVSHMEM's collective API is then left out of its build (module.cuh), about a
   third of nvcc's time; the device code is the same.
2. No ``__restrict__`` on kernel parameters: tilelang marks read-only parameters
   ``const T* __restrict__``, which lets nvcc read them with non-coherent loads (``ld.global.nc``); data
   a peer writes during the kernel would then be read stale after a wait.
3. Relocatable build modes only (``rdc``: :mod:`tilescale.build_modes`): relocatable device code loses
   the 1024-byte alignment of dynamic shared memory that swizzled TMA tiles need (misaligned-address
   faults on H200). ``buf_dyn_shmem`` is re-based at run time and the launch code asks for 1 KiB more
   (helpers in ``tilescale/module.cuh``).
"""
from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator

from .. import build_modes
from .discovery import find_nvshmem

INCLUDE_LINE = "#include <tilescale/tilescale.cuh>\n"
NO_COLLECTIVES_LINE = "#define TILESCALE_NVSHMEM_NO_COLLECTIVES\n"
# The NVSHMEM functions that tilescale's language emits into kernels (tilescale/language/distributed.py), none of them
# a collective; everything else it emits goes through tilescale/ops.cuh, whose needs module.cuh covers.
LANGUAGE_NVSHMEM_CALLS = frozenset({"nvshmem_my_pe", "nvshmem_n_pes", "nvshmem_fence", "nvshmem_quiet"})
_NVSHMEM_NAME = re.compile(r"\bnvshmem\w*")

_state = threading.local()
_lock = threading.Lock()
_installed = False
_previous = None

_DYN_SMEM = re.compile(r"extern __shared__ __align__\(1024\) (\w+) (\w+)\[\];")
_KERNEL_DECL = re.compile(r'^(extern "C" __global__ void[^\n]*)$', re.M)

RDC_LAUNCH_MACROS = """
// tilescale (RDC mode): launch with kDynSmemPad more bytes of dynamic shared memory (see module.cuh).
#define cudaFuncSetAttribute(f, a, v) ::tilescale::rdc_set_attr((const void*)(f), (a), (v))
#define cudaLaunchKernelEx(c, k, ...) ::tilescale::rdc_launch_ex((c), (k), __VA_ARGS__)
#define cudaLaunchCooperativeKernel(f, g, b, a, s, st) ::tilescale::rdc_launch_coop((f), (g), (b), (a), (s), (st))
"""


def calls_only_language_nvshmem(code: str) -> bool:
    """Whether kernel source `code` names no NVSHMEM function but those of :data:`LANGUAGE_NVSHMEM_CALLS` (a kernel
    that calls an NVSHMEM function itself, through T.call_extern, may call a collective)."""
    return all(name in LANGUAGE_NVSHMEM_CALLS for name in _NVSHMEM_NAME.findall(code))


def transform(code: str, build_mode: str, collectives_separable: bool = False) -> str:
    """The source of a distributed kernel, given tilelang's generated source. `collectives_separable`: the NVSHMEM
    in use can build a kernel without its collective API (discovery.NvshmemInstall.collectives_separable)."""
    if INCLUDE_LINE in code:
        return code
    relocatable = build_modes.get(build_mode).relocatable
    head = NO_COLLECTIVES_LINE if collectives_separable and not relocatable and calls_only_language_nvshmem(code) \
        else ""
    code = _KERNEL_DECL.sub(lambda m: m.group(1).replace(" __restrict__", ""), code)
    tail = ""
    if relocatable and _DYN_SMEM.search(code):
        # tilelang names the merged buffer `uchar buf_dyn_shmem[]`, a single one by its own name and type
        code = _DYN_SMEM.sub(lambda m: f"extern __shared__ __align__(1024) uchar tilescale_dyn_shmem_raw[];\n"
                                       f"  {m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>("
                                       "tilescale::align_dyn_smem(tilescale_dyn_shmem_raw));", code)
        tail = RDC_LAUNCH_MACROS
    return head + INCLUDE_LINE + device_code_for_device_pass(code) + tail


# tilelang's device-only headers: instructions, copies, reductions, barriers. Kernel bodies use them; the host
# wrapper and the kernels' signatures do not (their types come from common.h and the number-format headers, which
# stay visible to both passes, as does any header not named here).
_DEVICE_ONLY_HEADER = re.compile(
    r"^#include <tl_templates/cuda/(?:instruction/\w+|copy\w*|reduce|scan|ldsm|intrin|barrier|cluster|atomic|math|"
    r"threadblock_swizzle|debug|tcgen_05\w*|gemm\w*)\.h>$")
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|//.*$')
HOST_PASS_NOTE = "// tilescale: the host pass of nvcc sees the kernels' signatures only (codegen.py)"


def device_code_for_device_pass(code: str) -> str:
    """`code` (tilelang's device source) with what only the device needs hidden from nvcc's host pass
    (``__CUDA_ARCH__`` undefined): the device-only headers of tilelang and the kernel bodies; the host pass gets
    each kernel with an empty body, enough for the launch stubs it generates. nvcc's host pass (cudafe++, then the
    host compiler) otherwise parses every template of those headers and every kernel body a second time, about a
    third of a fused kernel's build. The device pass compiles the same code as before.

    Only for source of the shape tilelang generates: includes, then kernel declarations and definitions at the top
    level (each definition's braces balanced). Anything else at the top level (a helper function, a variable: the
    host pass may need it) leaves `code` unchanged."""
    lines = code.split("\n")
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
        i += 1
    head, body = lines[:i], lines[i:]
    stubs, depth = [], 0
    for ln in body:
        opens_at_top = depth == 0
        bare = _STRINGS.sub("", ln)
        depth += bare.count("{") - bare.count("}")
        if depth < 0:
            return code
        if not opens_at_top:
            continue
        if not ln.strip():
            continue
        if not ln.startswith('extern "C" __global__ void'):
            return code          # something of the top level that is not a kernel: leave it all visible
        if ln.rstrip().endswith(");") and depth == 0:
            stubs.append(ln)                                 # a declaration
        elif ln.rstrip().endswith("{") and depth == 1:
            stubs.append(ln.rstrip() + "}")                  # a definition: the signature, an empty body
        else:
            return code
    if depth != 0 or not any(s.endswith("{}") for s in stubs):
        return code
    guarded, hidden = [], False          # runs of device-only includes in one #if each
    for ln in head:
        device_only = bool(_DEVICE_ONLY_HEADER.match(ln.strip()))
        if device_only != hidden:
            guarded.append("#if defined(__CUDA_ARCH__)" if device_only else "#endif")
            hidden = device_only
        guarded.append(ln)
    if hidden:
        guarded.append("#endif")
    return "\n".join([*guarded, "#include <tl_templates/cuda/common.h>", "#if defined(__CUDA_ARCH__)", *body,
                      "#else", HOST_PASS_NOTE, *stubs, "#endif", ""])


def _postproc(code: str, target) -> str:
    listener = getattr(_state, "listener", None)
    if listener is not None:
        try:
            listener()
        except Exception:  # noqa: BLE001  (a progress display must not fail a build)
            pass
    if _previous is not None:
        code = _previous(code, target)
    mode = getattr(_state, "build_mode", None)
    if mode is None:
        return code
    return transform(code, mode, _collectives_separable())


def _collectives_separable() -> bool:
    try:
        return find_nvshmem().collectives_separable
    except Exception:  # noqa: BLE001  (no NVSHMEM: its build fails with that error elsewhere)
        return False


def install() -> None:
    """Register the post-processor once, chaining any that was registered before."""
    global _installed, _previous
    with _lock:
        if _installed:
            return
        import tilelang
        from tilelang import tvm

        prev = tvm.get_global_func("tilelang_callback_cuda_postproc", allow_missing=True)
        _previous = prev
        tilelang.register_cuda_postproc(_postproc, override=True)
        _installed = True


@contextlib.contextmanager
def _this_thread(name: str, value) -> Iterator[None]:
    """Within this block (this thread), the post-processor's state `name` is `value` (the hook installed first)."""
    install()
    prev = getattr(_state, name, None)
    setattr(_state, name, value)
    try:
        yield
    finally:
        setattr(_state, name, prev)


def distributed_build(build_mode: str):
    """Within this block (this thread), CUDA generated by tilelang is a distributed kernel's."""
    return _this_thread("build_mode", build_mode)


def on_generate(callback):
    """Within this block (this thread), `callback()` is called each time tilelang generates a kernel's CUDA, i.e.
    when a kernel is really being built rather than taken from a cache (tilescale.batch's progress line)."""
    return _this_thread("listener", callback)
