"""Pre-flight checks of a machine before a distributed tilescale run: ``python -m tilescale doctor``.

    python -m tilescale doctor --gpus 4            # one line per check; exit 1 if a run would fail
    python -m tilescale doctor --gpus 4 --quiet    # only what is not ok, and a summary
    python -m tilescale doctor --json              # machine-readable
    python -m tilescale doctor --markdown          # the README's Troubleshooting section

    from tilescale import doctor
    checks = doctor.run_checks(gpus=4)             # [Check(name, status, found, fix, what), ...]

Each check is a small function ``check_xxx(ctx) -> Check``; ``ok`` means fine, ``warn`` means a run may
work but something is off, ``FAIL`` means a run would fail. Nothing here builds anything or starts
NVSHMEM: the host library is only dlopen'ed to ask its version. torch is imported inside the checks.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import math
import os
import re
import socket
import struct
import tempfile
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

OK, WARN, FAIL = "ok", "warn", "FAIL"
STATUSES = (OK, WARN, FAIL)

TILELANG_PIN = "0.1.15"
NVSHMEM_DEFAULT_SYMMETRIC_SIZE = 1 << 30   # NVSHMEM's SYMMETRIC_SIZE_DEFAULT
HEAP_WARN_FRACTION = 0.8
SIZE_SYNTAX = ("a number of bytes with an optional k/m/g/t suffix (powers of 2), e.g. "
               "NVSHMEM_SYMMETRIC_SIZE=4G, 512m or 1073741824")
PIP_NVSHMEM = "nvidia-nvshmem-cu13"        # (or -cu12 for CUDA 12)


@dataclass(frozen=True)
class Check:
    """The result of one check: ``status`` is ok / warn / FAIL; ``fix`` is set when it is not ok."""

    name: str
    status: str
    found: str
    fix: str = ""
    what: str = ""      # what was checked (filled in by run_checks from the check's spec)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Context:
    """What the checks share: the requested GPU count and lazily probed facts. Tests may assign any
    of the cached attributes (``ctx.gpu_count = 2``) before running a check."""

    def __init__(self, gpus: int | None = None):
        self.gpus = gpus
        self.torch_error: BaseException | None = None
        self.install_error: BaseException | None = None
        self.ranks_per_gpu_error: BaseException | None = None

    @cached_property
    def torch(self):
        try:
            import torch

            return torch
        except Exception as e:  # noqa: BLE001  (a broken torch install raises all sorts)
            self.torch_error = e
            return None

    @cached_property
    def gpu_count(self) -> int:
        t = self.torch
        if t is None:
            return 0
        try:
            return int(t.cuda.device_count())
        except Exception:  # noqa: BLE001
            return 0

    @property
    def n_gpus(self) -> int:
        """How many GPUs the GPU-pair and memory checks look at: the first --gpus, or all visible."""
        return min(self.gpus, self.gpu_count) if self.gpus else self.gpu_count

    @cached_property
    def gpu_names(self) -> list[str]:
        try:
            return [self.torch.cuda.get_device_name(i) for i in range(self.n_gpus)]
        except Exception:  # noqa: BLE001
            return []

    @cached_property
    def min_gpu_memory(self) -> int | None:
        """Smallest total memory (bytes) among the GPUs looked at; None without GPUs."""
        if self.n_gpus == 0:
            return None
        return min(int(self.torch.cuda.get_device_properties(i).total_memory) for i in range(self.n_gpus))

    @cached_property
    def ranks_per_gpu(self) -> int | None:
        """TILESCALE_RANKS_PER_GPU (shared-GPU mode; 1 = a GPU per rank); None when it is invalid."""
        try:
            return _ranks_per_gpu_setting()
        except ValueError as e:
            self.ranks_per_gpu_error = e
            return None

    @property
    def ranks_on_a_gpu(self) -> int:
        """Ranks the busiest GPU holds in the requested run: ceil(--gpus / visible GPUs), at least 1."""
        if not self.gpus or not self.gpu_count:
            return 1
        return max(1, -(-self.gpus // self.gpu_count))

    @property
    def shared_gpus(self) -> bool:
        """Whether the requested run shares GPUs (more ranks than GPUs, allowed by TILESCALE_RANKS_PER_GPU)."""
        rpg = self.ranks_per_gpu
        return self.ranks_on_a_gpu > 1 and rpg is not None and self.ranks_on_a_gpu <= rpg

    @cached_property
    def install(self):
        from .discovery import find_nvshmem

        try:
            return find_nvshmem()
        except Exception as e:  # noqa: BLE001  (NvshmemNotFoundError, or an invalid setting)
            self.install_error = e
            return None


# ---------------------------------------------------------------------------------------------- helpers
NO_GPU = "no GPU visible"     # how the gpus check's finding starts on a machine that can only compile


def _ranks_per_gpu_setting() -> int:
    """TILESCALE_RANKS_PER_GPU as tilescale reads it (settings.ranks_per_gpu); ValueError when invalid."""
    from .env import settings

    if hasattr(type(settings), "ranks_per_gpu"):
        return settings.ranks_per_gpu
    raw = os.environ.get("TILESCALE_RANKS_PER_GPU", "1")   # (a tilescale without the setting)
    try:
        v = int(raw.strip())
    except ValueError:
        v = 0
    if v < 1:
        raise ValueError(f"TILESCALE_RANKS_PER_GPU={raw!r}: expected a whole number >= 1")
    return v


def _cvd() -> str:
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if v is None else f"CUDA_VISIBLE_DEVICES={v!r}"


def _fmt_bytes(n: float) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def _one_line(text: str) -> str:
    """Multi-line messages (the discovery error lists places) as one line."""
    out = ""
    for raw in str(text).splitlines():
        s = raw.strip()
        if s.startswith("- "):
            s = s[2:]
        if not s:
            continue
        out = s if not out else out + (" " if out.endswith(":") else "; ") + s
    return out


_SIZE_RE = re.compile(r"\s*([+]?(?:0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?\d+)?"
                      r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))(.*)", re.S)


def parse_nvshmem_size(raw: str) -> int:
    """Bytes of an NVSHMEM size setting, read as NVSHMEM reads it (``sscanf("%lf%c")``): a number,
    optionally followed at once by k/m/g/t (x 2**10, 2**20, 2**30, 2**40; any case). NVSHMEM ignores
    what follows the suffix ('1GB' is 1G). Raises ValueError where NVSHMEM would refuse the value."""
    m = _SIZE_RE.fullmatch(raw)
    if m is None:
        raise ValueError(f"{raw!r} is not {SIZE_SYNTAX}")
    num = m.group(1).lstrip("+")
    value = float.fromhex(num) if num[:2].lower() == "0x" else float(num)
    rest = m.group(2)
    scale = 0
    if rest:
        shift = {"k": 10, "m": 20, "g": 30, "t": 40}.get(rest[0].lower())
        if shift is None:
            raise ValueError(f"{raw!r}: unknown suffix {rest[0]!r}; expected {SIZE_SYNTAX}")
        scale = shift
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not {SIZE_SYNTAX}")
    return int(math.ceil(value * (1 << scale)))


def host_library_version(install) -> str:
    """NVSHMEM version ("3.4.5") reported by the host library itself: dlopen it (nothing is built
    or initialised) and call ``nvshmemx_vendor_get_version_info``. (``nvshmem_info_get_version``
    reports the OpenSHMEM specification version, 1.3, not NVSHMEM's.)"""
    from .runtime import load_host_library

    key = "NVSHMEM_BOOTSTRAP_UID_PLUGIN"
    before = os.environ.get(key)
    try:
        lib = load_host_library(install)
    finally:  # load_host_library points NVSHMEM at the plugin for a run; the doctor starts none
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    fn = getattr(lib, "nvshmemx_vendor_get_version_info", None)
    if fn is None:
        raise OSError(f"{install.host_library} exports no nvshmemx_vendor_get_version_info "
                      "(not an NVSHMEM >= 2 host library?)")
    fn.restype = None
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3
    a, b, c = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(-1)
    fn(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return f"{a.value}.{b.value}.{c.value}"


def _can_access_peer(i: int, j: int) -> bool:
    import torch

    return bool(torch.cuda.can_device_access_peer(i, j))


def _interfaces() -> list[str]:
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


def _has_address(iface: str, family: str) -> bool | None:
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


def _resolves(host: str, timeout_s: float = 3.0) -> bool | None:
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


def _skip_no_nvshmem(name: str, ctx: Context) -> Check | None:
    if ctx.install is None:
        return Check(name, OK, "skipped: NVSHMEM not found (see the nvshmem check)")
    return None


def _build_mode() -> str:
    from .env import settings

    try:
        return settings.build_mode
    except ValueError:
        return "auto"


# ----------------------------------------------------------------------------------------------- checks
def check_gpus(ctx: Context) -> Check:
    n = "gpus"
    if ctx.torch is None:
        return Check(n, FAIL, f"torch cannot be imported: {ctx.torch_error}",
                     "pip install 'torch>=2.9' (a CUDA build, e.g. --index-url https://download.pytorch.org/whl/cu130)")
    count = ctx.gpu_count
    cpu_build = getattr(ctx.torch.version, "cuda", None) is None
    torch_desc = f"torch {ctx.torch.__version__}" + (" is a CPU-only build" if cpu_build else "")
    if count == 0:
        if ctx.gpus:
            fix = (f"run on a machine with {ctx.gpus} GPUs (this one can only compile: GPUS={ctx.gpus} bash "
                   "launch.sh script.py compiles the kernels without running them)")
            if cpu_build:
                fix += "; torch here is CPU-only: pip install torch --index-url https://download.pytorch.org/whl/cu130"
            elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
                fix += "; or unset CUDA_VISIBLE_DEVICES"
            return Check(n, FAIL, f"{NO_GPU}, {ctx.gpus} requested ({_cvd()}; {torch_desc})", fix)
        return Check(n, WARN, f"{NO_GPU}: compile-only machine ({_cvd()}; {torch_desc})",
                     "kernels compile here; run them on a machine with GPUs (GPUS=N bash launch.sh script.py)")
    names = ctx.gpu_names
    kinds = sorted(set(names))
    desc = ", ".join(f"{names.count(k)} x {k}" for k in kinds) if names else "names unknown"
    if ctx.gpus and count < ctx.gpus:
        if ctx.shared_gpus:
            return Check(n, OK, f"{count} GPU(s) visible, {ctx.gpus} requested: {desc}; shared, up to "
                                f"{ctx.ranks_on_a_gpu} ranks per GPU (see shared-gpu) ({_cvd()})")
        fix = f"ask for at most {count}: GPUS={count} bash launch.sh ... (or --gpus {count})"
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            fix += f", or list {ctx.gpus} devices in CUDA_VISIBLE_DEVICES (or unset it)"
        fix += (f", or share GPUs (correctness only): TILESCALE_RANKS_PER_GPU={ctx.ranks_on_a_gpu}")
        return Check(n, FAIL, f"{count} GPU(s) visible, {ctx.gpus} requested ({_cvd()})", fix)
    req = f", {ctx.gpus} requested" if ctx.gpus else ""
    return Check(n, OK, f"{count} GPU(s) visible{req}: {desc} ({_cvd()})")


def check_peer_access(ctx: Context) -> Check:
    n = "peer-access"
    g = ctx.n_gpus
    if g == 0:
        return Check(n, OK, "skipped: no GPUs")
    if g == 1:
        return Check(n, OK, "1 GPU: no pair to check")
    rows, missing = [], []
    for i in range(g):
        row = ""
        for j in range(g):
            if i == j:
                row += "."
                continue
            ok = _can_access_peer(i, j)
            row += "Y" if ok else "n"
            if not ok:
                missing.append(f"{i}->{j}")
        rows.append(row)
    matrix = f"matrix over GPUs 0..{g - 1} (row i, column j: i can access j): " + " ".join(rows)
    if missing:
        return Check(n, FAIL, f"no peer access for {', '.join(missing)}; {matrix}",
                     "NVSHMEM's intra-node transport needs P2P between every pair: choose GPUs that can reach each "
                     "other with CUDA_VISIBLE_DEVICES (see `nvidia-smi topo -m`); in a VM or container enable P2P "
                     "(IOMMU/ACS settings of the host)")
    return Check(n, OK, f"every pair has peer access; {matrix}")


def check_shared_gpu(ctx: Context) -> Check:
    n = "shared-gpu"
    rpg = ctx.ranks_per_gpu
    if rpg is None:
        return Check(n, FAIL, str(ctx.ranks_per_gpu_error or "TILESCALE_RANKS_PER_GPU is invalid"),
                     "unset TILESCALE_RANKS_PER_GPU (1 rank per GPU), or set it to a whole number >= 1")
    setting = f"TILESCALE_RANKS_PER_GPU={rpg}" + ("" if "TILESCALE_RANKS_PER_GPU" in os.environ else " (default)")
    g = ctx.gpu_count
    if g == 0:
        return Check(n, OK, f"skipped: no GPU (compile-only); {setting}")
    if not ctx.gpus:
        if rpg > 1:
            return Check(n, OK, f"{setting}: runs may put up to {rpg} ranks on each of the {g} GPU(s) "
                                "(--gpus N says whether one does)")
        return Check(n, OK, f"one rank per GPU ({setting}; {g} GPU(s) visible)")
    if ctx.gpus <= g:
        return Check(n, OK, f"one rank per GPU: {ctx.gpus} rank(s), {g} GPU(s) visible ({setting})")
    need = ctx.ranks_on_a_gpu
    if need <= rpg:
        return Check(n, OK, f"shared-GPU mode: {ctx.gpus} ranks on {g} GPU(s), up to {rpg} per GPU; "
                            "torch.distributed on gloo only, NVSHMEM multiple-processes-per-GPU; timings mean "
                            "nothing")
    return Check(n, FAIL, f"{ctx.gpus} ranks on {g} GPU(s) need {need} per GPU, {setting} allows {rpg}",
                 f"set TILESCALE_RANKS_PER_GPU={need} to share GPUs (correctness only) or ask for GPUS<={g}")


def check_nvshmem(ctx: Context) -> Check:
    n = "nvshmem"
    inst = ctx.install
    if inst is None:
        msg = str(ctx.install_error)
        found, sep, fix = msg.partition("\nTo fix:")
        if not sep:
            if "switched off" in msg:
                fix = "unset TILESCALE_USE_NVSHMEM TILELANG_USE_NVSHMEM"
            else:
                from .discovery import PIP_HINT

                fix = PIP_HINT
        return Check(n, FAIL, _one_line(found), _one_line(fix))
    return Check(n, OK, f"NVSHMEM {inst.version} from {inst.source}: {inst.root}")


def check_nvshmem_version(ctx: Context) -> Check:
    n = "nvshmem-version"
    skip = _skip_no_nvshmem(n, ctx)
    if skip:
        return skip
    inst = ctx.install
    try:
        host = host_library_version(inst)
    except Exception as e:  # noqa: BLE001  (OSError from dlopen, or a missing symbol)
        return Check(n, FAIL, f"cannot ask {inst.host_library} its version: {e}",
                     f"reinstall NVSHMEM (pip install --force-reinstall {PIP_NVSHMEM}) or point NVSHMEM_HOME at a "
                     "working install")
    if host != inst.version:
        if inst.source.startswith("pip"):
            fix = f"pip install --force-reinstall '{PIP_NVSHMEM}=={inst.version}' (headers and library of one wheel)"
        else:
            fix = (f"point NVSHMEM_HOME at one install whose include/ and lib/ belong together "
                   f"(now {inst.root}), or unset it to use the pip wheel")
        return Check(n, FAIL, f"headers say {inst.version} ({inst.include_dir}) but the host library says {host} "
                              f"({inst.host_library}): kernels would fail at module init", fix)
    return Check(n, OK, f"headers and host library agree: {host}")


def check_nvshmem_device_library(ctx: Context) -> Check:
    n = "nvshmem-device-lib"
    skip = _skip_no_nvshmem(n, ctx)
    if skip:
        return skip
    inst = ctx.install
    if inst.device_library is not None:
        return Check(n, OK, f"{inst.device_library} (rdc build mode available)")
    mode = _build_mode()
    found = f"no libnvshmem_device.a in {inst.lib_dir}: rdc build mode unavailable"
    if mode == "rdc":
        return Check(n, FAIL, found + " but TILESCALE_BUILD_MODE=rdc",
                     "unset TILESCALE_BUILD_MODE (auto uses the inlined mode), or point NVSHMEM_HOME at an install "
                     f"with lib/libnvshmem_device.a (the {PIP_NVSHMEM} wheel has it)")
    return Check(n, WARN, found,
                 f"only needed for TILESCALE_BUILD_MODE=rdc; pip install {PIP_NVSHMEM} or set NVSHMEM_HOME to an "
                 "install with lib/libnvshmem_device.a")


def check_nvshmem_inlined(ctx: Context) -> Check:
    n = "nvshmem-inlined"
    skip = _skip_no_nvshmem(n, ctx)
    if skip:
        return skip
    inst = ctx.install
    if inst.supports_inlined:
        return Check(n, OK, f"NVSHMEM {inst.version} headers support the inlined (non-RDC) build mode")
    mode = _build_mode()
    found = (f"NVSHMEM {inst.version} headers lack NVSHMEM_ENABLE_ALL_DEVICE_INLINING: the inlined (non-RDC) "
             "build mode is unavailable")
    fix = f"pip install '{PIP_NVSHMEM}>=3.4' (or NVSHMEM_HOME at NVSHMEM >= 3.4)"
    if mode == "inlined":
        return Check(n, FAIL, found + " but TILESCALE_BUILD_MODE=inlined", fix + ", or unset TILESCALE_BUILD_MODE")
    if inst.device_library is None:
        return Check(n, FAIL, found + ", and without libnvshmem_device.a rdc is too: no distributed kernel can "
                                      "be built", fix)
    return Check(n, WARN, found + "; auto falls back to rdc (slower on Hopper; tilelang's TMA GEMMs break "
                                  "under -rdc=true)", fix)


def check_bootstrap_plugin(ctx: Context) -> Check:
    n = "bootstrap-plugin"
    skip = _skip_no_nvshmem(n, ctx)
    if skip:
        return skip
    inst = ctx.install
    env = os.environ.get("NVSHMEM_BOOTSTRAP_UID_PLUGIN")
    if env:
        p = Path(env)
        if not p.is_file() and "/" in env:
            return Check(n, FAIL, f"NVSHMEM_BOOTSTRAP_UID_PLUGIN={env!r} is not a file",
                         f"unset NVSHMEM_BOOTSTRAP_UID_PLUGIN (tilescale points it at {inst.bootstrap_uid})"
                         if inst.bootstrap_uid else "unset NVSHMEM_BOOTSTRAP_UID_PLUGIN")
    if inst.bootstrap_uid is None:
        return Check(n, FAIL, f"no nvshmem_bootstrap_uid.so.3 in {inst.lib_dir}: tilescale starts NVSHMEM with the "
                              "unique-id bootstrap",
                     f"pip install --force-reinstall {PIP_NVSHMEM}, or point NVSHMEM_HOME at an install with "
                     "lib/nvshmem_bootstrap_uid.so.3")
    extra = f" (NVSHMEM_BOOTSTRAP_UID_PLUGIN={env})" if env else ""
    return Check(n, OK, f"unique-id bootstrap plugin {inst.bootstrap_uid}{extra}")


def check_bootstrap_interface(ctx: Context) -> Check:
    n = "bootstrap-interface"
    ifaces = _interfaces()
    spec = os.environ.get("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME")
    family = os.environ.get("NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY", "AF_INET").strip() or "AF_INET"
    listing = ", ".join(ifaces) or "none found"
    if family not in ("AF_INET", "AF_INET6"):
        return Check(n, FAIL, f"NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY={family!r}: expected AF_INET or AF_INET6",
                     "unset NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY (AF_INET is the default)")
    if not spec:
        nccl = os.environ.get("NCCL_SOCKET_IFNAME")
        if nccl:
            return Check(n, WARN, f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME unset but NCCL_SOCKET_IFNAME={nccl!r}: NVSHMEM "
                                  f"may bootstrap over another interface (interfaces: {listing})",
                         f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={nccl}")
        return Check(n, OK, f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME unset: NVSHMEM picks one of {listing}")
    chosen = match_interfaces(spec, ifaces)
    usable = [i for i in ifaces if _has_address(i, family) is not False]
    pick = next((i for i in usable if i != "lo"), usable[0] if usable else "<interface>")
    if not chosen:
        return Check(n, FAIL, f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} matches no interface of this machine "
                              f"(interfaces: {listing}); NVSHMEM init would fail with 'No socket interface found'",
                     f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={pick}   (or unset it)")
    has = [_has_address(i, family) for i in chosen]
    if all(h is False for h in has):
        return Check(n, FAIL, f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} selects {', '.join(chosen)}, none with "
                              f"an {family} address",
                     f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={pick}   (interfaces with an {family} address: "
                     f"{', '.join(usable) or 'none'}), or set NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY to the family it has")
    return Check(n, OK, f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} selects {', '.join(chosen)} ({family})")


_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def check_rendezvous(ctx: Context) -> Check:
    n = "rendezvous"
    present = [v for v in _LAUNCHER_VARS if v in os.environ]
    if not present:
        return Check(n, OK, "not under a launcher (launch.sh / torchrun set MASTER_ADDR, MASTER_PORT, RANK, ...)")
    problems, fixes = [], []
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    world_raw = os.environ.get("WORLD_SIZE", "1")
    try:
        world = int(world_raw)
    except ValueError:
        world = 1
        problems.append(f"WORLD_SIZE={world_raw!r} is not an integer")
        fixes.append("start with launch.sh or torchrun, which set WORLD_SIZE")
    if world > 1 and not addr:
        problems.append(f"WORLD_SIZE={world} but MASTER_ADDR is unset")
        fixes.append("export MASTER_ADDR=<address of rank 0's node> (launch.sh and torchrun set it)")
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(f"MASTER_PORT={port!r} is not a port number")
            fixes.append("export MASTER_PORT=29500 (any free port 1024-65535), or unset it for launch.sh to pick one")
    elif addr:
        problems.append("MASTER_ADDR is set but MASTER_PORT is not")
        fixes.append("export MASTER_PORT=<a free port>")
    if addr:
        r = _resolves(addr)
        if r is False:
            problems.append(f"MASTER_ADDR={addr!r} does not resolve")
            fixes.append("export MASTER_ADDR=<an IP address or a resolvable host name of rank 0's node>")
        elif r is None:
            problems.append(f"MASTER_ADDR={addr!r}: name lookup did not answer within 3 s")
            fixes.append("use an IP address for MASTER_ADDR")
        lw = os.environ.get("LOCAL_WORLD_SIZE")
        if lw and lw.isdigit() and world > int(lw) and addr in ("127.0.0.1", "localhost", "::1"):
            problems.append(f"{world} ranks over several nodes but MASTER_ADDR={addr} (loopback)")
            fixes.append("export MASTER_ADDR=<address of node 0 that the other nodes can reach>")
    if problems:
        return Check(n, WARN, "; ".join(problems), "; ".join(fixes))
    shown = ", ".join(f"{v}={os.environ[v]}" for v in present)
    return Check(n, OK, shown)


def check_symmetric_heap(ctx: Context) -> Check:
    n = "symmetric-heap"
    raw = os.environ.get("NVSHMEM_SYMMETRIC_SIZE")
    if raw is None:
        size, src = NVSHMEM_DEFAULT_SYMMETRIC_SIZE, "NVSHMEM_SYMMETRIC_SIZE unset: NVSHMEM's default 1 GiB"
    else:
        try:
            size = parse_nvshmem_size(raw)
        except ValueError as e:
            return Check(n, FAIL, f"NVSHMEM_SYMMETRIC_SIZE={raw!r} cannot be read: {e}; NVSHMEM init would fail",
                         "export NVSHMEM_SYMMETRIC_SIZE=4G   (" + SIZE_SYNTAX + ")")
        src = f"NVSHMEM_SYMMETRIC_SIZE={raw} = {_fmt_bytes(size)} ({size} bytes)"
        m = _SIZE_RE.fullmatch(raw)
        if m and len(m.group(2)) > 1:
            return Check(n, WARN, f"{src}: NVSHMEM ignores {m.group(2)[1:]!r} after the suffix",
                         f"export NVSHMEM_SYMMETRIC_SIZE={m.group(1)}{m.group(2)[0]}")
        if size == 0:
            return Check(n, FAIL, f"{src}: an empty heap holds no symmetric tensor",
                         "export NVSHMEM_SYMMETRIC_SIZE=4G   (" + SIZE_SYNTAX + ")")
    mem = ctx.min_gpu_memory
    if mem is None:
        return Check(n, OK, f"{src}; no GPU to compare with")
    where = f"GPU memory {_fmt_bytes(mem)}" + (f" (smallest of {ctx.n_gpus})" if ctx.n_gpus > 1 else "")
    per_gpu = ctx.ranks_on_a_gpu if ctx.shared_gpus else 1
    if per_gpu > 1:   # shared-GPU mode: every rank on a GPU has its own heap there
        src = f"{src} x {per_gpu} ranks on a GPU = {_fmt_bytes(size * per_gpu)}"
        size *= per_gpu
    suggest = 1 << max(20, int(math.log2(mem * 0.5 / per_gpu)))
    fix = f"export NVSHMEM_SYMMETRIC_SIZE={_fmt_bytes(suggest).replace(' ', '').replace('iB', '')}"
    if size > mem:
        return Check(n, FAIL, f"{src} is larger than the {where}", fix)
    if size > HEAP_WARN_FRACTION * mem:
        return Check(n, WARN, f"{src} is {100 * size / mem:.0f}% of the {where}: little room is left for "
                              "ordinary tensors and kernels", fix)
    return Check(n, OK, f"{src}, {100 * size / mem:.0f}% of the {where}")


def check_nvls(ctx: Context) -> Check:
    n = "nvls"
    v = os.environ.get("NVSHMEM_DISABLE_NVLS")
    if v is not None and v.strip().lower() in ("1", "true", "yes", "on", "y", "t"):
        return Check(n, OK, f"NVSHMEM_DISABLE_NVLS={v}: NVLink multicast off")
    found = "NVSHMEM_DISABLE_NVLS unset" if v is None else f"NVSHMEM_DISABLE_NVLS={v!r}"
    return Check(n, WARN, f"{found}: NVSHMEM may map NVLink multicast (NVLS), which tilescale does not use; on shared "
                          "machines it must stay off (multicast mapping can fail init)",
                 "export NVSHMEM_DISABLE_NVLS=1")


def check_multicast(ctx: Context) -> Check:
    n = "multicast"
    want = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    bad = {k: os.environ.get(k) for k, w in want.items() if os.environ.get(k, "").strip() != w}
    if not bad:
        return Check(n, OK, "NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
    found = ", ".join(f"{k} unset" if v is None else f"{k}={v!r}" for k, v in bad.items())
    return Check(n, WARN, f"{found}: NCCL / torch symmetric memory may use NVLink multicast",
                 "export " + " ".join(f"{k}={want[k]}" for k in bad))


def check_module_loading(ctx: Context) -> Check:
    n = "module-loading"
    v = os.environ.get("CUDA_MODULE_LOADING")
    if v is not None and v.strip().upper() == "EAGER":
        return Check(n, OK, "CUDA_MODULE_LOADING=EAGER")
    found = ("CUDA_MODULE_LOADING unset (CUDA loads lazily; tilescale.init_distributed sets EAGER only if CUDA has "
             "not started yet)" if v is None else f"CUDA_MODULE_LOADING={v!r}")
    return Check(n, WARN, found + ": a kernel spinning on a signal can deadlock while the kernel that sets it waits "
                                  "to be loaded", "export CUDA_MODULE_LOADING=EAGER   (launch.sh sets it)")


def _try_write(d: Path) -> str | None:
    """None if a file can be created in `d` (made if missing), else why not."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".tilescale-doctor-") as f:
            f.write(b"ok")
            f.flush()
    except OSError as e:
        return f"{e.strerror or e}" + (f" ({e.filename})" if getattr(e, "filename", None) else "")
    return None


def _own_cache_dir(name: str, bad: Path) -> str:
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


def check_cache_dirs(ctx: Context) -> Check:
    n = "cache-dirs"
    from .env import settings

    try:
        ts_dir = settings.cache_dir
    except ValueError as e:
        return Check(n, FAIL, str(e), "unset TILESCALE_CACHE_DIR")
    tl_dir = Path(os.environ.get("TILELANG_CACHE_DIR") or os.path.expanduser("~/.tilelang/cache")).expanduser()
    bad, good, fixes = [], [], []
    for var, d in (("TILESCALE_CACHE_DIR", ts_dir), ("TILELANG_CACHE_DIR", tl_dir)):
        why = _try_write(d)
        if why is None:
            good.append(f"{var.split('_')[0].lower()} {d}")
        else:
            bad.append(f"{var} {d} is not writable: {why}")
            fixes.append(f"export {var}={_own_cache_dir(var.split('_')[0].lower(), d)}")
    if bad:
        return Check(n, FAIL, "; ".join(bad), "; ".join(fixes))
    return Check(n, OK, "writable: " + ", ".join(good))


def check_nvcc(ctx: Context) -> Check:
    n = "nvcc"
    from . import toolchain

    try:
        path = toolchain.nvcc_path()
        ver = toolchain.nvcc_version()
    except Exception as e:  # noqa: BLE001  (TileScaleError, OSError, timeout)
        return Check(n, FAIL, _one_line(str(e)),
                     "install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, or export CUDA_HOME=<toolkit root>")
    found = f"nvcc {ver} at {path}"
    tcuda = getattr(getattr(ctx.torch, "version", None), "cuda", None) if ctx.torch is not None else None
    if tcuda and ver.split(".")[0] != str(tcuda).split(".")[0]:
        return Check(n, WARN, f"{found} but torch is built for CUDA {tcuda}: kernels and torch would use different "
                              "CUDA major versions",
                     f"use a CUDA {str(tcuda).split('.')[0]}.x toolkit (export CUDA_HOME=...), or a torch built for "
                     f"CUDA {ver.split('.')[0]}")
    return Check(n, OK, found + (f" (torch built for CUDA {tcuda})" if tcuda else ""))


def check_tilelang(ctx: Context) -> Check:
    n = "tilelang"
    try:
        import tilelang
    except Exception as e:  # noqa: BLE001
        return Check(n, FAIL, f"tilelang cannot be imported: {_one_line(f'{type(e).__name__}: {e}')}",
                     f"pip install 'tilelang=={TILELANG_PIN}'")
    ver = str(getattr(tilelang, "__version__", "unknown"))
    if ver.split("+")[0] != TILELANG_PIN:
        return Check(n, WARN, f"tilelang {ver}; tilescale is tested with {TILELANG_PIN}",
                     f"pip install 'tilelang=={TILELANG_PIN}'")
    return Check(n, OK, f"tilelang {ver}")


def _driver_version() -> str | None:
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


def check_libcuda(ctx: Context) -> Check:
    n = "libcuda"
    drv = _driver_version()
    if ctx.gpu_count > 0:
        if drv is None:
            return Check(n, FAIL, "GPUs are visible but libcuda.so.1 cannot be loaded",
                         "install the NVIDIA driver's libcuda, or add its directory to LD_LIBRARY_PATH")
        return Check(n, OK, f"CUDA driver {drv}")
    if drv is None:
        return Check(n, WARN, "no CUDA driver: compile-only; tilescale links against a stub",
                     "nothing to do to compile; running kernels needs a machine with the NVIDIA driver and GPUs")
    return Check(n, WARN, f"CUDA driver {drv} but no GPU visible ({_cvd()}): compile-only",
                 "check nvidia-smi and CUDA_VISIBLE_DEVICES")


def check_settings(ctx: Context) -> Check:
    n = "settings"
    from .env import describe

    bad = [(name, value) for name, value, _ in describe() if value.startswith("INVALID")]
    if bad:
        return Check(n, FAIL, "; ".join(v.replace("INVALID: ", "") for _, v in bad),
                     "fix or unset " + ", ".join(name for name, _ in bad) + " (python -m tilescale env lists them)")
    return Check(n, OK, "every TILESCALE_* setting parses (python -m tilescale env lists them)")


# Variables of NVSHMEM, CUDA, NCCL, torch and the launcher that the checks read (``python -m tilescale env``).
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


# ------------------------------------------------------------------------------------------------ specs
@dataclass(frozen=True)
class CheckSpec:
    """One check: its function and the words the Troubleshooting section is made of."""

    name: str
    what: str        # what the doctor checks
    symptom: str     # what goes wrong without it
    fix: str         # how to fix it (Markdown)
    func: Callable[[Context], Check]


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("gpus", "GPUs visible to torch versus the ranks requested (--gpus N)",
              "`invalid device ordinal`, `LOCAL_RANK=... but this node has N visible GPU(s)`, or launch.sh refusing "
              "`GPUS`.",
              "Ask for at most as many ranks as `torch.cuda.device_count()` reports (`GPUS=N bash launch.sh ...`); "
              "check `CUDA_VISIBLE_DEVICES`; or share GPUs (see `shared-gpu`). On a machine without GPUs tilescale "
              "only compiles.", check_gpus),
    CheckSpec("peer-access", "CUDA peer access between every pair of the GPUs used",
              "NVSHMEM init fails, or `nvshmem_ptr` returns NULL for a peer on the same node.",
              "Use GPUs that can reach each other (`nvidia-smi topo -m`; select them with `CUDA_VISIBLE_DEVICES`); "
              "in VMs and containers enable P2P on the host.", check_peer_access),
    CheckSpec("shared-gpu", "with more ranks than GPUs (--gpus N), whether `TILESCALE_RANKS_PER_GPU` lets them "
                            "share GPUs (shared-GPU mode: ceil(N / GPUs) ranks per GPU at most that setting)",
              "launch.sh refusing `GPUS` above the GPUs found; in shared-GPU mode, timings that mean nothing or "
              "NCCL errors (ranks sharing a GPU use gloo for torch.distributed).",
              "`export TILESCALE_RANKS_PER_GPU=<ceil(N / GPUs)>` to develop and test N ranks on fewer GPUs "
              "(correct, but not for timings), or ask for `GPUS` <= the GPUs found.", check_shared_gpu),
    CheckSpec("nvshmem", "an NVSHMEM install is found (NVSHMEM_HOME, 3rdparty build, pip wheel), and where",
              "`NvshmemNotFoundError: NVSHMEM not found. Looked in, in order: ...`.",
              "`pip install nvidia-nvshmem-cu13` (CUDA 13; `-cu12` for CUDA 12) or `pip install tilescale[cu13]`, "
              "or `export NVSHMEM_HOME=<root with include/ and lib/>`; make sure `TILESCALE_USE_NVSHMEM` is not 0.",
              check_nvshmem),
    CheckSpec("nvshmem-version", "the NVSHMEM version of the headers equals that of the host library "
                                 "(`nvshmemx_vendor_get_version_info`)",
              "`NVSHMEM device library version does not match with NVSHMEM host library version`, or per-module "
              "NVSHMEM init returning a negative code.",
              "Use headers and libraries of one install: `pip install --force-reinstall nvidia-nvshmem-cu13==X.Y.Z`, "
              "or point `NVSHMEM_HOME` at a consistent install.", check_nvshmem_version),
    CheckSpec("nvshmem-device-lib", "`libnvshmem_device.a` is present (needed by the rdc build mode)",
              "`TILESCALE_BUILD_MODE=rdc` fails to link (`cannot find -lnvshmem_device`).",
              "Use the default build mode (auto, inlined on NVSHMEM >= 3.4), or an NVSHMEM install that ships "
              "`lib/libnvshmem_device.a` (the pip wheel does).", check_nvshmem_device_library),
    CheckSpec("nvshmem-inlined", "the NVSHMEM headers support the inlined (non-RDC) build mode",
              "`TILESCALE_BUILD_MODE=inlined` is refused, or auto falls back to rdc (slower; breaks tilelang's "
              "TMA/wgmma GEMMs).",
              "`pip install 'nvidia-nvshmem-cu13>=3.4'` (or `NVSHMEM_HOME` at NVSHMEM >= 3.4).", check_nvshmem_inlined),
    CheckSpec("bootstrap-plugin", "NVSHMEM's unique-id bootstrap plugin (`nvshmem_bootstrap_uid.so.3`) is present",
              "NVSHMEM init fails on every rank: the bootstrap plugin cannot be loaded.",
              "Reinstall NVSHMEM with its plugins (`pip install --force-reinstall nvidia-nvshmem-cu13`); leave "
              "`NVSHMEM_BOOTSTRAP_UID_PLUGIN` unset (tilescale points it at the plugin).", check_bootstrap_plugin),
    CheckSpec("bootstrap-interface", "`NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME`, when set, names an interface of this "
                                     "machine with an address of `NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY`",
              "Pages of `bootstrap_uid: No socket interface found ... bootstrap pre-initialization failed`.",
              "`export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=<interface from /sys/class/net>` (NCCL syntax: prefix, "
              "`=exact`, `^exclude`), or unset it; set it like `NCCL_SOCKET_IFNAME` on multi-node runs.",
              check_bootstrap_interface),
    CheckSpec("rendezvous", "under a launcher: MASTER_ADDR resolves, MASTER_PORT is a port, WORLD_SIZE > 1 has "
                            "a MASTER_ADDR",
              "`WORLD_SIZE > 1 but MASTER_ADDR is not set`, or the rendezvous hangs or times out.",
              "Start with `bash launch.sh script.py` or torchrun, which set them; on several nodes "
              "`MASTER_ADDR` is node 0's reachable address.", check_rendezvous),
    CheckSpec("symmetric-heap", "`NVSHMEM_SYMMETRIC_SIZE` parses (number with k/m/g/t suffix; default 1G) and fits "
                                "in GPU memory (once per rank on a GPU in shared-GPU mode)",
              "NVSHMEM init fails or exits; `SymmetricHeapExhaustedError`; out-of-memory in ordinary torch code.",
              "`export NVSHMEM_SYMMETRIC_SIZE=4G` (launch.sh's default): large enough for the symmetric tensors of "
              "a rank, at most 80% of one GPU's memory.", check_symmetric_heap),
    CheckSpec("nvls", "`NVSHMEM_DISABLE_NVLS=1` (tilescale does not use NVLink multicast)",
              "NVSHMEM init fails in `team_internal_nvls` / `cuMemMap failed to map ... bytes`.",
              "`export NVSHMEM_DISABLE_NVLS=1` (launch.sh and `tilescale.init_distributed` set it by default).",
              check_nvls),
    CheckSpec("multicast", "`NCCL_NVLS_ENABLE=0` and `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`",
              "NCCL or torch symmetric memory sets up NVLink multicast, which fails or is forbidden on shared "
              "machines.",
              "`export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1`.", check_multicast),
    CheckSpec("module-loading", "`CUDA_MODULE_LOADING=EAGER`",
              "A kernel that waits on a signal hangs forever (lazy loading keeps the kernel that would set it "
              "from being loaded).",
              "`export CUDA_MODULE_LOADING=EAGER` before CUDA starts (launch.sh does).", check_module_loading),
    CheckSpec("cache-dirs", "the tilescale and tilelang cache directories are writable",
              "`PermissionError` / `Read-only file system` while building the runtime shim or a kernel.",
              "`export TILESCALE_CACHE_DIR=<writable dir>` and/or `export TILELANG_CACHE_DIR=<writable dir>`.",
              check_cache_dirs),
    CheckSpec("nvcc", "nvcc is found (CUDA_HOME/bin, then PATH), its version, and that its CUDA major matches "
                      "torch's",
              "`nvcc not found`, or kernels built for one CUDA major version loaded next to torch built for another.",
              "Install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, or `export CUDA_HOME=<toolkit root>`; "
              "match torch's CUDA major version.", check_nvcc),
    CheckSpec("tilelang", f"tilelang imports and is version {TILELANG_PIN}",
              "`ImportError` on the first `@tilescale.jit`, or tilescale hooks that no longer fit tilelang.",
              f"`pip install 'tilelang=={TILELANG_PIN}'`.", check_tilelang),
    CheckSpec("libcuda", "the CUDA driver library (libcuda) is loadable where GPUs are",
              "`libcuda.so.1: cannot open shared object file`, or (without GPUs) kernels that compile but cannot "
              "run.",
              "Install the NVIDIA driver; without GPUs tilescale compiles against a stub `libcuda.so` and runs "
              "nothing.", check_libcuda),
    CheckSpec("settings", "every TILESCALE_* setting has a valid value",
              "`ValueError: TILESCALE_...=...: expected ...` on first use.",
              "Fix or unset the variable; `python -m tilescale env` lists every setting, its value and meaning.",
              check_settings),
)


def run_checks(gpus: int | None = None) -> list[Check]:
    """Run every check; ``gpus`` is the number of ranks (GPUs) the run will use on this node."""
    ctx = Context(gpus)
    out = []
    for spec in CHECKS:
        try:
            c = spec.func(ctx)
        except Exception as e:  # noqa: BLE001  (a broken check must not hide the others)
            c = Check(spec.name, WARN, f"the check itself failed: {type(e).__name__}: {_one_line(str(e))}",
                      "report this as a tilescale bug, with the output of `python -m tilescale doctor --json`")
        out.append(dataclasses.replace(c, name=spec.name, what=spec.what, found=_one_line(c.found),
                                       fix=_one_line(c.fix)))
    return out


# ----------------------------------------------------------------------------------------------- output
def format_check(c: Check) -> str:
    line = f"{c.status:<4}  {c.name:<19} {c.found}"
    if c.status != OK and c.fix:
        line += f"  -> fix: {c.fix}"
    return line


def compile_only(checks: list[Check]) -> bool:
    """Whether the checks found no GPU: kernels can be compiled here, nothing can run."""
    return any(c.name == "gpus" and c.found.startswith(NO_GPU) for c in checks)


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    if counts[FAIL]:
        verdict = "a run would fail"
    elif compile_only(checks):
        verdict = "nothing can run here (no GPU): kernels can be compiled only (GPUS=N bash launch.sh compiles them)"
    else:
        verdict = "ready" if not counts[WARN] else "a run should work"
    return (f"tilescale doctor: {counts[FAIL]} FAIL, {counts[WARN]} warn, {counts[OK]} ok: {verdict}"
            + (" (TILESCALE_SKIP_DOCTOR=1 skips this check in launch.sh)" if counts[FAIL] else ""))


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def troubleshooting_markdown() -> str:
    """The README's Troubleshooting section, generated from the checks."""
    lines = [
        "## Troubleshooting",
        "",
        "Most failures of a distributed run come from the machine's setup, not from the kernel. Run the "
        "pre-flight check first (`launch.sh` runs it before every launch; `TILESCALE_SKIP_DOCTOR=1` skips it):",
        "",
        "```bash",
        "python -m tilescale doctor --gpus 4      # one line per check; exits 1 if a run would fail",
        "python -m tilescale doctor --json        # the same, as JSON",
        "python -m tilescale env                  # every TILESCALE_* setting, its value and meaning",
        "```",
        "",
        "Each line reads `ok`, `warn` (a run may work) or `FAIL` (a run would fail), then the check's name, "
        "what it found and, when not ok, the fix. The checks, with the symptom each one prevents:",
        "",
    ]
    for s in CHECKS:
        lines += [
            f"### `{s.name}`",
            "",
            f"- **Symptom:** {s.symptom}",
            f"- **The doctor checks:** {s.what}.",
            f"- **Fix:** {s.fix}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"
