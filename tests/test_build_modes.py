"""The build-mode table (tilescale/build_modes.py) is the one place a mode is spelled: the resolver, the nvcc
flags, the setting, the source rewriting, the doctor and the headers all follow it."""
from __future__ import annotations

import re
import subprocess
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tilescale import backend, build_modes, codegen, discovery, doctor, env
from tilescale.backend import BackendSpec, nvshmem_compile_flags, resolve_build_mode
from tilescale.build_modes import INLINED, MODES, NAMES, RDC
from tilescale.errors import BackendError

MODULE_CUH = Path(backend.INCLUDE_DIR) / "tilescale" / "module.cuh"


def test_rows_are_frozen_and_distinct():
    with pytest.raises(FrozenInstanceError):
        INLINED.name = "other"
    assert NAMES == ("inlined", "rdc") and len(set(NAMES)) == len(MODES)
    for field in ("macro", "mode_char"):
        values = [getattr(m, field) for m in MODES]
        assert len(set(values)) == len(values), field
    assert build_modes.get("rdc") is RDC
    with pytest.raises(KeyError):
        build_modes.get("auto")


def test_pass_config_spellings_pick_the_rows():
    assert build_modes.by_disable_rdc(True) is INLINED and build_modes.by_disable_rdc(False) is RDC
    for m in MODES:
        assert resolve_build_mode(None, {build_modes.PASS_CONFIG: m.disable_rdc}, inlined_supported=True) == m.name
    assert backend.PASS_DISABLE_RDC == build_modes.PASS_CONFIG == "tl.disable_rdc"


def test_each_mode_has_its_flags_and_macro():
    assert INLINED.nvcc_flags == ("-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING", "-DTILESCALE_BUILD_MODE_INLINED")
    assert RDC.nvcc_flags == ("-rdc=true", "-lnvshmem_device", "--linker-options=--exclude-libs=ALL",
                              "-DTILESCALE_BUILD_MODE_RDC")
    for m in MODES:
        assert f"-D{m.macro}" in m.nvcc_flags and all(" " not in f for f in m.nvcc_flags)
        assert ("-rdc=true" in m.nvcc_flags) == m.relocatable


def _install(tmp_path, device_library: bool, inlined: bool = True):
    return SimpleNamespace(include_dir=tmp_path / "include", lib_dir=tmp_path / "lib", version="3.4.5",
                           host_library_link_flag="-lnvshmem_host", supports_inlined=inlined,
                           device_library=tmp_path / "lib" / "libnvshmem_device.a" if device_library else None)


@pytest.mark.parametrize("mode", MODES, ids=NAMES)
def test_compile_flags_follow_the_table(clean_ts_env, tmp_path, mode):
    flags = nvshmem_compile_flags(BackendSpec("cython", True, mode.name, "test"), _install(tmp_path, True))
    at = flags.index(mode.nvcc_flags[0])
    assert tuple(flags[at:at + len(mode.nvcc_flags)]) == mode.nvcc_flags
    for other in MODES:
        if other is not mode:
            assert f"-D{other.macro}" not in flags


def test_a_mode_whose_libraries_are_missing_is_refused(clean_ts_env, tmp_path):
    with pytest.raises(BackendError, match=re.escape(f"build_mode 'rdc' needs {RDC.needs}, not found in")):
        nvshmem_compile_flags(BackendSpec("cython", True, "rdc", "test"), _install(tmp_path, False))
    assert RDC.supported_by(_install(tmp_path, True)) and not RDC.supported_by(_install(tmp_path, False))
    assert INLINED.supported_by(_install(tmp_path, False))
    assert not INLINED.supported_by(_install(tmp_path, False, inlined=False))


def test_auto_prefers_the_first_row(clean_ts_env):
    assert resolve_build_mode(None, {}, inlined_supported=True) == MODES[0].name
    assert resolve_build_mode("auto", {}, inlined_supported=False) == MODES[1].name
    with pytest.raises(BackendError, match=re.escape(f"needs {INLINED.needs}")):
        resolve_build_mode(INLINED.name, {}, inlined_supported=False)
    with pytest.raises(BackendError, match="expected one of 'auto', 'inlined', 'rdc'"):
        resolve_build_mode("fast", {})


def test_the_setting_lists_the_rows(monkeypatch):
    s = env.setting("TILESCALE_BUILD_MODE")
    assert s.choices == ("auto", *NAMES)
    for m in MODES:
        assert f"{m.name} ({m.summary})" in s.doc
    monkeypatch.setenv("TILESCALE_BUILD_MODE", "RDC")
    assert env.settings.build_mode == "rdc"


def test_source_rewriting_follows_relocatable():
    src = ('extern "C" __global__ void k(float* __restrict__ a) {\n'
           "  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];\n}\n")
    for m in MODES:
        out = codegen.transform(src, m.name)
        assert ("align_dyn_smem" in out) == m.relocatable
    fake = replace(INLINED, name="fake", relocatable=True)
    assert fake.relocatable and "fake" not in NAMES


def test_doctor_names_what_each_mode_needs(tmp_path, monkeypatch):
    ctx = doctor.Context()
    ctx.install = replace(discovery.find_nvshmem(), device_library=None)
    c = doctor.check_nvshmem_device_library(ctx)
    assert c.status == doctor.WARN and RDC.needs in c.found and RDC.name in c.found


def _preprocess(*flags: str) -> subprocess.CompletedProcess:
    from tilescale.toolchain import nvcc_path

    nv = discovery.find_nvshmem()
    cmd = [nvcc_path(), "-E", "-x", "cu", "-arch=sm_90a", "-std=c++17", f"-I{backend.INCLUDE_DIR}",
           f"-I{nv.include_dir}", *flags, str(MODULE_CUH)]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


@pytest.mark.parametrize("mode", MODES, ids=NAMES)
def test_module_header_keys_on_the_mode_macro(mode):
    """module.cuh picks its NVSHMEM setup and tilescale_module_mode() from the row's macro (preprocessed by
    nvcc with the mode's compile flags, as a kernel build does)."""
    r = _preprocess(*mode.compile_flags, f"-D{mode.macro}")
    assert r.returncode == 0, r.stdout[-3000:]
    body = r.stdout[r.stdout.index("tilescale_module_mode()"):]
    assert body.split("return", 1)[1].split(";", 1)[0].strip() == repr(mode.mode_char)


def test_module_header_refuses_a_missing_or_mismatched_mode():
    assert "define exactly one" in _preprocess().stdout
    assert "goes with nvcc -rdc=true" in _preprocess(f"-D{RDC.macro}").stdout
    assert "goes with nvcc -rdc=true" in _preprocess("-rdc=true", f"-D{INLINED.macro}").stdout
