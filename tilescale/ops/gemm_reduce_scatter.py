"""GEMM + ReduceScatter, overlapped (row-parallel layer): ``C_local = ReduceScatter(X_local @ W_local)``.

torch equivalent (X_local: (M, K/W), W_local: (K/W, N) on each rank)::

    partial = X_local @ W_local                                   # (M, N)
    C_local = torch.empty(M // W, N)
    torch.distributed.reduce_scatter_tensor(C_local, partial)     # sum over ranks, rows split by rank

Each rank's GEMM computes the row chunks in the order their owners need them: rank+1's rows first, its own
last. Two ways to sum them (chosen per job, the same on every rank: :func:`default_path`):

- **push** (every rank on this node, NVLink / P2P mapped; the default there): one kernel on every SM, nothing
  else, summing along a ring like NCCL's reduce-scatter: each rank adds its product to the sum that rank me + 1
  pushed and pushes the new sum on to rank me - 1 (:mod:`.gemm_rs_push`: the kernel and its protocol, steps 1-3);
- **pull** (a rank on another node, ``TILESCALE_NODE_SIZE`` included; more than 8 ranks; MPS-shared GPUs): the
  GEMM counts finished tiles per row block and a reduction kernel on a side stream pulls and sums each complete
  row block of every rank while the GEMM goes on (:mod:`.gemm_rs_pull`: the two kernels and the protocol, steps
  1-3).

The rows per rank are a run-time argument of the kernels, up to the op's bound fixed at construction (its buffers
are sized for it): one build serves every row count, and the ops of one config share their kernels.
"""
from . import checks, op_cache, vectors
from .base import Op, _capturing
from .gemm import GemmConfig, check_problem, problem_config
from .gemm_rs_path import MAX_PUSH_RANKS, PATHS, check_sizes, default_path, push_takes  # noqa: F401  (re-exported)
from .gemm_rs_pull import REDUCE_THREADS, gemm_rs_gemm_kernel, gemm_rs_reduce_kernel
from .gemm_rs_push import PUSH_PARAMS, gemm_rs_push_kernel, gemm_rs_push_loopback_kernel, push_shapes  # noqa: F401

__all__ = ["GemmRS", "gemm_rs"]


def kernels(M: int, N: int, K_local: int, world_size: int, dtype: str, reduce_blocks: int = 20,
            config: GemmConfig | None = None, path: str | None = None, sms: int = 132, team=None) -> list:
    """[(jit function, args)] of the kernels :class:`GemmRS` compiles for problems of up to `M` rows (W x rows per
    rank) on `path` (None: :func:`default_path`): the push kernel, or the pull path's GEMM and reduction; `sms`: the
    GPU's SM count (the push kernel's blocks). The rows (and the buffers' sizes) are run-time arguments of each
    call: M only chooses the config (the tuning table's for M). `team`: the ranks of the op's group
    (tilescale.runtime.team.kernel_team; None: the world, whose kernels take no team argument)."""
    push = (path or default_path(world_size, K_local, team=team)) == "push"
    t = () if team is None else (team,)
    # the tuning table ranks the pull path's GEMM ("gemm_rs"); the push kernel has entries of its own, or the default
    # config (which ran at least as fast as the pull-tuned one for it on every benchmark shape)
    cfg = problem_config(M, N, K_local, world_size=world_size, op="gemm_rs_push" if push else "gemm_rs", config=config)
    gemm_args = (N, K_local, world_size, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, cfg.threads,
                 cfg.swizzle)
    if push:
        return [(gemm_rs_push_kernel, gemm_args + (sms, *t))]
    col_tile = 256 if N % 256 == 0 and cfg.block_m <= 128 else 128   # fp32 accumulator <= 128 x 256
    if N % col_tile:
        raise ValueError(f"N: got {N}, expected a multiple of 128")
    per_block = N // cfg.block_n                          # T.release_stores: one count per tile
    return [(gemm_rs_gemm_kernel, gemm_args + t),
            (gemm_rs_reduce_kernel, (N, world_size, per_block, reduce_blocks, dtype, cfg.block_m, col_tile)
             + ((REDUCE_THREADS, team) if t else ()))]


