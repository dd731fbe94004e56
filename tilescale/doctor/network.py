"""Checks of what a multi-rank start needs from the network: NVSHMEM's bootstrap interface and the
launcher's rendezvous variables."""
from __future__ import annotations

import os

from . import probes
from .check import Check, check, fail, ok, warn
from .context import Context

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@check('bootstrap-interface',
       what="`NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME`, when set, names an interface of this "
            "machine with an address of `NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY`",
       symptom="Pages of `bootstrap_uid: No socket interface found ... bootstrap pre-initialization failed`.",
       fix="`export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=<interface from /sys/class/net>` (NCCL syntax: prefix, "
           "`=exact`, `^exclude`), or unset it; set it like `NCCL_SOCKET_IFNAME` on multi-node runs.")
def check_bootstrap_interface(ctx: Context) -> Check:
    ifaces = probes.interfaces()
    spec = os.environ.get("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME")
    family = os.environ.get("NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY", "AF_INET").strip() or "AF_INET"
    listing = ", ".join(ifaces) or "none found"
    if family not in ("AF_INET", "AF_INET6"):
        return fail(f"NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY={family!r}: expected AF_INET or AF_INET6",
                    "unset NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY (AF_INET is the default)")
    if not spec:
        nccl = os.environ.get("NCCL_SOCKET_IFNAME")
        if nccl:
            return warn(f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME unset but NCCL_SOCKET_IFNAME={nccl!r}: NVSHMEM "
                        f"may bootstrap over another interface (interfaces: {listing})",
                        f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={nccl}")
        return ok(f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME unset: NVSHMEM picks one of {listing}")
    chosen = probes.match_interfaces(spec, ifaces)
    usable = [i for i in ifaces if probes.has_address(i, family) is not False]
    pick = next((i for i in usable if i != "lo"), usable[0] if usable else "<interface>")
    if not chosen:
        return fail(f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} matches no interface of this machine "
                    f"(interfaces: {listing}); NVSHMEM init would fail with 'No socket interface found'",
                    f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={pick}   (or unset it)")
    has = [probes.has_address(i, family) for i in chosen]
    if all(h is False for h in has):
        return fail(f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} selects {', '.join(chosen)}, none with "
                    f"an {family} address",
                    f"export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={pick}   (interfaces with an {family} address: "
                    f"{', '.join(usable) or 'none'}), or set NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY to the family it has")
    return ok(f"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME={spec!r} selects {', '.join(chosen)} ({family})")


@check('rendezvous',
       what="under a launcher: MASTER_ADDR resolves, MASTER_PORT is a port, WORLD_SIZE > 1 has "
            "a MASTER_ADDR",
       symptom="`WORLD_SIZE > 1 but MASTER_ADDR is not set`, or the rendezvous hangs or times out.",
       fix="Start with `bash launch.sh script.py` or torchrun, which set them; on several nodes "
           "`MASTER_ADDR` is node 0's reachable address.")
def check_rendezvous(ctx: Context) -> Check:
    present = [v for v in _LAUNCHER_VARS if v in os.environ]
    if not present:
        return ok("not under a launcher (launch.sh / torchrun set MASTER_ADDR, MASTER_PORT, RANK, ...)")
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
        r = probes.resolves(addr)
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
        return warn("; ".join(problems), "; ".join(fixes))
    shown = ", ".join(f"{v}={os.environ[v]}" for v in present)
    return ok(shown)
