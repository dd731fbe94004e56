"""AllGather of a row-sharded tensor over NVLink, written in tilescale (one-shot push, double-buffered).

torch equivalent::

    out = torch.empty(world_size * x.shape[0], *x.shape[1:])
    torch.distributed.all_gather_into_tensor(out, x)

Buffers (symmetric, allocated once per op): two output slots ``out[0]``, ``out[1]`` of (W, n) elements
and two rows of arrival counters ``arrived[0]``, ``arrived[1]`` of W words. Call number e = 1, 2, ...
of an op is counted on the device (``T.call_number(counters)``: the same in every block of the call, new on
every replay of a CUDA graph); the kernel derives from it its slot s = (e - 1) % 2 and r = (e + 1) // 2, how
many calls have used slot s, this one included. Every rank runs one kernel of ``blocks_per_peer x W`` blocks;
there is no handshake before the data moves.

Signal protocol of call e:

1. block (b, j) copies chunk b of the local shard (16-byte aligned chunks, 16-byte vector stores through
   the NVLink mapping) into ``out[s][rank]`` on peer p = (rank + j) % W (j = 0: this rank's own slot),
   fences at system scope, then adds 1 to ``arrived[s][rank]`` on p;
2. the block numbered L = j * blocks_per_peer + b, for each L < W, waits until
   ``arrived[s][L] >= r * blocks_per_peer`` (acquire, system scope): the kernel ends when every shard
   of call e has arrived here.

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): step 1's copy is an NVSHMEM put to it, and its counter update an
NVSHMEM signal add, ordered after the put by ``nvshmem_fence`` (``put_signal_block``).

Why no handshake is needed (the calls of one op are made on one stream on every rank, as for NCCL):

3. my slot s is written (by peers, and by my own j = 0 blocks) only in calls e, e + 2, e + 4, ...: call
   e + 1 uses the other slot;
4. a peer p runs its kernel of call e + 2 only after its kernel of call e + 1 has ended (stream order);
   that one ended only after one of its blocks counted all chunks of my shard of call e + 1 (step 2);
   I push those from my kernel of call e + 1, which starts only after all the work I enqueued before it
   (stream order). So every read of call e's output that I enqueue before my next call is complete
   before any peer overwrites it (my own blocks write it in call e + 2, after it in stream order);
5. the same chain keeps the counters exact: increments of ``arrived[s]`` from a peer's call e + 2 come
   after my kernel of call e + 1 has started, hence after my kernel of call e has ended, so the wait of
   call e never counts them; the increments of call e - 2 all arrived before my kernel of call e - 2
   ended. Buffers and counters are zero on every rank before any call (``symm.zeros`` ends with a barrier).

tilelang launches kernels with programmatic dependent launch allowed: a kernel may start once every
block of the kernel before it has exited (not waiting for the memory flush). That keeps steps 4 and 5:
an exited block has finished its reads and its waits (a kernel that triggers its dependents early,
``T.pdl_trigger``, before reading our output, would not: don't do that between two calls).

What the caller sees: ``ag(x)`` returns the slot this call wrote; it holds the result for everything
enqueued on the stream before the next call of this op (use it, or copy it, before calling again: the
next call leaves it alone, but peers may overwrite it in the call after next as soon as the next call
has started). ``ag(x, out=t)`` copies the result into `t` on the stream right after the kernel, so `t`
stays valid for good.

CUDA graphs: the kernel picks its slot by the device's count, which graph replays advance without the host
knowing. So once a call of this op has been captured (``ag.captured``), during the capture and in every later
eager call, the result is taken by the device's parity, on the stream and without a host sync:
``torch.index_select(slots, 0, (counters[:1] - 1) % 2)`` into `out` (a new tensor when None: in a graph, its
static output); ``ag.out`` and ``ag.next_out`` then raise, and `out` must not be one of the slots. Before any
capture, the host's count equals the device's and ``ag(x)`` returns the slot itself (no copy).
"""
import ctypes
import math

