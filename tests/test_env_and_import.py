"""tilescale.env (typed settings read at use time) and the lightness of `import tilescale`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tilescale import env
from tilescale.env import settings

EXPECTED_SETTINGS = {
    "TILESCALE_USE_DISTRIBUTED", "TILESCALE_USE_NVSHMEM", "NVSHMEM_HOME", "TILESCALE_CACHE_DIR",
    "TILESCALE_BUILD_MODE", "TILESCALE_WAIT_TIMEOUT_S", "TILESCALE_TARGET", "TILESCALE_CHECK_SYMMETRIC",
    "TILESCALE_LOG",
}


# ------------------------------------------------------------------------------------------- env
def test_defaults(menv, tmp_path):
    menv.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert settings.use_distributed is False
    assert settings.use_nvshmem is True
    assert settings.nvshmem_home == ""
    assert settings.build_mode == "auto"
    assert settings.wait_timeout_s == 100.0 and isinstance(settings.wait_timeout_s, float)   # bounded by default
    assert settings.target == ""
    assert settings.check_symmetric is True
    assert settings.log_level == "warning"
    assert settings.cache_dir == tmp_path / "tilescale"


@pytest.mark.parametrize("raw,want", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                      ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_bool_parsing(menv, raw, want):
    menv.setenv("TILESCALE_CHECK_SYMMETRIC", raw)
    assert settings.check_symmetric is want


def test_typed_values(menv):
    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "2.5")
    assert settings.wait_timeout_s == 2.5
    menv.setenv("TILESCALE_BUILD_MODE", " RDC ")
    assert settings.build_mode == "rdc"
    menv.setenv("TILESCALE_LOG", "Debug")
    assert settings.log_level == "debug"
    menv.setenv("TILESCALE_CACHE_DIR", "~/somewhere/ts")
    assert settings.cache_dir == Path(os.path.expanduser("~/somewhere/ts"))
    assert isinstance(settings.cache_dir, Path)
    menv.setenv("TILESCALE_TARGET", "sm_100a")
    assert settings.target == "sm_100a"


@pytest.mark.parametrize("alias,name,prop,raw,want", [
    ("TILELANG_USE_DISTRIBUTED", "TILESCALE_USE_DISTRIBUTED", "use_distributed", "1", True),
    ("TILELANG_USE_NVSHMEM", "TILESCALE_USE_NVSHMEM", "use_nvshmem", "0", False),
])
def test_aliases(menv, alias, name, prop, raw, want):
    menv.setenv(alias, raw)
    assert getattr(settings, prop) is want
    row = {n: v for n, v, _ in env.describe()}[name]
    assert f"(from {alias})" in row
    # the tilescale name wins over the alias
    menv.setenv(name, "0" if want else "1")
    assert getattr(settings, prop) is (not want)
    assert "(from" not in {n: v for n, v, _ in env.describe()}[name]


@pytest.mark.parametrize("name,raw,prop", [
    ("TILESCALE_WAIT_TIMEOUT_S", "soon", "wait_timeout_s"),
    ("TILESCALE_WAIT_TIMEOUT_S", "-1", "wait_timeout_s"),
    ("TILESCALE_USE_DISTRIBUTED", "maybe", "use_distributed"),
    ("TILELANG_USE_DISTRIBUTED", "2", "use_distributed"),
    ("TILESCALE_BUILD_MODE", "fast", "build_mode"),
    ("TILESCALE_LOG", "verbose", "log_level"),
    ("TILESCALE_CHECK_SYMMETRIC", "sometimes", "check_symmetric"),
])
def test_invalid_values_name_the_variable(menv, name, raw, prop):
    menv.setenv(name, raw)
    with pytest.raises(ValueError) as ei:
        getattr(settings, prop)
    msg = str(ei.value)
    assert name in msg and repr(raw) in msg and "expected" in msg, msg


def test_describe_lists_every_setting(menv):
    rows = env.describe()
    names = [r[0] for r in rows]
    assert set(names) == {s.name for s in env.SETTINGS}
    assert EXPECTED_SETTINGS <= set(names)
    assert len(names) == len(set(names))
    assert all(doc.strip() for _, _, doc in rows)
    # an invalid value is shown, not raised
    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "soon")
    row = {n: v for n, v, _ in env.describe()}["TILESCALE_WAIT_TIMEOUT_S"]
    assert row.startswith("INVALID:") and "soon" in row
    assert env.setting("TILESCALE_BUILD_MODE").name == "TILESCALE_BUILD_MODE"


def test_values_are_read_at_use_time(menv):
    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "1")
    assert settings.wait_timeout_s == 1.0
    os.environ["TILESCALE_WAIT_TIMEOUT_S"] = "7"  # changed after import and after a first read
    assert settings.wait_timeout_s == 7.0
    menv.delenv("TILESCALE_WAIT_TIMEOUT_S")
    assert settings.wait_timeout_s == 100.0


def test_values_read_at_use_time_in_a_fresh_process(python_runner):
    code = ("import os, tilescale\nfrom tilescale.env import settings\n"
            "a = settings.build_mode\nos.environ['TILESCALE_BUILD_MODE'] = 'rdc'\n"
            "print(a, settings.build_mode)\n")
    r, _ = python_runner(code, {"TILESCALE_BUILD_MODE": "inlined"})
    assert r.returncode == 0, r.stdout
    assert r.stdout.split()[-2:] == ["inlined", "rdc"]


# ----------------------------------------------------------------------------------------- import
HEAVY = ("tilelang", "tvm", "tvm_ffi", "torch", "torch.distributed", "numpy", "nvidia", "nvidia.nvshmem")


def test_import_tilescale_is_light(python_runner):
    code = ("import sys, json\nimport tilescale\n"
            "names = dir(tilescale)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm', 'tvm_ffi', 'torch',"
            " 'nvidia', 'numpy'))\n"
            "print(json.dumps({'heavy': heavy, 'version': tilescale.__version__, 'dir': names}))\n"
            # a lazy name really loads its module
            "tilescale.jit\n"
            "print(json.dumps({'after': 'tilelang' in sys.modules}))\n")
    r, _ = python_runner(code)
    assert r.returncode == 0, r.stdout
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    first, after = json.loads(lines[0]), json.loads(lines[1])
    assert first["heavy"] == [], f"import tilescale imported {first['heavy']}"
    for m in HEAVY:
        assert m not in first["heavy"]
    assert first["version"]
    for name in ("jit", "compile", "build", "resolve_backend", "init_distributed", "barrier", "language", "symm"):
        assert name in first["dir"]
    assert after["after"] is True


def test_unknown_attribute():
    import tilescale

    with pytest.raises(AttributeError, match="no attribute 'not_a_thing'"):
        tilescale.not_a_thing  # noqa: B018
