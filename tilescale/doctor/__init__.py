"""Pre-flight checks of a machine before a distributed tilescale run: ``python -m tilescale doctor``.

    python -m tilescale doctor --gpus 4            # one line per check; exit 1 if a run would fail
    python -m tilescale doctor --gpus 4 --quiet    # only what is not ok, and a summary
    python -m tilescale doctor --json              # machine-readable
    python -m tilescale doctor --markdown          # the README's Troubleshooting section

    from tilescale import doctor
    checks = doctor.run_checks(gpus=4)             # [Check(name, status, found, fix, what), ...]

Each check is a small function ``check_xxx(ctx) -> Check``, declared once with its name and the words of
its Troubleshooting entry (``@check(...)`` in :mod:`.check`), in a module per concern: :mod:`.gpus`,
:mod:`.nvshmem`, :mod:`.network`, :mod:`.environment`, :mod:`.tools`, :mod:`.settings` (run in that order).
``ok`` means fine, ``warn`` means a run may work but something is off, ``FAIL`` means a run would fail.
Nothing here builds anything or starts NVSHMEM: the host library is only dlopen'ed to ask its version.
torch is imported inside the checks. What the checks read from the machine is in :mod:`.probes`.
"""
from __future__ import annotations

import dataclasses

from ..env import parse_nvshmem_size
from . import environment, gpus, network, nvshmem, probes, settings, tools
from .check import FAIL, OK, STATUSES, WARN, Check, CheckSpec, one_line, specs_of, warn
from .context import Context
from .environment import check_module_loading, check_multicast, check_nvls, check_symmetric_heap
from .gpus import NO_GPU, check_gpus, check_peer_access, check_shared_gpu
from .network import check_bootstrap_interface, check_rendezvous
from .nvshmem import (
    PIP_NVSHMEM,
    check_bootstrap_plugin,
    check_nvshmem,
    check_nvshmem_device_library,
    check_nvshmem_inlined,
    check_nvshmem_version,
)
from .probes import host_library_version, match_interfaces
from .report import compile_only, exit_code, format_check, summary
from .settings import check_settings
from .tools import TILELANG_PIN, check_cache_dirs, check_libcuda, check_nvcc, check_tilelang, check_torch

__all__ = [
    "OK", "WARN", "FAIL", "STATUSES", "Check", "CheckSpec", "Context", "CHECKS", "run_checks", "format_check",
    "summary", "exit_code", "compile_only", "troubleshooting_markdown", "NO_GPU", "PIP_NVSHMEM", "TILELANG_PIN",
    "parse_nvshmem_size", "host_library_version", "match_interfaces", "probes",
    "check_gpus", "check_peer_access", "check_shared_gpu", "check_nvshmem", "check_nvshmem_version",
    "check_nvshmem_device_library", "check_nvshmem_inlined", "check_bootstrap_plugin", "check_bootstrap_interface",
    "check_rendezvous", "check_symmetric_heap", "check_nvls", "check_multicast", "check_module_loading",
    "check_cache_dirs", "check_nvcc", "check_tilelang", "check_torch", "check_libcuda", "check_settings",
]

CHECKS: tuple[CheckSpec, ...] = sum((specs_of(m) for m in (gpus, nvshmem, network, environment, tools, settings)),
                                    ())


def run_checks(gpus: int | None = None) -> list[Check]:
    """Run every check; ``gpus`` is the number of ranks (GPUs) the run will use on this node."""
    ctx = Context(gpus)
    out = []
    for spec in CHECKS:
        try:
            c = spec.func(ctx)
        except Exception as e:  # noqa: BLE001  (a broken check must not hide the others)
            c = warn(f"the check itself failed: {type(e).__name__}: {one_line(str(e))}",
                     "report this as a tilescale bug, with the output of `python -m tilescale doctor --json`")
        out.append(dataclasses.replace(c, name=spec.name, what=spec.what, found=one_line(c.found),
                                       fix=one_line(c.fix)))
    return out


def troubleshooting_markdown() -> str:
    """The README's Troubleshooting section, generated from the checks."""
    lines = [
        "## Troubleshooting",
        "",
        "Most failures of a distributed run come from the machine's setup, not from the kernel. Run the "
        "pre-flight check first (`tilescale run` and `launch.sh` run it before every launch; "
        "`TILESCALE_SKIP_DOCTOR=1` skips it):",
        "",
        "```bash",
        "python -m tilescale doctor --gpus 4      # one line per check; exits 1 if a run would fail",
        "python -m tilescale doctor --json        # the same, as JSON",
        "python -m tilescale env                  # every TILESCALE_* setting, its value and meaning",
        "```",
        "",
        "Each line reads `ok`, `warn` (a run may work) or `FAIL` (a run would fail), then the check's name, "
        "what it found and, when not ok, the fix. The checks, with the symptom each one prevents:",
        "",
    ]
    for s in CHECKS:
        lines += [
            f"### `{s.name}`",
            "",
            f"- **Symptom:** {s.symptom}",
            f"- **The doctor checks:** {s.what}.",
            f"- **Fix:** {s.fix}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"
