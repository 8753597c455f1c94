"""torchrun's environment variables for the members of a mesh: pure, no torch.

A training script written for ``torchrun`` reads RANK, WORLD_SIZE, LOCAL_RANK, ... and calls
``init_process_group()``. hpcmesh writes the same variables into its processes: at spawn (the
whole ProcMesh is one world) and again from ``hpcmesh.spmd.setup_torch_elastic_env`` (any view
of it: a world of its own). The local numbering follows torchrun's: the members of a world on
one host, in world order, are LOCAL_RANK 0..n-1 of that host, and the hosts, in order of their
first member, are GROUP_RANK 0..g-1.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: Every variable ``torchrun_env`` writes; ``hpcmesh.spmd`` clears them all before a new world.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                 "MASTER_ADDR", "MASTER_PORT")

#: torchrun's default role name (``--role``).
DEFAULT_ROLE = "default"

#: Set in every member by ``hpcmesh.spmd.setup_torch_elastic_env``: the world's id (so
#: ``hpcmesh.collectives`` forms that world, not one of its own) and its dims, ``hosts=2,gpus=4``.
WORLD_ID_VAR = "HPCMESH_TORCH_WORLD"
WORLD_EXTENT_VAR = "HPCMESH_TORCH_WORLD_EXTENT"


@dataclass(frozen=True)
class MemberPlace:
    """Where one member of a world sits: its ranks globally and on its host."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int


def places(host_of_member: Sequence[Hashable]) -> list[MemberPlace]:
    """The place of each member, given the host of each member in world (rank) order."""
    by_host: dict[Hashable, list[int]] = {}
    for rank, host in enumerate(host_of_member):
        by_host.setdefault(host, []).append(rank)
    group_of = {host: i for i, host in enumerate(by_host)}
    out = []
    for rank, host in enumerate(host_of_member):
        on_host = by_host[host]
        out.append(MemberPlace(rank, len(host_of_member), on_host.index(rank), len(on_host),
                               group_of[host], len(by_host)))
    return out


def torchrun_env(place: MemberPlace, master: tuple[str, int] | None,
                 role: str = DEFAULT_ROLE) -> dict[str, str]:
    """torchrun's variables for one member (MASTER_* only when the master is known)."""
    env = {"RANK": str(place.rank), "WORLD_SIZE": str(place.world_size),
           "LOCAL_RANK": str(place.local_rank), "LOCAL_WORLD_SIZE": str(place.local_world_size),
           "GROUP_RANK": str(place.group_rank), "GROUP_WORLD_SIZE": str(place.group_world_size),
           "ROLE_RANK": str(place.rank), "ROLE_WORLD_SIZE": str(place.world_size),
           "ROLE_NAME": role}
    if master is not None:
        env["MASTER_ADDR"], env["MASTER_PORT"] = str(master[0]), str(master[1])
    return env
