"""tilescale.ops.vectors: "read in place" (contiguous at a 16-byte aligned address), else an aligned copy."""
import torch

from tilescale.ops import vectors


def test_is_aligned_and_aligned():
    t = torch.arange(64, dtype=torch.bfloat16)
    assert vectors.is_aligned(t) and vectors.aligned(t) is t
    off = t[1:9]                                      # 2 bytes past an aligned address
    assert off.is_contiguous() and not vectors.is_aligned(off)
    c = vectors.aligned(off)
    assert c is not off and vectors.is_aligned(c) and torch.equal(c, off)
    tr = t.view(8, 8).t()                             # aligned address, not contiguous
    assert not vectors.is_aligned(tr)
    c = vectors.aligned(tr)
    assert vectors.is_aligned(c) and torch.equal(c, tr)
    assert vectors.is_aligned(t[8:16]) and vectors.aligned(t[8:16]).data_ptr() == t[8:16].data_ptr()
