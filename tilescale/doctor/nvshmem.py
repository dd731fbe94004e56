"""Checks of the NVSHMEM install: found, headers and host library of one version, what each build mode
needs (tilescale/build_modes.py), the bootstrap plugin."""
from __future__ import annotations

import functools
import os
from pathlib import Path

from ..build_modes import INLINED, RDC
from ..compilation.discovery import PIP_HINT
from ..env import settings
from . import probes
from .check import Check, check, fail, ok, one_line, warn
from .context import Context

PIP_NVSHMEM = "nvidia-nvshmem-cu13"        # (or -cu12 for CUDA 12)


def needs_nvshmem(func):
    """A check of the install `ctx.install`: skipped (ok) when no NVSHMEM was found (the nvshmem check fails)."""
    @functools.wraps(func)
    def run(ctx: Context) -> Check:
        if ctx.install is None:
            return ok("skipped: NVSHMEM not found (see the nvshmem check)")
        return func(ctx)

    return run


def build_mode_setting() -> str:
    """TILESCALE_BUILD_MODE, or "auto" when it is invalid (the settings check reports that)."""
    try:
        return settings.build_mode
    except ValueError:
        return "auto"


@check('nvshmem',
       what="an NVSHMEM install is found (NVSHMEM_HOME, 3rdparty build, pip wheel), and where",
       symptom="`NvshmemNotFoundError: NVSHMEM not found. Looked in, in order: ...`; with two NVSHMEM wheels in one "
               "environment (`nvidia-nvshmem-cu12` and `-cu13`), headers and libraries of either.",
       fix="`pip install nvidia-nvshmem-cu13` (CUDA 13; `-cu12` for CUDA 12: the one your torch requires), or "
           "`export NVSHMEM_HOME=<root with include/ and lib/>`; make sure `TILESCALE_USE_NVSHMEM` is not 0. Two "
           "wheels: install again in a new environment, as the README's install for your CUDA says.")
def check_nvshmem(ctx: Context) -> Check:
    inst = ctx.install
    if inst is None:
        msg = str(ctx.install_error)
        found, sep, fix = msg.partition("\nTo fix:")
        if not sep:
            if "switched off" in msg:
                fix = "unset TILESCALE_USE_NVSHMEM TILELANG_USE_NVSHMEM"
            else:
                fix = PIP_HINT
        return fail(one_line(found), one_line(fix))
    wheels = probes.nvshmem_wheels()
    if len(wheels) > 1 and inst.source.startswith("pip"):
        return warn(f"NVSHMEM {inst.version} from {inst.source}: {inst.root}, where {' and '.join(wheels)} both "
                    "installed their files (the same directory): headers and libraries may be of either",
                    "install again in a new virtual environment as the README says for your CUDA (CUDA 12: with "
                    "constraints/cu12.txt and a torch built for CUDA 12), so that one NVSHMEM wheel is installed")
    return ok(f"NVSHMEM {inst.version} from {inst.source}: {inst.root}")


@check('nvshmem-version',
       what="the NVSHMEM version of the headers equals that of the host library "
            "(`nvshmemx_vendor_get_version_info`)",
       symptom="`NVSHMEM device library version does not match with NVSHMEM host library version`, or per-module "
               "NVSHMEM init returning a negative code.",
       fix="Use headers and libraries of one install: `pip install --force-reinstall nvidia-nvshmem-cu13==X.Y.Z`, "
           "or point `NVSHMEM_HOME` at a consistent install.")
@needs_nvshmem
def check_nvshmem_version(ctx: Context) -> Check:
    inst = ctx.install
    try:
        host = probes.host_library_version(inst)
    except Exception as e:  # noqa: BLE001  (OSError from dlopen, or a missing symbol)
        return fail(f"cannot ask {inst.host_library} its version: {e}",
                    f"reinstall NVSHMEM (pip install --force-reinstall {PIP_NVSHMEM}) or point NVSHMEM_HOME at a "
                    "working install")
    if host != inst.version:
        if inst.source.startswith("pip"):
            fix = f"pip install --force-reinstall '{PIP_NVSHMEM}=={inst.version}' (headers and library of one wheel)"
        else:
            fix = (f"point NVSHMEM_HOME at one install whose include/ and lib/ belong together "
                   f"(now {inst.root}), or unset it to use the pip wheel")
        return fail(f"headers say {inst.version} ({inst.include_dir}) but the host library says {host} "
                    f"({inst.host_library}): kernels would fail at module init", fix)
    return ok(f"headers and host library agree: {host}")


