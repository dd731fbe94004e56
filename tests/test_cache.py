"""The kernel cache across processes, concurrent builds into one cache, and corrupted cache entries.

Every case uses fresh cache directories (TILELANG_CACHE_DIR, TILESCALE_CACHE_DIR) and a fresh TMPDIR
per process. Each process notes every library build of tilelang (``LibraryGenerator.compile_lib``, nvcc) in
``<TMPDIR>.nvcc``, so an absent note means nvcc did not run; its TMPDIR is empty once the build is done (tilescale
removes tilelang's temporaries). The ring kernel has no dynamic shared memory, so tilelang's load step works
without a GPU."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

COMPILE = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "distributed"))
from tilelang.jit.adapter.libgen import LibraryGenerator
_compile_lib = LibraryGenerator.compile_lib

def _noted(self, *a, **k):   # the test's note of an nvcc run (module docstring)
    with open(os.environ["TMPDIR"] + ".nvcc", "a") as f:
        f.write("compile_lib\n")
    return _compile_lib(self, *a, **k)

LibraryGenerator.compile_lib = _noted
import tilescale
from example_ring_put import ring_put_kernel

def entries():
    root = os.environ["TILELANG_CACHE_DIR"]
    return sorted(os.path.join(d, e) for d, subdirs, _ in os.walk(root) if os.path.basename(d) == "kernels"
                  for e in subdirs)

f = ring_put_kernel.get_tir(32, 128, 2)
out = []
for mode in (os.environ.get("MODES") or "auto").split(","):
    t = time.monotonic()
    k = tilescale.compile(f, build_mode=None if mode == "auto" else mode, world_size=2)
    out.append({"mode": k.build_mode, "t": time.monotonic() - t, "entries": len(entries()),
                "source_ok": "\n#include <tilescale/tilescale.cuh>\n" in "\n" + k.get_kernel_source()})
if os.environ.get("CALL_WITHOUT_RUNTIME"):
    try:
        k()
        out.append({"call": "no error"})
    except tilescale.errors.NotInitializedError as e:
        out.append({"call": "NotInitializedError", "msg": str(e)})
print("RESULT " + json.dumps(out))
"""


def _env(tmp: Path, name: str, **extra) -> dict:
    td = tmp / f"tmpdir-{name}"
    td.mkdir()
    e = dict(os.environ)
    e.update({"TILELANG_CACHE_DIR": str(tmp / "tl-cache"), "TILESCALE_CACHE_DIR": str(tmp / "ts-cache"),
              "TMPDIR": str(td), "TILESCALE_WAIT_TIMEOUT_S": "30", "PYTHONPATH": str(REPO_ROOT)})
    for n in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILELANG_DISABLE_CACHE"):
        e.pop(n, None)
    e.update(extra)
    return e


def _start(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=str(REPO_ROOT))


def _result(p: subprocess.Popen, timeout: float = 600):
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-6000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


def _run(code: str, env: dict):
    return _result(_start(code, env))


def _kernel_entries(tmp: Path) -> list[Path]:
    return [e for k in (tmp / "tl-cache").rglob("kernels") if k.is_dir() for e in k.iterdir() if e.is_dir()]


def _cu_files(env: dict) -> list[str]:
    """The library builds (nvcc runs) of the process of `env` (module docstring); none: it hit the cache."""
    note = Path(env["TMPDIR"] + ".nvcc")
    return note.read_text().split() if note.exists() else []


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """Four processes compile one kernel at once into the same fresh caches, the cold cache the other cases
    start from: (cache folder, their environments, their results)."""
    tmp = tmp_path_factory.mktemp("cold")
    envs = [_env(tmp, f"p{i}") for i in range(4)]
    procs = [_start(COMPILE, e) for e in envs]       # all four start from a cold cache
    return tmp, envs, [_result(p)[0] for p in procs]


def _copy_env(e: dict, tmp: Path, name: str, **extra) -> dict:
    """The environment `e` with a fresh TMPDIR and `extra` settings."""
    td = tmp / f"tmpdir-{name}"
    td.mkdir()
    return dict(e, TMPDIR=str(td), **extra)


def _copy_kernel_cache(cold_dir: Path, dst: Path, name: str, **extra) -> dict:
    """A copy of the cold kernel cache in `dst`, and the environment of a process that uses it. The
    tilescale cache stays the cold one: on a GPU-less machine the kernels link against the stub libcuda
    kept there, whose path is part of the flags and so of the kernel's cache key."""
    shutil.copytree(cold_dir / "tl-cache", dst / "tl-cache", symlinks=True)
    e = _env(dst, name, **extra)
    e["TILESCALE_CACHE_DIR"] = str(cold_dir / "ts-cache")
    return e


