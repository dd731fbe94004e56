"""AllGather + GEMM, overlapped: ``C = AllGather(A) @ B`` with A sharded by rows.

torch equivalent (A_local: (M/W, K) on each rank, B: (K, N) local)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, A_local)
    C = A @ B

How it overlaps: communication starts when the call starts and runs beside the GEMM. The GEMM starts at once on
this rank's own rows, read where they are (`a_local`); a second launch of the GEMM computes the other ranks' rows
in the order they arrive (rank+1's first, then rank+2's, ...), each tile waiting only for its chunk of rows. Two
protocols move the rows, chosen by topology (:func:`protocol_for`). At world size 1 the call is the first GEMM
alone, on `a_local`.

Push (two ranks on two GPUs of this node: every copy runs on a copy engine, no SM is taken from the GEMM).
Flags: ``arrived[q, chunk]`` (symmetric, here): rank q's chunk is in my ``A_full``; ``freed[q]`` (symmetric,
here): rank q has read my rows of its ``A_full`` of the last call and zeroed its ``arrived`` (1 before the first
call). Each is set to 1 by its one writer and reset by its one reader.

1. main stream: an event ``start`` (after the work enqueued before the call);
2. the copy stream, from ``start``, for dst = rank-1, rank-2, ... (dst reads my rows first when I am its rank+1):
   wait until ``freed[dst] >= 1``, set it to 0;
3. for each chunk of my rows: a copy-engine copy from `a_local` into dst's ``A_full`` through its mapping, then a
   stream write ``arrived[me, chunk] = 1`` on dst (ordered after the copy); last, an event ``pushed``;
4. main stream: the GEMM of my own rows from `a_local`;
5. main stream: the GEMM of the other ranks' rows from ``A_full``; a tile first waits until
   ``arrived[src, chunk] >= 1`` (acquire, system scope);
6. main stream: wait for ``pushed`` (the call ends after its reads of `a_local`), zero ``arrived``, then
   ``freed[me] = 1`` on every peer.

My rows are not copied into my own ``A_full`` by the call (a copy within one GPU needs SMs): ``gathered()`` copies
them in when asked. A non-contiguous (or not 16-byte aligned) `a_local` is copied into my rows of ``A_full`` by
torch on the main stream first and pushed from there. Unlike pulling (below), no copy kernel of my rows competes
with the first GEMM for SMs before the peers may read them.

Pull (a peer shares this rank's GPU, or is on another node). This rank's shard is copied into its slot of the
symmetric gathered buffer (``A_full``), where peers pull it from, and the copy engines pull the other shards over
NVLink one peer after another (rank+1, rank+2, ...). A rank of another node (``TILESCALE_NODE_SIZE`` included, per
:func:`tilescale.topology.current`) has no peer view: its chunks come by NVSHMEM's on-stream get
(``nvshmemx_getmem_on_stream``).

Signal protocol of a pull call. Flags are set to 1 by their one writer and reset to 0 by their one reader, so no
value depends on a count kept on the host: a call captured in a CUDA graph replays correctly, and replays and
eager calls may be interleaved. No barrier, and no flag that needs an SM: stream memory operations
(``cuStreamWaitValue64`` / ``cuStreamWriteValue64``), on a peer's flag through its mapping, or NVSHMEM's on-stream
signal (an add) for a rank of another node. ``ready[q]`` (symmetric, here): rank q's slot of its ``A_full``
holds its shard of this call; ``freed[q]`` (symmetric, here): rank q has pulled my slot of the last call (1 before
the first call); ``arrived[q, chunk]`` (local): that chunk is here. An event ``start`` on the main stream marks
the call's start (after the work enqueued before it).

1. main stream: the GEMM of my own rows, ``C[my rows] = a_local @ B`` (TMA loads from `a_local` itself);
2. local stream, from ``start``: for every peer q, wait until ``freed[q] >= 1`` (q is done reading my slot), set
   it to 0; copy a_local into my slot of ``A_full``, then set ``ready[me] = 1`` on every peer; then an event
   (``copied``);
3. main stream, after 1: wait for ``copied``: the copy is a copy kernel (a copy within one GPU takes SMs), which
   peers wait for, so it must not be left behind the second GEMM's waiting tiles;
4. copy stream j (one per peer src = rank + 1 + j), from ``start`` and, for j > 0, once stream j - 1 has pulled
   (its event ``pulled``): wait until ``ready[src] >= 1``, set it to 0; for each chunk of src's shard a pull from
   src's ``A_full`` (a copy-engine copy from its peer view, or an on-stream NVSHMEM get from another node), then
   a stream write ``arrived[src, chunk] = 1`` (ordered after the pull); record ``pulled``; last, ``freed[me] = 1``
   on src. A pull that needs an SM must end before step 5 (:func:`pulls_needing_sms`; step 3 also waits for its
   copy stream's join event): from a src on this rank's own GPU (ranks sharing one: a copy kernel), or from one
   NVSHMEM has no mapping to (its on-stream get launches a one-thread proxy kernel). Were such a copy still to
   come, the second GEMM's waiting tiles could hold every SM and it would never start;
5. main stream: the GEMM of the other ranks' rows from ``A_full``; a tile first waits until
   ``arrived[src, chunk] >= 1`` (acquire, system scope), then loads them with TMA;
6. main stream: joins the copy streams and the local stream, then zeroes ``arrived`` (the next call's copy
   streams start after its ``start``, so after this).

Each flag's set and reset alternate: my reset of ``ready[src]`` (4) precedes my ``freed`` signal to src, which
src's next set of ``ready[src]`` waits for (its 2); my reset of ``freed[q]`` (2) precedes my ``ready`` signal to
q, which q's next reset of ``ready[me]`` waits for (its 4).

How the host issues a call: the ``start`` event, step 4 and step 2 are one program of stream operations
(:mod:`.stream_ops`, built once by ``AGGemm._plan``, each operation on its stream), issued by one call of the
runtime shim; then the first GEMM (1, through the kernel's C entry point); step 3 (a second program); the second
GEMM (5); step 6 (a third program). A non-contiguous (or not 16-byte aligned) `a_local` is copied into my slot by
torch on the main stream first (after step 2's waits), and the first GEMM reads it there; a profiled call issues
the same steps one by one from Python.
"""
from ..profiler import session as profiling
from . import checks, op_cache, vectors
from . import stream_ops as so
from .ag_gemm_kernel import (  # noqa: F401  (re-exported)
    PULL_MAX_CHUNKS,
    PULL_MIN_BYTES,
    ag_gemm_kernel,
    grid_plan,
    kernel_plan,
    kernels,
    pull_chunks,
)
from .base import Op
from .gemm import GemmConfig, check_problem, padded_rows, split_workspace

