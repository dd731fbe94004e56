"""Diagnostic (run 29, K6). It ran from .device/k6/ as diag6.py: a full copy of k5_diag.py (then .device/k5/diag5.py)
with the one wrapper below added; kept here as that import, the copy being identical."""
from k5_diag import diag_func, diag_kernel  # noqa: F401  (diag_kernel: K6's "copy")

import tilescale


@tilescale.jit(pass_configs={"tl.disable_thread_storage_sync": True})
def diag_nosync_kernel(M: int, N: int, K: int, W: int, V: str = ""):
    return diag_func(M, N, K, W, V)
