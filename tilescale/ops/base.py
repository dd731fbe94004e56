"""What the host side of every tilescale op shares: :class:`Op`.

An op file holds its configuration, its buffers and its kernel (ThunderKittens' ``kernels/parallel``
layout); the steps around them are written once, here:

1. construction (collective): ``with self.arguments(**raw_args): <checks>`` takes the runtime handle
   (``rt``, ``world_size``, ``rank``), runs the checks with their errors held back, then makes every rank
   agree that all passed the same arguments and that all found them valid
   (:func:`~tilescale.ops.checks.require_same_on_all_ranks`: a rank never raises alone);
2. :meth:`Op.symmetric` allocates the op's symmetric buffers (collectively), which :meth:`Op.close` frees;
   :meth:`Op.build` compiles the kernel and finds its direct entry point
   (:func:`~tilescale.ops.direct_launch.direct_entry`);
3. every call starts with :meth:`Op.begin`: run the call checks (``_validate``, agreed across ranks once
   per argument signature) and order a change of the current stream after the previous call's
   (:class:`~tilescale.ops.checks.StreamOrder`). Every op of tilescale is ``GRAPH_SAFE``: no per-call state
   on the host (the collectives and GEMM+RS count calls on the device, :meth:`Op.call_counters` and
   ``T.call_number``, their buffers double-buffered by its parity; AG+GEMM's flags are set and reset on the
   device), so calls may be captured in a CUDA graph (:mod:`.capture`: no stream-order change during
   capture; the ops whose result is one of two output slots, :class:`DoubleBuffered`, then return it by the
   device's parity); an op that is not (``GRAPH_SAFE = False``, the default of a new op) refuses capture.
   AllGather runs these steps inline for its common call (not capturing, no ``out``, a signature agreed before:
   issue 15's host time), and :meth:`Op.begin` itself for every other;
4. the launch: :meth:`Op.launch_direct` with raw pointers when the tensors are as the kernel wants them
   (one ctypes call), else the checked ``kernel.launch`` on staged copies (:meth:`Op.scratch`: padded
   scratch tensors owned by the op).
"""
import contextlib
import math

from .. import errors
from . import capture, checks
from .direct_launch import direct_entry
from .vectors import stream_getter, vector_view


