"""What a doctor check is: its result (:class:`Check`) and its declaration (:func:`check`), which names it once."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "FAIL"
STATUSES = (OK, WARN, FAIL)


@dataclass(frozen=True)
class Check:
    """The result of one check: ``status`` is ok / warn / FAIL; ``fix`` is set when it is not ok."""

    name: str
    status: str
    found: str
    fix: str = ""
    what: str = ""      # what was checked (filled in by run_checks from the check's spec)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CheckSpec:
    """One check: its function and the words the Troubleshooting section is made of."""

    name: str
    what: str        # what the doctor checks
    symptom: str     # what goes wrong without it
    fix: str         # how to fix it (Markdown)
    func: Callable


def ok(found: str) -> Check:
    """A check's verdict: fine (the decorated check names it)."""
    return Check("", OK, found)


def warn(found: str, fix: str) -> Check:
    """A check's verdict: a run may work, but something is off."""
    return Check("", WARN, found, fix)


def fail(found: str, fix: str) -> Check:
    """A check's verdict: a run would fail."""
    return Check("", FAIL, found, fix)


def check(name: str, *, what: str, symptom: str, fix: str):
    """Declare a check ``func(ctx) -> Check`` under `name`, with the words of its Troubleshooting entry; the
    verdicts it returns (:func:`ok`, :func:`warn`, :func:`fail`) carry that name. Its ``spec`` attribute is
    the :class:`CheckSpec`; :func:`specs_of` collects them from a module, in order."""
    def declare(func):
        @functools.wraps(func)
        def run(ctx) -> Check:
            return dataclasses.replace(func(ctx), name=name)

        run.spec = CheckSpec(name, what, symptom, fix, run)
        return run

    return declare


def specs_of(module) -> tuple[CheckSpec, ...]:
    """The checks declared in `module`, in the order they are written."""
    return tuple(v.spec for v in vars(module).values() if isinstance(getattr(v, "spec", None), CheckSpec))


def one_line(text: str) -> str:
    """Multi-line messages (the discovery error lists places) as one line."""
    out = ""
    for raw in str(text).splitlines():
        s = raw.strip()
        if s.startswith("- "):
            s = s[2:]
        if not s:
            continue
        out = s if not out else out + (" " if out.endswith(":") else "; ") + s
    return out
