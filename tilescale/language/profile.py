"""In-kernel timestamps for tilescale's profiler. Re-exported by ``tilescale.language`` (as ``T``).

    t0 = T.timestamp()          # uint64: GPU global timer, nanoseconds (%globaltimer)
    sm = T.smid()               # uint32: the SM this thread runs on (%smid)

A kernel records them into a uint64 buffer it is given; :mod:`tilescale.profiler.device_timeline`
decodes such buffers and maps the GPU clock onto the host's. The ops are not distributed: a kernel
that only takes timestamps keeps tilelang's own backend. Their device functions live in
``tilescale/include/tilescale/profile.cuh``, which every use also pastes into the generated source
(guarded, so a distributed kernel, which includes tilescale's headers, gets one definition).
"""
import functools
from pathlib import Path

import tilelang.language as T

__all__ = ["timestamp", "smid"]

HEADER = Path(__file__).resolve().parent.parent / "include" / "tilescale" / "profile.cuh"
TIMESTAMP_FN = "tilescale_profile_timestamp"
SMID_FN = "tilescale_profile_smid"


@functools.lru_cache(maxsize=1)
def device_source() -> str:
    """The text of profile.cuh, as pasted into kernels that use these ops."""
    return HEADER.read_text()


def timestamp():
    """The GPU's global timer in nanoseconds (uint64), read by the calling thread. Reads are ordered
    with the calling thread's loads and stores around them (the asm clobbers memory)."""
    T.import_source(device_source())
    return T.call_extern("uint64", TIMESTAMP_FN)


def smid():
    """Index of the SM that runs the calling thread (uint32)."""
    T.import_source(device_source())
    return T.call_extern("uint32", SMID_FN)
