"""Ops over a process group (tilescale.runtime.team), without a GPU: a group's ranks as a team (start, stride,
size), the errors for groups tilescale cannot run, every rank's agreement on the groups, the kernels' code for a
group (lowered to CUDA, not run), GEMM+RS's path for a group, and the torch operators and async-TP drop-ins over
groups in a simulated world of threads (tests/torch_worlds.py). On GPUs: tests/gpu/groups_main.py."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_codegen import kernel_function, lower_source  # noqa: E402
from torch_worlds import ThreadWorld, randn, world_fixture  # noqa: E402, F401

from tilescale import errors, runtime  # noqa: E402
from tilescale.ops import (  # noqa: E402,E501
    all_to_all,
    allgather,
    allreduce,
    broadcast_from_root,
    checks,
    gemm_rs_path,
    reduce_scatter,
    reduce_to_root,
)
from tilescale.ops import gemm_reduce_scatter as grs  # noqa: E402
from tilescale.pytorch import async_tp, torch_ops  # noqa: E402
from tilescale.runtime import team  # noqa: E402
from tilescale.runtime.team import Team  # noqa: E402


# ---------------------------------------------------------------------------------------------------- teams
@pytest.mark.parametrize("ranks,want", [([0, 1], Team(0, 1, 2)), ([2, 3], Team(2, 1, 2)), ((1, 3), Team(1, 2, 2)),
                                        (range(0, 8, 4), Team(0, 4, 2)), ([5], Team(5, 1, 1))])
def test_evenly_spaced_ranks_are_a_team(ranks, want):
    t = team.of_ranks("Op", ranks, 8)
    assert t == want and t.ranks == tuple(ranks)
    assert [t.pe(i) for i in range(t.size)] == list(ranks) and [t.index(p) for p in ranks] == list(range(t.size))


@pytest.mark.parametrize("ranks,msg", [([0, 1, 3], "evenly spaced"), ([3, 1], "evenly spaced"), ([1, 1], "evenly"),
                                       ([0, 8], "ranks of the world"), ([], "ranks of the world"),
                                       ([True, 1], "ranks of the world")])
def test_other_rank_lists_are_refused_by_name(ranks, msg):
    with pytest.raises(errors.OpArgumentError, match=rf"Op: group: got ranks .*expected .*{msg}"):
        team.of_ranks("Op", ranks, 8)


def test_the_worlds_team_leaves_ranks_and_kernels_as_they_are():
    """The whole world's team maps a rank to itself (the very object: kernel expressions are left untouched), and
    its kernels take no team argument."""
    w = Team.world(4)
    marker = object()
    assert w.pe(marker) is marker and w.index(marker) is marker
    assert team.kernel_team(w, 4) is None and team.kernel_team(Team(0, 1, 2), 4) == Team(0, 1, 2)


def test_a_group_is_resolved_for_this_rank():
    assert team.resolve("Op", None, 3, 4) == Team(0, 1, 4)
    assert team.resolve("Op", [2, 3], 3, 4) == Team(2, 1, 2)
    with pytest.raises(errors.OpArgumentError, match=r"Op: group: got ranks \[0, 1\], expected a group that holds "
                                                     r"this rank \(3\)"):
        team.resolve("Op", [0, 1], 3, 4)
    with pytest.raises(errors.OpArgumentTypeError, match="Op: group: got float, expected None"):
        team.resolve("Op", 1.5, 0, 4)
    with pytest.raises(errors.OpArgumentError, match="Op: group: got the name 'nope', expected the name of a torch"):
        team.resolve("Op", "nope", 0, 4)

    class DeviceMesh:      # (torch's, as the resolver recognises it: by its type's name)
        ndim = 2

    with pytest.raises(errors.OpArgumentError, match="Op: group: got a DeviceMesh of 2 dimensions, expected a 1-D"):
        team.resolve("Op", DeviceMesh(), 0, 4)


@pytest.fixture
def fake_world():
    """init(W): a torch.distributed world of W ranks in this process, rank 0 of it (torch's fake backend)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(W):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=W)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_torch_process_group_is_its_ranks(fake_world):
    """A ProcessGroup, its name and a 1-D DeviceMesh of its ranks are the same team; torch's collectives get the
    ProcessGroup (torch_group); a list of ranks has none."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    fake_world(4)
    pg = dist.new_group([0, 2])
    dist.new_group([1, 3])
    assert team.resolve("Op", pg, 0, 4) == team.resolve("Op", pg.group_name, 0, 4) == Team(0, 2, 2)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert team.resolve("Op", mesh["tp"], 0, 4) == Team(0, 1, 2) and team.resolve("Op", mesh["dp"], 0, 4) == pg_team(0)
    assert team.torch_group(pg) is pg and team.torch_group(pg.group_name) is pg
    assert team.torch_group(None) is None and team.torch_group([1, 3]) is False
    with pytest.raises(errors.OpArgumentError, match=r"Op: group: got ranks \[0, 1, 3\], expected ascending, evenly"):
        team.resolve("Op", dist.new_group([0, 1, 3]), 0, 4)


def pg_team(start):
    return Team(start, 2, 2)


def test_an_ops_ranks_are_its_groups_or_the_worlds(monkeypatch):
    """team.size_of, the W of every function's checks: the world's size for no group (None without a runtime), else
    the group's, resolved and checked (a bad group: the op's argument error)."""
    assert team.size_of("op", None, 4) == 4 and team.size_of("op", [0, 1], None) is None
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(2, [(0, 2, 2), (1, 2, 2)] * 2))
    assert team.size_of("op", [0, 2], 4) == 2
    with pytest.raises(errors.OpArgumentError, match="op"):
        team.size_of("op", [0, 1, 3], 4)


def test_a_groups_team_is_remembered_until_finalize(monkeypatch):
    """of_group resolves a group once per runtime (a name, a list of ranks); finalize() forgets them, as a new job
    may give a name to other ranks."""
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(2, [(0, 2, 2), (1, 2, 2)] * 2))
    team._RESOLVED.clear()
    assert team.of_group("Op", [0, 2]) == Team(0, 2, 2) and ((0, 2), 2, 4) in team._RESOLVED
    assert team._RESOLVED.clear in runtime._at_finalize
    for hook in runtime._at_finalize:
        if hook == team._RESOLVED.clear:
            hook()
    assert not team._RESOLVED


@pytest.mark.parametrize("teams", [[(0, 1, 2)] * 2 + [(2, 1, 2)] * 2, [(0, 2, 2), (1, 2, 2)] * 2,
                                   [(0, 1, 4)] * 4])
def test_every_rank_agrees_on_its_group(teams):
    team.check_teams("Op", teams)


def test_a_rank_whose_group_differs_from_its_members_is_named():
    with pytest.raises(errors.CollectiveMismatchError,
                       match=r"Op: group: rank 0 passed the group of ranks \[0, 1\] but rank 1 passed ranks \[1, 3\]"):
        team.check_teams("Op", [(0, 1, 2), (1, 2, 2), (2, 1, 2), (1, 2, 2)])
    with pytest.raises(errors.CollectiveMismatchError, match=r"Op: group: got groups of sizes \[1, 3\]"):
        team.check_teams("Op", [(0, 1, 1), (1, 1, 3), (1, 1, 3), (1, 1, 3)])


class GroupRuntime:
    """Rank `rank` of a world of 4 whose ranks construct an op for the groups `teams` (every rank's (start,
    stride, size), as exchanged): the other ranks' contributions to the construction's all_gather are this rank's
    arguments with their own group."""

    def __init__(self, rank, teams):
        self.info = runtime.DistInfo(rank=rank, world_size=4, local_rank=rank, local_world_size=4)
        self.teams = teams

    def all_gather_object(self, obj):
        return [{**obj, checks._TEAM_KEY: t} if checks._TEAM_KEY in obj else obj for t in self.teams]


def _no_cuda(monkeypatch):
    """Op.arguments without a GPU: this device the CPU, no stream to order, no capture."""
    from tilescale.ops import base, capture

    monkeypatch.setattr(checks, "this_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(checks, "StreamOrder", lambda device: None)
    monkeypatch.setattr(base, "stream_getter", lambda: None)
    monkeypatch.setattr(capture, "construction_error", lambda op: None)


@pytest.mark.parametrize("group,teams", [([2, 3], [(0, 1, 2)] * 2 + [(2, 1, 2)] * 2),
                                         ([1, 3], [(0, 2, 2), (1, 2, 2)] * 2)])
def test_an_op_of_a_group_takes_its_size_and_rank(monkeypatch, group, teams):
    """Op.arguments: the op's world size and rank are its group's, its kernels' team that group (agreed)."""
    from tilescale.ops.base import Op

    _no_cuda(monkeypatch)
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(3, teams))
    op = object.__new__(Op)
    with op.arguments(shape=(4,), group=group):
        pass
    assert (op.world_size, op.rank, op.kernel_team, op.group) == (2, 1, team.of_ranks("Op", group, 4), group)
    assert op.pe(0) == group[0] and op.pe(1) == 3
    world = object.__new__(Op)
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(3, [(0, 1, 4)] * 4))
    with world.arguments(shape=(4,)):
        pass
    assert (world.world_size, world.rank, world.kernel_team) == (4, 3, None)


