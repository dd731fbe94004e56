"""AllToAll over NVLink, written in tilescale (push): equal splits, and variable splits (MoE token dispatch).

torch equivalent::

    torch.distributed.all_to_all_single(out, x)                           # equal splits of dim 0
    torch.distributed.all_to_all_single(out, x, out_splits, in_splits)    # rows per peer

Rank r sends rows ``x[send_off[p] : send_off[p] + send_rows[p]]`` to every rank p, which stores them at
its row offset for r: ``sum of the rows ranks 0..r-1 send to p``. The kernel moves bytes (any dtype)
and reads, per peer p, (send offset, byte count, receive offset at p) from a small int64 table.

Signal protocol of one call (call number e = 1, 2, ..., counted on the device: ``T.call_number(counters)``,
the same in every block of the call and new on every replay of a CUDA graph; every rank runs one kernel of
``blocks_per_peer x W`` blocks, all co-resident; block (b, j) serves peer p = (rank + j) % W, j = 0 being this
rank's own rows):

1. block (b, j) tells p that this rank has entered call e: ``ready[rank] = e`` on p (release, system
   scope);
2. it waits until p has entered call e too (``ready[p] >= e`` here): p no longer reads the output of
   the previous call, so it may be overwritten;
3. it copies chunk b of the rows for p into p's output at this rank's offset (16-byte stores through
   the NVLink mapping), fences, and adds 1 to ``arrived[rank]`` on p (also for an empty chunk);
4. blocks (b < W, j = 0) wait until ``arrived[b] >= e * blocks_per_peer``: when the kernel ends,
   every rank's rows have arrived here.

The output lives in this op's symmetric buffer: ``a2a(x)`` returns it (overwritten by the next call);
``all_to_all_single(out, ...)`` copies it into `out`.

A rank of another node (``TILESCALE_NODE_SIZE`` included) has no NVLink mapping; the ops pick their path per peer at
run time (:mod:`tilescale.language.distributed`): ``ready`` (step 1) is set with an NVSHMEM atomic after
``nvshmem_fence``, the rows (step 3) go by NVSHMEM put, then an NVSHMEM signal add (``put_signal_block``).
"""

import tilescale
import tilescale.language as T

from ..errors import GraphCaptureError
from . import capture, checks, op_cache, registry, vectors
from .base import Op
from .vectors import BYTE, COUNTER, INDEX, PASS_CONFIGS, SIGNAL

__all__ = ["AllToAll", "all_to_all_single"]

# (max bytes per rank, blocks per peer)
BLOCKS_PER_PEER = ((256 << 10, 4), (4 << 20, 16), (64 << 20, 32), (1 << 62, 64))


