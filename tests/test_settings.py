"""Settings declared once (tilescale/env.py): typed descriptors on one class, settings.scope(), and the
variables the tests that check defaults clear (conftest.py reads them from env.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tilescale import env
from tilescale.env import Setting, Settings, settings


def test_every_setting_is_one_descriptor_of_settings():
    declared = [(k, v) for k, v in vars(Settings).items() if isinstance(v, Setting)]
    assert [v for _, v in declared] == list(env.SETTINGS)
    assert all(v.attr == k for k, v in declared)
    names = [s.name for s in env.SETTINGS]
    assert len(names) == len(set(names)) == len(declared)
    assert all(env.setting(s.name) is s for s in env.SETTINGS)


def test_descriptors_give_typed_values(menv, tmp_path):
    menv.setenv("TILESCALE_PROFILE_DIR", "~/prof")
    menv.setenv("TILESCALE_RANKS_PER_GPU", "3")
    menv.setenv("TILESCALE_NVCC_TIMEOUT_S", "12")
    assert settings.profile_dir == Path(os.path.expanduser("~/prof"))
    assert settings.ranks_per_gpu == 3 and settings.nvcc_timeout_s == 12.0
    assert settings.plan_dir == settings.cache_dir          # default: the cache directory
    menv.setenv("TILESCALE_CACHE_DIR", str(tmp_path))
    assert settings.plan_dir == tmp_path                     # read when used
    assert Settings.build_mode is env.setting("TILESCALE_BUILD_MODE")   # on the class: the declaration


def test_settings_cannot_be_assigned():
    with pytest.raises(AttributeError, match="TILESCALE_BUILD_MODE.*settings.scope"):
        settings.build_mode = "rdc"


def test_scope_sets_for_a_while_and_restores(menv):
    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "7")
    menv.setenv("TILELANG_USE_DISTRIBUTED", "1")
    with settings.scope(build_mode="rdc", wait_timeout_s=2.5, use_distributed=False, profile=True) as s:
        assert s is settings
        assert (settings.build_mode, settings.wait_timeout_s, settings.use_distributed, settings.profile) == \
               ("rdc", 2.5, False, True)
        assert os.environ["TILESCALE_PROFILE"] == "1" and "TILELANG_USE_DISTRIBUTED" not in os.environ
        with settings.scope(build_mode=None):                # None: unset (the default comes back)
            assert settings.build_mode == "auto"
        assert settings.build_mode == "rdc"
    assert settings.build_mode == "auto" and settings.wait_timeout_s == 7.0 and settings.use_distributed is True
    assert "TILESCALE_BUILD_MODE" not in os.environ and "TILESCALE_PROFILE" not in os.environ
    assert os.environ["TILELANG_USE_DISTRIBUTED"] == "1"


def test_scope_restores_after_an_error(menv):
    with pytest.raises(RuntimeError):
        with settings.scope(build_mode="inlined"):
            raise RuntimeError("boom")
    assert "TILESCALE_BUILD_MODE" not in os.environ


def test_scope_checks_values_and_names_first(menv):
    with pytest.raises(ValueError, match="TILESCALE_BUILD_MODE='fast': expected one of auto, inlined, rdc"):
        with settings.scope(wait_timeout_s=1, build_mode="fast"):
            pass
    assert "TILESCALE_WAIT_TIMEOUT_S" not in os.environ       # nothing was set
    with pytest.raises(AttributeError, match="no setting 'bild_mode'"):
        with settings.scope(bild_mode="rdc"):
            pass


def test_behaviour_variables_are_what_tests_clear():
    per_run = {s.name for s in env.SETTINGS if s.per_run}
    assert per_run == {"TILESCALE_CACHE_DIR", "TILESCALE_WAIT_TIMEOUT_S", "TILESCALE_COMPILE_ONLY",
                       "TILESCALE_RANKS_PER_GPU", "TILESCALE_MPS", "TILESCALE_SKIP_DOCTOR", "TILESCALE_NVCC_TIMEOUT_S",
                       "TILESCALE_NODE_SIZE", "TILESCALE_JOB_DIR", "TILESCALE_BUILD_JOBS"}
    cleared = env.behaviour_variables()
    for s in env.SETTINGS:
        for n in (s.name, *s.aliases):
            assert (n in cleared) == (not s.per_run), n


def test_clean_ts_env_clears_the_behaviour_variables(clean_ts_env):
    for n in env.behaviour_variables():
        assert n not in os.environ, n


def test_symmetric_heap_size(monkeypatch):
    monkeypatch.delenv("NVSHMEM_SYMMETRIC_SIZE", raising=False)
    assert env.symmetric_heap_size() == env.NVSHMEM_DEFAULT_SYMMETRIC_SIZE == 1 << 30
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "4G")
    assert env.symmetric_heap_size() == 4 << 30
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "4Q")
    with pytest.raises(ValueError, match="unknown suffix 'Q'"):
        env.symmetric_heap_size()


def test_invalid_settings_raise_setting_errors(menv):
    from tilescale.errors import SettingError, TileScaleError

    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "soon")
    with pytest.raises(SettingError, match="TILESCALE_WAIT_TIMEOUT_S='soon'"):
        _ = settings.wait_timeout_s
    assert issubclass(SettingError, ValueError) and issubclass(SettingError, TileScaleError)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "1e300", "604801", "-1"])
@pytest.mark.parametrize("var, attr", [("TILESCALE_WAIT_TIMEOUT_S", "wait_timeout_s"),
                                       ("TILESCALE_NVCC_TIMEOUT_S", "nvcc_timeout_s")])
def test_seconds_refuse_nan_infinite_and_huge_values(menv, raw, var, attr):
    """Not a raw ValueError / OverflowError at first use, nor a bound that never ends (nan compares false with
    every deadline): a SettingError naming the variable, the value and the range."""
    from tilescale.errors import SettingError

    menv.setenv(var, raw)
    with pytest.raises(SettingError) as e:
        getattr(settings, attr)
    msg = str(e.value)
    assert msg.startswith(f"{var}={raw!r}: expected a number of seconds from 0 to 604800"), msg
    assert "0 turns the bound off" in msg, msg
    menv.setenv(var, "604800")                     # the largest bound taken, and 0 (none)
    assert getattr(settings, attr) == 604800.0
    menv.setenv(var, "0")
    assert getattr(settings, attr) == 0.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30, -1.0])
def test_a_kernels_own_wait_timeout_is_checked_like_the_setting(value):
    """tilescale.jit(wait_timeout_s=...) reaches the -D flag of the kernel's bound in nanoseconds: refused by
    name before (inf was an OverflowError of int(), nan a ValueError)."""
    from tilescale import backend
    from tilescale.errors import SettingError

    spec = backend.BackendSpec(name="cython", distributed=True, build_mode="inlined", reason="test")
    with pytest.raises(SettingError, match=r"^wait_timeout_s=.*: expected a number of seconds from 0 to 604800"):
        backend.nvshmem_compile_flags(spec, install=None, wait_timeout_s=value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30, 0, -1.0])
def test_init_distributeds_timeout_is_checked_before_anything_starts(value):
    """init_distributed's timeout_s bounds the process groups, the host lock's wait and NVSHMEM's start: nan would
    never pass a deadline, inf overflows torch's timedelta. Refused by name (without the check, this machine's
    missing GPU would be the error)."""
    import tilescale
    from tilescale.errors import TileScaleError

    with pytest.raises(TileScaleError, match=r"^tilescale\.init_distributed\(timeout_s=.*\): expected a number of "
                                             r"seconds above 0 and at most 604800"):
        tilescale.init_distributed(timeout_s=value)
    assert not tilescale.is_initialized()
