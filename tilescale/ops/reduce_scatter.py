"""ReduceScatter (sum) over NVLink, written in tilescale: push every slice to its owner, reduce on arrival.

torch equivalent (x: (R, ...) on every rank, R divisible by W)::

    out = torch.empty(R // W, *x.shape[1:])
    torch.distributed.reduce_scatter_tensor(out, x)      # rank r: sum over ranks of x[r*R/W:(r+1)*R/W]

Layout: x is seen as W slices of ``sv`` 16-byte vectors (:mod:`tilescale.ops.vectors`); every rank runs
one kernel of `blocks` blocks (all co-resident), block b owning vectors [lo_b, hi_b) of every slice.
Signal protocol of one call (epoch e = 1, 2, ...; par = e % 2 picks one of two receive buffers):

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
"""

import tilescale
import tilescale.language as T

from . import op_cache
from .capture import refuse_graph_capture
from .direct_launch import direct_entry
from . import checks, vectors
from .vectors import SIGNAL

# Empty chunks are legal (a block whose chunk starts at the end still signals): no bound guards.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}

# (max bytes of the full input, blocks); more blocks keep more NVLink stores in flight.
BLOCKS = ((1 << 20, 16), (16 << 20, 64), (1 << 62, 128))


@T.macro
def push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, world_size: int, threads: int, dtype: str, vec: int,
                    dst, di, dst2, di2, two_dsts: bool):
    """Steps 1-3 of the protocol above for block `b`: the sum of chunk b of this rank's slice lands in
    ``dst[di, lo:hi]`` (and ``dst2[di2, lo:hi]`` too with `two_dsts`), dst and dst2 being (., sv, vec)."""
    me = T.get_rank()
    tx = T.get_thread_binding()
    for j in T.serial(world_size - 1):
        p = (me + 1 + j) % world_size
        T.put_signal_block(x[p, lo:hi, :], recv[par, me, lo:hi, :], flags[0, b, me], value=epoch, dst_pe=p)
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
def reduce_scatter_kernel(world_size: int, blocks: int, dtype: str = "bfloat16", threads: int = 512):
    """Kernel of :class:`ReduceScatter`; the slice length `sv` (16-byte vectors) is a run-time argument,
    so one build serves every message size."""
    W = world_size
    vec = 16 // (4 if dtype == "float32" else 2)
    sv = T.dynamic("sv")

    @T.prim_func
    def reduce_scatter(x: T.Tensor((W, sv, vec), dtype), out: T.Tensor((1, sv, vec), dtype),
                       recv: T.Tensor((2, W, sv, vec), dtype), flags: T.Tensor((1, blocks, W), SIGNAL),
                       epoch: T.uint64):
        with T.Kernel(blocks, threads=threads) as b:
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(sv, blocks)
            lo = T.min(b * chunk, sv)
            hi = T.min(lo + chunk, sv)
            push_and_reduce(x, recv, flags, b, lo, hi, par, epoch, W, threads, dtype, vec, out, 0, out, 0, False)

    return reduce_scatter


def kernel_for(nbytes: int, world_size: int, dtype: str, sms: int, threads: int = 512):
    """(jit function, args) of the kernel :class:`ReduceScatter` builds for a full input of `nbytes`."""
    return reduce_scatter_kernel, (world_size, vectors.blocks_for(nbytes, BLOCKS, sms), dtype, threads)


