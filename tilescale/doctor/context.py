"""What the checks share: the requested GPU count and facts probed once, on first use."""
from __future__ import annotations

from functools import cached_property

from ..compilation import discovery
from ..env import settings


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
            return settings.ranks_per_gpu
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
        try:
            return discovery.find_nvshmem()
        except Exception as e:  # noqa: BLE001  (NvshmemNotFoundError, or an invalid setting)
            self.install_error = e
            return None
