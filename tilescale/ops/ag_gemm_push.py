"""The push protocol of AG+GEMM (:mod:`tilescale.ops.allgather_gemm`), for ranks each on a GPU of its own, all on
this node (:func:`tilescale.ops.allgather_gemm.protocol_for`): every copy runs on a copy engine, no SM is taken from
the GEMM (a copy into a peer's mapping runs while the second GEMM's blocks hold every SM; a copy within one GPU
would wait for an SM: docs/ag-gemm-overlap.md).

Flags: ``arrived[q, chunk]`` (symmetric, here): rank q's chunk is in my ``A_full``; ``freed[q]`` (symmetric,
here): rank q has read my rows of its ``A_full`` of the last call and zeroed its ``arrived`` (1 before the first
call). Each is set to 1 by its one writer and reset by its one reader.

1. main stream: an event ``start`` (after the work enqueued before the call);
2. the copy stream, from ``start``, for dst = rank-1, rank-2, ... (dst reads my rows first when I am its rank+1):
   wait until ``freed[dst] >= 1``, set it to 0;
3. for each chunk of my rows (``AGGemm.chunk_rows`` of the call's rows): a copy-engine copy from `a_local` into
   dst's ``A_full`` through its mapping (none for a chunk past the call's rows), then a stream write
   ``arrived[me, chunk] = 1`` on dst (ordered after the copy); last, an event ``pushed``;
4. main stream: the GEMM of my own rows from `a_local`;
5. main stream: the GEMM of the other ranks' rows from ``A_full``; a tile first waits until
   ``arrived[src, chunk] >= 1`` (acquire, system scope);
6. main stream: wait for ``pushed`` (the call ends after its reads of `a_local`), zero ``arrived``, then
   ``freed[me] = 1`` on every peer.

My rows are not copied into my own ``A_full`` by the call (a copy within one GPU needs SMs): ``gathered()`` copies
them in when asked. A non-contiguous (or not 16-byte aligned) `a_local` is copied into my rows of ``A_full`` by
torch on the main stream first and pushed from there. Unlike pulling (:mod:`.ag_gemm_pull`), no copy kernel of my
rows competes with the first GEMM for SMs before the peers may read them.

How the host issues a call: steps 1-3 are one program of stream operations (:mod:`.stream_ops`, built once by
``PushProtocol._plan_push``), issued by one call of the runtime shim; then the two GEMMs (4, 5, through the kernel's
C entry point); step 6 (a second program). A profiled call issues the same programs, in pieces, with the profiler's
records of the pushes between them (the programs' marks).
"""
from . import stream_ops as so
from . import vectors


class PushProtocol:
    """The push protocol's programs and call, a part of :class:`tilescale.ops.allgather_gemm.AGGemm` (its buffers,
    flags, streams and events)."""

    def _plan_push(self) -> None:
        """The push protocol's programs (module docstring): ``_first`` (the call's start, then steps 2-3 on
        the copy stream; each copy ``_push_ops[i]`` (op, dst, chunk): its destination and size set for the call's
        rows by :meth:`_size_pushes`, its source per call) and ``_post`` (step 6)."""
        W, r = self.world_size, self.rank
        self._row_bytes = self.K * self.a_full.element_size()
        first = so.Program([s.cuda_stream for s in self.streams])
        first.add(so.EVENT_RECORD, self._start.cuda_event)                                   # 1
        first.add(so.EVENT_WAIT, self._start.cuda_event, stream=1)
        copies = []               # (op index, dst, chunk)
        for j in range(1, W):                                                                # 2, 3
            dst = (r - j) % W     # rank-1 first: it reads my rows first (its rank+1)
            first.add(so.WAIT_GEQ, self._freed_here[dst], 1, stream=1, label=so.wait_label("AGGemm", "freed", dst))
            first.add(so.WRITE, self._freed_here[dst], 0, stream=1)
            first.mark("copies_begin", 1, dst, "to")       # (a profiled call's records: Program.mark)
            for ch in range(self.slots):
                copies.append((first.add(so.COPY, 0, 0, 0, stream=1), dst, ch))
                first.add(so.WRITE, self._arrived_on[dst] + 8 * ch, 1, stream=1)
                first.mark("copy_done", 1, dst, ch)       # (its bytes are the call's: the profiled call adds them)
        first.add(so.EVENT_RECORD, self._joins[0].cuda_event, stream=1)
        post = so.Program([s.cuda_stream for s in self.streams])
        post.add(so.EVENT_WAIT, self._joins[0].cuda_event)                                   # 6
        post.add(so.ZERO, self.arrived.data_ptr(), 0, self.arrived.nbytes)
        for q in range(W):
            if q != r:
                post.add(so.WRITE, self._flag_at["freed"][q], 1)
        self._first, self._post = first.seal(), post.seal()
        self._push_ops = [(self._first.array[i], dst, ch) for i, dst, ch in copies]   # views into the program
        self._programs = (self._first, self._post)
        self._size_pushes(self.chunk_rows(self.rows))

    def _size_pushes(self, chunks: list) -> None:
        """The programs' copies for a call whose rows are in `chunks` ((first row, rows) each:
        ``AGGemm.chunk_rows``): the destination and size of each push (my slot of dst's A_full: rows
        ``rank * rows ..``), and its offset in the call's rows (``_push_from``; the source is set per call). A chunk
        past the call's rows copies nothing and sets its flag all the same."""
        rb, r, rows = self._row_bytes, self.rank, self.rows
        for op, dst, ch in self._push_ops:
            lo, n = chunks[ch]
            op.a, op.n = self._peers[dst].data_ptr() + (r * rows + lo) * rb, n * rb
        self._push_from = [chunks[ch][0] * rb for _, _, ch in self._push_ops]

    def _push_source(self, a_local):
        """The rows a push call sends and its first GEMM reads: `a_local` itself when the copy engines and TMA can
        read it (contiguous, 16-byte aligned; gathered() copies it into my rows of A_full later), else my rows of
        A_full, filled from it by torch on the main stream first."""
        if vectors.is_aligned(a_local):
            self._last_a, self._slot_stale = a_local, True
            return a_local
        self._slot.copy_(a_local)
        self._last_a, self._slot_stale = None, False
        return self._slot

    def _call_push(self, via, a_local, b, out, stream):
        """A call of the push protocol (module docstring): its programs and the two GEMMs, launched and issued by
        `via` (the op itself, or a profiled call's stand-ins: AGGemm.__call__)."""
        a = self._push_source(a_local)
        base = a.data_ptr()
        for (op, _, _), off in zip(self._push_ops, self._push_from, strict=True):
            op.b = base + off
        fn = via._stream_ops
        self._first.run(fn, stream, "AGGemm")                                                  # 1-3
        via._gemm_own(a, b, out, stream)                                                       # 4
        via._gemm_peers(b, out, stream)                                                        # 5
        self._post.run(fn, stream, "AGGemm")                                                   # 6
        return out
