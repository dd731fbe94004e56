"""AllGather + GEMM, overlapped: ``C = AllGather(A) @ B`` with A sharded by rows.

torch equivalent (A_local: (M/W, K) on each rank, B: (K, N) local)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, A_local)
    C = A @ B

How it overlaps: the GEMM kernel starts at once on this rank's own rows while the other shards are
pulled over NVLink by the copy engines (no SM is taken from the GEMM); each GEMM tile waits only for the
chunk of rows it needs. Rows are computed in the order they arrive: own shard, then rank+1, rank+2, ...
A rank of another node (``TILESCALE_NODE_SIZE`` included, per :func:`tilescale.topology.current`) has
no peer view: its chunks are pulled with NVSHMEM's on-stream get (``nvshmemx_getmem_on_stream``) instead.

Signal protocol of one call. Flags are set to 1 by their one writer and reset to 0 by their one reader,
so no value depends on a count kept on the host: a call captured in a CUDA graph replays correctly, and
replays and eager calls may be interleaved. No barrier, and no flag that needs an SM: stream memory
operations (``cuStreamWaitValue64`` / ``cuStreamWriteValue64``), on a peer's flag through its mapping, or
NVSHMEM's on-stream signal (an add) for a rank of another node. ``ready[q]`` (symmetric, here): rank q's
slot of its ``A_full`` holds its shard of this call; ``freed[q]`` (symmetric, here): rank q has pulled my
slot of the last call (1 before the first call); ``arrived[q, chunk]`` (local): that chunk is here.

1. main stream: for every peer q, wait until ``freed[q] >= 1`` (q is done reading my slot), set it to 0;
2. main stream: copy A_local into my slot of ``A_full`` (symmetric), then set ``ready[me] = 1`` on every peer;
3. main stream: wait until ``ready[q] >= 1`` for every peer q (every slot holds this call's shard), then an
   event that the copy streams wait for. The GEMM starts after this: a pull from a rank on the same GPU
   (ranks sharing one) is a copy kernel, which would find every SM taken by the GEMM's waiting tiles if the
   GEMM were launched before the pull could start;
4. copy streams (one per peer src), after that event: set ``ready[src]`` to 0; for each chunk of src's
   shard a pull from src's ``A_full`` (a copy-engine copy from its peer view, or an on-stream NVSHMEM get
   from another node), then a stream write ``arrived[src, chunk] = 1`` (ordered after the pull); last,
   ``freed[me] = 1`` on src;
5. main stream: GEMM; a tile on rows of another rank first waits until ``arrived[src, chunk] >= 1``
   (acquire, system scope), then loads them with TMA;
6. main stream: joins the copy streams, then zeroes ``arrived`` (the next call's copy streams start after
   its step 3, so after this).

Each flag's set and reset alternate: my reset of ``ready[src]`` (4) precedes my ``freed`` signal to src, which
src's next set of ``ready[src]`` waits for (its 1, 2); my reset of ``freed[q]`` (1) precedes my ``ready``
signal to q, which q's next set of ``freed[q]`` waits for (its 3, 4).

How the host issues a call: steps 1-4 are one program of stream operations (:mod:`.stream_ops`, built once by
``AGGemm._plan``: the flag writes and waits, the copies, NVSHMEM's gets and signals and the events, in the
order above, each on its stream), issued by one call of the runtime shim; then the GEMM (5, through the
kernel's C entry point); then step 6, a second program. A non-contiguous `a_local` is copied by torch between
step 1 and the rest of the program; a profiled call issues the same steps one by one from Python.
"""

import tilescale
import tilescale.language as T

