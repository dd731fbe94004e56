"""Which path :class:`tilescale.ops.gemm_reduce_scatter.GemmRS` takes on a job (push or pull: that module's
docstring), and the problem sizes each path's kernels can index."""
from . import checks

PATHS = ("push", "pull")
MAX_PUSH_RANKS = 8     # the push path's ranks: one NVLink domain (8 GPUs of a node)


def _mps_client() -> bool:
    """Whether this process's CUDA work would go through an MPS daemon (its pipe directory exists)."""
    import os

    return os.path.isdir(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def push_takes(world_size: int, K_local: int, elem_bytes: int = 2) -> bool:
    """Whether the push kernel can run this K: at world size > 1 it loads rows of X by TMA, which must be whole
    16-byte units (K_local a multiple of 8 in bf16 / fp16); the pull path takes any K."""
    return world_size == 1 or (K_local * elem_bytes) % 16 == 0


def default_path(world_size: int, K_local: int | None = None, elem_bytes: int = 2, team=None) -> str:
    """The path :class:`GemmRS` takes on this job (module docstring) among `world_size` ranks (those of `team`,
    tilescale.runtime.team, where given; else the world): "push" when every one is on this node
    (the launcher's grouping, or ``TILESCALE_NODE_SIZE``), at most :data:`MAX_PUSH_RANKS` ranks, ranks that
    share a GPU do not share it through MPS, and the push kernel takes `K_local` (:func:`push_takes`; None: any);
    else "pull". The same on every rank of a job."""
    from .. import runtime
    from ..runtime import topology

    rt = runtime.current() if runtime.is_initialized() else None
    local = rt.info.local_world_size if rt is not None else None
    if team is not None and rt is not None:
        topo = topology.current()
        nodes = len({topo.node_of(p) for p in team.ranks})
    else:
        nodes = topology.of(world_size, local).nodes
    if nodes > 1 or world_size > MAX_PUSH_RANKS:
        return "pull"
    if rt is not None and runtime.shares_gpu() and _mps_client():
        return "pull"
    if K_local is not None and not push_takes(world_size, K_local, elem_bytes):
        return "pull"
    return "push"


def check_sizes(M: int, N: int, K_local: int, world_size: int, path: str, block_m: int) -> None:
    """OpArgumentError unless the kernels of `path` can index this problem: the pull path's reduction offsets its
    rows of the partials by the call's half of ``P``, the literal M x N, a 32-bit integer; a grid of the pull path's
    GEMM (and of the push kernel at world size 1) has a row of blocks per tile of M, at most 65535 (CUDA's grid
    limit in y). (The push kernel at world size > 1 indexes its buffers with 64-bit integers and runs a grid of one
    row; X and W are loaded by TMA, whose descriptors hold 64-bit sizes.)"""
    got = f"M={M}, N={N}, K_local={K_local}"
    if path == "pull":
        checks.fits_int32("GemmRS", "M, N", got, M * N, "M x N (the pull path's offset of a call's partials)")
    if (path == "pull" or world_size == 1) and M // block_m > 65535:
        checks.fail("GemmRS", "M", got, f"at most {65535 * block_m} rows (M / block_m = {M // block_m} blocks in a "
                    "grid's y dimension, whose CUDA limit is 65535)")
