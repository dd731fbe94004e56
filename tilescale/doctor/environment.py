"""Checks of the NVSHMEM, NCCL and CUDA variables a run depends on: the symmetric heap's size, multicast
off, eager module loading."""
from __future__ import annotations

import math
import os

from ..env import NVSHMEM_DEFAULT_SYMMETRIC_SIZE, SIZE_RE, SIZE_SYNTAX, parse_nvshmem_size
from .check import Check, check, fail, ok, warn
from .context import Context

HEAP_WARN_FRACTION = 0.8


def fmt_bytes(n: float) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


@check('symmetric-heap',
       what="`NVSHMEM_SYMMETRIC_SIZE` parses (number with k/m/g/t suffix; default 1G) and fits "
            "in GPU memory (once per rank on a GPU in shared-GPU mode)",
       symptom="NVSHMEM init fails or exits; `SymmetricHeapExhaustedError`; out-of-memory in ordinary torch code.",
       fix="`export NVSHMEM_SYMMETRIC_SIZE=4G` (launch.sh's default): large enough for the symmetric tensors of "
           "a rank, at most 80% of one GPU's memory.")
def check_symmetric_heap(ctx: Context) -> Check:
    raw = os.environ.get("NVSHMEM_SYMMETRIC_SIZE")
    if raw is None:
        size, src = NVSHMEM_DEFAULT_SYMMETRIC_SIZE, "NVSHMEM_SYMMETRIC_SIZE unset: NVSHMEM's default 1 GiB"
    else:
        try:
            size = parse_nvshmem_size(raw)
        except ValueError as e:
            return fail(f"NVSHMEM_SYMMETRIC_SIZE={raw!r} cannot be read: {e}; NVSHMEM init would fail",
                        "export NVSHMEM_SYMMETRIC_SIZE=4G   (" + SIZE_SYNTAX + ")")
        src = f"NVSHMEM_SYMMETRIC_SIZE={raw} = {fmt_bytes(size)} ({size} bytes)"
        m = SIZE_RE.fullmatch(raw)
        if m and len(m.group(2)) > 1:
            return warn(f"{src}: NVSHMEM ignores {m.group(2)[1:]!r} after the suffix",
                        f"export NVSHMEM_SYMMETRIC_SIZE={m.group(1)}{m.group(2)[0]}")
        if size == 0:
            return fail(f"{src}: an empty heap holds no symmetric tensor",
                        "export NVSHMEM_SYMMETRIC_SIZE=4G   (" + SIZE_SYNTAX + ")")
    mem = ctx.min_gpu_memory
    if mem is None:
        return ok(f"{src}; no GPU to compare with")
    where = f"GPU memory {fmt_bytes(mem)}" + (f" (smallest of {ctx.n_gpus})" if ctx.n_gpus > 1 else "")
    per_gpu = ctx.ranks_on_a_gpu if ctx.shared_gpus else 1
    if per_gpu > 1:   # shared-GPU mode: every rank on a GPU has its own heap there
        src = f"{src} x {per_gpu} ranks on a GPU = {fmt_bytes(size * per_gpu)}"
        size *= per_gpu
    suggest = 1 << max(20, int(math.log2(mem * 0.5 / per_gpu)))
    fix = f"export NVSHMEM_SYMMETRIC_SIZE={fmt_bytes(suggest).replace(' ', '').replace('iB', '')}"
    if size > mem:
        return fail(f"{src} is larger than the {where}", fix)
    if size > HEAP_WARN_FRACTION * mem:
        return warn(f"{src} is {100 * size / mem:.0f}% of the {where}: little room is left for "
                    "ordinary tensors and kernels", fix)
    return ok(f"{src}, {100 * size / mem:.0f}% of the {where}")


@check('nvls',
       what="`NVSHMEM_DISABLE_NVLS=1` (tilescale does not use NVLink multicast)",
       symptom="NVSHMEM init fails in `team_internal_nvls` / `cuMemMap failed to map ... bytes`.",
       fix="`export NVSHMEM_DISABLE_NVLS=1` (launch.sh and `tilescale.init_distributed` set it by default).")
def check_nvls(ctx: Context) -> Check:
    v = os.environ.get("NVSHMEM_DISABLE_NVLS")
    if v is not None and v.strip().lower() in ("1", "true", "yes", "on", "y", "t"):
        return ok(f"NVSHMEM_DISABLE_NVLS={v}: NVLink multicast off")
    found = "NVSHMEM_DISABLE_NVLS unset" if v is None else f"NVSHMEM_DISABLE_NVLS={v!r}"
    return warn(f"{found}: NVSHMEM may map NVLink multicast (NVLS), which tilescale does not use; on shared "
                "machines it must stay off (multicast mapping can fail init)",
                "export NVSHMEM_DISABLE_NVLS=1")


@check('multicast',
       what="`NCCL_NVLS_ENABLE=0` and `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`",
       symptom="NCCL or torch symmetric memory sets up NVLink multicast, which fails or is forbidden on shared "
               "machines.",
       fix="`export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1`.")
def check_multicast(ctx: Context) -> Check:
    want = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    bad = {k: os.environ.get(k) for k, w in want.items() if os.environ.get(k, "").strip() != w}
    if not bad:
        return ok("NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
    found = ", ".join(f"{k} unset" if v is None else f"{k}={v!r}" for k, v in bad.items())
    return warn(f"{found}: NCCL / torch symmetric memory may use NVLink multicast",
                "export " + " ".join(f"{k}={want[k]}" for k in bad))


@check('module-loading',
       what="`CUDA_MODULE_LOADING=EAGER`",
       symptom="A kernel that waits on a signal hangs forever (lazy loading keeps the kernel that would set it "
               "from being loaded).",
       fix="`export CUDA_MODULE_LOADING=EAGER` before CUDA starts (launch.sh does).")
def check_module_loading(ctx: Context) -> Check:
    v = os.environ.get("CUDA_MODULE_LOADING")
    if v is not None and v.strip().upper() == "EAGER":
        return ok("CUDA_MODULE_LOADING=EAGER")
    found = ("CUDA_MODULE_LOADING unset (CUDA loads lazily; tilescale.init_distributed sets EAGER only if CUDA has "
             "not started yet)" if v is None else f"CUDA_MODULE_LOADING={v!r}")
    return warn(found + ": a kernel spinning on a signal can deadlock while the kernel that sets it waits "
                        "to be loaded", "export CUDA_MODULE_LOADING=EAGER   (launch.sh sets it)")
