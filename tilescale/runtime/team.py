"""Teams: the ranks an op runs among. A team is a strided set of the world's ranks (NVSHMEM's strided teams):
``start, start + stride, ..., start + (size - 1) * stride``, its rank i being world rank ``pe(i)``::

    tp = torch.distributed.new_group([0, 1])          # every rank makes every group, as torch requires
    op = tilescale.ops.AGGemm(M, N, K, torch.bfloat16, group=tp)     # or group=mesh["tp"] (a 1-D DeviceMesh)

An op built for a team sizes its buffers and kernels by the team's size and addresses its peer i as PE ``pe(i)``;
``op.world_size`` and ``op.rank`` are the team's. Its kernels take the team as a compile-time argument
(:func:`kernel_team`: None for the whole world, whose kernels are those of an op without a group), so the members
of a team share their kernels and each team has its own.

Constructing an op for a team is collective over the whole world: its symmetric buffers are allocated by every rank
of the world (NVSHMEM's heap), so every rank constructs the same op, each for its own team, at the same point of
the program, as the tensor-parallel groups of a DP x TP program do. Its calls involve the team's ranks only (the
call checks agree once per argument signature over the world: every team makes the same calls).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CollectiveMismatchError, OpArgumentError, OpArgumentTypeError
from . import at_finalize


@dataclass(frozen=True)
class Team:
    """World ranks ``start + stride * i`` for i < `size`."""

    start: int
    stride: int
    size: int

    @classmethod
    def world(cls, world_size: int) -> Team:
        return cls(0, 1, world_size)

    def pe(self, i):
        """World rank (PE) of team rank `i`: an int, or an expression of the kernel's when `i` is one; the world's
        team returns `i` itself (its kernels' code is that of an op without a group)."""
        return i if (self.start, self.stride) == (0, 1) else self.start + self.stride * i

    def index(self, pe):
        """Team rank of world rank `pe` (a member), as :meth:`pe`'s inverse (int or kernel expression)."""
        if (self.start, self.stride) == (0, 1):
            return pe
        return (pe - self.start) // self.stride

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.start + self.stride * i for i in range(self.size))

    def __contains__(self, pe: int) -> bool:
        return pe in self.ranks

    def __str__(self) -> str:
        return f"ranks {list(self.ranks)}"


def kernel_team(team: Team, world_size: int) -> Team | None:
    """The compile-time team argument of a kernel: None for the whole world."""
    return None if team == Team.world(world_size) else team


def of_ranks(op: str, ranks, world_size: int) -> Team:
    """The team of world ranks `ranks` (in team-rank order: ascending and evenly spaced)."""
    ranks = tuple(ranks)
    if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world_size for r in ranks):
        raise OpArgumentError(f"{op}: group: got ranks {list(ranks)}, expected ranks of the world (0 .. "
                              f"{world_size - 1})")
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if stride < 1 or any(b - a != stride for a, b in zip(ranks, ranks[1:], strict=False)):
        raise OpArgumentError(f"{op}: group: got ranks {list(ranks)}, expected ascending, evenly spaced ranks "
                              "(start, start + stride, ...): tilescale addresses a group's ranks by start and stride")
    return Team(ranks[0], stride, len(ranks))


def resolve(op: str, group, rank: int, world_size: int) -> Team:
    """This rank's team for `group`: None (the whole world), a torch.distributed ProcessGroup, a group's name (as
    torch's ``group_name`` arguments), a 1-D DeviceMesh, or a sequence of world ranks. This rank must be one of
    them."""
    if group is None:
        return Team.world(world_size)
    if isinstance(group, (list, tuple, range)):
        team = of_ranks(op, group, world_size)
    else:
        team = of_ranks(op, _torch_group_ranks(op, group), world_size)
    if rank not in team:
        raise OpArgumentError(f"{op}: group: got {team}, expected a group that holds this rank ({rank}): an op is "
                              "constructed by the ranks of its group")
    return team


def _torch_group_ranks(op: str, group) -> list[int]:
    import torch.distributed as dist

    from .. import compat

    if type(group).__name__ == "DeviceMesh":
        if group.ndim != 1:
            raise OpArgumentError(f"{op}: group: got a DeviceMesh of {group.ndim} dimensions, expected a 1-D one "
                                  "(a dimension of it, as mesh['tp'])")
        group = group.get_group()
    elif isinstance(group, str):
        try:
            group = compat.resolve_process_group(group)
        except Exception as e:  # noqa: BLE001  (torch's error for an unknown name varies by version)
            raise OpArgumentError(f"{op}: group: got the name {group!r}, expected the name of a torch.distributed "
                                  f"process group ({e})") from e
    if not isinstance(group, dist.ProcessGroup):
        raise OpArgumentTypeError(f"{op}: group: got {type(group).__name__}, expected None (the whole world), a "
                                  "torch.distributed ProcessGroup, its name, a 1-D DeviceMesh or a list of ranks")
    return dist.get_process_group_ranks(group)


def check_teams(op: str, teams: list) -> None:
    """Raise CollectiveMismatchError unless every rank's team (`teams[r]`: (start, stride, size) of rank r, as
    gathered from every rank) is the one its members passed and every team has the same size: the ops' symmetric
    buffers are sized by it and allocated by the whole world at once."""
    mine = [Team(*t) for t in teams]
    for r, t in enumerate(mine):
        other = next((m for m in t.ranks if m < len(mine) and mine[m] != t), None)
        if other is not None:
            raise CollectiveMismatchError(
                f"{op}: group: rank {r} passed the group of {t} but rank {other} passed {mine[other]}: every rank "
                "of a group passes the same group")
    sizes = sorted({t.size for t in mine})
    if len(sizes) > 1:
        raise CollectiveMismatchError(
            f"{op}: group: got groups of sizes {sizes} ({', '.join(f'rank {r}: {t}' for r, t in enumerate(mine))}), "
            "expected groups of one size: the ops' symmetric buffers are allocated by every rank of the world alike")


# of_group's teams by (group, rank, world size), forgotten by finalize(): a new job may reuse a group's name
_RESOLVED: dict = {}
at_finalize(_RESOLVED.clear)


def of_group(op: str, group) -> Team:
    """:func:`resolve` for this rank of the runtime, remembered per group (a function's call resolves its group once;
    None costs one lookup)."""
    from . import current

    info = current().info
    key = (tuple(group) if isinstance(group, (list, range)) else group, info.rank, info.world_size)
    try:
        return _RESOLVED[key]
    except (KeyError, TypeError):
        pass
    team = resolve(op, group, info.rank, info.world_size)
    try:
        _RESOLVED[key] = team
    except TypeError:   # an unhashable group: resolved every time
        pass
    return team


def size_of(op: str, group, world_size: int | None) -> int | None:
    """How many ranks an op over `group` runs among: `world_size` (the runtime's; None without one: nothing to resolve)
    for the whole world (None), else the group's size (:func:`of_group`: a bad group raises `op`'s argument error)."""
    return world_size if world_size is None or group is None else of_group(op, group).size


def torch_group(group):
    """The torch.distributed ProcessGroup of `group` for torch's collectives (None: the default group, for None);
    a sequence of ranks has none: ``False``."""
    if group is None:
        return None
    if isinstance(group, (list, tuple, range)):
        return False
    if type(group).__name__ == "DeviceMesh":
        return group.get_group()
    if isinstance(group, str):
        from .. import compat

        return compat.resolve_process_group(group)
    return group