from tilelang import tvm

import tilescale
import tilescale.language as T

from ..profiler import session as profiling
from ..profiler.session import now as _now
from . import allgather_hierarchical as hier
from . import base, checks, op_cache, registry, vectors
from .base import DoubleBuffered
from .vectors import COUNTER, SIGNAL

__all__ = ["AllGather", "all_gather", "all_gather_into_tensor"]

# Streaming multiprocessors of an H100 / H200 (SXM): the block count derives from this constant, not from
# this GPU's, because it must be the same on every rank (a rank's waits count its peers' blocks).
SMS_H100 = 132


def default_blocks_per_peer(nbytes_per_rank: int, world_size: int, sms: int = SMS_H100) -> int:
    """Blocks per peer: about 64 KiB per block for small and medium messages (enough blocks in flight
    to fill NVLink, each block short), 64 per peer for large ones; at least 2, and at most one block per
    SM in all (one wave). Any count is correct (only W blocks wait, and no block waits for a block of its
    own kernel); this is for speed."""
    want = max(2, 1 << max(0, math.ceil(math.log2(max(1, nbytes_per_rank) / (64 << 10)))))
    want = min(want, 64)
    return max(1, min(want, max(1, sms // world_size)))


@tilescale.jit
def allgather_kernel(world_size: int, blocks_per_peer: int, dtype: str = "bfloat16", threads: int = 512, team=None):
    """Kernel of :class:`AllGather` (one call, the slot of its parity): `x` (n elements) goes to
    ``out[s, rank]`` on every rank of `team` (tilescale.runtime.team; None: the world). `n` is a run-time argument,
    so one build serves every message size; chunks are whole 16-byte vectors (the last block takes the remainder,
    possibly nothing)."""
    n = T.dynamic("n")
    W, bpp = world_size, blocks_per_peer
    vec = 16 // (tvm.DataType(dtype).bits // 8)  # elements per 16-byte vector
    chunk = T.ceildiv(T.ceildiv(n, bpp), vec) * vec

    @T.prim_func
    def allgather(x: T.Tensor((n,), dtype), out: T.Tensor((2, W, n), dtype), arrived: T.Tensor((2, W), SIGNAL),
                  counters: T.Tensor((bpp * W,), COUNTER)):
        with T.Kernel(bpp, W, threads=threads) as (b, j):
            e = T.call_number(counters)
            s = T.cast((e - 1) % 2, "int32")     # this call's slot
            r = (e + 1) // 2                      # calls that have used slot s, this one included
            me = T.team_rank(team)
            peer = (me + j) % W
            size = T.max(T.min(chunk, n - b * chunk), 0)
            lo = T.min(b * chunk, n - 1)  # in bounds even when size is 0 (else tilelang would skip the signal)
            T.put_signal_block(x[lo], out[s, me, lo], arrived[s, me], size=size, value=1, sig_op="add",
                               dst_pe=T.team_pe(team, peer))
            L = j * bpp + b
            if L < W:
                if T.get_thread_binding() == 0:
                    T.wait_until(arrived[s, L], cmp="ge", value=r * bpp)
                T.sync_threads()

    return allgather


def kernels(nbytes: int, world_size: int, dtype: str = "bfloat16", sms: int = SMS_H100, threads: int = 512) -> list:
    """[(jit function, args)] of the kernel :class:`AllGather` builds for a gathered output of `nbytes` (`sms`
    is not used: see ``SMS_H100``)."""
    return [(allgather_kernel, (world_size, default_blocks_per_peer(nbytes // world_size, world_size), dtype,
                                threads))]


class AllGather(DoubleBuffered):
    """AllGather of `(rows, *cols)` shards of `dtype` into a `(W * rows, *cols)` output.

    Collective to construct (allocates symmetric buffers); calls must be made in the same order on every
    rank, on one stream. `group`: the ranks it gathers from (tilescale.runtime.team; None: the world), W being
    their number. ``ag(x)`` returns the output slot this call wrote (see the module docstring: valid
    for work enqueued before the next call); ``ag(x, out=t)`` also copies it into `t` (no copy when `t` is
    that slot). ``ag.out`` is the slot the last call wrote, ``ag.next_out`` the one the next call writes,
    ``ag.buffers`` both. Capturable in a CUDA graph; once captured, results are copies taken by the device's
    parity and ``out`` / ``next_out`` raise (module docstring).
    """

    NAME, KERNEL = "AllGather", "allgather"
    GRAPH_SAFE = True
    # Made at first use and set as plain attributes (functools.cached_property would materialize the instance's
    # __dict__, after which every attribute load of the op is slower: +15% per call on CPython 3.11):
    _entry = None    # the address of the kernel's C entry point (the direct launch; set by __init__)
    _record = None   # the constant part of its profiler records (_quick_record)
    _timed = None    # its timed call for the runtime shim (_timed_call)

    def __init__(self, shape, dtype, *, blocks_per_peer: int | None = None, threads: int = 512, group=None):
        import torch

        # a rank whose arguments are invalid must not raise alone (every rank raises if the arguments differ,
        # or if they are invalid on any rank)
        with self.arguments(shape=shape, dtype=dtype, blocks_per_peer=blocks_per_peer, threads=threads, group=group):
            self.shape = checks.as_shape("AllGather", "shape", shape, lo=1, min_dims=1,
                                         sizes="a non-empty shard shape (rows, *cols): sizes >= 1")
            checks.as_dtype("AllGather", "dtype", dtype, checks.COPY_DTYPES)
            n = math.prod(self.shape)
            checks.fits_int32("AllGather", "shape", repr(self.shape), n, "its elements (the kernel's n)")
            checks.as_int("AllGather", "blocks_per_peer", blocks_per_peer, allow_none=True)
            checks.as_threads("AllGather", threads)
        W, self.dtype, self.n, self.threads = self.world_size, dtype, n, threads
        esize = torch.empty((), dtype=dtype).element_size()
        self.blocks_per_peer = blocks_per_peer or default_blocks_per_peer(n * esize, W)
        self.make_slots((W * self.shape[0], *self.shape[1:]), dtype, n)
        self.arrived = self.symmetric((2, W), torch.uint64, zero=True)
        tl_dtype = str(dtype).replace("torch.", "")
        args = (W, self.blocks_per_peer, tl_dtype, threads)
        self.kernel, self._direct = self.build(allgather_kernel, args if self.kernel_team is None
                                               else (*args, self.kernel_team), ("x", "out", "arrived", "counters", "n"))
        self.launch_path = "direct" if self._direct is not None else "tilelang"  # how __call__ launches
        if self._direct is not None:   # (its 6 parameters: the names above and the stream; session.timed_call)
            self._entry = ctypes.cast(self._direct[0], ctypes.c_void_p).value
        self.call_counters(self.blocks_per_peer * W)
        self._ptrs = (self._slots.data_ptr(), self.arrived.data_ptr(), self.counters.data_ptr())

    def _validate(self, x, out) -> None:
        """The call checks (agreed across ranks by ``self._check``): `x` a shard of this op's shape and dtype
        on this GPU (any strides: staged), `out` None or a (W * rows, *cols) tensor of the dtype on this GPU
        (any strides: copied into)."""
        checks.check_tensor("AllGather", "x", x, shape=self.shape, dtype=self.dtype, device=self.device,
                            what="the shard shape this AllGather was built for")
        if out is not None:
            checks.check_tensor("AllGather", "out", out, shape=tuple(self.buffers[0].shape), dtype=self.dtype,
                                device=self.device, what="world_size x the shard")

    def __call__(self, x, out=None):
        # Op.begin, inline for the common call (issue 15: host time): not capturing a CUDA graph, no `out`, and the
        # signature of `x` agreed before (the key is Op.call_key's); the stream order as in Op.begin. Anything else,
        # or an `x` whose key cannot be read, takes Op.begin itself. The capture query is skipped on torch's default
        # stream, the legacy NULL stream (handle 0): CUDA refuses to begin a capture there (and torch.cuda.graph
        # refuses the default stream), so it is never capturing.
        try:
            fast = out is None and (type(x), x.dtype, x.shape, x.device, None) in self._agreed
        except Exception:  # noqa: BLE001  (not a tensor: Op.begin's checks say what is wrong)
            fast = False
        if fast:
            stream = self._stream()
            if stream and base._capturing():
                stream = self.begin(x, out)
            elif stream != self._order.handle:
                self._order.switch(stream)
        else:
            stream = self.begin(x, out)
        p = x.data_ptr()
        if p & 15 or not x.is_contiguous():   # vectors.is_aligned, written out: no Python call on the fast path
            x = vectors.aligned(x)               # whole 16-byte vectors
            p = x.data_ptr()
        prof = profiling.current
        if prof is None:
            direct = self._direct
            if direct is not None:   # Op.launch_direct, inline
                out3d, arrived, counters = self._ptrs
                if direct[0](p, out3d, arrived, counters, self.n, stream):
                    raise self.launch_error()
            else:
                self.kernel.launch(x.view(-1), self._out3d, self.arrived, self.counters)
        elif (timed := prof.timed) is not None and self._entry is not None:
            # a session of host events with the runtime shim's timed calls: the shim launches through the C entry
            # point and records the call and its LAUNCH (session.ShimCalls)
            if timed(self._timed or self._timed_call(), p, stream):
                raise self.launch_error()
        elif prof.quick_coll:   # the same, recorded here: four ints
            t0 = _now()
            self._launch(x, p, stream)
            prof.raw.extend((self._quick_record(), prof.top, t0, _now()))
        else:   # not decided yet, or a session recording more than host events: OpCall
            return self._call_recorded(x, p, stream, out)
        if out is None and not self.captured:   # DoubleBuffered.slot_result, inline: the slot of the host's count
            s = self.calls
            self.calls = s + 1
            return self.buffers[s & 1]
        return self.slot_result(out)

    def _quick_record(self) -> int:
        """The constant part of this op's profiler records (a COLL call with its LAUNCH), registered at the first
        quick-recorded call and kept (``profiling.call_record``)."""
        if self._record is None:
            self._record = profiling.call_record("coll", "AllGather", "allgather",
                                                 bytes=self.n * self.buffers[0].itemsize)
        return self._record

    def _timed_call(self) -> int:
        """This op's timed call for the runtime shim (its C entry point and record: ``profiling.timed_call``), made at
        the first call that the shim times and kept."""
        self._timed = profiling.timed_call(self._entry, self._quick_record(), (0, *self._ptrs, self.n, 0), (0, 5))
        return self._timed

    def _launch(self, x, p, stream) -> None:
        """The launch of a call (no record): through the kernel's C entry point, else tilelang's launch."""
        if self._direct is not None:
            self.launch_direct(p, *self._ptrs, self.n, stream)
        else:
            self.kernel.launch(x.view(-1), self._out3d, self.arrived, self.counters)

    def _call_recorded(self, x, p, stream, out):
        """The launch and result of a call, recorded through the profiler's general path (OpCall): in a session that
        is not ``quick_coll`` (KERNEL timed by CUDA events, a live profiler, COLL masked off), or at the first call of
        a run, which decides on TILESCALE_PROFILE."""
        rec = profiling.call("AllGather", launch="allgather", bytes=x.nbytes)
        self._launch(x, p, stream)
        if rec is not None:  # tilescale.profiler: the call and its launch end here
            rec.end()
        return self.slot_result(out)


@op_cache.cached(16, close_evicted=False)
def _cached(shape, dtype, world_size, group=None):
    return AllGather(shape, dtype, group=group)


_fn_check = checks.CallCheck("all_gather")
_fn_into_check = checks.CallCheck("all_gather_into_tensor")


def _validate_shard(op: str, x, group=None) -> None:
    if group is not None:
        from ..runtime import team

        team.of_group(op, group)     # a bad group: an argument error, agreed as the others
    checks.check_tensor(op, "input" if op == "all_gather_into_tensor" else "x", x, dtypes=checks.COPY_DTYPES,
                        min_dims=1)
    if x.numel() < 1:
        checks.fail(op, "input" if op == "all_gather_into_tensor" else "x", checks.describe(x),
                    "a non-empty shard")


def all_gather(x, *, group=None):
    """``torch.cat(all_gather(x))`` over all ranks (of `group`: tilescale.runtime.team): a new tensor
    (W * rows, ...)."""
    from .. import runtime

    if group is None:
        _fn_check(checks.signature(x), _validate_shard, "all_gather", x)
    else:
        _fn_check((checks.signature(x), group), _validate_shard, "all_gather", x, group)
    return _cached(tuple(x.shape), x.dtype, runtime.current().info.world_size, group)(x).clone()


def all_gather_into_tensor(output, input, *, group=None):  # noqa: A002  (torch's argument names)
    """``torch.distributed.all_gather_into_tensor(output, input, group)``: one local copy into `output`, or none
    when `output` is the slot this call writes (``_cached(...).next_out``, before any CUDA graph capture)."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_into_check((checks.signature(output), checks.signature(input), group), _validate_into, output, input,
                   rt, group)
    ag = _cached(tuple(input.shape), input.dtype, runtime.current().info.world_size, group)
    return ag(input, out=output)


def _validate_into(output, input, rt, group) -> None:  # noqa: A002
    from ..runtime import team

    W = team.size_of("all_gather_into_tensor", group, None if rt is None else rt.info.world_size)
    _validate_shard("all_gather_into_tensor", input)
    if W is None:  # no runtime: no world size (and the call stops right after)
        return checks.check_tensor("all_gather_into_tensor", "output", output, dtype=input.dtype)
    checks.check_tensor("all_gather_into_tensor", "output", output, shape=(W * input.shape[0], *input.shape[1:]),
                        dtype=input.dtype, what="world_size x input rows")


# ------------------------------------------------------------------------------------- registry
def run_push(output, input):  # noqa: A002
    """torch: ``dist.all_gather_into_tensor(output, input)``."""
    n = input.numel()
    if n == 0 or n >= 1 << 31:
        raise registry.PlanUnsupportedError(f"allgather of {n} elements per rank (the kernel takes 1 .. 2**31 - 1)")
    all_gather_into_tensor(output.view(-1), input.view(-1))


def serve(world_size, output_tensor, input_tensor, **_):
    """A ``torch.distributed.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)`` call as a
    plan runs it."""
    if output_tensor.numel() != world_size * input_tensor.numel():
        return "output size is not world_size x input size"
    return registry.TorchCall(out=output_tensor, args=(input_tensor,), key=input_tensor,
                              msg_bytes=output_tensor.numel() * output_tensor.element_size())


def bench(algo, x, world_size):
    """A shard of a W-th of the message, gathered into a tensor of the caller's."""
    import torch

    x = x[:x.numel() // world_size]
    op = AllGather(x.shape, x.dtype)
    out = torch.empty(world_size * x.numel(), device=x.device, dtype=x.dtype)
    return op, lambda: op(x, out=out), out, (torch.empty_like(out), x)


COLLECTIVE = registry.collective("allgather", torch_name="all_gather_into_tensor", aliases=("all_gather",),
                                 algos={"push": registry.Algorithm(run_push, nodes="any", graph_safe=True),
                                        "hierarchical": registry.Algorithm(hier.run_hierarchical, nodes="several",
                                                                           graph_safe=True)},
                                 tensors=("output_tensor", "input_tensor"),
                                 serve=serve, kernels=kernels, bench=bench, busbw=lambda W: (W - 1) / W, exact=True,
                                 module=__name__)
