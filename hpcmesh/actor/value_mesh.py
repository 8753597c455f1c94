"""ValueMesh: the results of ``call()``, one value per member, sliceable like the mesh called."""

from __future__ import annotations

import operator
from typing import Generic, Iterable, Iterator, TypeVar

from ..shapes import Extent, MeshTrait, Point, Shape

T = TypeVar("T")


class ValueMesh(MeshTrait, Generic[T]):
    """Results of ``call()``: one value per member, same extent as the mesh called."""

    def __init__(self, shape: Shape, values: list[T]):
        self._shape = shape
        self._values = values

    @staticmethod
    def from_indexed(shape: Shape | Extent, pairs: Iterable[tuple[int, T]]) -> "ValueMesh[T]":
        """A ValueMesh from ``(rank, value)`` pairs in any order (Monarch's
        ``from_indexed``): results gathered as they arrived, put back in mesh order.
        Every rank of ``shape`` needs a value; for a rank given twice, the last wins."""
        if isinstance(shape, Extent):
            shape = Shape.from_extent(shape)
        n = shape.nelem
        values: dict[int, T] = {}
        for rank, value in pairs:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
                raise ValueError(f"ValueMesh.from_indexed: rank {rank!r} is not a rank of "
                                 f"{dict(shape.extent)} (0 to {n - 1})")
            values[rank] = value
        if len(values) != n:
            missing = sorted(set(range(n)) - values.keys())
            raise ValueError(f"ValueMesh.from_indexed: {dict(shape.extent)} has {n} ranks; "
                             f"no value for {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        return ValueMesh(Shape.from_extent(shape.extent), [values[r] for r in range(n)])

    def _new_with_shape(self, shape: Shape) -> "ValueMesh":
        return ValueMesh(shape, self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        for rank, g in enumerate(self._shape.ranks()):
            yield Point(rank, self._shape.extent), self._values[g]

    def values(self) -> list[T]:
        return [self._values[g] for g in self._shape.ranks()]

    def items(self) -> list[tuple[Point, T]]:
        return list(iter(self))

    def __getitem__(self, key) -> T:
        if isinstance(key, int):
            if not 0 <= key < self._shape.nelem:
                raise IndexError(f"rank {key} out of range for a ValueMesh of {self._shape.nelem}")
            return self._values[self._shape.ranks()[key]]
        return self._values[self._shape.global_index(key)]

    def get(self, rank: int) -> T:
        """The value of the member with flat ``rank`` in this view (Monarch's ``get``)."""
        return self[operator.index(rank)]

    def item(self, **coords: int) -> T:
        view = self.slice(**coords) if coords else self
        if view._shape.nelem != 1 or len(view._shape.extent):
            raise ValueError(f"item() needs a coordinate for every dimension of "
                             f"{dict(self.extent)}; got {coords}")
        return view._values[view._shape.ranks()[0]]

    def __eq__(self, other) -> bool:
        return isinstance(other, ValueMesh) and self.extent == other.extent and \
            self.values() == other.values()

    def __repr__(self) -> str:
        return f"ValueMesh({dict(self.extent)}, {self.values()!r})"

    def __reduce__(self):
        return ValueMesh, (Shape.from_extent(self._shape.extent), self.values())
