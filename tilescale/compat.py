"""Every private or undocumented tilelang / TVM / torch API that tilescale uses, in one place.

tilescale builds on tilelang's public hooks (``tilelang.compile``, ``tilelang.register_cuda_postproc``,
``tilelang.language``) and, where those do not reach, on the internals below. Each is reached through one
function here, which imports it when first called (``import tilescale`` stays light), so an upstream release
that moves one breaks this file only; tests/test_compat.py imports every one and names what breaks when it
moves. ``UPSTREAM`` lists them with what tilescale needs each for.

Known but not yet routed here: ``tilescale/ops/capture.py`` and ``ops/base.py`` call
``torch._C._cuda_isCurrentStreamCapturing``, ``ops/prebuild.py``
``torch.distributed.distributed_c10d._get_default_store``, and ``ops/direct_launch.py`` reads tilelang's
generated host ``call(...)`` with a regex (see ``UPSTREAM``; the ops rewrite moves them here).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Upstream:
    """One private or undocumented upstream API: where it lives and what of tilescale needs it."""

    name: str        # dotted path in the upstream package
    used_by: str     # what of tilescale breaks when it moves


UPSTREAM: tuple[Upstream, ...] = (
    Upstream("tilelang.jit.JITImpl", "@tilescale.jit (subclassed: tilescale's compile step behind tilelang's "
                                     "decorator, its get_tir / signature / options fields)"),
    Upstream("tilelang.jit.ExecutionBackend", "the execution backends tilescale accepts (execution_backend=)"),
    Upstream("tilelang.language.eager.PrimFunc", "tilescale.compile / resolve_backend (what a kernel is)"),
    Upstream("tilelang.language.eager.prim_func", "@tilescale.jit (eager_jit=True, as tilelang.jit does)"),
    Upstream("tilelang.backend.target.determine_target", "the GPU-arch check before loading a kernel"),
    Upstream("tilelang.env.env.is_cache_enabled", "whether compiles of one kernel take turns (file lock)"),
    Upstream("tilelang.env.env.TILELANG_CACHE_DIR", "the private (0700) tilelang cache check"),
    Upstream("tilelang.cache.kernel_cache.KernelCache._get_cache_root", "the private tilelang cache check"),
    Upstream("tilelang.cache.kernel_cache.KernelCache._get_staging_root", "the private tilelang cache check"),
    Upstream("tilelang.cache.kernel_cache.KernelCache._get_base_key", "tilescale.build's cache key"),
    Upstream("tilelang.engine.lower.lower", "tilescale.build and lower_source (lowering without loading)"),
    Upstream("tilelang.jit.adapter.wrapper.TLWrapper", "tilescale.build (the host wrapper source)"),
    Upstream("tilelang.jit.adapter.libgen.LibraryGenerator", "tilescale.build (nvcc command, library)"),
    Upstream("JITKernel.adapter.lib", "a distributed kernel's module (NVSHMEM init, barrier, direct launch)"),
    Upstream("tvm global function tilelang_callback_cuda_postproc",
             "codegen.py chains a CUDA post-processor registered before tilescale's"),
    Upstream("tilelang.contrib.nvcc.get_nvcc_compiler", "the nvcc tilescale runs and puts in cache keys"),
    Upstream("tilelang.contrib.nvcc.get_cuda_library_dirs", "whether a stub libcuda is needed (GPU-less builds)"),
    Upstream("tvm.tirx.stmt_functor.post_order_visit", "finding the distributed calls of a kernel's IR"),
    Upstream("torch.distributed.distributed_c10d._get_default_store",
             "job-wide abort (diagnostics.py; ops/prebuild.py too)"),
    Upstream("torch._C._cuda_isCurrentStreamCapturing", "CUDA graph capture of the ops (ops/base.py, ops/capture.py)"),
    Upstream("torch._C._cuda_getCurrentRawStream", "the ops' fast current-stream read (Op.begin: ops/vectors.py "
                                                   "stream_getter, through raw_stream_query)"),
    Upstream("torch.cuda._lazy_init", "compile-only runs: CUDA's initialisation stops the run (compile_only.py)"),
    Upstream("torch.distributed.distributed_c10d._resolve_process_group",
             "which ranks a group_name holds (the async-TP drop-ins serve the whole world: pytorch/torch_ops.py)"),
    Upstream("torch.distributed._symmetric_memory", "registers torch.ops.symm_mem.* (the async-TP drop-ins' "
                                                    "fallback to torch's ops: pytorch/async_tp.py)"),
    Upstream("torch.distributed._symmetric_memory._fused_all_gather_matmul / _fused_matmul_reduce_scatter",
             "torch's own CUDA kernels of the symm_mem ops, which use_for_inductor_async_tp's kernels call for what "
             "tilescale does not serve (pytorch/inductor_async_tp.py)"),
    Upstream("torch.distributed._symmetric_memory.enable_symm_mem_for_group",
             "use_for_inductor_async_tp: Inductor's micro-pipeline TP pass fuses only the groups marked by it "
             "(deprecated in torch 2.14, still the pass's gate)"),
    Upstream("torch._inductor.config._micro_pipeline_tp", "use_for_inductor_async_tp turns the pass on (and back)"),
    Upstream("tilelang's generated host call(...) (regex)", "direct launch of ops (ops/direct_launch.py)"),
    Upstream("tilelang's warp specialisation: producer warps first, tl_shuffle_elect<n> for T.copy's TMA store",
             "GEMM+RS's count of a tile once its store is written (storing_warp)"),
)


# ---------------------------------------------------------------------------------------------- tilelang
def jit_impl_base() -> type:
    """tilelang's ``JITImpl`` (a dataclass), the base of ``TileScaleJITImpl``."""
    from tilelang.jit import JITImpl

    return JITImpl


