"""ValueMesh: the results of ``call()``, one value per member, sliceable like the mesh called."""

from __future__ import annotations

import operator
from typing import Any, Iterator

from ..shapes import MeshTrait, Point, Shape


class ValueMesh(MeshTrait):
    """Results of ``call()``: one value per member, same extent as the mesh called."""

    def __init__(self, shape: Shape, values: list):
        self._shape = shape
        self._values = values

    def _new_with_shape(self, shape: Shape) -> "ValueMesh":
        return ValueMesh(shape, self._values)

    def __iter__(self) -> Iterator[tuple[Point, Any]]:
        for rank, g in enumerate(self._shape.ranks()):
            yield Point(rank, self._shape.extent), self._values[g]

    def values(self) -> list:
        return [self._values[g] for g in self._shape.ranks()]

    def items(self):
        return list(iter(self))

    def __getitem__(self, key) -> Any:
        if isinstance(key, int):
            if not 0 <= key < self._shape.nelem:
                raise IndexError(f"rank {key} out of range for a ValueMesh of {self._shape.nelem}")
            return self._values[self._shape.ranks()[key]]
        return self._values[self._shape.global_index(key)]

    def get(self, rank: int) -> Any:
        """The value of the member with flat ``rank`` in this view (Monarch's ``get``)."""
        return self[operator.index(rank)]

    def item(self, **coords: int) -> Any:
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
