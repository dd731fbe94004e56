"""The check of tilescale's own settings (every TILESCALE_* variable parses)."""
from __future__ import annotations

from ..env import describe
from .check import Check, check, fail, ok
from .context import Context


@check('settings',
       what="every TILESCALE_* setting has a valid value",
       symptom="`ValueError: TILESCALE_...=...: expected ...` on first use.",
       fix="Fix or unset the variable; `python -m tilescale env` lists every setting, its value and meaning.")
def check_settings(ctx: Context) -> Check:
    bad = [(name, value) for name, value, _ in describe() if value.startswith("INVALID")]
    if bad:
        return fail("; ".join(v.replace("INVALID: ", "") for _, v in bad),
                    "fix or unset " + ", ".join(name for name, _ in bad) + " (python -m tilescale env lists them)")
    return ok("every TILESCALE_* setting parses (python -m tilescale env lists them)")
