"""Broadcast over NVLink, written in tilescale (the root stages, every other rank pulls).

torch equivalent::

    torch.distributed.broadcast(x, src)      # in place: x = root's x on every rank

The kernel moves bytes (any dtype). Every rank runs one kernel of `blocks` co-resident blocks; block b
owns a 16-byte aligned chunk b of the message, cut into ``nsub`` sub-chunks of ``SUB_BYTES`` (sub-chunk k
of call e has the sequence number ``seq = (e - 1) * nsub + k + 1``, which only grows). The root copies its
tensor into its symmetric ``stage[par]`` (par = e % 2); the other ranks read it over NVLink straight into
their own tensor, so neither side needs its tensor on the symmetric heap; sub-chunks pipeline the two.

Signal protocol of one call (call number e = 1, 2, ..., counted on the device: ``T.call_number(counters)``,
the same in every block of the call and new on every replay of a CUDA graph; the kernel derives par and
e_old = max(e - 2, 0) from it):

1. root, block b: waits until ``done[b, r] >= e_old`` for every other rank r (r finished reading
   ``stage[par]`` two calls ago, so it may be overwritten); then for k = 0, 1, ...: copies sub-chunk k
   of chunk b of x into ``stage[par]`` and sets ``ready[b] = seq`` on every other rank (release, system
   scope);
2. other rank r, block b, for k = 0, 1, ...: waits until ``ready[b] >= seq``, copies sub-chunk k from the
   root's ``stage[par]`` (16-byte loads over NVLink) into its tensor; at the end it sets
   ``done[b, r] = e`` on the root (release).

Each rank sends or receives the whole message once; the root's NVLink carries W - 1 copies of it
(a flat broadcast: on NVSwitch systems every receiver reads at full speed, but the root's links are
shared by the W - 1 readers).

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): ``ready`` and ``done`` are set with NVSHMEM atomics after
``nvshmem_fence``, and a receiver's copy (step 2) is an NVSHMEM get from the root's ``stage[par]``
(``get_block``).
"""

import tilescale
import tilescale.language as T

from . import checks, op_cache, registry, vectors
from .base import Op
from .vectors import BYTE, COUNTER, PASS_CONFIGS, SIGNAL

__all__ = ["Broadcast", "broadcast"]

# (max bytes, blocks)
BLOCKS = ((256 << 10, 8), (4 << 20, 32), (1 << 62, 64))
SUB_BYTES = 64 << 10        # the unit of the stage/read pipeline


@tilescale.jit(pass_configs=PASS_CONFIGS)
def broadcast_kernel(world_size: int, blocks: int, threads: int = 512, team=None):
    """Kernel of :class:`Broadcast` (bytes; one build serves every dtype, size and root). `team`: the ranks of the
    op's group (tilescale.runtime.team.kernel_team; None: the world): ``me``, ``root`` and the peers are ranks of
    it."""
    W = world_size
    n = T.dynamic("n")
    n_stage = T.dynamic("n_stage")

    @T.prim_func
    def broadcast(x: T.Tensor((n,), BYTE), out: T.Tensor((n,), BYTE),
                  stage: T.Tensor((2, n_stage), BYTE), ready: T.Tensor((blocks,), SIGNAL),
                  done: T.Tensor((blocks, W), SIGNAL), root: T.int32, counters: T.Tensor((blocks,), COUNTER)):
        with T.Kernel(blocks, threads=threads) as b:
            epoch = T.call_number(counters)
            epoch_old = T.max(epoch, 2) - 2     # max(e - 2, 0), in unsigned arithmetic
            me = T.team_rank(team)
            tx = T.get_thread_binding()
            par = T.cast(epoch % 2, "int32")
            chunk = T.ceildiv(T.ceildiv(n, blocks), 16) * 16      # 16-byte aligned chunks
            nsub = T.ceildiv(chunk, SUB_BYTES)
            lo = T.min(b * chunk, n)
            hi = T.min(lo + chunk, n)
            if me == root:
                if tx < W:
                    if tx != root:
                        T.wait_until(done[b, tx], cmp="ge", value=epoch_old)
                T.sync_threads()
                for k in T.serial(nsub):
                    slo = T.min(lo + k * SUB_BYTES, hi)
                    shi = T.min(slo + SUB_BYTES, hi)
                    # a local copy (through the self mapping)
                    T.put_block(x[slo:shi], stage[par, slo:shi], dst_pe=T.team_pe(team, me))
                    if tx < W:
                        if tx != root:
                            T.st(ready[b], (epoch - 1) * T.cast(nsub, "uint64") + T.cast(k + 1, "uint64"),
                                 scope="sys", sem="release", dst_pe=T.team_pe(team, tx))
            else:
                for k in T.serial(nsub):
                    slo = T.min(lo + k * SUB_BYTES, hi)
                    shi = T.min(slo + SUB_BYTES, hi)
                    if tx == 0:
                        T.wait_until(ready[b], cmp="ge",
                                     value=(epoch - 1) * T.cast(nsub, "uint64") + T.cast(k + 1, "uint64"))
                    T.sync_threads()
                    T.get_block(stage[par, slo:shi], out[slo:shi], src_pe=T.team_pe(team, root))
                if tx == 0:
                    T.st(done[b, me], epoch, scope="sys", sem="release", dst_pe=T.team_pe(team, root))

    return broadcast


