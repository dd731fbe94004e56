"""`python -m tilescale doctor` / `env` (CPU only, no GPU needed)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nvshmem_versions import extra_install

from tilescale import discovery, doctor
from tilescale.__main__ import main

REPO = Path(__file__).resolve().parent.parent

# Variables that change what the checks report; every test starts without them.
_ENV = ("NVSHMEM_HOME", "TILESCALE_USE_NVSHMEM", "TILELANG_USE_NVSHMEM", "TILESCALE_BUILD_MODE", "TILESCALE_CACHE_DIR",
        "TILELANG_CACHE_DIR", "NVSHMEM_SYMMETRIC_SIZE", "NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST", "CUDA_MODULE_LOADING", "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
        "NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY", "NVSHMEM_BOOTSTRAP_UID_PLUGIN", "NCCL_SOCKET_IFNAME", "RANK",
        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TILESCALE_RANKS_PER_GPU", "XDG_CACHE_HOME")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for v in _ENV:
        monkeypatch.delenv(v, raising=False)
    discovery.clear_cache()
    yield
    discovery.clear_cache()


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in _ENV}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "tilescale", *args], cwd=REPO, env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def _line(out: str, name: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.split()[1:2] == [name]]
    assert len(lines) == 1, f"no single line for check {name!r} in:\n{out}"
    return lines[0]


def _ctx(gpus=None, gpu_count=0, mem=None, ranks_per_gpu=None) -> doctor.Context:
    ctx = doctor.Context(gpus)
    ctx.gpu_count = gpu_count
    ctx.gpu_names = ["NVIDIA H200"] * min(gpus or gpu_count, gpu_count)
    ctx.min_gpu_memory = mem
    if ranks_per_gpu is not None:
        ctx.ranks_per_gpu = ranks_per_gpu
    return ctx


# ------------------------------------------------------------------------------------------ command line
def test_cli_fails_when_more_gpus_requested_than_visible():
    r = _cli("doctor", "--gpus", "2", CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 1, r.stdout
    line = _line(r.stdout, "gpus")
    assert line.startswith("FAIL"), line
    assert "2 requested" in line and "CUDA_VISIBLE_DEVICES=''" in line
    assert "-> fix:" in line
    assert "1 FAIL" in r.stdout.splitlines()[-1]


def test_cli_quiet_prints_only_problems_and_a_summary(monkeypatch, capsys):
    checks = [doctor.Check("a", doctor.OK, "fine"), doctor.Check("b", doctor.WARN, "hmm", "do x"),
              doctor.Check("c", doctor.FAIL, "broken", "do y")]
    monkeypatch.setattr(doctor, "run_checks", lambda gpus=None: checks)
    assert main(["doctor", "--quiet"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    assert out[0].startswith("warn") and "b" in out[0] and "fix: do x" in out[0]
    assert out[1].startswith("FAIL") and "fix: do y" in out[1]
    assert "1 FAIL, 1 warn, 1 ok" in out[2]
    assert not any(ln.startswith("ok") for ln in out)


def test_warnings_do_not_fail(monkeypatch, capsys):
    checks = [doctor.Check("a", doctor.OK, "fine"), doctor.Check("b", doctor.WARN, "hmm", "do x")]
    monkeypatch.setattr(doctor, "run_checks", lambda gpus=None: checks)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("ok") and "fine" in out and "fix: do x" in out


def test_cli_json_parses():
    r = _cli("doctor", "--json", "--gpus", "2", CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert [d["name"] for d in data] == [s.name for s in doctor.CHECKS]
    for d in data:
        assert set(d) >= {"name", "status", "found", "fix", "what"}
        assert d["status"] in doctor.STATUSES
        assert d["status"] == "ok" or d["fix"], d
    gpus = next(d for d in data if d["name"] == "gpus")
    assert gpus["status"] == "FAIL" and "2 requested" in gpus["found"]


def test_cli_env_lists_settings():
    r = _cli("env", TILESCALE_WAIT_TIMEOUT_S="7")
    assert r.returncode == 0, r.stdout
    assert "TILESCALE_WAIT_TIMEOUT_S = 7.0" in r.stdout
    from tilescale.env import SETTINGS

    # every setting: a line with its name and value, then its help (env.py's text, as it is now)
    lines = r.stdout.splitlines()
    for s in SETTINGS:
        at = [i for i, ln in enumerate(lines) if ln.startswith(f"{s.name} = ")]
        assert len(at) == 1, f"no single line for {s.name} in:\n{r.stdout}"
        assert s.doc.strip() and lines[at[0] + 1] == f"    {s.doc}", (s.name, lines[at[0] + 1])
    assert "gives up" in lines[lines.index("TILESCALE_WAIT_TIMEOUT_S = 7.0") + 1]   # the bound's help, not another's
    assert "NVSHMEM_SYMMETRIC_SIZE = " in r.stdout


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "doctor" in out and "env" in out
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert "--gpus" in out and "--quiet" in out and "--json" in out and "--markdown" in out
    assert main([]) == 2
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--gpus", "0"])
    assert e.value.code == 2


# --------------------------------------------------------------------------------------------------- GPUs
def test_gpu_check():
    c = doctor.check_gpus(_ctx(gpus=None, gpu_count=0))
    assert c.status == "warn" and "compile-only" in c.found
    c = doctor.check_gpus(_ctx(gpus=2, gpu_count=0))
    assert c.status == "FAIL" and c.fix
    c = doctor.check_gpus(_ctx(gpus=4, gpu_count=2))
    assert c.status == "FAIL" and "2 GPU(s) visible, 4 requested" in c.found and "CUDA_VISIBLE_DEVICES" in c.found
    assert "tilescale run -n 2" in c.fix
    c = doctor.check_gpus(_ctx(gpus=2, gpu_count=4))
    assert c.status == "ok" and "2 x NVIDIA H200" in c.found


def test_no_gpu_no_driver_says_nothing_can_run(monkeypatch):
    """Without GPU and driver the doctor does not fail the compile-only use, but does not promise a run."""
    monkeypatch.setattr(doctor.Context, "gpu_count", property(lambda self: 0))
    monkeypatch.setattr(doctor.probes, "driver_version", lambda: None)
    checks = {c.name: c for c in doctor.run_checks()}
    assert checks["gpus"].status == "warn" and checks["libcuda"].status == "warn"
    assert checks["shared-gpu"].status == "ok" and "compile-only" in checks["shared-gpu"].found
    # the verdict, on these checks without the FAILs this machine may have for other reasons
    shown = [c for c in checks.values() if c.status != doctor.FAIL]
    assert doctor.compile_only(shown)
    line = doctor.summary(shown)
    assert "nothing can run here" in line and "compiled only" in line
    assert "a run should work" not in line and "ready" not in line and doctor.exit_code(shown) == 0
    # with --gpus N it is a FAIL, as before
    assert "a run would fail" in doctor.summary(doctor.run_checks(gpus=2))


def test_summary_with_gpus_is_unchanged():
    ok = doctor.Check("gpus", doctor.OK, "2 GPU(s) visible: 2 x NVIDIA H200")
    warn = doctor.Check("nvls", doctor.WARN, "x", "y")
    assert not doctor.compile_only([ok, warn])
    assert doctor.summary([ok]).endswith(": ready") and doctor.summary([ok, warn]).endswith("a run should work")


@pytest.mark.parametrize("gpus,count,rpg,status", [
    (None, 0, 1, "ok"), (2, 0, 4, "ok"),          # no GPU: compile-only, nothing to share
    (None, 2, 1, "ok"), (None, 1, 4, "ok"),
    (2, 2, 1, "ok"), (1, 4, 1, "ok"),            # a GPU per rank
    (4, 1, 4, "ok"), (4, 2, 2, "ok"), (3, 2, 2, "ok"), (8, 3, 3, "ok"),   # shared: ceil(N/G) <= R
    (2, 1, 1, "FAIL"), (4, 1, 2, "FAIL"), (5, 2, 2, "FAIL"),            # more than R per GPU
])
def test_shared_gpu(gpus, count, rpg, status):
    c = doctor.check_shared_gpu(_ctx(gpus=gpus, gpu_count=count, ranks_per_gpu=rpg))
    assert c.status == status, c
    g = doctor.check_gpus(_ctx(gpus=gpus, gpu_count=count, ranks_per_gpu=rpg))
    if count == 0:
        assert "compile-only" in c.found
        return
    if gpus is not None and gpus <= count:
        assert "one rank per GPU" in c.found and g.status == "ok"
    elif gpus is not None and status == "ok":   # shared-GPU mode: the gpus check agrees
        assert c.found == (f"shared-GPU mode: {gpus} ranks on {count} GPU(s), up to {rpg} per GPU; "
                           "torch.distributed on gloo only, NVSHMEM multiple-processes-per-GPU; timings mean nothing")
        assert g.status == "ok" and "shared" in g.found
    elif status == "FAIL":
        need = -(-gpus // count)
        assert c.fix == (f"set TILESCALE_RANKS_PER_GPU={need} to share GPUs (correctness only) or ask for "
                         f"GPUS<={count}")
        assert g.status == "FAIL" and f"TILESCALE_RANKS_PER_GPU={need}" in g.fix


def test_shared_gpu_reads_the_setting(monkeypatch):
    monkeypatch.setenv("TILESCALE_RANKS_PER_GPU", "4")
    c = doctor.check_shared_gpu(_ctx(gpus=4, gpu_count=1))
    assert c.status == "ok" and c.found.startswith("shared-GPU mode: 4 ranks on 1 GPU(s), up to 4 per GPU")
    assert doctor.check_gpus(_ctx(gpus=4, gpu_count=1)).status == "ok"
    monkeypatch.setenv("TILESCALE_RANKS_PER_GPU", "0")
    c = doctor.check_shared_gpu(_ctx(gpus=4, gpu_count=1))
    assert c.status == "FAIL" and "TILESCALE_RANKS_PER_GPU='0'" in c.found and "unset TILESCALE_RANKS_PER_GPU" in c.fix
    assert doctor.check_gpus(_ctx(gpus=4, gpu_count=1)).status == "FAIL"
    monkeypatch.delenv("TILESCALE_RANKS_PER_GPU")
    c = doctor.check_shared_gpu(_ctx(gpus=2, gpu_count=1))
    assert c.status == "FAIL" and "(default)" in c.found and "TILESCALE_RANKS_PER_GPU=2" in c.fix


def test_peer_access(monkeypatch):
    assert doctor.check_peer_access(_ctx(gpu_count=0)).status == "ok"
    monkeypatch.setattr(doctor.probes, "can_access_peer", lambda i, j: True)
    c = doctor.check_peer_access(_ctx(gpus=3, gpu_count=4))
    assert c.status == "ok" and ".YY Y.Y YY." in c.found
    monkeypatch.setattr(doctor.probes, "can_access_peer", lambda i, j: {i, j} != {0, 2})
    c = doctor.check_peer_access(_ctx(gpus=3, gpu_count=4))
    assert c.status == "FAIL" and "0->2" in c.found and "2->0" in c.found and ".Yn Y.Y nY." in c.found
    assert "CUDA_VISIBLE_DEVICES" in c.fix


# ------------------------------------------------------------------------------------------------ NVSHMEM
def test_nvshmem_found_with_the_wheel():
    inst = discovery.find_nvshmem()
    c = doctor.check_nvshmem(doctor.Context())
    assert c.status == "ok"
    assert inst.version in c.found and str(inst.root) in c.found and inst.source in c.found


def test_nvshmem_switched_off_fails_clearly(monkeypatch):
    monkeypatch.setenv("TILESCALE_USE_NVSHMEM", "0")
    checks = {c.name: c for c in doctor.run_checks()}
    c = checks["nvshmem"]
    assert c.status == "FAIL" and "switched off" in c.found and "TILESCALE_USE_NVSHMEM" in c.fix
    # the checks that need an install say so instead of crashing
    for name in ("nvshmem-version", "nvshmem-device-lib", "nvshmem-inlined", "bootstrap-plugin"):
        assert checks[name].status == "ok" and "skipped" in checks[name].found


def test_nvshmem_not_found_lists_places_and_pip(monkeypatch, tmp_path):
    monkeypatch.setattr(discovery, "_candidates", lambda: [("NVSHMEM_HOME", tmp_path, tmp_path / "include",
                                                            tmp_path / "lib")])
    c = doctor.check_nvshmem(doctor.Context())
    assert c.status == "FAIL"
    assert "\n" not in c.found and "Looked in" in c.found and str(tmp_path / "include" / "nvshmem.h") in c.found
    assert "pip install nvidia-nvshmem-cu13" in c.fix


def test_host_library_version_is_read_from_the_library():
    inst = discovery.find_nvshmem()
    assert doctor.host_library_version(inst) == inst.version
    assert "NVSHMEM_BOOTSTRAP_UID_PLUGIN" not in os.environ   # the doctor leaves the environment alone
    assert doctor.check_nvshmem_version(doctor.Context()).status == "ok"


def test_version_mismatch_detected(monkeypatch):
    inst = discovery.find_nvshmem()
    other = f"{inst.version_tuple[0]}.{inst.version_tuple[1] + 1}.0"
    monkeypatch.setattr(doctor.probes, "host_library_version", lambda install: other)
    c = doctor.check_nvshmem_version(doctor.Context())
    assert c.status == "FAIL"
    assert f"headers say {inst.version}" in c.found and f"host library says {other}" in c.found
    assert str(inst.host_library) in c.found
    assert f"=={inst.version}" in c.fix if inst.source.startswith("pip") else "NVSHMEM_HOME" in c.fix
    monkeypatch.setattr(doctor.probes, "host_library_version", lambda install: inst.version)
    assert doctor.check_nvshmem_version(doctor.Context()).status == "ok"


def _mixed_install(root: Path, include_from: Path, lib_from: Path, header_version: str | None = None) -> Path:
    """An NVSHMEM_HOME with the headers of one install and the libraries of another; `header_version`
    rewrites the version header (the host library is still asked its own version, for real)."""
    inc = root / "include"
    inc.mkdir(parents=True)
    for item in include_from.iterdir():
        if item.name != "non_abi":
            (inc / item.name).symlink_to(item)
    (inc / "non_abi").mkdir()
    for item in (include_from / "non_abi").iterdir():
        if item.name != "nvshmem_version.h":
            (inc / "non_abi" / item.name).symlink_to(item)
    header = (include_from / "non_abi" / "nvshmem_version.h").read_text()
    if header_version is not None:
        for part, value in zip(("MAJOR", "MINOR", "PATCH"), header_version.split("."), strict=False):
            header = re.sub(rf"(#define\s+NVSHMEM_VENDOR_{part}_VERSION\s+)\d+", rf"\g<1>{value}", header)
    (inc / "non_abi" / "nvshmem_version.h").write_text(header)
    (root / "lib").symlink_to(lib_from)
    return root


def test_real_version_mismatch(monkeypatch, tmp_path):
    """Headers that say one version, the real host library of another: the doctor asks the library itself.
    With .ci/run's second NVSHMEM (TILESCALE_TEST_NVSHMEM_345) of another version than the wheel: the
    wheel's headers and that library; else the wheel's library under headers edited to the next minor."""
    wheel = discovery.find_nvshmem()
    extra = extra_install()
    if extra is not None and extra[1] != wheel.version:
        lib_dir, lib_version = extra[0] / "lib", extra[1]
        home = _mixed_install(tmp_path / "home", wheel.include_dir, lib_dir)
        header_version = wheel.version
    else:
        lib_dir, lib_version = wheel.lib_dir, wheel.version
        major, minor, _ = wheel.version_tuple
        header_version = f"{major}.{minor + 1}.0"
        home = _mixed_install(tmp_path / "home", wheel.include_dir, lib_dir, header_version)
    monkeypatch.setenv("NVSHMEM_HOME", str(home))
    discovery.clear_cache()
    assert discovery.find_nvshmem().version == header_version
    assert doctor.host_library_version(discovery.find_nvshmem()) == lib_version
    c = doctor.check_nvshmem_version(doctor.Context())
    assert c.status == "FAIL" and f"headers say {header_version}" in c.found
    assert f"host library says {lib_version}" in c.found
    assert "NVSHMEM_HOME" in c.fix
    monkeypatch.delenv("NVSHMEM_HOME")
    discovery.clear_cache()
    assert doctor.check_nvshmem_version(doctor.Context()).status == "ok"   # the wheel agrees with itself


def test_device_library_and_inlined(monkeypatch):
    import dataclasses

    inst = discovery.find_nvshmem()
    ctx = doctor.Context()
    ctx.install = dataclasses.replace(inst, device_library=None)
    c = doctor.check_nvshmem_device_library(ctx)
    assert c.status == "warn" and "rdc build mode unavailable" in c.found
    monkeypatch.setenv("TILESCALE_BUILD_MODE", "rdc")
    assert doctor.check_nvshmem_device_library(ctx).status == "FAIL"
    monkeypatch.delenv("TILESCALE_BUILD_MODE")
    ctx.install = dataclasses.replace(inst, include_dir=Path("/nonexistent"))   # no inlining macro there
    c = doctor.check_nvshmem_inlined(ctx)
    assert c.status == "warn" and "inlined" in c.found
    ctx.install = dataclasses.replace(inst, include_dir=Path("/nonexistent"), device_library=None)
    assert doctor.check_nvshmem_inlined(ctx).status == "FAIL"


def test_bootstrap_plugin_missing(monkeypatch):
    import dataclasses

    ctx = doctor.Context()
    assert doctor.check_bootstrap_plugin(ctx).status == "ok"
    ctx.install = dataclasses.replace(discovery.find_nvshmem(), bootstrap_uid=None)
    c = doctor.check_bootstrap_plugin(ctx)
    assert c.status == "FAIL" and "nvshmem_bootstrap_uid.so.3" in c.found and c.fix


# ---------------------------------------------------------------------------------------------- bootstrap
def test_match_interfaces():
    ifs = ["eth0", "eth1", "ib0", "lo"]
    assert doctor.match_interfaces("eth", ifs) == ["eth0", "eth1"]
    assert doctor.match_interfaces("=eth", ifs) == []
    assert doctor.match_interfaces("=eth1", ifs) == ["eth1"]
    assert doctor.match_interfaces("^eth,lo", ifs) == ["ib0"]
    assert doctor.match_interfaces("ib0:1234", ifs) == ["ib0"]


def test_bootstrap_interface(monkeypatch):
    ifaces = doctor.probes.interfaces()
    assert "lo" in ifaces
    assert doctor.check_bootstrap_interface(doctor.Context()).status == "ok"
    monkeypatch.setenv("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "nosuchif9")
    c = doctor.check_bootstrap_interface(doctor.Context())
    assert c.status == "FAIL" and "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" in c.found
    assert all(i in c.found for i in ifaces) and "export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=" in c.fix
    monkeypatch.setenv("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
    assert doctor.check_bootstrap_interface(doctor.Context()).status == "ok"
    monkeypatch.delenv("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    c = doctor.check_bootstrap_interface(doctor.Context())
    assert c.status == "warn" and c.fix == "export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo"


def test_rendezvous(monkeypatch):
    assert doctor.check_rendezvous(doctor.Context()).status == "ok"
    monkeypatch.setenv("WORLD_SIZE", "4")
    c = doctor.check_rendezvous(doctor.Context())
    assert c.status == "warn" and "MASTER_ADDR is unset" in c.found
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "99999")
    c = doctor.check_rendezvous(doctor.Context())
    assert c.status == "warn" and "MASTER_PORT" in c.found
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert doctor.check_rendezvous(doctor.Context()).status == "ok"


# ------------------------------------------------------------------------------------------ heap and env
@pytest.mark.parametrize("raw,expected", [("4G", 4 << 30), ("512m", 512 << 20), ("1073741824", 1 << 30),
                                          ("1k", 1024), ("2T", 2 << 40), ("1.5g", 3 << 29), ("0x100", 256),
                                          ("1GB", 1 << 30)])
def test_parse_symmetric_size(raw, expected):
    assert doctor.parse_nvshmem_size(raw) == expected


@pytest.mark.parametrize("raw", ["abc", "", "-1", "4X", "4 G", "G"])
def test_parse_symmetric_size_rejects(raw):
    with pytest.raises(ValueError):
        doctor.parse_nvshmem_size(raw)


def test_symmetric_heap_check(monkeypatch):
    c = doctor.check_symmetric_heap(_ctx())
    assert c.status == "ok" and "1 GiB" in c.found          # NVSHMEM's default when unset
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "abc")
    c = doctor.check_symmetric_heap(_ctx())
    assert c.status == "FAIL" and "'abc'" in c.found and "k/m/g/t" in c.fix and "NVSHMEM_SYMMETRIC_SIZE=" in c.fix
    gpu = 8 << 30
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "16G")
    c = doctor.check_symmetric_heap(_ctx(gpu_count=1, mem=gpu))
    assert c.status == "FAIL" and "larger than" in c.found and c.fix.startswith("export NVSHMEM_SYMMETRIC_SIZE=")
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "7g")
    assert doctor.check_symmetric_heap(_ctx(gpu_count=1, mem=gpu)).status == "warn"
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "2048m")
    c = doctor.check_symmetric_heap(_ctx(gpu_count=1, mem=gpu))
    assert c.status == "ok" and "25%" in c.found
    # shared-GPU mode: each rank on a GPU has its own heap there
    c = doctor.check_symmetric_heap(_ctx(gpus=3, gpu_count=1, mem=gpu, ranks_per_gpu=4))
    assert c.status == "ok" and "x 3 ranks on a GPU = 6 GiB" in c.found and "75%" in c.found
    c = doctor.check_symmetric_heap(_ctx(gpus=4, gpu_count=1, mem=gpu, ranks_per_gpu=4))
    assert c.status == "warn" and c.fix == "export NVSHMEM_SYMMETRIC_SIZE=1G"   # 4 x 1G: half the GPU
    c = doctor.check_symmetric_heap(_ctx(gpus=10, gpu_count=2, mem=gpu, ranks_per_gpu=8))
    assert c.status == "FAIL" and "x 5 ranks on a GPU = 10 GiB" in c.found and "larger than" in c.found
    c = doctor.check_symmetric_heap(_ctx(gpus=4, gpu_count=1, mem=gpu))   # not shared (refused): one heap
    assert c.status == "ok" and "ranks on a GPU" not in c.found


def test_nvls(monkeypatch):
    c = doctor.check_nvls(doctor.Context())
    assert c.status == "warn" and c.fix == "export NVSHMEM_DISABLE_NVLS=1"
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "0")
    assert doctor.check_nvls(doctor.Context()).status == "warn"
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    assert doctor.check_nvls(doctor.Context()).status == "ok"


def test_multicast(monkeypatch):
    c = doctor.check_multicast(doctor.Context())
    assert c.status == "warn" and "NCCL_NVLS_ENABLE=0" in c.fix and "TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in c.fix
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    c = doctor.check_multicast(doctor.Context())
    assert c.status == "warn" and "NCCL_NVLS_ENABLE" not in c.fix
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    assert doctor.check_multicast(doctor.Context()).status == "ok"


def test_module_loading(monkeypatch):
    c = doctor.check_module_loading(doctor.Context())
    assert c.status == "warn" and "CUDA_MODULE_LOADING=EAGER" in c.fix
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    assert doctor.check_module_loading(doctor.Context()).status == "warn"
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert doctor.check_module_loading(doctor.Context()).status == "ok"


def test_cache_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(tmp_path / "ts"))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    assert doctor.check_cache_dirs(doctor.Context()).status == "ok"
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(blocker / "cache"))
    c = doctor.check_cache_dirs(doctor.Context())
    assert c.status == "FAIL" and str(blocker / "cache") in c.found and "export TILESCALE_CACHE_DIR=" in c.fix
    assert "TILELANG_CACHE_DIR" not in c.fix
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(tmp_path / "ts"))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(blocker))
    c = doctor.check_cache_dirs(doctor.Context())
    assert c.status == "FAIL" and "export TILELANG_CACHE_DIR=" in c.fix


def test_cache_dirs_suggests_a_directory_of_the_user(monkeypatch, tmp_path):
    """Not a shared directory such as /tmp/tilescale-cache (another user could create it first)."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(blocker / "ts"))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(blocker / "tl"))
    c = doctor.check_cache_dirs(doctor.Context())
    assert c.status == "FAIL"
    assert c.fix == (f"export TILESCALE_CACHE_DIR={home}/.cache/tilescale; "
                     f"export TILELANG_CACHE_DIR={home}/.cache/tilelang")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert doctor.check_cache_dirs(doctor.Context()).fix.startswith(f"export TILESCALE_CACHE_DIR={xdg}/tilescale;")
    # the suggestion is never the directory that failed
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(xdg / "tilescale"))
    xdg.write_text("a file where XDG_CACHE_HOME should be")
    c = doctor.check_cache_dirs(doctor.Context())
    assert c.fix.startswith(f"export TILESCALE_CACHE_DIR={home}/.cache/tilescale;")
    # both suggested directories in the user's home, not a shared one such as /tmp/tilescale (compared as values:
    # the test's own folder may be under a /tmp/tilescale-tests-* run folder)
    values = [part.split("=", 1)[1] for part in c.fix.split("; ")]
    assert values == [f"{home}/.cache/tilescale", f"{home}/.cache/tilelang"], c.fix