@check('nvshmem-device-lib',
       what="`libnvshmem_device.a` is present (needed by the rdc build mode)",
       symptom="`TILESCALE_BUILD_MODE=rdc` fails to link (`cannot find -lnvshmem_device`).",
       fix="Use the default build mode (auto, inlined on NVSHMEM >= 3.4), or an NVSHMEM install that ships "
           "`lib/libnvshmem_device.a` (the pip wheel does).")
@needs_nvshmem
def check_nvshmem_device_library(ctx: Context) -> Check:
    inst = ctx.install
    if RDC.supported_by(inst):
        return ok(f"{inst.device_library} ({RDC.name} build mode available)")
    mode = build_mode_setting()
    found = f"no {RDC.needs} in {inst.lib_dir}: {RDC.name} build mode unavailable"
    if mode == RDC.name:
        return fail(found + f" but TILESCALE_BUILD_MODE={RDC.name}",
                    "unset TILESCALE_BUILD_MODE (auto uses the inlined mode), or point NVSHMEM_HOME at an install "
                    f"with lib/libnvshmem_device.a (the {PIP_NVSHMEM} wheel has it)")
    return warn(found,
                f"only needed for TILESCALE_BUILD_MODE=rdc; pip install {PIP_NVSHMEM} or set NVSHMEM_HOME to an "
                "install with lib/libnvshmem_device.a")


@check('nvshmem-inlined',
       what="the NVSHMEM headers support the inlined (non-RDC) build mode",
       symptom="`TILESCALE_BUILD_MODE=inlined` is refused, or auto falls back to rdc (slower; breaks tilelang's "
               "TMA/wgmma GEMMs).",
       fix="`pip install 'nvidia-nvshmem-cu13>=3.4'` (or `NVSHMEM_HOME` at NVSHMEM >= 3.4).")
@needs_nvshmem
def check_nvshmem_inlined(ctx: Context) -> Check:
    inst = ctx.install
    if INLINED.supported_by(inst):
        return ok(f"NVSHMEM {inst.version} headers support the {INLINED.name} (non-RDC) build mode")
    mode = build_mode_setting()
    found = (f"NVSHMEM {inst.version} headers lack NVSHMEM_ENABLE_ALL_DEVICE_INLINING: the inlined (non-RDC) "
             "build mode is unavailable")
    fix = f"pip install '{PIP_NVSHMEM}>=3.4' (or NVSHMEM_HOME at NVSHMEM >= 3.4)"
    if mode == INLINED.name:
        return fail(found + f" but TILESCALE_BUILD_MODE={INLINED.name}", fix + ", or unset TILESCALE_BUILD_MODE")
    if not RDC.supported_by(inst):
        return fail(found + ", and without libnvshmem_device.a rdc is too: no distributed kernel can "
                            "be built", fix)
    return warn(found + "; auto falls back to rdc (slower on Hopper; tilelang's TMA GEMMs break "
                        "under -rdc=true)", fix)


@check('bootstrap-plugin',
       what="NVSHMEM's unique-id bootstrap plugin (`nvshmem_bootstrap_uid.so.3`) is present",
       symptom="NVSHMEM init fails on every rank: the bootstrap plugin cannot be loaded.",
       fix="Reinstall NVSHMEM with its plugins (`pip install --force-reinstall nvidia-nvshmem-cu13`); leave "
           "`NVSHMEM_BOOTSTRAP_UID_PLUGIN` unset (tilescale points it at the plugin).")
@needs_nvshmem
def check_bootstrap_plugin(ctx: Context) -> Check:
    inst = ctx.install
    env = os.environ.get("NVSHMEM_BOOTSTRAP_UID_PLUGIN")
    if env:
        p = Path(env)
        if not p.is_file() and "/" in env:
            return fail(f"NVSHMEM_BOOTSTRAP_UID_PLUGIN={env!r} is not a file",
                        f"unset NVSHMEM_BOOTSTRAP_UID_PLUGIN (tilescale points it at {inst.bootstrap_uid})"
                        if inst.bootstrap_uid else "unset NVSHMEM_BOOTSTRAP_UID_PLUGIN")
    if inst.bootstrap_uid is None:
        return fail(f"no nvshmem_bootstrap_uid.so.3 in {inst.lib_dir}: tilescale starts NVSHMEM with the "
                    "unique-id bootstrap",
                    f"pip install --force-reinstall {PIP_NVSHMEM}, or point NVSHMEM_HOME at an install with "
                    "lib/nvshmem_bootstrap_uid.so.3")
    extra = f" (NVSHMEM_BOOTSTRAP_UID_PLUGIN={env})" if env else ""
    return ok(f"unique-id bootstrap plugin {inst.bootstrap_uid}{extra}")
