"""GPU architectures of compile targets: which target a kernel compiles for, and whether the code it gives can
run on this process's GPU (checked before tilelang loads a kernel)."""
from __future__ import annotations

import re

from ..env import settings
from ..errors import ArchMismatchError, TileScaleError


def default_target(target=None):
    """`target` if given; tilelang's auto-detection when a GPU is visible; else a dict target for the
    TILESCALE_TARGET arch (default sm_90a), so kernels compile on GPU-less machines."""
    if target not in (None, "auto"):
        return target
    try:
        import torch

        if torch.cuda.is_available():
            return target
    except Exception:  # noqa: BLE001
        pass
    arch = settings.target or "sm_90a"
    if not arch.startswith("sm_"):
        raise TileScaleError(f"TILESCALE_TARGET={arch!r}: expected an arch such as sm_90a")
    return {"kind": "cuda", "arch": arch}


_SM = re.compile(r"sm_(\d+?)(\d)([af]?)")


def target_codes(target) -> list[str]:
    """The GPU codes (``sm_XY[a|f]``) that a CUDA `target` compiles to, e.g. ``['sm_90a']``; [] when the
    target names none (None / "auto": tilelang picks the visible GPU's) or is not a CUDA target."""
    if target in (None, "auto"):
        return []
    from ..compat import determine_target

    try:
        t = determine_target(target)
    except Exception:  # noqa: BLE001  (tilelang reports invalid targets itself, when it compiles)
        return []
    if t.kind.name != "cuda":
        return []
    if "code" in t.attrs:
        return [str(c) for c in t.attrs["code"]]
    return [str(t.attrs["arch"])] if "arch" in t.attrs else []


def code_runs_on(code: str, capability: tuple[int, int]) -> bool:
    """Whether GPU code `code` (tilelang embeds machine code only, no PTX) runs on a GPU of compute
    capability `capability`: ``sm_XYa`` only on X.Y; ``sm_XY`` and ``sm_XYf`` on X.Z for Z >= Y."""
    m = _SM.fullmatch(code)
    if m is None:
        return True  # not a form tilescale knows: let the driver decide
    major, minor, variant = int(m.group(1)), int(m.group(2)), m.group(3)
    if variant == "a":
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


def device_arch(capability: tuple[int, int]) -> str:
    """The code tilelang compiles for a GPU of this compute capability (sm_90a for 9.0, sm_80 for 8.0)."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _current_device():
    """(index, name, compute capability) of this process's CUDA device; None without a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        i = torch.cuda.current_device()
        return i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i))
    except Exception:  # noqa: BLE001
        return None


def check_target_arch(target, kernel: str, device=None) -> None:
    """Raise :class:`ArchMismatchError` if `target` compiles `kernel` for GPU code that cannot run on
    `device` ((index, name, capability); default: this process's GPU). Nothing to check without a GPU
    or when the target is left to tilelang (None / "auto")."""
    if target in (None, "auto"):
        return
    device = device or _current_device()
    if device is None:
        return
    codes = target_codes(target)
    if not codes:
        return
    index, name, cap = device
    if any(code_runs_on(c, cap) for c in codes):
        return
    here = device_arch(cap)
    raise ArchMismatchError(
        f"kernel '{kernel}': target={target!r} compiles it for {', '.join(codes)}, but this process's GPU "
        f"{index} ({name}) has compute capability {cap[0]}.{cap[1]} ({here}): code built for "
        f"{codes[0]} cannot run there (CUDA would fail with 'no kernel image is available'). Compile it for "
        f"this GPU: leave target unset (or 'auto'), or pass target={{'kind': 'cuda', 'arch': '{here}'}}. "
        f"To build for {codes[0]} without loading it, use tilescale.build(..., target=...) or compile on a "
        f"machine without a GPU with TILESCALE_TARGET={codes[0]}.")
