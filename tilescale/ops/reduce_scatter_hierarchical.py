"""ReduceScatter (sum) across nodes, hierarchical: reduce over NVLink within each node first, then exchange one
fp32 partial per destination along the rails and add the node partials. One kernel.

torch equivalent (the same result as :class:`~tilescale.ops.reduce_scatter.ReduceScatter`)::

    out = torch.empty(R // W, *x.shape[1:])
    torch.distributed.reduce_scatter_tensor(out, x)      # rank r: sum over ranks of x[r*R/W:(r+1)*R/W]

Topology (:mod:`tilescale.topology`): W = n nodes x g ranks, rank ``me = a * g + i`` (node a, local index i).
Intra-node then inter-node (not the reverse): rank (a, i) reduces, over its node, the slices of every rank of
local index i, so only one partial per other node crosses the network, (n - 1) slices per rank, where the
other order sends whole node blocks, (n - 1) * g slices (docs/multinode.md, "The variants"). The partials
cross in fp32, so the sum is accumulated in fp32 all the way and rounded once, as ReduceScatter's (twice the
network bytes of a bf16 partial; the association differs: node by node, then over the nodes).

Layout: x is W slices of ``sv`` 16-byte vectors (:mod:`tilescale.ops.vectors`); every rank runs one kernel of
`blocks` blocks, block b owning vectors [lo_b, hi_b) of every slice. Buffers (symmetric): ``recv[par, k, c]``
(chunk of node peer (a, k)'s slice for rank (c, i)), ``part[par, c]`` (node c's fp32 partial of my slice),
``stage[0, c]`` (my node's fp32 partial for rank (c, i), before it is sent), ``flags[b, :]`` (g*n words: node
peers, then n: nodes). Signal protocol of one call (call number e = 1, 2, ..., counted on the device:
``T.call_number(counters)``, the same in every block and new on every replay of a CUDA graph; par = e % 2):

1. block b puts chunk b of x's slices for ranks (c, k), every node c, into ``recv[par, i, c]`` on each node
   peer (a, k), k != i, each put then ``flags[b, i * n + c] = e`` there (``put_signal``);
2. it waits until ``flags[b, k * n + c] >= e`` for every other local index k and every node c;
3. for every node c it sums chunk b over the node in fp32, local order 0..g-1 (its own slice from x, the
   others from ``recv[par, k, c]``): into ``part[par, a]`` here for c = a, into ``stage[0, c]`` otherwise;
4. it puts ``stage[0, c]`` into ``part[par, a]`` on rank (c, i), for every other node c, each put then
   ``flags[b, g * n + a] = e`` there;
5. it waits until ``flags[b, g * n + c] >= e`` for every other node c;
6. it sums ``part[par, c]`` over the nodes in fp32, node order 0..n-1, and stores it, rounded once, into out.

Why no waiting block can wait forever: every wait is for a flag that another rank sets (k != i, c != a),
never for a block of this kernel; step 1 puts before any wait, and step 4 puts after waiting only for step 1
of other ranks. No cycle.

Why no handshake is needed: the ranks that write into my memory are the ranks of my node (``recv``, step 1)
and my counterparts on the other nodes (``part``, step 4); I put to each of them directly in my steps 1 and 4,
and each waits for those puts in its own call. A buffer of parity par is written again in call e + 2: a rank
starts call e + 2 after its call e + 1 ended, which waited for my puts of call e + 1, which I make only after
my call e (and every read of it) ended. The flags hold epochs (>= e: a later call's value also passes, and
its data goes to the other parity). ``stage`` has one parity: only this rank's kernel writes it, and its puts
are blocking (the source may be reused when they return).

On one node (n = 1) the constructor refuses (use :class:`~tilescale.ops.reduce_scatter.ReduceScatter`); the
plan algorithm declines (:class:`~tilescale.ops.registry.PlanUnsupportedError`).
"""

import tilescale
import tilescale.language as T

from ..runtime import topology
from . import checks, op_cache, registry, vectors
from .allgather_hierarchical import several_nodes
from .base import Op
from .vectors import COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["ReduceScatterHierarchical"]

FP32 = "float32"
# ReduceScatter's table (tilescale.ops.reduce_scatter.BLOCKS, which tests check this against; not imported:
# reduce_scatter.py registers this module): (max bytes of the full input, blocks)
BLOCKS = ((1 << 20, 16), (16 << 20, 64), (1 << 62, 128))