def test_an_op_whose_groups_disagree_raises_on_every_rank(monkeypatch):
    from tilescale.ops.base import Op

    _no_cuda(monkeypatch)
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(3, [(0, 1, 2), (0, 1, 2), (1, 2, 2), (2, 1, 2)]))
    op = object.__new__(Op)
    with pytest.raises(errors.CollectiveMismatchError, match=r"Op: group: rank 2 passed the group of ranks \[1, 3\]"):
        with op.arguments(shape=(4,), group=[2, 3]):
            pass


class SilentWorld(GroupRuntime):
    """A world whose other ranks never reach the construction: gloo's timeout (`message`)."""

    def __init__(self, message):
        super().__init__(1, [(0, 1, 2)] * 4)
        self.message = message

    def all_gather_object(self, obj):
        raise RuntimeError(self.message)


def test_an_op_that_other_ranks_never_construct_says_so(monkeypatch):
    """A rank waiting at an op's construction for ranks that never come (say, another group that constructs no such
    op) gets, at the control group's timeout, an error that names the op and says every rank constructs it; other
    errors of the exchange are left as they are."""
    from tilescale.ops.base import Op

    _no_cuda(monkeypatch)
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 300000ms for recv operation"
    monkeypatch.setattr(runtime, "current", lambda: SilentWorld(gloo))
    with pytest.raises(errors.CollectiveMismatchError, match=r"Op: not every rank of the world constructed this op "
                       r"within the control group's timeout \(.*Timed out.*\); every rank constructs each op at the "
                       r"same point .*this rank's group: ranks \[0, 1\]"):
        with object.__new__(Op).arguments(shape=(4,), group=[0, 1]):
            pass
    monkeypatch.setattr(runtime, "current", lambda: SilentWorld("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="^Connection closed by peer$"):
        with object.__new__(Op).arguments(shape=(4,), group=[0, 1]):
            pass


# -------------------------------------------------------------------------------------------------- kernels
def _code(fn, args) -> str:
    return kernel_function(lower_source(fn.get_tir(*args)))


@pytest.mark.parametrize("t,me,pe", [(Team(2, 1, 2), "(nvshmem_my_pe() - 2)", "+ 2)"),
                                     (Team(1, 2, 2), "((nvshmem_my_pe() - 1) >> 1)", "* 2) + 1)")])
def test_a_groups_kernels_address_its_ranks(t, me, pe):
    """AllGather's, ReduceScatter's and AllReduce's kernels for a group: this rank's index in it from its PE, and each
    peer's PE from its index in it; the world's kernels (no team) take NVSHMEM's PE as the rank and a peer's rank as
    its PE."""
    jobs = [*allgather.kernels(1 << 20, 2, "bfloat16"), *reduce_scatter.kernels(1 << 20, 2, "bfloat16", 132),
            *allreduce.kernels(1 << 20, 2, "bfloat16", 132)]        # (AllReduce: one-shot and two-shot)
    for fn, args in jobs:
        world, group = _code(fn, args), _code(fn, (*args, t))     # (AllGather adds its team so: AllGather.__init__)
        assert "int me = nvshmem_my_pe();" in world and f"int me = {me};" in group
        put = [ln for ln in group.splitlines() if "tilescale::put_signal<" in ln]
        assert put and all(pe in ln for ln in put), put      # (the put's last argument: the peer's PE)
        assert world.replace("nvshmem_my_pe()", me) != group     # (the peers' PEs differ too)


@pytest.mark.parametrize("mod", [broadcast_from_root, reduce_to_root])
def test_a_groups_root_is_a_rank_of_the_group(mod):
    """Broadcast's and Reduce's kernels for a group (ranks 1 and 3): this rank's index from its PE, and the root (a
    run-time rank of the group) and every peer reached at their PEs, 1 + 2 x their rank."""
    [(fn, args)] = mod.kernels(1 << 20, 2, "bfloat16", 132)
    [(_, args_t)] = mod.kernels(1 << 20, 2, "bfloat16", 132, team=Team(1, 2, 2))
    world, group = _code(fn, args), _code(fn, args_t)
    assert "int me = nvshmem_my_pe();" in world and "int me = ((nvshmem_my_pe() - 1) >> 1);" in group
    assert "((root * 2) + 1)" in group and "((root * 2) + 1)" not in world
    assert group.count("* 2) + 1)") > world.count("* 2) + 1)")


@pytest.mark.parametrize("fn,arg", [("broadcast", "src"), ("reduce", "dst")])
def test_a_functions_root_must_be_in_its_group(monkeypatch, fn, arg):
    """broadcast / reduce with a group: the root is a world rank (torch's `src` / `dst`), one of the group's."""
    monkeypatch.setattr(runtime, "current", lambda: GroupRuntime(0, [(0, 2, 2), (1, 2, 2)] * 2))
    monkeypatch.setattr(checks, "check_tensor", lambda *a, **k: None)     # (a CUDA tensor's checks)
    mod = broadcast_from_root if fn == "broadcast" else reduce_to_root
    t = torch.zeros(4, dtype=torch.float32)
    args = (t, 1, 4, [0, 2]) if fn == "broadcast" else (t, 1, "sum", 4, [0, 2])
    with pytest.raises(errors.OpArgumentError, match=rf"{fn}: {arg}: got 1, expected a rank of the group "
                                                     r"\(ranks \[0, 2\]\)"):
        mod._validate_fn(*args)
    mod._validate_fn(*((t, 2, 4, [0, 2]) if fn == "broadcast" else (t, 2, "sum", 4, [0, 2])))


def test_all_to_all_of_a_group_sends_to_its_ranks():
    [(fn, args)] = all_to_all.kernels(1 << 20, 2, None, 132)
    [(_, args_t)] = all_to_all.kernels(1 << 20, 2, None, 132, team=Team(2, 1, 2))
    world, group = _code(fn, args), _code(fn, args_t)
    assert "int me = nvshmem_my_pe();" in world and "int me = (nvshmem_my_pe() - 2);" in group
    assert group.count("& 1) + 2)") - world.count("& 1) + 2)") == 2     # (the ready flag's PE and the put's)


def _splits(send, recv, team_=None):
    return dict(send=send, recv=recv, err=None, row=(8,), dtype="torch.bfloat16", team=team_)


def test_all_to_all_splits_are_checked_within_each_group():
    """all_to_all_single's split sizes over two groups ([0, 2], [1, 3]): every rank checks every group's pairs (the
    same verdict everywhere), naming world ranks; a pair across groups is not one."""
    g0, g1 = (0, 2, 2), (1, 2, 2)
    ok = [_splits([1, 2], [1, 3], g0), _splits([5, 6], [5, 7], g1), _splits([3, 4], [2, 4], g0),
          _splits([7, 8], [6, 8], g1)]
    for rank in range(4):
        all_to_all.check_splits(ok, rank)
    bad = list(ok)
    bad[2] = _splits([3, 4], [9, 4], g0)        # rank 2 expects 9 rows from its group's rank 0 (world rank 0)
    for rank in range(4):
        with pytest.raises(errors.CollectiveMismatchError, match=r"rank 0 sends 2 rows to rank 2 \(its "
                           r"input_split_sizes\[1\]\) but rank 2 expects 9 \(its output_split_sizes\[0\]\)"):
            all_to_all.check_splits(bad, rank)


def test_gemm_rs_reduction_of_a_group_reads_its_peers_at_their_pes():
    """The pull path's reduction (ranks of other nodes, or shared GPUs): its waits, mapped loads and NVSHMEM gets
    name a peer s of the group as PE start + stride * s."""
    _, (fn, args) = grs.kernels(2048, 2048, 1024, 2, "bfloat16", path="pull")
    _, (fn_t, args_t) = grs.kernels(2048, 2048, 1024, 2, "bfloat16", path="pull", team=Team(1, 2, 2))
    world, group = _code(fn, args), _code(fn_t, args_t)
    assert "((nvshmem_my_pe() - 1) >> 1)" in group
    for call in ("tilescale::wait_until_pe", "tilescale::peer_reachable", "tilescale::get"):
        assert call in world and call in group, call
    assert group.count("* 2) + 1)") >= 3 and world.count("* 2) + 1)") == 0


def test_gemm_rs_takes_the_push_path_for_a_group_on_one_node(monkeypatch):
    """Push needs every rank of the op's group on this node: a group across two (emulated) nodes pulls, one within
    a node pushes, whatever the world spans."""
    from tilescale.env import settings
    from tilescale.runtime import topology

    info = runtime.DistInfo(rank=0, world_size=4, local_rank=0, local_world_size=4)
    monkeypatch.setattr(runtime, "current", lambda: type("R", (), {"info": info})())
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)
    monkeypatch.setattr(runtime, "shares_gpu", lambda: False)
    with settings.scope(node_size=2):
        assert topology.current().nodes == 2
        assert gemm_rs_path.default_path(2, team=Team(0, 1, 2)) == "push"
        assert gemm_rs_path.default_path(2, team=Team(0, 2, 2)) == "pull"
        assert gemm_rs_path.default_path(4) == "pull"


@pytest.mark.parametrize("node_size", [4, 2])
def test_every_choice_of_gemm_rs_path_for_a_group_follows_the_groups_nodes(monkeypatch, node_size):
    """The group's kernels (GemmRS's, the prebuild's, the torch operator's check of the fused path) choose the path
    by the group's ranks: one node (4 ranks a node) pushes; a group across two nodes (2 a node, ranks 0 and 2) pulls;
    none reads the group's size as the world's (TILESCALE_NODE_SIZE=4 did not divide it: SettingError on GPUs)."""
    from tilescale.env import settings
    from tilescale.ops import prebuild

    info = runtime.DistInfo(rank=0, world_size=4, local_rank=0, local_world_size=4)
    monkeypatch.setattr(runtime, "current", lambda: type("R", (), {"info": info})())
    monkeypatch.setattr(runtime, "is_initialized", lambda: True)
    monkeypatch.setattr(runtime, "shares_gpu", lambda: False)
    t, want = Team(0, 2, 2), "push" if node_size == 4 else "pull"
    name = lambda jobs: {getattr(fn, "func", fn).__name__ for fn, _ in jobs}   # noqa: E731
    with settings.scope(node_size=node_size):
        assert ("gemm_rs_push_kernel" in name(grs.kernels(1024, 1024, 1024, 2, "bfloat16", team=t))) == (want == "push")
        for cached in (False, True):
            jobs = prebuild.gemm_rs_jobs([(1024, 2048, 1024)], 2, "bfloat16", cached=cached, team=t)
            assert ("gemm_rs_push_kernel" in name(jobs)) == (want == "push")
        monkeypatch.setattr(team, "of_group", lambda op, group: {"tp": t}[group])
        assert torch_ops.why_not_fused("gemm_rs", 128, 1024, 1024, torch.bfloat16, 2, "tp") is None


# ------------------------------------------------------------------------------- torch operators, drop-ins
GROUPS = {"contiguous": {"tp0": [0, 1], "tp1": [2, 3]}, "strided": {"tp0": [0, 2], "tp1": [1, 3]}}


def _tp_world(world, layout):
    w = world(ThreadWorld(4))
    w.groups.update(GROUPS[layout])
    return w, {r: next(n for n, ranks in GROUPS[layout].items() if r in ranks) for r in range(4)}


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_torch_ops_over_tp_groups_gather_and_reduce_within_each(world, layout):
    """Two TP groups of 2 in a world of 4: every rank's ag_gemm gathers its group's rows only (in group-rank
    order), gemm_rs sums over its group only; the backward of each runs over the same group."""
    w, name = _tp_world(world, layout)
    a = [randn(4, 8, seed=r) for r in range(4)]
    b = randn(8, 6, seed=10)
    x = [randn(4, 8, seed=20 + r) for r in range(4)]
    wt = randn(8, 16, seed=30)

    def body(r):
        ar, xr = a[r].clone().requires_grad_(), x[r].clone().requires_grad_()
        c = torch_ops.ag_gemm(ar, b, group=name[r])
        y = torch_ops.gemm_rs(xr, wt, group=name[r])
        (c.sum() + y.sum()).backward()
        return c, y, ar.grad, xr.grad

    got = w.run(body)
    for r in range(4):
        members = GROUPS[layout][name[r]]
        i = members.index(r)
        c, y, da, dx = got[r]
        assert torch.allclose(c, torch.cat([a[q] for q in members]) @ b)
        assert torch.allclose(y, sum(x[q] @ wt for q in members).chunk(2)[i], atol=1e-5)
        # d(sum c)/d a_r: rank r's rows of the ones @ b^T, summed over its group's 2 ranks (each uses a_r once)
        assert torch.allclose(da, 2 * torch.ones(4, 6) @ b.t(), atol=1e-5)
        assert torch.allclose(dx, torch.ones(4, 16) @ wt.t(), atol=1e-5)   # all_gather of ones over the group
    assert w.calls and all(c.endswith(f" {name[0]}") for c in w.calls), w.calls    # (rank 0's: its group's)


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_drop_ins_serve_an_evenly_spaced_tp_group(world, layout):
    """torch's async-TP ops with a TP group's name run on tilescale over that group (not on torch's op)."""
    w, name = _tp_world(world, layout)
    a = [randn(2, 4, 8, seed=r) for r in range(4)]
    b = randn(8, 6, seed=10)

    def body(r):
        A, (c,) = async_tp.fused_all_gather_matmul(a[r], [b], 0, name[r])
        y = async_tp.fused_matmul_reduce_scatter(a[r], b, "sum", 1, name[r])
        return A, c, y

    got = w.run(body)
    for r in range(4):
        members = GROUPS[layout][name[r]]
        A, c, y = got[r]
        assert torch.equal(A, torch.cat([a[q] for q in members]))
        assert torch.allclose(c, A @ b)
        want = sum(a[q] @ b for q in members).chunk(2, dim=1)[members.index(r)]    # (2, 2, 6): dim 1 scattered
        assert y.shape == want.shape and torch.allclose(y, want, atol=1e-5)
    assert w.calls and all(c.endswith(f" {name[0]}") for c in w.calls), w.calls


def test_a_group_name_of_ranks_not_evenly_spaced_goes_to_torch(world, monkeypatch):
    """A group tilescale cannot address by start and stride runs torch's op, which says why (debug log)."""
    w = world(ThreadWorld(4))
    seen = []

    class SymmMem:
        def fused_all_gather_matmul(self, *a, **k):
            seen.append(a[3])
            return None, []

    monkeypatch.setattr(torch.ops, "symm_mem", SymmMem(), raising=False)
    w.local.rank = 0
    async_tp.fused_all_gather_matmul(randn(4, 8), [randn(8, 4)], 0, "odd")
    assert seen == ["odd"] and not w.calls


def test_torch_ops_take_a_group_by_name_process_group_or_mesh():
    class PG:
        group_name = "tp7"

    class DeviceMesh:
        def get_group(self):
            return PG()

    assert torch_ops.group_name(None) == "" and torch_ops.group_name("tp7") == "tp7"
    assert torch_ops.group_name(PG()) == "tp7" and torch_ops.group_name(DeviceMesh()) == "tp7"
    with pytest.raises(TypeError, match=r"group: got .*expected None \(the whole world\), a torch.distributed"):
        torch_ops.group_name([0, 1])


def test_a_groups_kernel_runs_in_a_world_larger_than_the_group(monkeypatch):
    """A kernel compiled with a team takes the group's size as its world size: its first launch checks that the job
    holds the team's ranks, not that the job's world is the group's (a world-of-2 kernel in a job of 4 still
    raises)."""
    from types import SimpleNamespace

    from tilescale.compilation.backend import BackendSpec
    from tilescale.runtime.distributed_kernel import DistributedKernel

    args = (2, 16, "bfloat16", 512)
    assert allgather.allgather_kernel._peers(args, {}) == {"world_size": 2, "team": None}
    assert allgather.allgather_kernel._peers((*args, Team(1, 2, 2)), {}) == {"world_size": 2, "team": Team(1, 2, 2)}
    loaded = []
    monkeypatch.setattr(runtime, "init_module", lambda lib, name: loaded.append(name))
    monkeypatch.setattr(runtime, "current", lambda: SimpleNamespace(info=SimpleNamespace(world_size=4)))
    monkeypatch.setattr("tilescale.compat.kernel_library", lambda k: None)
    spec = BackendSpec("cython", True, "inlined", "test")

    def kernel(team):
        return DistributedKernel(None, spec, "allgather", ["x"], [], 2, True, team=team)

    kernel(Team(1, 2, 2)).prepare()
    kernel(Team(2, 1, 2)).prepare()
    assert loaded == ["allgather", "allgather"]
    with pytest.raises(errors.WorldSizeMismatchError, match=r"group of ranks 3, 4, \.\.\. 4 but this job has 4"):
        kernel(Team(3, 1, 2)).prepare()
    with pytest.raises(errors.WorldSizeMismatchError, match="compiled for world_size=2 but this job has 4 ranks"):
        kernel(None).prepare()
    import tilescale

    pf = allgather.allgather_kernel.get_tir(*args)
    with pytest.raises(TypeError, match=r"tilescale.compile: team: got tuple, expected None \(the whole world\) or a "
                                        r"tilescale.runtime.team.Team"):
        tilescale.compile(pf, world_size=2, team=(1, 2, 2))


# ------------------------------------------------------------------------------------------------ on GPUs
def test_the_tiers_prebuild_compiles_each_groups_kernels(monkeypatch):
    """tests/gpu/prebuild_tier.py at 4 ranks lists, for each group of the GPU test's two layouts, the kernel of every
    op it runs with that group's team (a compile-time argument: each group's kernels are its own), and a group's
    fused-op kernels are the world-of-2 ones plus the team."""
    import importlib

    from tilescale.ops import prebuild

    monkeypatch.setattr(sys, "path", list(sys.path))     # (prebuild_tier puts the examples' folders first)
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    tier, groups_main = importlib.import_module("prebuild_tier"), importlib.import_module("groups_main")
    listed = tier.jit_jobs(4)
    teams = {Team(0, 1, 2), Team(2, 1, 2), Team(0, 2, 2), Team(1, 2, 2)}
    kinds = {"allgather_kernel", "reduce_scatter_kernel", "allreduce_one_shot_kernel", "allreduce_two_shot_kernel",
             "broadcast_kernel", "reduce_kernel", "all_to_all_kernel", "ag_gemm_kernel", "gemm_rs_push_kernel"}
    for t in teams:
        mine = [(fn, args) for fn, args in listed if args and args[-1] == t]
        assert {getattr(fn, "func", fn).__name__ for fn, _ in mine} == kinds, t
        fused = {(getattr(fn, "func", fn).__name__, args[:-1]) for fn, args in mine}
        shape = [(2 * groups_main.ROWS, groups_main.K, groups_main.N)]
        world2 = prebuild.ag_gemm_jobs(shape, 2) + prebuild.gemm_rs_jobs(shape, 2)
        assert {(getattr(fn, "func", fn).__name__, args) for fn, args in world2} <= fused, t
    assert not [args for _, args in tier.jit_jobs(2) if args and isinstance(args[-1], Team)]   # (no groups at 2)



@pytest.mark.multigpu
@pytest.mark.parametrize("nranks", [4])
def test_ops_over_two_groups_on_gpus(nranks):
    from tilescale import testing

    testing.skip_unless_ranks(nranks)
    proc = testing.launch(Path(__file__).resolve().parent / "gpu" / "groups_main.py", nranks, timeout=500)
    testing.assert_all_ranks_ok(proc, nranks, marker="OK: collectives and fused ops over groups")