# -------------------------------------------------------------------------------------- tools and driver
def test_nvcc(monkeypatch):
    from tilescale import toolchain
    from tilescale.errors import TileScaleError

    try:
        toolchain.nvcc_path()
    except TileScaleError:
        pytest.skip("no nvcc on this machine")
    c = doctor.check_nvcc(doctor.Context())
    assert c.status in ("ok", "warn") and toolchain.nvcc_version() in c.found

    def missing():
        raise TileScaleError("nvcc not found: install the CUDA toolkit")

    monkeypatch.setattr(toolchain, "nvcc_path", missing)
    c = doctor.check_nvcc(doctor.Context())
    assert c.status == "FAIL" and "CUDA_HOME" in c.fix


def test_nvcc_major_versus_torch(monkeypatch):
    from tilescale import toolchain

    monkeypatch.setattr(toolchain, "nvcc_path", lambda: "/x/nvcc")
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "13.0")

    class FakeTorch:
        class version:
            cuda = "12.8"

    ctx = doctor.Context()
    ctx.torch = FakeTorch
    c = doctor.check_nvcc(ctx)
    assert c.status == "warn" and "12.8" in c.found
    FakeTorch.version.cuda = "13.0"
    assert doctor.check_nvcc(ctx).status == "ok"


def test_tilelang():
    c = doctor.check_tilelang(doctor.Context())
    assert c.status == "ok" and doctor.TILELANG_PIN in c.found