from ..profiler import session as profiling
from ..profiler.device_timeline import TILE_WORDS
from . import checks, op_cache
from . import stream_ops as so
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
                arrived: T.Tensor((W * chunks,), "uint64"), prof: Prof):
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
                T.wait_until(arrived[src * chunks + chunk], cmp="ge", value=1)
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
    GRAPH_SAFE = True     # flags set and reset on the device (module docstring): no per-call host state

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
        self.a_full = self.symmetric((M, K), dtype)
        self.ready = self.symmetric((W,), torch.uint64, zero=True)
        self.freed = self.symmetric((W,), torch.uint64, zero=True)
        self.freed.fill_(1)     # no peer reads my slot before the first call (a peer sets it only after that)
        torch.cuda.current_stream().synchronize()
        self.arrived = torch.zeros(W * self.chunks, dtype=torch.uint64, device=self.rt.device)
        self.streams = [torch.cuda.Stream(priority=-1) for _ in range(max(1, W - 1))]
        # a peer of this node: a torch view of its A_full (copy-engine pulls) and the addresses of its flags
        # (stream writes); of another node: None (NVSHMEM gets and signals)
        topo = topology.current()
        near = [topo.same_node(p, self.rank) and p != self.rank for p in range(W)]
        self._peers = [symm.peer_tensor(self.a_full, p) if near[p] else None for p in range(W)]
        # my word of a flag on rank p: through its mapping, or the symmetric address for NVSHMEM's signal
        self._flag_at = {name: [(symm.get_remote_ptr(f, p) if near[p] else f.data_ptr()) + 8 * self.rank
                                for p in range(W)] for name, f in (("ready", self.ready), ("freed", self.freed))}
        self._ready_here = [self.ready.data_ptr() + 8 * q for q in range(W)]     # rank q's word here
        self._freed_here = [self.freed.data_ptr() + 8 * q for q in range(W)]
        self._arrived_at = [self.arrived.data_ptr() + 8 * i for i in range(W * self.chunks)]
        self._slot = self.a_full[self.rank * self.rows:(self.rank + 1) * self.rows]   # my rows of A_full (step 2)
        self.kernel, self._direct = self.build(fn, self.args, ("A", "B", "C", "arrived"))
        self.launch_path = "direct" if self._direct is not None else "tilelang"  # how __call__ launches the GEMM
        self.kernel_prof = fn(*self.args, profile=True).prepare() if profile else None
        self.tiles = (M // self.args[6]) * -(-N // self.args[7])   # grid of the kernel: tile records
        # the gate of step 3 and a join per copy stream (step 6): made once, recorded once here (a CUDA event
        # exists from its first record), reused by every call (a wait sees the record made before it)
        self._gate, self._joins = torch.cuda.Event(), [torch.cuda.Event() for _ in self.streams]
        main = torch.cuda.current_stream()
        for e in (self._gate, *self._joins):
            e.record(main)
        main.synchronize()
        self._plan(a_full=self.a_full.data_ptr(), row_bytes=self.K * self.a_full.element_size(),
                   peer_at=[None if t is None else t.data_ptr() for t in self._peers],
                   streams=[s.cuda_stream for s in self.streams], gate=self._gate.cuda_event,
                   joins=[e.cuda_event for e in self._joins], arrived=self.arrived.data_ptr(),
                   arrived_bytes=self.arrived.nbytes)

    def _plan(self, *, a_full: int, row_bytes: int, peer_at: list, streams: list, gate: int, joins: list,
              arrived: int, arrived_bytes: int) -> None:
        """The host steps of a call (module docstring, 1-6) as programs of stream operations, issued by one shim
        call each (:mod:`.stream_ops`; stream 0: the caller's current stream, stream j: ``self.streams[j - 1]``),
        in the order of the steps: ``_pre`` (1-4: everything before the GEMM; the copy of `a_local` is op
        ``_copy_at``, whose source each call sets), or ``_pre_head`` (1), a torch copy, ``_pre_tail`` (2-4) when
        `a_local` is not contiguous; then the GEMM (5); ``_post`` (6). `a_full`, `peer_at` (a peer of this node:
        the address of its A_full; else None), `gate`, `joins`, `arrived`: raw addresses and handles."""
        W, r, rows, chunks = self.world_size, self.rank, self.rows, self.chunks
        peers = [(r + j) % W for j in range(1, W)]
        step = rows // chunks
        ops = []

        def add(kind, a, b=0, n=0, stream=0, pe=0):
            ops.append((kind, a, b, n, stream, pe))

        def signal(flag, pe, stream):     # my word of `flag` on rank pe := 1 (a stream write, or NVSHMEM's add)
            if peer_at[pe] is not None:
                add(so.WRITE, self._flag_at[flag][pe], 1, stream=stream)
            else:
                add(so.SIGNAL_ADD, self._flag_at[flag][pe], 1, stream=stream, pe=pe)

        for q in peers:                                                                        # 1
            add(so.WAIT_GEQ, self._freed_here[q], 1)
            add(so.WRITE, self._freed_here[q], 0)
        head = len(ops)
        add(so.COPY, a_full + r * rows * row_bytes, 0, rows * row_bytes)                       # 2 (source: a_local)
        for q in peers:
            signal("ready", q, 0)
        for q in peers:                                                                        # 3
            add(so.WAIT_GEQ, self._ready_here[q], 1)
        if peers:
            add(so.EVENT_RECORD, gate)
        for j, src in enumerate(peers):                                                        # 4
            s = j + 1
            add(so.EVENT_WAIT, gate, stream=s)
            add(so.WRITE, self._ready_here[src], 0, stream=s)
            for ch in range(chunks):
                off = (src * rows + ch * step) * row_bytes
                if peer_at[src] is not None:    # a copy-engine pull from the peer's A_full through its mapping
                    add(so.COPY, a_full + off, peer_at[src] + off, step * row_bytes, stream=s)
                else:   # NVSHMEM's get of the same rows of the peer's buffer (symmetric: one address on every rank)
                    add(so.GET, a_full + off, a_full + off, step * row_bytes, stream=s, pe=src)
                add(so.WRITE, self._arrived_at[src * chunks + ch], 1, stream=s)
            signal("freed", src, s)
        post = []
        for j in range(len(peers)):                                                            # 6
            post += [(so.EVENT_RECORD, joins[j], 0, 0, j + 1, 0), (so.EVENT_WAIT, joins[j], 0, 0, 0, 0)]
        post.append((so.ZERO, arrived, 0, arrived_bytes, 0, 0))

        def program(rows_):
            p = so.Program(streams)
            for kind, a, b, n, stream, pe in rows_:
                p.add(kind, a, b, n, stream=stream, pe=pe)
            return p.seal()

        self._pre, self._pre_head, self._pre_tail = program(ops), program(ops[:head]), program(ops[head + 1:])
        self._post = program(post)
        self._copy_at = head
        self._a_local_op = self._pre.array[head]       # a view into the program: its source is set per call
        self._stream_ops = getattr(self.rt.shim, "ts_stream_ops", None)
        self._launch_args = (a_full, arrived)    # the GEMM's A and arrived (direct launch)

    def gathered(self):
        """The gathered A of the last call (this op's buffer: the next call overwrites it)."""
        return self.a_full

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
        """``checks.signature(a_local), checks.signature(b, True), checks.signature(out, True)``, flattened into
        one tuple built inline (raises AttributeError for a non-tensor: Op.begin then runs the checks)."""
        return (type(a_local), a_local.dtype, a_local.shape, a_local.device,
                type(b), b.dtype, b.shape, b.device, b.is_contiguous(), b.data_ptr() & 15,
                None if out is None else (type(out), out.dtype, out.shape, out.device, out.is_contiguous(),
                                          out.data_ptr() & 15))

    def _signal(self, stream, flag: str, pe: int) -> None:
        """Set my word of `flag` (``ready`` / ``freed``) on rank `pe` to 1, ordered on `stream` (step 2 / 4)."""
        h = self.rt.shim
        if self._peers[pe] is not None:    # this node: a stream write through the mapping
            h.ts_stream_write_u64(stream, self._flag_at[flag][pe], 1)
        else:                              # another node: NVSHMEM's signal (the word is 0: an add sets it)
            h.ts_signal_add_on_stream(self._flag_at[flag][pe], 1, pe, stream)

    def __call__(self, a_local, b, out=None):
        m = self.begin(a_local, b, out)
        if profiling.current is not None:
            rec = profiling.call("AGGemm", "fused", M=self.M, N=self.N, K=self.K)
            if rec is not None:
                return self._call_steps(a_local, b, out, rec)
        fn = self._stream_ops
        if fn is None:     # a shim without ts_stream_ops
            return self._call_steps(a_local, b, out, None)
        if out is None:
            import torch

            out = torch.empty(self.M, self.N, dtype=self.dtype, device=a_local.device)
        if a_local.is_contiguous():                     # 1-4 in one shim call: the copy of a_local is a program op
            self._a_local_op.b = a_local.data_ptr()
            self._pre.run(fn, m, "AGGemm")
        else:                                           # 1, the copy by torch (any strides), 2-4
            self._pre_head.run(fn, m, "AGGemm")
            self._slot.copy_(a_local)
            self._pre_tail.run(fn, m, "AGGemm")
        direct = self._direct
        if direct is not None:                                                                 # 5
            a_at, arrived_at = self._launch_args
            if direct[0](a_at, b.data_ptr(), out.data_ptr(), arrived_at, m):
                raise self.launch_error()
        else:
            self.kernel.launch(self.a_full, b, out, self.arrived)
        self._post.run(fn, m, "AGGemm")                                                        # 6
        return out

    def _call_steps(self, a_local, b, out, rec):
        """A call step by step from Python (one torch / shim call per operation, the order of ``_plan``'s
        programs): the profiled call (`rec`: the profiler's hooks between the copies and around the GEMM)."""
        import torch

        main = torch.cuda.current_stream()
        W, r, shim = self.world_size, self.rank, self.rt.shim
        a_full, m = self.a_full, main.cuda_stream
        peers = [(r + j) % W for j in range(1, W)]
        for q in peers:                                                      # 1
            shim.ts_stream_wait_geq_u64(m, self._freed_here[q], 1)
            shim.ts_stream_write_u64(m, self._freed_here[q], 0)
        self._slot.copy_(a_local)                                            # 2
        for q in peers:
            self._signal(m, "ready", q)
        for q in peers:                                                      # 3
            shim.ts_stream_wait_geq_u64(m, self._ready_here[q], 1)
        gate = torch.cuda.Event()
        gate.record(main)
        c = out if out is not None else torch.empty(self.M, self.N, dtype=self.dtype, device=a_local.device)
        step = self.rows // self.chunks
        for j, src in enumerate(peers):                                      # 4
            s = self.streams[j]
            s.wait_event(gate)
            h = s.cuda_stream
            with torch.cuda.stream(s):
                if rec is not None:
                    rec.copies_begin(s, src)
                shim.ts_stream_write_u64(h, self._ready_here[src], 0)
                lo, peer = src * self.rows, self._peers[src]
                for ch in range(self.chunks):
                    rows = slice(lo + ch * step, lo + (ch + 1) * step)
                    if peer is not None:
                        a_full[rows].copy_(peer[rows], non_blocking=True)
                    else:   # the same rows of the peer's buffer (symmetric: one address on every rank)
                        chunk = a_full[rows]
                        shim.ts_getmem_on_stream(chunk.data_ptr(), chunk.data_ptr(), chunk.nbytes, src, h)
                    shim.ts_stream_write_u64(h, self._arrived_at[src * self.chunks + ch], 1)
                    if rec is not None:
                        rec.copy_done(s, src, ch, a_full[rows].nbytes)
                self._signal(h, "freed", src)
        if rec is None:                                                      # 5
            self.kernel.launch(a_full, b, c, self.arrived)
        else:  # LAUNCH (+ KERNEL, and WAIT/TILE from the instrumented kernel) events, then the call ends
            rec.launcher(self.kernel, instrumented=self.kernel_prof, tiles=self.tiles, end=True)(a_full, b, c,
                                                                                                self.arrived)
        for s in self.streams[:W - 1]:                                       # 6
            main.wait_stream(s)
        self.arrived.zero_()
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
    ``(c, all_gather(a_local))`` (the gathered A, a copy: the op's buffer is reused by its next call)."""
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
