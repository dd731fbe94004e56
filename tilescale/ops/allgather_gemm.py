"""AllGather + GEMM, overlapped: ``C = AllGather(A) @ B`` with A sharded by rows.

torch equivalent (A_local: (M/W, K) on each rank, B: (K, N) local)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, A_local)
    C = A @ B

How it overlaps: the GEMM kernel starts at once on this rank's own rows while the other shards are
pulled over NVLink by the copy engines (no SM is taken from the GEMM); each GEMM tile waits only for the
chunk of rows it needs. Rows are computed in the order they arrive: own shard, then rank+1, rank+2, ...
A rank of another node (``TILESCALE_NODE_SIZE`` included, per :func:`tilescale.topology.current`) has
no peer view: its chunks are pulled with NVSHMEM's on-stream get (``nvshmemx_getmem_on_stream``) instead.

Signal protocol of one call (epoch e = 1, 2, ...; buffers double-buffered by e % 2):

1. main stream: copy A_local into this rank's slot of ``A_full[e % 2]`` (symmetric);
2. main stream: NVSHMEM barrier of all ranks (every slot of epoch e is written, and every rank is past
   the GEMM of epoch e - 1, which read the other buffer);
3. copy streams (one per peer): for each chunk of each peer's shard, a pull of the chunk from the
   peer's ``A_full[e % 2]`` (a copy-engine copy from its peer view, or an on-stream NVSHMEM get from
   another node), then a stream write ``arrived[peer, chunk] = e`` (ordered after the pull on that
   stream);
4. main stream: GEMM; a tile on rows of another rank first waits until ``arrived[src, chunk] >= e``
   (acquire, system scope), then loads them with TMA;
5. main stream joins the copy streams.
"""

import tilescale
import tilescale.language as T

from ..profiler import session as profiling
from ..profiler.device_timeline import TILE_WORDS
from . import checks, op_cache
from .base import Op
from .gemm import GemmConfig, check_problem, padded_rows, problem_config, tile_buffers, tile_loop

__all__ = ["AGGemm", "ag_gemm"]


@tilescale.jit
def ag_gemm_kernel(M: int, N: int, K: int, world_size: int, chunks: int, dtype: str = "bfloat16",
                   block_m: int = 128, block_n: int = 256, block_k: int = 64, stages: int = 3, threads: int = 256,
                   swizzle: int = 10, profile: bool = False):
    """The GEMM of :class:`AGGemm`: `C = A_full @ B`, tiles of other ranks' rows wait for their chunk.

    `profile=True` adds a last argument `prof` (uint64, TILE_WORDS per tile of the grid) where thread 0 of
    each tile writes its record (tilescale.profiler.device_timeline.TILE_FIELDS: entry, signal observed
    and end timestamps, SM, source rank, chunk, row and column tile); `profile=False` generates the same
    code as a kernel without the option (tests/test_profiler.py checks it against a snapshot)."""
    W = world_size
    tiles_m = M // block_m
    tiles_per_rank = tiles_m // W
    rows_per_chunk = (M // W) // chunks
    tiles_n = (N + block_n - 1) // block_n
    Prof = T.Tensor((tiles_m * tiles_n * TILE_WORDS,), "uint64") if profile else None

    @T.prim_func
    def ag_gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
                arrived: T.Tensor((W * chunks,), "uint64"), epoch: T.uint64, prof: Prof):
        with T.Kernel(T.ceildiv(N, block_n), tiles_m, threads=threads) as (bx, by):
            As, Bs, Cl, Cs = tile_buffers(block_m, block_n, block_k, dtype, swizzle)
            me = T.get_rank()
            rb = (by + me * tiles_per_rank) % tiles_m      # own rows first, then rank+1, rank+2, ...
            src = rb // tiles_per_rank
            chunk = (rb % tiles_per_rank) * block_m // rows_per_chunk
            if profile:
                slot = (by * tiles_n + bx) * TILE_WORDS
                if T.get_thread_binding() == 0:
                    prof[slot] = T.timestamp()
            if src != me:
                T.wait_until(arrived[src * chunks + chunk], cmp="ge", value=epoch)
            if profile:
                if T.get_thread_binding() == 0:
                    prof[slot + 1] = T.timestamp()
                    for i, v in enumerate((T.smid(), src, chunk, rb, bx)):
                        prof[slot + 3 + i] = T.cast(v, "uint64")
            tile_loop(A, B, C, As, Bs, Cl, Cs, rb, bx, stages, False)
            if profile:
                if T.get_thread_binding() == 0:
                    prof[slot + 2] = T.timestamp()

    return ag_gemm