class ReduceScatter:
    """Sum-ReduceScatter of a `(R, ...)` input of `dtype` (R divisible by the world size) into `(R/W, ...)`.

    Collective to construct (allocates symmetric receive buffers, checks that every rank passed the same
    shape and dtype). ``rs(x)`` returns a new tensor with this rank's reduced rows; ``rs(x, out=t)`` writes
    them into `t`. Sums are accumulated in fp32, in rank order, and rounded once.
    """

    def __init__(self, shape, dtype, *, blocks: int | None = None, threads: int = 512):
        import torch

        from .. import runtime, symm
        from .checks import require_same_on_all_ranks

        rt = runtime.current()
        self.world_size = W = rt.info.world_size
        self.rank = rt.info.rank
        with checks.deferred("ReduceScatter") as d:
            self.shape = vectors.as_shape("ReduceScatter", shape)
            vectors.check_dtype("ReduceScatter", dtype)
            vectors.check_launch("ReduceScatter", blocks, threads, W)
            if len(self.shape) == 0 or self.shape[0] % W:
                checks.fail("ReduceScatter", "shape", repr(self.shape), "(rows, ...) with rows divisible by the "
                            f"world size {W}")
        # every rank learns whether all passed the same arguments, and whether they are valid on every rank
        require_same_on_all_ranks("ReduceScatter", d.error, shape=shape, dtype=dtype, blocks=blocks, threads=threads)
        self.dtype = dtype
        self.out_shape = (self.shape[0] // W, *self.shape[1:])
        self.n = vectors.numel(self.shape)
        self.slice = self.n // W                                # elements per rank's slice
        self.vec = vec = vectors.vector_width(dtype)
        self.sv = sv = -(-self.slice // vec)                    # 16-byte vectors per slice (padded)
        nbytes = self.n * vectors.element_size(dtype)
        fn, args = kernel_for(nbytes, W, vectors.dtype_name(dtype), vectors.sm_count(), threads)
        if blocks:
            args = (W, blocks, *args[2:])
        self.blocks = args[1]
        self.recv = symm.empty((2, W, sv, vec), dtype=dtype)
        self.flags = symm.zeros((1, self.blocks, W), dtype=torch.uint64)
        self.epoch = 0
        self.padded = sv * vec != self.slice
        self._xpad = self._opad = None
        self.kernel = fn(*args)
        self.kernel.prepare()
        self._direct = direct_entry(self.kernel, ("x", "out", "recv", "flags", "epoch", "sv"))
        self._bufs = (self.recv.data_ptr(), self.flags.data_ptr())
        self._stream = vectors.stream_getter()
        self._size, self._out_size = torch.Size(self.shape), torch.Size(self.out_shape)
        self.device = checks.this_device()
        self._check = checks.CallCheck("ReduceScatter")
        self._agreed = self._check.agreed
        self._order = checks.StreamOrder(self.device)

    def close(self) -> None:
        """Free this op's symmetric buffers (collective)."""
        from .. import symm

        for t in (self.recv, self.flags):
            symm.free(t)

    def _staging(self):
        import torch

        if self._xpad is None:
            dev = torch.device("cuda", torch.cuda.current_device())
            self._xpad = torch.zeros((self.world_size, self.sv * self.vec), dtype=self.dtype, device=dev)
            self._opad = torch.empty((self.sv * self.vec,), dtype=self.dtype, device=dev)
        return self._xpad, self._opad

    def _validate(self, x, out) -> None:
        """The call checks (agreed across ranks): `x` of this op's shape, `out` (None: a new tensor) of its
        output shape, of its dtype on this GPU (any strides: staged)."""
        checks.check_tensor("ReduceScatter", "x", x, shape=self.shape, dtype=self.dtype, device=self.device)
        if out is not None:
            checks.check_tensor("ReduceScatter", "out", out, shape=self.out_shape, dtype=self.dtype, device=self.device,
                                what="rows / world_size")

    def __call__(self, x, out=None):
        refuse_graph_capture("ReduceScatter")
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
            out = torch.empty(self._out_size, dtype=self.dtype, device=x.device)
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
                if fn(xp, op, *self._bufs, self.epoch, self.sv, stream) != 0:
                    raise vectors.launch_failed("reduce_scatter", err)
                return out
        W, sv, vec = self.world_size, self.sv, self.vec
        xv = None if self.padded else vectors.vector_view(x, (W, sv, vec))
        ov = None if self.padded else vectors.vector_view(out, (1, sv, vec))
        if xv is None:
            xpad, _ = self._staging()
            xpad[:, :self.slice].copy_(x.reshape(W, self.slice))
            xv = xpad.view(W, sv, vec)
        if ov is None:
            _, opad = self._staging()
            ov = opad.view(1, sv, vec)
        self.epoch += 1
        self.kernel.launch(xv, ov, self.recv, self.flags, self.epoch)
        if ov.data_ptr() != out.data_ptr() or not out.is_contiguous():
            out.copy_(ov.view(-1)[:self.slice].view(self.out_shape))
        return out


@op_cache.cached(16)
def _cached(n, dtype, world_size):
    return ReduceScatter((n,), dtype)


_fn_check = checks.CallCheck("reduce_scatter_tensor")


def _validate_fn(output, input, op, W) -> None:  # noqa: A002
    check_op("reduce_scatter_tensor", op)
    for name, t in (("output", output), ("input", input)):
        checks.check_tensor("reduce_scatter_tensor", name, t)
    vectors.check_dtype("reduce_scatter_tensor", input.dtype, "input")
    if output.dtype != input.dtype:
        checks.fail("reduce_scatter_tensor", "output", f"dtype {output.dtype}", f"{input.dtype} (the dtype of input)")
    if W is not None and input.numel() != W * output.numel():
        checks.fail("reduce_scatter_tensor", "output", f"{tuple(output.shape)} ({output.numel()} elements) for an "
                    f"input of {input.numel()} elements",
                    f"input.numel() / world_size = {input.numel() / W:g} elements")


def reduce_scatter_tensor(output, input, *, op="sum"):  # noqa: A002  (torch's argument names)
    """``torch.distributed.reduce_scatter_tensor(output, input)`` with op "sum": `input` holds W equal
    slices (``input.numel() == W * output.numel()``); this rank's slice of the sum lands in `output`,
    which is returned."""
    from .. import runtime

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(output), checks.signature(input), op if isinstance(op, str) else str(op)),
              _validate_fn, output, input, op, rt.info.world_size if rt is not None else None)
    W = runtime.current().info.world_size
    rs = _cached(input.numel(), input.dtype, W)
    flat_in = input.reshape(-1)
    if output.is_contiguous():
        rs(flat_in, out=output.view(-1))
    else:
        output.copy_(rs(flat_in).view(output.shape))
    return output


def check_op(fn: str, op) -> None:
    """ValueError unless `op` is the sum (the string "sum" or torch.distributed.ReduceOp.SUM)."""
    if op == "sum":
        return
    try:
        import torch.distributed as dist

        if op == dist.ReduceOp.SUM:
            return
    except Exception:  # noqa: BLE001  (torch.distributed without ReduceOp)
        pass
    checks.fail(fn, "op", checks.describe(op), "'sum' (the only reduction tilescale implements)")
