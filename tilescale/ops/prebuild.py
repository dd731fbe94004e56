"""Compile many kernels at once, ahead of use: one process compiles in threads (tilescale.batch: nvcc runs in
parallel, up to the cores), the other ranks wait and then load from the kernel cache.

    jobs = prebuild.ag_gemm_jobs([(8192, 8192, 2048)], world_size=4, dtype="bfloat16")
    prebuild.on_local_rank0(jobs)     # collective: local rank 0 compiles, everyone waits, all hit the cache
"""
import time


def unique(jobs) -> list:
    """`jobs` without repeats of the same (jit function, args), in order."""
    from ..compilation.batch import unique as _unique

    return _unique(jobs)


def ag_gemm_jobs(shapes, world_size: int, dtype: str = "bfloat16", *, cached: bool = False, team=None) -> list:
    """(jit function, args) of every kernel AGGemm builds for these (M, K, N) shapes (M: the op's bound of the
    gathered rows); `cached`: those of ``tilescale.ops.ag_gemm`` (and the torch ops) for M gathered rows instead
    (tilescale.ops.op_cache.cached_op: the config of the rows' bound, plain grids). `team`: an op over a group
    (tilescale.runtime.team.kernel_team of the group; `world_size` then its size); None: the world."""
    from .allgather_gemm import kernels
    from .gemm import gemm_config
    from .op_cache import row_bound

    jobs = []
    for M, K, N in shapes:
        if M % world_size:
            continue
        if not cached:
            jobs += kernels(M, N, K, world_size, dtype, team=team)
            continue
        bound = row_bound(M // world_size) * world_size
        cfg = gemm_config(bound, N, K, world_size=world_size, op="ag_gemm")
        jobs += kernels(bound, N, K, world_size, dtype, config=cfg, sms=0, team=team)
    return jobs


def gemm_rs_jobs(shapes, world_size: int, dtype: str = "bfloat16", *, cached: bool = False, team=None) -> list:
    """(jit function, args) of every kernel GemmRS builds for these (M, K, N) shapes (K is the full K; M the op's
    bound of the rows); `cached`: those of ``tilescale.ops.gemm_rs`` (and the torch ops) for M rows instead
    (tilescale.ops.op_cache.cached_op: the config of the rows' bound). `team` as in :func:`ag_gemm_jobs`."""
    from .gemm import gemm_config
    from .gemm_reduce_scatter import default_path, kernels
    from .op_cache import row_bound

    jobs = []
    for M, K, N in shapes:
        if M % world_size or K % world_size:
            continue
        kl = K // world_size
        if not cached:
            jobs += kernels(M, N, kl, world_size, dtype, team=team)
            continue
        bound = row_bound(M // world_size) * world_size
        op = "gemm_rs_push" if default_path(world_size, kl, team=team) == "push" else "gemm_rs"
        jobs += kernels(bound, N, kl, world_size, dtype, config=gemm_config(bound, N, kl, world_size=world_size, op=op),
                        team=team)
    return jobs


def allgather_jobs(world_size: int, dtype: str = "bfloat16") -> list:
    """(jit function, args) of the AllGather kernels for shards of 1 KiB .. 256 MiB."""
    from .allgather import kernels

    return unique(job for k in range(10, 29) for job in kernels(world_size << k, world_size, dtype))


def collective_jobs(world_size: int, sizes, dtypes=("bfloat16",), sms: int = 132, ops=None) -> list:
    """(jit function, args) of every kernel the collectives (`ops`: their names, any spelling; None: every
    one :mod:`tilescale.ops.registry` lists) build for messages of `sizes` bytes (as
    tilescale.plan.Request.msg_bytes: per rank; AllGather of the gathered output, ReduceScatter and AllToAll
    of the full input), for each dtype (kernels that move bytes: one build for all). Deduplicated."""
    from . import registry

    wanted = None if ops is None else {registry.canonical(o, "ops") for o in ops}
    return unique(job for c in registry.collectives() if wanted is None or c.name in wanted
                  for nb in sizes for dt in dtypes for job in c.kernels(nb, world_size, dt, sms))


def compile_all(jobs, workers: int | None = None, verbose: bool = True) -> float:
    """Compile (and load) every job side by side (tilescale.batch: TILESCALE_BUILD_JOBS threads, one progress
    line on rank 0 while kernels are really built, nothing when every one came from the caches); returns the
    seconds it took. `verbose`: the progress line (rank 0)."""
    from ..compilation.batch import compile_all as _compile_all

    t0 = time.time()
    _compile_all(unique(jobs), workers=workers, progress=None if verbose else False)
    return time.time() - t0


_calls = 0   # on_local_rank0 calls in this process: every rank makes the same ones (it is collective)


def wait_bound_s(n_kernels: int) -> float:
    """How long the other ranks wait for their local rank 0 to compile `n_kernels`: TILESCALE_NVCC_TIMEOUT_S
    per kernel (each nvcc run is bounded by it) plus 10 minutes (elaboration, loading); 0 means a week."""
    from ..env import settings

    per = settings.nvcc_timeout_s
    return 7 * 24 * 3600.0 if per <= 0 else per * max(n_kernels, 1) + 600.0


def on_local_rank0(jobs, workers: int | None = None, timeout_s: float | None = None) -> None:
    """Collective: local rank 0 compiles `jobs`; every other rank of its node waits, then each loads from
    the cache. The wait is bounded by `timeout_s` (default :func:`wait_bound_s`), not by the control
    group's timeout; if local rank 0 fails, every rank of its node raises its error instead of waiting."""
    import datetime

    import torch.distributed as dist

    from .. import runtime
    from ..errors import TileScaleError

    global _calls
    rt = runtime.current()
    jobs = unique(jobs)
    timeout_s = wait_bound_s(len(jobs)) if timeout_s is None else timeout_s
    _calls += 1
    leader = rt.info.rank - rt.info.local_rank          # global rank of this node's local rank 0
    key = f"tilescale/prebuild/{_calls}/{leader}"
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001  (no default store: the old way, bounded by the group's timeout)
        store = None
    if store is None:
        if rt.info.local_rank == 0:
            compile_all(jobs, workers)
        dist.barrier(group=rt.ctrl_group)
        return
    if rt.info.local_rank == 0:
        try:
            compile_all(jobs, workers)
        except BaseException as e:
            store.set(key, f"error: {type(e).__name__}: {e}"[:8000])
            raise
        store.set(key, "ok")
        return
    t0 = time.monotonic()
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        status = store.get(key).decode(errors="replace")
    except Exception as e:  # noqa: BLE001  (torch's store raises DistStoreError / RuntimeError)
        waited = time.monotonic() - t0
        raise TileScaleError(
            f"prebuild: rank {rt.info.rank} waited {waited:.0f} s (bound {timeout_s:.0f} s) for local rank 0 "
            f"(rank {leader}) to compile {len(jobs)} kernel(s), and it did not report ({type(e).__name__}: {e}). "
            "It is stuck or gone: see its output. The bound is TILESCALE_NVCC_TIMEOUT_S x kernels + 600 s, or "
            "on_local_rank0(timeout_s=...)") from None
    if status != "ok":
        raise TileScaleError(f"prebuild: local rank 0 (rank {leader}) failed to compile the kernels, so rank "
                             f"{rt.info.rank} stops too: {status.removeprefix('error: ')}")
