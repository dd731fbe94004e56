"""ReduceScatter (sum) over NVLink, written in tilescale: push every slice to its owner, reduce on arrival.

torch equivalent (x: (R, ...) on every rank, R divisible by W)::

    out = torch.empty(R // W, *x.shape[1:])
    torch.distributed.reduce_scatter_tensor(out, x)      # rank r: sum over ranks of x[r*R/W:(r+1)*R/W]

Layout: x is seen as W slices of ``sv`` 16-byte vectors (:mod:`tilescale.ops.vectors`); every rank runs
one kernel of `blocks` blocks (all co-resident), block b owning vectors [lo_b, hi_b) of every slice.
Signal protocol of one call (call number e = 1, 2, ..., counted on the device: ``T.call_number(counters)``,
the same in every block of the call and new on every replay of a CUDA graph; par = e % 2 picks one of two
receive buffers):

1. block b copies chunk b of slice p of x into ``recv[par, rank]`` on rank p, for p = rank+1, rank+2, ...
   (16-byte stores through the NVLink mapping), then, after a system fence, sets ``flags[0, b, rank] = e``
   on p (``put_signal``);
2. it waits until ``flags[0, b, s] >= e`` for every other rank s: chunk b of every rank's slice is here;
3. it sums chunk b in fp32, in rank order 0..W-1 (its own slice read from x, the others from
   ``recv[par, s]``), and stores the sum, rounded once, into out.

A receive buffer is written again two calls later (e + 2), never earlier: rank p starts call e + 2 only
after its call e + 1 ended, which waited (step 2) for this rank's chunks of call e + 1, which this rank
sends only after its call e (and its reads of ``recv[par]``) ended. No handshake is needed.
(Measured on 2 x H200: splitting the blocks into pushers and reducers pipelined over sub-chunks was no
faster than this, and slower for the two-shot AllReduce built on it.)

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): step 1 is an NVSHMEM put, then an NVSHMEM signal set ordered
after it (``put_signal_block``).
"""

import tilescale
import tilescale.language as T

from . import checks, op_cache, registry, vectors
from . import reduce_scatter_hierarchical as hier
from .base import Op
from .vectors import COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["ReduceScatter", "reduce_scatter_tensor"]

# (max bytes of the full input, blocks); more blocks keep more NVLink stores in flight.
BLOCKS = ((1 << 20, 16), (16 << 20, 64), (1 << 62, 128))


@T.macro
def push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, world_size: int, threads: int, dtype: str, vec: int,
                    dst, di, dst2, di2, two_dsts: bool, team=None):
    """Steps 1-3 of the protocol above for block `b`: the sum of chunk b of this rank's slice lands in
    ``dst[di, lo:hi]`` (and ``dst2[di2, lo:hi]`` too with `two_dsts`), dst and dst2 being (., sv, vec). Ranks are
    those of `team` (None: the world)."""
    me = T.team_rank(team)
    tx = T.get_thread_binding()
    for j in T.serial(world_size - 1):
        p = (me + 1 + j) % world_size
        T.put_signal_block(x[p, lo:hi, :], recv[par, me, lo:hi, :], flags[0, b, me], value=epoch,
                           dst_pe=T.team_pe(team, p))
    if tx < world_size:
        if tx != me:
            T.wait_until(flags[0, b, tx], cmp="ge", value=epoch)
    T.sync_threads()
    acc = T.alloc_local((vec,), "float32")
    for it in T.serial(T.ceildiv(hi - lo, threads)):
        v = lo + it * threads + tx
        if v < hi:
            for i in T.vectorized(vec):
                acc[i] = 0.0
            for s in T.unroll(world_size):
                if s == me:
                    for i in T.vectorized(vec):
                        acc[i] += T.cast(x[s, v, i], "float32")
                else:
                    for i in T.vectorized(vec):
                        acc[i] += T.cast(recv[par, s, v, i], "float32")
            for i in T.vectorized(vec):
                dst[di, v, i] = T.cast(acc[i], dtype)
            if two_dsts:
                for i in T.vectorized(vec):
                    dst2[di2, v, i] = T.cast(acc[i], dtype)


