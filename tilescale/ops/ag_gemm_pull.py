"""The pull protocol of AG+GEMM (:mod:`tilescale.ops.allgather_gemm`), where a peer shares this rank's GPU or is on
another node (:func:`tilescale.ops.allgather_gemm.protocol_for`). This rank's shard is copied into its slot of the
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
   (its event ``pulled``): wait until ``ready[src] >= 1``, set it to 0; for each chunk of src's shard
   (``AGGemm.chunk_rows`` of the call's rows; a chunk past them pulls nothing) a pull from
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
(:mod:`.stream_ops`, built once by ``PullProtocol._plan``, each operation on its stream), issued by one call of the
runtime shim; then the first GEMM (1, through the kernel's C entry point); step 3 (a second program); the second
GEMM (5); step 6 (a third program). A non-contiguous (or not 16-byte aligned) `a_local` is copied into my slot by
torch on the main stream first (after step 2's waits), and the first GEMM reads it there. A profiled call issues the
same programs, in pieces, with the profiler's records of each copy stream's pulls between them (the programs'
marks).
"""
from . import stream_ops as so


def pulls_needing_sms(world_size: int, rank: int, same_gpu, mapped) -> list[bool]:
    """Per rank p, whether this rank's pull of p's shard needs an SM (step 4), so that it must end before the second
    GEMM's tiles, which wait for it, take every SM: p on this rank's GPU (``same_gpu(p)``: a copy within one GPU is a
    copy kernel), or p not mapped here (``mapped(p)`` False: NVSHMEM's on-stream get from a peer
    without a load/store mapping launches a one-thread proxy kernel, NVSHMEM's ``nvshmemi_proxy_rma_launcher``). A
    mapped peer on another GPU is pulled by a copy engine. False for `rank` itself."""
    return [p != rank and (same_gpu(p) or not mapped(p)) for p in range(world_size)]


class PullProtocol:
    """The pull protocol's programs, a part of :class:`tilescale.ops.allgather_gemm.AGGemm` (its buffers, flags,
    streams and events)."""

    def _plan(self, *, a_full: int, row_bytes: int, peer_at: list, streams: list, events: dict, joins: list,
              pulled: list, arrived: int, arrived_bytes: int) -> None:
        """The host steps of a call (module docstring) as programs of stream operations, issued by one shim call
        each (:mod:`.stream_ops`; stream 0: the caller's current stream, stream j: ``self.streams[j - 1]``: a copy
        stream per peer, then the local stream), in the order of the steps:
        ``_first`` (the call's start, the pulls of 4 and the copy of 2, whose source is op ``_copy_at``, set per
        call), or, when `a_local` is not contiguous, ``_local_head`` (2's waits, on the main stream), a torch copy,
        ``_local_tail`` (the rest of 2, then what ``_first`` issues but 2); then the first GEMM (1); ``_pre``
        (3); the second GEMM (5); ``_post`` (6). `a_full`, `peer_at` (a peer of this node: the address of its
        A_full; else None), `events` (start, copied), `joins`, `pulled`, `arrived`: raw addresses and handles. A copy
        stream's pulls carry the marks of a profiled call's records: ``copies_begin`` before its wait for ``ready``,
        ``copy_done`` after each chunk's ``arrived`` (its bytes are the call's: the profiled call adds them). Ranks are
        the op's group's (NVSHMEM's gets and signals take their world ranks: ``self.pe``)."""
        W, r, rows, slots = self.world_size, self.rank, self.rows, self.slots
        peers = [(r + j) % W for j in range(1, W)]
        local = W          # the local stream's index
        ops = []

        def add(kind, a, b=0, n=0, stream=0, pe=0, label=None):
            ops.append((kind, a, b, n, stream, pe, label, []))

        def mark(*what):           # a profiled call's record here, after the op added last (Program.mark)
            ops[-1][-1].append(what)

        def signal(flag, pe, stream):     # my word of `flag` on rank pe := 1 (a stream write, or NVSHMEM's add)
            if peer_at[pe] is not None:
                add(so.WRITE, self._flag_at[flag][pe], 1, stream=stream)
            else:
                add(so.SIGNAL_ADD, self._flag_at[flag][pe], 1, stream=stream, pe=self.pe(pe))

        def local_steps(stream):                                                               # 2
            for q in peers:
                add(so.WAIT_GEQ, self._freed_here[q], 1, stream=stream, label=so.wait_label("AGGemm", "freed", q))
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
                mark("copies_begin", s, src)
                add(so.WAIT_GEQ, self._ready_here[src], 1, stream=s, label=so.wait_label("AGGemm", "ready", src))
                add(so.WRITE, self._ready_here[src], 0, stream=s)
                for ch, (lo, n) in enumerate(self.chunk_rows(rows)):   # (sizes set per call: _size_pulls)
                    off = (src * rows + lo) * row_bytes
                    if peer_at[src] is not None:    # a copy-engine pull from the peer's A_full through its mapping
                        add(so.COPY, a_full + off, peer_at[src] + off, n * row_bytes, stream=s)
                    else:   # NVSHMEM's get of the same rows of the peer's buffer (symmetric: one address on every rank)
                        add(so.GET, a_full + off, a_full + off, n * row_bytes, stream=s, pe=self.pe(src))
                    add(so.WRITE, self._arrived_at[src * slots + ch], 1, stream=s)
                    mark("copy_done", s, src, ch)
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
        pre, ops = ops, []
        for j in range(len(streams)):                                                          # 6
            add(so.EVENT_RECORD, joins[j], stream=j + 1)
            add(so.EVENT_WAIT, joins[j])
        add(so.ZERO, arrived, 0, arrived_bytes)
        post = ops

        def program(rows_):
            p = so.Program(streams)
            for kind, a, b, n, stream, pe, label, marks in rows_:
                p.add(kind, a, b, n, stream=stream, pe=pe, label=label)
                for what in marks:
                    p.mark(*what)
            return p.seal()

        self._first, self._local_head, self._local_tail = program(first), program(local_head), program(local_tail)
        self._pre, self._post = program(pre), program(post)
        self._copy_at = head
        self._a_local_op = self._first.array[head]     # a view into the program: its source is set per call
        self._programs = (self._first, self._local_head, self._local_tail, self._pre, self._post)
        # the pulls of both programs that issue them, found by the flag each sets next: (op, src, chunk), their
        # addresses and sizes set per call for its rows (_size_pulls)
        flag = {a: (i // slots, i % slots) for i, a in enumerate(self._arrived_at)}
        self._pull_ops = [(prog.array[i - 1], *flag[op.a]) for prog in (self._first, self._local_tail)
                          for i, op in enumerate(prog.array) if op.kind == so.WRITE and op.a in flag]
        self._pull_at = [a_full if p is None else p for p in peer_at]
        self._a_full_at, self._row_bytes = a_full, row_bytes

    def _size_pulls(self, m: int, chunks: list) -> None:
        """The programs' copies for a call of `m` rows per rank in `chunks` ((first row, rows) each:
        ``AGGemm.chunk_rows``): the size of my shard's copy into my slot (step 2), the addresses and size of each
        pull (step 4; rank q's slot: rows ``q * rows ..`` of A_full, its first m rows used). A chunk past the call's
        rows pulls nothing and sets its flag all the same."""
        rb, rows = self._row_bytes, self.rows
        self._a_local_op.n = m * rb
        for op, src, ch in self._pull_ops:
            lo, n = chunks[ch]
            off = (src * rows + lo) * rb
            op.a, op.b, op.n = self._a_full_at + off, self._pull_at[src] + off, n * rb
