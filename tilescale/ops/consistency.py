"""Cross-rank argument checks for collectives: every rank must call a collective with the same shapes,
dtypes and options, or the kernels would read past buffers or wait forever. Checked once, when an op is
built (one small all_gather over the CPU control group), not on every call."""
from ..errors import CollectiveMismatchError


def require_same_on_all_ranks(op: str, **args) -> None:
    """Raise :class:`~tilescale.errors.CollectiveMismatchError` on every rank unless every rank passed
    equal values for each keyword argument of `op`; the message names each differing argument and shows
    every rank's value.

    torch equivalent: none (NCCL hangs or reads garbage in this case).
    """
    from .. import runtime

    rt = runtime.current()
    mine = {k: _canon(v) for k, v in args.items()}
    everyone = rt.all_gather_object(mine)
    bad = [k for k in mine if any(v.get(k) != mine[k] for v in everyone)]
    if bad:
        lines = []
        for k in bad:
            vals = ", ".join(f"rank {r}: {v.get(k)}" for r, v in enumerate(everyone))
            lines.append(f"  {k}: {vals}")
        raise CollectiveMismatchError(
            f"{op}: argument(s) {', '.join(bad)} differ across ranks; every rank must pass the same values:\n"
            + "\n".join(lines) + f"\n(this is rank {rt.info.rank})")


def _canon(v):
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)  # torch.dtype, torch.Size...