class Op:
    """Base of the ops' classes. A subclass sets ``NAME`` (its class name, in messages) and ``KERNEL``
    (its kernel's name, in launch errors); the call checks (``_validate``) are those of ``op(x, out=None)``
    with `x` of ``shape`` and `out` of ``out_shape``, both of ``dtype`` (``X_WHAT`` / ``OUT_WHAT``: why,
    in messages), unless it defines its own. ``GRAPH_SAFE``: its kernels count calls on the device
    (:meth:`call_counters`), so its calls may be captured in a CUDA graph; else they refuse capture."""

    NAME = "Op"
    GRAPH_SAFE = False
    KERNEL = "op"
    X_WHAT = OUT_WHAT = ""
    out_shape = None      # None: ``shape``
    # the ranks it runs among (tilescale.runtime.team; set by arguments(): the world's team unless a group was
    # given), the group as given, and its kernels' team argument (None: the world)
    team = group = kernel_team = None

    # ------------------------------------------------------------------------------- construction
    @contextlib.contextmanager
    def arguments(self, **args):
        """``with self.arguments(**args): <checks>``: the runtime handle first (``self.rt``,
        ``self.world_size``, ``self.rank``); then the checks in the block, whose argument errors are held
        back until every rank has learnt whether all passed equal `args` (the raw arguments) and whether
        any rank's checks failed: then every rank raises, or none does. Construction during CUDA graph
        capture is refused the same way (agreed: :func:`.capture.construction_error`). Sets up the call
        checks and the stream order."""
        from .. import runtime
        from ..runtime import team

        self.rt = runtime.current()
        info = self.rt.info
        self.group = group = args.pop("group", None)    # as the caller gave it (team.torch_group)
        self.team = team.Team.world(info.world_size)
        with checks.deferred(self.NAME) as g:     # a bad group: the block checks as for the whole world
            self.team = team.resolve(self.NAME, group, info.rank, info.world_size)
        self.world_size, self.rank = self.team.size, self.team.index(info.rank)
        with checks.deferred(self.NAME) as d:
            yield args      # the block may complete an argument (a default it resolved)
        checks.require_same_on_all_ranks(self.NAME, g.error or d.error or capture.construction_error(self.NAME),
                                         self.team, **args)
        self.kernel_team = team.kernel_team(self.team, info.world_size)
        self._arguments = args
        self.device = checks.this_device()
        self._check = checks.CallCheck(self.NAME)
        self._agreed = self._check.agreed
        self._order = checks.StreamOrder(self.device)
        self._stream = stream_getter()
        self._buffers, self._scratch = [], {}
        self.captured = False   # a call of this op was captured in a CUDA graph (replays count on the device)

    def pe(self, i: int) -> int:
        """World rank (PE) of this op's rank `i` (its group's: :mod:`tilescale.runtime.team`)."""
        return i if self.team is None else self.team.pe(i)

    def symmetric(self, shape, dtype, *, zero: bool = False):
        """A symmetric tensor of this op (collective; zero-filled with `zero`), freed by :meth:`close`. When
        it cannot be allocated (e.g. the heap is exhausted: on every rank alike), the op's buffers allocated
        so far are freed before the error propagates."""
        from ..runtime import symm

        try:
            t = (symm.zeros if zero else symm.empty)(shape, dtype=dtype)
        except BaseException:
            self.close()
            raise
        self._buffers.append(t)
        return t

    def call_counters(self, blocks: int):
        """This op's call counters (``self.counters``): `blocks` int64 words, one per block of its kernel,
        zero, in this GPU's memory (not symmetric); the kernel counts its calls in them (``T.call_number``).
        Zeroed before this returns (the first call may be made on another stream)."""
        import torch

        self.counters = torch.zeros(blocks, dtype=torch.int64, device=self.device)
        torch.cuda.current_stream(self.device).synchronize()
        return self.counters

    def compile_ahead(self, jobs) -> None:
        """Compile this op's kernels (``(fn, args)`` or ``(fn, args, kwargs)``) side by side, as one batch with one
        progress line on rank 0 (tilescale.batch), before :meth:`build` takes them one by one from memory. A kernel
        that fails here is compiled again by build(), which raises its error as it does."""
        from ..compilation.batch import compile_all

        try:
            compile_all(jobs, label=f"{self.NAME} kernels")
        except Exception:  # noqa: BLE001  (build() raises it, as it does without a batch)
            pass

    def build(self, fn, args: tuple, names: tuple | None = None):
        """(kernel, direct entry or None): ``fn(*args)`` compiled (through :meth:`compile_ahead`, unless it was
        already) and loaded, and its C entry point when its parameters are `names` (+ the stream). A kernel that TVM
        cannot build because a size of this problem does not fit its 32-bit indices (sizes the op's own checks did
        not foresee) is an OpArgumentError naming the op and its arguments, raised alike on every rank (the same
        arguments, agreed), once the op's buffers are freed."""
        if hasattr(fn, "compile_tir"):
            self.compile_ahead([(fn, args)])
        try:
            kernel = fn(*args)
        except Exception as e:
            line = next((ln for ln in str(e).splitlines() if "exceeds maximum of int32" in ln), None)
            if line is None:
                raise
            self.close()
            shown = ", ".join(f"{k}={v}" for k, v in getattr(self, "_arguments", {}).items()
                              if isinstance(v, int) and not isinstance(v, bool) or k == "shape")
            name = getattr(getattr(fn, "func", None), "__name__", None) or getattr(fn, "__name__", "its kernel")
            raise errors.OpArgumentError(
                f"{self.NAME}: sizes: got {shown}, expected sizes that the kernel {name!r} can index with 32-bit "
                f"integers (TVM: {line.strip()[-160:]})") from e
        kernel.prepare()
        return kernel, (direct_entry(kernel, names) if names else None)

    def close(self) -> None:
        """Free this op's symmetric buffers (collective)."""
        from ..runtime import symm

        while self._buffers:
            symm.free(self._buffers.pop(0))

    # ------------------------------------------------------------------------------------- calls
    def _validate(self, x, out) -> None:
        """The call checks (agreed across ranks): `x` of this op's shape and dtype on this GPU, `out` (None: the
        op's choice) of its output shape and dtype on this GPU (any strides: staged)."""
        checks.check_tensor(self.NAME, "x", x, shape=self.shape, dtype=self.dtype, device=self.device,
                            what=self.X_WHAT)
        if out is not None:
            checks.check_tensor(self.NAME, "out", out, shape=self.shape if self.out_shape is None else self.out_shape,
                                dtype=self.dtype, device=self.device, what=self.OUT_WHAT)

    def call_key(self, x, out):
        """What the call checks read of the arguments: a signature agreed before costs one lookup."""
        return (type(x), x.dtype, x.shape, x.device,
                None if out is None else (type(out), out.dtype, out.shape, out.device))

    def begin(self, *args) -> int:
        """The first steps of every call (see the module docstring); returns the current stream's handle.
        During CUDA graph capture: refused unless ``GRAPH_SAFE``; the call checks as always (agreed over the
        host's gloo group: nothing on the GPU); no stream-order change (``torch.cuda.graph`` orders its capture
        stream, and an event recorded outside a capture cannot be waited for inside it)."""
        capturing = _capturing()
        if capturing:
            if not self.GRAPH_SAFE:
                raise capture.refusal(self.NAME)
            self.captured = True
        try:    # costs nothing unless raised (Python >= 3.11: zero-cost exceptions)
            key = self.call_key(*args)
            hit = key in self._agreed     # the fast path: a signature agreed before, one lookup
        except Exception:  # noqa: BLE001  (not tensors: the checks say what is wrong)
            key, hit = None, False
        if not hit:
            self._check(key, self._validate, *args)
        stream = self._stream()
        if not capturing and stream != self._order.handle:   # ordered_stream, inline
            self._order.switch(stream)
        return stream

    def ordered_stream(self) -> int:
        """The current stream's handle, after ordering it behind the previous call's stream if it changed."""
        stream = self._stream()
        if stream != self._order.handle:  # another stream than the last call's: order it after that one
            self._order.switch(stream)
        return stream

    def launch_direct(self, *args) -> None:
        """Launch through the kernel's C entry point (raw pointers and ints, the stream last)."""
        if self._direct[0](*args) != 0:
            raise self.launch_error()

    def launch_error(self, direct=None) -> RuntimeError:
        """The error of a failed direct launch (the kernel library's last error); `direct`: the entry point that
        failed, when the op has more than ``self._direct``."""
        err = (direct or self._direct)[1]
        return RuntimeError(f"{self.KERNEL} kernel launch failed: {err().decode(errors='replace')}")

    def scratch(self, name: str, shape, *, zero: bool = False):
        """A tensor of this op's dtype on this GPU, made on first use and kept (staging of arguments the
        kernel cannot take as they are)."""
        t = self._scratch.get(name)
        if t is None:
            import torch

            dev = torch.device("cuda", torch.cuda.current_device())
            t = (torch.zeros if zero else torch.empty)(shape, dtype=self.dtype, device=dev)
            self._scratch[name] = t
        return t

    def padded_scratch(self, x_groups: int, x_shape: tuple, out_shape: tuple) -> None:
        """Make the scratch tensors of :meth:`launch_vectors` now when every call needs them (``self.padded``):
        zero-filled here, eagerly; made on first use during a CUDA graph capture, their zero fill would run only
        when the graph is replayed."""
        if self.padded:
            self.scratch("x", (x_groups, math.prod(x_shape) // x_groups), zero=True)
            self.scratch("out", out_shape)

    def launch_args(self, *args) -> None:
        """The kernel's arguments between the input / output and the run-time sizes, the same on every call: the
        op's buffers (tensors, the call counters last) and ints (:meth:`launch_vectors`)."""
        self._bufs = args
        self._ptrs = tuple(a.data_ptr() if hasattr(a, "data_ptr") else a for a in args)

    def launch_vectors(self, x, out, stream, dim: int, x_groups: int, x_shape: tuple, out_shape: tuple, *,
                       writes_out: bool = True):
        """The launch of a kernel ``(x, out, *launch_args, dim)`` that sees its input as `x_shape` and its
        output as `out_shape`, runs of 16-byte vectors (the reducing collectives, :mod:`.vectors`) with `dim`
        their run-time size: with raw pointers when both tensors are contiguous, 16-byte aligned and fill whole
        vectors; else through the op's padded scratch tensors (`x` as `x_groups` equal runs, each padded with
        zeros; one copy in, and one out unless the kernel leaves `out` alone on this rank: `writes_out`).
        `out` None: a new tensor of the op's output shape. Returns `out`."""
        if out is None:
            import torch

            out = torch.empty(self.shape if self.out_shape is None else self.out_shape, dtype=self.dtype,
                              device=x.device)
        if x.numel() == 0:
            return out
        if self._direct is not None and not self.padded and x.is_contiguous() and out.is_contiguous():
            xp, op = x.data_ptr(), out.data_ptr()
            if not (xp | op) & 15:  # the fast path: 16-byte aligned, whole vectors
                self.launch_direct(xp, op, *self._ptrs, dim, stream)
                return out
        xv, ov = vector_view(x, x_shape), vector_view(out, out_shape)
        if xv is None:
            n = x.numel() // x_groups
            xpad = self.scratch("x", (x_groups, math.prod(x_shape) // x_groups), zero=True)
            xpad[:, :n].copy_(x.reshape(x_groups, n))
            xv = xpad.view(x_shape)
        if ov is None:
            ov = self.scratch("out", out_shape)
        self.kernel.launch(xv, ov, *self._bufs)
        if writes_out and (ov.data_ptr() != out.data_ptr() or not out.is_contiguous()):
            out.copy_(ov.view(-1)[:out.numel()].view(out.shape))
        return out


class DoubleBuffered(Op):
    """Base of the ops whose call writes its whole result into one of two symmetric output slots, the slot of
    the parity of its call number e ((e - 1) % 2, counted on the device: ``T.call_number``): AllGather and
    AllGatherHierarchical. The subclass makes its slots with :meth:`make_slots` and its ``self.counters``
    (:meth:`Op.call_counters`), and ends its call with :meth:`slot_result`.

    What a call returns: the slot it wrote, valid for the work enqueued before the next call of the op (peers may
    overwrite it in the call after next); with ``out=t``, a copy into `t` (none when `t` is that slot). Once a call
    of the op has been captured in a CUDA graph (``captured``), replays advance the device's count without the
    host knowing: then, during the capture and in every later eager call, the result is the slot chosen by the
    device's parity, copied on the stream without a host sync (:meth:`_by_parity`), and ``out`` / ``next_out``
    raise."""

    def make_slots(self, out_shape: tuple, dtype, n: int) -> None:
        """``self._slots``: the two output slots (symmetric, zero-filled: one tensor of shape (2, *out_shape)),
        ``self.buffers`` its two halves, ``self._out3d`` the (2, W, n) view a kernel writes (n elements per rank),
        and ``self.calls = 0``: the calls counted on the host, equal to the device's count until a capture."""
        self._slots = self.symmetric((2, *out_shape), dtype, zero=True)
        self.buffers = (self._slots[0], self._slots[1])
        self._out3d = self._slots.view(2, self.world_size, n)
        self.calls = 0

    @property
    def out(self):
        """The output slot of the last call (before the first call: the slot the first call writes)."""
        self._host_count("out")
        return self.buffers[(max(self.calls, 1) - 1) % 2]

    @property
    def next_out(self):
        """The output slot the next call writes."""
        self._host_count("next_out")
        return self.buffers[self.calls % 2]

    def _host_count(self, what: str) -> None:
        if self.captured:
            raise RuntimeError(f"{self.NAME}.{what}: a call of this op was captured in a CUDA graph, so the host no "
                               "longer knows which slot a call writes (replays count on the device); use the "
                               "tensor a call returns")

    def slot_result(self, out):
        """What the call just launched returns (see the class docstring): its slot, or `out` holding a copy."""
        if self.captured:    # the device's count decides the slot (replays advanced it without the host)
            return self._by_parity(out)
        s = self.calls % 2
        self.calls += 1
        result = self.buffers[s]
        if out is None or out.data_ptr() == result.data_ptr():
            return result
        out.copy_(result)
        return out

    def _by_parity(self, out):
        """The slot that the call just enqueued writes, chosen by the device's count ((e - 1) % 2), copied into
        `out` (None: a new tensor) on the stream: no host sync, capturable."""
        import torch

        if out is not None and any(out.data_ptr() == b.data_ptr() for b in self.buffers):
            raise RuntimeError(f"{self.NAME}: out is one of this op's slots, but a call of this op was captured in a "
                               "CUDA graph, so a call's slot is chosen on the device: pass another tensor")
        slot = torch.remainder(self.counters[:1] - 1, 2)
        if out is None:
            out = torch.empty_like(self.buffers[0])
        if out.is_contiguous():
            torch.index_select(self._slots, 0, slot, out=out.view(1, *out.shape))
        else:
            out.copy_(torch.index_select(self._slots, 0, slot)[0])
        return out


def _first_capture_query() -> bool:
    """Whether the current stream is capturing a CUDA graph (one C call, ~0.1 us, once CUDA is initialised).
    This is ``_capturing`` until its first call, which replaces this module's ``_capturing`` by torch's C function
    itself, so that the ops' calls (``_capturing()`` in :meth:`Op.begin`, ``base._capturing()`` in AllGather's)
    run no Python frame and no import for it. A ``_capturing`` put in its place (tests, benchmarks) is left as it
    is (a module that imported this function by name calls it every time and gets the same answer)."""
    global _capturing
    import torch

    query = torch._C._cuda_isCurrentStreamCapturing
    if _capturing is _first_capture_query:
        _capturing = query
    return query()


_capturing = _first_capture_query
