"""AllReduce (sum) over NVLink, written in tilescale: one-shot for small messages, two-shot for large.

torch equivalent::

    torch.distributed.all_reduce(x)          # in place: x = sum over ranks of x

Both kernels see x as 16-byte vectors (:mod:`tilescale.ops.vectors`), accumulate in fp32 in rank order
0..W-1 and round once, so every rank gets bitwise the same result. Every rank runs one kernel of
`blocks` co-resident blocks; block b owns chunk b of the vectors. The call number e = 1, 2, ... is counted
on the device (``T.call_number(counters)``: every block of the call reads the same e, also when the call is
replayed from a CUDA graph). Receive buffers are double-buffered by its parity (par = e % 2), which makes a
call safe to follow the previous one without a handshake:
a peer writes ``recv[par]`` again only in call e + 2, which it starts after its call e + 1 waited for
data this rank sent after finishing call e.

One-shot (latency: one exchange), protocol of call e:

1. block b copies chunk b of x into ``recv[par, rank]`` on every other rank p (16-byte stores through
   the NVLink mapping), then sets ``flags[b, rank] = e`` on p after a system fence (``put_signal``);
2. it waits until ``flags[b, s] >= e`` for every other rank s;
3. it sums chunk b of x (its own) and of ``recv[par, s]`` for every s, in fp32, into out.

Two-shot (bandwidth: each rank sends and receives 2 (W-1)/W of the message), x seen as W slices:

1-3. ReduceScatter (the protocol of :mod:`tilescale.ops.reduce_scatter`): block b pushes chunk b of
   slice p to rank p, waits for chunk b of its own slice from everyone (``flags[0, b, s] >= e``), sums
   it into ``out[rank]`` and into its symmetric ``red[par]``;
4. it sets ``flags[1, b, rank] = e`` on every other rank (release, system scope): chunk b of this rank's
   reduced slice is readable;
5. for every other rank s it waits until ``flags[1, b, s] >= e`` and copies chunk b of ``red[par]`` from
   s (16-byte loads over NVLink) into ``out[s]``.
``red[par]`` is rewritten in call e + 2 only, after every peer finished call e + 1 and so its reads of
call e (step 5).

x and out may be the same tensor (in place): one-shot block b overwrites only the chunk it has already
sent; two-shot block b overwrites chunk b of ``x[s]`` only after s has summed it (step 5), which needed
this block's push of it.

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): its pushes (one-shot step 1, two-shot step 1) are
NVSHMEM puts followed by a signal set (``put_signal_block``), the flag of step 4 an NVSHMEM atomic set after
``nvshmem_fence``, the copy of step 5 an NVSHMEM get (``get_block``).
"""

import tilescale
import tilescale.language as T

from . import checks, op_cache, registry, vectors
from .base import Op
from .reduce_scatter import push_and_reduce
from .vectors import COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["AllReduce", "all_reduce", "ONE_SHOT_MAX_BYTES"]

ONE_SHOT_MAX_BYTES = 1 << 20
"""``algo="auto"`` uses the one-shot kernel up to this many bytes per rank, the two-shot kernel above."""

# (max bytes per rank, blocks) of each algorithm.
ONE_SHOT_BLOCKS = ((256 << 10, 16), (8 << 20, 64), (1 << 62, 128))
TWO_SHOT_BLOCKS = ((4 << 20, 32), (1 << 62, 128))


@T.macro
def sum_chunk(x, recv, out, lo, hi, par, me, tx, world_size: int, threads: int, dtype: str, vec: int):
    """Vectors [lo, hi) of `out` = the sum over ranks s of x (s = me) and ``recv[par, s]`` (the others),
    accumulated in fp32 in rank order 0..W-1 and rounded once (the one-shot sum; x, out: (nv, vec))."""
    acc = T.alloc_local((vec,), "float32")
    for it in T.serial(T.ceildiv(hi - lo, threads)):
        v = lo + it * threads + tx
        if v < hi:
            for k in T.vectorized(vec):
                acc[k] = 0.0
            for s in T.unroll(world_size):
                if s == me:
                    for k in T.vectorized(vec):
                        acc[k] += T.cast(x[v, k], "float32")
                else:
                    for k in T.vectorized(vec):
                        acc[k] += T.cast(recv[par, s, v, k], "float32")
            for k in T.vectorized(vec):
                out[v, k] = T.cast(acc[k], dtype)