def test_second_process_hits_the_cache(cold):
    tmp, envs, results = cold
    compiled = [(e, r) for e, r in zip(envs, results, strict=False) if _cu_files(e)]   # nvcc ran: a .cu in its TMPDIR
    assert compiled, "no process compiled the kernel into the cold cache"
    e1, first = compiled[0]
    assert first["entries"] == 1 and first["source_ok"] and first["mode"] == "inlined"

    e2 = _env(tmp, "second", CALL_WITHOUT_RUNTIME="1")
    res = _run(COMPILE, e2)
    second, call = res[0], res[1]
    assert _cu_files(e2) == [], "the second process ran nvcc: no cache hit"
    assert second["entries"] == 1 and second["source_ok"]
    assert second["t"] < 0.4 * first["t"], f"cache hit took {second['t']:.2f} s, cold compile {first['t']:.2f} s"
    # a kernel loaded from the cache still needs the runtime before it runs
    assert call["call"] == "NotInitializedError" and "tilescale.init_distributed()" in call["msg"]


def test_wait_timeout_and_build_mode_are_part_of_the_key(cold, tmp_path):
    e = _copy_kernel_cache(cold[0], tmp_path, "same")  # a cache holding the default build only
    assert len(_kernel_entries(tmp_path)) == 1
    same = _run(COMPILE, e)[0]
    assert same["entries"] == 1 and _cu_files(e) == [], "the same settings did not hit the copied cache"
    res = _run(COMPILE, _copy_env(e, tmp_path, "other", TILESCALE_WAIT_TIMEOUT_S="7", MODES="auto,rdc"))
    timeout_changed, mode_changed = res
    assert timeout_changed["entries"] == 2, "a different TILESCALE_WAIT_TIMEOUT_S reused the old binary"
    assert mode_changed["mode"] == "rdc" and mode_changed["entries"] == 3, "build mode rdc reused the inlined binary"
    assert len(_kernel_entries(tmp_path)) == 3


def test_four_processes_compile_one_kernel_at_once(cold):
    tmp_path, envs, results = cold
    for e in envs:   # the one that built it too: tilelang's tmp*.cu and tmp*.so were removed
        assert list(Path(e["TMPDIR"]).iterdir()) == [], sorted(Path(e["TMPDIR"]).iterdir())
    assert all(r["source_ok"] and r["mode"] == "inlined" for r in results)
    # they took turns (tilescale.compile's lock): one ran nvcc, the other three loaded its cache entry
    compiled = [e["TMPDIR"] for e in envs if _cu_files(e)]
    assert len(compiled) == 1, f"nvcc ran in {len(compiled)} of the 4 processes: {compiled}"
    entries = _kernel_entries(tmp_path)
    assert len(entries) == 1, f"expected one cache entry, found {[e.name for e in entries]}"
    assert (entries[0] / "kernel_lib.so").is_file()
    staging = [p for p in (tmp_path / "tl-cache").rglob(".staging") for p in p.rglob("*") if p.is_file()]
    assert staging == [], f"half-written files left behind: {staging}"

    e5 = _env(tmp_path, "fifth", CALL_WITHOUT_RUNTIME="1")
    fifth, call = _run(COMPILE, e5)
    assert fifth["entries"] == 1 and fifth["source_ok"]
    assert _cu_files(e5) == [], "the fifth process did not load from the cache"
    assert call["call"] == "NotInitializedError"


SHIM = r"""
import json
from tilescale.discovery import find_nvshmem
from tilescale import runtime
print("RESULT " + json.dumps(str(runtime._shim_path(find_nvshmem()))))
"""


@pytest.fixture(scope="module")
def shim_cache(tmp_path_factory):
    """Four processes build the runtime shim at once into one empty TILESCALE_CACHE_DIR (a built cache the
    corruption cases copy): (the cache, the shim path each returned)."""
    tmp = tmp_path_factory.mktemp("shim")
    envs = [_env(tmp, f"s{i}") for i in range(4)]
    for e in envs:
        e["TILESCALE_CACHE_DIR"] = str(tmp / "shim-cache")   # one empty cache for all four
    procs = [_start(SHIM, e) for e in envs]
    return tmp / "shim-cache", [_result(p) for p in procs]