@tilescale.jit(pass_configs=PASS_CONFIGS)
def reduce_scatter_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512, team=None):
    """Kernel of :class:`ReduceScatter`; the slice length `sv` (16-byte vectors) is a run-time argument,
    so one build serves every message size. `team`: the group's ranks (tilescale.runtime.team; None: the world)."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    sv = T.dynamic("sv")

    @T.prim_func
    def reduce_scatter(x: T.Tensor((W, sv, vec), dtype), out: T.Tensor((1, sv, vec), dtype),
                       recv: T.Tensor((2, W, sv, vec), dtype), flags: T.Tensor((1, blocks, W), SIGNAL),
                       counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(sv, blocks)
            lo = T.min(b * chunk, sv)
            hi = T.min(lo + chunk, sv)
            push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, W, threads, dtype, vec, out, 0, out, 0, False,
                            team)

    return reduce_scatter


def kernels(nbytes: int, world_size: int, dtype: str, sms: int, threads: int = 512, team=None) -> list:
    """[(jit function, args)] of the kernel :class:`ReduceScatter` builds for a full input of `nbytes` among the
    ranks of `team` (a kernel's group: tilescale.runtime.team.kernel_team; None: the world)."""
    args = (world_size, vectors.blocks_for(nbytes, BLOCKS, sms), dtype, threads)
    return [(reduce_scatter_kernel, args if team is None else (*args, team))]


class ReduceScatter(Op):
    """Sum-ReduceScatter of a `(R, ...)` input of `dtype` (R divisible by the world size) into `(R/W, ...)`.

    Collective to construct (allocates symmetric receive buffers, checks that every rank passed the same
    shape and dtype). `group`: the ranks it runs among (tilescale.runtime.team; None: the world), W being their
    number. ``rs(x)`` returns a new tensor with this rank's reduced rows; ``rs(x, out=t)`` writes
    them into `t`. Sums are accumulated in fp32, in rank order, and rounded once.
    """

    NAME, KERNEL = "ReduceScatter", "reduce_scatter"
    GRAPH_SAFE = True
    OUT_WHAT = "rows / world_size"

    def __init__(self, shape, dtype, *, blocks: int | None = None, threads: int = 512, group=None):
        import torch

        with self.arguments(shape=shape, dtype=dtype, blocks=blocks, threads=threads, group=group):
            self.shape = vectors.as_shape("ReduceScatter", shape)
            vectors.check_dtype("ReduceScatter", dtype)
            vectors.check_launch("ReduceScatter", blocks, threads, self.world_size)
            if len(self.shape) == 0 or self.shape[0] % self.world_size:
                checks.fail("ReduceScatter", "shape", repr(self.shape), "(rows, ...) with rows divisible by the "
                            f"world size {self.world_size}")
            checks.fits_int32("ReduceScatter", "shape", repr(self.shape), -(-vectors.numel(self.shape) // (
                self.world_size * vectors.vector_width(dtype))), "the 16-byte vectors of a rank's slice")
        W, self.dtype = self.world_size, dtype
        self.out_shape = (self.shape[0] // W, *self.shape[1:])
        self.n = vectors.numel(self.shape)
        self.slice = self.n // W                                # elements per rank's slice
        self.vec = vec = vectors.vector_width(dtype)
        self.sv = sv = -(-self.slice // vec)                    # 16-byte vectors per slice (padded)
        nbytes = self.n * vectors.element_size(dtype)
        [(fn, args)] = kernels(nbytes, W, vectors.dtype_name(dtype), vectors.sm_count(), threads, self.kernel_team)
        self.blocks = blocks or args[1]
        self.recv = self.symmetric((2, W, sv, vec), dtype)
        self.flags = self.symmetric((1, self.blocks, W), torch.uint64, zero=True)
        self.padded = sv * vec != self.slice
        self.kernel, self._direct = self.build(fn, (W, self.blocks, *args[2:]),
                                               ("x", "out", "recv", "flags", "counters", "sv"))
        self.padded_scratch(W, (W, sv, vec), (1, sv, vec))
        self.launch_args(self.recv, self.flags, self.call_counters(self.blocks))

    def __call__(self, x, out=None):
        stream = self.begin(x, out)
        W, sv, vec = self.world_size, self.sv, self.vec
        return self.launch_vectors(x, out, stream, sv, W, (W, sv, vec), (1, sv, vec))


@op_cache.cached(16)
def _cached(n, dtype, world_size, group=None):
    return ReduceScatter((n,), dtype, group=group)


_fn_check = checks.CallCheck("reduce_scatter_tensor")


def _validate_fn(output, input, op, W, group) -> None:  # noqa: A002
    from ..runtime import team

    W = team.size_of("reduce_scatter_tensor", group, W)
    checks.check_op("reduce_scatter_tensor", op)
    for name, t in (("output", output), ("input", input)):
        checks.check_tensor("reduce_scatter_tensor", name, t)
    vectors.check_dtype("reduce_scatter_tensor", input.dtype, "input")
    if output.dtype != input.dtype:
        checks.fail("reduce_scatter_tensor", "output", f"dtype {output.dtype}", f"{input.dtype} (the dtype of input)")
    if W is not None and input.numel() != W * output.numel():
        checks.fail("reduce_scatter_tensor", "output", f"{tuple(output.shape)} ({output.numel()} elements) for an "
                    f"input of {input.numel()} elements",
                    f"input.numel() / world_size = {input.numel() / W:g} elements")


def reduce_scatter_tensor(output, input, *, op="sum", group=None):  # noqa: A002  (torch's argument names)
    """``torch.distributed.reduce_scatter_tensor(output, input, group=group)`` with op "sum": `input` holds W equal
    slices (``input.numel() == W * output.numel()``, W the ranks of `group`: tilescale.runtime.team); this rank's
    slice of the sum lands in `output`, which is returned."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(output), checks.signature(input), op if isinstance(op, str) else str(op), group),
              _validate_fn, output, input, op, rt.info.world_size if rt is not None else None, group)
    rs = _cached(input.numel(), input.dtype, runtime.current().info.world_size, group)
    flat_in = input.reshape(-1)
    if output.is_contiguous():
        rs(flat_in, out=output.view(-1))
    else:
        output.copy_(rs(flat_in).view(output.shape))
    return output


# ------------------------------------------------------------------------------------- registry
def run_direct(output, input, op="sum"):  # noqa: A002  (torch's argument names)
    """torch: ``dist.reduce_scatter_tensor(output, input)``."""
    reduce_scatter_tensor(output.view(-1), input.view(-1), op=op)


def serve(world_size, output, input, **_):  # noqa: A002
    """A ``torch.distributed.reduce_scatter_tensor(output, input, op, group, async_op)`` call as a plan runs it."""
    if input.numel() != world_size * output.numel():
        return "input size is not world_size x output size"
    return registry.TorchCall(out=output, args=(input,), kwargs={"op": "sum"}, key=input,
                              msg_bytes=input.numel() * input.element_size())


def bench(algo, x, world_size):
    import torch

    x = x[:x.numel() - x.numel() % world_size]
    op = ReduceScatter(x.shape, x.dtype)
    out = torch.empty(x.numel() // world_size, device=x.device, dtype=x.dtype)
    return op, lambda: op(x, out=out), out, (torch.empty_like(out), x)


COLLECTIVE = registry.collective("reduce_scatter", torch_name="reduce_scatter_tensor", aliases=("reducescatter",),
                                 algos={"direct": registry.Algorithm(run_direct, nodes="any", graph_safe=True),
                                        "hierarchical": registry.Algorithm(hier.run_hierarchical, nodes="several",
                                                                           graph_safe=True)},
                                 tensors=("output", "input"),
                                 serve=serve, kernels=kernels, bench=bench, busbw=lambda W: (W - 1) / W, exact=False,
                                 module=__name__)
