"""AllReduce (sum) over NVLink, written in tilescale: one-shot for small messages, two-shot for large.

torch equivalent::

    torch.distributed.all_reduce(x)          # in place: x = sum over ranks of x

Both kernels see x as 16-byte vectors (:mod:`tilescale.ops.vectors`), accumulate in fp32 in rank order
0..W-1 and round once, so every rank gets bitwise the same result. Every rank runs one kernel of
`blocks` co-resident blocks; block b owns chunk b of the vectors. Receive buffers are double-buffered
by epoch parity (par = e % 2), which makes a call safe to follow the previous one without a handshake:
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
"""

import tilescale
import tilescale.language as T

from . import op_cache
from .capture import refuse_graph_capture
from .direct_launch import direct_entry
from . import checks, vectors
from .vectors import SIGNAL
from .reduce_scatter import PASS_CONFIGS, check_op, push_and_reduce

ALGOS = ("auto", "one_shot", "two_shot")
ONE_SHOT_MAX_BYTES = 1 << 20
"""``algo="auto"`` uses the one-shot kernel up to this many bytes per rank, the two-shot kernel above."""

# (max bytes per rank, blocks) of each algorithm.
ONE_SHOT_BLOCKS = ((256 << 10, 16), (8 << 20, 64), (1 << 62, 128))
TWO_SHOT_BLOCKS = ((4 << 20, 32), (1 << 62, 128))


@tilescale.jit(pass_configs=PASS_CONFIGS)
def allreduce_one_shot_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512):
    """One-shot kernel of :class:`AllReduce`; the vector count `nv` is a run-time argument."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    nv = T.dynamic("nv")

    @T.prim_func
    def allreduce_one_shot(x: T.Tensor((nv, vec), dtype), out: T.Tensor((nv, vec), dtype),
                           recv: T.Tensor((2, W, nv, vec), dtype), flags: T.Tensor((blocks, W), SIGNAL),
                           epoch: T.uint64):
        with T.Kernel(blocks, threads=threads) as b:
            me = T.get_rank()
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(nv, blocks)
            lo = T.min(b * chunk, nv)
            hi = T.min(lo + chunk, nv)
            for j in T.serial(W - 1):
                p = (me + 1 + j) % W
                T.put_signal_block(x[lo:hi, :], recv[par, me, lo:hi, :], flags[b, me], value=epoch, dst_pe=p)
            if tx < W:
                if tx != me:
                    T.wait_until(flags[b, tx], cmp="ge", value=epoch)
            T.sync_threads()
            acc = T.alloc_local((vec,), "float32")
            for it in T.serial(T.ceildiv(hi - lo, threads)):
                v = lo + it * threads + tx
                if v < hi:
                    for k in T.vectorized(vec):
                        acc[k] = 0.0
                    for s in T.unroll(W):
                        if s == me:
                            for k in T.vectorized(vec):
                                acc[k] += T.cast(x[v, k], "float32")
                        else:
                            for k in T.vectorized(vec):
                                acc[k] += T.cast(recv[par, s, v, k], "float32")
                    for k in T.vectorized(vec):
                        out[v, k] = T.cast(acc[k], dtype)

    return allreduce_one_shot


@tilescale.jit(pass_configs=PASS_CONFIGS)
def allreduce_two_shot_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512):
    """Two-shot kernel of :class:`AllReduce`; the slice length `sv` (vectors) is a run-time argument."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    sv = T.dynamic("sv")

    @T.prim_func
    def allreduce_two_shot(x: T.Tensor((W, sv, vec), dtype), out: T.Tensor((W, sv, vec), dtype),
                           recv: T.Tensor((2, W, sv, vec), dtype), red: T.Tensor((2, sv, vec), dtype),
                           flags: T.Tensor((2, blocks, W), SIGNAL), epoch: T.uint64):
        with T.Kernel(blocks, threads=threads) as b:
            me = T.get_rank()
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(sv, blocks)
            lo = T.min(b * chunk, sv)
            hi = T.min(lo + chunk, sv)
            # 1-3: reduce chunk b of this rank's slice into out[rank] and red[par] ...
            push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, W, threads, dtype, vec, out, me, red, par, True)
            T.sync_threads()
            # 4: ... and tell every peer it is there
            if tx >= 1:
                if tx < W:
                    T.st(flags[1, b, me], epoch, scope="sys", sem="release", dst_pe=(me + tx) % W)
            # 5: gather every peer's reduced chunk b
            for j in T.serial(W - 1):
                s = (me + W - 1 - j) % W
                if tx == 0:
                    T.wait_until(flags[1, b, s], cmp="ge", value=epoch)
                T.sync_threads()
                T.get_block(red[par, lo:hi, :], out[s, lo:hi, :], src_pe=s)

    return allreduce_two_shot