def kernels(M: int, N: int, K: int, world_size: int, dtype: str, chunks: int | None = None,
            config: GemmConfig | None = None) -> list:
    """[(jit function, args)] of the kernel :class:`AGGemm` compiles for this problem."""
    cfg = problem_config(M, N, K, world_size=world_size, op="ag_gemm", config=config)
    tiles_per_rank = M // world_size // cfg.block_m
    chunks = chunks or 4
    while tiles_per_rank % chunks:
        chunks -= 1
    return [(ag_gemm_kernel, (M, N, K, world_size, chunks, dtype, cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages,
                              cfg.threads, cfg.swizzle))]


class AGGemm(Op):
    """``C = all_gather(A_local) @ B`` for fixed shapes; collective to construct.

    `M` is the gathered row count (W x rows per rank). ``op(a_local, b)`` returns C (a new tensor unless
    `out=` is given). The gathered A of the last call stays in ``op.gathered()``. `profile` (default
    TILESCALE_PROFILE_DEVICE) also builds the kernel with in-kernel timestamps, used while a
    tilescale.profiler session records WAIT/TILE events.
    """

    NAME, KERNEL = "AGGemm", "ag_gemm"

    def __init__(self, M: int, N: int, K: int, dtype, *, chunks: int | None = None, config: GemmConfig | None = None,
                 profile: bool | None = None):
        import torch

        from .. import symm, topology
        from ..env import settings

        with self.arguments(M=M, N=N, K=K, dtype=dtype, chunks=chunks, config=config, profile=profile) as agreed:
            profile = settings.profile_device if profile is None else profile
            check_problem("AGGemm", M, N, K, dtype, config, "K")
            checks.as_int("AGGemm", "chunks", chunks, allow_none=True)
            if not isinstance(profile, bool) and profile not in (0, 1):
                checks.fail("AGGemm", "profile", checks.describe(profile), "a bool (or None: TILESCALE_PROFILE_DEVICE)",
                            type_error=True)
            agreed["profile"] = profile = bool(profile)
            [(fn, args)] = kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config)
        W, self.args = self.world_size, args
        self.M, self.N, self.K, self.dtype = M, N, K, dtype
        self.rows = M // W
        self.chunks = self.args[4]
        self.a_full = [self.symmetric((M, K), dtype) for _ in range(2)]
        self.arrived = torch.zeros(W * self.chunks, dtype=torch.uint64, device=self.rt.device)
        self.streams = [torch.cuda.Stream(priority=-1) for _ in range(max(1, W - 1))]
        # a peer of this node: a torch view of its buffer (copy-engine pulls); of another node: None (gets)
        topo = topology.current()
        self._peers = [[symm.peer_tensor(a, p) if topo.same_node(p, self.rank) and p != self.rank else None
                        for p in range(W)] for a in self.a_full]
        self.kernel, _ = self.build(fn, self.args)
        self.kernel_prof = fn(*self.args, profile=True).prepare() if profile else None
        self.tiles = (M // self.args[6]) * -(-N // self.args[7])   # grid of the kernel: tile records

    def gathered(self):
        return self.a_full[self.epoch % 2]

    def _validate(self, a_local, b, out) -> None:
        """The call checks (agreed across ranks): `a_local` (rows, K) of the dtype on this GPU (any strides:
        copied into the gathered buffer); `b` (K, N) and `out` (M, N) handed to the kernel as they are:
        contiguous and 16-byte aligned (TMA)."""
        d, dt = self.device, self.dtype
        checks.check_tensor("AGGemm", "a_local", a_local, shape=(self.rows, self.K), dtype=dt, device=d,
                            what="M / world_size rows")
        checks.check_tensor("AGGemm", "b", b, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("AGGemm", "out", out, shape=(self.M, self.N), dtype=dt, device=d, contiguous=True,
                                aligned=True)

    def call_key(self, a_local, b, out):
        return checks.signature(a_local), checks.signature(b, True), checks.signature(out, True)

    def __call__(self, a_local, b, out=None):
        import ctypes

        import torch

        self.begin(a_local, b, out)
        main = torch.cuda.current_stream()
        self.epoch += 1
        rec = profiling.call("AGGemm", "fused", M=self.M, N=self.N, K=self.K) if profiling.current is not None else None
        e, p, W, r = self.epoch, self.epoch % 2, self.world_size, self.rank
        a_full = self.a_full[p]
        a_full[r * self.rows:(r + 1) * self.rows].copy_(a_local)
        c = out if out is not None else torch.empty(self.M, self.N, dtype=self.dtype, device=a_local.device)
        # The barrier runs on the main stream, before the GEMM: a GEMM whose blocks spin on the GPU must
        # not be able to take the SMs that a kernel it waits for (the barrier) would need.
        self.rt.barrier(main)
        evb = torch.cuda.Event()
        evb.record(main)
        step = self.rows // self.chunks
        shim = self.rt.shim
        for j in range(1, W):
            src = (r + j) % W
            s = self.streams[j - 1]
            s.wait_event(evb)
            with torch.cuda.stream(s):
                if rec is not None:
                    rec.copies_begin(s, src)
                lo = src * self.rows
                for ch in range(self.chunks):
                    rows = slice(lo + ch * step, lo + (ch + 1) * step)
                    peer = self._peers[p][src]
                    if peer is not None:
                        a_full[rows].copy_(peer[rows], non_blocking=True)
                    else:   # the same rows of the peer's buffer (symmetric: one address on every rank)
                        chunk = a_full[rows]
                        shim.ts_getmem_on_stream(ctypes.c_void_p(chunk.data_ptr()), ctypes.c_void_p(chunk.data_ptr()),
                                                 chunk.nbytes, src, ctypes.c_void_p(s.cuda_stream))
                    shim.ts_stream_write_u64(ctypes.c_void_p(s.cuda_stream),
                                             ctypes.c_void_p(self.arrived[src * self.chunks + ch:].data_ptr()), e)
                    if rec is not None:
                        rec.copy_done(s, src, ch, a_full[rows].nbytes)
        if rec is None:
            self.kernel.launch(a_full, b, c, self.arrived, e)
        else:  # LAUNCH (+ KERNEL, and WAIT/TILE from the instrumented kernel) events, then the call ends
            rec.launcher(self.kernel, instrumented=self.kernel_prof, tiles=self.tiles, end=True)(a_full, b, c,
                                                                                                self.arrived, e)
        for s in self.streams[:W - 1]:
            main.wait_stream(s)
        return c


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size):
    return AGGemm(M, N, K, dtype)


_fn_check = checks.CallCheck("ag_gemm")


def _validate_fn(a_local, b) -> None:
    checks.check_tensor("ag_gemm", "a_local", a_local, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("ag_gemm", "b", b, dtype=a_local.dtype, min_dims=2)
    if a_local.dim() != 2 or b.dim() != 2 or a_local.shape[1] != b.shape[0]:
        checks.fail("ag_gemm", "b", checks.describe(b), f"a 2-D ({a_local.shape[-1]}, N) tensor for a_local "
                    f"{tuple(a_local.shape)} (2-D operands, inner sizes equal)")


def ag_gemm(a_local, b, *, return_gathered: bool = False):
    """``all_gather(a_local) @ b`` (see :class:`AGGemm`); builds and caches the op per shape.

    Any number of rows: a shard whose rows are not a multiple of 128 runs as a shard padded with zero rows
    (one copy of the shard), whose results are dropped (one copy of C). ``return_gathered=True`` returns
    ``(c, all_gather(a_local))`` (the gathered A, a copy: the op's buffer is reused two calls later)."""
    from .. import runtime

    _fn_check((checks.signature(a_local), checks.signature(b)), _validate_fn, a_local, b)
    W = runtime.current().info.world_size
    (rows, K), N = a_local.shape, b.shape[1]
    rp = padded_rows(rows)
    op = _cached(rp * W, N, K, a_local.dtype, W)
    if rp == rows:
        c = op(a_local, b)
        return (c, op.gathered().clone()) if return_gathered else c
    a_p = a_local.new_empty((rp, K))
    a_p[:rows].copy_(a_local)
    a_p[rows:].zero_()
    c = op(a_p, b).view(W, rp, N)[:, :rows].reshape(W * rows, N)
    if not return_gathered:
        return c
    return c, op.gathered().view(W, rp, K)[:, :rows].reshape(W * rows, K)
