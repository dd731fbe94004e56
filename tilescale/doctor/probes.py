"""What the checks read from the machine (GPUs, network interfaces, the CUDA driver, directories,
NVSHMEM's host library), each behind one function that tests can replace."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
import struct
import tempfile
import threading
from pathlib import Path

from ..compilation.nvshmem_host import host_library_version

__all__ = ["visible_devices", "can_access_peer", "interfaces", "match_interfaces", "has_address", "resolves",
           "driver_version", "try_write", "own_cache_dir", "host_library_version", "nvshmem_wheels"]


def visible_devices() -> str:
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if v is None else f"CUDA_VISIBLE_DEVICES={v!r}"


def can_access_peer(i: int, j: int) -> bool:
    import torch

    return bool(torch.cuda.can_device_access_peer(i, j))


def nvshmem_wheels() -> list[str]:
    """The NVSHMEM wheels installed in this environment, as 'name version' (both install into nvidia/nvshmem)."""
    import importlib.metadata as md

    found = []
    for name in ("nvidia-nvshmem-cu12", "nvidia-nvshmem-cu13"):
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return found


def interfaces() -> list[str]:
    try:
        names = sorted(os.listdir("/sys/class/net"))
        if names:
            return names
    except OSError:
        pass
    try:
        return sorted(n for _, n in socket.if_nameindex())
    except OSError:
        return []


def match_interfaces(spec: str, interfaces: list[str]) -> list[str]:
    """Interfaces selected by an NCCL-style list, as NVSHMEM's UID bootstrap (NCCL's socket code)
    reads ``NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME``: comma-separated prefixes ('eth' matches eth0),
    '=' in front for exact names, '^' in front to exclude; an optional ':port' after a name."""
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    pats = [p.split(":")[0].strip() for p in s.split(",") if p.split(":")[0].strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in pats)

    return [n for n in interfaces if (not hit(n)) == exclude]


def has_address(iface: str, family: str) -> bool | None:
    """Whether `iface` has an address of `family` (AF_INET / AF_INET6); None when unknown."""
    if family == "AF_INET6":
        try:
            with open("/proc/net/if_inet6") as f:
                return any(line.split()[-1] == iface for line in f if line.strip())
        except OSError:
            return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))  # SIOCGIFADDR
        return True
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            return False
        return None


def resolves(host: str, timeout_s: float = 3.0) -> bool | None:
    """Whether `host` resolves (None: no answer within timeout_s)."""
    box: list = []

    def look() -> None:
        try:
            socket.getaddrinfo(host, None)
            box.append(True)
        except OSError:
            box.append(False)

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout_s)
    return box[0] if box else None


def driver_version() -> str | None:
    """CUDA driver API version from libcuda ("13.0"); None without a driver."""
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
                return f"{v.value // 1000}.{(v.value % 1000) // 10}"
        except AttributeError:
            continue
        return "unknown"
    return None


def try_write(d: Path) -> str | None:
    """None if a file can be created in `d` (made if missing), else why not."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".tilescale-doctor-") as f:
            f.write(b"ok")
            f.flush()
    except OSError as e:
        return f"{e.strerror or e}" + (f" ({e.filename})" if getattr(e, "filename", None) else "")
    return None


def own_cache_dir(name: str, bad: Path) -> str:
    """A cache directory of the user's to suggest instead of `bad`: under XDG_CACHE_HOME or ~/.cache, else the
    home directory (never a shared one such as /tmp, where another user could plant it first)."""
    home = Path(os.path.expanduser("~"))
    bases = [Path(os.environ["XDG_CACHE_HOME"]).expanduser()] if os.environ.get("XDG_CACHE_HOME") else []
    cands = [b / name for b in bases + [home / ".cache"]] + [home / f".{name}-cache"]
    for c in cands:
        if c == bad or bad in c.parents:
            continue
        p = c
        while not p.exists() and p != p.parent:   # the nearest existing parent decides whether it can be made
            p = p.parent
        if p.is_dir() and os.access(p, os.W_OK | os.X_OK):
            return str(c)
    return "<a writable directory of your own, e.g. under your home directory>"
