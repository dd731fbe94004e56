"""Where the ranks of a job run and how torch.distributed starts for them (tilescale.init_distributed's
first steps): the launcher's variables, the CUDA device of each local rank (also the shared-GPU mode), the
backends of the process group."""
from __future__ import annotations

import os

from ..errors import TileScaleError


def device_map(local_world_size: int, num_gpus: int, ranks_per_gpu: int = 1) -> list[int]:
    """The CUDA device of each local rank: one rank per GPU while there are enough GPUs; otherwise (the
    shared-GPU mode, allowed up to `ranks_per_gpu` ranks per GPU) the ranks spread evenly over every GPU,
    neighbours together: 4 ranks on 2 GPUs -> [0, 0, 1, 1]; 3 ranks on 2 GPUs -> [0, 0, 1]."""
    if local_world_size < 1:
        raise TileScaleError(f"local world size {local_world_size}: expected at least 1 rank")
    if num_gpus < 1:
        raise TileScaleError(f"{local_world_size} rank(s) on this node but no visible GPU")
    if local_world_size <= num_gpus:
        return list(range(local_world_size))
    need = -(-local_world_size // num_gpus)   # ceil: the most ranks that one GPU must hold
    if need > ranks_per_gpu:
        raise TileScaleError(
            f"{local_world_size} ranks on this node but only {num_gpus} visible GPU(s): start at most {num_gpus} "
            f"processes per node (GPUS={num_gpus} bash launch.sh ...), or share GPUs for development and testing "
            f"with TILESCALE_RANKS_PER_GPU={need} (correct, but timings mean nothing)")
    return [r * num_gpus // local_world_size for r in range(local_world_size)]


def env_int(name: str, default: int | None = None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise TileScaleError(f"environment variable {name} is not set: start the job with "
                                 "`bash launch.sh your_script.py` or torchrun")
        return default
    try:
        return int(v)
    except ValueError:
        raise TileScaleError(f"{name}={v!r}: expected an integer") from None


def process_group_args(shared_gpu: bool, device: int) -> dict:
    """How init_distributed starts torch.distributed: gloo for CPU tensors and NCCL for CUDA tensors, or gloo
    alone when GPUs are shared (NCCL refuses two ranks on one GPU: "Duplicate GPU detected")."""
    import torch

    if shared_gpu:
        return {"backend": "gloo"}
    return {"backend": "cpu:gloo,cuda:nccl", "device_id": torch.device("cuda", device)}
