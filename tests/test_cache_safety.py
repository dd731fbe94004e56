"""Cache safety and build hygiene (CPU only): private cache directories (0700, owner and mode checked, a
planted library refused), what the kernel cache key holds, paths with whitespace, the nvcc timeout,
compile-only builds through the cache leaving nothing in TMPDIR, the prebuild wait, and the symmetric
check forgetting freed allocations."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FOREIGN_UID = 12345


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Fresh tilescale and tilelang cache roots (not created yet)."""
    ts, tl = tmp_path / "ts-cache", tmp_path / "tl-cache"
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(ts))
    monkeypatch.delenv("TILESCALE_PLAN_DIR", raising=False)
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tl))
    return ts, tl


def _env(tmp: Path, **extra) -> dict:
    td = tmp / "tmpdir"
    td.mkdir(exist_ok=True)
    e = dict(os.environ)
    e.update({"TILESCALE_CACHE_DIR": str(tmp / "ts-cache"), "TILELANG_CACHE_DIR": str(tmp / "tl-cache"),
              "TMPDIR": str(td), "PYTHONPATH": str(REPO_ROOT), "TILESCALE_WAIT_TIMEOUT_S": "30"})
    for n in ("NVSHMEM_HOME", "TILESCALE_BUILD_MODE", "TILESCALE_PLAN_DIR", "TILESCALE_NVCC_TIMEOUT_S"):
        e.pop(n, None)
    e.update(extra)
    return e


def _py(code: str, env: dict, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, cwd=str(REPO_ROOT), timeout=timeout)
    return r, time.monotonic() - t0


