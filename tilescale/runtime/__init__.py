"""The distributed runtime: torch.distributed + NVSHMEM, bootstrapped by a unique id that rank 0
creates and torch.distributed broadcasts.

    import tilescale
    info = tilescale.init_distributed()     # under torchrun / launch.sh
    info.rank, info.world_size, info.local_rank
    ...
    tilescale.finalize()                    # also runs at exit

Control traffic (the unique id, agreement checks of collective calls) goes over a gloo group, so a
GPU that is stuck cannot block it.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import compat, shm_leftovers
from ..compilation import toolchain
from ..compilation.cache_files import build_once, private_dir
from ..compilation.kernel_build import compile_kernel, func_name
from ..compilation.nvshmem_host import load_host_library
from ..env import MAX_SECONDS, check_node_size, settings
from ..errors import (
    AlreadyInitializedError,
    NotInitializedError,
    SymmetricMismatchError,
    TileScaleError,
    WaitTimeoutError,
)
from . import diagnostics, heap, nvshmem_start
from .mpg_lock import HostLock, first_on_host
from .placement import device_map, env_int, process_group_args  # noqa: F401  (runtime.device_map, ...)

log = logging.getLogger("tilescale")

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "ts_runtime.cu"


@dataclass(frozen=True)
class DistInfo:
    """What init_distributed() returns."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: int = 0            # this rank's CUDA device index
    shared_gpu: bool = False   # some GPU of this node runs more than one rank (TILESCALE_RANKS_PER_GPU)
    node_devices: tuple[int, ...] = ()   # the CUDA device of each local rank of this node (device_map)

    def same_gpu(self, rank: int) -> bool:
        """Whether `rank` runs on this rank's GPU (itself, or a rank sharing it: the shared-GPU mode). A copy
        between two ranks of one GPU is work of that GPU's SMs, not of a copy engine."""
        L = self.local_world_size
        if rank == self.rank:
            return True
        if not self.node_devices or rank // L != self.rank // L:
            return False
        return self.node_devices[rank % L] == self.device


def _shim_path(install) -> Path:
    """The runtime shim for `install`, built once into TILESCALE_CACHE_DIR/runtime (a private directory:
    build_once refuses one that others could write, since the shim is loaded RTLD_GLOBAL)."""
    tag = f"{install.version}-{toolchain.file_digest(SHIM_SOURCE, install.host_library)}"
    target = private_dir(settings.cache_dir / "runtime" / tag) / "libts_runtime.so"

    def build(tmp: Path) -> None:
        toolchain.run_nvcc(["-std=c++17", "--shared", "-Xcompiler", "-fPIC", f"-I{install.include_dir}",
                            str(SHIM_SOURCE), f"-L{install.lib_dir}", install.host_library_link_flag,
                            f"-Xlinker=-rpath,{install.lib_dir}", "-o", str(tmp)], "the tilescale runtime shim")

    return build_once(target, build)


