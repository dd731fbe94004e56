"""Repository-wide pytest setup.

* ``gpu`` / ``multigpu`` tests are skipped, with the reason, when torch sees no GPU (each such test also
  checks for itself; this hook makes the CPU tier safe to run anywhere). With fewer GPUs than ranks a
  multigpu test runs with ranks sharing GPUs (``tilescale.testing.launch``). ``--ranks 2,4`` selects
  the gpu / multigpu tests by world size.
* A run in which no test passed but some were skipped is a failure: a CI that skips everything has
  checked nothing.
* Device-side waits of kernels built by the tests are bounded (``TILESCALE_WAIT_TIMEOUT_S=30``) unless
  the caller chose otherwise. The user's kernel caches are kept (speed); tests that need a cold cache
  make their own temporary one.
* torch's inductor cache (made when torch._dynamo loads) goes to a folder of the run's own, removed at its end;
  inductor precompiles no C++ headers (torch puts them in /tmp/torchinductor_<user> whatever the cache folder).
* So do pytest's temporary folders (``tmp_path``), unless ``--basetemp`` names one: under pytest's default,
  /tmp/pytest-of-<user>, each run deletes all but the newest three runs' folders, those of a run still going beside
  it too (two runs side by side: one's tests found their ``tmp_path`` gone).
* The kernels of the selected compile tests are built ahead, in the background, while other tests run
  (tests/prebuild_cpu_tier.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("TILESCALE_WAIT_TIMEOUT_S", "30")


@pytest.hookimpl(tryfirst=True)    # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config):
    import tempfile

    # torch._dynamo (loaded by tilescale.ops.torch_ops and by torch.compile) makes its cache folder,
    # /tmp/torchinductor_<user>, as it loads: the tests (and the jobs they start) use one of their own, removed
    # when the run ends, so a test run leaves nothing in /tmp.
    # Inductor's precompiled C++ headers (its CPU kernels) go to /tmp/torchinductor_<user> whatever
    # TORCHINDUCTOR_CACHE_DIR says (torch._inductor.codecache._HEADER_DIR): the tests compile without them.
    os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        config._tilescale_inductor_dir = tempfile.mkdtemp(prefix="tilescale-tests-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = config._tilescale_inductor_dir
    if config.option.basetemp is None:   # the run's own temporary folders (module docstring)
        config._tilescale_basetemp = tempfile.mkdtemp(prefix="tilescale-tests-tmp-")
        config.option.basetemp = os.path.join(config._tilescale_basetemp, "pytest")


def pytest_unconfigure(config):
    import shutil

    d = getattr(config, "_tilescale_inductor_dir", None)
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    d = getattr(config, "_tilescale_basetemp", None)
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)

REPO_ROOT = Path(__file__).resolve().parent


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def pytest_addoption(parser):
    parser.addoption("--ranks", default="", metavar="N[,N...]",
                     help="run only the gpu / multigpu tests of these world sizes (1 = the one-GPU tests; a "
                          "multigpu test's size is its `nranks` parameter, else 2); the GPU tier runs each size "
                          "as a part of its own")
    parser.addoption("--shard", default="", metavar="I/K",
                     help="run only every K-th gpu / multigpu test, starting with the I-th (1 <= I <= K): the GPU "
                          "tier runs K shards side by side")


def world_size_of(item) -> int:
    """The number of ranks a gpu / multigpu test starts: 1 for `gpu`, else its `nranks` parameter (default 2)."""
    if "multigpu" not in item.keywords:
        return 1
    callspec = getattr(item, "callspec", None)
    return int(callspec.params.get("nranks", 2)) if callspec is not None else 2


def pytest_collection_modifyitems(config, items):
    needs = [item for item in items if "gpu" in item.keywords or "multigpu" in item.keywords]
    if not needs:
        return
    wanted = {int(x) for x in config.getoption("--ranks").replace(",", " ").split()}
    if wanted:
        keep = [i for i in items if not ("gpu" in i.keywords or "multigpu" in i.keywords) or world_size_of(i) in wanted]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        needs = [i for i in needs if i in keep]
    shard = config.getoption("--shard")
    if shard:
        try:
            i, k = (int(x) for x in shard.split("/"))
            assert 1 <= i <= k
        except (ValueError, AssertionError):
            raise pytest.UsageError(f"--shard {shard}: expected I/K with 1 <= I <= K, e.g. 2/3") from None
        drop = {id(item) for n, item in enumerate(needs) if n % k != i - 1}
        config.hook.pytest_deselected(items=[it for it in items if id(it) in drop])
        items[:] = [it for it in items if id(it) not in drop]
        needs = [it for it in needs if id(it) not in drop]
    found = _gpu_count()
    if found == 0:  # multi-rank tests share GPUs when there are fewer than ranks (tilescale.testing.launch)
        for item in needs:
            marker = "multigpu" if "multigpu" in item.keywords else "gpu"
            item.add_marker(pytest.mark.skip(
                reason=f"'{marker}' test needs a CUDA GPU ({world_size_of(item)} rank(s), which may share it); "
                       "torch sees none"))


# ------------------------------------------------------------------ "everything skipped" is a failure
_outcomes = {"passed": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
        _outcomes["passed"] += 1
    elif report.skipped:
        _outcomes["skipped"] += 1
    if report.failed:
        _keep_failure(report)


def _keep_failure(report) -> None:
    """With TILESCALE_TEST_LOG_DIR (the GPU tier), each failure's report is written there at once, to
    failures.log: a part stopped at its time limit prints no summary, and its failures would be lost."""
    d = os.environ.get("TILESCALE_TEST_LOG_DIR")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "failures.log"), "a") as f:
        f.write(f"===== {time.strftime('%H:%M:%S')} FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n"
                f"{report.longreprtext}\n")


def _all_skipped_message() -> str:
    return (f"conftest.py: no test passed and {_outcomes['skipped']} were skipped: a run where every test is "
            "skipped checks nothing, so it counts as a failure (exit status 1)")


def pytest_sessionfinish(session, exitstatus):
    if _outcomes["passed"] == 0 and _outcomes["skipped"] > 0 and exitstatus == 0:
        session.exitstatus = 1
        _outcomes["all_skipped"] = 1
        if session.config.pluginmanager.get_plugin("terminalreporter") is None:
            print(_all_skipped_message(), file=sys.stderr)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # called after pytest_sessionfinish, from the terminal reporter's own sessionfinish
    if _outcomes.get("all_skipped"):
        terminalreporter.ensure_newline()
        terminalreporter.write_line(_all_skipped_message(), red=True, bold=True)


# --------------------------------------------------------------------------------- shared fixtures
@pytest.fixture
def clean_ts_env(monkeypatch):
    """No tilescale setting from the caller's environment (those that change how tilescale resolves, discovers
    or builds: tilescale/env.py says which), and a fresh NVSHMEM discovery."""
    from tilescale import discovery
    from tilescale.env import behaviour_variables

    for name in behaviour_variables():
        monkeypatch.delenv(name, raising=False)
    discovery.clear_cache()
    yield monkeypatch
    discovery.clear_cache()


@pytest.fixture
def menv(monkeypatch):
    """No tilescale setting at all (every name and alias of tilescale/env.py unset): defaults apply."""
    from tilescale.env import SETTINGS

    for s in SETTINGS:
        for n in (s.name, *s.aliases):
            monkeypatch.delenv(n, raising=False)
    return monkeypatch


def run_python(code: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None
               ) -> tuple[subprocess.CompletedProcess, float]:
    """Run `code` in a fresh interpreter (this one's), with os.environ plus `env`; (result, seconds)."""
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), e.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=e, timeout=timeout, cwd=str(cwd or REPO_ROOT))
    return r, time.monotonic() - t0


@pytest.fixture(scope="session", autouse=True)
def _kernels_built_ahead(request, tmp_path_factory):
    """The kernels of the selected compile tests, compiled meanwhile by a background process at the lowest
    priority (tests/prebuild_cpu_tier.py: why, and what it builds); stopped at the end of the run."""
    script = REPO_ROOT / "tests" / "prebuild_cpu_tier.py"
    if not script.is_file():                  # this conftest copied elsewhere (tests/test_conftest_policy.py)
        yield
        return
    ids = {i.nodeid.split("[")[0] for i in request.session.items
           if "gpu" not in i.keywords and "multigpu" not in i.keywords}
    d = tmp_path_factory.mktemp("prebuild")   # also its TMPDIR: whatever tilelang leaves stays in pytest's own
    (d / "tests.txt").write_text("\n".join(sorted(ids)))
    with open(d / "log.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, str(script), str(d / "tests.txt")], stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), env={**os.environ, "TMPDIR": str(d)})
    yield
    if proc.poll() is None:
        proc.terminate()                      # drops what has not started; running builds finish
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def python_runner():
    """`run_python` for tests: runs code in a subprocess, returns (CompletedProcess, seconds)."""
    return run_python
