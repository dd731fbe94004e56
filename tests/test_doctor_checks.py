"""The doctor's checks are declared once each (@check in tilescale/doctor/, one module per concern)."""
from __future__ import annotations

import ast
from pathlib import Path

from tilescale import doctor
from tilescale.doctor.check import Check, check, ok, specs_of

DOCTOR = Path(doctor.__file__).resolve().parent


def test_each_check_name_is_written_once():
    names = [s.name for s in doctor.CHECKS]
    assert len(names) == len(set(names)) == 20
    consts = [n.value for p in DOCTOR.glob("*.py") for n in ast.walk(ast.parse(p.read_text()))
              if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    for name in names:
        assert consts.count(name) == 1, f"check name {name!r} is written {consts.count(name)} times"


def test_the_order_is_the_modules_then_their_declarations():
    mods = (doctor.gpus, doctor.nvshmem, doctor.network, doctor.environment, doctor.tools, doctor.settings)
    assert doctor.CHECKS == sum((specs_of(m) for m in mods), ())
    assert [s.name for s in doctor.CHECKS][:3] == ["gpus", "peer-access", "shared-gpu"]
    assert doctor.CHECKS[-1].name == "settings"


def test_a_declared_check_names_its_verdicts():
    @check("example", what="w", symptom="s", fix="f")
    def check_example(ctx) -> Check:
        return ok("fine")

    assert check_example(None) == Check("example", doctor.OK, "fine")
    assert check_example.spec.name == "example" and check_example.spec.func is check_example
    ctx = doctor.Context()
    ctx.gpu_count = 0
    assert doctor.check_peer_access(ctx).name == "peer-access"


def test_checks_of_the_install_are_skipped_without_nvshmem():
    """With no NVSHMEM found, only the nvshmem check fails; the checks of the install say they were skipped."""
    ctx = doctor.Context()
    ctx.install = None
    ctx.install_error = RuntimeError("NVSHMEM not found. Looked in, in order: ...")
    assert doctor.nvshmem.check_nvshmem(ctx).status == doctor.FAIL
    for name in ("nvshmem-version", "nvshmem-device-lib", "nvshmem-inlined", "bootstrap-plugin"):
        (spec,) = [s for s in doctor.CHECKS if s.name == name]
        got = spec.func(ctx)
        assert got == Check(name, doctor.OK, "skipped: NVSHMEM not found (see the nvshmem check)"), got
