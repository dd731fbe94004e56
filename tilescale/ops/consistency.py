"""Cross-rank argument checks for collectives: every rank must call a collective with the same shapes,
dtypes and options, or the kernels would read past buffers or wait forever. Checked once, when an op is
built (one small all_gather over the CPU control group), not on every call. The code lives in
:mod:`tilescale.ops.checks` (with the ops' other argument checks); this module keeps its old name."""
from .checks import _canon, require_same_on_all_ranks  # noqa: F401
