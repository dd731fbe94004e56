"""The kernel cache across processes, and concurrent builds into one cache.

Every case uses fresh cache directories (TILELANG_CACHE_DIR, TILESCALE_CACHE_DIR) and a fresh TMPDIR
per process: tilelang writes the .cu it hands to nvcc there, so an empty TMPDIR means nvcc did not run.
The ring kernel has no dynamic shared memory, so tilelang's load step works without a GPU."""
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
                "source_ok": k.get_kernel_source().startswith("#include <tilescale/tilescale.cuh>")})
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
    return sorted(p.name for p in Path(env["TMPDIR"]).rglob("*.cu"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """One cold compile into fresh caches: (cache folder, its environment, result)."""
    tmp = tmp_path_factory.mktemp("cold")
    e = _env(tmp, "first")
    return tmp, e, _run(COMPILE, e)[0]


def _copy_caches(src: Path, dst: Path) -> None:
    for name in ("tl-cache", "ts-cache"):
        shutil.copytree(src / name, dst / name, symlinks=True)


def test_second_process_hits_the_cache(cold):
    tmp, e1, first = cold
    assert first["entries"] == 1 and first["source_ok"] and first["mode"] == "inlined"
    assert _cu_files(e1), "the first process should have run nvcc (a .cu in its TMPDIR)"

    e2 = _env(tmp, "second", CALL_WITHOUT_RUNTIME="1")
    res = _run(COMPILE, e2)
    second, call = res[0], res[1]
    assert _cu_files(e2) == [], "the second process ran nvcc: no cache hit"
    assert second["entries"] == 1 and second["source_ok"]
    assert second["t"] < 0.4 * first["t"], f"cache hit took {second['t']:.2f} s, cold compile {first['t']:.2f} s"
    # a kernel loaded from the cache still needs the runtime before it runs
    assert call["call"] == "NotInitializedError" and "tilescale.init_distributed()" in call["msg"]


def test_wait_timeout_and_build_mode_are_part_of_the_key(cold, tmp_path):
    _copy_caches(cold[0], tmp_path)  # a cache holding the default build only
    assert len(_kernel_entries(tmp_path)) == 1
    res = _run(COMPILE, _env(tmp_path, "other", TILESCALE_WAIT_TIMEOUT_S="7", MODES="auto,rdc"))
    timeout_changed, mode_changed = res
    assert timeout_changed["entries"] == 2, "a different TILESCALE_WAIT_TIMEOUT_S reused the old binary"
    assert mode_changed["mode"] == "rdc" and mode_changed["entries"] == 3, "build mode rdc reused the inlined binary"
    assert len(_kernel_entries(tmp_path)) == 3


def test_four_processes_compile_one_kernel_at_once(tmp_path):
    envs = [_env(tmp_path, f"p{i}") for i in range(4)]
    procs = [_start(COMPILE, e) for e in envs]       # all four start from a cold cache
    results = [_result(p)[0] for p in procs]
    assert all(r["source_ok"] and r["mode"] == "inlined" for r in results)
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


def test_four_processes_build_the_runtime_shim_at_once(tmp_path):
    import ctypes

    from tilescale import runtime
    from tilescale.discovery import clear_cache, find_nvshmem

    envs = [_env(tmp_path, f"s{i}") for i in range(4)]
    for e in envs:
        e["TILESCALE_CACHE_DIR"] = str(tmp_path / "shim-cache")   # one empty cache for all four
    procs = [_start(SHIM, e) for e in envs]
    paths = [_result(p) for p in procs]
    assert len(set(paths)) == 1, paths
    so = Path(paths[0])
    assert so.is_file() and so.is_relative_to(tmp_path / "shim-cache")
    leftovers = [p.name for p in (tmp_path / "shim-cache").rglob("*") if p.is_file()
                 and not (p.name.endswith(".so") or p.name.endswith(".lock"))]
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
    assert sorted(p.name for p in bad.parent.iterdir()) == ["bad.so.lock", "thing.so", "thing.so.lock"]
