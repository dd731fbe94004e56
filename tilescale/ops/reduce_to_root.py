"""Reduce (sum) to one rank over NVLink, written in tilescale: every other rank pushes, the root sums.

torch equivalent::

    torch.distributed.reduce(x, dst)         # in place on rank dst: x = sum over ranks of x; others unchanged

x is seen as 16-byte vectors (:mod:`tilescale.ops.vectors`), summed in fp32 in rank order 0..W-1 and
rounded once (bitwise the AllReduce's result). Every rank runs one kernel of `blocks` co-resident blocks;
block b owns chunk b of the vectors. The root's receive buffer is double-buffered by the parity of the call
number (par = e % 2).

Signal protocol of one call (call number e = 1, 2, ..., counted on the device: ``T.call_number(counters)``,
the same in every block of the call and new on every replay of a CUDA graph):

1. rank r != root, block b: waits until ``done[b] >= e - 2`` (the root has summed what r sent into
   ``recv[par]`` two calls ago, so it may be overwritten); copies chunk b of x into ``recv[par, r]`` on the
   root (16-byte stores through the NVLink mapping) and, after a system fence, sets ``ready[b, r] = e``
   there (``put_signal``);
2. the root, block b: waits until ``ready[b, s] >= e`` for every other rank s, sums chunk b of its own x
   and of ``recv[par, s]`` for every s into out, then sets ``done[b] = e`` on every other rank (release,
   system scope).

The root's NVLink carries W - 1 messages in, the others' one out; x and out may be the same tensor (in
place): the root's block b overwrites only its own chunk, after reading it.

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): step 1 is an NVSHMEM put, then an NVSHMEM signal set
ordered after it (``put_signal_block``); the root's ``done`` updates (step 2) are NVSHMEM atomic sets after
``nvshmem_fence``.
"""
import tilescale
import tilescale.language as T

from . import checks, op_cache, registry, vectors
from .allreduce import sum_chunk
from .base import Op
from .vectors import COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["Reduce", "reduce"]

# (max bytes per rank, blocks)
BLOCKS = ((256 << 10, 16), (8 << 20, 64), (1 << 62, 128))


