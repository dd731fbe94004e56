"""AllGather across nodes, hierarchical: each shard crosses the network once per other node (to the rank of
the same local index there, its rail), and that rank forwards it to its node's peers over NVLink. One kernel.

torch equivalent (the same result as :class:`~tilescale.ops.allgather.AllGather`)::

    out = torch.empty(world_size * x.shape[0], *x.shape[1:])
    torch.distributed.all_gather_into_tensor(out, x)

Topology (:mod:`tilescale.topology`): W = n nodes x g ranks, rank ``me = a * g + i`` (node a, local index i).
Inter-node then intra-node (not the reverse): the network carries (n - 1) shards per rank, the other order
(n - 1) * g (docs/multinode.md, "The variants"). A peer on another node is reached through NVSHMEM's API
(``T.put_signal_block`` picks it where there is no load/store mapping), a peer of this node through NVLink.

Buffers (symmetric, allocated once per op): two output slots ``out[0]``, ``out[1]`` of (W, n) elements and two
arrays of flags ``flags[0]``, ``flags[1]`` of (W, bpp) words, ``flags[s][q, b]`` saying that chunk b of
rank q's shard is in ``out[s][q]`` here; the kernel gets both slots and both arrays. Call number e = 1, 2, ...
of an op is counted on the device (``T.call_number(counters)``, local call counters of one word per block: the
same in every block of the call, new on every replay of a CUDA graph); the kernel derives from it its slot
s = (e - 1) % 2 and r = (e + 1) // 2, how many calls have used slot s, this one included. Each rank's kernel has
``bpp x W`` blocks, block (b, j) moving chunk b (16-byte aligned) of one shard; its row j gives its role.

Signal protocol of call e (every put is ``put_signal_block``: the chunk, then ``flags[s][q, b] = r`` on the
destination, after a system fence; every wait is ``flags[s][q, b] >= r``, acquire, system scope):

1. rail rows, j = u < n - 1: put chunk b of x into ``out[s][me]`` on rank ((a + 1 + u) % n, i); then wait for
   chunk b of rank ((a - 1 - u) % n, i)'s shard (it arrives over the network);
2. node rows, j = n - 1 + t, t < g: put chunk b of x into ``out[s][me]`` on rank (a, (i + t) % g) (t = 0:
   this rank's own slot, no wait); for t > 0 wait for chunk b of rank (a, (i - t) % g)'s shard;
3. forward rows, the other (n - 1)(g - 1) rows, one per (other node u, other local index t): wait for chunk b
   of the shard of q = ((a + 1 + u) % n, i) (step 1 of rank q), put it from ``out[s][q]`` here into
   ``out[s][q]`` on rank (a, (i + t) % g); then wait for chunk b of the shard of ((a + 1 + u) % n, (i - t) % g),
   which rank (a, (i - t) % g) forwards to this rank in its own step 3.

Every slot ``out[s][q]`` of every rank has exactly one writer per call (itself, a rank of its node, its
counterpart on node q's node, or its node's rank of q's local index), and every chunk of every other rank's
shard is waited for by some block (steps 1-3 cover the n - 1 rail shards, the g - 1 node shards and the
(n - 1)(g - 1) forwarded ones): the kernel ends when all of call e's output is here.

Why no waiting block can wait forever (ranks may share a GPU, blocks of one kernel are not co-resident):

4. every wait is for a flag another rank sets (q != me in steps 1-3), never for a block of this kernel;
5. the blocks of steps 1 and 2 put before they wait, so their flags are set whatever else runs; the blocks of
   step 3 wait only for those flags (step 1 of another rank) before putting. No cycle.

Why no handshake is needed (the calls of one op are made on one stream on every rank, as for NCCL):

6. my slot s is written only in calls e, e + 2, ...; call e + 1 uses the other slot;
7. every rank that writes into my memory (the ranks of my node, and my counterparts on the other nodes) is one
   I put to directly in steps 1-2, and its kernel of call e + 1 waits for those chunks of my call e + 1.
   It runs call e + 2 only after that kernel ended (stream order), and I put them only in my kernel of call
   e + 1, after my kernel of call e and everything I enqueued before it. So every read of call e's output
   that I enqueue before my next call is complete before any rank writes that slot again;
8. the same chain keeps the flags exact: r grows by one per use of slot s, a flag of slot s is set to r + 1
   only after my kernel of call e ended, and the value r - 1 of the use before was seen by my previous use.
   Outputs and flags are zero on every rank before any call (``symm.zeros`` ends with a barrier), and so are
   the call counters; every rank makes (and replays) the same calls of an op in the same order, so every
   rank's kernel of one call counts the same e, hence uses the same s and r.

As for AllGather, programmatic dependent launch keeps 7 and 8 (a kernel starts once every block of the one
before has exited). What the caller sees is AllGather's (:class:`~tilescale.ops.base.DoubleBuffered`): ``ag(x)``
returns the slot this call wrote (valid for work enqueued before the next call); ``ag(x, out=t)`` copies it into
`t`. CUDA graphs: once a call of this op has been captured (``ag.captured``), the result is taken by the
device's parity (``(counters[:1] - 1) % 2``), copied on the stream into `out` (a new tensor when None), and
``ag.out`` / ``ag.next_out`` raise. On one node (n = 1) there is nothing to be hierarchical about: the
constructor refuses (use :class:`~tilescale.ops.allgather.AllGather`); the plan algorithm declines
(:class:`~tilescale.ops.registry.PlanUnsupportedError`, the same on every rank), and tilescale.distributed then
passes the call to torch.distributed. The selector offers it only on several nodes (:mod:`tilescale.plan.builtin`).
"""
import math

