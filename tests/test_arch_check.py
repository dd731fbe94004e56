"""A kernel compiled for another GPU architecture: a clear ArchMismatchError before tilelang loads it,
instead of CUDA's 'no kernel image is available'. The GPU side is in tests/gpu/bad_input_main.py."""
import os
import sys
from pathlib import Path

import pytest

from tilescale import arch
from tilescale.compiler import ArchMismatchError, check_target_arch, code_runs_on, device_arch, target_codes
from tilescale.errors import TileScaleError

H200 = (0, "NVIDIA H200", (9, 0))
A100 = (1, "NVIDIA A100-SXM4-80GB", (8, 0))
B200 = (0, "NVIDIA B200", (10, 0))


@pytest.mark.parametrize("code,runs,fails", [
    ("sm_90a", [(9, 0)], [(8, 0), (8, 9), (10, 0), (12, 0)]),          # arch-specific: that GPU only
    ("sm_90", [(9, 0)], [(8, 9), (10, 0)]),                             # machine code: same major only
    ("sm_80", [(8, 0), (8, 6), (8, 9)], [(7, 5), (9, 0), (10, 0)]),     # newer minor yes, newer major no
    ("sm_86", [(8, 6), (8, 9)], [(8, 0), (9, 0)]),
    ("sm_100a", [(10, 0)], [(9, 0), (10, 3), (12, 0)]),
    ("sm_100f", [(10, 0), (10, 3)], [(9, 0), (12, 0)]),                 # family: later minors of 10.x
    ("sm_120", [(12, 0)], [(9, 0), (10, 0)]),
])
def test_code_runs_on(code, runs, fails):
    assert all(code_runs_on(code, c) for c in runs), code
    assert not any(code_runs_on(code, c) for c in fails), code


def test_device_arch_is_what_tilelang_compiles_for():
    assert device_arch((9, 0)) == "sm_90a" and device_arch((8, 0)) == "sm_80" and device_arch((10, 0)) == "sm_100a"
    for cap in ((8, 0), (8, 6), (9, 0), (10, 0), (12, 0)):
        assert code_runs_on(device_arch(cap), cap)


def test_target_codes():
    assert target_codes(None) == [] and target_codes("auto") == []
    assert target_codes({"kind": "cuda", "arch": "sm_80"}) == ["sm_80"]
    assert target_codes({"kind": "cuda", "arch": "sm_100a", "code": ["sm_100a", "sm_103a"]}) == ["sm_100a", "sm_103a"]
    assert target_codes("llvm") == []


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a", "sm_120"])
def test_mismatch_names_both_archs_and_the_fix(arch):
    target = {"kind": "cuda", "arch": arch}
    with pytest.raises(ArchMismatchError) as ei:
        check_target_arch(target, "ring_put", device=H200)
    msg = str(ei.value)
    for needle in ("'ring_put'", arch, "NVIDIA H200", "9.0", "sm_90a", "target=", "'auto'",
                   "{'kind': 'cuda', 'arch': 'sm_90a'}", f"TILESCALE_TARGET={arch}", "tilescale.build"):
        assert needle in msg, (needle, msg)
    assert isinstance(ei.value, TileScaleError)


def test_matching_or_unset_targets_pass():
    check_target_arch({"kind": "cuda", "arch": "sm_90a"}, "k", device=H200)
    check_target_arch({"kind": "cuda", "arch": "sm_80"}, "k", device=(0, "NVIDIA A10", (8, 6)))
    check_target_arch({"kind": "cuda", "arch": "sm_100a", "code": ["sm_90a", "sm_100a"]}, "k", device=H200)
    check_target_arch(None, "k", device=B200)          # tilelang picks the GPU's own arch
    check_target_arch("auto", "k", device=A100)
    with pytest.raises(ArchMismatchError, match="sm_90a"):
        check_target_arch({"kind": "cuda", "arch": "sm_90a"}, "k", device=A100)


def test_no_gpu_means_no_check(monkeypatch):
    monkeypatch.setattr(arch, "_current_device", lambda: None)
    check_target_arch({"kind": "cuda", "arch": "sm_100a"}, "k")   # GPU-less build machine: build anything


def test_compile_refuses_before_building(monkeypatch, tmp_path):
    """tilescale.compile on a (pretend) H200 with target sm_100a: the error comes before nvcc runs (nothing
    is written to TMPDIR) and before tilelang would load the library."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "distributed"))
    from example_ring_put import ring_put_kernel

    import tilescale

    monkeypatch.setattr(arch, "_current_device", lambda: H200)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    f = ring_put_kernel.get_tir(32, 128, 2)
    with pytest.raises(ArchMismatchError, match="sm_100a.*compute capability 9.0"):
        tilescale.compile(f, target={"kind": "cuda", "arch": "sm_100a"}, world_size=2)
    assert os.listdir(tmp_path) == [], "nvcc ran before the arch check"
