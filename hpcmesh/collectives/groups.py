"""Which members form a group along some mesh dimensions: pure, no torch.

A group is the set of members whose coordinates agree on every dimension *not* in ``dims``;
a member's rank in its group is its row-major rank over ``dims`` taken in mesh order. The
controller can use this to predict membership, and tests check it without processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..shapes import DimKeyError, unravel

Dims = Union[str, Sequence[str], None]


@dataclass(frozen=True)
class GroupSpec:
    """Pure description of the group a member belongs to along some dims."""

    extent: tuple[tuple[str, int], ...]
    dims: tuple[str, ...]  # in mesh order
    members: tuple[int, ...]  # flat ranks, ordered by group rank
    rank: int  # this member's rank in the group
    index: int  # which group (row-major over the dims not in `dims`)

    @property
    def size(self) -> int:
        return len(self.members)

    def describe(self) -> str:
        ext = "{" + ", ".join(f"{k!r}: {v}" for k, v in self.extent) + "}"
        return (
            f"dims={self.dims} of mesh extent {ext}, group members "
            f"{list(self.members)} (this member is group rank {self.rank} of {self.size})"
        )

    def store_key(self, prefix: str, backend: str) -> str:
        ext = ",".join(f"{k}={v}" for k, v in self.extent)
        dims = ",".join(self.dims) or "-"
        return f"{prefix}/hpcmesh.collectives/{backend}/{ext}/{dims}/{self.index}"


def extent_items(extent: Any) -> tuple[tuple[str, int], ...]:
    """Accept a Mapping, an Extent-like object (``keys()`` + ``sizes``) or
    pairs, so callers can pass ``point.extent`` or ``mesh.extent`` as is."""
    if hasattr(extent, "items"):
        items = list(extent.items())
    elif hasattr(extent, "keys") and hasattr(extent, "sizes"):
        sizes = extent.sizes() if callable(extent.sizes) else extent.sizes
        items = list(zip(extent.keys(), sizes))
    else:
        items = [tuple(p) for p in extent]
    seen: set[str] = set()
    out = []
    for name, size in items:
        if not isinstance(name, str) or not name:
            raise ValueError(f"mesh dimension names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"mesh dimension {name!r} appears twice in extent {items}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh dimension {name!r} must have a positive int size, got {size!r}")
        seen.add(name)
        out.append((name, int(size)))
    return tuple(out)


def format_extent(items: tuple[tuple[str, int], ...]) -> str:
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"


def normalize_dims(dims: Dims, extent: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Validate dims and put them in mesh order (the order group ranks use)."""
    names = [k for k, _ in extent]
    if dims is None:
        return tuple(names)
    if isinstance(dims, str):
        wanted = [dims]
    else:
        wanted = list(dims)
    for d in wanted:
        if not isinstance(d, str) or d not in names:
            raise DimKeyError(
                f"unknown mesh dimension {d!r}; available dimensions: {names} "
                f"(mesh extent {format_extent(extent)})"
            )
    chosen = set(wanted)
    return tuple(n for n in names if n in chosen)


def ravel(coords: Sequence[int], sizes: Sequence[int]) -> int:
    r = 0
    for c, s in zip(coords, sizes):
        r = r * s + c
    return r


def compute_group(rank: int, extent: Any, dims: Dims) -> GroupSpec:
    """The group of flat ``rank`` along ``dims`` (pure; usable without torch
    groups, e.g. by the controller to predict membership)."""
    items = extent_items(extent)
    sizes = [s for _, s in items]
    world = math.prod(sizes)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a mesh of {world} members (extent {format_extent(items)})")
    dims_t = normalize_dims(dims, items)
    in_group = [name in dims_t for name, _ in items]
    mine = unravel(rank, sizes)
    members = []
    for combo in itertools.product(*(range(s) for (n, s), g in zip(items, in_group) if g)):
        it = iter(combo)
        coords = [next(it) if g else c for c, g in zip(mine, in_group)]
        members.append(ravel(coords, sizes))
    other_coords = [c for c, g in zip(mine, in_group) if not g]
    other_sizes = [s for s, g in zip(sizes, in_group) if not g]
    return GroupSpec(
        extent=items,
        dims=dims_t,
        members=tuple(members),
        rank=members.index(rank),
        index=ravel(other_coords, other_sizes),
    )
