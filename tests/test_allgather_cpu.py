"""AllGather (tilescale/ops/allgather.py) on CPU: blocks per peer by size, and the direct launch path:
the host wrapper that tilelang generates for the kernel has exactly the C signature the op calls with raw
pointers (a tilelang change there must switch the op to its checked launcher, not corrupt a launch)."""
import ctypes
from pathlib import Path

from tilescale.ops import allgather
from tilescale.ops.allgather import default_blocks_per_peer
from tilescale.ops.direct_launch import argtypes_for, call_signature

NAMES = ("x", "out", "arrived", "counters", "n")


def test_blocks_per_peer_by_size():
    for W in (2, 4, 8):
        prev = 0
        for k in range(0, 31):
            b = default_blocks_per_peer(1 << k, W)
            assert 1 <= b <= max(1, 132 // W) and b >= prev, (W, k, b)
            prev = b
        assert default_blocks_per_peer(1 << 10, W) == 2                       # tiny: latency only
        assert default_blocks_per_peer(1 << 20, W) == 16                      # 1 MiB: 64 KiB per block
        assert default_blocks_per_peer(256 << 20, W) == min(64, 132 // W)     # large: one wave at most
    assert default_blocks_per_peer(1 << 20, 4, sms=8) == 2


def test_call_signature_parses_tilelang_wrappers():
    src = ('extern "C" TL_EXPORT int call(bfloat16_t* __restrict__ x, bfloat16_t* __restrict__ out, '
           'uint64_t* __restrict__ arrived, int64_t* __restrict__ counters, int n, '
           'cudaStream_t stream=cudaStreamDefault) {')
    sig = call_signature(src)
    assert sig == [("bfloat16_t*", "x"), ("bfloat16_t*", "out"), ("uint64_t*", "arrived"), ("int64_t*", "counters"),
                   ("int", "n"), ("cudaStream_t", "stream")]
    assert argtypes_for(sig, NAMES) == [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p]
    assert argtypes_for(sig, ("x", "out", "arrived", "counters")) is None          # a parameter more
    assert argtypes_for(sig, ("out", "x", "arrived", "counters", "n")) is None     # another order
    assert argtypes_for([("float", "x"), ("cudaStream_t", "stream")], ("x",)) is None  # a type it cannot pass
    assert call_signature("int main() {}") is None


def test_direct_entry_matches_the_built_wrapper():
    r = allgather.allgather_kernel.build(4, 16, "bfloat16")
    host = Path(r.library).with_suffix(".cu").read_text()   # the wrapper source tilelang compiled
    types = argtypes_for(call_signature(host), NAMES)
    assert types is not None, host[host.find("int call("):][:400]
    assert types[3] is ctypes.c_void_p and types[4] is ctypes.c_int      # the call counters (a pointer), n


# ------------------------------------------------------------------- the call's host path (issue 15)
class _Order:
    """A stream order that records its switches (checks.StreamOrder's interface)."""

    def __init__(self, handle):
        self.handle, self.switched = handle, []

    def switch(self, handle):
        self.switched.append(handle)
        self.handle = handle


def _allgather(monkeypatch, capturing=False):
    """An AllGather of (4, 8) float32 shards at W = 2, without GPU pieces (object.__new__): its real __call__, a
    direct launch that records its arguments, the current stream 7."""
    import torch

    from tilescale.ops import base, checks

    state = {"capturing": capturing, "stream": 7}
    monkeypatch.setattr(base, "_capturing", lambda: state["capturing"])
    ag = object.__new__(allgather.AllGather)
    ag.device, ag.captured, ag.calls = torch.device("cpu"), False, 0
    ag._check = checks.CallCheck("AllGather")
    ag._agreed = ag._check.agreed
    ag._stream = lambda: state["stream"]
    ag._order = _Order(7)
    ag.shape, ag.dtype, ag.n = (4, 8), torch.float32, 32
    ag._slots = torch.stack([torch.full((8, 8), 10.0), torch.full((8, 8), 20.0)])
    ag.buffers = (ag._slots[0], ag._slots[1])
    ag.counters = torch.zeros(16, dtype=torch.int64)
    ag._ptrs = (ag._slots.data_ptr(), 111, ag.counters.data_ptr())
    launched = []
    ag._direct = (lambda *a: launched.append(a) or 0, None)
    return ag, launched, state


def test_call_fast_path_keeps_every_check(monkeypatch):
    """ag(x) with a signature agreed before skips the checks (one set lookup) and launches the right arguments;
    any change of the argument's type, dtype, shape or device, or a non-tensor, runs the checks again (and fails
    as before); out= takes the general path and its checks."""
    import pytest
    import torch

    ag, launched, _ = _allgather(monkeypatch)
    x = torch.zeros(4, 8)
    assert ag(x) is ag.buffers[0] and ag._check.exchanges == 1            # first call: checked and agreed
    assert ag(x) is ag.buffers[1] and ag(x) is ag.buffers[0] and ag._check.exchanges == 1   # agreed: no check
    assert launched == [(x.data_ptr(), ag._slots.data_ptr(), 111, ag.counters.data_ptr(), 32, 7)] * 3
    with pytest.raises(ValueError, match=r"AllGather: x: got a float64 tensor"):
        ag(torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"AllGather: x: .*shape \(4, 8\)"):
        ag(torch.zeros(8, 4))
    with pytest.raises(ValueError, match=r"AllGather: x: .*on cpu"):
        ag(torch.zeros(4, 8, device="meta"))
    with pytest.raises(TypeError, match=r"AllGather: x: got"):
        ag([[0.0] * 8] * 4)
    assert len(launched) == 3 and ag.calls == 3       # nothing launched, no call counted by the failed calls
    p = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)   # another type: checked (valid), then agreed
    before = ag._check.exchanges
    ag(p)
    ag(p)
    assert ag._check.exchanges == before + 1 and len(launched) == 5
    t = torch.zeros(8, 8)
    assert ag(x, out=t) is t and t.eq(20.0).all()                      # call 6 wrote slot 1: copied into out
    with pytest.raises(ValueError, match=r"AllGather: out: .*shape \(8, 8\)"):
        ag(x, out=torch.zeros(4, 8))


def test_call_fast_path_stages_unaligned_or_strided_input(monkeypatch):
    import torch

    ag, launched, _ = _allgather(monkeypatch)
    base_t = torch.arange(64, dtype=torch.float32)
    x = base_t[:32].view(4, 8)
    ag(x)
    strided = torch.arange(32, dtype=torch.float32).view(8, 4).t()         # (4, 8), not contiguous
    ag(strided)
    unaligned = base_t[1:33].view(4, 8)                                  # contiguous, 4 bytes past 16-byte alignment
    ag(unaligned)
    ptrs = [a[0] for a in launched]
    assert ptrs[0] == x.data_ptr() and ptrs[1] != strided.data_ptr() and ptrs[2] != unaligned.data_ptr()
    assert all(p % 16 == 0 for p in ptrs)


def test_call_fast_path_orders_a_new_stream_and_captures(monkeypatch):
    """The stream-order switch on the fast path (a new current stream: switched once, not again); a capture after
    eager calls marks the op captured, and every later call (eager, fast path included) returns the slot of the
    device's parity, a copy, never a slot."""
    import torch

    ag, launched, state = _allgather(monkeypatch)
    x = torch.zeros(4, 8)
    ag(x)
    ag(x)
    assert ag._order.switched == []
    state["stream"] = 9
    ag(x)
    ag(x)
    assert ag._order.switched == [9] and [a[-1] for a in launched] == [7, 7, 9, 9]
    state["capturing"] = True
    ag.counters.fill_(5)                                                 # the kernel counted call 5: slot 0
    got = ag(x)
    assert ag.captured and ag._order.switched == [9]                     # no stream switch during capture
    assert got.data_ptr() not in (b.data_ptr() for b in ag.buffers) and got.eq(10.0).all()
    state["capturing"] = False
    ag.counters.fill_(8)                                                 # replays advanced it: slot 1
    got = ag(x)
    assert got.data_ptr() not in (b.data_ptr() for b in ag.buffers) and got.eq(20.0).all()
    assert len(launched) == 6


def test_capture_query_binds_torch_function_once(monkeypatch):
    """base._capturing's first call puts torch's C function in its place (no Python frame per call after), unless
    something else was put there (tests, benchmarks)."""
    import torch

    from tilescale.ops import base

    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", bool)   # a C function returning False
    monkeypatch.setattr(base, "_capturing", base._first_capture_query)
    assert base._capturing() is False and base._capturing is bool
    replaced = lambda: True  # noqa: E731
    monkeypatch.setattr(base, "_capturing", replaced)
    assert base._first_capture_query() is False and base._capturing is replaced


def test_call_on_the_default_stream_skips_the_capture_query(monkeypatch):
    """On torch's default stream (raw handle 0, the legacy NULL stream, where CUDA cannot begin a capture) the fast
    path makes no capture query; on any other stream it does, and a capturing stream takes Op.begin (captured)."""
    import torch

    from tilescale.ops import base

    ag, launched, state = _allgather(monkeypatch)
    x = torch.zeros(4, 8)
    ag(x)                                        # agreed (Op.begin: its own capture query)
    queries = []

    def query():
        queries.append(state["stream"])
        return state["capturing"]

    monkeypatch.setattr(base, "_capturing", query)
    state["stream"] = 0
    ag(x)
    ag(x)
    assert queries == [] and ag._order.switched == [0] and [a[-1] for a in launched] == [7, 0, 0]
    state["stream"], state["capturing"] = 9, True
    ag.counters.fill_(4)
    got = ag(x)
    assert queries[0] == 9 and ag.captured and ag._order.switched == [0]   # capturing: no stream switch
    assert got.eq(20.0).all() and got.data_ptr() not in (b.data_ptr() for b in ag.buffers)