def tilelang_execution_backends() -> tuple[str, ...]:
    """The ``execution_backend`` values tilelang accepts, "auto" first."""
    from tilelang.jit import ExecutionBackend

    return tuple(typing.get_args(ExecutionBackend))


def prim_func_class() -> type:
    """The class of tilelang's PrimFunc objects (eager module)."""
    from tilelang.language.eager import PrimFunc

    return PrimFunc


def eager_prim_func(func):
    """``func`` as tilelang's lazily elaborated PrimFunc, as ``tilelang.jit`` makes it."""
    from tilelang.language.eager import prim_func

    return prim_func(func, eager_jit=True)


def determine_target(target):
    """tilelang's resolution of a target spec to a TVM Target object."""
    from tilelang.backend.target import determine_target as _determine

    return _determine(target, return_object=True)


def tilelang_cache_enabled() -> bool:
    from tilelang import env as tl_env

    return bool(tl_env.is_cache_enabled())


def tilelang_cache_root() -> str:
    """TILELANG_CACHE_DIR as tilelang resolves it."""
    from tilelang import env as tl_env

    return str(tl_env.TILELANG_CACHE_DIR)


def tilelang_cache_dirs() -> tuple[str, str]:
    """(kernels, staging) directories of tilelang's kernel cache."""
    from tilelang.cache.kernel_cache import KernelCache

    return KernelCache._get_cache_root(), KernelCache._get_staging_root()


def tilelang_cache_base_key() -> dict:
    """tilelang's version and a hash of its native libraries (the base of its own cache key)."""
    from tilelang.cache.kernel_cache import KernelCache

    return KernelCache._get_base_key()


def lower(func, target):
    """tilelang's lowering of a PrimFunc (needs a PassContext and the target entered by the caller)."""
    from tilelang.engine.lower import lower as _lower

    return _lower(func, target=target)


def library_builders():
    """(TLWrapper, LibraryGenerator): tilelang's host-wrapper and nvcc-library builders."""
    from tilelang.jit.adapter.libgen import LibraryGenerator
    from tilelang.jit.adapter.wrapper import TLWrapper

    return TLWrapper, LibraryGenerator


def kernel_library(kernel):
    """The ctypes library of a kernel built by tilelang's cython backend."""
    return kernel.adapter.lib


def cuda_postproc_callback():
    """The CUDA post-processor registered with tilelang now (None if none): tilescale chains it."""
    from tilelang import tvm

    return tvm.get_global_func("tilelang_callback_cuda_postproc", allow_missing=True)


def nvcc_compiler() -> str:
    """The nvcc tilelang runs (CUDA_HOME/bin, then PATH)."""
    from tilelang.contrib.nvcc import get_nvcc_compiler

    return get_nvcc_compiler()