def _result(r: subprocess.CompletedProcess):
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, r.stdout[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


# ----------------------------------------------------------------------------- private cache directories


def test_cache_directories_are_created_0700(caches):
    from tilescale.toolchain import build_once, file_lock, private_dir, record_path

    ts, _ = caches
    d = private_dir(ts / "runtime" / "tag")
    assert d == ts / "runtime" / "tag"
    assert [_mode(p) for p in (ts, ts / "runtime", d)] == [0o700] * 3
    with file_lock(ts / "plans" / "x.lock"):
        pass
    assert _mode(ts / "plans") == 0o700 and _mode(ts / "plans" / "x.lock") == 0o600

    lib = build_once(ts / "stubs" / "lib.so", lambda tmp: tmp.write_bytes(b"\x7fELF" + bytes(64)))
    assert _mode(ts / "stubs") == 0o700 and _mode(lib) == 0o700 and _mode(record_path(lib)) == 0o600
    assert _mode(lib.with_name("lib.so.lock")) == 0o600


@pytest.mark.parametrize("where", ["root", "subdirectory"])
@pytest.mark.parametrize("mode,who", [(0o775, "its group"), (0o757, "all users"), (0o777, "its group and all users")])
def test_cache_directory_writable_by_others_is_refused(caches, where, mode, who):
    from tilescale.toolchain import UnsafeCacheDirError, build_once, private_dir

    ts, _ = caches
    private_dir(ts / "runtime")
    bad = ts if where == "root" else ts / "runtime"
    os.chmod(bad, mode)
    calls = []
    with pytest.raises(UnsafeCacheDirError) as e:
        build_once(ts / "runtime" / "t" / "libts_runtime.so", lambda tmp: calls.append(tmp))
    msg = str(e.value)
    assert f"refusing to use the cache directory {bad}:" in msg and f"writable by {who}" in msg, msg
    assert f"chmod 700 {bad}" in msg and "TILESCALE_CACHE_DIR" in msg, msg
    assert calls == [] and not (ts / "runtime" / "t").exists(), "wrote into a directory it refused"
    os.chmod(bad, 0o755)   # not writable by others: accepted (readable is no threat to what is loaded)
    private_dir(ts / "runtime")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_cache_directory_of_another_user_is_refused(caches):
    from tilescale.toolchain import UnsafeCacheDirError, private_dir

    ts, tl = caches
    private_dir(ts / "runtime")
    os.chown(ts / "runtime", FOREIGN_UID, -1)
    with pytest.raises(UnsafeCacheDirError, match=rf"{ts / 'runtime'}: it is owned by uid {FOREIGN_UID}.*not by the "
                                                  r"current user.*TILESCALE_CACHE_DIR"):
        private_dir(ts / "runtime" / "x")
    tl.mkdir(mode=0o700)
    os.chown(tl, FOREIGN_UID, -1)
    from tilescale.kernel_build import private_tilelang_cache

    with pytest.raises(UnsafeCacheDirError, match=rf"{tl}: it is owned by uid {FOREIGN_UID}.*TILELANG_CACHE_DIR"):
        private_tilelang_cache()


def test_tilelang_cache_is_made_private_and_checked(caches):
    from tilelang.cache.kernel_cache import KernelCache

    from tilescale.kernel_build import private_tilelang_cache
    from tilescale.toolchain import UnsafeCacheDirError

    _, tl = caches
    private_tilelang_cache()
    kernels, staging = Path(KernelCache._get_cache_root()), Path(KernelCache._get_staging_root())
    assert kernels.is_relative_to(tl) and staging.is_relative_to(tl)
    for d in (tl, kernels, staging, kernels.parent):
        assert _mode(d) == 0o700, d
    os.chmod(kernels, 0o777)
    with pytest.raises(UnsafeCacheDirError, match=rf"{kernels}: it is writable by .*TILELANG_CACHE_DIR"):
        private_tilelang_cache()


def test_writable_cached_file_is_refused(caches):
    from tilescale.toolchain import UnsafeCacheDirError, build_once

    ts, _ = caches
    target = ts / "stubs" / "libcuda.so"
    build_once(target, lambda tmp: tmp.write_bytes(b"x" * 10))
    os.chmod(target, 0o666)
    with pytest.raises(UnsafeCacheDirError, match=rf"refusing to load {target}: it is writable by others"):
        build_once(target, lambda tmp: tmp.write_bytes(b"x" * 10))


PLANT = r"""
import json, os, shutil, subprocess, sys
from pathlib import Path
from tilescale import cache_files, runtime, toolchain
from tilescale.discovery import find_nvshmem

def fake_nvcc(args, what):           # the "legitimate" shim: an empty library (no nvcc needed)
    out = args[args.index("-o") + 1]
    subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "-", "-o", out], input=b"", check=True)

toolchain.run_nvcc = fake_nvcc
nv = find_nvshmem()
so = runtime._shim_path(nv)
# the attacker: a library whose constructor runs at load, put in place with a matching record
src = Path(os.environ["WORK"]) / "evil.c"
src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {'
               ' FILE *f = fopen("' + os.environ["MARKER"] + '", "w"); if (f) { fputs("ran", f); fclose(f); } }\n')
evil = Path(os.environ["WORK"]) / "evil.so"
subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(evil)], check=True)
mode = os.environ["ATTACK"]
if mode == "group-writable":
    os.chmod(so.parent, 0o777)
elif mode == "foreign-owner":
    os.chown(so.parent, int(os.environ["FOREIGN_UID"]), -1)
shutil.copyfile(evil, so)
toolchain.record_path(so).write_text(f"{so.stat().st_size} {cache_files._sha256(so)}\n")
assert toolchain.why_invalid(so) is None        # the record alone does not catch it
try:
    runtime.load_shim(nv)
    out = {"error": None}
except Exception as e:
    out = {"error": type(e).__name__, "msg": str(e)}
out["dir"] = str(so.parent)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("attack", ["group-writable", "foreign-owner", "none (control)"])
def test_planted_runtime_shim_is_refused(tmp_path, attack):
    """The reviewer's scenario: the cached libts_runtime.so replaced and its .sha256 rewritten by someone who
    can write the directory. The load is refused before dlopen (the planted constructor never runs). The
    control (directory private, i.e. only this user could have planted it) shows the scenario is real:
    there the library is loaded and its constructor runs."""
    if attack == "foreign-owner" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    marker = tmp_path / "constructor-ran"
    r, _ = _py(PLANT, _env(tmp_path, WORK=str(tmp_path), MARKER=str(marker), ATTACK=attack,
                           FOREIGN_UID=str(FOREIGN_UID)), timeout=300)
    assert r.returncode == 0, r.stdout[-6000:]
    res = _result(r)
    if attack == "none (control)":
        assert marker.exists(), "control: the planted library was not loaded; the test does not reach dlopen"
        return
    assert not marker.exists(), "the planted library's constructor ran"
    assert res["error"] == "UnsafeCacheDirError", res
    assert f"refusing to use the cache directory {res['dir']}" in res["msg"], res
    assert ("writable by" in res["msg"]) if attack == "group-writable" else (f"uid {FOREIGN_UID}" in res["msg"])


# ----------------------------------------------------------------------------- the kernel cache key


def test_key_flags_follow_nvcc_codegen_and_headers(tmp_path, monkeypatch):
    import shutil

    from tilescale import compiler, toolchain

    base = compiler.key_flags()
    assert any(f.startswith("-DTILESCALE_NVCC=") for f in base) and any(f.startswith("-DTILESCALE_SRC=") for f in base)

    real = toolchain._nvcc_version_output
    monkeypatch.setattr(toolchain, "_nvcc_version_output",
                        lambda p: real(p).replace("V13.", "V99.").replace("V12.", "V98.") + "x")
    other_nvcc = compiler.key_flags()
    assert other_nvcc[0] != base[0] and other_nvcc[1] == base[1]
    monkeypatch.setattr(toolchain, "_nvcc_version_output", lambda p: real(p) + "\nBuild cuda_other")
    assert compiler.key_flags()[0] != base[0], "a different nvcc build with the same release: same key"
    monkeypatch.setattr(toolchain, "_nvcc_version_output", real)

    pkg = tmp_path / "pkg"
    (pkg / "include").mkdir(parents=True)
    (pkg / "compilation").mkdir()
    shutil.copy(toolchain._PKG / "compilation" / "codegen.py", pkg / "compilation" / "codegen.py")
    shutil.copytree(toolchain._PKG / "include", pkg / "include", dirs_exist_ok=True)
    monkeypatch.setattr(toolchain, "_PKG", pkg)
    assert compiler.key_flags() == base, "a copy of the same sources gave another key"
    digests = {base[1]}
    (pkg / "compilation" / "codegen.py").write_text((pkg / "compilation" / "codegen.py").read_text() + "\n# changed\n")
    digests.add(compiler.key_flags()[1])
    hdr = pkg / "include" / "tilescale" / "ops.cuh"
    hdr.write_text(hdr.read_text() + "\n// changed\n")
    digests.add(compiler.key_flags()[1])
    (pkg / "include" / "tilescale" / "detail").mkdir()
    (pkg / "include" / "tilescale" / "detail" / "new.cuh").write_text("// a nested header\n")
    digests.add(compiler.key_flags()[1])
    assert len(digests) == 4, "codegen.py, a header or a nested header changed without changing the key"


def test_compile_flags_are_in_tilelangs_key():
    """tilescale's key flags reach the key through tilelang's compile_flags: check tilelang still hashes them."""
    from tilelang.cache.kernel_cache import KernelCache

    kc = object.__new__(KernelCache)   # no singleton, no cache directories
    fn = SimpleNamespace(script=lambda show_meta=True: "# the same IR")
    keys = {kc._generate_key(fn, out_idx=None, execution_backend="cython", args=(), target="cuda",
                             compile_flags=["-DTILESCALE_NVCC=" + v]) for v in ("13.0.88-a", "13.0.88-b")}
    assert len(keys) == 2


def test_distributed_flags_hold_the_key_flags(clean_ts_env):
    from tilescale.backend import BackendSpec
    from tilescale.kernel_build import key_flags, prepare_distributed

    for mode in ("inlined", "rdc"):
        flags = prepare_distributed(None, BackendSpec("cython", True, mode, "test"), ["-DUSER"], 7.0)
        assert flags[0] == "-DUSER" and set(key_flags()) <= set(flags)
        assert any(f.startswith("-DTILESCALE_NVSHMEM=") for f in flags)
        assert any(f.startswith("-DTILESCALE_HDR=") for f in flags)
        assert "-DTILESCALE_WAIT_TIMEOUT_NS=7000000000ull" in flags
        assert ("-rdc=true" in flags) == (mode == "rdc")


# ----------------------------------------------------------------------------- paths with whitespace


def test_nvshmem_home_with_a_space_is_refused_clearly(tmp_path, clean_ts_env):
    from tilescale.backend import BackendSpec
    from tilescale.discovery import clear_cache, find_nvshmem
    from tilescale.errors import TileScaleError
    from tilescale.kernel_build import prepare_distributed

    root = Path(find_nvshmem().root)
    spaced = tmp_path / "my nvshmem"
    spaced.symlink_to(root, target_is_directory=True)
    clean_ts_env.setenv("NVSHMEM_HOME", str(spaced))
    clear_cache()
    assert str(find_nvshmem().root).startswith(str(spaced))
    with pytest.raises(TileScaleError) as e:
        prepare_distributed(None, BackendSpec("cython", True, "inlined", "test"), None, None)
    msg = str(e.value)
    assert "my nvshmem" in msg and "whitespace" in msg and "NVSHMEM_HOME" in msg, msg


def test_run_nvcc_passes_a_path_with_spaces_as_one_argument(tmp_path, monkeypatch):
    from tilescale import toolchain

    fake = tmp_path / "nvcc"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: str(fake))
    monkeypatch.setenv("ARGS_OUT", str(tmp_path / "args"))
    inc = tmp_path / "dir with spaces" / "include"
    toolchain.run_nvcc([f"-I{inc}", "-o", str(tmp_path / "out lib.so")], "a test")
    assert (tmp_path / "args").read_text().splitlines() == [f"-I{inc}", "-o", str(tmp_path / "out lib.so")]


# ----------------------------------------------------------------------------- the nvcc timeout

SLOW_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then exec "{real}" --version; fi
echo $$ >> "{pids}"
sleep 300 &
echo $! >> "{pids}"
wait
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _slow_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    pids = tmp_path / "pids"
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text(SLOW_NVCC.format(real=shutil.which("nvcc"), pids=pids))
    fake.chmod(0o755)
    return fake, pids


def test_run_nvcc_times_out_and_kills_nvcc_and_its_children(tmp_path, monkeypatch):
    from tilescale import toolchain

    fake, pids = _slow_nvcc(tmp_path)
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: str(fake))
    monkeypatch.setenv("TILESCALE_NVCC_TIMEOUT_S", "1")
    t0 = time.monotonic()
    with pytest.raises(toolchain.NvccTimeoutError) as e:
        toolchain.run_nvcc(["shim.cu", "-o", "x.so"], "the tilescale runtime shim")
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert "the tilescale runtime shim (shim.cu) within 1 s" in msg and "TILESCALE_NVCC_TIMEOUT_S" in msg, msg
    ids = [int(x) for x in pids.read_text().split()]
    assert len(ids) == 2
    time.sleep(0.2)
    assert not any(_alive(p) for p in ids), "nvcc or its child survived the timeout"


BUILD_SLOW = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "distributed"))
import tilescale
from example_ring_put import ring_put_kernel
out = {}
for how in ("build", "compile"):
    try:
        f = ring_put_kernel.get_tir(32, 128, 2)
        (tilescale.build if how == "build" else tilescale.compile)(f)
        out[how] = None
    except Exception as e:
        out[how] = [type(e).__name__, str(e)]
    if how == "build":
        out["tmpdir_after_build"] = sorted(os.listdir(os.environ["TMPDIR"]))
print("RESULT " + json.dumps(out))
"""


def test_kernel_builds_time_out(tmp_path):
    """tilelang's own nvcc runs (tilescale.build and tilescale.compile of a distributed kernel) are bounded
    too; the error names the kernel and the file; nothing is left running or in TMPDIR."""
    fake, pids = _slow_nvcc(tmp_path)
    e = _env(tmp_path, CUDA_HOME=str(fake.parent.parent), TILESCALE_NVCC_TIMEOUT_S="2")
    r, dt = _py(BUILD_SLOW, e, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:]
    res = _result(r)
    for how in ("build", "compile"):
        assert res[how] is not None and res[how][0] == "NvccTimeoutError", (how, res[how], r.stdout[-3000:])
        assert "kernel '" in res[how][1]
        assert ".cu) within 2 s" in res[how][1] and "TILESCALE_NVCC_TIMEOUT_S" in res[how][1], res[how]
    time.sleep(0.2)
    assert not any(_alive(int(p)) for p in pids.read_text().split())
    assert res["tmpdir_after_build"] == [], res["tmpdir_after_build"]
    assert list(Path(e["TMPDIR"]).iterdir()) == [], sorted(Path(e["TMPDIR"]).iterdir())   # the JIT build's too


# ----------------------------------------------------------------------------- the JIT build's temporaries
JIT_BUILD = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "distributed"))
import tilescale
from example_ring_put import ring_put_kernel
out = {}
k = tilescale.compile(ring_put_kernel.get_tir(32, 128, 2))
out["built"] = "\n#include <tilescale/tilescale.cuh>\n" in "\n" + k.get_kernel_source()   # after a #define or none
out["after_build"] = sorted(os.listdir(os.environ["TMPDIR"]))
try:
    tilescale.compile(ring_put_kernel.get_tir(32, 256, 2), compile_flags=["--no-such-nvcc-option"])
    out["failed"] = None