def test_libcuda(monkeypatch):
    monkeypatch.setattr(doctor.probes, "driver_version", lambda: None)
    c = doctor.check_libcuda(_ctx(gpu_count=0))
    assert c.status == "warn" and "compile-only" in c.found and "stub" in c.found
    assert doctor.check_libcuda(_ctx(gpu_count=2)).status == "FAIL"
    monkeypatch.setattr(doctor.probes, "driver_version", lambda: "13.0")
    assert doctor.check_libcuda(_ctx(gpu_count=2)).status == "ok"


def test_invalid_setting_fails(monkeypatch):
    monkeypatch.setenv("TILESCALE_BUILD_MODE", "fast")
    c = doctor.check_settings(doctor.Context())
    assert c.status == "FAIL" and "TILESCALE_BUILD_MODE" in c.found and "TILESCALE_BUILD_MODE" in c.fix


def test_a_crashing_check_is_reported_not_raised(monkeypatch):
    import dataclasses

    def boom(ctx):
        raise RuntimeError("kaboom")

    specs = tuple(dataclasses.replace(s, func=boom) if s.name == "nvls" else s for s in doctor.CHECKS)
    monkeypatch.setattr(doctor, "CHECKS", specs)
    c = next(c for c in doctor.run_checks() if c.name == "nvls")
    assert c.status == "warn" and "kaboom" in c.found