def cuda_library_dirs() -> list:
    from tilelang.contrib.nvcc import get_cuda_library_dirs

    return get_cuda_library_dirs()


def post_order_visit(stmt, visit) -> None:
    """TVM's post-order walk over a statement."""
    from tvm.tirx.stmt_functor import post_order_visit as _visit

    _visit(stmt, visit)


def storing_warp(threads: int) -> int:
    """The warp, among a block's `threads` consumer threads (0 = their first), whose elected lane issues the TMA
    store of ``T.copy(shared, global)`` in a warp-specialised GEMM: tilelang puts its producer warpgroup (4 warps)
    first and elects the first warp whose index in the block is a multiple of threads / 32
    (``tl_shuffle_elect<threads>``): warp 4 of 8 for 256 consumer threads, warp 0 of 4 for 128. Only that
    warp can wait for the store to be written (a thread waits for its own bulk stores), so it is the one to
    count the tile (``T.release_stores``, once per tile). Undocumented: tests/test_compat.py checks it on the
    generated code."""
    per = threads // 32
    return -(-4 // per) * per - 4


# ------------------------------------------------------------------------------------------------- torch
def default_store():
    """torch.distributed's store of the default process group (None before init)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def raw_stream_query():
    """torch's ``_cuda_getCurrentRawStream(device_index)``: the current CUDA stream of a device as a raw handle
    (an int), with no ``torch.cuda.Stream`` object made (the ops' per-call stream read); None where torch has
    none (the caller then reads ``torch.cuda.current_stream().cuda_stream``)."""
    import torch

    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def replace_torch_cuda_init(fn) -> None:
    """Have torch's lazy CUDA initialisation call `fn` instead: ``torch.cuda._lazy_init``, which every torch.cuda
    call that needs the driver runs first (from C++ too, looked up on the module when called)."""
    import torch.cuda

    torch.cuda._lazy_init = fn


def resolve_process_group(group_name: str):
    """The torch.distributed process group named `group_name` (raises for an unknown name)."""
    import torch.distributed as dist

    return dist.distributed_c10d._resolve_process_group(group_name)


def symm_mem_module():
    """``torch.distributed._symmetric_memory``, imported: importing it registers ``torch.ops.symm_mem.*``."""
    import importlib

    return importlib.import_module("torch.distributed._symmetric_memory")


def symm_mem_kernel(op: str):
    """torch's own implementation of ``torch.ops.symm_mem.<op>`` for CUDA tensors (``fused_all_gather_matmul`` or
    ``fused_matmul_reduce_scatter``): the Python function torch registers as the op's CUDA kernel, callable with the
    op's arguments without the dispatcher."""
    return getattr(symm_mem_module(), "_" + op)


def override_kernel(lib, op: str, device_type: str, fn) -> None:
    """Register `fn` in `lib` (a ``torch.library.Library(ns, "IMPL")``) as the kernel of ``<ns>::<op>`` for
    `device_type` ("cuda", "cpu"), in place of one torch registered from Python: torch's own symm_mem kernels are
    such (``Library.impl`` refuses to replace them unless ``allow_override``, whose default was False in torch 2.11
    and True in 2.14). The kernel lasts as long as `lib`; the dispatcher then runs the one before it again."""
    import inspect

    key = {"cuda": "CUDA", "cpu": "CPU"}.get(device_type, device_type)
    if "allow_override" in inspect.signature(lib.impl).parameters:
        lib.impl(op, fn, key, allow_override=True)
    else:
        lib.impl(op, fn, key)


def mark_group_for_symm_mem(group_name: str) -> None:
    """Mark `group_name` for symmetric memory (``is_symm_mem_enabled_for_group`` is then True: Inductor's
    micro-pipeline TP pass fuses its collectives); torch 2.14 deprecates the call (a FutureWarning, silenced here)
    but the pass still asks. Idempotent."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem_module().enable_symm_mem_for_group(group_name)


def set_micro_pipeline_tp(on: bool) -> bool:
    """Turn Inductor's micro-pipeline TP pass on or off (read when a graph compiles); returns the previous value."""
    import torch._inductor.config as inductor_config

    before = bool(inductor_config._micro_pipeline_tp)
    inductor_config._micro_pipeline_tp = on
    return before
