"""GEMM + ReduceScatter, overlapped (row-parallel layer): ``C_local = ReduceScatter(X_local @ W_local)``.

torch equivalent (X_local: (M, K/W), W_local: (K/W, N) on each rank)::

    partial = X_local @ W_local                                   # (M, N)
    C_local = torch.empty(M // W, N)
    torch.distributed.reduce_scatter_tensor(C_local, partial)     # sum over ranks, rows split by rank

How it overlaps: each rank's GEMM computes the row chunks in the order their owners need them
(rank+1's rows first, its own last) and counts finished tiles per row block; a reduction kernel on a
side stream, on a few SMs, pulls each finished row block of every rank as soon as its count is complete
and sums it in fp32, while the GEMM goes on. A rank of this node is read over NVLink (loads through its
peer mapping); a rank of another node (``TILESCALE_NODE_SIZE`` included) with NVSHMEM: its count polled
with atomic fetches, its rows fetched with a get into a symmetric staging tile, summed from there.

Signal protocol of one call. Its call number e = 1, 2, ... is counted on the device by each kernel
(``T.call_number``: both kernels run once per call, so both count the same e), and the partials are
double-buffered by e % 2 (``P`` holds both: rows ``(e % 2) * M + ...``): a call captured in a CUDA graph
sees a new e on every replay, and replays and eager calls may be interleaved.

1. GEMM (main stream): a block stores its tile of row block rb into ``P[e % 2]`` with one TMA store; each of
   its consumer warps waits until that store is written, then adds 1 to ``done[rb]`` (release, system
   scope; ``T.release_stores``); a row block is complete at ``e * (threads / 32) * tiles_n``;
2. reduction (side stream), for each row block of this rank's chunk, for each rank s in the order the
   blocks complete (rank-1, rank-2, ..., rank): wait until s's ``done[rb]`` is complete (acquire,
   system scope; polled through the peer mapping, or with NVSHMEM atomic fetches for another node),
   add s's partial rows into fp32 accumulators (loaded through the mapping, or first fetched with
   ``get_block`` into this block's ``staging`` tile); then store the sum into C_local;
3. the main stream joins the side stream. The next-but-one call may overwrite ``P[e % 2]``: by then
   every peer has finished reducing epoch e (its call e + 1 started after, and we waited for it).
"""

import tilescale
import tilescale.language as T

from . import checks, op_cache, vectors
from .base import Op, _capturing
from .gemm import GemmConfig, check_problem, padded_rows, problem_config, tile_buffers, tile_loop

__all__ = ["GemmRS", "gemm_rs"]


