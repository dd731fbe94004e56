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