_SIGS = {
    "ts_version": ([], ctypes.c_int), "ts_uid_size": ([], ctypes.c_int),
    "ts_get_uid": ([ctypes.c_void_p], ctypes.c_int),
    "ts_init_uid": ([ctypes.c_int, ctypes.c_int, ctypes.c_void_p], ctypes.c_int),
    "ts_init_status": ([], ctypes.c_int), "ts_my_pe": ([], ctypes.c_int), "ts_n_pes": ([], ctypes.c_int),
    "ts_team_node_size": ([], ctypes.c_int),
    "ts_malloc": ([ctypes.c_size_t], ctypes.c_void_p), "ts_free": ([ctypes.c_void_p], None),
    "ts_malloc_zeroed": ([ctypes.c_size_t], ctypes.c_void_p), "ts_barrier_all": ([], None),
    "ts_ptr": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_void_p),
    "ts_getmem_on_stream": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p], None),
    "ts_barrier_all_on_stream": ([ctypes.c_void_p], None), "ts_quiet_on_stream": ([ctypes.c_void_p], None),
    "ts_signal_add_on_stream": ([ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p], None),
    "ts_stream_write_u64": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong], ctypes.c_int),
    # a stream wait, and its slot of tilescale/runtime/stream_waits.py (None: not watched)
    "ts_stream_wait_geq_u64": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p], ctypes.c_int),
    "ts_watch_failures": ([], ctypes.c_ulonglong),
    # a program of stream operations (tilescale/ops/stream_ops.py): streams, ops, count, &failed (raw addresses)
    "ts_stream_ops": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p], ctypes.c_int),
    # the profiler's timed calls (tilescale/profiler/session.py ShimCalls): the op's ts_timed_fn and the two arguments
    # of its C entry point that change per call, as c_void_p (ctypes' cheapest conversion; word-sized integers in C)
    "ts_timed_call": ([ctypes.c_void_p] * 3, ctypes.c_int),
    "ts_timed_group": ([ctypes.c_longlong], None), "ts_timed_reset": ([], None),
    "ts_timed_take": ([ctypes.c_void_p, ctypes.c_longlong], ctypes.c_longlong),
    "ts_finalize": ([], None),
}


def load_shim(install) -> ctypes.CDLL:
    load_host_library(install)
    lib = ctypes.CDLL(str(_shim_path(install)), mode=ctypes.RTLD_GLOBAL)
    for name, (args, res) in _SIGS.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


_GENERATION = 0


class Runtime:
    """Process-wide state after init_distributed()."""

    def __init__(self, info: DistInfo, install, shim, ctrl_group, created_pg: bool, generation: int):
        import torch

        self.info = info
        self.install = install
        self.shim = shim
        self.ctrl_group = ctrl_group
        self.created_pg = created_pg
        self.device = torch.device("cuda", info.device)
        # the same on every rank (each starts as often): the runtime's keys in the job's store (failures, finalize)
        self.generation = generation
        # Record written by a device-side wait that times out: pinned host memory is addressable from
        # the GPU (UVA) and stays readable after the kernel traps.
        self.wait_diag = torch.zeros(128, dtype=torch.uint8, pin_memory=True)
        self.watchdog = None
        self.modules: dict[int, ctypes.CDLL] = {}   # id(ctypes lib) -> the module, once initialised
        self.module_names: dict[int, str] = {}      # id(ctypes lib) -> the kernel it was initialised for
        self.closed = False
        self.mpg_lock_holder = False   # holds tilescale.mpg_lock's host lock while NVSHMEM starts / stops
        self.init_timeout_s = 300.0    # init_distributed's timeout_s: also finalize's bound on the host lock
        # world_size + 1 symmetric words behind every barrier of tilescale (ops.cuh: barrier_one_thread)
        self.barrier_words = shim.ts_malloc_zeroed(8 * (info.world_size + 1)) if shim is not None else None
        self._barrier_fn = None

    # ---------------------------------------------------------------- collectives of the control plane
    def all_gather_object(self, obj) -> list:
        import torch.distributed as dist

        out = [None] * self.info.world_size
        dist.all_gather_object(out, obj, group=self.ctrl_group)
        return out

    def agree(self, what: str, value) -> None:
        """Raise SymmetricMismatchError on every rank unless every rank passed an equal `value`."""
        vals = self.all_gather_object(value)
        if any(v != vals[0] for v in vals):
            lines = "\n".join(f"  rank {r}: {v}" for r, v in enumerate(vals))
            raise SymmetricMismatchError(f"{what}: ranks disagree (every rank must make the same call):\n{lines}")

    def barrier(self, stream=None) -> None:
        """Barrier of all ranks, ordered on `stream` (default: the current stream): every rank's puts issued
        before it are complete, then every rank has arrived. Bounded like every device wait
        (TILESCALE_WAIT_TIMEOUT_S): a rank that never arrives stops it with a record naming the barrier."""
        import torch

        diagnostics.check(self)
        s = stream if stream is not None else torch.cuda.current_stream()
        if self._barrier_fn is None:
            self._barrier_fn = _barrier_function(self)
        rc = self._barrier_fn(ctypes.c_void_p(s.cuda_stream), 1)
        if rc != 0:
            raise TileScaleError(f"tilescale.barrier(): launching the barrier kernel failed (CUDA error {rc})")