__all__ = ["AGGemm", "ag_gemm"]


def pulls_needing_sms(world_size: int, rank: int, same_gpu, mapped) -> list[bool]:
    """Per rank p, whether this rank's pull of p's shard needs an SM (step 4 of the module docstring), so that it must
    end before the second GEMM's tiles, which wait for it, take every SM: p on this rank's GPU (``same_gpu(p)``: a copy
    within one GPU is a copy kernel), or p not mapped here (``mapped(p)`` False: NVSHMEM's on-stream get from a peer
    without a load/store mapping launches a one-thread proxy kernel, NVSHMEM's ``nvshmemi_proxy_rma_launcher``). A
    mapped peer on another GPU is pulled by a copy engine. False for `rank` itself."""
    return [p != rank and (same_gpu(p) or not mapped(p)) for p in range(world_size)]


def protocol_for(world_size: int, rank: int, near, same_gpu) -> str:
    """"push" for two ranks on two GPUs of this node (``near[p]``: mapped here; ``same_gpu(p)``: on this rank's GPU),
    where every copy runs on a copy engine; else "pull" (module docstring). Not yet at 3 or more ranks: on 4
    distinct H200s a rank's second push never reached its peer, whose second GEMM waited until
    TILESCALE_WAIT_TIMEOUT_S (docs/ag-gemm-overlap.md)."""
    others = [p for p in range(world_size) if p != rank]
    return "push" if world_size == 2 and all(near[p] and not same_gpu(p) for p in others) else "pull"



