"""AllGather + GEMM, overlapped: ``C = AllGather(A) @ B`` with A sharded by rows.

torch equivalent (A_local: (M/W, K) on each rank, B: (K, N) local)::

    A = torch.empty(M, K); torch.distributed.all_gather_into_tensor(A, A_local)
    C = A @ B

How it overlaps: communication starts when the call starts and runs beside the GEMM. The GEMM starts at once on
this rank's own rows, read where they are (`a_local`); a second launch of the GEMM computes the other ranks' rows
in the order they arrive (rank+1's first, then rank+2's, ...), each tile waiting only for its chunk of rows. At world
size 1 the call is the first GEMM alone, on `a_local`. Two protocols move the rows, chosen by topology
(:func:`protocol_for`), each with its flags and numbered steps in its module:

- push (:mod:`.ag_gemm_push`): every rank on a GPU of its own, all on this node; each rank's copy engine pushes its
  rows into each peer's gathered buffer (rank-1 first), chunk by chunk, each chunk followed by a flag that the
  peer's second GEMM waits for;
- pull (:mod:`.ag_gemm_pull`): ranks sharing a GPU, or ranks on several nodes; each rank copies its rows into its
  slot of the gathered buffer and pulls the other ranks' slots, one peer after another.

The kernel (both GEMMs), its grids and the kernels an op compiles are in :mod:`.ag_gemm_kernel`. A call is one path,
:meth:`AGGemm.__call__`: the protocol's programs of stream operations (:mod:`.stream_ops`, built once, each issued by
one call of the runtime shim) around the two GEMMs (launched through the kernel's C entry point). A profiled call takes
the same path with two differences (``_Profiled``): each program is issued in pieces, the profiler recording the
copies between them where the program marks them, and the GEMMs are launched through the profiler.
"""
from ..profiler import session as profiling
from . import checks, op_cache, vectors
from . import stream_ops as so
from .ag_gemm_kernel import (  # noqa: F401  (re-exported)
    PULL_MAX_CHUNKS,
    PULL_MIN_BYTES,
    SPLIT_PARAMS,
    SPLIT_SIZES,
    ag_gemm_kernel,
    chunk_slots,
    chunk_tiles,
    elem_bytes,
    grid_plan,
    kernel_plan,
    kernels,
    pull_chunks,
    split_space,
    splits,
)
from .ag_gemm_pull import PullProtocol, pulls_needing_sms
from .ag_gemm_push import PushProtocol
from .base import Op
from .gemm import GemmConfig, check_problem, split_workspace

__all__ = ["AGGemm", "ag_gemm"]


def protocol_for(world_size: int, rank: int, near, same_gpu, shared_gpu: bool = False) -> str:
    """"push" where every rank is on a GPU of its own on this node (``near[p]``: rank p mapped here; ``same_gpu(p)``:
    on this rank's GPU; `shared_gpu`: some GPU of this node runs more than one rank), so that every copy of the
    call runs on a copy engine; else "pull" (:mod:`.ag_gemm_pull`). The answer is the same on every rank: a peer on
    another node makes every rank pull (each then has one), and so does any GPU that two ranks share."""
    others = [p for p in range(world_size) if p != rank]
    distinct = not shared_gpu and not any(same_gpu(p) for p in others)
    return "push" if others and distinct and all(near[p] for p in others) else "pull"


