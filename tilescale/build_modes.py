"""The NVSHMEM build modes of distributed kernels: one frozen row per mode, and everything that differs
between the modes is read from its row: the resolver and nvcc flags (backend.py), the setting
(env.py's ``TILESCALE_BUILD_MODE``), the source rewriting (codegen.py), the doctor's checks, and the
headers, which see the row's macro (``tilescale/module.cuh``).

Measured on H200: ``-rdc=true`` drops setmaxnreg, serialises wgmma around NVSHMEM calls and needs a
shared-memory re-alignment; the inlined mode keeps plain speed.

=========  ====================================================  =============================
mode       nvcc                                                  chosen by
=========  ====================================================  =============================
inlined    ``-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING``, no RDC;      default where the NVSHMEM
           module state filled by ``nvshmemx_cumodule_init``      headers support it
rdc        ``-rdc=true -lnvshmem_device`` (the TileScale seed)    ``tl.disable_rdc=False``,
                                                                  ``build_mode="rdc"``,
                                                                  ``TILESCALE_BUILD_MODE=rdc``
=========  ====================================================  =============================
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The tilelang execution backend that builds distributed kernels (with nvcc, linked with NVSHMEM).
DISTRIBUTED_BACKEND = "cython"
# The seed's pass-config key of the mode: True picks the row whose `disable_rdc` is True.
PASS_CONFIG = "tl.disable_rdc"


@dataclass(frozen=True)
class BuildMode:
    """One build mode of distributed kernels."""

    name: str                        # as spelled by build_mode= and TILESCALE_BUILD_MODE
    summary: str                     # a few words for TILESCALE_BUILD_MODE's help
    disable_rdc: bool                # the value of tl.disable_rdc that picks this mode
    relocatable: bool                # nvcc -rdc=true: dynamic shared memory needs re-aligning (codegen.py)
    macro: str                       # defined for the headers (-D): module.cuh sets NVSHMEM up by it
    mode_char: str                   # what a module's tilescale_module_mode() returns
    compile_flags: tuple[str, ...]   # nvcc flags of the mode
    link_libraries: tuple[str, ...]  # NVSHMEM libraries linked into the module (-l), beside the host library
    link_flags: tuple[str, ...]      # nvcc flags of that link
    needs: str                       # what an NVSHMEM install must have for this mode (doctor)
    supported_by: Callable[[object], bool]   # whether an NvshmemInstall has it

    @property
    def nvcc_flags(self) -> tuple[str, ...]:
        """Every nvcc flag of the mode, single tokens (tilelang splits flags on whitespace)."""
        return (*self.compile_flags, *(f"-l{lib}" for lib in self.link_libraries), *self.link_flags,
                f"-D{self.macro}")


INLINED = BuildMode(
    name="inlined", summary="non-RDC, fast on Hopper", disable_rdc=True, relocatable=False,
    macro="TILESCALE_BUILD_MODE_INLINED", mode_char="I",
    compile_flags=("-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING",), link_libraries=(), link_flags=(),
    needs="NVSHMEM headers with NVSHMEM_ENABLE_ALL_DEVICE_INLINING (NVSHMEM >= 3.4)",
    supported_by=lambda install: install.supports_inlined)

RDC = BuildMode(
    name="rdc", summary="-rdc=true + libnvshmem_device", disable_rdc=False, relocatable=True,
    macro="TILESCALE_BUILD_MODE_RDC", mode_char="R",
    compile_flags=("-rdc=true",), link_libraries=("nvshmem_device",),
    link_flags=("--linker-options=--exclude-libs=ALL",),   # the device library's symbols stay in the module
    needs="libnvshmem_device.a",
    supported_by=lambda install: install.device_library is not None)

MODES: tuple[BuildMode, ...] = (INLINED, RDC)       # auto picks the first one the install supports
NAMES: tuple[str, ...] = tuple(m.name for m in MODES)


def get(name: str) -> BuildMode:
    """The row of mode `name` (KeyError for an unknown name: callers validate user input first)."""
    for m in MODES:
        if m.name == name:
            return m
    raise KeyError(name)


def by_disable_rdc(value: bool) -> BuildMode:
    """The mode that ``tl.disable_rdc=value`` picks."""
    return next(m for m in MODES if m.disable_rdc == value)


def setting_help() -> str:
    """TILESCALE_BUILD_MODE's help: every mode with its summary, then auto."""
    return ("NVSHMEM build mode of distributed kernels: " + ", ".join(f"{m.name} ({m.summary})" for m in MODES)
            + f", or auto ({MODES[0].name} where the NVSHMEM headers support it)")