class AGGemm(Op):
    """``C = all_gather(A_local) @ B`` for fixed shapes; collective to construct.

    `M` is the gathered row count (W x rows per rank). ``op(a_local, b)`` returns C (a new tensor unless
    `out=` is given). The gathered A of the last call stays in ``op.gathered()``. `fused` (default: the committed
    table, tilescale/ops/fused_paths.py): False runs NCCL's AllGather then cuBLAS, where the fused kernel is slower
    (small M); ``op.fused`` says which path the op takes. `profile` (default
    TILESCALE_PROFILE_DEVICE) also builds the kernels with in-kernel timestamps, used while a
    tilescale.profiler session records WAIT/TILE events.
    """

    NAME, KERNEL = "AGGemm", "ag_gemm"
    GRAPH_SAFE = True     # flags set and reset on the device (module docstring): no per-call host state

    def __init__(self, M: int, N: int, K: int, dtype, *, chunks: int | None = None, config: GemmConfig | None = None,
                 profile: bool | None = None, fused: bool | None = None):
        import torch

        from ..env import settings
        from ..runtime import symm, topology
        from . import fused_paths
        from .gemm import current_gpu

        with self.arguments(M=M, N=N, K=K, dtype=dtype, chunks=chunks, config=config, profile=profile,
                            fused=fused) as agreed:
            if fused is None:   # the table's path, decided before any check can fail on this rank alone, so that
                # a rank with a bad argument and one without still agree on it (only the bad argument is named)
                agreed["fused"] = fused = fused_paths.choose("ag_gemm", M, N, K, self.rt.info, current_gpu()) == "fused"
            if not isinstance(fused, bool):
                checks.fail("AGGemm", "fused", checks.describe(fused), "a bool (or None: the committed table, "
                            "tilescale/ops/fused_paths.json)", type_error=True)
            profile = settings.profile_device if profile is None else profile
            check_problem("AGGemm", M, N, K, dtype, config, "K")
            checks.as_int("AGGemm", "chunks", chunks, allow_none=True)
            if not isinstance(profile, bool) and profile not in (0, 1):
                checks.fail("AGGemm", "profile", checks.describe(profile), "a bool (or None: TILESCALE_PROFILE_DEVICE)",
                            type_error=True)
            agreed["profile"] = profile = bool(profile)
            kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config, 0)   # its errors: agreed
            self.fused = fused
        self.M, self.N, self.K, self.dtype = M, N, K, dtype
        self.rows = M // self.world_size
        if not self.fused:    # NCCL then cuBLAS (tilescale/ops/fused_paths.py): no kernel, no symmetric buffer
            self.launch_path, self._full = "unfused", None
            return
        # the SM count (the last waves' split) read once every rank's arguments agreed: no rank queries its GPU, and
        # maybe fails alone, before the others learn whether the call was valid
        jobs = kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config, vectors.sm_count())
        W, (fn, self.args) = self.world_size, jobs[-1]
        self.chunks = self.args[4]
        self._last_a = None       # world size 1: the a_local of the last call (gathered())
        # the grids of the GEMM of my rows (step 1) and of the others' (step 5; world size > 1); a split one takes
        # its workspace after its other arguments (`_tail[i]`, () when not split)
        self.plans = [kernel_plan(a) for _, a in jobs]
        self.tail = [split_workspace(p, *a[6:8], device=self.rt.device) if p.split > 1 else ()
                      for p, (_, a) in zip(self.plans, jobs, strict=True)]
        tail = [("work", "tail_arrived", "tail_fixed")[:len(ws)] for ws in self.tail]
        self.compile_ahead(jobs + ([(fn, a[:-3], dict(profile=True, own=a[-2], sms=a[-1])) for _, a in jobs]
                                   if profile else []))   # every kernel of the op side by side; build() takes them
        self.kernel_own, self._direct_own = self.build(fn, jobs[0][1], ("A", "B", "C", *tail[0]))
        self.kernel, self._direct = (self.build(fn, self.args, ("A", "B", "C", "arrived", *tail[1])) if W > 1
                                     else (None, None))
        self._tail_ptrs = [tuple(t.data_ptr() for t in ws) for ws in self.tail]
        self.launch_path = "direct" if self._direct_own is not None else "tilelang"  # how __call__ launches
        # the same kernels with timestamps (args: ..., profile, own, sms), and their blocks (one record each)
        self.kernels_prof = ([fn(*a[:-3], profile=True, own=a[-2], sms=a[-1]).prepare() for _, a in jobs] if profile
                             else None)
        self.tiles = [p.blocks for p in self.plans] + [0] * (2 - len(self.plans))
        if W == 1:
            return
        self.a_full = self.symmetric((M, K), dtype)
        self.ready = self.symmetric((W,), torch.uint64, zero=True)
        self.freed = self.symmetric((W,), torch.uint64, zero=True)
        self.freed.fill_(1)     # no peer reads my slot before the first call (a peer sets it only after that)
        torch.cuda.current_stream().synchronize()
        # written by the peers (push) or by this rank's copy streams (pull): symmetric for the first
        self.arrived = self.symmetric((W * self.chunks,), torch.uint64, zero=True)
        # a peer of this node: a torch view of its A_full (copy-engine copies) and the addresses of its flags
        # (stream writes); of another node: None (NVSHMEM gets and signals)
        topo = topology.current()
        near = [topo.same_node(p, self.rank) and p != self.rank for p in range(W)]
        same_gpu = self.rt.info.same_gpu
        self.protocol = protocol_for(W, self.rank, near, same_gpu)
        # push: one copy stream; pull: a copy stream per peer (step 4), then the local stream (step 2)
        self.streams = [torch.cuda.Stream(priority=-1) for _ in range(1 if self.protocol == "push" else W)]
        # pulls that need an SM are done before the second GEMM (step 4)
        shim, at = self.rt.shim, self.a_full.data_ptr()
        self._pull_first = pulls_needing_sms(W, self.rank, same_gpu, lambda p: near[p] or bool(shim.ts_ptr(at, p)))
        self._peers = [symm.peer_tensor(self.a_full, p) if near[p] else None for p in range(W)]
        # my word of a flag on rank p: through its mapping, or the symmetric address for NVSHMEM's signal
        self._flag_at = {name: [(symm.get_remote_ptr(f, p) if near[p] else f.data_ptr()) + 8 * self.rank
                                for p in range(W)] for name, f in (("ready", self.ready), ("freed", self.freed))}
        # push: rank p's arrived flags of my chunks, through its mapping
        self._arrived_on = [symm.get_remote_ptr(self.arrived, p) + 8 * self.rank * self.chunks if near[p] else None
                            for p in range(W)]
        self._ready_here = [self.ready.data_ptr() + 8 * q for q in range(W)]     # rank q's word here
        self._freed_here = [self.freed.data_ptr() + 8 * q for q in range(W)]
        self._arrived_at = [self.arrived.data_ptr() + 8 * i for i in range(W * self.chunks)]
        self._slot = self.a_full[self.rank * self.rows:(self.rank + 1) * self.rows]   # my rows of A_full (step 2)
        # the events of the steps: made once, recorded once here (a CUDA event exists from its first record), reused
        # by every call (a wait sees the record made before it): the call's start, step 2's copy, a join per copy
        # stream and the local stream (step 6), and step 4's ``pulled`` per copy stream but the last
        self._start, self._copied = torch.cuda.Event(), torch.cuda.Event()
        self._joins = [torch.cuda.Event() for _ in self.streams]
        self._pulled = [torch.cuda.Event() for _ in range(W - 2)]
        main = torch.cuda.current_stream()
        for e in (self._start, self._copied, *self._joins, *self._pulled):
            e.record(main)
        main.synchronize()
        self._slot_stale = False    # push: my rows of A_full not copied in by the last call (gathered() does it)
        self._stream_ops = getattr(self.rt.shim, "ts_stream_ops", None)
        if self.protocol == "push":
            self._plan_push()
            return
        self._plan(a_full=self.a_full.data_ptr(), row_bytes=self.K * self.a_full.element_size(),
                   peer_at=[None if t is None else t.data_ptr() for t in self._peers],
                   streams=[s.cuda_stream for s in self.streams],
                   events=dict(start=self._start.cuda_event, copied=self._copied.cuda_event),
                   joins=[e.cuda_event for e in self._joins], pulled=[e.cuda_event for e in self._pulled],
                   arrived=self.arrived.data_ptr(), arrived_bytes=self.arrived.nbytes)

    def _plan_push(self) -> None:
        """The push protocol's programs (module docstring, "Push"): ``_first`` (the call's start, then steps 2-3 on
        the copy stream; the source of each copy, ``_push_at[i]``, set per call to the call's rows) and
        ``_post`` (step 6)."""
        W, r, rows, chunks = self.world_size, self.rank, self.rows, self.chunks
        step_bytes = rows // chunks * self.K * self.a_full.element_size()
        row_bytes = self.K * self.a_full.element_size()
        first = so.Program([s.cuda_stream for s in self.streams])
        first.add(so.EVENT_RECORD, self._start.cuda_event)                                   # 1
        first.add(so.EVENT_WAIT, self._start.cuda_event, stream=1)
        pushes = []               # (op index, byte offset in the call's rows)
        for j in range(1, W):                                                                # 2, 3
            dst = (r - j) % W     # rank-1 first: it reads my rows first (its rank+1)
            first.add(so.WAIT_GEQ, self._freed_here[dst], 1, stream=1, label=_label("freed", dst))
            first.add(so.WRITE, self._freed_here[dst], 0, stream=1)
            at = self._peers[dst].data_ptr() + r * rows * row_bytes
            for ch in range(chunks):
                i = first.add(so.COPY, at + ch * step_bytes, 0, step_bytes, stream=1)
                pushes.append((i, ch * step_bytes))
                first.add(so.WRITE, self._arrived_on[dst] + 8 * ch, 1, stream=1)
        first.add(so.EVENT_RECORD, self._joins[0].cuda_event, stream=1)
        post = so.Program([s.cuda_stream for s in self.streams])
        post.add(so.EVENT_WAIT, self._joins[0].cuda_event)                                   # 6
        post.add(so.ZERO, self.arrived.data_ptr(), 0, self.arrived.nbytes)
        for q in range(W):
            if q != r:
                post.add(so.WRITE, self._flag_at["freed"][q], 1)
        self._first, self._post = first.seal(), post.seal()
        self._push_at = [(first.array[i], off) for i, off in pushes]   # views into the program, set per call

    def _plan(self, *, a_full: int, row_bytes: int, peer_at: list, streams: list, events: dict, joins: list,
              pulled: list, arrived: int, arrived_bytes: int) -> None:
        """The host steps of a call (module docstring) as programs of stream operations, issued by one shim call
        each (:mod:`.stream_ops`; stream 0: the caller's current stream, stream j: ``self.streams[j - 1]``: a copy
        stream per peer, then the local stream), in the order of the steps:
        ``_first`` (the call's start, the pulls of 4 and the copy of 2, whose source is op ``_copy_at``, set per
        call), or, when `a_local` is not contiguous, ``_local_head`` (2's waits, on the main stream), a torch copy,
        ``_local_tail`` (the rest of 2, then what ``_first`` issues but 2); then the first GEMM (1); ``_pre``
        (3); the second GEMM (5); ``_post`` (6). `a_full`, `peer_at` (a peer of this node: the address of its
        A_full; else None), `events` (start, copied), `joins`, `pulled`, `arrived`: raw addresses and handles."""
        W, r, rows, chunks = self.world_size, self.rank, self.rows, self.chunks
        peers = [(r + j) % W for j in range(1, W)]
        step = rows // chunks
        local = W          # the local stream's index
        ops = []

        def add(kind, a, b=0, n=0, stream=0, pe=0, label=None):
            ops.append((kind, a, b, n, stream, pe, label))

        def signal(flag, pe, stream):     # my word of `flag` on rank pe := 1 (a stream write, or NVSHMEM's add)
            if peer_at[pe] is not None:
                add(so.WRITE, self._flag_at[flag][pe], 1, stream=stream)
            else:
                add(so.SIGNAL_ADD, self._flag_at[flag][pe], 1, stream=stream, pe=pe)

        def local_steps(stream):                                                               # 2
            for q in peers:
                add(so.WAIT_GEQ, self._freed_here[q], 1, stream=stream, label=_label("freed", q))
                add(so.WRITE, self._freed_here[q], 0, stream=stream)
            head = len(ops)
            add(so.COPY, a_full + r * rows * row_bytes, 0, rows * row_bytes, stream=stream)  # (source: a_local)
            for q in peers:
                signal("ready", q, stream)
            add(so.EVENT_RECORD, events["copied"], stream=stream)
            return head

        def begin():               # the call's start; 4 on the copy streams from there
            add(so.EVENT_RECORD, events["start"])
            for j, src in enumerate(peers):                                                    # 4
                s = j + 1
                add(so.EVENT_WAIT, events["start"], stream=s)
                if j:       # one peer after another: the pulls share the copy engines' bandwidth less
                    add(so.EVENT_WAIT, pulled[j - 1], stream=s)
                add(so.WAIT_GEQ, self._ready_here[src], 1, stream=s, label=_label("ready", src))
                add(so.WRITE, self._ready_here[src], 0, stream=s)
                for ch in range(chunks):
                    off = (src * rows + ch * step) * row_bytes
                    if peer_at[src] is not None:    # a copy-engine pull from the peer's A_full through its mapping
                        add(so.COPY, a_full + off, peer_at[src] + off, step * row_bytes, stream=s)
                    else:   # NVSHMEM's get of the same rows of the peer's buffer (symmetric: one address on every rank)
                        add(so.GET, a_full + off, a_full + off, step * row_bytes, stream=s, pe=src)
                    add(so.WRITE, self._arrived_at[src * chunks + ch], 1, stream=s)
                if j < W - 2:
                    add(so.EVENT_RECORD, pulled[j], stream=s)
                signal("freed", src, s)
                if self._pull_first[src]:      # a pull that needs an SM: 3 waits for it
                    add(so.EVENT_RECORD, joins[j], stream=s)

        begin()
        add(so.EVENT_WAIT, events["start"], stream=local)
        head = local_steps(local)
        first, ops = ops, []
        head_main = local_steps(0)                     # the same on the main stream (a_local copied by torch)
        local_head, local_tail, ops = ops[:head_main], ops[head_main + 1:], []
        begin()
        local_tail += ops
        ops = []
        add(so.EVENT_WAIT, events["copied"])                                                   # 3
        for j, src in enumerate(peers):
            if self._pull_first[src]:
                add(so.EVENT_WAIT, joins[j])
        pre = ops
        post = []
        for j in range(len(streams)):                                                          # 6
            post += [(so.EVENT_RECORD, joins[j], 0, 0, j + 1, 0, None), (so.EVENT_WAIT, joins[j], 0, 0, 0, 0, None)]
        post.append((so.ZERO, arrived, 0, arrived_bytes, 0, 0, None))

        def program(rows_):
            p = so.Program(streams)
            for kind, a, b, n, stream, pe, label in rows_:
                p.add(kind, a, b, n, stream=stream, pe=pe, label=label)
            return p.seal()

        self._first, self._local_head, self._local_tail = program(first), program(local_head), program(local_tail)
        self._pre, self._post = program(pre), program(post)
        self._copy_at = head
        self._a_local_op = self._first.array[head]     # a view into the program: its source is set per call

    def gathered(self):
        """The gathered A of the last call: this op's buffer (the next call overwrites it); at world size 1, the
        `a_local` of the last call itself (nothing is gathered, and no copy is made). With the push protocol the call
        sends this rank's rows to the peers straight from `a_local`: they are copied into the buffer here, from the
        last call's `a_local` (on the current stream, once per call)."""
        if self.world_size == 1:
            return self._last_a
        if not self.fused:
            return self._full
        if self._slot_stale:
            self._slot.copy_(self._last_a)
            self._slot_stale = False
        return self.a_full

    def _validate(self, a_local, b, out) -> None:
        """The call checks (agreed across ranks): `a_local` (rows, K) of the dtype on this GPU (any strides: a
        non-contiguous one is copied into the gathered buffer first); `b` (K, N) and `out` (M, N) handed to the
        kernels as they are: contiguous and 16-byte aligned (TMA)."""
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
            so.check(h.ts_stream_write_u64(stream, self._flag_at[flag][pe], 1), "AGGemm", so.WRITE, stream,
                     self._flag_at[flag][pe], 1)
        else:                              # another node: NVSHMEM's signal (the word is 0: an add sets it)
            h.ts_signal_add_on_stream(self._flag_at[flag][pe], 1, pe, stream)

    def _gemm_own(self, a, b, c, m) -> None:
        """Step 1: the GEMM of my rows, through its C entry point (raw pointers, the stream last) or tilelang."""
        direct = self._direct_own
        if direct is None:
            self.kernel_own.launch(a, b, c, *self.tail[0])
        elif direct[0](a.data_ptr(), b.data_ptr(), c.data_ptr(), *self._tail_ptrs[0], m):
            raise self.launch_error(direct)

    def _gemm_peers(self, b, c, m) -> None:
        """Step 5: the GEMM of the other ranks' rows, as :meth:`_gemm_own`."""
        direct = self._direct
        if direct is None:
            self.kernel.launch(self.a_full, b, c, self.arrived, *self.tail[1])
        elif direct[0](self.a_full.data_ptr(), b.data_ptr(), c.data_ptr(), self.arrived.data_ptr(), *self._tail_ptrs[1],
                       m):
            raise self.launch_error(direct)

    def __call__(self, a_local, b, out=None):
        m = self.begin(a_local, b, out)
        if not self.fused:
            return self._call_unfused(a_local, b, out)
        if profiling.current is not None:
            rec = profiling.call("AGGemm", "fused", M=self.M, N=self.N, K=self.K)
            if rec is not None:
                return self._call_steps(a_local, b, out, rec)
        if out is None:
            import torch

            out = torch.empty(self.M, self.N, dtype=self.dtype, device=a_local.device)
        if self.world_size == 1:                        # 1 alone: nothing to gather
            self._last_a = a_local
            self._gemm_own(_tma_ready(a_local), b, out, m)
            return out
        fn = self._stream_ops
        if fn is None:     # a shim without ts_stream_ops
            return self._call_steps(a_local, b, out, None)
        if self.protocol == "push":
            return self._call_push(fn, a_local, b, out, m)
        if a_local.is_contiguous() and not a_local.data_ptr() & 15:   # 2 and 4 in one shim call; a_local an op
            self._a_local_op.b = a_local.data_ptr()
            self._first.run(fn, m, "AGGemm")
            a = a_local
        else:                                           # 2 on the main stream: its waits, the copy by torch, the rest
            self._local_head.run(fn, m, "AGGemm")
            self._slot.copy_(a_local)
            self._local_tail.run(fn, m, "AGGemm")
            a = self._slot
        self._gemm_own(a, b, out, m)                                                           # 1
        self._pre.run(fn, m, "AGGemm")                                                         # 3
        self._gemm_peers(b, out, m)                                                            # 5
        self._post.run(fn, m, "AGGemm")                                                        # 6
        return out

    def _call_unfused(self, a_local, b, out):
        """NCCL's AllGather into a buffer of this op, then ``torch.matmul`` (the op's torch equivalent)."""
        import torch
        import torch.distributed as dist

        if self._full is None:
            self._full = torch.empty(self.M, self.K, dtype=self.dtype, device=a_local.device)
        dist.all_gather_into_tensor(self._full, a_local.contiguous())
        return torch.matmul(self._full, b, out=out)

    def _push_source(self, a_local):
        """The rows a push call sends and its first GEMM reads: `a_local` itself when the copy engines and TMA can
        read it (contiguous, 16-byte aligned; gathered() copies it into my rows of A_full later), else my rows of
        A_full, filled from it by torch on the main stream first."""
        if a_local.is_contiguous() and not a_local.data_ptr() & 15:
            self._last_a, self._slot_stale = a_local, True
            return a_local
        self._slot.copy_(a_local)
        self._last_a, self._slot_stale = None, False
        return self._slot

    def _call_push(self, fn, a_local, b, out, m):
        """A call of the push protocol (module docstring, "Push"): its programs and the two GEMMs."""
        a = self._push_source(a_local)
        base = a.data_ptr()
        for op, off in self._push_at:
            op.b = base + off
        self._first.run(fn, m, "AGGemm")                                                       # 1-3
        self._gemm_own(a, b, out, m)                                                           # 4
        self._gemm_peers(b, out, m)                                                            # 5
        self._post.run(fn, m, "AGGemm")                                                        # 6
        return out

    def _call_steps(self, a_local, b, out, rec):
        """A call step by step from Python (one torch / shim call per operation, the order of ``_plan``'s
        programs): the profiled call (`rec`: the profiler's hooks between the copies and around the GEMMs)."""
        import torch

        main = torch.cuda.current_stream()
        W, r, shim = self.world_size, self.rank, self.rt.shim
        c = out if out is not None else torch.empty(self.M, self.N, dtype=self.dtype, device=a_local.device)
        direct = a_local.is_contiguous() and not a_local.data_ptr() & 15

        def gemm(kernel, prof, tiles, args, end):
            if rec is None:
                kernel.launch(*args)
            else:  # LAUNCH (+ KERNEL, and WAIT/TILE from the instrumented kernel) events
                rec.launcher(kernel, instrumented=prof, tiles=tiles, end=end)(*args)

        prof = self.kernels_prof or [None, None]
        if W == 1:                                                           # 1 alone
            self._last_a = a_local
            gemm(self.kernel_own, prof[0], self.tiles[0], (_tma_ready(a_local), b, c, *self.tail[0]), True)
            return c
        if self.protocol == "push":
            return self._push_steps(a_local, b, c, rec, gemm, prof)
        a_full = self.a_full
        peers = [(r + j) % W for j in range(1, W)]
        local = self.streams[-1]
        step = self.rows // self.chunks

        # the slots of the programs that the fast path would run (the same waits on the same streams): bounded alike
        watch = {k: v for p in ((self._first,) if direct else (self._local_head, self._local_tail))
                 for k, v in p.watches.items()}

        def wait(h, flag, q, at):     # wait for my flag `flag` of rank q (at `at`) to be 1, then reset it
            so.check(shim.ts_stream_wait_geq_u64(h, at, 1, watch.get(_label(flag, q))), "AGGemm", so.WAIT_GEQ, h,
                     at, 1, label=_label(flag, q))
            so.check(shim.ts_stream_write_u64(h, at, 0), "AGGemm", so.WRITE, h, at)

        def local_steps(s2):                                                 # 2
            h2 = s2.cuda_stream
            for q in peers:
                wait(h2, "freed", q, self._freed_here[q])
            with torch.cuda.stream(s2):
                self._slot.copy_(a_local)
            for q in peers:
                self._signal(h2, "ready", q)
            self._copied.record(s2)

        def begin():                                                         # 4
            self._start.record(main)
            for j, src in enumerate(peers):
                s = self.streams[j]
                s.wait_event(self._start)
                if j:
                    s.wait_event(self._pulled[j - 1])
                h = s.cuda_stream
                with torch.cuda.stream(s):
                    if rec is not None:
                        rec.copies_begin(s, src)
                    wait(h, "ready", src, self._ready_here[src])
                    lo, peer = src * self.rows, self._peers[src]
                    for ch in range(self.chunks):
                        rows = slice(lo + ch * step, lo + (ch + 1) * step)
                        if peer is not None:
                            a_full[rows].copy_(peer[rows], non_blocking=True)
                        else:   # the same rows of the peer's buffer (symmetric: one address on every rank)
                            chunk = a_full[rows]
                            shim.ts_getmem_on_stream(chunk.data_ptr(), chunk.data_ptr(), chunk.nbytes, src, h)
                        at = self._arrived_at[src * self.chunks + ch]
                        so.check(shim.ts_stream_write_u64(h, at, 1), "AGGemm", so.WRITE, h, at, 1)
                        if rec is not None:
                            rec.copy_done(s, src, ch, a_full[rows].nbytes)
                    if j < W - 2:
                        self._pulled[j].record(s)
                    self._signal(h, "freed", src)
                if self._pull_first[src]:
                    self._joins[j].record(s)

        if direct:
            begin()
            local.wait_event(self._start)
            local_steps(local)
        else:
            local_steps(main)
            begin()
        gemm(self.kernel_own, prof[0], self.tiles[0], (a_local if direct else self._slot, b, c, *self.tail[0]),
             False)                                                          # 1
        main.wait_event(self._copied)                                        # 3
        for j, src in enumerate(peers):
            if self._pull_first[src]:
                main.wait_event(self._joins[j])
        gemm(self.kernel, prof[1], self.tiles[1], (a_full, b, c, self.arrived, *self.tail[1]), True)   # 5
        for j, s in enumerate(self.streams):                                 # 6
            self._joins[j].record(s)
            main.wait_event(self._joins[j])
        self.arrived.zero_()
        return c


    def _push_steps(self, a_local, b, c, rec, gemm, prof):
        """The push protocol's call step by step (:meth:`_call_steps`)."""
        import torch

        main, s, shim = torch.cuda.current_stream(), self.streams[0], self.rt.shim
        W, r, rows = self.world_size, self.rank, self.rows
        step = rows // self.chunks
        a = self._push_source(a_local)
        self._start.record(main)                                                            # 1
        s.wait_event(self._start)
        h = s.cuda_stream
        for j in range(1, W):                                                               # 2, 3
            dst = (r - j) % W
            at = self._freed_here[dst]
            so.check(shim.ts_stream_wait_geq_u64(h, at, 1, self._first.watches.get(_label("freed", dst))), "AGGemm",
                     so.WAIT_GEQ, h, at, 1, label=_label("freed", dst))
            so.check(shim.ts_stream_write_u64(h, at, 0), "AGGemm", so.WRITE, h, at)
            with torch.cuda.stream(s):
                if rec is not None:
                    rec.copies_begin(s, dst, "to")
                for ch in range(self.chunks):
                    rows_ = slice(r * rows + ch * step, r * rows + (ch + 1) * step)
                    self._peers[dst][rows_].copy_(a[ch * step:(ch + 1) * step], non_blocking=True)
                    at = self._arrived_on[dst] + 8 * ch
                    so.check(shim.ts_stream_write_u64(h, at, 1), "AGGemm", so.WRITE, h, at, 1)
                    if rec is not None:
                        rec.copy_done(s, dst, ch, step * self.K * a.element_size())
        self._joins[0].record(s)
        gemm(self.kernel_own, prof[0], self.tiles[0], (a, b, c, *self.tail[0]), False)          # 4
        gemm(self.kernel, prof[1], self.tiles[1], (self.a_full, b, c, self.arrived, *self.tail[1]), True)   # 5
        main.wait_event(self._joins[0])                                                     # 6
        self.arrived.zero_()
        for q in range(W):
            if q != r:
                at = self._flag_at["freed"][q]
                so.check(shim.ts_stream_write_u64(main.cuda_stream, at, 1), "AGGemm", so.WRITE, main.cuda_stream, at, 1)
        return c


def _label(flag: str, q: int) -> tuple:
    """The label of a stream wait for my flag `flag` (``ready`` / ``freed``) of rank `q`, which rank q sets: what the
    record of a wait that did not end within TILESCALE_WAIT_TIMEOUT_S names (tilescale/runtime/stream_waits.py)."""
    return ("AGGemm", f"{flag}[{q}]", q)


def _tma_ready(a):
    """`a` itself when TMA can load it (contiguous, 16-byte aligned), else a copy that is (a new allocation is
    aligned; ``contiguous()`` alone would return a misaligned contiguous tensor as it is)."""
    if a.is_contiguous():
        return a if not a.data_ptr() & 15 else a.clone()
    return a.contiguous()


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