def test_four_processes_build_the_runtime_shim_at_once(shim_cache):
    import ctypes

    from tilescale import runtime
    from tilescale.discovery import clear_cache, find_nvshmem

    cache, paths = shim_cache
    assert len(set(paths)) == 1, paths
    so = Path(paths[0])
    assert so.is_file() and so.is_relative_to(cache)
    leftovers = [p.name for p in cache.rglob("*") if p.is_file()
                 and not p.name.endswith((".so", ".lock", ".so.sha256"))]
    assert leftovers == [], f"temporary files left behind: {leftovers}"
    assert [p.name for p in so.parent.iterdir() if p.suffix == ".so"] == ["libts_runtime.so"]

    clear_cache()
    nv = find_nvshmem()
    runtime.load_host_library(nv)
    lib = ctypes.CDLL(str(so))
    lib.ts_version.restype = ctypes.c_int
    major, minor, patch = nv.version_tuple
    assert lib.ts_version() == major * 10000 + minor * 100 + patch
    for name in ("ts_init_uid", "ts_malloc", "ts_barrier_all_on_stream", "ts_finalize"):
        assert hasattr(lib, name)


def test_build_once_is_atomic_and_single(tmp_path):
    """toolchain.build_once: the builder runs once, a failed build leaves nothing, waiters see the file."""
    from concurrent.futures import ThreadPoolExecutor

    from tilescale.toolchain import build_once

    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        time.sleep(0.3)
        tmp.write_text("done")

    target = tmp_path / "a" / "thing.so"
    target.parent.mkdir()
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda _: build_once(target, build), range(2)))
    assert got == [target, target] and len(calls) == 1 and target.read_text() == "done"

    def failing(tmp: Path) -> None:
        tmp.write_text("partial")
        raise RuntimeError("nvcc exploded")

    bad = tmp_path / "a" / "bad.so"
    with pytest.raises(RuntimeError, match="exploded"):
        build_once(bad, failing)
    assert not bad.exists()
    assert sorted(p.name for p in bad.parent.iterdir()) == ["bad.so.lock", "thing.so", "thing.so.lock",
                                                            "thing.so.sha256"]


# ----------------------------------------------------------------------------- corrupted cache entries


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])


