"""Every private or undocumented upstream API tilescale uses is reached through tilescale/compat.py, and is
still where tilescale expects it: when tilelang, TVM or torch moves one, the failing probe below names it
and what of tilescale breaks (compat.UPSTREAM)."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tilescale import compat

PACKAGE = Path(compat.__file__).resolve().parent


def _jit_impl():
    base = compat.jit_impl_base()
    import dataclasses

    fields = {f.name for f in dataclasses.fields(base)}
    assert {"func", "out_idx", "execution_backend", "target", "target_host", "verbose", "pass_configs",
            "debug_root_path", "compile_flags", "func_source", "signature", "mode"} <= fields, fields
    assert callable(getattr(base, "get_tir", None))


def _execution_backends():
    assert compat.tilelang_execution_backends()[:3] == ("auto", "tvm_ffi", "cython")


def _prim_func_class():
    assert isinstance(compat.prim_func_class(), type)


def _eager_prim_func():
    import tilescale.language as T

    def k(n: int):
        @T.prim_func
        def main(a: T.Tensor((n,), "float32")):
            with T.Kernel(1, threads=32):
                a[0] = 1.0

        return main

    pf = compat.eager_prim_func(k)
    assert pf.orig_func is k


def _determine_target():
    t = compat.determine_target({"kind": "cuda", "arch": "sm_90a"})
    assert t.kind.name == "cuda" and str(t.attrs["arch"]) == "sm_90a"


def _cache_enabled():
    assert isinstance(compat.tilelang_cache_enabled(), bool)


def _cache_root():
    assert compat.tilelang_cache_root()


def _cache_dirs(which):
    def probe():
        kernels, staging = compat.tilelang_cache_dirs()
        assert {"kernels": kernels, "staging": staging}[which]

    return probe


def _base_key():
    key = compat.tilelang_cache_base_key()
    assert isinstance(key, dict) and key


def _lower():
    from tilelang.engine.lower import lower

    assert compat.lower.__module__ == "tilescale.compat"
    assert "target" in inspect.signature(lower).parameters


def _library_builders():
    wrapper, generator = compat.library_builders()
    for name in ("assign_optimized_module", "assign_pass_configs", "assign_host_module", "assign_device_module",
                 "wrap"):
        assert callable(getattr(wrapper, name, None)), name
    for name in ("assign_pass_configs", "assign_compile_flags", "update_lib_code", "compile_lib"):
        assert callable(getattr(generator, name, None)), name


def _kernel_library():
    class Adapter:
        lib = object()

    class Kernel:
        adapter = Adapter()

    assert compat.kernel_library(Kernel()) is Adapter.lib
    from tilelang.jit.adapter.cython.adapter import CythonKernelAdapter

    assert "lib" in inspect.getsource(CythonKernelAdapter)


def _postproc_callback():
    compat.cuda_postproc_callback()   # None or a function: it must be askable


def _nvcc_compiler():
    from tilelang.contrib.nvcc import get_nvcc_compiler

    assert callable(get_nvcc_compiler)


def _cuda_library_dirs():
    assert isinstance(compat.cuda_library_dirs(), (list, tuple))


def _post_order_visit():
    from tilelang import tvm

    seen = []
    compat.post_order_visit(tvm.tirx.Evaluate(tvm.tirx.const(1, "int32")), seen.append)
    assert seen


def _default_store():
    import torch.distributed.distributed_c10d as c10d

    assert callable(c10d._get_default_store)   # (it raises without a process group: callers catch that)


def _torch_private(name):
    def probe():
        import torch

        assert callable(getattr(torch._C, name, None)), name

    return probe


def _host_call_regex():
    """tilelang's host wrapper of a kernel (lowered and wrapped as tilescale.build does, no nvcc) still has the
    ``int call(...)`` entry point that ops/direct_launch.py reads."""
    from tilelang import tvm
    from tvm.target import Target

    import tilescale.language as T
    from tilescale.ops.direct_launch import call_signature

    @T.prim_func
    def scale(a: T.Tensor((128,), "float32"), b: T.Tensor((128,), "float32")):
        with T.Kernel(1, threads=128) as _:
            for i in T.Parallel(128):
                b[i] = a[i] * 2.0

    tgt = Target({"kind": "cuda", "arch": "sm_90a"}, "c")
    with tvm.transform.PassContext(opt_level=3), tgt:
        art = compat.lower(scale, tgt)
    wrapper_class, _ = compat.library_builders()
    w = wrapper_class(tgt)
    w.assign_optimized_module(tvm.IRModule({"main": scale}))
    w.assign_pass_configs({})
    w.assign_host_module(art.host_mod)
    w.assign_device_module(art.device_mod)
    sig = call_signature(w.wrap(art.kernel_source))
    assert sig is not None and [n for _, n in sig][-1] == "stream", sig


def _storing_warp():
    """A warp-specialised tile loop with a T.copy TMA store, lowered for 256 and 128 consumer threads: the producer
    warpgroup comes first and the store is issued under tl_shuffle_elect<threads>, which elects a lane of the one
    consumer warp compat.storing_warp names (tilelang's intrinsic: warps whose index is a multiple of threads / 32)."""
    import re

    import tilelang.language as T
    from tilelang import tvm
    from tvm.target import Target

    def tile(threads):
        @T.prim_func
        def k(A: T.Tensor((128, 256), "bfloat16"), B: T.Tensor((256, 256), "bfloat16"),
              C: T.Tensor((128, 256), "bfloat16")):
            with T.Kernel(1, 1, threads=threads) as (bx, by):
                As = T.alloc_shared((128, 64), "bfloat16")
                Bs = T.alloc_shared((64, 256), "bfloat16")
                Cl = T.alloc_fragment((128, 256), "float32")
                Cs = T.alloc_shared((128, 256), "bfloat16")
                T.clear(Cl)
                for ko in T.Pipelined(4, num_stages=2):
                    T.copy(A[0, ko * 64], As)
                    T.copy(B[ko * 64, 0], Bs)
                    T.gemm(As, Bs, Cl)
                T.copy(Cl, Cs)
                T.copy(Cs, C[0, 0])
        return k

    tgt = Target({"kind": "cuda", "arch": "sm_90a"})
    intrin = Path(__import__("tilelang").__file__).parent / "src" / "tl_templates" / "cuda" / "intrin.h"
    assert "(cutlass::canonical_warp_idx() % warp_extent) == 0" in intrin.read_text()
    for threads in (256, 128):
        with tvm.transform.PassContext(opt_level=3), tgt:
            src = compat.lower(tile(threads), tgt).kernel_source
        assert "if (((int)threadIdx.x) < 128) {" in src                 # the producer warpgroup: warps 0-3
        store = src.index("tl::tma_store(")
        assert re.findall(r"tl::tl_shuffle_elect<(\d+)>\(\)", src[:store])[-1] == str(threads)
        per = threads // 32
        elected = [w for w in range(4, 4 + per) if w % per == 0]          # the consumer warps that qualify
        assert elected == [4 + compat.storing_warp(threads)], (threads, elected)


def _lazy_init():
    """torch.cuda._lazy_init is what a CUDA tensor's creation calls, found on the module at call time."""
    import subprocess
    import sys

    code = ("import torch; from tilescale import compat\n"
            "def stop(): raise KeyboardInterrupt('init')\n"
            "compat.replace_torch_cuda_init(stop)\n"
            "try:\n    torch.empty(1, device='cuda')\nexcept KeyboardInterrupt:\n    print('REPLACED')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REPLACED" in r.stdout, r.stdout + r.stderr


def _resolve_process_group():
    import torch.distributed.distributed_c10d as c10d

    assert callable(c10d._resolve_process_group)   # (it raises for an unknown name: the caller catches that)


# torch.ops.symm_mem's schemas, which the async-TP drop-ins (tilescale/pytorch/async_tp.py) take as they are
SYMM_MEM_SCHEMAS = {
    "fused_all_gather_matmul": "symm_mem::fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, "
                               "str group_name, *, bool return_A=True) -> (Tensor?, Tensor[])",
    "fused_matmul_reduce_scatter": "symm_mem::fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, "
                                   "int scatter_dim, str group_name) -> Tensor",
}


def _symm_mem_ops():
    import torch

    compat.symm_mem_module()
    for op, schema in SYMM_MEM_SCHEMAS.items():
        assert str(getattr(torch.ops.symm_mem, op).default._schema) == schema


def _symm_mem_kernels():
    """The functions compat.symm_mem_kernel returns are the ops' CUDA kernels (registered from their module), and
    take the ops' arguments (in order; the keyword-only ones by name)."""
    import inspect as _inspect

    import torch

    for op in SYMM_MEM_SCHEMAS:
        fn = compat.symm_mem_kernel(op)
        table = torch._C._dispatch_dump_table(f"symm_mem::{op}")
        assert f"CUDA: registered at {compat.symm_mem_module().__file__}:" in table, table
        schema = getattr(torch.ops.symm_mem, op).default._schema
        params = _inspect.signature(fn).parameters.values()      # called positionally, but for keyword-only ones
        assert len(params) == len(schema.arguments), op
        assert [p.name for p in params if p.kind == p.KEYWORD_ONLY] == [a.name for a in schema.arguments
                                                                          if a.kwarg_only], op


def _mark_group_for_symm_mem():
    mod = compat.symm_mem_module()
    assert callable(mod.enable_symm_mem_for_group) and callable(mod.is_symm_mem_enabled_for_group)


def _micro_pipeline_tp():
    import torch._inductor.config as inductor_config

    before = inductor_config._micro_pipeline_tp
    try:
        assert compat.set_micro_pipeline_tp(True) == before and inductor_config._micro_pipeline_tp is True
        assert compat.set_micro_pipeline_tp(before) is True
    finally:
        inductor_config._micro_pipeline_tp = before


PROBES = {
    "tilelang.jit.JITImpl": _jit_impl,
    "tilelang.jit.ExecutionBackend": _execution_backends,
    "tilelang.language.eager.PrimFunc": _prim_func_class,
    "tilelang.language.eager.prim_func": _eager_prim_func,
    "tilelang.backend.target.determine_target": _determine_target,
    "tilelang.env.env.is_cache_enabled": _cache_enabled,
    "tilelang.env.env.TILELANG_CACHE_DIR": _cache_root,
    "tilelang.cache.kernel_cache.KernelCache._get_cache_root": _cache_dirs("kernels"),
    "tilelang.cache.kernel_cache.KernelCache._get_staging_root": _cache_dirs("staging"),
    "tilelang.cache.kernel_cache.KernelCache._get_base_key": _base_key,
    "tilelang.engine.lower.lower": _lower,
    "tilelang.jit.adapter.wrapper.TLWrapper": _library_builders,
    "tilelang.jit.adapter.libgen.LibraryGenerator": _library_builders,
    "JITKernel.adapter.lib": _kernel_library,
    "tvm global function tilelang_callback_cuda_postproc": _postproc_callback,
    "tilelang.contrib.nvcc.get_nvcc_compiler": _nvcc_compiler,
    "tilelang.contrib.nvcc.get_cuda_library_dirs": _cuda_library_dirs,
    "tvm.tirx.stmt_functor.post_order_visit": _post_order_visit,
    "torch.distributed.distributed_c10d._get_default_store": _default_store,
    "torch._C._cuda_isCurrentStreamCapturing": _torch_private("_cuda_isCurrentStreamCapturing"),
    "torch._C._cuda_getCurrentRawStream": _torch_private("_cuda_getCurrentRawStream"),
    "torch.cuda._lazy_init": _lazy_init,
    "torch.distributed.distributed_c10d._resolve_process_group": _resolve_process_group,
    "torch.distributed._symmetric_memory": _symm_mem_ops,
    "torch.distributed._symmetric_memory._fused_all_gather_matmul / _fused_matmul_reduce_scatter": _symm_mem_kernels,
    "torch.distributed._symmetric_memory.enable_symm_mem_for_group": _mark_group_for_symm_mem,
    "torch._inductor.config._micro_pipeline_tp": _micro_pipeline_tp,
    "tilelang's generated host call(...) (regex)": _host_call_regex,
    "tilelang's warp specialisation: producer warps first, tl_shuffle_elect<n> for T.copy's TMA store": _storing_warp,
}


def test_raw_stream_query_is_torchs_and_the_ops_stream_getter_uses_it(monkeypatch):
    import torch

    from tilescale.ops import vectors

    assert compat.raw_stream_query() is torch._C._cuda_getCurrentRawStream
    seen = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: seen.append(dev) or 0x5100 + dev)
    get = vectors.stream_getter(3)      # the handle Op.begin returns (AG+GEMM's stream 0)
    assert get() == 0x5103 and seen == [3]


def test_every_upstream_api_has_a_probe():
    assert {u.name for u in compat.UPSTREAM} == set(PROBES)


@pytest.mark.parametrize("api", compat.UPSTREAM, ids=[u.name for u in compat.UPSTREAM])
def test_upstream_api_is_where_tilescale_expects_it(api):
    try:
        PROBES[api.name]()
    except Exception as e:  # noqa: BLE001  (whatever the upstream change raises)
        pytest.fail(f"{api.name} moved or changed ({type(e).__name__}: {e}); this breaks: {api.used_by}. "
                    "Adapt tilescale/compat.py")


# Imports of upstream internals: only compat.py may have them. (ops/ still reaches three torch internals by
# attribute, listed in compat's docstring; the ops rewrite routes them here.)
PRIVATE_MODULES = re.compile(r"^(tilelang\.(jit\.adapter|engine|cache|backend|language\.eager|contrib|env)"
                             r"|tvm\.tirx\.stmt_functor|torch\._C|torch\.distributed\.distributed_c10d)(\.|$)")
PRIVATE_NAMES = {"JITImpl", "KernelCache", "LibraryGenerator", "TLWrapper", "_get_default_store"}


def test_only_compat_imports_upstream_internals():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "compat.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mod, names = node.module, {a.name for a in node.names}
                if PRIVATE_MODULES.match(mod) or names & PRIVATE_NAMES or \
                        (mod == "tilelang" and "env" in names):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: from {mod} import ...")
            elif isinstance(node, ast.Import):
                bad += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: import {a.name}" for a in node.names
                        if PRIVATE_MODULES.match(a.name)]
    assert not bad, "upstream internals imported outside tilescale/compat.py:\n" + "\n".join(bad)
