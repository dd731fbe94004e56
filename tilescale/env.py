"""Every setting tilescale reads from the environment, typed, in one place.

Each setting is read when it is used, never at import time, so a test or a launcher may change the
environment at any point before the call that needs it. ``python -m tilescale env`` prints them all.

    from tilescale import env
    env.settings.wait_timeout_s        # float, from TILESCALE_WAIT_TIMEOUT_S
    env.describe()                     # [(name, value, doc), ...]
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

V = TypeVar("V")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_float(name: str, raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds, e.g. 30") from None
    if v < 0:
        raise ValueError(f"{name}={raw!r}: expected a number >= 0 (0 turns it off)")
    return v


def _parse_choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        v = raw.strip().lower()
        if v not in choices:
            raise ValueError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
        return v

    return parse


def _parse_str(name: str, raw: str) -> str:
    return raw


def _parse_positive_int(name: str, raw: str) -> int:
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a whole number >= 1") from None
    if v < 1:
        raise ValueError(f"{name}={raw!r}: expected a whole number >= 1")
    return v


@dataclass(frozen=True)
class Setting(Generic[V]):
    """One environment variable: its name, older aliases, parser, default and meaning."""

    name: str
    parse: Callable[[str, str], V]
    default: Callable[[], V]
    doc: str
    aliases: tuple[str, ...] = ()

    def raw(self) -> tuple[str, str] | None:
        for n in (self.name, *self.aliases):
            if n in os.environ:
                return n, os.environ[n]
        return None

    def get(self) -> V:
        found = self.raw()
        if found is None:
            return self.default()
        return self.parse(*found)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilescale"


SETTINGS: tuple[Setting, ...] = (
    Setting("TILESCALE_USE_DISTRIBUTED", _parse_bool, lambda: False,
            "build every @tilescale.jit kernel on the distributed (NVSHMEM) path, even one without "
            "distributed ops (the IR decides otherwise)", aliases=("TILELANG_USE_DISTRIBUTED",)),
    Setting("TILESCALE_USE_NVSHMEM", _parse_bool, lambda: True,
            "allow linking NVSHMEM; 0 makes building a distributed kernel an error",
            aliases=("TILELANG_USE_NVSHMEM",)),
    Setting("NVSHMEM_HOME", _parse_str, lambda: "",
            "NVSHMEM install to use (include/ and lib/ below it); searched first"),
    Setting("TILESCALE_CACHE_DIR", _parse_str, lambda: str(_default_cache_dir()),
            "where tilescale keeps its runtime shim, stub libraries and plans"),
    Setting("TILESCALE_BUILD_MODE", _parse_choice("auto", "inlined", "rdc"), lambda: "auto",
            "NVSHMEM build mode of distributed kernels: inlined (non-RDC, fast on Hopper), rdc "
            "(-rdc=true + libnvshmem_device), or auto (inlined where the NVSHMEM headers support it)"),
    Setting("TILESCALE_WAIT_TIMEOUT_S", _parse_float, lambda: 100.0,
            "bound of every device-side wait and barrier of kernels built from now on: after this many seconds "
            "it gives up, reports rank, block, wait site, expected and observed values, stops the kernel, and "
            "every other rank is stopped (0 = wait forever)"),
    Setting("TILESCALE_TARGET", _parse_str, lambda: "",
            "compile target when no GPU is visible, e.g. sm_90a (default sm_90a)"),
    Setting("TILESCALE_CHECK_SYMMETRIC", _parse_bool, lambda: True,
            "check at each launch that tensors used by remote ops live on the symmetric heap"),
    Setting("TILESCALE_COMPILE_ONLY", _parse_bool, lambda: False,
            "set by launch.sh on a machine without GPUs: examples compile their kernels instead of running"),
    Setting("TILESCALE_RANKS_PER_GPU", _parse_positive_int, lambda: 1,
            "shared-GPU mode: up to this many ranks of a node may run on one GPU (launch.sh then accepts "
            "GPUS above the GPUs found; ranks are spread evenly over the GPUs; torch.distributed runs on gloo "
            "only, NVSHMEM in its multiple-processes-per-GPU mode). For developing and testing multi-rank "
            "kernels on one GPU: correct, but timings mean nothing (1 = one rank per GPU)"),
    Setting("TILESCALE_MPS", _parse_bool, lambda: False,
            "launch.sh starts the CUDA MPS daemon for the job (shared-GPU mode: ranks' kernels then run side "
            "by side instead of time-slicing) when none runs, and stops it after"),
    Setting("TILESCALE_SKIP_DOCTOR", _parse_bool, lambda: False,
            "launch.sh skips its pre-flight check (python -m tilescale doctor)"),
    Setting("TILESCALE_LOG", _parse_choice("warning", "info", "debug"), lambda: "warning",
            "log level of the 'tilescale' logger"),
    Setting("TILESCALE_PLAN_DIR", _parse_str, lambda: _BY_NAME["TILESCALE_CACHE_DIR"].get(),
            "root of the plan cache: compiled collective plans are kept as plans/<collective>/<id>.json "
            "below it (default: TILESCALE_CACHE_DIR)"),
    Setting("TILESCALE_TUNING_FILE", _parse_str, lambda: "",
            "a tuning table (JSON: gpu, world_size, collectives) used instead of the tables shipped in "
            "tilescale/plan/tuning; it decides where built-in plans replace NCCL"),
    Setting("TILESCALE_DIST_PREFER", _parse_choice("auto", "tilescale", "nccl"), lambda: "auto",
            "default hint of tilescale.distributed collectives (use_tilescale=True): auto (tuning table, "
            "NCCL where no table matches), tilescale (a built-in plan wherever one can run), nccl"),
    Setting("TILESCALE_DIST_DEBUG", _parse_bool, lambda: False,
            "print one line per tilescale.distributed collective call: the plan chosen, or NCCL and why"),
    Setting("TILESCALE_PROFILE", _parse_bool, lambda: False,
            "record tilescale's profiler events for the whole run (calls, launches, copy chunks; in-kernel "
            "tile steps of ops built with TILESCALE_PROFILE_DEVICE) into TILESCALE_PROFILE_DIR"),
    Setting("TILESCALE_PROFILE_MASK", _parse_str, lambda: "all",
            "event types the profiler records: names among group, coll, fused, launch, kernel, copy, wait, "
            "tile, host, device, all (comma-separated) or an int bit mask; parents are added"),
    Setting("TILESCALE_PROFILE_DIR", _parse_str, lambda: "tilescale_profile",
            "where the profiler writes trace_rank<R>.json and, on rank 0, the merged trace.json"),
    Setting("TILESCALE_PROFILE_DEVICE", _parse_bool, lambda: False,
            "fused ops built from now on also build their instrumented kernels (in-kernel %globaltimer "
            "stamps per tile) and use them while profiling; off, the kernels are unchanged"),
    Setting("TILESCALE_NVCC_TIMEOUT_S", _parse_float, lambda: 600.0,
            "longest time one nvcc run of tilescale (a kernel, the runtime shim) may take before it is stopped "
            "with an error naming the file being built (0 = no limit); prebuild's ranks wait for their local "
            "rank 0 up to this times the number of kernels"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    return _BY_NAME[name]


class _Settings:
    """Typed, read-at-use view of the environment: ``settings.wait_timeout_s`` etc."""

    @property
    def use_distributed(self) -> bool:
        return _BY_NAME["TILESCALE_USE_DISTRIBUTED"].get()

    @property
    def use_nvshmem(self) -> bool:
        return _BY_NAME["TILESCALE_USE_NVSHMEM"].get()

    @property
    def nvshmem_home(self) -> str:
        return _BY_NAME["NVSHMEM_HOME"].get()

    @property
    def cache_dir(self) -> Path:
        return Path(_BY_NAME["TILESCALE_CACHE_DIR"].get()).expanduser()

    @property
    def build_mode(self) -> str:
        return _BY_NAME["TILESCALE_BUILD_MODE"].get()

    @property
    def wait_timeout_s(self) -> float:
        return _BY_NAME["TILESCALE_WAIT_TIMEOUT_S"].get()

    @property
    def target(self) -> str:
        return _BY_NAME["TILESCALE_TARGET"].get()

    @property
    def check_symmetric(self) -> bool:
        return _BY_NAME["TILESCALE_CHECK_SYMMETRIC"].get()

    @property
    def compile_only(self) -> bool:
        return _BY_NAME["TILESCALE_COMPILE_ONLY"].get()

    @property
    def ranks_per_gpu(self) -> int:
        return _BY_NAME["TILESCALE_RANKS_PER_GPU"].get()

    @property
    def mps(self) -> bool:
        return _BY_NAME["TILESCALE_MPS"].get()

    @property
    def log_level(self) -> str:
        return _BY_NAME["TILESCALE_LOG"].get()

    @property
    def plan_dir(self) -> Path:
        return Path(_BY_NAME["TILESCALE_PLAN_DIR"].get()).expanduser()

    @property
    def tuning_file(self) -> str:
        return _BY_NAME["TILESCALE_TUNING_FILE"].get()

    @property
    def dist_prefer(self) -> str:
        return _BY_NAME["TILESCALE_DIST_PREFER"].get()

    @property
    def dist_debug(self) -> bool:
        return _BY_NAME["TILESCALE_DIST_DEBUG"].get()

    @property
    def profile(self) -> bool:
        return _BY_NAME["TILESCALE_PROFILE"].get()

    @property
    def profile_mask(self) -> str:
        return _BY_NAME["TILESCALE_PROFILE_MASK"].get()

    @property
    def profile_dir(self) -> Path:
        return Path(_BY_NAME["TILESCALE_PROFILE_DIR"].get()).expanduser()

    @property
    def profile_device(self) -> bool:
        return _BY_NAME["TILESCALE_PROFILE_DEVICE"].get()

    @property
    def nvcc_timeout_s(self) -> float:
        return _BY_NAME["TILESCALE_NVCC_TIMEOUT_S"].get()


settings = _Settings()


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