# ----------------------------------------------------------------------------------------------- markdown
def test_troubleshooting_markdown_covers_every_check(capsys):
    md = doctor.troubleshooting_markdown()
    assert md.startswith("# Troubleshooting")
    for s in doctor.CHECKS:
        assert f"## `{s.name}`" in md
        assert s.symptom in md and s.fix in md
    names = [c.name for c in doctor.run_checks()]
    assert names == [s.name for s in doctor.CHECKS] and len(set(names)) == len(names)
    assert main(["doctor", "--markdown"]) == 0
    assert capsys.readouterr().out == md
    # docs/troubleshooting.md is this text (regenerate it with `python -m tilescale doctor --markdown`)
    assert (REPO / "docs" / "troubleshooting.md").read_text() == md, "docs/troubleshooting.md is not the doctor's"


@pytest.mark.parametrize("case", ["world-writable", "below a world-writable parent", "another user's"])
def test_cache_dirs_runs_the_caches_own_checks(monkeypatch, tmp_path, case):
    """A cache directory that every rank would refuse (UnsafeCacheDirError at its first build or load) is a FAIL
    of the doctor, not ok because a file can be written there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    if case == "world-writable":
        cache = shared
        shared.chmod(0o777)
    elif case == "below a world-writable parent":
        shared.chmod(0o777)             # no sticky bit: anyone can rename the cache below it away
        cache = shared / "ts"
        cache.mkdir(mode=0o700)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a directory of another user needs root")
        cache = shared
        os.chown(shared, 12345, -1)
    monkeypatch.setenv("TILESCALE_CACHE_DIR", str(cache))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    monkeypatch.delenv("TILESCALE_PLAN_DIR", raising=False)
    c = doctor.check_cache_dirs(doctor.Context())
    assert c.status == "FAIL", c
    assert f"TILESCALE_CACHE_DIR {cache} cannot be used: refusing to use the cache directory" in c.found, c.found
    assert c.fix.startswith("export TILESCALE_CACHE_DIR=") and "TILELANG_CACHE_DIR" not in c.fix, c.fix