@tilescale.jit(pass_configs=PASS_CONFIGS)
def allreduce_one_shot_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512, team=None):
    """One-shot kernel of :class:`AllReduce`; the vector count `nv` is a run-time argument; `team`: the ranks of the
    op's group (tilescale.runtime.team.kernel_team; None: the world)."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    nv = T.dynamic("nv")

    @T.prim_func
    def allreduce_one_shot(x: T.Tensor((nv, vec), dtype), out: T.Tensor((nv, vec), dtype),
                           recv: T.Tensor((2, W, nv, vec), dtype), flags: T.Tensor((blocks, W), SIGNAL),
                           counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            me = T.team_rank(team)
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(nv, blocks)
            lo = T.min(b * chunk, nv)
            hi = T.min(lo + chunk, nv)
            for j in T.serial(W - 1):
                p = (me + 1 + j) % W
                T.put_signal_block(x[lo:hi, :], recv[par, me, lo:hi, :], flags[b, me], value=epoch,
                                   dst_pe=T.team_pe(team, p))
            if tx < W:
                if tx != me:
                    T.wait_until(flags[b, tx], cmp="ge", value=epoch)
            T.sync_threads()
            sum_chunk(x, recv, out, lo, hi, par, me, tx, W, threads, dtype, vec)

    return allreduce_one_shot


@tilescale.jit(pass_configs=PASS_CONFIGS)
def allreduce_two_shot_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512, team=None):
    """Two-shot kernel of :class:`AllReduce`; the slice length `sv` (vectors) is a run-time argument; `team` as the
    one-shot kernel's."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    sv = T.dynamic("sv")

    @T.prim_func
    def allreduce_two_shot(x: T.Tensor((W, sv, vec), dtype), out: T.Tensor((W, sv, vec), dtype),
                           recv: T.Tensor((2, W, sv, vec), dtype), red: T.Tensor((2, sv, vec), dtype),
                           flags: T.Tensor((2, blocks, W), SIGNAL), counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            me = T.team_rank(team)
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(sv, blocks)
            lo = T.min(b * chunk, sv)
            hi = T.min(lo + chunk, sv)
            # 1-3: reduce chunk b of this rank's slice into out[rank] and red[par] ...
            push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, W, threads, dtype, vec, out, me, red, par, True,
                            team)
            T.sync_threads()
            # 4: ... and tell every peer it is there
            if tx >= 1:
                if tx < W:
                    T.st(flags[1, b, me], epoch, scope="sys", sem="release", dst_pe=T.team_pe(team, (me + tx) % W))
            # 5: gather every peer's reduced chunk b
            for j in T.serial(W - 1):
                s = (me + W - 1 - j) % W
                if tx == 0:
                    T.wait_until(flags[1, b, s], cmp="ge", value=epoch)
                T.sync_threads()
                T.get_block(red[par, lo:hi, :], out[s, lo:hi, :], src_pe=T.team_pe(team, s))

    return allreduce_two_shot


def resolve_algo(algo: str, nbytes: int, world_size: int) -> str:
    """The kernel ``algo="auto"`` stands for: one-shot up to ONE_SHOT_MAX_BYTES per rank."""
    if algo != "auto":
        return algo
    return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES or world_size == 1 else "two_shot"


def kernels(nbytes: int, world_size: int, dtype: str, sms: int, algo: str | None = None, threads: int = 512,
            team=None) -> list:
    """[(jit function, args)] of the kernel :class:`AllReduce` builds for `nbytes` per rank with `algo`
    (None: of both algorithms) among the ranks of `team` (a kernel's group; None: the world)."""
    out = []
    for a in (("one_shot", "two_shot") if algo is None else (resolve_algo(algo, nbytes, world_size),)):
        fn, table = (allreduce_one_shot_kernel, ONE_SHOT_BLOCKS) if a == "one_shot" else \
            (allreduce_two_shot_kernel, TWO_SHOT_BLOCKS)
        args = (world_size, vectors.blocks_for(nbytes, table, sms), dtype, threads)
        out.append((fn, args if team is None else (*args, team)))
    return out


