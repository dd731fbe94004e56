"""Modules that moved into packages (tilescale.compilation, tilescale.runtime, tilescale.pytorch) keep their old
import paths: the old name is the new module itself, so state and monkeypatching agree under both names."""
import importlib
import sys

import pytest

import tilescale
from tilescale import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_is_the_module_at_its_new_path(old):
    new = _moved.MOVED[old]
    assert importlib.import_module(old) is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is sys.modules[new]


def test_monkeypatching_the_old_name_patches_the_module(monkeypatch):
    from tilescale.compilation import toolchain

    monkeypatch.setattr("tilescale.toolchain.nvcc_version_tag", lambda: "patched")
    assert toolchain.nvcc_version_tag() == "patched"


def test_from_import_and_attribute_access_by_old_names():
    from tilescale.compilation import toolchain
    from tilescale.toolchain import run_bounded
    assert run_bounded is toolchain.run_bounded and tilescale.toolchain is toolchain


def test_no_module_is_left_at_an_old_path():
    """An old path is only a name: a file there would shadow the moved module for some callers."""
    root = tilescale.__path__[0]
    import os
    left = [old for old in _moved.MOVED
            if os.path.exists(os.path.join(root, *old.split(".")[1:]) + ".py")]
    assert not left, left
