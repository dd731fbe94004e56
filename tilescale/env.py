"""Every setting tilescale reads from the environment, typed, declared once.

Each setting is read when it is used, never at import time, so a test or a launcher may change the
environment at any point before the call that needs it. ``python -m tilescale env`` prints them all.

    from tilescale import env
    env.settings.wait_timeout_s        # float, from TILESCALE_WAIT_TIMEOUT_S
    env.describe()                     # [(name, value, doc), ...]
    with env.settings.scope(build_mode="rdc", wait_timeout_s=5):   # for a while (tests)
        ...

A setting is a typed descriptor on :class:`Settings` (``Flag``, ``Seconds``, ``Choice``, ``Text``, ``PathSetting``,
``OptionalPath``, ``Count``): its class parses the variable and names it in every error. Below them, the NVSHMEM /
CUDA / launcher variables that tilescale reads or checks (``RELATED_ENV``) and NVSHMEM's size syntax.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from . import build_modes
from .errors import SettingError

V = TypeVar("V")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Setting(Generic[V]):
    """One environment variable: its name, older aliases, default and meaning. As a class attribute of
    :class:`Settings` it is a descriptor: ``settings.<attribute>`` parses the variable now.

    `per_run`: a property of the run rather than of tilescale's behaviour (where caches live, time bounds,
    the launcher's choices); the tests that check defaults keep it (conftest.py's ``clean_ts_env``)."""

    def __init__(self, name: str, default: V | Callable[[], V], doc: str, *, aliases: tuple[str, ...] = (),
                 per_run: bool = False):
        self.name, self.doc, self.aliases, self.per_run = name, doc, aliases, per_run
        self._default = default
        self.attr = ""

    # ------------------------------------------------------------------ what a subclass defines
    def parse(self, name: str, raw: str) -> V:
        """The value of `raw`, found in variable `name`; SettingError (a ValueError) naming it when invalid."""
        raise NotImplementedError

    def typed(self, value: V) -> Any:
        """What ``settings.<attribute>`` returns for a parsed value (the value itself by default)."""
        return value

    def text(self, value: Any) -> str:
        """The environment text of `value` (for :meth:`Settings.scope`)."""
        return str(value)

    # ------------------------------------------------------------------------------------ reading
    def raw(self) -> tuple[str, str] | None:
        """(variable, text) of the first of the name and its aliases that is set; None if none is."""
        for n in (self.name, *self.aliases):
            if n in os.environ:
                return n, os.environ[n]
        return None

    def default(self) -> V:
        return self._default() if callable(self._default) else self._default

    def get(self) -> V:
        found = self.raw()
        return self.default() if found is None else self.parse(*found)

    def __set_name__(self, owner, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj, owner=None):
        return self if obj is None else self.typed(self.get())

    def __set__(self, obj, value) -> None:
        raise AttributeError(f"settings.{self.attr} is read from {self.name}: set that variable, or use "
                             f"settings.scope({self.attr}=...)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Flag(Setting[bool]):
    def parse(self, name: str, raw: str) -> bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise SettingError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")

    def text(self, value: Any) -> str:
        return "1" if value else "0"


MAX_SECONDS = 7 * 24 * 3600.0   # a week: any bound of tilescale above it is a typo; 0 turns a bound off


def check_seconds(name: str, value: float, raw: str | None = None) -> float:
    """`value` if it is a finite number of seconds from 0 to MAX_SECONDS, else SettingError naming `name`
    (nan compares false with everything, inf overflows the nanosecond bounds of kernels and the waits of
    Python's threads)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not 0 <= value <= MAX_SECONDS:
        shown = repr(raw) if raw is not None else repr(value)
        raise SettingError(f"{name}={shown}: expected a number of seconds from 0 to {MAX_SECONDS:.0f} (a week; "
                           "0 turns the bound off)")
    return float(value)


class Seconds(Setting[float]):
    """A number of seconds from 0 (no bound) to :data:`MAX_SECONDS`."""

    def parse(self, name: str, raw: str) -> float:
        try:
            v = float(raw)
        except ValueError:
            raise SettingError(f"{name}={raw!r}: expected a number of seconds, e.g. 30") from None
        return check_seconds(name, v, raw)


class Count(Setting[int]):
    """A whole number >= 1."""

    def parse(self, name: str, raw: str) -> int:
        try:
            v = int(raw.strip())
        except ValueError:
            raise SettingError(f"{name}={raw!r}: expected a whole number >= 1") from None
        if v < 1:
            raise SettingError(f"{name}={raw!r}: expected a whole number >= 1")
        return v


class Choice(Setting[str]):
    def __init__(self, name: str, choices: tuple[str, ...], default: str, doc: str, **kw):
        super().__init__(name, default, doc, **kw)
        self.choices = choices

    def parse(self, name: str, raw: str) -> str:
        v = raw.strip().lower()
        if v not in self.choices:
            raise SettingError(f"{name}={raw!r}: expected one of {', '.join(self.choices)}")
        return v


class Text(Setting[str]):
    def parse(self, name: str, raw: str) -> str:
        return raw


class PathSetting(Text):
    """Text in the environment; a Path (``~`` expanded) as a setting."""

    def typed(self, value: str) -> Path:
        return Path(value).expanduser()


class OptionalPath(Text):
    """Text in the environment; a Path (``~`` expanded) as a setting, or None when unset or empty."""

    def typed(self, value: str) -> Path | None:
        return Path(value).expanduser() if value.strip() else None


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return str(Path(base) / "tilescale")


class Settings:
    """Typed, read-at-use view of the environment: ``settings.wait_timeout_s`` etc. (one attribute per
    setting, in the order ``python -m tilescale env`` lists them)."""

    use_distributed = Flag(
        "TILESCALE_USE_DISTRIBUTED", False,
        "build every @tilescale.jit kernel on the distributed (NVSHMEM) path, even one without distributed ops "
        "(the IR decides otherwise)", aliases=("TILELANG_USE_DISTRIBUTED",))
    use_nvshmem = Flag(
        "TILESCALE_USE_NVSHMEM", True, "allow linking NVSHMEM; 0 makes building a distributed kernel an error",
        aliases=("TILELANG_USE_NVSHMEM",))
    nvshmem_home = Text("NVSHMEM_HOME", "", "NVSHMEM install to use (include/ and lib/ below it); searched first")
    cache_dir = PathSetting(
        "TILESCALE_CACHE_DIR", _default_cache_dir, "where tilescale keeps its runtime shim, stub libraries and plans",
        per_run=True)
    build_mode = Choice("TILESCALE_BUILD_MODE", ("auto", *build_modes.NAMES), "auto", build_modes.setting_help())
    wait_timeout_s = Seconds(
        "TILESCALE_WAIT_TIMEOUT_S", 100.0,
        "bound of every device-side wait and barrier of kernels built from now on: after this many seconds it gives "
        "up, reports rank, block, wait site, expected and observed values, stops the kernel, and every other rank "
        "is stopped (0 = wait forever)", per_run=True)
    target = Text("TILESCALE_TARGET", "", "compile target when no GPU is visible, e.g. sm_90a (default sm_90a)")
    check_symmetric = Flag(
        "TILESCALE_CHECK_SYMMETRIC", True,
        "check at each launch that tensors used by remote ops live on the symmetric heap")
    compile_only = Flag(
        "TILESCALE_COMPILE_ONLY", False,
        "set by launch.sh on a machine without GPUs: examples compile their kernels instead of running",
        per_run=True)
    ranks_per_gpu = Count(
        "TILESCALE_RANKS_PER_GPU", 1,
        "shared-GPU mode: up to this many ranks of a node may run on one GPU (launch.sh then accepts GPUS above the "
        "GPUs found; ranks are spread evenly over the GPUs; torch.distributed runs on gloo only, NVSHMEM in its "
        "multiple-processes-per-GPU mode). For developing and testing multi-rank kernels on one GPU: correct, but "
        "timings mean nothing (1 = one rank per GPU)", per_run=True)
    node_size = Count(
        "TILESCALE_NODE_SIZE", 0,
        "emulated nodes: ranks form nodes of this many consecutive ranks, and a peer on another node is reached "
        "only through NVSHMEM's put / get / signal / atomic API, never through a load/store mapping, as across real "
        "nodes (1: every peer but itself: the forced-remote path). It must divide the world size; kernels built "
        "under it are cached apart. Unset: the real topology (the launcher's ranks per node; NVSHMEM maps the "
        "peers it can reach)", per_run=True)
    mps = Flag(
        "TILESCALE_MPS", False,
        "launch.sh starts the CUDA MPS daemon for the job (shared-GPU mode: ranks' kernels then run side by side "
        "instead of time-slicing) when none runs, and stops it after", per_run=True)
    job_dir = OptionalPath(
        "TILESCALE_JOB_DIR", "",
        "set by launch.sh in the shared-GPU mode: its private directory where each rank records its pid before "
        "NVSHMEM starts, so that launch.sh removes the /dev/shm files of its own ranks that were killed (and no "
        "other process's)", per_run=True)
    skip_doctor = Flag(
        "TILESCALE_SKIP_DOCTOR", False, "launch.sh skips its pre-flight check (python -m tilescale doctor)",
        per_run=True)
    log_level = Choice("TILESCALE_LOG", ("warning", "info", "debug"), "warning", "log level of the 'tilescale' logger")
    plan_dir = PathSetting(
        "TILESCALE_PLAN_DIR", lambda: Settings.cache_dir.get(),
        "root of the plan cache: compiled collective plans are kept as plans/<collective>/<id>.json below it "
        "(default: TILESCALE_CACHE_DIR)")
    tuning_file = Text(
        "TILESCALE_TUNING_FILE", "",
        "a tuning table (JSON: gpu, world_size, collectives) used instead of the tables shipped in "
        "tilescale/plan/tuning; it decides where built-in plans replace NCCL")
    dist_prefer = Choice(
        "TILESCALE_DIST_PREFER", ("auto", "tilescale", "nccl"), "auto",
        "default hint of tilescale.distributed collectives (use_tilescale=True): auto (tuning table, NCCL where no "
        "table matches), tilescale (a built-in plan wherever one can run), nccl")
    dist_debug = Flag(
        "TILESCALE_DIST_DEBUG", False,
        "print one line per tilescale.distributed collective call: the plan chosen, or NCCL and why")
    profile = Flag(
        "TILESCALE_PROFILE", False,
        "record tilescale's profiler events for the whole run (calls, launches, copy chunks; in-kernel tile steps "
        "of ops built with TILESCALE_PROFILE_DEVICE) into TILESCALE_PROFILE_DIR")
    profile_mask = Text(
        "TILESCALE_PROFILE_MASK", "all",
        "event types the profiler records: names among group, coll, fused, launch, kernel, copy, wait, tile, host, "
        "device, all (comma-separated) or an int bit mask; parents are added")
    profile_dir = PathSetting(
        "TILESCALE_PROFILE_DIR", "tilescale_profile",
        "where the profiler writes trace_rank<R>.json and, on rank 0, the merged trace.json")
    profile_device = Flag(
        "TILESCALE_PROFILE_DEVICE", False,
        "fused ops built from now on also build their instrumented kernels (in-kernel %globaltimer stamps per "
        "tile) and use them while profiling; off, the kernels are unchanged")
    nvcc_timeout_s = Seconds(
        "TILESCALE_NVCC_TIMEOUT_S", 600.0,
        "longest time one nvcc run of tilescale (a kernel, the runtime shim) may take before it is stopped with "
        "an error naming the file being built (0 = no limit); prebuild's ranks wait for their local rank 0 up to "
        "this times the number of kernels", per_run=True)
    build_jobs = Count(
        "TILESCALE_BUILD_JOBS", lambda: _available_cores(),
        "kernels built side by side (threads; one nvcc each) where tilescale builds several at once: an op's "
        "kernels, prebuild, tilescale.compile_all / build_all (default: the cores this process may use)",
        per_run=True)

    @contextlib.contextmanager
    def scope(self, **values) -> Iterator[Settings]:
        """Set settings for the duration of a ``with`` block (by attribute name; None unsets one), then
        restore the environment as it was: ``with settings.scope(build_mode="rdc"): ...``. Each value is
        checked first, as the setting would read it."""
        changes: dict[str, str | None] = {}
        for attr, value in values.items():
            s = vars(Settings).get(attr)
            if not isinstance(s, Setting):
                raise AttributeError(f"settings.scope: no setting {attr!r}; settings: "
                                     f"{', '.join(x.attr for x in SETTINGS)}")
            for alias in s.aliases:
                changes[alias] = None
            changes[s.name] = None if value is None else s.text(value)
            if value is not None:
                s.parse(s.name, changes[s.name])
        saved = {n: os.environ.get(n) for n in changes}
        try:
            _apply(changes)
            yield self
        finally:
            _apply(saved)


def _apply(values: dict[str, str | None]) -> None:
    for n, v in values.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v


settings = Settings()
SETTINGS: tuple[Setting, ...] = tuple(v for v in vars(Settings).values() if isinstance(v, Setting))
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    return _BY_NAME[name]


def behaviour_variables() -> tuple[str, ...]:
    """Every variable (names and aliases) of the settings that change how tilescale resolves, discovers or
    builds, not the run's own (``per_run``): what the tests that check defaults clear."""
    return tuple(n for s in SETTINGS if not s.per_run for n in (s.name, *s.aliases))


def describe() -> list[tuple[str, str, str]]:
    """(name, current value or error, doc) for every setting."""
    rows = []
    for s in SETTINGS:
        try:
            value = repr(s.get())
        except ValueError as e:
            value = f"INVALID: {e}"
        found = s.raw()
        src = f" (from {found[0]})" if found and found[0] != s.name else ""
        rows.append((s.name, value + src, s.doc))
    return rows


# ----------------------------------------------------------------- variables of NVSHMEM, CUDA, the launcher
# Variables of NVSHMEM, CUDA, NCCL, torch and the launcher that tilescale reads or the doctor checks
# (``python -m tilescale env`` lists them after tilescale's own).
RELATED_ENV: tuple[tuple[str, str], ...] = (
    ("NVSHMEM_SYMMETRIC_SIZE", "symmetric heap per rank (k/m/g/t suffix; NVSHMEM default 1G, launch.sh 4G)"),
    ("NVSHMEM_DISABLE_NVLS", "1: no NVLink multicast in NVSHMEM (tilescale sets it by default)"),
    ("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "network interface(s) of NVSHMEM's unique-id bootstrap (NCCL syntax)"),
    ("NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY", "AF_INET (default) or AF_INET6"),
    ("NVSHMEM_BOOTSTRAP_UID_PLUGIN", "path of nvshmem_bootstrap_uid.so.3 (tilescale sets it)"),
    ("NVSHMEM_DEBUG", "WARN / INFO / TRACE: NVSHMEM's own log"),
    ("CUDA_MODULE_LOADING", "EAGER: load every kernel at module load (launch.sh sets it)"),
    ("CUDA_VISIBLE_DEVICES", "GPUs this process sees"),
    ("CUDA_HOME", "CUDA toolkit root (nvcc is looked for in its bin/ first)"),
    ("TILELANG_CACHE_DIR", "tilelang's kernel cache (default ~/.tilelang/cache)"),
    ("NCCL_NVLS_ENABLE", "0: no NVLink multicast in NCCL"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1: no multicast in torch symmetric memory"),
    ("MASTER_ADDR", "rendezvous address (launch.sh / torchrun)"),
    ("MASTER_PORT", "rendezvous port (launch.sh / torchrun)"),
)

NVSHMEM_DEFAULT_SYMMETRIC_SIZE = 1 << 30   # NVSHMEM's SYMMETRIC_SIZE_DEFAULT
SIZE_SYNTAX = ("a number of bytes with an optional k/m/g/t suffix (powers of 2), e.g. "
               "NVSHMEM_SYMMETRIC_SIZE=4G, 512m or 1073741824")
SIZE_RE = re.compile(r"\s*([+]?(?:0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?\d+)?"
                     r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))(.*)", re.S)


def parse_nvshmem_size(raw: str) -> int:
    """Bytes of an NVSHMEM size setting, read as NVSHMEM reads it (``sscanf("%lf%c")``): a number,
    optionally followed at once by k/m/g/t (x 2**10, 2**20, 2**30, 2**40; any case). NVSHMEM ignores
    what follows the suffix ('1GB' is 1G). Raises SettingError (a ValueError) where NVSHMEM would refuse it."""
    m = SIZE_RE.fullmatch(raw)
    if m is None:
        raise SettingError(f"{raw!r} is not {SIZE_SYNTAX}")
    num = m.group(1).lstrip("+")
    value = float.fromhex(num) if num[:2].lower() == "0x" else float(num)
    rest = m.group(2)
    scale = 0
    if rest:
        shift = {"k": 10, "m": 20, "g": 30, "t": 40}.get(rest[0].lower())
        if shift is None:
            raise SettingError(f"{raw!r}: unknown suffix {rest[0]!r}; expected {SIZE_SYNTAX}")
        scale = shift
    if not math.isfinite(value):
        raise SettingError(f"{raw!r} is not {SIZE_SYNTAX}")
    return int(math.ceil(value * (1 << scale)))


def check_node_size(node_size: int, world_size: int) -> None:
    """Nodes of `node_size` ranks (TILESCALE_NODE_SIZE, or the launcher's ranks per node) must group a job of
    `world_size` ranks evenly: SettingError otherwise (tilescale.init_distributed checks the setting first, on
    every rank alike; tilescale.topology.Topology every grouping)."""
    if node_size < 1 or world_size < 1 or world_size % node_size:
        raise SettingError(f"TILESCALE_NODE_SIZE={node_size}: expected a whole number >= 1 that divides the world "
                           f"size {world_size} (ranks form nodes of equal size)")


def symmetric_heap_size() -> int:
    """Bytes of symmetric heap per rank: NVSHMEM_SYMMETRIC_SIZE, or NVSHMEM's default (1 GiB)."""
    raw = os.environ.get("NVSHMEM_SYMMETRIC_SIZE")
    return parse_nvshmem_size(raw) if raw else NVSHMEM_DEFAULT_SYMMETRIC_SIZE