class AllReduce(Op):
    """Sum-AllReduce of a tensor of `shape` and `dtype` (bf16, fp16, fp32; accumulated in fp32).

    ``algo``: "one_shot" (every rank reads every input: lowest latency), "two_shot" (ReduceScatter, then
    AllGather of the reduced slices: least traffic), or "auto" (one-shot up to ``ONE_SHOT_MAX_BYTES``).
    Collective to construct (allocates symmetric receive buffers; checks that every rank passed the same
    shape, dtype and algo). ``ar(x)`` returns a new tensor with the sum; ``ar(x, out=t)`` writes it into
    `t` (which may be `x`: in place). `group`: the ranks it sums over (tilescale.runtime.team; None: the world).
    """

    NAME, KERNEL = "AllReduce", "allreduce"
    GRAPH_SAFE = True

    def __init__(self, shape, dtype, *, algo: str = "auto", blocks: int | None = None, threads: int = 512,
                 group=None):
        import torch

        with self.arguments(shape=shape, dtype=dtype, algo=algo, blocks=blocks, threads=threads, group=group):
            checks.as_choice("AllReduce", "algo", algo, ("auto", *ALGOS))
            self.shape = vectors.as_shape("AllReduce", shape)
            vectors.check_dtype("AllReduce", dtype)
            vectors.check_launch("AllReduce", blocks, threads, self.world_size)
            n, vec = vectors.numel(self.shape), vectors.vector_width(dtype)
            one_shot = resolve_algo(algo, n * vectors.element_size(dtype), self.world_size) == "one_shot"
            per = vec if one_shot else vec * self.world_size    # the kernel's run-time size: vectors (per rank)
            checks.fits_int32("AllReduce", "shape", repr(self.shape), -(-n // per),
                              "its 16-byte vectors" + ("" if one_shot else " per rank"))
        W, self.dtype = self.world_size, dtype
        self.n = n = vectors.numel(self.shape)
        nbytes = n * vectors.element_size(dtype)
        self.algo = algo = resolve_algo(algo, nbytes, W)
        self.vec = vec = vectors.vector_width(dtype)
        [(fn, args)] = kernels(nbytes, W, vectors.dtype_name(dtype), vectors.sm_count(), algo, threads,
                               self.kernel_team)
        self.blocks = blocks or args[1]
        if algo == "one_shot":
            self.nv = -(-n // vec)
            self.vshape = (self.nv, vec)
            self.recv = self.symmetric((2, W, self.nv, vec), dtype)
            self.red = None
            self.flags = self.symmetric((self.blocks, W), torch.uint64, zero=True)
            names = ("x", "out", "recv", "flags", "counters", "nv")
        else:
            sv = -(-n // (vec * W))
            self.nv = W * sv
            self.vshape = (W, sv, vec)
            self.recv = self.symmetric((2, W, sv, vec), dtype)
            self.red = self.symmetric((2, sv, vec), dtype)
            self.flags = self.symmetric((2, self.blocks, W), torch.uint64, zero=True)
            names = ("x", "out", "recv", "red", "flags", "counters", "sv")
        self.kernel, self._direct = self.build(fn, (W, self.blocks, *args[2:]), names)
        self.padded = self.nv * vec != n
        self.padded_scratch(1, self.vshape, self.vshape)
        self.launch_args(*(t for t in (self.recv, self.red, self.flags) if t is not None),
                         self.call_counters(self.blocks))
        self._dim = self.nv if algo == "one_shot" else self.nv // W

    def __call__(self, x, out=None):
        return self.launch_vectors(x, out, self.begin(x, out), self._dim, 1, self.vshape, self.vshape)


@op_cache.cached(16)
def _cached(n, dtype, algo, world_size, group=None):
    return AllReduce((n,), dtype, algo=algo, group=group)


_fn_check = checks.CallCheck("all_reduce")


def _validate_fn(tensor, op, algo, group=None) -> None:
    if group is not None:
        from ..runtime import team

        team.of_group("all_reduce", group)     # a bad group: an argument error, agreed as the others
    checks.check_op("all_reduce", op)
    checks.as_choice("all_reduce", "algo", algo, ("auto", *ALGOS))
    checks.check_tensor("all_reduce", "tensor", tensor)
    vectors.check_dtype("all_reduce", tensor.dtype, "tensor")


def all_reduce(tensor, *, op="sum", algo="auto", group=None):
    """``torch.distributed.all_reduce(tensor, group=group)`` (sum), in place: `tensor` receives the sum over ranks
    (of `group`: tilescale.runtime.team) and is returned. One :class:`AllReduce` per (numel, dtype, algo, group) is
    built on first use and cached."""
    from .. import runtime

    _fn_check((checks.signature(tensor), op if isinstance(op, str) else str(op), algo, group), _validate_fn, tensor,
              op, algo, group)
    ar = _cached(tensor.numel(), tensor.dtype, algo, runtime.current().info.world_size, group)
    if tensor.is_contiguous():
        flat = tensor.view(-1)
        ar(flat, out=flat)
    else:
        tensor.copy_(ar(tensor.reshape(-1)).view(tensor.shape))
    return tensor


# ------------------------------------------------------------------------------------- registry
def run_one_shot(tensor, op="sum"):
    """torch: ``dist.all_reduce(tensor)``; every rank reads every peer's input (small messages)."""
    all_reduce(tensor.view(-1), op=op, algo="one_shot")


def run_two_shot(tensor, op="sum"):
    """torch: ``dist.all_reduce(tensor)``; reduce-scatter, then all-gather (large messages)."""
    all_reduce(tensor.view(-1), op=op, algo="two_shot")


ALGOS = {"one_shot": registry.Algorithm(run_one_shot, ((0, ONE_SHOT_MAX_BYTES),), nodes="any", graph_safe=True),
         "two_shot": registry.Algorithm(run_two_shot, ((ONE_SHOT_MAX_BYTES + 1, registry.MAX_MSG_SIZE),),
                                        nodes="any", graph_safe=True)}


def serve(world_size, tensor, **_):
    """A ``torch.distributed.all_reduce(tensor, op, group, async_op)`` call (sum) as a plan runs it."""
    return registry.TorchCall(out=tensor, msg_bytes=tensor.numel() * tensor.element_size(), kwargs={"op": "sum"})


def bench(algo, x, world_size):
    """Out of place, as the ops allow (NCCL in place)."""
    import torch

    op = AllReduce(x.shape, x.dtype, algo=algo)
    out = torch.empty_like(x)
    return op, lambda: op(x, out=out), out, (x.clone(),)


COLLECTIVE = registry.collective("allreduce", torch_name="all_reduce", algos=ALGOS, tensors=("tensor",), serve=serve,
                                 kernels=kernels, bench=bench, busbw=lambda W: 2 * (W - 1) / W, exact=False,
                                 module=__name__)