def _barrier_function(rt: Runtime):
    """`tilescale_module_barrier` of the barrier module (tilescale/barrier_kernel.py), built once (tilelang's
    kernel cache) and initialised for this runtime."""
    from .barrier_kernel import barrier_module  # (tilelang: imported at the first barrier)

    func = barrier_module(rt.info.world_size)
    kernel, _ = compile_kernel(func)
    lib = compat.kernel_library(kernel)
    init_module(lib, func_name(func))
    fn = lib.tilescale_module_barrier
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_RT: Runtime | None = None
_init_lock = threading.Lock()
_at_finalize: list[Callable[[], None]] = []
_mpg_lock = HostLock()   # held by the lowest rank of each host while NVSHMEM starts or stops (shared-GPU mode)


def is_initialized() -> bool:
    return _RT is not None and not _RT.closed


def current() -> Runtime:
    if _RT is None or _RT.closed:
        if settings.compile_only:   # a script's compile-only run (tilescale/compile_only.py) has no runtime
            from ..compilation.compile_only import NeedsGpu

            raise NeedsGpu("the tilescale runtime (tilescale.ops, symmetric memory of peers)")
        raise NotInitializedError("the tilescale distributed runtime is not initialised: call "
                                  "tilescale.init_distributed() first (under torchrun or launch.sh)")
    return _RT