from tilelang import tvm

import tilescale
import tilescale.language as T

from ..runtime import topology
from . import checks, op_cache, registry, vectors
from .base import DoubleBuffered
from .vectors import COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["AllGatherHierarchical"]

SMS_H100 = 132   # as AllGather: the block count must be the same on every rank


@tilescale.jit(pass_configs=PASS_CONFIGS)
def allgather_hierarchical_kernel(world_size: int, node_size: int, blocks_per_peer: int, dtype: str = "bfloat16",
                                  threads: int = 512):
    """Kernel of :class:`AllGatherHierarchical` (one call, the slot of its parity): `x` (n elements) goes to
    ``out[s, rank]`` on every rank, in the steps of the module docstring. `n` is a run-time argument."""
    n = T.dynamic("n")
    W, g, bpp = world_size, node_size, blocks_per_peer
    nodes = W // g
    gm1 = max(g - 1, 1)                       # forward rows per other node (none when g == 1)
    vec = 16 // (tvm.DataType(dtype).bits // 8)
    chunk = T.ceildiv(T.ceildiv(n, bpp), vec) * vec

    @T.prim_func
    def allgather_hierarchical(x: T.Tensor((n,), dtype), out: T.Tensor((2, W, n), dtype),
                               flags: T.Tensor((2, W, bpp), SIGNAL), counters: T.Tensor((bpp * W,), COUNTER)):
        with T.Kernel(bpp, W, threads=threads) as (b, j):
            e = T.call_number(counters)
            s = T.cast((e - 1) % 2, "int32")     # this call's slot
            r = (e + 1) // 2                      # calls that have used slot s, this one included
            me = T.get_rank()
            a = me // g
            i = me % g
            size = T.max(T.min(chunk, n - b * chunk), 0)
            lo = T.min(b * chunk, n - 1)  # in bounds even when size is 0 (the flag is set all the same)
            if j < nodes - 1 + g:         # steps 1 and 2: this rank's shard, then one wait
                t = j - (nodes - 1)
                dst = T.if_then_else(j < nodes - 1, ((a + 1 + j) % nodes) * g + i, a * g + (i + t) % g)
                src = T.if_then_else(j < nodes - 1, ((a + nodes - 1 - j) % nodes) * g + i, a * g + (i + g - t) % g)
                T.put_signal_block(x[lo], out[s, me, lo], flags[s, me, b], size=size, value=r, dst_pe=dst)
                if src != me:
                    if T.get_thread_binding() == 0:
                        T.wait_until(flags[s, src, b], cmp="ge", value=r)
                    T.sync_threads()
            else:                         # step 3: forward a rail shard to one peer of this node
                f = j - (nodes - 1 + g)
                node = (a + 1 + f // gm1) % nodes
                t = 1 + f % gm1
                q = node * g + i
                if T.get_thread_binding() == 0:
                    T.wait_until(flags[s, q, b], cmp="ge", value=r)
                T.sync_threads()
                T.put_signal_block(out[s, q, lo], out[s, q, lo], flags[s, q, b], size=size, value=r,
                                   dst_pe=a * g + (i + t) % g)
                if T.get_thread_binding() == 0:
                    T.wait_until(flags[s, node * g + (i + g - t) % g, b], cmp="ge", value=r)
                T.sync_threads()

    return allgather_hierarchical


def blocks_per_peer(nbytes_per_rank: int, world_size: int, sms: int = SMS_H100) -> int:
    """AllGather's rule (:func:`tilescale.ops.allgather.default_blocks_per_peer`, which tests check this against;
    not imported: allgather.py registers this module): the grids are alike. About 64 KiB per block, 2 to 64 per
    peer, one wave of an H100 / H200 in all (the same count on every rank, whatever its GPU)."""
    want = min(64, max(2, 1 << max(0, math.ceil(math.log2(max(1, nbytes_per_rank) / (64 << 10))))))
    return max(1, min(want, max(1, sms // world_size)))


def kernels(nbytes: int, world_size: int, node_size: int, dtype: str = "bfloat16", threads: int = 512) -> list:
    """[(jit function, args)] of the kernel :class:`AllGatherHierarchical` builds for a gathered output of
    `nbytes` on nodes of `node_size` ranks."""
    return [(allgather_hierarchical_kernel,
             (world_size, node_size, blocks_per_peer(nbytes // world_size, world_size), dtype, threads))]


def several_nodes(op: str, topo) -> None:
    """OpArgumentError (on every rank alike) unless the job spans several nodes."""
    if topo.nodes < 2:
        checks.fail(op, "topology", f"{topo.nodes} node of {topo.node_size} ranks",
                    "a job on several nodes (real ones, or emulated with TILESCALE_NODE_SIZE); on one node use the "
                    "flat op")


class AllGatherHierarchical(DoubleBuffered):
    """AllGather of `(rows, *cols)` shards of `dtype` into a `(W * rows, *cols)` output, inter-node then
    intra-node (see the module docstring); the API of :class:`~tilescale.ops.allgather.AllGather`.

    Collective to construct (allocates symmetric buffers); refuses a job on one node. ``ag(x)`` returns the
    output slot this call wrote (valid for work enqueued before the next call); ``ag(x, out=t)`` also copies
    it into `t`. ``ag.out`` is the slot the last call wrote, ``ag.next_out`` the one the next call writes,
    ``ag.buffers`` both. Capturable in a CUDA graph; once captured, results are copies taken by the device's
    parity and ``out`` / ``next_out`` raise (:class:`~tilescale.ops.base.DoubleBuffered`)."""

    NAME, KERNEL = "AllGatherHierarchical", "allgather_hierarchical"
    GRAPH_SAFE = True
    X_WHAT = "the shard shape this AllGatherHierarchical was built for"
    OUT_WHAT = "world_size x the shard"

    def __init__(self, shape, dtype, *, blocks_per_peer: int | None = None, threads: int = 512):
        import torch

        topo = topology.current()
        with self.arguments(shape=shape, dtype=dtype, blocks_per_peer=blocks_per_peer, threads=threads,
                            node_size=topo.node_size):
            self.shape = checks.as_shape(self.NAME, "shape", shape, lo=1, min_dims=1,
                                         sizes="a non-empty shard shape (rows, *cols): sizes >= 1")
            checks.as_dtype(self.NAME, "dtype", dtype, checks.COPY_DTYPES)
            n = math.prod(self.shape)
            checks.fits_int32(self.NAME, "shape", repr(self.shape), n, "its elements (the kernel's n)")
            checks.as_int(self.NAME, "blocks_per_peer", blocks_per_peer, allow_none=True)
            checks.as_threads(self.NAME, threads)
            several_nodes(self.NAME, topo)
        W, self.dtype, self.n, self.topology = self.world_size, dtype, n, topo
        self.out_shape = (W * self.shape[0], *self.shape[1:])
        esize = torch.empty((), dtype=dtype).element_size()
        [(fn, args)] = kernels(n * esize * W, W, topo.node_size, str(dtype).replace("torch.", ""), threads)
        self.blocks_per_peer = bpp = blocks_per_peer or args[2]
        self.make_slots(self.out_shape, dtype, n)
        self.flags = self.symmetric((2, W, bpp), torch.uint64, zero=True)
        self.kernel, self._direct = self.build(fn, (W, topo.node_size, bpp, *args[3:]),
                                               ("x", "out", "flags", "counters", "n"))
        self.call_counters(bpp * W)
        self._ptrs = (self._slots.data_ptr(), self.flags.data_ptr(), self.counters.data_ptr())

    def __call__(self, x, out=None):
        stream = self.begin(x, out)
        x = vectors.aligned(x)   # whole 16-byte vectors
        if self._direct is not None:
            self.launch_direct(x.data_ptr(), *self._ptrs, self.n, stream)
        else:
            self.kernel.launch(x.view(-1), self._out3d, self.flags, self.counters)
        return self.slot_result(out)


@op_cache.cached(16, close_evicted=False)
def _cached(shape, dtype, world_size, node_size):
    return AllGatherHierarchical(shape, dtype)


def run_hierarchical(output, input):  # noqa: A002  (torch's argument names)
    """torch: ``dist.all_gather_into_tensor(output, input)``; declines on one node (the same on every rank)."""
    topo = topology.current()
    if topo.nodes < 2:
        raise registry.PlanUnsupportedError(f"hierarchical allgather on {topo.nodes} node (it needs several)")
    n = input.numel()
    if n == 0 or n >= 1 << 31:
        raise registry.PlanUnsupportedError(f"allgather of {n} elements per rank (the kernel takes 1 .. 2**31 - 1)")
    _cached((n,), input.dtype, topo.world_size, topo.node_size)(input.reshape(-1), out=output.view(-1))


def bench(algo, x, world_size):
    """The collectives benchmark's case (benchmarks/bench_collectives.py): AllGather's, with this op."""
    import torch

    x = x[:x.numel() // world_size]
    op = AllGatherHierarchical(x.shape, x.dtype)
    out = torch.empty(world_size * x.numel(), device=x.device, dtype=x.dtype)
    return op, lambda: op(x, out=out), out, (torch.empty_like(out), x)
