"""How the doctor's results are shown: one line per check, the summary line, the exit status."""
from __future__ import annotations

from .check import FAIL, OK, STATUSES, WARN, Check
from .gpus import NO_GPU, check_gpus


def format_check(c: Check) -> str:
    line = f"{c.status:<4}  {c.name:<19} {c.found}"
    if c.status != OK and c.fix:
        line += f"  -> fix: {c.fix}"
    return line


def compile_only(checks: list[Check]) -> bool:
    """Whether the checks found no GPU: kernels can be compiled here, nothing can run."""
    return any(c.name == check_gpus.spec.name and c.found.startswith(NO_GPU) for c in checks)


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    if counts[FAIL]:
        verdict = "a run would fail"
    elif compile_only(checks):
        verdict = ("nothing can run here (no GPU): kernels can be compiled only (tilescale run -n N script.py "
                   "compiles them)")
    else:
        verdict = "ready" if not counts[WARN] else "a run should work"
    return (f"tilescale doctor: {counts[FAIL]} FAIL, {counts[WARN]} warn, {counts[OK]} ok: {verdict}"
            + (" (TILESCALE_SKIP_DOCTOR=1 skips this check in tilescale run / launch.sh)" if counts[FAIL] else ""))


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0