def kernels(nbytes: int, world_size: int, dtype: str | None = None, sms: int = 132, threads: int = 512,
            team=None) -> list:
    """[(jit function, args)] of the kernel :class:`Broadcast` builds for a message of `nbytes` (bytes: one
    build serves every dtype) among the ranks of `team` (None: the world)."""
    args = (world_size, vectors.blocks_for(nbytes, BLOCKS, sms), threads)
    return [(broadcast_kernel, args if team is None else (*args, team))]


# The kernel computes byte offsets and sub-chunk counts (n + 4 MiB - 1) in int32: keep both below 2**31.
MAX_BYTES = (1 << 31) - (8 << 20)


class Broadcast(Op):
    """Broadcast of a tensor of `shape` and `dtype` from rank `src` to every rank.

    Collective to construct (allocates the root's symmetric staging buffer on every rank; checks that
    every rank passed the same shape, dtype and src). ``bc(x)`` overwrites `x` with the root's tensor
    on every other rank (in place, like torch) and returns it; ``bc(x, out=t)`` leaves `x` alone and
    writes the root's tensor into `t` instead (on the root too). `group`: the ranks it runs among
    (tilescale.runtime.team; None: the world), `src` being a rank of it (torch's ``group_src``).
    """

    NAME, KERNEL = "Broadcast", "broadcast"
    GRAPH_SAFE = True

    def __init__(self, shape, dtype, src: int, *, blocks: int | None = None, threads: int = 512, group=None):
        import torch

        with self.arguments(shape=shape, dtype=dtype, src=src, blocks=blocks, threads=threads, group=group):
            W = self.world_size
            vectors.check_launch("Broadcast", blocks, threads, W)
            self.shape = vectors.as_shape("Broadcast", shape)
            checks.as_dtype("Broadcast", "dtype", dtype)
            if not checks._is_int(src) or not 0 <= src < W:
                checks.fail("Broadcast", "src", checks.describe(src), f"a rank in 0..{W - 1}",
                            type_error=not checks._is_int(src))
            self.nbytes = vectors.numel(self.shape) * vectors.element_size(dtype)
            if self.nbytes > MAX_BYTES:
                checks.fail("Broadcast", "shape", f"{self.shape} {dtype} ({self.nbytes} bytes)", f"at most {MAX_BYTES} "
                            "bytes (2 GiB - 8 MiB: the kernel counts bytes and sub-chunks in 32-bit integers)")
        self.dtype, self.src = dtype, src
        [(fn, args)] = kernels(self.nbytes, W, None, vectors.sm_count(), threads, self.kernel_team)
        self.blocks = blocks or args[1]
        self.stage = self.symmetric((2, -(-self.nbytes // 16) * 16), torch.uint8)
        self.ready = self.symmetric((self.blocks,), torch.uint64, zero=True)
        self.done = self.symmetric((self.blocks, W), torch.uint64, zero=True)
        self.kernel, self._direct = self.build(fn, (W, self.blocks, *args[2:]), ("x", "out", "stage", "ready", "done",
                                                                                "root", "counters", "n", "n_stage"))
        self.launch_args(self.stage, self.ready, self.done, src, self.call_counters(self.blocks))

    def __call__(self, x, out=None):
        import torch

        stream = self.begin(x, out)
        if out is None:
            out = x
        if self.nbytes == 0:
            return out
        if self._direct is not None and out is x and x.is_contiguous():
            p = x.data_ptr()   # the fast path: in place
            self.launch_direct(p, p, *self._ptrs, self.nbytes, self.stage.shape[1], stream)
            return out
        dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        src = x if x.is_contiguous() else x.contiguous()
        if self.rank == self.src and dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
        self.kernel.launch(src.view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8), *self._bufs)
        if dst is not out:
            out.copy_(dst)
        return out


@op_cache.cached(16)
def _cached(nbytes_shape, dtype, src, world_size, group=None):
    return Broadcast(nbytes_shape, dtype, src, group=group)


_fn_check = checks.CallCheck("broadcast")


def _validate_fn(tensor, src, W, group=None) -> None:
    from ..runtime import team

    checks.check_tensor("broadcast", "tensor", tensor)
    if not checks._is_int(src) or src < 0 or (W is not None and src >= W):
        checks.fail("broadcast", "src", checks.describe(src), "a rank (int >= 0)" if W is None else
                    f"a rank in 0..{W - 1}", type_error=not checks._is_int(src))
    if W is not None and group is not None and src not in (t := team.of_group("broadcast", group)):
        checks.fail("broadcast", "src", checks.describe(src), f"a rank of the group ({t})")


def broadcast(tensor, src: int, *, group=None):
    """``torch.distributed.broadcast(tensor, src, group)``: every rank's `tensor` receives rank `src`'s (a world
    rank, of `group` where given: tilescale.runtime.team), in place; returns `tensor`. One :class:`Broadcast` per
    (numel, dtype, src, group) is built on first use."""
    from .. import runtime
    from ..runtime import team

    rt = checks.runtime_or_none()
    _fn_check((checks.signature(tensor), src if checks._is_int(src) else repr(src), group), _validate_fn, tensor, src,
              rt.info.world_size if rt is not None else None, group)
    W = runtime.current().info.world_size
    root = src if group is None else team.of_group("broadcast", group).index(src)   # (the group's rank)
    bc = _cached((tensor.numel(),), tensor.dtype, root, W, group)
    if tensor.is_contiguous():
        bc(tensor.view(-1))
    else:
        flat = tensor.contiguous().view(-1)
        bc(flat)
        tensor.copy_(flat.view(tensor.shape))
    return tensor


# ------------------------------------------------------------------------------------- registry
def run_pull(tensor, src):
    """torch: ``dist.broadcast(tensor, src)``; every rank reads `src`'s staged copy."""
    broadcast(tensor.view(-1), src)


def serve(world_size, tensor, src, group_src, **_):
    """A ``torch.distributed.broadcast(tensor, src, group, async_op, group_src)`` call as a plan runs it."""
    return registry.rooted_call(world_size, tensor, src, group_src, "src")


COLLECTIVE = registry.collective("broadcast", torch_name="broadcast",
                                 algos={"pull": registry.Algorithm(run_pull, nodes="any", graph_safe=True)},
                                 tensors=("tensor",), serve=serve, kernels=kernels,
                                 bench=registry.rooted_bench(Broadcast),
                                 busbw=lambda W: 1.0, exact=True, module=__name__)