def resolve_algo(algo: str, nbytes: int, world_size: int) -> str:
    """The kernel ``algo="auto"`` stands for: one-shot up to ONE_SHOT_MAX_BYTES per rank."""
    if algo != "auto":
        return algo
    return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES or world_size == 1 else "two_shot"


def kernel_for(algo: str, nbytes: int, world_size: int, dtype: str, sms: int, threads: int = 512):
    """(jit function, args) of the kernel :class:`AllReduce` builds for `nbytes` per rank (prebuild)."""
    algo = resolve_algo(algo, nbytes, world_size)
    if algo == "one_shot":
        return allreduce_one_shot_kernel, (world_size, vectors.blocks_for(nbytes, ONE_SHOT_BLOCKS, sms), dtype, threads)
    return allreduce_two_shot_kernel, (world_size, vectors.blocks_for(nbytes, TWO_SHOT_BLOCKS, sms), dtype, threads)


class AllReduce:
    """Sum-AllReduce of a tensor of `shape` and `dtype` (bf16, fp16, fp32; accumulated in fp32).

    ``algo``: "one_shot" (every rank reads every input: lowest latency), "two_shot" (ReduceScatter, then
    AllGather of the reduced slices: least traffic), or "auto" (one-shot up to ``ONE_SHOT_MAX_BYTES``).
    Collective to construct (allocates symmetric receive buffers; checks that every rank passed the same
    shape, dtype and algo). ``ar(x)`` returns a new tensor with the sum; ``ar(x, out=t)`` writes it into
    `t` (which may be `x`: in place).
    """

    def __init__(self, shape, dtype, *, algo: str = "auto", blocks: int | None = None, threads: int = 512):
        import torch

        from .. import runtime, symm
        from .checks import require_same_on_all_ranks

        rt = runtime.current()
        self.world_size = W = rt.info.world_size
        with checks.deferred("AllReduce") as d:
            checks.as_choice("AllReduce", "algo", algo, ALGOS)
            self.shape = vectors.as_shape("AllReduce", shape)
            vectors.check_dtype("AllReduce", dtype)
            vectors.check_launch("AllReduce", blocks, threads, W)
        # every rank learns whether all passed the same arguments, and whether they are valid on every rank
        require_same_on_all_ranks("AllReduce", d.error, shape=shape, dtype=dtype, algo=algo, blocks=blocks,
                                  threads=threads)
        self.rank = rt.info.rank
        self.dtype = dtype
        self.n = n = vectors.numel(self.shape)
        nbytes = n * vectors.element_size(dtype)
        self.algo = algo = resolve_algo(algo, nbytes, W)
        self.vec = vec = vectors.vector_width(dtype)
        fn, args = kernel_for(algo, nbytes, W, vectors.dtype_name(dtype), vectors.sm_count(), threads)
        if blocks:
            args = (W, blocks, *args[2:])
        self.blocks = args[1]
        if algo == "one_shot":
            self.nv = -(-n // vec)
            self.vshape = (self.nv, vec)
            self.recv = symm.empty((2, W, self.nv, vec), dtype=dtype)
            self.red = None
            self.flags = symm.zeros((self.blocks, W), dtype=torch.uint64)
        else:
            sv = -(-n // (vec * W))
            self.nv = W * sv
            self.vshape = (W, sv, vec)
            self.recv = symm.empty((2, W, sv, vec), dtype=dtype)
            self.red = symm.empty((2, sv, vec), dtype=dtype)
            self.flags = symm.zeros((2, self.blocks, W), dtype=torch.uint64)
        self.kernel = fn(*args)
        self.padded = self.nv * vec != n
        self._xpad = self._opad = None
        self.epoch = 0
        self.kernel.prepare()
        names = ("x", "out", "recv", "flags", "epoch", "nv") if algo == "one_shot" else \
            ("x", "out", "recv", "red", "flags", "epoch", "sv")
        self._direct = direct_entry(self.kernel, names)
        self._bufs = tuple(t.data_ptr() for t in (self.recv, self.red, self.flags) if t is not None)
        self._dim = self.nv if algo == "one_shot" else self.nv // W
        self._stream = vectors.stream_getter()
        self._size = torch.Size(self.shape)
        self.device = checks.this_device()
        self._check = checks.CallCheck("AllReduce")
        self._agreed = self._check.agreed
        self._order = checks.StreamOrder(self.device)

    def close(self) -> None:
        """Free this op's symmetric buffers (collective)."""
        from .. import symm

        for t in (self.recv, self.red, self.flags):
            if t is not None:
                symm.free(t)

    def _staging(self):
        import torch

        if self._xpad is None:
            dev = torch.device("cuda", torch.cuda.current_device())
            self._xpad = torch.zeros(self.nv * self.vec, dtype=self.dtype, device=dev)
            self._opad = torch.empty(self.nv * self.vec, dtype=self.dtype, device=dev)
        return self._xpad, self._opad

    def _validate(self, x, out) -> None:
        """The call checks (agreed across ranks): `x` and `out` (None: a new tensor) of this op's shape and
        dtype on this GPU (any strides: staged)."""
        checks.check_tensor("AllReduce", "x", x, shape=self.shape, dtype=self.dtype, device=self.device)
        if out is not None:
            checks.check_tensor("AllReduce", "out", out, shape=self.shape, dtype=self.dtype, device=self.device)

    def __call__(self, x, out=None):
        refuse_graph_capture("AllReduce")
        import torch

        try:  # what the checks read of the arguments; a signature agreed before costs one lookup
            key = (type(x), x.dtype, x.shape, x.device,
                   None if out is None else (type(out), out.dtype, out.shape, out.device))
            hit = key in self._agreed
        except Exception:  # noqa: BLE001  (not tensors: the checks say what is wrong)
            key, hit = None, False
        if not hit:
            self._check(key, self._validate, x, out)
        if out is None:
            out = torch.empty(self._size, dtype=self.dtype, device=x.device)
        stream = self._stream()
        if stream != self._order.handle:  # another stream than the last call's: order it after that one
            self._order.switch(stream)
        if self.n == 0:
            return out
        if self._direct is not None and not self.padded and x.is_contiguous() and out.is_contiguous():
            xp, op = x.data_ptr(), out.data_ptr()
            if not (xp | op) & 15:  # the fast path: 16-byte aligned, whole vectors
                self.epoch += 1
                fn, err = self._direct
                if fn(xp, op, *self._bufs, self.epoch, self._dim, stream) != 0:
                    raise vectors.launch_failed("allreduce", err)
                return out
        xv = vectors.vector_view(x, self.vshape)
        ov = vectors.vector_view(out, self.vshape)
        if xv is None:
            xpad, _ = self._staging()
            xpad[:self.n].copy_(x.reshape(-1))
            xv = xpad.view(self.vshape)
        if ov is None:
            _, opad = self._staging()
            ov = opad.view(self.vshape)
        self.epoch += 1
        if self.red is None:
            self.kernel.launch(xv, ov, self.recv, self.flags, self.epoch)
        else:
            self.kernel.launch(xv, ov, self.recv, self.red, self.flags, self.epoch)
        if ov.data_ptr() != out.data_ptr() or not out.is_contiguous():
            out.copy_(ov.view(-1)[:self.n].view(self.shape))
        return out


@op_cache.cached(16)
def _cached(n, dtype, algo, world_size):
    return AllReduce((n,), dtype, algo=algo)


_fn_check = checks.CallCheck("all_reduce")


def _validate_fn(tensor, op, algo) -> None:
    check_op("all_reduce", op)
    checks.as_choice("all_reduce", "algo", algo, ALGOS)
    checks.check_tensor("all_reduce", "tensor", tensor)
    vectors.check_dtype("all_reduce", tensor.dtype, "tensor")


def all_reduce(tensor, *, op="sum", algo="auto"):
    """``torch.distributed.all_reduce(tensor)`` (sum), in place: `tensor` receives the sum over ranks and
    is returned. One :class:`AllReduce` per (numel, dtype, algo) is built on first use and cached."""
    from .. import runtime

    _fn_check((checks.signature(tensor), op if isinstance(op, str) else str(op), algo), _validate_fn, tensor, op, algo)
    ar = _cached(tensor.numel(), tensor.dtype, algo, runtime.current().info.world_size)
    if tensor.is_contiguous():
        flat = tensor.view(-1)
        ar(flat, out=flat)
    else:
        tensor.copy_(ar(tensor.reshape(-1)).view(tensor.shape))
    return tensor
