"""Checks of the GPUs: how many are visible against the ranks asked for, peer access between them, and
whether ranks may share them (shared-GPU mode)."""
from __future__ import annotations

import os

from ..version import TORCH_REQUIREMENT
from . import probes
from .check import Check, check, fail, ok, warn
from .context import Context

NO_GPU = "no GPU visible"     # how the gpus check's finding starts on a machine that can only compile


@check('gpus',
       what="GPUs visible to torch versus the ranks requested (--gpus N)",
       symptom="`invalid device ordinal`, `LOCAL_RANK=... but this node has N visible GPU(s)`, or `tilescale run` "
               "refusing `-n` / `GPUS`.",
       fix="Ask for at most as many ranks as `torch.cuda.device_count()` reports (`tilescale run -n N ...`); "
           "check `CUDA_VISIBLE_DEVICES`; or share GPUs (see `shared-gpu`). On a machine without GPUs tilescale "
           "only compiles.")
def check_gpus(ctx: Context) -> Check:
    if ctx.torch is None:
        return fail(f"torch cannot be imported: {ctx.torch_error}",
                    f"pip install '{TORCH_REQUIREMENT}' (a CUDA build; see the README's install)")
    count = ctx.gpu_count
    cpu_build = getattr(ctx.torch.version, "cuda", None) is None
    torch_desc = f"torch {ctx.torch.__version__}" + (" is a CPU-only build" if cpu_build else "")
    if count == 0:
        if ctx.gpus:
            fix = (f"run on a machine with {ctx.gpus} GPUs (this one can only compile: tilescale run -n {ctx.gpus} "
                   "script.py compiles the kernels without running them)")
            if cpu_build:
                fix += "; torch here is CPU-only: pip install torch --index-url https://download.pytorch.org/whl/cu130"
            elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
                fix += "; or unset CUDA_VISIBLE_DEVICES"
            return fail(f"{NO_GPU}, {ctx.gpus} requested ({probes.visible_devices()}; {torch_desc})", fix)
        return warn(f"{NO_GPU}: compile-only machine ({probes.visible_devices()}; {torch_desc})",
                    "kernels compile here; run them on a machine with GPUs (tilescale run -n N script.py)")
    names = ctx.gpu_names
    kinds = sorted(set(names))
    desc = ", ".join(f"{names.count(k)} x {k}" for k in kinds) if names else "names unknown"
    if ctx.gpus and count < ctx.gpus:
        if ctx.shared_gpus:
            return ok(f"{count} GPU(s) visible, {ctx.gpus} requested: {desc}; shared, up to "
                      f"{ctx.ranks_on_a_gpu} ranks per GPU (see shared-gpu) ({probes.visible_devices()})")
        fix = f"ask for at most {count}: tilescale run -n {count} ... (or --gpus {count})"
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            fix += f", or list {ctx.gpus} devices in CUDA_VISIBLE_DEVICES (or unset it)"
        fix += (f", or share GPUs (correctness only): TILESCALE_RANKS_PER_GPU={ctx.ranks_on_a_gpu}")
        return fail(f"{count} GPU(s) visible, {ctx.gpus} requested ({probes.visible_devices()})", fix)
    req = f", {ctx.gpus} requested" if ctx.gpus else ""
    return ok(f"{count} GPU(s) visible{req}: {desc} ({probes.visible_devices()})")


@check('peer-access',
       what="CUDA peer access between every pair of the GPUs used",
       symptom="NVSHMEM init fails, or `nvshmem_ptr` returns NULL for a peer on the same node.",
       fix="Use GPUs that can reach each other (`nvidia-smi topo -m`; select them with `CUDA_VISIBLE_DEVICES`); "
           "in VMs and containers enable P2P on the host.")
def check_peer_access(ctx: Context) -> Check:
    g = ctx.n_gpus
    if g == 0:
        return ok("skipped: no GPUs")
    if g == 1:
        return ok("1 GPU: no pair to check")
    rows, missing = [], []
    for i in range(g):
        row = ""
        for j in range(g):
            if i == j:
                row += "."
                continue
            reach = probes.can_access_peer(i, j)
            row += "Y" if reach else "n"
            if not reach:
                missing.append(f"{i}->{j}")
        rows.append(row)
    matrix = f"matrix over GPUs 0..{g - 1} (row i, column j: i can access j): " + " ".join(rows)
    if missing:
        return fail(f"no peer access for {', '.join(missing)}; {matrix}",
                    "NVSHMEM's intra-node transport needs P2P between every pair: choose GPUs that can reach each "
                    "other with CUDA_VISIBLE_DEVICES (see `nvidia-smi topo -m`); in a VM or container enable P2P "
                    "(IOMMU/ACS settings of the host)")
    return ok(f"every pair has peer access; {matrix}")


@check('shared-gpu',
       what="with more ranks than GPUs (--gpus N), whether `TILESCALE_RANKS_PER_GPU` lets them "
            "share GPUs (shared-GPU mode: ceil(N / GPUs) ranks per GPU at most that setting)",
       symptom="`tilescale run` refusing `-n` / `GPUS` above the GPUs found; in shared-GPU mode, timings that mean "
               "nothing or NCCL errors (ranks sharing a GPU use gloo for torch.distributed).",
       fix="`export TILESCALE_RANKS_PER_GPU=<ceil(N / GPUs)>` to develop and test N ranks on fewer GPUs "
           "(correct, but not for timings), or ask for `GPUS` <= the GPUs found.")
def check_shared_gpu(ctx: Context) -> Check:
    rpg = ctx.ranks_per_gpu
    if rpg is None:
        return fail(str(ctx.ranks_per_gpu_error or "TILESCALE_RANKS_PER_GPU is invalid"),
                    "unset TILESCALE_RANKS_PER_GPU (1 rank per GPU), or set it to a whole number >= 1")
    setting = f"TILESCALE_RANKS_PER_GPU={rpg}" + ("" if "TILESCALE_RANKS_PER_GPU" in os.environ else " (default)")
    g = ctx.gpu_count
    if g == 0:
        return ok(f"skipped: no GPU (compile-only); {setting}")
    if not ctx.gpus:
        if rpg > 1:
            return ok(f"{setting}: runs may put up to {rpg} ranks on each of the {g} GPU(s) "
                      "(--gpus N says whether one does)")
        return ok(f"one rank per GPU ({setting}; {g} GPU(s) visible)")
    if ctx.gpus <= g:
        return ok(f"one rank per GPU: {ctx.gpus} rank(s), {g} GPU(s) visible ({setting})")
    need = ctx.ranks_on_a_gpu
    if need <= rpg:
        return ok(f"shared-GPU mode: {ctx.gpus} ranks on {g} GPU(s), up to {rpg} per GPU; "
                  "torch.distributed on gloo only, NVSHMEM multiple-processes-per-GPU; timings mean "
                  "nothing")
    return fail(f"{ctx.gpus} ranks on {g} GPU(s) need {need} per GPU, {setting} allows {rpg}",
                f"set TILESCALE_RANKS_PER_GPU={need} to share GPUs (correctness only) or ask for GPUS<={g}")
