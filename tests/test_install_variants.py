"""What the install gives: torch bounded to the versions the tests cover (the doctor warns outside them), one NVSHMEM
wheel per CUDA variant (the doctor warns when both are installed), and no message that names the package index's
`tilescale` (someone else's empty placeholder: tilescale installs from its checkout). .ci/run resolves the variants."""
from __future__ import annotations

import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from tilescale import doctor, version

REPO = Path(__file__).resolve().parent.parent


def _setup_kwargs(monkeypatch) -> dict:
    import setuptools

    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    runpy.run_path(str(REPO / "setup.py"), run_name="__main__")
    return seen


def test_setup_requires_the_tested_torch_and_one_nvshmem_per_cuda(monkeypatch):
    kw = _setup_kwargs(monkeypatch)
    torch_req = [r for r in kw["install_requires"] if r.startswith("torch")]
    assert torch_req == [version.TORCH_REQUIREMENT] == [f"torch>={version.TORCH_LOWEST},<{version.TORCH_BELOW}"]
    assert kw["version"] == version.__version__
    for cuda in ("cu12", "cu13"):
        assert [r.split(">")[0] for r in kw["extras_require"][cuda]] == [f"nvidia-nvshmem-{cuda}"]


def test_the_cuda12_constraints_exclude_the_cuda13_nvshmem():
    lines = [ln.split("#")[0].strip() for ln in (REPO / "constraints" / "cu12.txt").read_text().splitlines()]
    assert [ln for ln in lines if ln] == ["nvidia-nvshmem-cu13<0"]


@pytest.mark.parametrize("ver,status", [("2.14.1+cu130", "ok"), ("2.11.0", "ok"), ("2.15.0", "warn"),
                                        ("2.10.1+cu128", "warn"), ("2.16.0.dev20261201+cu130", "warn")])
def test_doctor_warns_outside_the_tested_torch(ver, status):
    ctx = doctor.Context()
    ctx.torch = SimpleNamespace(__version__=ver)
    c = doctor.check_torch(ctx)
    assert c.status == status, c
    assert ver in c.found
    if status == "warn":
        assert f"{version.TORCH_LOWEST} <= torch < {version.TORCH_BELOW}" in c.found
        assert version.TORCH_REQUIREMENT in c.fix


def test_doctor_warns_when_two_nvshmem_wheels_share_their_directory(monkeypatch):
    ctx = doctor.Context()
    ctx.install = SimpleNamespace(version="3.4.5", source="pip:nvidia-nvshmem", root=Path("/site/nvidia/nvshmem"))
    monkeypatch.setattr(doctor.probes, "nvshmem_wheels", lambda: ["nvidia-nvshmem-cu13 3.4.5"])
    assert doctor.check_nvshmem(ctx).status == "ok"
    monkeypatch.setattr(doctor.probes, "nvshmem_wheels",
                        lambda: ["nvidia-nvshmem-cu12 3.4.5", "nvidia-nvshmem-cu13 3.4.5"])
    c = doctor.check_nvshmem(ctx)
    assert c.status == "warn" and "nvidia-nvshmem-cu12 3.4.5 and nvidia-nvshmem-cu13 3.4.5" in c.found, c
    assert "new virtual environment" in c.fix and "constraints/cu12.txt" in c.fix


PLACEHOLDER = re.compile(r"pip install\s+(-U\s+)?['\"`]?tilescale\b")


def test_no_message_points_at_the_placeholder_package():
    files = [*(REPO / "tilescale").rglob("*.py"), REPO / "launch.sh", REPO / "README.md", REPO / "setup.py",
             *(REPO / "docs").glob("*.md")]
    hits = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files for m in PLACEHOLDER.finditer(f.read_text())]
    assert not hits, hits
    c = doctor.check_nvshmem(SimpleNamespace(install=None, install_error=RuntimeError("NVSHMEM not found.")))
    assert c.status == "FAIL" and "pip install nvidia-nvshmem-cu13" in c.fix, c