@tilescale.jit(pass_configs=PASS_CONFIGS)
def reduce_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512, team=None):
    """Kernel of :class:`Reduce`; the vector count `nv` is a run-time argument. `team`: the ranks of the op's group
    (tilescale.runtime.team.kernel_team; None: the world): ``me``, ``root`` and the peers are ranks of it."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    nv = T.dynamic("nv")

    @T.prim_func
    def reduce(x: T.Tensor((nv, vec), dtype), out: T.Tensor((nv, vec), dtype), recv: T.Tensor((2, W, nv, vec), dtype),
               ready: T.Tensor((blocks, W), SIGNAL), done: T.Tensor((blocks,), SIGNAL), root: T.int32,
               counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            me = T.team_rank(team)
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(nv, blocks)
            lo = T.min(b * chunk, nv)
            hi = T.min(lo + chunk, nv)
            if me != root:
                if tx == 0:  # 1: the root has read this buffer two calls ago
                    T.wait_until(done[b], cmp="ge", value=T.max(epoch, 2) - 2)
                T.sync_threads()
                T.put_signal_block(x[lo:hi, :], recv[par, me, lo:hi, :], ready[b, me], value=epoch,
                                   dst_pe=T.team_pe(team, root))
            else:
                if tx < W:   # 2: every rank's chunk b is here
                    if tx != root:
                        T.wait_until(ready[b, tx], cmp="ge", value=epoch)
                T.sync_threads()
                sum_chunk(x, recv, out, lo, hi, par, me, tx, W, threads, dtype, vec)   # (here me is the root)
                T.sync_threads()
                if tx < W:
                    if tx != root:
                        T.st(done[b], epoch, scope="sys", sem="release", dst_pe=T.team_pe(team, tx))

    return reduce


def kernels(nbytes: int, world_size: int, dtype: str, sms: int, threads: int = 512, team=None) -> list:
    """[(jit function, args)] of the kernel :class:`Reduce` builds for `nbytes` per rank among the ranks of `team`
    (None: the world)."""
    args = (world_size, vectors.blocks_for(nbytes, BLOCKS, sms), dtype, threads)
    return [(reduce_kernel, args if team is None else (*args, team))]


class Reduce(Op):
    """Sum of a tensor of `shape` and `dtype` (bf16, fp16, fp32; accumulated in fp32) over every rank, on rank
    `dst`. Collective to construct (allocates the root's receive buffer on every rank; checks that every rank
    passed the same shape, dtype and dst). ``red(x)`` writes the sum into `x` on rank dst (in place, like
    torch) and returns `x`; ``red(x, out=t)`` writes it into `t` instead. Other ranks' tensors are left alone.
    `group`: the ranks it sums over (tilescale.runtime.team; None: the world), `dst` being a rank of it (torch's
    ``group_dst``).
    """

    NAME, KERNEL = "Reduce", "reduce"
    GRAPH_SAFE = True

    def __init__(self, shape, dtype, dst: int, *, blocks: int | None = None, threads: int = 512, group=None):
        import torch

        with self.arguments(shape=shape, dtype=dtype, dst=dst, blocks=blocks, threads=threads, group=group):
            W = self.world_size
            self.shape = vectors.as_shape("Reduce", shape)
            vectors.check_dtype("Reduce", dtype)
            vectors.check_launch("Reduce", blocks, threads, W)
            checks.fits_int32("Reduce", "shape", repr(self.shape),
                              -(-vectors.numel(self.shape) // vectors.vector_width(dtype)), "its 16-byte vectors")
            if not checks._is_int(dst) or not 0 <= dst < W:
                checks.fail("Reduce", "dst", checks.describe(dst), f"a rank in 0..{W - 1}",
                            type_error=not checks._is_int(dst))
        self.dtype, self.dst = dtype, dst
        self.n = vectors.numel(self.shape)
        self.vec = vectors.vector_width(dtype)
        self.nv = -(-self.n // self.vec)
        self.padded = self.nv * self.vec != self.n
        [(fn, args)] = kernels(self.n * vectors.element_size(dtype), W, vectors.dtype_name(dtype), vectors.sm_count(),
                               threads, self.kernel_team)
        self.blocks = blocks or args[1]
        self.recv = self.symmetric((2, W, self.nv, self.vec), dtype)
        self.ready = self.symmetric((self.blocks, W), torch.uint64, zero=True)
        self.done = self.symmetric((self.blocks,), torch.uint64, zero=True)
        self.kernel, self._direct = self.build(fn, (W, self.blocks, *args[2:]),
                                               ("x", "out", "recv", "ready", "done", "root", "counters", "nv"))
        self.padded_scratch(1, (self.nv, self.vec), (self.nv, self.vec))
        self.launch_args(self.recv, self.ready, self.done, dst, self.call_counters(self.blocks))

    def __call__(self, x, out=None):
        stream, shape = self.begin(x, out), (self.nv, self.vec)
        return self.launch_vectors(x, x if out is None else out, stream, self.nv, 1, shape, shape,
                                   writes_out=self.rank == self.dst)


@op_cache.cached(16)
def _cached(n, dtype, dst, world_size, group=None):
    return Reduce((n,), dtype, dst, group=group)


_fn_check = checks.CallCheck("reduce")


def _validate_fn(tensor, dst, op, W, group=None) -> None:
    from ..runtime import team

    checks.check_op("reduce", op)
    checks.check_tensor("reduce", "tensor", tensor)
    vectors.check_dtype("reduce", tensor.dtype, "tensor")
    if not checks._is_int(dst) or dst < 0 or (W is not None and dst >= W):
        checks.fail("reduce", "dst", checks.describe(dst), "a rank (int >= 0)" if W is None else
                    f"a rank in 0..{W - 1}", type_error=not checks._is_int(dst))
    if W is not None and group is not None and dst not in (t := team.of_group("reduce", group)):
        checks.fail("reduce", "dst", checks.describe(dst), f"a rank of the group ({t})")


def reduce(tensor, dst: int, *, op="sum", group=None):
    """``torch.distributed.reduce(tensor, dst, group=group)`` (sum): rank `dst`'s `tensor` (a world rank, of
    `group` where given: tilescale.runtime.team) receives the sum over the ranks, in place; the others' are left
    alone; returns `tensor`. One :class:`Reduce` per (numel, dtype, dst, group) is built on first use and cached."""
    from .. import runtime
    from ..runtime import team

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(tensor), dst if checks._is_int(dst) else repr(dst), op if isinstance(op, str) else
               str(op), group), _validate_fn, tensor, dst, op, rt.info.world_size if rt is not None else None, group)
    rt = runtime.current()
    root = dst if group is None else team.of_group("reduce", group).index(dst)   # (the group's rank)
    red = _cached(tensor.numel(), tensor.dtype, root, rt.info.world_size, group)
    if tensor.is_contiguous():
        red(tensor.view(-1))
    else:
        flat = tensor.reshape(-1)     # a copy
        red(flat)
        if rt.info.rank == dst:
            tensor.copy_(flat.view(tensor.shape))
    return tensor


# ------------------------------------------------------------------------------------- registry
def run_push(tensor, dst, op="sum"):
    """torch: ``dist.reduce(tensor, dst)``; every rank pushes its tensor to `dst`, which sums."""
    reduce(tensor.view(-1), dst, op=op)


def serve(world_size, tensor, dst, group_dst, **_):
    """A ``torch.distributed.reduce(tensor, dst, op, group, async_op, group_dst)`` call (sum) as a plan runs it."""
    return registry.rooted_call(world_size, tensor, dst, group_dst, "dst", op="sum")


COLLECTIVE = registry.collective("reduce", torch_name="reduce",
                                 algos={"push": registry.Algorithm(run_push, nodes="any", graph_safe=True)},
                                 tensors=("tensor",), serve=serve, kernels=kernels, bench=registry.rooted_bench(Reduce),
                                 busbw=lambda W: 1.0, exact=False, module=__name__)
