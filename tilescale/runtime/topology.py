"""Which ranks share a node: the real grouping (the launcher's ranks per node) or, with
``TILESCALE_NODE_SIZE=k``, emulated nodes of k consecutive ranks on one host. Ranks are numbered node by
node (launch.sh and torchrun: ``rank = node_rank * ranks_per_node + local_rank``).

The device side reads the same number (``-DTILESCALE_NODE_SIZE`` in every distributed kernel's build,
``ops.cuh``'s ``peer_ptr_or_null``): a peer on another node gets no load/store mapping, so every op takes
its NVSHMEM API path to it, as it must across real nodes. Plans and the selector read :func:`current`.

    topo = topology.current()          # after tilescale.init_distributed()
    topo.nodes, topo.node_size, topo.node_of(rank), topo.same_node(a, b), topo.emulated
"""
from __future__ import annotations

from dataclasses import dataclass

from ..env import check_node_size, settings


@dataclass(frozen=True)
class Topology:
    """`world_size` ranks in ``world_size // node_size`` nodes of `node_size` consecutive ranks; `emulated`:
    the grouping comes from TILESCALE_NODE_SIZE, not from the launcher."""

    world_size: int
    node_size: int
    emulated: bool = False

    def __post_init__(self):
        check_node_size(self.node_size, self.world_size)

    @property
    def nodes(self) -> int:
        return self.world_size // self.node_size

    def node_of(self, rank: int) -> int:
        return rank // self.node_size

    def local_rank(self, rank: int) -> int:
        """The rank's index within its node."""
        return rank % self.node_size

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.node_size, (node + 1) * self.node_size))


def of(world_size: int, local_world_size: int | None = None) -> Topology:
    """The topology of a job of `world_size` ranks with `local_world_size` ranks per node (None: all on one
    node), unless TILESCALE_NODE_SIZE sets emulated nodes (checked: it must divide `world_size`)."""
    k = settings.node_size
    if k:
        return Topology(world_size, k, emulated=True)
    return Topology(world_size, local_world_size or world_size)


def current() -> Topology:
    """The topology of the running job (tilescale.init_distributed() first)."""
    from .. import runtime

    info = runtime.current().info
    return of(info.world_size, info.local_world_size)


def node_size_flag() -> int:
    """What kernels are built with (``-DTILESCALE_NODE_SIZE``, tilescale/compilation/backend.py reads the same setting):
    TILESCALE_NODE_SIZE, 0 when unset (the real topology: NVSHMEM's mappings decide)."""
    return settings.node_size