class GemmRS(Op):
    """``reduce_scatter(X_local @ W_local)`` for fixed N, K and dtype; collective to construct. `M` is the bound of
    the rows (W x rows per rank): a call takes `x` of W x m rows for any m <= M / W (the same m on every rank) and
    returns m rows, with the kernels built once (the rows are a kernel argument; the buffers are sized for M).
    `path`: "push" or "pull" (module docstring; None: :func:`default_path`, the fastest this job can take);
    `reduce_blocks`: the SMs of the pull path's reduction."""

    NAME, KERNEL = "GemmRS", "gemm_rs"
    GRAPH_SAFE = True     # the kernels count calls on the device (module docstring)

    def __init__(self, M: int, N: int, K_local: int, dtype, *, reduce_blocks: int = 20,
                 config: GemmConfig | None = None, path: str | None = None, group=None):
        import torch

        from ..runtime import symm, team

        with self.arguments(M=M, N=N, K_local=K_local, dtype=dtype, reduce_blocks=reduce_blocks, config=config,
                            path=path, group=group) as agreed:
            check_problem("GemmRS", M, N, K_local, dtype, config, "K_local")
            checks.as_int("GemmRS", "reduce_blocks", reduce_blocks)
            job = default_path(self.world_size, team=self.team)   # the job's path for any K
            best = job if push_takes(self.world_size, K_local) else "pull"
            if path is not None and path not in PATHS:
                checks.fail("GemmRS", "path", repr(path), f"one of {PATHS} or None (the job's best: {best!r})")
            elif path == "push" and job != "push":
                checks.fail("GemmRS", "path", "'push'", "'pull' or None on this job (push needs every rank on this "
                            f"node, at most {MAX_PUSH_RANKS} ranks, and no MPS-shared GPU)")
            elif path == "push" and best != "push":
                checks.fail("GemmRS", "K_local", str(K_local), "a multiple of 8 on the push path (its TMA loads of "
                            "X need rows of whole 16 bytes); path='pull' or None takes any K_local")
            agreed["path"] = path = path or best
            try:
                sms = vectors.sm_count()
            except Exception:  # noqa: BLE001  (no GPU here: the construction fails later, after the agreement)
                sms = None
            if sms is not None and reduce_blocks >= sms:
                checks.fail("GemmRS", "reduce_blocks", repr(reduce_blocks), f"fewer than the {sms} SMs of this GPU "
                            "(the reduction's blocks wait while the GEMM runs, which needs SMs of its own)")
            jobs = kernels(M, N, K_local, self.world_size, checks.dtype_name(dtype), reduce_blocks, config, path,
                           sms if sms is not None else 132, team.kernel_team(self.team, self.rt.info.world_size))
            check_sizes(M, N, K_local, self.world_size, path, jobs[0][1][4])
        W = self.world_size
        self.path = path
        self.compile_ahead(jobs)                   # its kernels side by side; build() takes them
        (gemm_fn, self.gemm_args) = jobs[0]
        self.block_m, block_n = self.gemm_args[4], self.gemm_args[5]
        self.M, self.N, self.K, self.dtype = M, N, K_local, dtype
        self.rows = M // W                         # the bound of a call's rows per rank
        row_blocks = W * -(-self.rows // self.block_m)                  # the bound's row tiles, every rank's
        if path == "push":
            slab, words = push_shapes(M, N, W, self.block_m, block_n)
            self.R = self.symmetric(slab, dtype)                         # the sums in from rank + 1
            self.arrived = self.symmetric(words, torch.uint64, zero=True)  # their counts
            self.pushed = torch.zeros(words, dtype=torch.uint64, device=self.device)   # mine to rank - 1: up to
            self.gemm, self._direct = self.build(gemm_fn, self.gemm_args, PUSH_PARAMS)   # which call
            self.gemm_counters = self.call_counters(self.gemm_args[10])   # a word per block (the SMs)
            prev = self.pe((self.rank - 1) % W)                            # Rp, Ap: rank - 1's, where mine go
            self._tail = (self.R, self.arrived, self.gemm_counters, symm.peer_tensor(self.R, prev),
                          symm.peer_tensor(self.arrived, prev), self.pushed)
            self._tail_ptrs = tuple(t.data_ptr() for t in self._tail)
            self._sizes = (slab[0], words[0])                              # R's rows, arrived's words
            self.launch_path = "direct" if self._direct is not None else "tilelang"
            return
        (reduce_fn, self.reduce_args) = jobs[1]
        self.P = self.symmetric((2 * row_blocks * self.block_m, N), dtype)   # the partials of even calls, then odd
        self.done = self.symmetric((row_blocks,), torch.uint64, zero=True)
        # where a peer's partial rows land before they are summed, for peers on other nodes (an NVSHMEM get's
        # local buffer must be symmetric, i.e. registered, to cross a network)
        blocks, col_tile = self.reduce_args[3], self.reduce_args[6]
        self.staging = self.symmetric((blocks, self.block_m, col_tile), dtype)
        self.stream = torch.cuda.Stream(priority=-1)
        self.gemm, _ = self.build(gemm_fn, self.gemm_args)
        self.reduce, _ = self.build(reduce_fn, self.reduce_args)
        tiles = row_blocks * -(-N // block_n)
        counters = self.call_counters(tiles + blocks)        # the GEMM's, then the reduction's
        self.gemm_counters, self.reduce_counters = counters[:tiles], counters[tiles:]
        self.launch_path = "tilelang"

    def _validate(self, x, w, out) -> None:
        """The call checks (agreed across ranks): `x` (W x m, K_local), m <= M / W, `w` (K_local, N) and `out`
        (m, N), all of the dtype on this GPU, handed to the kernels as they are: contiguous and 16-byte aligned."""
        d, dt, W = self.device, self.dtype, self.world_size
        rows = x.shape[0] if getattr(x, "dim", lambda: 0)() == 2 else self.M
        if rows > self.M or rows % W:
            checks.fail("GemmRS", "x", checks.describe(x), f"W x m rows, m <= M / world_size = {self.M // W} (the "
                        f"bound of this op, built for M={self.M}: more rows need an op of their own), W = {W}")
        checks.check_tensor("GemmRS", "x", x, shape=(rows, self.K), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        checks.check_tensor("GemmRS", "w", w, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("GemmRS", "out", out, shape=(rows // W, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="the rows of x / world_size")

    def call_key(self, x, w, out):
        return checks.signature(x, True), checks.signature(w, True), checks.signature(out, True)

    def __call__(self, x, w, out=None):
        import torch

        stream = self.begin(x, w, out)
        W = self.world_size
        m = x.shape[0] // W                # the call's rows per rank
        c = out if out is not None else torch.empty(m, self.N, dtype=self.dtype, device=x.device)
        if m == 0:
            return c
        xv = x.view(W, m, self.K) if W > 1 else x     # as the kernels see it: rank q's rows, X[q]
        if self.path == "push":            # one kernel (module docstring, push)
            direct = self._direct
            if direct is None:
                self.gemm.launch(xv, w, c, *self._tail)
            elif direct[0](x.data_ptr(), w.data_ptr(), c.data_ptr(), *self._tail_ptrs, m, *self._sizes, stream):
                raise self.launch_error()
            return c
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.reduce.launch(self.P, self.done, c, self.staging, self.reduce_counters)
        self.gemm.launch(x.view(W, m, self.K), w, self.P, self.done, self.gemm_counters)
        main.wait_stream(self.stream)
        if not _capturing():    # (a graph's memory is its own pool: nothing to tell the allocator)
            c.record_stream(self.stream)
        return c


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size, config, group=None):
    return GemmRS(M, N, K, dtype, config=config, group=group)     # (the ops of one config share their kernels)


_fn_check = checks.CallCheck("gemm_rs")


def _validate_fn(x, w, W=None, group=None) -> None:
    from ..runtime import team

    W = team.size_of("gemm_rs", group, W)
    checks.check_tensor("gemm_rs", "x", x, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("gemm_rs", "w", w, dtype=x.dtype, min_dims=2)
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        checks.fail("gemm_rs", "w", checks.describe(w), f"a 2-D ({x.shape[-1]}, N) tensor for x {tuple(x.shape)} "
                    "(2-D operands, inner sizes equal)")
    if W is not None and x.shape[0] % W:
        checks.fail("gemm_rs", "x", f"{x.shape[0]} rows", f"a multiple of the world size {W} (equal row slices)")


def gemm_rs(x, w, *, group=None):
    """``reduce_scatter(x @ w)`` over all ranks (of `group`: tilescale.runtime.team; see :class:`GemmRS`); builds and
    caches the op per (N, K, dtype, config, group).

    Any number of rows divisible by the world size, run as they are by an op of a bound of rows per rank
    (tilescale.ops.op_cache.cached_op: the rows rounded up to a power of two, or a larger op cached with the same
    config); ops of one config share their kernels, so new rows build nothing unless the tuning table picks another
    config for their bound."""
    from .. import runtime
    from ..runtime import team

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(x), checks.signature(w), group), _validate_fn, x, w,
              rt.info.world_size if rt is not None else None, group)
    W = team.size_of("gemm_rs", group, runtime.current().info.world_size)
    (M, K), N = x.shape, w.shape[1]
    t = None if group is None else team.of_group("gemm_rs", group)
    op = "gemm_rs_push" if default_path(W, K, team=t) == "push" else "gemm_rs"
    return op_cache.cached_op(_cached, M // W, N, K, x.dtype, W, op, group)(x, w)