def blocks_per_peer_for(nbytes: int, world_size: int, sms: int) -> int:
    """Blocks per peer: the table above, at least W (blocks (b < W, 0) do the final waits), and at most
    one wave of ``blocks_per_peer x W`` blocks."""
    want = next(b for limit, b in BLOCKS_PER_PEER if nbytes <= limit)
    want = max(want, world_size)
    return max(world_size, min(want, max(1, sms // world_size)))


@tilescale.jit(pass_configs=PASS_CONFIGS)
def all_to_all_kernel(world_size: int, blocks_per_peer: int, threads: int = 512, team=None):
    """Kernel of :class:`AllToAll` (bytes; one build serves every dtype, size and split). `team`: the ranks of the
    op's group (tilescale.runtime.team.kernel_team; None: the world): ``me`` and the peers are ranks of it."""
    W = world_size
    B = blocks_per_peer
    n_in = T.dynamic("n_in")
    n_out = T.dynamic("n_out")

    @T.prim_func
    def all_to_all(x: T.Tensor((n_in,), BYTE), out: T.Tensor((n_out,), BYTE),
                   meta: T.Tensor((3, W), INDEX), ready: T.Tensor((W,), SIGNAL),
                   arrived: T.Tensor((W,), SIGNAL), counters: T.Tensor((B * W,), COUNTER)):
        with T.Kernel(B, W, threads=threads) as (b, j):
            epoch = T.call_number(counters)
            me = T.team_rank(team)
            peer = (me + j) % W
            tx = T.get_thread_binding()
            if tx == 0:
                T.st(ready[me], epoch, scope="sys", sem="release", dst_pe=T.team_pe(team, peer))
                T.wait_until(ready[peer], cmp="ge", value=epoch)
            T.sync_threads()
            send_off = meta[0, peer]
            count = meta[1, peer]
            recv_off = meta[2, peer]
            chunk = T.ceildiv(T.ceildiv(count, B), 16) * 16       # 16-byte aligned chunks
            lo = T.min(T.cast(b, "int64") * chunk, count)
            hi = T.min(lo + chunk, count)
            T.put_signal_block(x[send_off + lo:send_off + hi], out[recv_off + lo:recv_off + hi], arrived[me],
                               value=1, sig_op="add", dst_pe=T.team_pe(team, peer))
            if j == 0:
                if b < W:
                    if tx == 0:
                        T.wait_until(arrived[b], cmp="ge", value=epoch * B)
                    T.sync_threads()

    return all_to_all


def split_table(send_rows, matrix, rank: int, row_bytes: int) -> list[list[int]]:
    """The kernel's per-peer table, in bytes: ``[send offset in x, bytes to send, offset in the peer's
    output]`` for every peer p, where ``matrix[s][p]`` is the number of rows rank s sends to rank p and
    `send_rows` is this rank's row of it. Rank r's rows land at p after those of ranks 0..r-1."""
    W = len(send_rows)
    send_off = [sum(send_rows[:p]) * row_bytes for p in range(W)]
    counts = [send_rows[p] * row_bytes for p in range(W)]
    recv_off = [sum(matrix[s][p] for s in range(rank)) * row_bytes for p in range(W)]
    return [send_off, counts, recv_off]


def check_splits(every: list[dict], rank: int) -> None:
    """Cross-rank check of all_to_all_single's arguments, given every rank's ``{"send", "recv", "err",
    "row", "dtype"}`` (and ``"team"``: its group's (start, stride, size), None for the world): raises on every rank
    alike (each rank sees the same list) unless all are valid and, within each group, ``send[j]`` of its rank i
    equals ``recv[i]`` of its rank j for every pair. Ranks in messages are world ranks."""
    from ..errors import CollectiveMismatchError
    from ..runtime.team import Team

    W = len(every)
    bad = [(r, v["err"]) for r, v in enumerate(every) if v["err"]]
    if bad:
        if every[rank]["err"]:
            from ..errors import OpArgumentError

            others = [r for r, _ in bad if r != rank]
            raise OpArgumentError(f"all_to_all_single: {every[rank]['err']}"
                                  + (f" [also invalid on rank(s) {others}; this is rank {rank}]" if others else ""))
        raise CollectiveMismatchError("all_to_all_single: invalid arguments on other ranks (" +
                                      "; ".join(f"rank {r}: {e}" for r, e in bad) + f"); this is rank {rank}")
    if len({(v["row"], v["dtype"]) for v in every}) > 1:
        raise CollectiveMismatchError("all_to_all_single: ranks disagree on the row shape / dtype: " +
                                      ", ".join(f"rank {r}: {v['row']} {v['dtype']}" for r, v in enumerate(every)) +
                                      f"; this is rank {rank}")
    wrong = []
    for s in range(W):
        ranks = Team(*every[s]["team"]).ranks if every[s].get("team") else tuple(range(W))
        i = ranks.index(s)
        wrong += [(s, p, i, j) for j, p in enumerate(ranks) if every[s]["send"][j] != every[p]["recv"][i]]
    if wrong:
        s, p, i, j = wrong[0]
        raise CollectiveMismatchError(
            f"all_to_all_single: split sizes disagree: rank {s} sends {every[s]['send'][j]} rows to rank {p} "
            f"(its input_split_sizes[{j}]) but rank {p} expects {every[p]['recv'][i]} (its "
            f"output_split_sizes[{i}]); {len(wrong)} such pair(s); this is rank {rank}")


def kernels(nbytes: int, world_size: int, dtype: str | None = None, sms: int = 132, threads: int = 512,
            team=None) -> list:
    """[(jit function, args)] of the kernel :class:`AllToAll` builds for `nbytes` of output per rank (bytes:
    one build serves every dtype) among the ranks of `team` (None: the world)."""
    args = (world_size, blocks_per_peer_for(nbytes, world_size, sms), threads)
    return [(all_to_all_kernel, args if team is None else (*args, team))]


class AllToAll(Op):
    """AllToAll with equal splits of dim 0 of a `(R, ...)` tensor of `dtype` (R divisible by W): rank r
    receives rows ``[r*R/W, (r+1)*R/W)`` of every rank, in rank order.

    Collective to construct (allocates the symmetric output; checks that every rank passed the same
    shape and dtype). ``a2a(x)`` returns the output, which lives in this op's symmetric buffer and is
    overwritten by the next call; ``a2a(x, out=t)`` copies it into `t`.
    """

    NAME, KERNEL = "AllToAll", "all_to_all"
    GRAPH_SAFE = True

    def __init__(self, shape, dtype, *, blocks_per_peer: int | None = None, threads: int = 512,
                 _capacity_rows: int | None = None, group=None):
        import math

        import torch

        with self.arguments(shape=shape, dtype=dtype, capacity_rows=_capacity_rows, blocks_per_peer=blocks_per_peer,
                            threads=threads, group=group):
            W = self.world_size
            self.shape = vectors.as_shape("AllToAll", shape)
            checks.as_dtype("AllToAll", "dtype", dtype)
            if len(self.shape) == 0:
                checks.fail("AllToAll", "shape", repr(self.shape), "(rows, ...) with at least one dimension")
            checks.as_int("AllToAll", "_capacity_rows", _capacity_rows, lo=0, allow_none=True)
            vectors.check_launch("AllToAll", blocks_per_peer, threads, W, lambda: max(1, vectors.sm_count() // W))
            if blocks_per_peer is not None and blocks_per_peer < W:
                checks.fail("AllToAll", "blocks_per_peer", repr(blocks_per_peer), f"at least the world size {W} "
                            "(blocks (b < W, 0) do the final waits)")
            row_bytes = math.prod(self.shape[1:]) * vectors.element_size(dtype)
            checks.fits_int32("AllToAll", "shape", repr(self.shape), self.shape[0] * row_bytes, "its bytes")
            if _capacity_rows is not None:
                checks.fits_int32("AllToAll", "_capacity_rows", repr(_capacity_rows), _capacity_rows * row_bytes,
                                  "the bytes of its output")
            if _capacity_rows is None and self.shape[0] % W:
                checks.fail("AllToAll", "shape", repr(self.shape), f"(rows, ...) with rows divisible by the world size "
                            f"{W} (equal splits; all_to_all_single takes split sizes)")
        self.dtype = dtype
        self.row_bytes = math.prod(self.shape[1:]) * vectors.element_size(dtype)
        self.capacity_rows = self.shape[0] if _capacity_rows is None else _capacity_rows
        [(fn, args)] = kernels(self.capacity_rows * self.row_bytes, W, None, vectors.sm_count(), threads,
                               self.kernel_team)
        self.blocks_per_peer = blocks_per_peer or args[1]
        # derived from this GPU's SM count: ranks on GPUs of different sizes (MIG) would wait for a different
        # number of arrivals than their peers send
        checks.require_same_on_all_ranks("AllToAll", blocks_per_peer=self.blocks_per_peer)
        self.out = self.symmetric((self.capacity_rows, *self.shape[1:]), dtype)
        self._out_bytes = self.out.view(-1).view(torch.uint8) if self.out.numel() else \
            torch.empty(0, dtype=torch.uint8, device=self.out.device)
        self.ready = self.symmetric((W,), torch.uint64, zero=True)
        self.arrived = self.symmetric((W,), torch.uint64, zero=True)
        self.kernel, self._direct = self.build(fn, (W, self.blocks_per_peer, *args[2:]),
                                               ("x", "out", "meta", "ready", "arrived", "counters", "n_in", "n_out"))
        self.call_counters(self.blocks_per_peer * W)
        if _capacity_rows is None:
            rows = self.shape[0] // W
            self.meta = self._meta([rows] * W, [[rows] * W for _ in range(W)])

    def _meta(self, send_rows, matrix):
        """The kernel's (3, W) int64 table for these splits (see :func:`split_table`), on the GPU."""
        import torch

        table = split_table(send_rows, matrix, self.rank, self.row_bytes)
        return torch.tensor(table, dtype=torch.int64).to(self.out.device)

    def _launch(self, x, meta, stream) -> None:
        import torch

        if not x.is_contiguous():
            x = x.contiguous()
        if self._direct is not None:
            return self.launch_direct(x.data_ptr(), self.out.data_ptr(), meta.data_ptr(), self.ready.data_ptr(),
                                      self.arrived.data_ptr(), self.counters.data_ptr(), x.nbytes,
                                      self._out_bytes.numel(), stream)
        xb = x.view(-1).view(torch.uint8) if x.numel() else torch.empty(0, dtype=torch.uint8, device=x.device)
        self.kernel.launch(xb, self._out_bytes, meta, self.ready, self.arrived, self.counters)

    def __call__(self, x, out=None):
        self._launch(x, self.meta, self.begin(x, out))
        if out is None or out.data_ptr() == self.out.data_ptr():
            return self.out
        out.copy_(self.out)
        return out


@op_cache.cached(16)
def _cached(shape, dtype, world_size, group=None):
    return AllToAll(shape, dtype, group=group)


@op_cache.cached(8)
def _cached_v(row_shape, dtype, capacity_rows, world_size, group=None):
    return AllToAll((capacity_rows, *row_shape), dtype, _capacity_rows=capacity_rows, group=group)


def _splits(name: str, sizes, rows: int, W: int) -> tuple[list[int] | None, str | None]:
    """(split list, None) or (None, error message) for `sizes` (None = equal splits of `rows`)."""
    if sizes is None:
        if rows % W:
            return None, (f"{name}: None (equal splits) needs dim 0 divisible by the world size {W}, got {rows} "
                          "rows")
        return [rows // W] * W, None
    try:
        s = [int(v) for v in sizes]
    except (TypeError, ValueError):
        return None, f"{name}: got {sizes!r}, expected a list of {W} ints"
    if len(s) != W or any(v < 0 for v in s):
        return None, f"{name}: got {s}, expected {W} non-negative ints (rows per rank)"
    if sum(s) != rows:
        return None, f"{name}: got {s} (sum {sum(s)}), expected sizes summing to dim 0 = {rows}"
    return s, None


_fn_check = checks.CallCheck("all_to_all_single")


def _validate_fn(output, input, W, group=None) -> None:  # noqa: A002
    """Checks of all_to_all_single's tensors; with the world size `W`: those of equal splits too (among the ranks of
    `group`: tilescale.runtime.team)."""
    if group is not None:
        from ..runtime import team

        members = team.of_group("all_to_all_single", group)   # a bad group: an argument error, agreed as the others
        W = W and members.size
    for name, t in (("output", output), ("input", input)):
        checks.check_tensor("all_to_all_single", name, t, min_dims=1)
    if output.dtype != input.dtype or tuple(output.shape[1:]) != tuple(input.shape[1:]):
        rows = ", ".join(map(str, input.shape[1:]))
        checks.fail("all_to_all_single", "output", checks.describe(output),
                    f"(rows, {rows}) {input.dtype} (input's row shape and dtype)")
    if W is None:
        return
    if tuple(output.shape) != tuple(input.shape):
        checks.fail("all_to_all_single", "output", checks.describe(output),
                    f"shape {tuple(input.shape)} (equal splits: the shape of input)")
    if input.shape[0] % W:
        checks.fail("all_to_all_single", "input", f"{input.shape[0]} rows", f"a multiple of the world size {W} "
                    "(or pass split sizes)")


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *, group=None):  # noqa: A002
    """``torch.distributed.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group)`` (among
    the ranks of `group`: tilescale.runtime.team; split sizes per rank of the group).

    Equal splits (both None): one cached :class:`AllToAll` per (shape, dtype); the result is copied into
    `output` unless `output` is that op's buffer. Variable splits (rows per rank; ``input_split_sizes[p]``
    on rank r must equal ``output_split_sizes[r]`` on rank p): the split sizes of every rank are exchanged
    on the host (one small all_gather over the control group per call) and checked; a mismatch raises
    :class:`~tilescale.errors.CollectiveMismatchError` on every rank. Returns `output`.
    """
    from .. import runtime
    from ..runtime import team

    equal = output_split_sizes is None and input_split_sizes is None
    rt = checks.runtime_or_none()
    if equal:  # checked (and agreed across ranks) once per signature
        _fn_check((checks.signature(output), checks.signature(input), group), _validate_fn, output, input,
                  rt.info.world_size if rt is not None else None, group)
        op = _cached(tuple(input.shape), input.dtype, runtime.current().info.world_size, group)
        return op(input, out=output)

    # variable splits: every rank learns every rank's splits (and whether its arguments were valid)
    if capture.is_capturing():   # the same on every rank (they capture the same region)
        raise GraphCaptureError("all_to_all_single: split sizes during CUDA graph capture (they are exchanged "
                                "on the host on every call, which a graph cannot replay); capture equal splits "
                                "only (output_split_sizes = input_split_sizes = None)")
    rt = runtime.current()
    t = None
    with checks.deferred("all_to_all_single") as d:
        t = None if group is None else team.of_group("all_to_all_single", group)
        _validate_fn(output, input, None)
    W, me = (rt.info.world_size if t is None else t.size), rt.info.rank
    tt = None if t is None else (t.start, t.stride, t.size)
    if d.error is not None:
        mine = dict(send=None, recv=None, err=str(d.error).removeprefix("all_to_all_single: "), row=None, dtype=None,
                    team=tt)
    else:
        send, err_in = _splits("input_split_sizes", input_split_sizes, input.shape[0], W)
        recv, err_out = _splits("output_split_sizes", output_split_sizes, output.shape[0], W)
        mine = dict(send=send, recv=recv, err=err_in or err_out, row=tuple(input.shape[1:]), dtype=str(input.dtype),
                    team=tt)
    every = rt.all_gather_object(mine)     # (the whole world's: a group's op is allocated by every rank)
    check_splits(every, me)
    most = max(sum(v["recv"]) for v in every)
    capacity = 1 << max(0, (most - 1).bit_length())           # power of two: few distinct ops
    op = _cached_v(tuple(input.shape[1:]), input.dtype, capacity, rt.info.world_size, group)
    matrix = [every[p]["send"] for p in (range(W) if t is None else t.ranks)]
    op._launch(input, op._meta(send, matrix), op.ordered_stream())
    rows = output.shape[0]
    if output.data_ptr() != op.out.data_ptr() or not output.is_contiguous():
        output.copy_(op.out[:rows])
    return output


# ------------------------------------------------------------------------------------- registry
def run_push(output, input, output_split_sizes=None, input_split_sizes=None):  # noqa: A002
    """torch: ``dist.all_to_all_single(output, input)`` (equal splits: rank r gets the r-th W-th of
    every rank's input, which is the same memory whatever the row shape)."""
    if output_split_sizes is not None or input_split_sizes is not None:
        raise registry.PlanUnsupportedError("split sizes (the ranks' message sizes differ)")
    all_to_all_single(output.view(-1), input.view(-1))


def serve(world_size, output, input, output_split_sizes, input_split_sizes, **_):  # noqa: A002
    """A ``torch.distributed.all_to_all_single`` call as a plan runs it: equal splits only (with split sizes
    the ranks' message sizes differ)."""
    if output_split_sizes is not None or input_split_sizes is not None:
        return "split sizes given"
    if (output.numel() != input.numel() or input.dim() == 0 or output.dim() == 0 or input.shape[0] % world_size
            or output.shape[0] % world_size):
        return "input and output sizes differ, or dim 0 is not divisible by the world size"
    return registry.TorchCall(out=output, args=(input,), key=input, msg_bytes=input.numel() * input.element_size())


def bench(algo, x, world_size):
    """Into a tensor of the caller's, as all_to_all_single (and the plan selector) does: the kernel writes
    this op's symmetric buffer, then one local copy."""
    import torch

    rows = max(world_size, x.numel() // 64 // world_size * world_size)
    x = x[:rows * (x.numel() // rows)].view(rows, -1)
    op = AllToAll(x.shape, x.dtype)
    out = torch.empty_like(x)
    return op, lambda: op(x, out=out), out, (torch.empty_like(x), x)


COLLECTIVE = registry.collective("all_to_all", torch_name="all_to_all_single", aliases=("alltoall",),
                                 algos={"push": registry.Algorithm(run_push, nodes="any", graph_safe=True)},
                                 tensors=("output", "input"),
                                 serve=serve, kernels=kernels, bench=bench, busbw=lambda W: (W - 1) / W, exact=True,
                                 module=__name__)
