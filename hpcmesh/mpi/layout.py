"""Which MPI rank is which point of the mesh: the boot allgather's entries to a layout
(pure; unit-tested without MPI), and the format of the address file that carries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import HpcmeshError
from ..runtime.messages import NodeRef
from ..shapes import Extent, Point

#: The ``format`` of the address file rank 0 writes (``--address-file``) and
#: ``attach_to_mpi`` reads.
ADDRESS_FILE_FORMAT = "hpcmesh-mpi/1"


class LayoutError(HpcmeshError, ValueError):
    """The MPI job's shape cannot be a hosts × gpus mesh."""


@dataclass(frozen=True)
class RankEntry:
    """What one rank tells the others in the boot allgather."""
    world_rank: int
    host: str
    node_id: str
    addresses: tuple[str, ...]
    pid: int
    local_rank: int
    local_size: int
    leader: int          # lowest world rank of this rank's shared-memory group

    @property
    def ref(self) -> NodeRef:
        return NodeRef(self.node_id, tuple(self.addresses))


@dataclass(frozen=True)
class MPILayout:
    extent: dict[str, int]
    order: tuple[int, ...]          # world rank at each flat mesh rank
    entries: tuple[RankEntry, ...]  # indexed by world rank
    hosts: tuple[str, ...]          # hostname per host index

    def point_of(self, world_rank: int) -> Point:
        return Point(self.order.index(world_rank), Extent(self.extent))

    def by_flat_rank(self) -> list[RankEntry]:
        return [self.entries[w] for w in self.order]


def compute_layout(entries: Sequence[RankEntry], ragged: str = "error") -> MPILayout:
    """Mesh layout from the boot allgather: host index = order of the shared-memory
    groups by lowest world rank, gpus = local rank."""
    entries = tuple(sorted(entries, key=lambda e: e.world_rank))
    if [e.world_rank for e in entries] != list(range(len(entries))):
        raise LayoutError(f"world ranks are not 0..{len(entries) - 1}: "
                          f"{[e.world_rank for e in entries]}")
    groups: dict[int, list[RankEntry]] = {}
    for e in entries:
        groups.setdefault(e.leader, []).append(e)
    leaders = sorted(groups)
    sizes = {ld: len(groups[ld]) for ld in leaders}
    hosts = tuple(groups[ld][0].host for ld in leaders)
    uniform = len(set(sizes.values())) == 1
    for ld in leaders:
        locals_ = sorted(e.local_rank for e in groups[ld])
        if locals_ != list(range(len(locals_))):
            raise LayoutError(f"local ranks on {groups[ld][0].host} are {locals_}, "
                              f"expected 0..{len(locals_) - 1}")
    if not uniform:
        if ragged == "flat":
            return MPILayout({"ranks": len(entries)}, tuple(range(len(entries))), entries, hosts)
        detail = ", ".join(f"{groups[ld][0].host}: {sizes[ld]}" for ld in leaders)
        raise LayoutError(
            f"ranks per node differ ({detail}); a hosts x gpus mesh needs the same number on "
            f"every node: launch with `srun --ntasks-per-node=K` / `mpiexec -ppn K`, or pass "
            f"`--ragged flat` for a 1-D {{'ranks': {len(entries)}}} mesh")
    per = sizes[leaders[0]]
    order = [0] * len(entries)
    for h, ld in enumerate(leaders):
        for e in groups[ld]:
            order[h * per + e.local_rank] = e.world_rank
    return MPILayout({"hosts": len(leaders), "gpus": per}, tuple(order), entries, hosts)