def init_distributed(*, timeout_s: float = 300.0) -> DistInfo:
    """Start torch.distributed (if not started) and NVSHMEM on every rank; set this rank's CUDA device.

    Collective: every rank of the job calls it once. Returns (rank, world_size, local_rank, ...).
    """
    global _RT
    # before anything starts: nan never passes a deadline, inf overflows the process group's timedelta
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_SECONDS):
        raise TileScaleError(f"tilescale.init_distributed(timeout_s={timeout_s!r}): expected a number of seconds "
                             f"above 0 and at most {MAX_SECONDS:.0f} (a week)")
    if settings.compile_only:   # rank 0's answer, nothing started (tilescale/compile_only.py)
        from ..compilation.compile_only import rank_zero

        return DistInfo(**rank_zero())
    with _init_lock:
        if _RT is not None and not _RT.closed:
            raise AlreadyInitializedError("tilescale.init_distributed() was already called in this process; "
                                          "call it once (tilescale.is_initialized() tells)")
        import datetime

        import torch
        import torch.distributed as dist

        from .. import logs
        from ..compilation.discovery import find_nvshmem

        logs.apply()
        # CUDA lazy loading deadlocks a kernel that spins on a signal while the kernel that sets it is
        # loaded later; load modules eagerly unless the user chose otherwise (only effective before
        # CUDA is initialised in this process; tilescale also loads its own modules eagerly).
        os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")  # tilescale does not use NVLink multicast
        install = find_nvshmem()
        rank = env_int("RANK", 0 if not dist.is_initialized() else dist.get_rank())
        world = env_int("WORLD_SIZE", 1 if not dist.is_initialized() else dist.get_world_size())
        local_rank = env_int("LOCAL_RANK", rank)
        local_world = env_int("LOCAL_WORLD_SIZE", world)
        if settings.node_size:  # emulated nodes must divide the world: checked first, every rank raises alike
            check_node_size(settings.node_size, world)
        if not torch.cuda.is_available():
            raise TileScaleError("tilescale.init_distributed() needs CUDA GPUs; torch sees none "
                                 "(torch.cuda.is_available() is False)")
        ndev = torch.cuda.device_count()
        if not 0 <= local_rank < local_world:
            raise TileScaleError(f"LOCAL_RANK={local_rank} with LOCAL_WORLD_SIZE={local_world}: expected "
                                 f"0 <= LOCAL_RANK < LOCAL_WORLD_SIZE")
        devices = device_map(local_world, ndev, settings.ranks_per_gpu)
        device, shared = devices[local_rank], len(set(devices)) < len(devices)
        torch.cuda.set_device(device)
        torch.empty(1, device="cuda")  # primary context current before NVSHMEM uses it
        created = False
        if not dist.is_initialized():
            if world > 1 and "MASTER_ADDR" not in os.environ:
                raise TileScaleError("WORLD_SIZE > 1 but MASTER_ADDR is not set: start with launch.sh or torchrun")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            dist.init_process_group(**process_group_args(shared, device), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            created = True
        elif dist.get_world_size() != world:
            raise TileScaleError(f"torch.distributed has world size {dist.get_world_size()} but WORLD_SIZE={world}")
        elif shared and "nccl" in str(dist.get_backend()).lower():
            raise TileScaleError(f"shared-GPU mode (TILESCALE_RANKS_PER_GPU={settings.ranks_per_gpu}, {local_world} "
                                 f"ranks on {ndev} GPU(s)): torch.distributed was started with backend "
                                 f"'{dist.get_backend()}', but NCCL cannot run two ranks on one GPU; start it with "
                                 "backend 'gloo', or let tilescale.init_distributed() start it")
        ctrl = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        shim = load_shim(install)
        holder = shared and first_on_host(rank, ctrl)
        if shared:   # before NVSHMEM makes its /dev/shm files: launch.sh removes them if this rank is killed
            shm_leftovers.record_rank()
        global _GENERATION
        _GENERATION += 1     # this start's: a failure published before it (a caught one) stops none of its ranks
        nvshmem_start.start(shim, install, rank, world, ctrl, timeout_s=timeout_s, generation=_GENERATION,
                            shared=shared, holder=holder, lock=_mpg_lock)
        info = DistInfo(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                        device=device, shared_gpu=shared, node_devices=tuple(devices))
        if shared:
            log.info("shared-GPU mode: rank %d on cuda:%d with %d other rank(s) of this node; torch.distributed on "
                     "gloo only; timings mean nothing", rank, device, devices.count(device) - 1)
        _RT = Runtime(info, install, shim, ctrl, created, _GENERATION)
        _RT.mpg_lock_holder, _RT.init_timeout_s = holder, float(timeout_s)
        if not _RT.barrier_words:
            _RT = None
            raise TileScaleError(f"rank {rank}: could not allocate tilescale's barrier words on the symmetric heap "
                                 "(NVSHMEM_SYMMETRIC_SIZE too small?)")
        # Job-wide abort: a wait that gave up or an uncaught error on any rank stops every other rank.
        _RT.watchdog = diagnostics.Watchdog(_RT)
        _RT.watchdog.start()
        _register_exit()
        return info


def shares_gpu() -> bool:
    """True in the shared-GPU mode: this rank's GPU runs other ranks too (False before init_distributed)."""
    return _RT is not None and not _RT.closed and _RT.info.shared_gpu


_exit_registered = False


def _register_exit() -> None:
    global _exit_registered
    if not _exit_registered:
        atexit.register(_finalize_at_exit)
        prev = sys.excepthook

        def excepthook(*exc):  # an uncaught exception ends this rank, maybe alone: no collective teardown
            diagnostics.failing.set()      # this rank reports its own error: its watchdog must not stop it first
            prev(*exc)
            abandon(exc[1])

        sys.excepthook = excepthook
        _exit_registered = True


def abandon(error: BaseException | None = None) -> None:
    """Close the runtime without finalize()'s collective teardown (freeing symmetric memory, shutting
    NVSHMEM down): for a rank that stops on an error, which the other ranks may never join in those
    collectives. With `error`, the other ranks are told (the job's store): their watchdogs stop them with
    a message naming this rank and the error, instead of letting them wait for it. Frees nothing; the end
    of the process releases its GPU memory. finalize() then does nothing."""
    global _RT
    rt = _RT
    if rt is None or rt.closed:
        return
    if rt.watchdog is not None:
        rt.watchdog.stop.set()
    if error is not None:
        diagnostics.report_own_failure(rt, error)
    rt.closed = True
    _RT = None


def at_finalize(hook: Callable[[], None]) -> None:
    """Have finalize() call `hook()` once it has freed the symmetric heap (before NVSHMEM shuts down): for
    what holds pointers into the heap above the runtime (the ops' caches: tilescale/ops/op_cache.py)."""
    if hook not in _at_finalize:
        _at_finalize.append(hook)


def synchronize() -> None:
    """``torch.cuda.synchronize()`` that reports a wait of this rank that gave up as WaitTimeoutError
    (``tilescale.synchronize``; see tilescale/diagnostics.py)."""
    import torch

    if _RT is None and settings.compile_only:   # nothing ran (tilescale/compile_only.py)
        return
    rt = current()
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        rec = diagnostics.read_record(rt)
        if rec is not None:
            raise WaitTimeoutError(diagnostics.describe(rec)) from e
        raise
    diagnostics.check(rt)


def _late_to_finalize(rt: Runtime) -> list[int]:
    """Ranks that did not reach finalize() within TILESCALE_WAIT_TIMEOUT_S (empty when every rank did)."""
    from ..env import settings

    if rt.info.world_size == 1:
        return []
    try:
        store = rt.watchdog.store if rt.watchdog is not None else diagnostics.default_store()
    except Exception:  # noqa: BLE001  (no store: the teardown's own collectives are all there is)
        store = None
    if store is None:
        return []
    return diagnostics.late_ranks(store, f"tilescale/finalize/{rt.generation}", rt.info.rank, rt.info.world_size,
                                  settings.wait_timeout_s)


def _finalize_at_exit() -> None:
    """finalize() at the end of the process: its errors are said on stderr (a host lock that timed out, a module
    that did not finalize, the other ranks that never joined), never raised into a clean exit."""
    try:
        finalize()
    except WaitTimeoutError as e:   # the other ranks never joined: say so (they are told through the store)
        print(f"tilescale: {e}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001  (never turn a clean exit into a traceback)
        print(f"tilescale: tilescale.finalize() at exit failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def finalize() -> None:
    """Free every symmetric tensor, shut NVSHMEM down and, if tilescale started it, torch.distributed.
    Collective. A second call does nothing."""
    rt = _RT
    if rt is None or rt.closed:
        return
    if diagnostics.read_record(rt) is not None:  # a kernel trapped: the CUDA context is gone, nothing can be freed
        abandon()
        return
    # NVSHMEM's shutdown unlinks its per-GPU slab by a name other jobs on this host use too: in the shared-GPU
    # mode the lowest rank of each host holds the host lock from before the ranks agree until the shutdown is over.
    if rt.mpg_lock_holder:
        _mpg_lock.acquire(rt.init_timeout_s, f"rank {rt.info.rank}: tilescale.finalize()")
    try:
        _teardown(rt)
    finally:
        _mpg_lock.release()


def _teardown(rt: Runtime) -> None:
    """finalize()'s collective part, once every rank got there."""
    global _RT
    import torch.distributed as dist

    # The teardown below is collective (NVSHMEM's free and finalize wait for every rank, unbounded): first make
    # sure every rank got here, within the wait bound. A rank that leaves alone (an error it caught, then a
    # normal exit) would otherwise wait forever while the others wait for it in their kernels.
    late = _late_to_finalize(rt)
    if late:
        msg = (f"rank {rt.info.rank}: tilescale.finalize() gave up after {settings.wait_timeout_s:g} s "
               f"(TILESCALE_WAIT_TIMEOUT_S) waiting for rank(s) {', '.join(map(str, late))} to call it too (still "
               "running collectives, or failed): this rank leaves without the collective teardown")
        abandon(WaitTimeoutError(msg))    # tells the other ranks; the end of the process frees this rank's memory
        raise WaitTimeoutError(msg)
    # The watchdog runs on until NVSHMEM is shut down: a stream wait of this rank that never ends is said and stops
    # the job (its synchronize would not return), and a rank that fails meanwhile stops this one (NVSHMEM's free
    # and shutdown would wait for it forever).
    if not diagnostics.synchronize_within(rt.device, settings.wait_timeout_s):
        msg = (f"rank {rt.info.rank}: tilescale.finalize() gave up after {settings.wait_timeout_s:g} s "
               "(TILESCALE_WAIT_TIMEOUT_S) waiting for this rank's GPU work to end: a wait that nothing bounds (a "
               "stream wait of a call replayed from a CUDA graph, a kernel built with TILESCALE_WAIT_TIMEOUT_S=0) "
               "waits for a rank that left; this rank leaves without the collective teardown")
        abandon(WaitTimeoutError(msg))
        raise WaitTimeoutError(msg)
    heap.free_all(rt)
    for hook in _at_finalize:   # e.g. the ops' caches, whose ops point into the heap just freed
        hook()
    failed = finalize_modules(rt)
    rt.shim.ts_finalize()
    if rt.watchdog is not None:
        rt.watchdog.stop.set()
    if rt.info.shared_gpu:   # NVSHMEM's inter-process event files (tilescale/shm_leftovers.py)
        shm_leftovers.remove_own()
    rt.closed = True
    if rt.created_pg and dist.is_initialized():
        dist.destroy_process_group()
    _RT = None
    if failed:   # after the rest of the teardown, which does not depend on them
        raise TileScaleError(f"rank {rt.info.rank}: tilescale.finalize(): NVSHMEM's per-module finalize "
                             f"(nvshmemx_cumodule_finalize) failed for {'; '.join(failed)}")


def finalize_modules(rt: Runtime) -> list[str]:
    """Finalize the NVSHMEM state of every module initialised in `rt` (all of them, whatever one returns); the
    failures, as "kernel 'name' (rc N)" (empty when every one returned 0)."""
    failed = []
    for key, lib in rt.modules.items():
        fin = getattr(lib, "tilescale_module_finalize", None)
        if fin is not None:
            fin.restype = ctypes.c_int
            rc = fin()
            if rc != 0:
                failed.append(f"kernel '{rt.module_names.get(key, '?')}' (rc {rc})")
    rt.modules.clear()
    return failed


def init_module(lib: ctypes.CDLL, kernel_name: str) -> None:
    """Per-module NVSHMEM device state (once per loaded .so); needs the runtime."""
    rt = current()
    key = id(lib)
    if key in rt.modules:
        return
    fn = lib.tilescale_module_init
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rc = fn(ctypes.c_void_p(rt.wait_diag.data_ptr()), ctypes.c_void_p(rt.barrier_words))
    if rc == -1:
        raise NotInitializedError(f"kernel '{kernel_name}': NVSHMEM is not initialised in this process: "
                                  "call tilescale.init_distributed() before launching distributed kernels")
    if rc < 0:
        meaning = {-2: "cudaGetFuncBySymbol failed", -3: "cuFuncGetModule unavailable", -4: "cuFuncGetModule failed",
                   -9: "cudaMemcpyToSymbol failed", -10: "cudaMemcpyToSymbol failed"}.get(
            rc, "NVSHMEM module init failed (version mismatch between headers and host library?)")
        raise TileScaleError(f"kernel '{kernel_name}': per-module NVSHMEM init returned {rc}: {meaning}")
    rt.modules[key] = lib
    rt.module_names[key] = kernel_name
