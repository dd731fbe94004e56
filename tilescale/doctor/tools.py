"""Checks of what building and loading kernels needs: writable caches, nvcc, tilelang, the CUDA driver."""
from __future__ import annotations

from ..compilation import toolchain
from ..env import settings
from ..version import TORCH_BELOW, TORCH_LOWEST, TORCH_REQUIREMENT
from . import probes
from .check import Check, check, fail, ok, one_line, warn
from .context import Context

TILELANG_PIN = "0.1.15"


@check('cache-dirs',
       what="the tilescale, plan and tilelang cache directories are private (owned by you, writable by nobody else, "
            "below directories only you and root can write) and writable",
       symptom="`UnsafeCacheDirError: refusing to use the cache directory ...` on every rank, or `PermissionError` / "
               "`Read-only file system` while building the runtime shim or a kernel.",
       fix="`export TILESCALE_CACHE_DIR=<a directory of yours>` and/or `export TILELANG_CACHE_DIR=<a directory of "
           "yours>` (e.g. under `~/.cache`).")
def check_cache_dirs(ctx: Context) -> Check:
    from ..compilation.cache_files import UnsafeCacheDirError, private_dir, tilelang_cache_dir

    try:
        roots = [("TILESCALE_CACHE_DIR", settings.cache_dir)]
        if settings.plan_dir != settings.cache_dir:
            roots.append(("TILESCALE_PLAN_DIR", settings.plan_dir))
    except ValueError as e:
        return fail(str(e), "unset TILESCALE_CACHE_DIR")
    roots.append(("TILELANG_CACHE_DIR", tilelang_cache_dir()))
    bad, good, fixes = [], [], []
    for var, d in roots:
        try:   # the checks every load and build runs (created 0700 if missing, as a build would)
            private_dir(d)
            why = probes.try_write(d)
        except UnsafeCacheDirError as e:
            why = str(e)
        except OSError as e:
            why = f"{e.strerror or e}" + (f" ({e.filename})" if getattr(e, "filename", None) else "")
        if why is None:
            good.append(f"{var.split('_')[0].lower()} {d}")
        else:
            bad.append(f"{var} {d} cannot be used: {why}")
            fixes.append(f"export {var}={probes.own_cache_dir(var.split('_')[0].lower(), d)}")
    if bad:
        return fail("; ".join(bad), "; ".join(fixes))
    return ok("private and writable: " + ", ".join(good))


@check('nvcc',
       what="nvcc is found (CUDA_HOME/bin, then PATH), its version, and that its CUDA major matches "
            "torch's",
       symptom="`nvcc not found`, or kernels built for one CUDA major version loaded next to torch built for another.",
       fix="Install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, or `export CUDA_HOME=<toolkit root>`; "
           "match torch's CUDA major version.")
def check_nvcc(ctx: Context) -> Check:
    try:
        path = toolchain.nvcc_path()
        ver = toolchain.nvcc_version()
    except Exception as e:  # noqa: BLE001  (TileScaleError, OSError, timeout)
        return fail(one_line(str(e)),
                    "install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, or export CUDA_HOME=<toolkit root>")
    found = f"nvcc {ver} at {path}"
    tcuda = getattr(getattr(ctx.torch, "version", None), "cuda", None) if ctx.torch is not None else None
    if tcuda and ver.split(".")[0] != str(tcuda).split(".")[0]:
        return warn(f"{found} but torch is built for CUDA {tcuda}: kernels and torch would use different "
                    "CUDA major versions",
                    f"use a CUDA {str(tcuda).split('.')[0]}.x toolkit (export CUDA_HOME=...), or a torch built for "
                    f"CUDA {ver.split('.')[0]}")
    return ok(found + (f" (torch built for CUDA {tcuda})" if tcuda else ""))


@check('tilelang',
       what=f"tilelang imports and is version {TILELANG_PIN}",
       symptom="`ImportError` on the first `@tilescale.jit`, or tilescale hooks that no longer fit tilelang.",
       fix=f"`pip install 'tilelang=={TILELANG_PIN}'`.")
def check_tilelang(ctx: Context) -> Check:
    try:
        import tilelang
    except Exception as e:  # noqa: BLE001
        return fail(f"tilelang cannot be imported: {one_line(f'{type(e).__name__}: {e}')}",
                    f"pip install 'tilelang=={TILELANG_PIN}'")
    ver = str(getattr(tilelang, "__version__", "unknown"))
    if ver.split("+")[0] != TILELANG_PIN:
        return warn(f"tilelang {ver}; tilescale is tested with {TILELANG_PIN}",
                    f"pip install 'tilelang=={TILELANG_PIN}'")
    return ok(f"tilelang {ver}")


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as '2.14.1+cu130' or '2.15.0.dev20261101'."""
    parts = []
    for p in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@check('torch',
       what=f"torch's version is one the tests cover ({TORCH_LOWEST} <= version < {TORCH_BELOW})",
       symptom="Errors from inside torch in tilescale's torch operators, CUDA graphs or torch.compile support "
               "(tilescale relies on some private torch APIs: tilescale/compat.py).",
       fix=f"`pip install '{TORCH_REQUIREMENT}'` (a build for your CUDA; see the README's install).")
def check_torch(ctx: Context) -> Check:
    if ctx.torch is None:
        return ok("skipped: torch cannot be imported (see the gpus check)")
    ver = str(ctx.torch.__version__)
    if not _release(TORCH_LOWEST) <= _release(ver) < _release(TORCH_BELOW):
        return warn(f"torch {ver}; tilescale's tests cover {TORCH_LOWEST} <= torch < {TORCH_BELOW}",
                    f"pip install '{TORCH_REQUIREMENT}'")
    return ok(f"torch {ver}")


@check('libcuda',
       what="the CUDA driver library (libcuda) is loadable where GPUs are",
       symptom="`libcuda.so.1: cannot open shared object file`, or (without GPUs) kernels that compile but cannot "
               "run.",
       fix="Install the NVIDIA driver; without GPUs tilescale compiles against a stub `libcuda.so` and runs "
           "nothing.")
def check_libcuda(ctx: Context) -> Check:
    drv = probes.driver_version()
    if ctx.gpu_count > 0:
        if drv is None:
            return fail("GPUs are visible but libcuda.so.1 cannot be loaded",
                        "install the NVIDIA driver's libcuda, or add its directory to LD_LIBRARY_PATH")
        return ok(f"CUDA driver {drv}")
    if drv is None:
        return warn("no CUDA driver: compile-only; tilescale links against a stub",
                    "nothing to do to compile; running kernels needs a machine with the NVIDIA driver and GPUs")
    return warn(f"CUDA driver {drv} but no GPU visible ({probes.visible_devices()}): compile-only",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES")
