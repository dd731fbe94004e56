"""cache_files.write_once (importable from tilescale.toolchain too), the one writer of tilescale's caches
(build_once's libraries and the plan files): lock, re-check, temporary file beside the target, fsync, record,
rename."""
from __future__ import annotations

import concurrent.futures as cf
import os
import stat
import threading
from pathlib import Path

import pytest

from tilescale import cache_files, toolchain
from tilescale.cache_files import UnsafeCacheDirError, record_path, why_invalid, write_once
from tilescale.errors import TileScaleError


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_bytes_with_a_record(tmp_path):
    target = tmp_path / "cache" / "blob.bin"
    assert write_once(target, b"payload") is True
    assert target.read_bytes() == b"payload" and _mode(target) == 0o600 and _mode(target.parent) == 0o700
    assert record_path(target).read_text().split()[0] == "7" and why_invalid(target) is None
    assert write_once(target, b"other") is False                      # valid: left alone
    assert target.read_bytes() == b"payload"
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob.bin", "blob.bin.lock", "blob.bin.sha256"]


def test_a_builder_makes_a_library(tmp_path):
    target = tmp_path / "lib.so"
    write_once(target, lambda tmp: tmp.write_bytes(b"\x7fELF"))
    assert target.read_bytes() == b"\x7fELF" and _mode(target) == 0o700


def test_own_check_and_no_record(tmp_path):
    target = tmp_path / "plan.json"
    check = lambda p: None if p.exists() and p.read_bytes() == b"{}" else ("missing" if not p.exists() else "differs")  # noqa: E731
    told = []
    assert write_once(target, b"{}", check=check, record=False, on_rewrite=told.append)
    assert not record_path(target).exists() and told == []            # a missing file is not a rewrite
    target.write_bytes(b"{broken")
    assert write_once(target, b"{}", check=check, record=False, on_rewrite=told.append)
    assert target.read_bytes() == b"{}" and told == ["differs"]
    ino = target.stat().st_ino
    assert write_once(target, b"{}", check=check, record=False, rewrite_because="asked", on_rewrite=told.append)
    assert target.stat().st_ino != ino and told[-1] == "asked"        # renamed into place, not rewritten in place


def test_concurrent_writers_write_once(tmp_path):
    target = tmp_path / "lib.so"
    calls = []
    gate = threading.Barrier(4)

    def build(tmp: Path) -> None:
        calls.append(1)
        tmp.write_bytes(b"x" * 1000)

    def one(_):
        gate.wait()
        return write_once(target, build)

    with cf.ThreadPoolExecutor(4) as ex:
        wrote = list(ex.map(one, range(4)))
    assert len(calls) == 1 and sorted(wrote) == [False, False, False, True]


def test_a_write_that_does_not_pass_its_check_fails_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "x.json"
    with pytest.raises(TileScaleError, match="did not give a valid file: never valid"):
        write_once(target, b"1", check=lambda p: "never valid", record=False)
    with pytest.raises(RuntimeError, match="builder broke"):
        write_once(tmp_path / "y.so", lambda tmp: (_ for _ in ()).throw(RuntimeError("builder broke")))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".tmp.sha256"))]
    assert not (tmp_path / "y.so").exists()


def test_refuses_a_directory_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeCacheDirError, match="writable by"):
        write_once(shared / "f", b"1")


def test_build_once_and_the_plan_cache_use_it(monkeypatch, tmp_path):
    seen = []
    real = cache_files.write_once

    def spy(target, content, **kw):
        seen.append(Path(target).name)
        return real(target, content, **kw)

    monkeypatch.setattr(cache_files, "write_once", spy)
    toolchain.build_once(tmp_path / "a.so", lambda tmp: tmp.write_bytes(b"a"))
    from tilescale.plan import cache
    from tilescale.plan.plan import hash_id

    monkeypatch.setenv("TILESCALE_PLAN_DIR", str(tmp_path / "plans"))
    inputs = {"name": "test"}
    rec = {"collective": "all_reduce", "id": hash_id(inputs), "inputs": inputs, "schema_version": 1}
    path = cache.store(rec, rebuild=True)
    assert seen == ["a.so", path.name] and cache.why_invalid(path, rec) is None
    assert toolchain.write_once is real and toolchain.build_once is cache_files.build_once   # (importable there)