@T.macro
def node_sum(x, recv, dst, d0, di, par, lo, hi, c, i, g: int, threads: int, vec: int):
    """Step 3 for node c: ``dst[d0, di, lo:hi]`` = sum over this node's ranks of their slice for rank (c, i)."""
    tx = T.get_thread_binding()
    acc = T.alloc_local((vec,), FP32)
    for it in T.serial(T.ceildiv(hi - lo, threads)):
        v = lo + it * threads + tx
        if v < hi:
            for e in T.vectorized(vec):
                acc[e] = 0.0
            for k in T.unroll(g):
                if k == i:
                    for e in T.vectorized(vec):
                        acc[e] += T.cast(x[c * g + i, v, e], FP32)
                else:
                    for e in T.vectorized(vec):
                        acc[e] += T.cast(recv[par, k, c, v, e], FP32)
            for e in T.vectorized(vec):
                dst[d0, di, v, e] = acc[e]


@tilescale.jit(pass_configs=PASS_CONFIGS)
def reduce_scatter_hierarchical_kernel(world_size: int, node_size: int, blocks: int, dtype: str = "bfloat16",
                                       threads: int = 512):
    """Kernel of :class:`ReduceScatterHierarchical`, steps 1-6 of the module docstring; the slice length `sv`
    (16-byte vectors) is a run-time argument."""
    W, g = world_size, node_size
    nodes = W // g
    vec = 16 // (4 if dtype == FP32 else 2)
    sv = T.dynamic("sv")

    @T.prim_func
    def reduce_scatter_hierarchical(x: T.Tensor((W, sv, vec), dtype), out: T.Tensor((1, sv, vec), dtype),
                                    recv: T.Tensor((2, g, nodes, sv, vec), dtype),
                                    part: T.Tensor((2, nodes, sv, vec), FP32),
                                    stage: T.Tensor((1, nodes, sv, vec), FP32),
                                    flags: T.Tensor((blocks, W + nodes), SIGNAL),
                                    counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(sv, blocks)
            lo = T.min(b * chunk, sv)
            hi = T.min(lo + chunk, sv)
            me = T.get_rank()
            a = me // g
            i = me % g
            tx = T.get_thread_binding()
            for kk in T.serial(g - 1):                                   # 1
                k = (i + 1 + kk) % g
                for c in T.serial(nodes):
                    T.put_signal_block(x[c * g + k, lo:hi, :], recv[par, i, c, lo:hi, :], flags[b, i * nodes + c],
                                       value=epoch, dst_pe=a * g + k)
            if tx < W:                                                   # 2
                if tx // nodes != i:
                    T.wait_until(flags[b, tx], cmp="ge", value=epoch)
            T.sync_threads()
            for c in T.serial(nodes):                                    # 3
                if c == a:
                    node_sum(x, recv, part, par, a, par, lo, hi, c, i, g, threads, vec)
                else:
                    node_sum(x, recv, stage, 0, c, par, lo, hi, c, i, g, threads, vec)
            T.sync_threads()
            for u in T.serial(nodes - 1):                                # 4
                c = (a + 1 + u) % nodes
                T.put_signal_block(stage[0, c, lo:hi, :], part[par, a, lo:hi, :], flags[b, W + a], value=epoch,
                                   dst_pe=c * g + i)
            if tx < nodes:                                               # 5
                if tx != a:
                    T.wait_until(flags[b, W + tx], cmp="ge", value=epoch)
            T.sync_threads()
            acc = T.alloc_local((vec,), FP32)                            # 6
            for it in T.serial(T.ceildiv(hi - lo, threads)):
                v = lo + it * threads + tx
                if v < hi:
                    for e in T.vectorized(vec):
                        acc[e] = 0.0
                    for c in T.unroll(nodes):
                        for e in T.vectorized(vec):
                            acc[e] += part[par, c, v, e]
                    for e in T.vectorized(vec):
                        out[0, v, e] = T.cast(acc[e], dtype)

    return reduce_scatter_hierarchical


def kernels(nbytes: int, world_size: int, node_size: int, dtype: str, sms: int, threads: int = 512) -> list:
    """[(jit function, args)] of the kernel :class:`ReduceScatterHierarchical` builds for a full input of
    `nbytes` on nodes of `node_size` ranks."""
    return [(reduce_scatter_hierarchical_kernel,
             (world_size, node_size, vectors.blocks_for(nbytes, BLOCKS, sms), dtype, threads))]


class ReduceScatterHierarchical(Op):
    """Sum-ReduceScatter of a `(R, ...)` input of `dtype` (R divisible by the world size) into `(R/W, ...)`,
    intra-node then inter-node (see the module docstring); the API of
    :class:`~tilescale.ops.reduce_scatter.ReduceScatter`: ``rs(x)`` returns a new tensor with this rank's
    reduced rows, ``rs(x, out=t)`` writes them into `t`. Sums are accumulated in fp32 and rounded once.
    Collective to construct; refuses a job on one node."""

    NAME, KERNEL = "ReduceScatterHierarchical", "reduce_scatter_hierarchical"
    GRAPH_SAFE = True
    OUT_WHAT = "rows / world_size"

    def __init__(self, shape, dtype, *, blocks: int | None = None, threads: int = 512):
        import torch

        topo = topology.current()
        with self.arguments(shape=shape, dtype=dtype, blocks=blocks, threads=threads, node_size=topo.node_size):
            self.shape = vectors.as_shape(self.NAME, shape)
            vectors.check_dtype(self.NAME, dtype)
            vectors.check_launch(self.NAME, blocks, threads, self.world_size)
            if len(self.shape) == 0 or self.shape[0] % self.world_size:
                checks.fail(self.NAME, "shape", repr(self.shape), "(rows, ...) with rows divisible by the "
                            f"world size {self.world_size}")
            checks.fits_int32(self.NAME, "shape", repr(self.shape), -(-vectors.numel(self.shape) // (
                self.world_size * vectors.vector_width(dtype))), "the 16-byte vectors of a rank's slice")
            several_nodes(self.NAME, topo)
        W, g, self.dtype, self.topology = self.world_size, topo.node_size, dtype, topo
        nodes = W // g
        self.out_shape = (self.shape[0] // W, *self.shape[1:])
        self.n = vectors.numel(self.shape)
        self.slice = self.n // W
        self.vec = vec = vectors.vector_width(dtype)
        self.sv = sv = -(-self.slice // vec)
        nbytes = self.n * vectors.element_size(dtype)
        [(fn, args)] = kernels(nbytes, W, g, vectors.dtype_name(dtype), vectors.sm_count(), threads)
        self.blocks = blocks or args[2]
        self.recv = self.symmetric((2, g, nodes, sv, vec), dtype)
        self.part = self.symmetric((2, nodes, sv, vec), torch.float32)
        self.stage = self.symmetric((1, nodes, sv, vec), torch.float32)
        self.flags = self.symmetric((self.blocks, W + nodes), torch.uint64, zero=True)
        self.padded = sv * vec != self.slice
        self.kernel, self._direct = self.build(fn, (W, g, self.blocks, *args[3:]),
                                               ("x", "out", "recv", "part", "stage", "flags", "counters", "sv"))
        self.padded_scratch(W, (W, sv, vec), (1, sv, vec))
        self.launch_args(self.recv, self.part, self.stage, self.flags, self.call_counters(self.blocks))

    def __call__(self, x, out=None):
        stream = self.begin(x, out)
        W, sv, vec = self.world_size, self.sv, self.vec
        return self.launch_vectors(x, out, stream, sv, W, (W, sv, vec), (1, sv, vec))


@op_cache.cached(16)
def _cached(n, dtype, world_size, node_size):
    return ReduceScatterHierarchical((n,), dtype)


def run_hierarchical(output, input, op="sum"):  # noqa: A002  (torch's argument names)
    """torch: ``dist.reduce_scatter_tensor(output, input)``; declines on one node (the same on every rank)."""
    topo = topology.current()
    if topo.nodes < 2:
        raise registry.PlanUnsupportedError(f"hierarchical reduce_scatter on {topo.nodes} node (it needs several)")
    checks.check_op("reduce_scatter_tensor", op)
    rs = _cached(input.numel(), input.dtype, topo.world_size, topo.node_size)
    rs(input.reshape(-1), out=output.view(-1))


def bench(algo, x, world_size):
    """The collectives benchmark's case (benchmarks/bench_collectives.py): ReduceScatter's, with this op."""
    import torch

    x = x[:x.numel() - x.numel() % world_size]
    op = ReduceScatterHierarchical(x.shape, x.dtype)
    out = torch.empty(x.numel() // world_size, device=x.device, dtype=x.dtype)
    return op, lambda: op(x, out=out), out, (torch.empty_like(out), x)