def _scramble(path: Path) -> None:
    """Same size, different bytes in the middle (what a bad disk block or a stray write does)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))


def test_build_once_rebuilds_a_corrupted_artefact(tmp_path, caplog):
    """toolchain.build_once verifies an artefact against the record written after its build: truncated,
    scrambled, recordless (torn) or badly recorded artefacts are rebuilt with a warning; a good one is not."""
    import logging

    from tilescale.toolchain import build_once, record_path, why_invalid

    payload = b"\x7fELF" + bytes(range(256)) * 64
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        tmp.write_bytes(payload)

    target = tmp_path / "lib.so"
    build_once(target, build)
    assert len(calls) == 1 and why_invalid(target) is None
    assert record_path(target).read_text().split()[0] == str(len(payload))
    build_once(target, build)
    assert len(calls) == 1, "a valid artefact was rebuilt"

    cases = [("truncated", _truncate, "truncated"),
             ("scrambled", _scramble, "content differs"),
             ("no record", lambda p: record_path(p).unlink(), "no record"),
             ("garbage record", lambda p: record_path(p).write_text("x\n"), "record"),
             ("record of another build", lambda p: record_path(p).write_text(f"{len(payload)} {'0' * 64}\n"),
              "content differs")]
    for n, (name, corrupt, why) in enumerate(cases, start=2):
        corrupt(target)
        assert why in (why_invalid(target) or ""), f"{name}: not detected: {why_invalid(target)}"
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tilescale"):
            assert build_once(target, build) == target
        assert len(calls) == n, f"{name}: not rebuilt"
        assert target.read_bytes() == payload and why_invalid(target) is None, name
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(str(target) in w and "rebuilding" in w and why in w for w in warnings), (name, warnings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib.so", "lib.so.lock", "lib.so.sha256"]


def test_build_once_rejects_a_build_that_does_not_finish_its_file(tmp_path):
    """A builder that returns without error but leaves no file: an error, and neither a file nor a record
    is published."""
    from tilescale.errors import TileScaleError
    from tilescale.toolchain import build_once

    with pytest.raises((TileScaleError, FileNotFoundError)):
        build_once(tmp_path / "gone.so", lambda tmp: tmp.unlink())
    assert not (tmp_path / "gone.so").exists() and not (tmp_path / "gone.so.sha256").exists()


SHIM_LOAD = r"""
import ctypes, json
from tilescale.discovery import find_nvshmem
from tilescale import runtime
nv = find_nvshmem()
so = runtime._shim_path(nv)
runtime.load_host_library(nv)
lib = ctypes.CDLL(str(so))          # the dynamic loader accepts it
lib.ts_version.restype = ctypes.c_int
print("RESULT " + json.dumps([str(so), lib.ts_version()]))
"""


def _start_and_collect(code: str, env: dict, timeout: float = 600):
    p = _start(code, env)
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-6000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-6000:]
    return json.loads(lines[-1][len("RESULT "):]), out


@pytest.mark.parametrize("corrupt", ["truncated", "scrambled", "no record"])
def test_corrupted_runtime_shim_is_rebuilt_and_loads(shim_cache, tmp_path, corrupt):
    """The host shim in TILESCALE_CACHE_DIR: a corrupted copy is detected by the next process, rebuilt
    (nvcc runs again, a warning names the file and what is wrong) and the rebuilt library loads."""
    from tilescale.discovery import find_nvshmem
    from tilescale.toolchain import record_path, why_invalid

    cache, paths = shim_cache
    shutil.copytree(cache, tmp_path / "ts-cache", symlinks=True)   # each case corrupts a copy of the built cache
    so = tmp_path / "ts-cache" / Path(paths[0]).relative_to(cache)
    assert why_invalid(so) is None
    built = so.read_bytes()
    major, minor, patch = find_nvshmem().version_tuple
    version = major * 10000 + minor * 100 + patch
    {"truncated": _truncate, "scrambled": _scramble, "no record": lambda p: record_path(p).unlink()}[corrupt](so)
    mtime = so.stat().st_mtime_ns

    (so2, version2), out = _start_and_collect(SHIM_LOAD, _env(tmp_path, "again"))
    assert Path(so2) == so and version2 == version
    assert f"cached {so} is invalid" in out and "rebuilding it" in out, out[-3000:]
    assert why_invalid(so) is None
    assert so.stat().st_mtime_ns != mtime and len(so.read_bytes()) == len(built)

    (_, _), out3 = _start_and_collect(SHIM_LOAD, _env(tmp_path, "third"))
    assert "is invalid" not in out3, "a valid shim was rebuilt"


def _entry_files(tmp: Path) -> dict:
    [entry] = _kernel_entries(tmp)
    return {p.name: p for p in entry.iterdir() if p.is_file()}


def _manifest_ok(entry: dict) -> bool:
    """The entry's files match tilelang's manifest (sizes and SHA-256)."""
    import hashlib

    files = json.loads(entry["manifest.json"].read_text())["files"]
    return all(entry[n].stat().st_size == m["size"] and hashlib.sha256(entry[n].read_bytes()).hexdigest() == m["sha256"]
               for n, m in files.items()) and "kernel_lib.so" in files


def _garbage_with_matching_manifest(entry: dict) -> None:
    """A kernel_lib.so that is not a library although the manifest agrees with it (both rewritten)."""
    import hashlib

    so = entry["kernel_lib.so"]
    junk = bytes(so.stat().st_size)
    so.write_bytes(junk)
    m = json.loads(entry["manifest.json"].read_text())
    m["files"]["kernel_lib.so"]["sha256"] = hashlib.sha256(junk).hexdigest()
    entry["manifest.json"].write_text(json.dumps(m))


@pytest.mark.parametrize("corrupt,log_line", [
    ("truncated", "failed integrity verification"),
    ("torn entry", None),                                   # no manifest: an entry whose writer died
    ("garbage with matching manifest", "invalid ELF header"),
])
def test_corrupted_kernel_cache_entry_is_rebuilt(cold, tmp_path, corrupt, log_line):
    """A distributed kernel's entry in the kernel cache (tilelang's, which tilescale.compile uses): a
    corrupted entry is detected by the next process, recompiled by nvcc, replaced by a valid entry, and
    the kernel loads from it (its call reaches tilescale's runtime check)."""
    e = _copy_kernel_cache(cold[0], tmp_path, "after", CALL_WITHOUT_RUNTIME="1")
    entry = _entry_files(tmp_path)
    assert _manifest_ok(entry)
    if corrupt == "truncated":
        _truncate(entry["kernel_lib.so"])
    elif corrupt == "torn entry":
        entry["manifest.json"].unlink()
    else:
        _garbage_with_matching_manifest(entry)

    (res, call), out = _start_and_collect(COMPILE, e)
    assert res["entries"] == 1 and res["source_ok"], "the key changed: not a rebuild of the corrupted entry"
    assert _cu_files(e), f"{corrupt}: the corrupted entry was used instead of recompiling\n{out[-3000:]}"
    if log_line:
        assert log_line in out, out[-3000:]
    entry = _entry_files(tmp_path)
    assert _manifest_ok(entry), f"{corrupt}: the rebuilt entry does not match its manifest"
    assert entry["kernel_lib.so"].read_bytes()[:4] == b"\x7fELF"
    assert call["call"] == "NotInitializedError", call   # loaded: the wrapper ran up to the runtime check

    e2 = _copy_env(e, tmp_path, "after2", CALL_WITHOUT_RUNTIME="")
    _run(COMPILE, e2)
    assert _cu_files(e2) == [], "the rebuilt entry was not used by the next process"
