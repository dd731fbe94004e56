"""tilescale.topology: nodes of the launcher's size, or emulated ones (TILESCALE_NODE_SIZE)."""
import pytest

from tilescale import topology
from tilescale.errors import SettingError


def test_real_topology_is_the_launchers(menv):
    t = topology.of(16, 8)
    assert (t.nodes, t.node_size, t.emulated) == (2, 8, False)
    assert [t.node_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert t.same_node(3, 4) and not t.same_node(7, 8)
    assert topology.of(4).nodes == 1           # no local size: one node
    assert topology.node_size_flag() == 0


def test_emulated_nodes_group_consecutive_ranks(menv):
    menv.setenv("TILESCALE_NODE_SIZE", "2")
    t = topology.of(4, 4)
    assert (t.nodes, t.node_size, t.emulated) == (2, 2, True)
    assert t.node_ranks(1) == [2, 3] and t.local_rank(3) == 1
    assert topology.node_size_flag() == 2
    menv.setenv("TILESCALE_NODE_SIZE", "1")     # forced remote: every rank its own node
    assert topology.of(4, 4).nodes == 4


@pytest.mark.parametrize("raw", ["3", "0", "two"])
def test_a_node_size_that_cannot_group_the_ranks_is_refused(menv, raw):
    menv.setenv("TILESCALE_NODE_SIZE", raw)
    with pytest.raises(SettingError, match="TILESCALE_NODE_SIZE"):
        topology.of(4, 4)


def test_init_distributed_refuses_a_node_size_that_does_not_divide_the_world(menv):
    """Checked first, on every rank alike (each reads the same setting and world size): before CUDA, NCCL or
    NVSHMEM start, so no rank waits for one that raised, and the plain collectives never run on uneven
    'nodes' (they would stay correct, and nothing would say the setting was wrong)."""
    import tilescale

    for k, v in {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1",
                 "TILESCALE_NODE_SIZE": "3"}.items():
        menv.setenv(k, v)
    with pytest.raises(SettingError, match=r"TILESCALE_NODE_SIZE=3: .*divides the world size 4"):
        tilescale.init_distributed()
    assert not tilescale.is_initialized()
