"""AllGather of a row-sharded tensor over NVLink, written in tilescale (push).

torch equivalent::

    out = torch.empty(world_size * x.shape[0], *x.shape[1:])
    torch.distributed.all_gather_into_tensor(out, x)

Signal protocol of one call (epoch e = 1, 2, ...; every rank runs one kernel of
``blocks_per_peer x world_size`` blocks, all co-resident):

1. block (b, j) serves peer p = (rank + j) % W (j = 0 is this rank's own copy); it tells p that this
   rank has entered epoch e: ``ready[rank] = e`` on p (release, system scope);
2. it waits until p has entered epoch e too (``ready[p] >= e`` here): p no longer reads the output
   of the previous call, so it may be overwritten;
3. it copies chunk b of the local shard into ``out[rank]`` on p (vector stores through the NVLink
   mapping), fences, and adds 1 to ``arrived[rank]`` on p;
4. blocks (b < W, j = 0) wait until ``arrived[b] >= e * blocks_per_peer``: when the kernel ends, every
   shard has arrived here.
"""
import functools
import math

import tilescale
import tilescale.language as T


def default_blocks_per_peer(nbytes_per_rank: int, world_size: int, sms: int = 132) -> int:
    """Blocks per peer: enough for bandwidth on large messages, few for latency on small ones,
    and at most one wave (all blocks must be co-resident)."""
    if nbytes_per_rank <= 64 << 10:
        want = 1
    elif nbytes_per_rank <= 1 << 20:
        want = 4
    elif nbytes_per_rank <= 16 << 20:
        want = 16
    elif nbytes_per_rank <= 64 << 20:
        want = 32
    else:
        want = 64
    want = max(want, world_size)  # blocks (b < W, j = 0) do the final waits
    return max(world_size, min(want, max(1, sms // world_size)))


@tilescale.jit
def allgather_kernel(world_size: int, blocks_per_peer: int, dtype: str = "bfloat16", threads: int = 512):
    """Kernel of :class:`AllGather`; the shard size `n` (elements, divisible by blocks_per_peer) is a
    run-time argument, so one build serves every message size."""
    n = T.dynamic("n")
    chunk = n // blocks_per_peer

    @T.prim_func
    def allgather(x: T.Tensor((n,), dtype), out: T.Tensor((world_size, n), dtype),
                  ready: T.Tensor((world_size,), "uint64"), arrived: T.Tensor((world_size,), "uint64"),
                  epoch: T.uint64):
        with T.Kernel(blocks_per_peer, world_size, threads=threads) as (b, j):
            me = T.get_rank()
            peer = (me + j) % world_size
            tx = T.get_thread_binding()
            if tx == 0:
                T.st(ready[me], epoch, scope="sys", sem="release", dst_pe=peer)
                T.wait_until(ready[peer], cmp="ge", value=epoch)
            T.sync_threads()
            T.put_signal_block(x[b * chunk:(b + 1) * chunk], out[me, b * chunk:(b + 1) * chunk], arrived[me],
                               value=1, sig_op="add", dst_pe=peer)
            if j == 0:
                if b < world_size:
                    if tx == 0:
                        T.wait_until(arrived[b], cmp="ge", value=epoch * blocks_per_peer)
                    T.sync_threads()

    return allgather


class AllGather:
    """AllGather of `(rows, *cols)` shards of `dtype` into a symmetric `(W * rows, *cols)` output.

    Collective to construct (allocates symmetric buffers). ``ag(x)`` returns the gathered output, which
    lives in this object's symmetric buffer and is overwritten by the next call; ``ag(x, out=t)`` writes
    into `t` instead (a copy unless `t` is this object's buffer).
    """

    def __init__(self, shape, dtype, *, blocks_per_peer: int | None = None, threads: int = 512):
        import torch

        from .. import runtime, symm

        rt = runtime.current()
        self.world_size = W = rt.info.world_size
        self.rank = rt.info.rank
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.n = n = math.prod(self.shape)
        esize = torch.empty((), dtype=dtype).element_size()
        bpp = blocks_per_peer or default_blocks_per_peer(n * esize, W)
        while n % bpp:  # chunks must tile the shard
            bpp -= 1
        self.blocks_per_peer = bpp
        self.out = symm.empty((W * self.shape[0], *self.shape[1:]), dtype=dtype)
        self.ready = symm.zeros((W,), dtype=torch.uint64)
        self.arrived = symm.zeros((W,), dtype=torch.uint64)
        self.epoch = 0
        tl_dtype = str(dtype).replace("torch.", "")
        self.kernel = allgather_kernel(W, bpp, tl_dtype, threads)
        self.kernel.prepare()
        self._out2d = self.out.view(W, n)

    def close(self) -> None:
        """Free this op's symmetric buffers (collective)."""
        from .. import symm

        for t in (self.out, self.ready, self.arrived,):
            symm.free(t)

    def __call__(self, x, out=None):
        if tuple(x.shape) != self.shape or x.dtype != self.dtype:
            raise ValueError(f"x: got {tuple(x.shape)} {x.dtype}, expected {self.shape} {self.dtype} "
                             "(the shard shape this AllGather was built for)")
        if not x.is_contiguous():
            x = x.contiguous()
        self.epoch += 1
        self.kernel.launch(x.view(-1), self._out2d, self.ready, self.arrived, self.epoch)
        if out is None or out.data_ptr() == self.out.data_ptr():
            return self.out
        out.copy_(self.out)
        return out


@functools.lru_cache(maxsize=16)
def _cached(shape, dtype, world_size):
    return AllGather(shape, dtype)


def all_gather(x):
    """``torch.cat(all_gather(x))`` over all ranks: a new tensor (W * rows, ...)."""
    from .. import runtime

    return _cached(tuple(x.shape), x.dtype, runtime.current().info.world_size)(x).clone()


def all_gather_into_tensor(output, input):  # noqa: A002  (torch's argument names)
    """``torch.distributed.all_gather_into_tensor(output, input)``: zero-copy when `output` is the
    buffer of the cached :class:`AllGather`, else one local copy into `output`."""
    from .. import runtime

    ag = _cached(tuple(input.shape), input.dtype, runtime.current().info.world_size)
    if output.shape != ag.out.shape or output.dtype != ag.out.dtype:
        raise ValueError(f"output: got {tuple(output.shape)} {output.dtype}, expected {tuple(ag.out.shape)} "
                         f"{ag.out.dtype} (world_size x input rows)")
    return ag(input, out=output)