except Exception as e:
    out["failed"] = type(e).__name__
out["after_failure"] = sorted(os.listdir(os.environ["TMPDIR"]))
print("RESULT " + json.dumps(out))
"""


def test_jit_builds_of_distributed_kernels_leave_nothing_in_tmpdir(tmp_path):
    """tilescale.compile of a distributed kernel (tilelang's JIT, then its cache): the tmp*.cu source and the tmp*.so
    library (over a megabyte) that tilelang's build writes to TMPDIR are removed once the library is loaded, and
    after a build that nvcc refused."""
    e = _env(tmp_path)
    r, _ = _py(JIT_BUILD, e)
    assert r.returncode == 0, r.stdout[-6000:]
    res = _result(r)
    assert res["built"], res
    assert res["after_build"] == [], f"the build left {res['after_build']} in TMPDIR"
    assert res["failed"] == "BuildError", (res, r.stdout[-3000:])
    assert res["after_failure"] == [], f"the failed build left {res['after_failure']} in TMPDIR"


# ----------------------------------------------------------------------------- compile-only builds

BUILD = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "distributed"))
import tilescale
from example_ring_put import ring_put_kernel
t = time.monotonic()
r = ring_put_kernel.build(32, 128, 2)
print("RESULT " + json.dumps({"lib": r.library, "t": time.monotonic() - t, "src": r.source[:80],
                              "mtime": os.stat(r.library).st_mtime_ns}))
"""


def test_compile_only_builds_are_cached_and_leave_nothing_in_tmpdir(tmp_path):
    e = _env(tmp_path)
    r1, _ = _py(BUILD, e)
    assert r1.returncode == 0, r1.stdout[-6000:]
    first = _result(r1)
    lib = Path(first["lib"])
    assert lib.is_relative_to(tmp_path / "ts-cache" / "kernels"), lib
    assert "\n#include <tilescale/tilescale.cuh>\n" in "\n" + first["src"]   # after a #define or none
    assert lib.with_suffix(".cu").is_file(), "the library source is not kept beside the library"
    assert _mode(lib) == 0o700 and _mode(lib.parent) == 0o700
    assert list(Path(e["TMPDIR"]).iterdir()) == [], "the build left files in TMPDIR"

    r2, _ = _py(BUILD, e)
    assert r2.returncode == 0, r2.stdout[-6000:]
    second = _result(r2)
    assert second["lib"] == first["lib"] and second["mtime"] == first["mtime"], "rebuilt instead of reused"
    assert second["src"] == first["src"]
    assert second["t"] < 0.5 * first["t"], (second["t"], first["t"])
    assert list(Path(e["TMPDIR"]).iterdir()) == []


# ----------------------------------------------------------------------------- prebuild's wait

PREBUILD = r"""
import json, os, sys, time
from types import SimpleNamespace
import torch.distributed as dist
from tilescale import runtime
from tilescale.ops import prebuild
rank, mode = int(sys.argv[1]), os.environ["MODE"]
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2)
info = SimpleNamespace(rank=rank, local_rank=rank, world_size=2, local_world_size=2)
runtime._RT = SimpleNamespace(info=info, closed=False, ctrl_group=dist.group.WORLD)

def compile_all(jobs, workers=None):
    if mode == "fail":
        raise RuntimeError("nvcc could not build kernel 'x' (test)")
    if mode == "slow":
        time.sleep(8)

prebuild.compile_all = compile_all
t = time.monotonic()
try:
    prebuild.on_local_rank0([(compile_all, (1,))], timeout_s=2 if mode == "slow" else None)
    out = {"error": None}
except Exception as e:
    out = {"error": type(e).__name__, "msg": str(e)}
out["t"] = time.monotonic() - t
print("RESULT " + json.dumps(out), flush=True)
runtime._RT = None
"""


@pytest.mark.parametrize("mode", ["ok", "fail", "slow"])
def test_prebuild_wait_is_bounded_and_reports_rank0_failure(tmp_path, mode):
    e = _env(tmp_path, MODE=mode, STORE=str(tmp_path / "store"))
    procs = [subprocess.Popen([sys.executable, "-c", PREBUILD, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=e, cwd=str(REPO_ROOT)) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    r0, r1 = (_result(SimpleNamespace(stdout=o)) for o in outs)
    if mode == "ok":
        assert r0["error"] is None and r1["error"] is None, outs
    elif mode == "fail":
        assert r0["error"] == "RuntimeError"
        assert r1["error"] == "TileScaleError" and r1["t"] < 30, r1
        assert "local rank 0 (rank 0) failed" in r1["msg"] and "nvcc could not build kernel 'x'" in r1["msg"], r1
    else:
        assert r0["error"] is None
        assert r1["error"] == "TileScaleError" and 1.5 < r1["t"] < 7, r1
        assert "bound 2 s" in r1["msg"] and "did not report" in r1["msg"], r1


def test_prebuild_wait_bound_follows_the_nvcc_timeout(monkeypatch):
    from tilescale.ops.prebuild import wait_bound_s

    monkeypatch.setenv("TILESCALE_NVCC_TIMEOUT_S", "100")
    assert wait_bound_s(5) == 100 * 5 + 600
    monkeypatch.setenv("TILESCALE_NVCC_TIMEOUT_S", "0")
    assert wait_bound_s(5) >= 24 * 3600


# ----------------------------------------------------------------------------- the symmetric check


class _FakeTensor:
    is_cuda = True
    dtype = "uint8"
    device = "cuda:0"

    def __init__(self, ptr: int, n: int):
        self.ptr, self.n, self.shape = ptr, n, (n,)

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.n

    def element_size(self):
        return 1


def test_symmetric_check_forgets_freed_allocations(monkeypatch):
    import torch

    from tilescale import runtime, symm
    from tilescale.backend import BackendSpec
    from tilescale.compiler import DistributedKernel
    from tilescale.errors import NotSymmetricError

    freed = []
    rt = SimpleNamespace(closed=False, agree=lambda what, v: None,
                         shim=SimpleNamespace(ts_free=lambda p: freed.append(p)))
    monkeypatch.setattr(runtime, "_RT", rt)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    reg = symm._registry(rt)
    a = symm.Allocation(base=0x10000, nbytes=4096, shape=(4096,), dtype="uint8", seq=0, where="test")
    reg.add(a)

    k = DistributedKernel(None, BackendSpec("cython", True, "inlined", "test"), "k", ["x", "n"], ["x"], None, True)
    t = _FakeTensor(0x10000, 4096)
    k.check_args((t, 1))
    k.check_args((t, 1))                                   # cached
    with pytest.raises(NotSymmetricError):                 # same pointer, more bytes than the allocation
        k.check_args((_FakeTensor(0x10000, 8192), 1))

    symm.free(t)
    assert freed == [0x10000]
    with pytest.raises(NotSymmetricError, match=r"k\(x=...\)"):
        k.check_args((t, 1))

    b = symm.Allocation(base=0x10000, nbytes=4096, shape=(4096,), dtype="uint8", seq=1, where="test")
    reg.add(b)                                             # a new allocation at the same address is accepted
    k.check_args((t, 1))


def test_bounded_nvcc_leaves_tilelang_unpatched():
    """The nvcc bound watches processes; it replaces nothing of tilelang's (tilescale never patches it)."""
    import subprocess as real

    from tilelang.jit.adapter import libgen

    from tilescale import toolchain

    with toolchain.bounded_nvcc("nothing"):
        assert libgen.subprocess is real
    assert libgen.subprocess is real


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o1777, False), (0o755, False)])
def test_directories_above_a_cache_root_are_checked(caches, tmp_path, mode, refused):
    """Whoever can write a directory above the cache can rename the cache away and put their own in its place
    between a check and a load: refused when it is writable by all users without the sticky bit (a sticky /tmp-like
    directory protects what is ours in it)."""
    from tilescale.cache_files import UnsafeCacheDirError, private_dir

    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(mode)
    root = parent / "cache"
    if refused:
        with pytest.raises(UnsafeCacheDirError, match=rf"the directory {parent} above it is writable by all users "
                                                      r"without the sticky bit \(mode 0777\)"):
            private_dir(root / "runtime", root=root)
        assert not root.exists(), "created below an unsafe parent"
    else:
        assert private_dir(root / "runtime", root=root) == root / "runtime"


def test_a_directory_above_a_cache_root_owned_by_another_user_is_refused(caches, tmp_path):
    from tilescale.cache_files import UnsafeCacheDirError, private_dir

    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, FOREIGN_UID, -1)
    (parent / "cache").mkdir(mode=0o700)     # ours, in their directory: they can swap it
    with pytest.raises(UnsafeCacheDirError, match=rf"the directory {parent} above it is owned by uid {FOREIGN_UID}"):
        private_dir(parent / "cache")