class AGGemm(PullProtocol, PushProtocol, Op):
    """``C = all_gather(A_local) @ B`` for fixed N, K and dtype; collective to construct.

    `M` is the bound of the gathered rows (W x rows per rank): a call takes `a_local` of any m <= M / W rows (the
    same m on every rank) and returns C of W x m rows, with the kernels built once (the rows are a kernel argument;
    the buffers are sized for M). ``op(a_local, b)`` returns C (a new tensor unless `out=` is given). The gathered
    A of the last call stays in ``op.gathered()``. `fused` (default: the committed table at M,
    tilescale/ops/fused_paths.py): False runs NCCL's AllGather then cuBLAS, where the fused kernel is slower
    (small M); ``op.fused`` says which path the op takes. `split` (default True): a GEMM whose last wave's tiles
    split along K at M rows (:func:`grid_plan`) runs a grid that splits each call's last wave as that call's own
    plan says (as a kernel built for its rows would); False: plain grids. Either way the kernels depend on the
    config and the SM count alone (the cached ``ag_gemm``'s ops of every bound share them). `profile` (default
    TILESCALE_PROFILE_DEVICE) also builds the kernels with in-kernel timestamps, used while a tilescale.profiler
    session records WAIT/TILE events. Each protocol's programs are built by its part of the class
    (:class:`~tilescale.ops.ag_gemm_pull.PullProtocol`, :class:`~tilescale.ops.ag_gemm_push.PushProtocol`).
    """

    NAME, KERNEL = "AGGemm", "ag_gemm"
    GRAPH_SAFE = True     # flags set and reset on the device (either protocol): no per-call host state

    def __init__(self, M: int, N: int, K: int, dtype, *, chunks: int | None = None, config: GemmConfig | None = None,
                 profile: bool | None = None, split: bool = True, fused: bool | None = None, group=None):
        import torch

        from ..env import settings
        from ..runtime import symm, topology
        from . import fused_paths
        from .gemm import current_gpu

        with self.arguments(M=M, N=N, K=K, dtype=dtype, chunks=chunks, config=config, profile=profile,
                            split=split, fused=fused, group=group) as agreed:
            if fused is None:   # the table's path, decided before any check can fail on this rank alone, so that
                # a rank with a bad argument and one without still agree on it (only the bad argument is named); a
                # group given as ranks has no torch process group for NCCL's AllGather: fused
                agreed["fused"] = fused = (isinstance(group, (list, tuple, range)) or fused_paths.choose(
                    "ag_gemm", M, N, K, self.rt.info, current_gpu(), self.world_size) == "fused")
            if not isinstance(fused, bool):
                checks.fail("AGGemm", "fused", checks.describe(fused), "a bool (or None: the committed table, "
                            "tilescale/ops/fused_paths.json)", type_error=True)
            if not fused and isinstance(group, (list, tuple, range)):
                checks.fail("AGGemm", "fused", "False with a group given as ranks", "True or None (NCCL's AllGather "
                            "needs the group's torch.distributed process group: pass that as `group`)")
            profile = settings.profile_device if profile is None else profile
            check_problem("AGGemm", M, N, K, dtype, config, "K")
            checks.as_int("AGGemm", "chunks", chunks, allow_none=True)
            if not isinstance(split, bool):
                checks.fail("AGGemm", "split", checks.describe(split), "a bool", type_error=True)
            if not isinstance(profile, bool) and profile not in (0, 1):
                checks.fail("AGGemm", "profile", checks.describe(profile), "a bool (or None: TILESCALE_PROFILE_DEVICE)",
                            type_error=True)
            agreed["profile"] = profile = bool(profile)
            kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config, 0)   # its errors: agreed
            self.fused = fused
        self.M, self.N, self.K, self.dtype = M, N, K, dtype
        self.rows = M // self.world_size     # the bound of a call's rows per rank (`m`: those of the last call)
        self.m = self.rows
        if not self.fused:    # NCCL then cuBLAS (tilescale/ops/fused_paths.py): no kernel, no symmetric buffer
            self.launch_path, self._full = "unfused", None
            return
        # the SM count (the last waves' split) read once every rank's arguments agreed: no rank queries its GPU, and
        # maybe fails alone, before the others learn whether the call was valid
        jobs = kernels(M, N, K, self.world_size, checks.dtype_name(dtype), chunks, config,
                       vectors.sm_count() if split else 0, self.kernel_team)
        W, (fn, self.args) = self.world_size, jobs[-1]
        self.chunks = self.args[3]                   # 0: by each call's rows
        self.block_m = self.args[5]
        self._last_a = None       # world size 1: the a_local of the last call (gathered())
        # the GEMM of my rows (step 1) and of the others' (step 5; world size > 1): their grids at the bound, and a
        # split grid's workspace (for every call's plan: split_space), which it takes after its other arguments
        # with a call's slices and tail tiles (_tail)
        self._job_args = [a for _, a in jobs]
        self.plans = [kernel_plan(a, M) for _, a in jobs]
        self._sizes = [split_space(a, M) if splits(a) else () for _, a in jobs]
        self._ws = [split_workspace(z, *a[5:7], device=self.rt.device) if z else () for z, (_, a) in
                    zip(self._sizes, jobs, strict=True)]
        self._splits = {}         # rows per rank -> each GEMM's (slices, tail tiles): _split_of
        self.tail = [self._tail(i, self.rows) for i in range(len(jobs))]     # (a call of the bound's rows)
        tail, sizes = [SPLIT_PARAMS if z else () for z in self._sizes], [SPLIT_SIZES if z else () for z in self._sizes]
        prof_jobs = [(fn, a[:11] + (True,) + a[12:]) for _, a in jobs] if profile else []
        self.compile_ahead(jobs + prof_jobs)   # every kernel of the op side by side; build() takes them
        self.kernel_own, self._direct_own = self.build(fn, jobs[0][1], ("A", "B", "C", *tail[0], "m", *sizes[0]))
        self.kernel, self._direct = (self.build(fn, self.args, ("A", "B", "C", "arrived", *tail[1], "slot_rows", "m",
                                                                *sizes[1])) if W > 1 else (None, None))
        self._tail_ptrs = [tuple(t.data_ptr() for t in ws) for ws in self._ws]
        self.launch_path = "direct" if self._direct_own is not None else "tilelang"  # how __call__ launches
        # the same kernels with timestamps, and their blocks at the bound (one record each)
        self.kernels_prof = [f(*a).prepare() for f, a in prof_jobs] if profile else None
        self.tiles = [p.blocks for p in self.plans] + [0] * (2 - len(self.plans))
        if W == 1:
            return
        self.a_full = self.symmetric((M, K), dtype)     # rank q's rows of a call: its slot, A_full[q * rows:][:m]
        self.ready = self.symmetric((W,), torch.uint64, zero=True)
        self.freed = self.symmetric((W,), torch.uint64, zero=True)
        self.freed.fill_(1)     # no peer reads my slot before the first call (a peer sets it only after that)
        torch.cuda.current_stream().synchronize()
        self.slots = chunk_slots(self.chunks)       # arrived flags (and copies) per rank
        # written by the peers (push) or by this rank's copy streams (pull): symmetric for the first
        self.arrived = self.symmetric((W * self.slots,), torch.uint64, zero=True)
        # a peer of this node: a torch view of its A_full (copy-engine copies) and the addresses of its flags
        # (stream writes); of another node: None (NVSHMEM gets and signals)
        # (p: a rank of the op's group, at world rank self.pe(p))
        topo, info, pe = topology.current(), self.rt.info, self.pe
        near = [topo.same_node(pe(p), info.rank) and p != self.rank for p in range(W)]

        def same_gpu(p):
            return info.same_gpu(pe(p))

        self.protocol = protocol_for(W, self.rank, near, same_gpu, info.shared_gpu)
        # push: one copy stream; pull: a copy stream per peer (step 4), then the local stream (step 2)
        self.streams = [torch.cuda.Stream(priority=-1) for _ in range(1 if self.protocol == "push" else W)]
        # pulls that need an SM are done before the second GEMM (step 4)
        shim, at = self.rt.shim, self.a_full.data_ptr()
        self._pull_first = pulls_needing_sms(W, self.rank, same_gpu,
                                             lambda p: near[p] or bool(shim.ts_ptr(at, pe(p))))
        self._peers = [symm.peer_tensor(self.a_full, pe(p)) if near[p] else None for p in range(W)]
        # my word of a flag on rank p: through its mapping, or the symmetric address for NVSHMEM's signal
        self._flag_at = {name: [(symm.get_remote_ptr(f, pe(p)) if near[p] else f.data_ptr()) + 8 * self.rank
                                for p in range(W)] for name, f in (("ready", self.ready), ("freed", self.freed))}
        # push: rank p's arrived flags of my chunks, through its mapping
        self._arrived_on = [symm.get_remote_ptr(self.arrived, pe(p)) + 8 * self.rank * self.slots if near[p] else None
                            for p in range(W)]
        self._ready_here = [self.ready.data_ptr() + 8 * q for q in range(W)]     # rank q's word here
        self._freed_here = [self.freed.data_ptr() + 8 * q for q in range(W)]
        self._arrived_at = [self.arrived.data_ptr() + 8 * i for i in range(W * self.slots)]
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
        self._stream_ops = self.rt.shim.ts_stream_ops
        if self.protocol == "push":
            self._plan_push()
            return
        self._plan(a_full=self.a_full.data_ptr(), row_bytes=self.K * self.a_full.element_size(),
                   peer_at=[None if t is None else t.data_ptr() for t in self._peers],
                   streams=[s.cuda_stream for s in self.streams],
                   events=dict(start=self._start.cuda_event, copied=self._copied.cuda_event),
                   joins=[e.cuda_event for e in self._joins], pulled=[e.cuda_event for e in self._pulled],
                   arrived=self.arrived.data_ptr(), arrived_bytes=self.arrived.nbytes)

    def chunk_rows(self, m: int) -> list:
        """(first row, rows) of each chunk of a shard of `m` rows, as the kernel reads them (:func:`chunk_tiles`):
        :func:`chunk_slots` chunks of whole row tiles, the last ones shorter or empty."""
        step = chunk_tiles(-(-m // self.block_m), m, self.K, self.chunks, elem_bytes(self.dtype)) * self.block_m
        return [(min(ch * step, m), max(0, min(step, m - ch * step))) for ch in range(self.slots)]

    def _set_rows(self, m: int) -> None:
        """The programs' copies for a call of `m` rows per rank (rank q's slot: rows ``q * rows ..`` of A_full, its
        first m rows used), set by the protocol (PullProtocol._size_pulls, PushProtocol._size_pushes)."""
        chunks = self.chunk_rows(m)
        if self.protocol == "push":
            self._size_pushes(chunks)
        else:
            self._size_pulls(m, chunks)
        self._slot = self.a_full[self.rank * self.rows:self.rank * self.rows + m]   # (torch's copy of a_local that
        self.m = m                                                                   # is not contiguous; gathered())

    def gathered(self):
        """The gathered A of the last call (W x m rows): this op's buffer when the call had the bound's rows (the
        next call overwrites it), else a copy of its slots' rows; at world size 1, the `a_local` of the last call
        itself (nothing is gathered, and no copy is made). With the push protocol the call sends this rank's rows to
        the peers straight from `a_local`: they are copied into the buffer here, from the last call's `a_local` (on
        the current stream, once per call). Unfused: the first W x m rows of the AllGather's buffer."""
        if self.world_size == 1:
            return self._last_a
        if not self.fused:
            return self._full if self._full is None or self.m == self.rows else self._full[:self.world_size * self.m]
        if self._slot_stale:
            self._slot.copy_(self._last_a)
            self._slot_stale = False
        if self.m == self.rows:
            return self.a_full
        return self.a_full.view(self.world_size, self.rows, self.K)[:, :self.m].reshape(-1, self.K)

    def _validate(self, a_local, b, out) -> None:
        """The call checks (agreed across ranks): `a_local` (m, K), m <= M / world_size, of the dtype on this GPU
        (any strides: a non-contiguous one is copied into the gathered buffer first); `b` (K, N) and `out`
        (W x m, N) handed to the kernels as they are: contiguous and 16-byte aligned (TMA)."""
        d, dt = self.device, self.dtype
        m = a_local.shape[0] if getattr(a_local, "dim", lambda: 0)() == 2 else self.rows
        if m > self.rows:
            checks.fail("AGGemm", "a_local", checks.describe(a_local), f"at most {self.rows} rows (the bound M / "
                        f"world_size of this op, built for M={self.M}: a larger M needs an op of its own)")
        checks.check_tensor("AGGemm", "a_local", a_local, shape=(m, self.K), dtype=dt, device=d,
                            what=f"m <= M / world_size = {self.rows} rows")
        checks.check_tensor("AGGemm", "b", b, shape=(self.K, self.N), dtype=dt, device=d, contiguous=True,
                            aligned=True)
        if out is not None:
            checks.check_tensor("AGGemm", "out", out, shape=(self.world_size * m, self.N), dtype=dt, device=d,
                                contiguous=True, aligned=True, what="world_size x the rows of a_local")

    def call_key(self, a_local, b, out):
        """``checks.signature(a_local), checks.signature(b, True), checks.signature(out, True)``, flattened into
        one tuple built inline (raises AttributeError for a non-tensor: Op.begin then runs the checks)."""
        return (type(a_local), a_local.dtype, a_local.shape, a_local.device,
                type(b), b.dtype, b.shape, b.device, b.is_contiguous(), b.data_ptr() & 15,
                None if out is None else (type(out), out.dtype, out.shape, out.device, out.is_contiguous(),
                                          out.data_ptr() & 15))

    def _split_of(self, m: int) -> list:
        """Per GEMM, the (slices, tail tiles) of a call of `m` rows per rank on a split grid (slices 1, tail 0: none
        split), () on a plain grid: its :func:`kernel_plan`, as a kernel built for those rows alone would split."""
        if not any(self._sizes):
            return self._sizes                           # (plain grids: () each)
        got = self._splits.get(m)
        if got is None:
            plans = [kernel_plan(a, self.world_size * m) if z else None for a, z in zip(self._job_args, self._sizes,
                                                                                         strict=True)]
            got = self._splits[m] = [((p.split, p.tail) if p.split > 1 else (1, 0)) if p else () for p in plans]
        return got

    def _tail(self, i: int, m: int) -> tuple:
        """The arguments of GEMM `i` (0: my rows, 1: the others') after C (and arrived) for a call of `m` rows per
        rank, as tilelang launches it: a split grid's workspace, slices and tail tiles; () for a plain grid."""
        return (*self._ws[i], *self._split_of(m)[i])

    def _gemm_own(self, a, b, c, stream) -> None:
        """Step 1: the GEMM of my rows (a: m rows, c: W x m), through its C entry point (raw pointers and ints: a
        split grid's workspace, slices and tail, the rows, its workspace's sizes, the stream last) or tilelang."""
        direct, m = self._direct_own, a.shape[0]
        if direct is None:
            self.kernel_own.launch(a, b, c.view(self.world_size, m, self.N), *self._tail(0, m))
        elif direct[0](a.data_ptr(), b.data_ptr(), c.data_ptr(), *self._tail_ptrs[0], *self._split_of(m)[0], m,
                       *self._sizes[0], stream):
            raise self.launch_error(direct)

    def _gemm_peers(self, b, c, stream) -> None:
        """Step 5: the GEMM of the other ranks' rows (``self.m`` per rank), as :meth:`_gemm_own`."""
        direct, m, W = self._direct, self.m, self.world_size
        if direct is None:
            self.kernel.launch(self.a_full.view(W, self.rows, self.K), b, c.view(W, m, self.N), self.arrived,
                               *self._tail(1, m))
        elif direct[0](self.a_full.data_ptr(), b.data_ptr(), c.data_ptr(), self.arrived.data_ptr(), *self._tail_ptrs[1],
                       *self._split_of(m)[1], self.rows, m, *self._sizes[1], stream):
            raise self.launch_error(direct)

    def __call__(self, a_local, b, out=None):
        stream = self.begin(a_local, b, out)
        if not self.fused:
            return self._call_unfused(a_local, b, out)
        rows = a_local.shape[0]                         # the call's rows per rank (<= self.rows)
        if out is None:
            import torch

            out = torch.empty(self.world_size * rows, self.N, dtype=self.dtype, device=a_local.device)
        if rows == 0:
            return out
        if self.world_size > 1 and rows != self.m:      # the copies' sizes (and the pulls' chunks) of these rows
            self._set_rows(rows)
        via = self       # what launches the GEMMs and issues the programs: the op, or a profiled call's stand-ins
        if profiling.current is not None:
            rec = profiling.call("AGGemm", "fused", M=self.M, N=self.N, K=self.K)
            if rec is not None:
                via = _Profiled(self, rec, rows)
        if self.world_size == 1:                        # 1 alone: nothing to gather
            self._last_a = a_local
            via._gemm_own(vectors.aligned(a_local), b, out, stream)
            return out
        if self.protocol == "push":
            return self._call_push(via, a_local, b, out, stream)
        fn = via._stream_ops
        if vectors.is_aligned(a_local):   # 2 and 4 in one shim call; a_local an op
            self._a_local_op.b = a_local.data_ptr()
            self._first.run(fn, stream, "AGGemm")
            a = a_local
        else:                                           # 2 on the main stream: its waits, the copy by torch, the rest
            self._local_head.run(fn, stream, "AGGemm")
            self._slot.copy_(a_local)
            self._local_tail.run(fn, stream, "AGGemm")
            a = self._slot
        via._gemm_own(a, b, out, stream)                                                       # 1
        self._pre.run(fn, stream, "AGGemm")                                                    # 3
        via._gemm_peers(b, out, stream)                                                        # 5
        self._post.run(fn, stream, "AGGemm")                                                   # 6
        return out

    def _call_unfused(self, a_local, b, out):
        """NCCL's AllGather into the first W x m rows of a buffer of this op (M rows), then ``torch.matmul`` (the
        op's torch equivalent)."""
        import torch
        import torch.distributed as dist

        from ..runtime import team

        self.m = m = a_local.shape[0]
        if self._full is None:
            self._full = torch.empty(self.M, self.K, dtype=self.dtype, device=a_local.device)
        full = self._full[:self.world_size * m]       # a call of m rows per rank: W x m rows, contiguous
        if m:
            dist.all_gather_into_tensor(full, a_local.contiguous(), group=team.torch_group(self.group))
        return torch.matmul(full, b, out=out)

class _Profiled:
    """A profiled call's stand-ins for what :class:`AGGemm` launches and issues itself (``_gemm_own``,
    ``_gemm_peers``, ``_stream_ops``), which its call takes in their place (`rec`: the profiler's record of the
    call; `m`: its rows per rank): the GEMMs launched through the profiler (the kernels with timestamps where the op
    built them, ``profile``, each with the blocks of this call's grid: one record each; the last GEMM ends the
    record) and, at world size > 1, a stand-in for the shim's ``ts_stream_ops`` that issues each program in pieces,
    the profiler recording the copies where the program marks them (:func:`.stream_ops.in_pieces`; a ``copy_done``
    with its chunk's bytes of this call, :meth:`AGGemm.chunk_rows`). The steps, their order and their streams are
    those of any call."""

    def __init__(self, op: AGGemm, rec, m: int):
        self.op, self.rec, self.prof, self.m = op, rec, op.kernels_prof or [None, None], m
        W = op.world_size
        self.tiles = [kernel_plan(a, W * m).blocks for a in op._job_args] + [0] * (2 - len(op._job_args))
        if W > 1:
            streams, row_bytes = op.streams, op.K * op.a_full.element_size()
            chunk_bytes = [n * row_bytes for _, n in op.chunk_rows(m)]

            def record(hook, stream, *args):   # a program's mark: copies_begin / copy_done on that copy stream
                if hook == "copy_done":        # (peer, chunk): the chunk's bytes in this call
                    args = (*args, chunk_bytes[args[-1]])
                getattr(rec, hook)(streams[stream - 1], *args)

            self._stream_ops = so.in_pieces(op._stream_ops, op._programs, record)

    def _gemm_own(self, a, b, c, stream) -> None:
        op, m = self.op, self.m
        launch = self.rec.launcher(op.kernel_own, instrumented=self.prof[0], tiles=self.tiles[0],
                                   end=op.world_size == 1)
        launch(a, b, c.view(op.world_size, m, op.N), *op._tail(0, m))

    def _gemm_peers(self, b, c, stream) -> None:
        op, m, W = self.op, self.m, self.op.world_size
        launch = self.rec.launcher(op.kernel, instrumented=self.prof[1], tiles=self.tiles[1], end=True)
        launch(op.a_full.view(W, op.rows, op.K), b, c.view(W, m, op.N), op.arrived, *op._tail(1, m))


@op_cache.cached(16, close_evicted=False)
def _cached(M, N, K, dtype, world_size, config, group=None):
    return AGGemm(M, N, K, dtype, config=config, split=False, group=group)   # plain grids: ops of one config share
    # kernels


_fn_check = checks.CallCheck("ag_gemm")


def _validate_fn(a_local, b, group=None) -> None:
    if group is not None:
        from ..runtime import team

        team.of_group("ag_gemm", group)     # a bad group: an argument error, agreed as the others
    checks.check_tensor("ag_gemm", "a_local", a_local, dtypes=checks.GEMM_DTYPES, min_dims=2)
    checks.check_tensor("ag_gemm", "b", b, dtype=a_local.dtype, min_dims=2)
    if a_local.dim() != 2 or b.dim() != 2 or a_local.shape[1] != b.shape[0]:
        checks.fail("ag_gemm", "b", checks.describe(b), f"a 2-D ({a_local.shape[-1]}, N) tensor for a_local "
                    f"{tuple(a_local.shape)} (2-D operands, inner sizes equal)")


def ag_gemm(a_local, b, *, return_gathered: bool = False, group=None):
    """``all_gather(a_local) @ b`` over all ranks (of `group`: tilescale.runtime.team; see :class:`AGGemm`); builds
    and caches the op per (N, K, dtype, config, group).

    Any number of rows, run as they are by an op of a bound of rows per rank (tilescale.ops.op_cache.cached_op: the
    rows rounded up to a power of two, or a larger op cached with the same config); ops of one config share
    their kernels, so new rows build nothing unless the tuning table picks another config for their bound (plain
    grids: no split of the last wave). ``return_gathered=True`` returns
    ``(c, all_gather(a_local))`` (the gathered A, a copy: the op's buffer is reused by its next call)."""
    from .. import runtime
    from ..runtime import team

    _fn_check((checks.signature(a_local), checks.signature(b), group), _validate_fn, a_local, b, group)
    W = team.size_of("ag_gemm", group, runtime.current().info.world_size)
    (rows, K), N = a_local.shape, b.shape[1]
    op = op_cache.cached_op(_cached, rows, N, K, a_local.dtype, W, "ag_gemm", group)
    c = op(a_local, b)
    if not return_gathered:
        return c
    g = op.gathered()   # a copy of its slots' rows when fused at fewer rows than the bound; else the op's own
    return c, (g if W > 1 and op.fused and op.m != op.rows else g.clone())