@tilescale.jit
def gemm_rs_gemm_kernel(M: int, N: int, K: int, world_size: int, dtype: str = "bfloat16", block_m: int = 128,
                        block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256, swizzle: int = 10):
    """The GEMM of :class:`GemmRS`: partial rows in the order their owners reduce them, with counts."""
    W = world_size
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W

    tiles_n = -(-N // block_n)

    @T.prim_func
    def gemm_rs_gemm(X: T.Tensor((M, K), dtype), Wt: T.Tensor((K, N), dtype), P: T.Tensor((2 * M, N), dtype),
                     done: T.Tensor((tiles_m,), "uint64"), counters: T.Tensor((tiles_n * tiles_m,), vectors.COUNTER)):
        with T.Kernel(tiles_n, tiles_m, threads=threads) as (bx, by):
            Xs, Ws, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            e = T.call_number(counters)
            p = T.cast(e % 2, "int32")                        # this call's half of P
            me = T.get_rank()
            rb = (by + (me + 1) * tiles_per_rank) % tiles_m   # rank+1's rows first, own rows last
            tile_loop(X, Wt, P, Xs, Ws, Cl, Cs, rb, bx, stages, False, c_rb=p * tiles_m + rb)  # a TMA store
            T.release_stores(done[rb], 1, scope="sys")      # once written: one release per consumer warp

    return gemm_rs_gemm


@tilescale.jit
def gemm_rs_reduce_kernel(M: int, N: int, world_size: int, per_block: int, blocks: int, dtype: str = "bfloat16",
                          block_m: int = 128, col_tile: int = 256, threads: int = 512):
    """The reduction of :class:`GemmRS`: C_local = sum over ranks of their partial rows of this rank."""
    W = world_size
    rows = M // W
    tiles_per_rank = rows // block_m
    col_tiles = N // col_tile
    units = tiles_per_rank * col_tiles

    @T.prim_func
    def gemm_rs_reduce(P: T.Tensor((2 * M, N), dtype), done: T.Tensor((M // block_m,), "uint64"),
                       C: T.Tensor((rows, N), dtype), staging: T.Tensor((blocks, block_m, col_tile), dtype),
                       counters: T.Tensor((blocks,), vectors.COUNTER)):
        with T.Kernel(blocks, threads=threads) as bid:
            acc = T.alloc_fragment((block_m, col_tile), "float32")
            e = T.call_number(counters)
            p0 = T.cast(e % 2, "int32") * M                   # this call's half of P
            me = T.get_rank()
            tx = T.get_thread_binding()
            for u in T.serial(T.ceildiv(units, blocks)):
                unit = u * blocks + bid
                if unit < units:
                    t = unit // col_tiles
                    c0 = (unit % col_tiles) * col_tile
                    rb = me * tiles_per_rank + t
                    r0 = p0 + rb * block_m                    # its rows in this call's half of P
                    T.clear(acc)
                    for j in T.serial(W):
                        s = (me + 2 * W - 1 - j) % W          # rank-1, rank-2, ..., rank
                        if tx == 0:
                            T.wait_until(done[rb], cmp="ge", value=e * per_block, src_pe=s)
                        T.sync_threads()
                        if T.peer_reachable(P, pe=s):          # this node: loads through the mapping
                            Ps = T.remote(P, pe=s)
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += Ps[r0 + i, c0 + k]
                        else:                                  # another node: an NVSHMEM get, then local loads
                            T.get_block(P[r0:r0 + block_m, c0:c0 + col_tile], staging[bid, :, :], src_pe=s)
                            for i, k in T.Parallel(block_m, col_tile):
                                acc[i, k] += staging[bid, i, k]
                    T.copy(acc, C[t * block_m, c0])

    return gemm_rs_reduce


def kernels(M: int, N: int, K_local: int, world_size: int, dtype: str, reduce_blocks: int = 20,
            config: GemmConfig | None = None) -> list:
    """[(jit function, args)] of the GEMM and the reduction :class:`GemmRS` compiles for this problem."""
    cfg = problem_config(M, N, K_local, world_size=world_size, op="gemm_rs", config=config)
    col_tile = 256 if N % 256 == 0 and cfg.block_m <= 128 else 128   # fp32 accumulator <= 128 x 256
    if N % col_tile:
        raise ValueError(f"N: got {N}, expected a multiple of 128")
    per_block = cfg.threads // 32 * (N // cfg.block_n)     # T.release_stores: one count per consumer warp
    return [(gemm_rs_gemm_kernel, (M, N, K_local, world_size, dtype, cfg.block_m, cfg.block_n, cfg.block_k,
                                   cfg.stages, cfg.threads, cfg.swizzle)),
            (gemm_rs_reduce_kernel, (M, N, world_size, per_block, reduce_blocks, dtype, cfg.block_m, col_tile))]


class GemmRS(Op):
    """``reduce_scatter(X_local @ W_local)`` for fixed shapes; collective to construct."""

    NAME, KERNEL = "GemmRS", "gemm_rs"
    GRAPH_SAFE = True     # both kernels count calls on the device (module docstring)

    def __init__(self, M: int, N: int, K_local: int, dtype, *, reduce_blocks: int = 20,
                 config: GemmConfig | None = None):
        import torch

        with self.arguments(M=M, N=N, K_local=K_local, dtype=dtype, reduce_blocks=reduce_blocks, config=config):
            check_problem("GemmRS", M, N, K_local, dtype, config, "K_local")
            checks.as_int("GemmRS", "reduce_blocks", reduce_blocks)
            try:
                sms = vectors.sm_count()
            except Exception:  # noqa: BLE001  (no GPU here: the construction fails later, after the agreement)
                sms = None
            if sms is not None and reduce_blocks >= sms:
                checks.fail("GemmRS", "reduce_blocks", repr(reduce_blocks), f"fewer than the {sms} SMs of this GPU "
                            "(the reduction's blocks wait while the GEMM runs, which needs SMs of its own)")
            [(gemm_fn, self.gemm_args), (reduce_fn, self.reduce_args)] = kernels(
                M, N, K_local, self.world_size, checks.dtype_name(dtype), reduce_blocks, config)
        self.block_m = self.gemm_args[5]
        self.M, self.N, self.K, self.dtype = M, N, K_local, dtype
        self.P = self.symmetric((2 * M, N), dtype)     # the partials of even calls, then of odd ones
        self.done = self.symmetric((M // self.block_m,), torch.uint64, zero=True)
        # where a peer's partial rows land before they are summed, for peers on other nodes (an NVSHMEM get's
        # local buffer must be symmetric, i.e. registered, to cross a network)
        blocks, col_tile = self.reduce_args[4], self.reduce_args[7]
        self.staging = self.symmetric((blocks, self.block_m, col_tile), dtype)
        self.stream = torch.cuda.Stream(priority=-1)
        self.gemm, _ = self.build(gemm_fn, self.gemm_args)
        self.reduce, _ = self.build(reduce_fn, self.reduce_args)
        tiles = (M // self.block_m) * -(-N // self.gemm_args[6])
        counters = self.call_counters(tiles + blocks)        # the GEMM's, then the reduction's
        self.gemm_counters, self.reduce_counters = counters[:tiles], counters[tiles:]

    def _validate(self, x, w, out) -> None:
        """The call checks (agreed across ranks): `x` (M, K_local), `w` (K_local, N) and `out` (M / W, N),
        all of the dtype on this GPU, handed to the kernels as they are: contiguous and 16-byte aligned."""
        d, dt = self.device, self.dtype
        checks.check_tensor("GemmRS", "x", x, shape=(self.M, self.K), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        checks.check_tensor("GemmRS", "w", w, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("GemmRS", "out", out, shape=(self.M // self.world_size, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="M / world_size rows")

    def call_key(self, x, w, out):
        return checks.signature(x, True), checks.signature(w, True), checks.signature(out, True)

    def __call__(self, x, w, out=None):
        import torch

        self.begin(x, w, out)
        main = torch.cuda.current_stream()
        c = out if out is not None else torch.empty(self.M // self.world_size, self.N, dtype=self.dtype,
                                                    device=x.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.reduce.launch(self.P, self.done, c, self.staging, self.reduce_counters)
        self.gemm.launch(x, w, self.P, self.done, self.gemm_counters)
        main.wait_stream(self.stream)
        if not _capturing():    # (a graph's memory is its own pool: nothing to tell the allocator)
            c.record_stream(self.stream)
        return c


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size):
    return GemmRS(M, N, K, dtype)


_fn_check = checks.CallCheck("gemm_rs")


def _validate_fn(x, w, W=None) -> None:
    checks.check_tensor("gemm_rs", "x", x, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("gemm_rs", "w", w, dtype=x.dtype, min_dims=2)
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        checks.fail("gemm_rs", "w", checks.describe(w), f"a 2-D ({x.shape[-1]}, N) tensor for x {tuple(x.shape)} "
                    "(2-D operands, inner sizes equal)")
    if W is not None and x.shape[0] % W:
        checks.fail("gemm_rs", "x", f"{x.shape[0]} rows", f"a multiple of the world size {W} (equal row slices)")


def gemm_rs(x, w):
    """``reduce_scatter(x @ w)`` over all ranks (see :class:`GemmRS`); builds and caches the op per shape.

    Any number of rows divisible by the world size: when the rows per rank are not a multiple of 128, each
    rank's slice of `x` is padded with zero rows (one copy of `x`; zero rows add nothing) and the padding
    rows of the result are dropped."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(x), checks.signature(w)), _validate_fn, x, w,
              rt.info.world_size if rt is not None else None)
    W = runtime.current().info.world_size
    (M, K), N = x.shape, w.shape[1]
    rows = M // W
    rp = padded_rows(rows)
    if rp == rows:
        return _cached(M, N, K, x.dtype, W)(x, w)
    x_p = x.new_zeros((W, rp, K))
    x_p[:, :rows].copy_(x.reshape(W, rows, K))
    return _cached(W * rp, N, K, x.dtype, W)(x_p.view(W * rp, K), w)[:rows]
