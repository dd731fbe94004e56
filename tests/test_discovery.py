"""NVSHMEM discovery: NVSHMEM_HOME, the 3rdparty source build, the pip wheel; order, versions, errors."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from nvshmem_versions import wheel_version

from tilescale import discovery
from tilescale.discovery import clear_cache, find_nvshmem, read_version
from tilescale.errors import NvshmemNotFoundError

WHEEL = wheel_version()   # the installed nvidia-nvshmem wheel's version (its metadata), e.g. "3.4.5"
needs_wheel = pytest.mark.skipif(WHEEL is None, reason="no nvidia-nvshmem wheel installed (pip install -e '.[cu13]')")


def make_tree(root: Path, version=(3, 4, 5), *, include="include", lib="lib", device_lib=True, uid=True,
              inlining=True) -> Path:
    """A fake NVSHMEM install under `root` (headers and empty library files)."""
    inc, libd = root / include, root / lib
    (inc / "non_abi").mkdir(parents=True, exist_ok=True)
    libd.mkdir(parents=True, exist_ok=True)
    (inc / "nvshmem.h").write_text("// fake nvshmem.h\n")
    major, minor, patch = version
    (inc / "non_abi" / "nvshmem_version.h").write_text(
        "#pragma once\n"
        f"#define NVSHMEM_VENDOR_MAJOR_VERSION {major}\n"
        f"#define NVSHMEM_VENDOR_MINOR_VERSION   {minor}\n"
        f"#define NVSHMEM_VENDOR_PATCH_VERSION\t{patch}\n"
        "#define NVSHMEM_VENDOR_STRING \"3.x\"\n")
    if inlining:
        (inc / "non_abi" / "nvshmem_build_options.h").write_text(
            "#define NVSHMEM_ENABLE_ALL_DEVICE_INLINING_SUPPORTED\n// NVSHMEM_ENABLE_ALL_DEVICE_INLINING\n")
    (libd / "libnvshmem_host.so.3").write_bytes(b"")
    if device_lib:
        (libd / "libnvshmem_device.a").write_bytes(b"")
    if uid:
        (libd / "nvshmem_bootstrap_uid.so.3").write_bytes(b"")
    return root


@pytest.fixture
def env(clean_ts_env, tmp_path):
    """Clean environment, 3rdparty pointed at a directory that does not exist."""
    clean_ts_env.setattr(discovery, "THIRDPARTY_BUILD", tmp_path / "no-3rdparty" / "build")
    clear_cache()
    return clean_ts_env


def _no_pip_wheel(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *a, **kw):
        if name == "nvidia.nvshmem":
            return None
        return real(name, *a, **kw)

    monkeypatch.setattr(discovery.importlib.util, "find_spec", find_spec)


def test_nvshmem_home(env, tmp_path):
    home = make_tree(tmp_path / "home", (3, 4, 5))
    env.setenv("NVSHMEM_HOME", str(home))
    clear_cache()
    nv = find_nvshmem()
    assert nv.source == "NVSHMEM_HOME"
    assert nv.root == home and nv.include_dir == home / "include" and nv.lib_dir == home / "lib"
    assert nv.host_library == home / "lib" / "libnvshmem_host.so.3"
    assert nv.device_library == home / "lib" / "libnvshmem_device.a"
    assert nv.bootstrap_uid == home / "lib" / "nvshmem_bootstrap_uid.so.3"
    assert nv.version == "3.4.5" and nv.version_tuple == (3, 4, 5)
    assert nv.host_library_link_flag == "-l:libnvshmem_host.so.3"
    assert nv.supports_inlined


def test_nvshmem_home_optional_parts(env, tmp_path):
    home = make_tree(tmp_path / "home", (3, 2, 0), device_lib=False, uid=False, inlining=False)
    env.setenv("NVSHMEM_HOME", str(home))
    clear_cache()
    nv = find_nvshmem()
    assert nv.device_library is None and nv.bootstrap_uid is None
    assert not nv.supports_inlined


@pytest.mark.parametrize("include,lib", [("src/include", "src/lib"), ("include", "lib")])
def test_thirdparty_build_layouts(env, tmp_path, include, lib):
    build = make_tree(tmp_path / "3rdparty" / "nvshmem_src" / "build", (3, 5, 1), include=include, lib=lib)
    env.setattr(discovery, "THIRDPARTY_BUILD", build)
    clear_cache()
    nv = find_nvshmem()
    assert nv.source == "3rdparty"
    assert nv.include_dir == build / include and nv.lib_dir == build / lib
    assert nv.version == "3.5.1"


@needs_wheel
def test_pip_wheel(env):
    nv = find_nvshmem()
    assert nv.source == "pip:nvidia-nvshmem"
    assert nv.version == WHEEL                      # the headers say what the wheel's metadata says
    assert nv.version_tuple == tuple(int(x) for x in WHEEL.split("."))
    assert (3, 4) <= nv.version_tuple < (4,)        # what setup.py's extras allow
    spec = importlib.util.find_spec("nvidia.nvshmem")
    assert nv.root in {Path(p) for p in spec.submodule_search_locations}
    assert nv.host_library.name == "libnvshmem_host.so.3" and nv.host_library.exists()
    assert (nv.include_dir / "nvshmem.h").is_file()
    assert nv.device_library is not None and nv.device_library.exists()
    assert nv.supports_inlined


def test_priority_home_then_thirdparty_then_pip(env, tmp_path):
    home = make_tree(tmp_path / "home", (3, 4, 5))
    build = make_tree(tmp_path / "build", (3, 6, 0), include="src/include", lib="src/lib")
    env.setattr(discovery, "THIRDPARTY_BUILD", build)
    env.setenv("NVSHMEM_HOME", str(home))
    clear_cache()
    assert find_nvshmem().source == "NVSHMEM_HOME"           # beats 3rdparty and the wheel
    env.delenv("NVSHMEM_HOME")
    clear_cache()
    nv = find_nvshmem()
    assert nv.source == "3rdparty" and nv.version == "3.6.0"  # beats the wheel
    env.setattr(discovery, "THIRDPARTY_BUILD", tmp_path / "missing")
    clear_cache()
    assert find_nvshmem().source == "pip:nvidia-nvshmem"


def test_environment_change_is_seen_without_clear_cache(env, tmp_path):
    """The discovery cache is keyed on NVSHMEM_HOME: changing it needs no clear_cache()."""
    assert find_nvshmem().source == "pip:nvidia-nvshmem"
    env.setenv("NVSHMEM_HOME", str(make_tree(tmp_path / "home", (3, 4, 5))))
    assert find_nvshmem().source == "NVSHMEM_HOME"


def test_read_version(tmp_path):
    inc = make_tree(tmp_path / "a", (3, 10, 12)) / "include"
    assert read_version(inc) == "3.10.12"
    # the top-level header is accepted too
    top = tmp_path / "b" / "include"
    top.mkdir(parents=True)
    (top / "nvshmem_version.h").write_text("#define NVSHMEM_VENDOR_MAJOR_VERSION 2\n"
                                           "#define NVSHMEM_VENDOR_MINOR_VERSION 11\n"
                                           "#define NVSHMEM_VENDOR_PATCH_VERSION 0\n")
    assert read_version(top) == "2.11.0"
    # a header without the patch number, or none at all, is an error that names the directory
    (top / "nvshmem_version.h").write_text("#define NVSHMEM_VENDOR_MAJOR_VERSION 2\n"
                                           "#define NVSHMEM_VENDOR_MINOR_VERSION 11\n")
    with pytest.raises(NvshmemNotFoundError, match="carry no version"):
        read_version(top)
    empty = tmp_path / "c"
    empty.mkdir()
    with pytest.raises(NvshmemNotFoundError, match=str(empty)):
        read_version(empty)


def test_not_found_lists_every_place(env, tmp_path):
    home = tmp_path / "empty-home"
    home.mkdir()
    missing = tmp_path / "no-3rdparty" / "build"
    env.setenv("NVSHMEM_HOME", str(home))
    env.setattr(discovery, "THIRDPARTY_BUILD", missing)
    _no_pip_wheel(env)
    clear_cache()
    with pytest.raises(NvshmemNotFoundError) as ei:
        find_nvshmem()
    msg = str(ei.value)
    assert isinstance(ei.value, ImportError)
    for place in ("NVSHMEM_HOME", str(home / "include" / "nvshmem.h"),
                  "3rdparty", str(missing / "src" / "include" / "nvshmem.h"), str(missing / "include" / "nvshmem.h"),
                  "pip:nvidia-nvshmem", "pip install nvidia-nvshmem-cu13"):
        assert place in msg, f"{place!r} missing from:\n{msg}"


def test_home_without_host_library_is_reported(env, tmp_path):
    home = make_tree(tmp_path / "home")
    (home / "lib" / "libnvshmem_host.so.3").unlink()
    env.setenv("NVSHMEM_HOME", str(home))
    _no_pip_wheel(env)
    clear_cache()
    with pytest.raises(NvshmemNotFoundError, match=r"NVSHMEM_HOME: no libnvshmem_host.so.3 in"):
        find_nvshmem()


@needs_wheel
@pytest.mark.parametrize("var", ["TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM"])
def test_nvshmem_switched_off(env, var):
    env.setenv(var, "0")
    with pytest.raises(NvshmemNotFoundError, match="switched off"):
        find_nvshmem()
    env.setenv(var, "1")
    nv = find_nvshmem()
    assert nv.source == "pip:nvidia-nvshmem" and nv.version == WHEEL
