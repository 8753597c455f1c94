"""Mesh geometry: extents, points, shapes (views) and the ``MeshTrait`` mixin.

Everything here is pure: no I/O, no sockets, standard library only.

Vocabulary
----------
* An :class:`Extent` is an ordered mapping ``dim name -> size``.
* A :class:`Point` is one position inside an extent; its ``rank`` is the
  row-major flat index of that position (the last dimension varies fastest).
* A :class:`Shape` is a *view* over the members of the mesh that was originally
  created (its "global indices" ``0..N-1``).  It gives every point of its
  extent a global index.  Slicing, renaming, splitting and flattening produce
  new views over the same members; they never copy or touch members.

Internally a ``Shape`` is a row-major strided layout ``(labels, offset, sizes,
strides)``: the global index of coordinates ``c`` is ``offset + sum(c[i] *
strides[i])``.  A reshape that strides cannot express (flattening a
non-contiguous slice) falls back to an explicit tuple of global indices.  The
representation is canonical, so two shapes that address the same members in
the same order with the same labels and sizes compare (and hash) equal no
matter how they were obtained.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Self
from .errors import HpcmeshError

__all__ = [
    "Extent",
    "Point",
    "Shape",
    "MeshTrait",
    "MESH_ATTRIBUTE_NAMES",
    "DimKeyError",
    "unravel",
]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


class DimKeyError(HpcmeshError, KeyError):
    """A KeyError whose ``str()`` is the plain message.

    Built-in ``KeyError`` shows its argument with ``repr`` (extra quotes); these
    errors carry whole sentences, so they read better unquoted.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _unknown_dim(dim: object, labels: Sequence[str]) -> DimKeyError:
    return DimKeyError(f"unknown dimension {dim!r}; mesh dimensions are {list(labels)}")


def _as_int(value: object) -> int | None:
    """``int(value)`` for real integers (anything with ``__index__``), else None.

    ``bool`` is refused: ``True`` as a size or index is always a mistake.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check_label(name: object, what: str = "dimension name") -> str:
    if not isinstance(name, str):
        raise ValueError(f"{what} {name!r} is not a str (got {type(name).__name__})")
    if not name:
        raise ValueError(f"{what} must be a non-empty string, got ''")
    if not name.isidentifier():
        raise ValueError(f"{what} {name!r} is not a valid identifier")
    return name


def _row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    return tuple(strides)


def unravel(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major coordinates of flat ``rank`` in a grid of ``sizes`` (the last varies fastest)."""
    coords = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        rank, coords[i] = divmod(rank, sizes[i])
    return tuple(coords)


def _strided_indices(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> list[int]:
    """All ``offset + sum(c*s)`` in row-major order of ``c``."""
    out = [offset]
    for size, stride in zip(sizes, strides):
        steps = [i * stride for i in range(size)]
        out = [base + step for base in out for step in steps]
    return out


# --------------------------------------------------------------------------
# Extent
# --------------------------------------------------------------------------


def point_label(coords: Mapping[str, int]) -> str:
    """How hpcmesh names a member wherever it shows one (process names, logs, errors,
    admin, debugger): ``{"hosts": 0, "gpus": 1}`` -> ``hosts=0,gpus=1``; ``0`` for no
    dimensions."""
    return ",".join(f"{d}={c}" for d, c in coords.items()) or "0"


def subdir_for(coords: Mapping[str, int]) -> str:
    """A member's folder name from its coordinates (what ``$SUBDIR`` becomes):
    ``{"hosts": 0, "gpus": 1}`` -> ``hosts_0_gpus_1``; ``0`` for no dimensions."""
    return "_".join(f"{d}_{c}" for d, c in coords.items()) or "0"


class _DimMapping(Mapping[str, int]):
    """The value semantics Extent and Point share: immutable; equal to their own kind with
    the same ``_key()`` (the constructor's arguments, which pickling rebuilds them from)
    and to a plain mapping with the same items; never to the other kind, a mapping too.
    (``!=`` is object's: the negation of ``==``.)"""

    __slots__ = ()

    def _key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._key())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _DimMapping):
            return type(other) is type(self) and self._key() == other._key()
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self), *self._key()))


class Extent(_DimMapping):
    """The named, ordered sizes of a mesh (``{"hosts": 2, "gpus": 4}``).

    Exists so every layer agrees on one validated, immutable, hashable value
    for "which dimensions, in which order, how big".
    """

    __slots__ = ("_labels", "_sizes", "_index")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _index: dict[str, int]

    def __init__(
        self,
        labels: Mapping[str, int] | Iterable[str] | None = None,
        sizes: Iterable[int] | None = None,
    ) -> None:
        if sizes is None:
            if labels is None:
                pairs: list[tuple[Any, Any]] = []
            elif isinstance(labels, Mapping):
                pairs = list(labels.items())
            else:
                raise TypeError(
                    "Extent() takes a mapping {name: size} or two sequences "
                    f"(labels, sizes); got {type(labels).__name__} alone"
                )
        else:
            if isinstance(labels, str) or labels is None or isinstance(labels, Mapping):
                raise TypeError("Extent(labels, sizes): labels must be a sequence of names")
            names = list(labels)
            values = list(sizes)
            if len(names) != len(values):
                raise ValueError(
                    f"Extent: {len(names)} labels {names} but {len(values)} sizes {values}"
                )
            pairs = list(zip(names, values))
        seen: dict[str, int] = {}
        out_sizes: list[int] = []
        for name, size in pairs:
            _check_label(name)
            if name in seen:
                raise ValueError(f"duplicate dimension name {name!r}")
            n = _as_int(size)
            if n is None:
                raise ValueError(
                    f"size of dimension {name!r} must be an int, got {size!r}"
                )
            if n <= 0:
                raise ValueError(f"size of dimension {name!r} must be positive, got {n}")
            seen[name] = len(out_sizes)
            out_sizes.append(n)
        object.__setattr__(self, "_labels", tuple(seen))
        object.__setattr__(self, "_sizes", tuple(out_sizes))
        object.__setattr__(self, "_index", seen)

    @classmethod
    def _trusted(cls, labels: tuple[str, ...], sizes: tuple[int, ...]) -> Extent:
        self = object.__new__(cls)
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(labels)})
        return self

    def _key(self) -> tuple[Any, ...]:
        return (self._labels, self._sizes)

    # -- Mapping ------------------------------------------------------------
    def __getitem__(self, dim: str) -> int:
        try:
            return self._sizes[self._index[dim]]
        except (KeyError, TypeError):
            raise _unknown_dim(dim, self._labels) from None

    def __contains__(self, dim: object) -> bool:
        try:
            return dim in self._index
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    # -- properties ---------------------------------------------------------
    @property
    def labels(self) -> list[str]:
        """Dimension names, in order (a fresh list)."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """Dimension sizes, in order (a fresh list)."""
        return list(self._sizes)

    @property
    def nelem(self) -> int:
        """Number of points: the product of the sizes (1 for no dimensions)."""
        return math.prod(self._sizes)

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes))!r})"


# --------------------------------------------------------------------------
# Point
# --------------------------------------------------------------------------


class Point(_DimMapping):
    """One position in an :class:`Extent`, readable as ``point["gpus"]``.

    Exists to give actors and callbacks both their flat ``rank`` and their
    per-dimension coordinates; it travels over the wire, so it pickles as
    ``(rank, extent)``.
    """

    __slots__ = ("_rank", "_extent", "_coords")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent | Mapping[str, int]) -> None:
        if not isinstance(extent, Extent):
            extent = Extent(extent)
        r = _as_int(rank)
        if r is None:
            raise TypeError(f"Point rank must be an int, got {rank!r}")
        if not 0 <= r < extent.nelem:
            raise IndexError(
                f"rank {r} out of range for {extent!r} with {extent.nelem} points"
            )
        object.__setattr__(self, "_rank", r)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", unravel(r, extent._sizes))

    @classmethod
    def from_coords(cls, coords: Mapping[str, int], extent: Extent | Mapping[str, int]) -> Point:
        """The point of ``extent`` at ``coords`` (every dimension, none extra)."""
        if not isinstance(extent, Extent):
            extent = Extent(extent)
        for dim in coords:
            if dim not in extent:
                raise _unknown_dim(dim, extent._labels)
        rank = 0
        for dim, size in zip(extent._labels, extent._sizes):
            if dim not in coords:
                raise DimKeyError(
                    f"missing coordinate for dimension {dim!r}; "
                    f"need all of {list(extent._labels)}"
                )
            raw = coords[dim]
            c = _as_int(raw)
            if c is None:
                raise TypeError(f"coordinate for dimension {dim!r} must be an int, got {raw!r}")
            if not 0 <= c < size:
                raise IndexError(
                    f"index {c} out of range for dimension {dim!r} of size {size}"
                )
            rank = rank * size + c
        return cls(rank, extent)

    def _key(self) -> tuple[Any, ...]:
        return (self._rank, self._extent)

    @property
    def rank(self) -> int:
        """Row-major flat index of this point within its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    @property
    def coords(self) -> dict[str, int]:
        """``{dim: coordinate}`` (a fresh dict)."""
        return dict(zip(self._extent._labels, self._coords))

    def size(self, dim: str) -> int:
        """Size of dimension ``dim`` of this point's extent."""
        return self._extent[dim]

    def __getitem__(self, dim: str) -> int:
        try:
            return self._coords[self._extent._index[dim]]
        except (KeyError, TypeError):
            raise DimKeyError(
                f"unknown dimension {dim!r}; valid dimensions are {list(self._extent._labels)}"
            ) from None

    def __contains__(self, dim: object) -> bool:
        return dim in self._extent

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __repr__(self) -> str:
        """As Monarch prints a point: each coordinate over its dimension's size,
        ``{'hosts': 0/2, 'gpus': 1/4}`` (str() is the same)."""
        sizes = self._extent._sizes
        return "{" + ", ".join(f"{label!r}: {c}/{sizes[i]}" for i, (label, c) in
                               enumerate(zip(self._extent._labels, self._coords))) + "}"


# --------------------------------------------------------------------------
# Shape
# --------------------------------------------------------------------------


def _make_shape(
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    offset: int,
    strides: tuple[int, ...],
    explicit: tuple[int, ...] | None,
) -> Shape:
    """Unpickling entry point (module level so plain pickle finds it)."""
    if explicit is not None:
        return Shape._from_explicit(labels, sizes, explicit)
    return Shape._strided(labels, sizes, offset, strides)


class Shape:
    """A labelled view over the flat members (global indices) of a mesh.

    Exists so slicing and reshaping a mesh is pure arithmetic on a small,
    hashable, picklable value; the runtime turns a view into the exact set of
    members a message must reach with :meth:`ranks`.
    """

    __slots__ = ("_labels", "_sizes", "_offset", "_strides", "_explicit", "_extent", "_lookup")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _offset: int
    _strides: tuple[int, ...]
    # None for a strided view; else the global indices in row-major order
    # (and then _offset/_strides are the contiguous layout over positions).
    _explicit: tuple[int, ...] | None
    _extent: Extent
    _lookup: dict[int, int] | None

    def __init__(
        self,
        labels: Sequence[str],
        offset: int,
        sizes: Sequence[int],
        strides: Sequence[int],
    ) -> None:
        """A strided view: coordinates ``c`` address ``offset + sum(c[i]*strides[i])``.

        Validates names, sizes, that every addressed index is >= 0 and that no
        two points address the same member.
        """
        extent = Extent(list(labels), list(sizes))
        strides_t = tuple(strides)
        if len(strides_t) != len(extent):
            raise ValueError(f"{len(extent)} dimensions but {len(strides_t)} strides {list(strides_t)}")
        ints = [_as_int(s) for s in strides_t]
        for s, raw in zip(ints, strides_t):
            if s is None:
                raise ValueError(f"stride {raw!r} is not an int")
        off = _as_int(offset)
        if off is None or off < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        stride_ints = tuple(s for s in ints if s is not None)
        lowest = off + sum(min(0, (n - 1) * s) for n, s in zip(extent._sizes, stride_ints))
        if lowest < 0:
            raise ValueError(f"view addresses negative global index {lowest}")
        indices = _strided_indices(off, extent._sizes, stride_ints)
        if len(set(indices)) != len(indices):
            raise ValueError("strides address the same member more than once")
        built = Shape._strided(extent._labels, extent._sizes, off, stride_ints)
        for name in self.__slots__:
            object.__setattr__(self, name, getattr(built, name))

    # -- construction -------------------------------------------------------
    @classmethod
    def _strided(
        cls,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        offset: int,
        strides: tuple[int, ...],
    ) -> Shape:
        self = object.__new__(cls)
        # canonical: a dimension of size 1 has no meaningful stride
        strides = tuple(0 if n == 1 else s for n, s in zip(sizes, strides))
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_offset", offset)
        object.__setattr__(self, "_strides", strides)
        object.__setattr__(self, "_explicit", None)
        object.__setattr__(self, "_extent", Extent._trusted(labels, sizes))
        object.__setattr__(self, "_lookup", None)
        return self

    @classmethod
    def _from_explicit(
        cls, labels: tuple[str, ...], sizes: tuple[int, ...], indices: tuple[int, ...]
    ) -> Shape:
        """Canonical shape for explicit row-major ``indices``: strided if possible."""
        offset = indices[0]
        rm = _row_major_strides(sizes)
        strides = tuple(
            (indices[step] - offset) if n > 1 else 0 for n, step in zip(sizes, rm)
        )
        if _strided_indices(offset, sizes, strides) == list(indices):
            return cls._strided(labels, sizes, offset, strides)
        # not strided: the row-major layout of its extent, addressed through ``indices``
        self = cls._strided(labels, sizes, 0, rm)
        object.__setattr__(self, "_explicit", indices)
        return self

    def _derive(
        self,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        offset: int,
        strides: tuple[int, ...],
    ) -> Shape:
        """A new view whose layout (offset, strides) is in this view's address space."""
        if self._explicit is None:
            return Shape._strided(labels, sizes, offset, strides)
        base = self._explicit
        positions = _strided_indices(offset, sizes, strides)
        return Shape._from_explicit(labels, sizes, tuple(base[p] for p in positions))

    @classmethod
    def from_extent(cls, extent: Extent | Mapping[str, int]) -> Shape:
        """The identity view: global index == row-major rank."""
        if not isinstance(extent, Extent):
            extent = Extent(extent)
        return cls._strided(
            extent._labels, extent._sizes, 0, _row_major_strides(extent._sizes)
        )

    @classmethod
    def from_ranks(
        cls, labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int]
    ) -> Shape:
        """A view given its global indices explicitly, in row-major order."""
        extent = Extent(list(labels), list(sizes))
        indices: list[int] = []
        for raw in ranks:
            g = _as_int(raw)
            if g is None or g < 0:
                raise ValueError(f"global index must be a non-negative int, got {raw!r}")
            indices.append(g)
        if len(indices) != extent.nelem:
            raise ValueError(
                f"{extent!r} has {extent.nelem} points but {len(indices)} global indices were given"
            )
        if len(set(indices)) != len(indices):
            raise ValueError("global indices must be distinct")
        return cls._from_explicit(extent._labels, extent._sizes, tuple(indices))

    # -- value semantics ----------------------------------------------------
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Shape is immutable")

    def _key(self) -> tuple[Any, ...]:
        return (self._labels, self._sizes, self._offset, self._strides, self._explicit)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_shape, self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((Shape, *self._key()))

    def __repr__(self) -> str:
        ext = dict(zip(self._labels, self._sizes))
        if self._explicit is None:
            return f"Shape({ext!r}, offset={self._offset}, strides={list(self._strides)})"
        return f"Shape({ext!r}, ranks={list(self._explicit)})"

    # -- queries ------------------------------------------------------------
    @property
    def extent(self) -> Extent:
        return self._extent

    labels = property(lambda self: self._extent.labels, doc="Dimension names (a fresh list).")
    sizes = property(lambda self: self._extent.sizes, doc="Dimension sizes (a fresh list).")
    nelem = property(lambda self: self._extent.nelem, doc="Number of points.")

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Number of points (no ``dim``), size of one dimension, or product over several."""
        if dim is None:
            return self.nelem
        if isinstance(dim, str):
            return self._extent[dim]
        if isinstance(dim, (tuple, list)):
            return math.prod(self._extent[d] for d in dim)
        raise TypeError(f"size(dim): dim must be None, a str or a tuple of str, got {dim!r}")

    def ranks(self) -> list[int]:
        """Global indices of all points, in row-major order."""
        if self._explicit is not None:
            return list(self._explicit)
        return _strided_indices(self._offset, self._sizes, self._strides)

    def points(self) -> list[Point]:
        """All points of this view's extent, in row-major order."""
        ext = self._extent
        return [Point(i, ext) for i in range(self.nelem)]

    def global_index(self, point_or_rank: Point | Mapping[str, int] | int) -> int:
        """Global index of a point of this view (a Point, a coords mapping or a flat rank)."""
        if isinstance(point_or_rank, Point):
            if point_or_rank.extent != self._extent:
                raise ValueError(
                    f"{point_or_rank!r} belongs to {point_or_rank.extent!r}, "
                    f"not to this view's {self._extent!r}"
                )
            rank = point_or_rank.rank
        elif isinstance(point_or_rank, Mapping):
            rank = Point.from_coords(point_or_rank, self._extent).rank
        else:
            r = _as_int(point_or_rank)
            if r is None:
                raise TypeError(
                    f"global_index() takes a Point, a coords mapping or an int rank, "
                    f"got {point_or_rank!r}"
                )
            if not 0 <= r < self.nelem:
                raise IndexError(f"rank {r} out of range for a view of {self.nelem} points")
            rank = r
        if self._explicit is not None:
            return self._explicit[rank]
        coords = unravel(rank, self._sizes)
        return self._offset + sum(c * s for c, s in zip(coords, self._strides))

    def rank_of(self, global_index: int) -> int:
        """Flat rank in this view of a member given by global index (ValueError if absent)."""
        lookup = self._lookup
        if lookup is None:
            lookup = {g: i for i, g in enumerate(self.ranks())}
            object.__setattr__(self, "_lookup", lookup)
        try:
            return lookup[global_index]
        except (KeyError, TypeError):
            raise ValueError(f"global index {global_index!r} is not a member of this view") from None

    # -- views --------------------------------------------------------------
    def slice(self, **selectors: int | slice | range) -> Shape:
        """Select along dimensions: an int removes the dimension, a slice/range keeps it.

        Ints may be negative (from the end); slices clamp like Python; a range is
        an explicit arithmetic sequence of indices, each of which must exist.
        """
        for dim in selectors:
            if dim not in self._extent._index:
                raise _unknown_dim(dim, self._labels)
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        offset = self._offset
        for dim, size, stride in zip(self._labels, self._sizes, self._strides):
            if dim not in selectors:
                labels.append(dim)
                sizes.append(size)
                strides.append(stride)
                continue
            sel = selectors[dim]
            if isinstance(sel, slice):
                try:
                    picked = range(*sel.indices(size))
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"bad slice {sel!r} for dimension {dim!r}: {exc}") from None
                if not picked:
                    raise IndexError(
                        f"slice {sel!r} selects nothing from dimension {dim!r} of size {size}"
                    )
            elif isinstance(sel, range):
                if not sel:
                    raise IndexError(
                        f"{sel!r} selects nothing from dimension {dim!r} of size {size}"
                    )
                for end in (sel[0], sel[-1]):
                    if not 0 <= end < size:
                        raise IndexError(
                            f"index {end} (from {sel!r}) out of range for dimension "
                            f"{dim!r} of size {size}"
                        )
                picked = sel
            else:
                i = _as_int(sel)
                if i is None:
                    raise TypeError(
                        f"index for dimension {dim!r} must be an int, slice or range, "
                        f"got {type(sel).__name__} {sel!r}"
                    )
                j = i + size if i < 0 else i
                if not 0 <= j < size:
                    raise IndexError(
                        f"index {i} out of range for dimension {dim!r} of size {size}"
                    )
                offset += j * stride
                continue
            offset += picked.start * stride
            labels.append(dim)
            sizes.append(len(picked))
            strides.append(picked.step * stride)
        return self._derive(tuple(labels), tuple(sizes), offset, tuple(strides))

    def rename(self, **renames: str) -> Shape:
        """Rename dimensions: ``rename(old="new", ...)``; order and members unchanged."""
        for old in renames:
            if old not in self._extent._index:
                raise _unknown_dim(old, self._labels)
        for old, new in renames.items():
            _check_label(new, f"new name for dimension {old!r}")
        labels = tuple(renames.get(dim, dim) for dim in self._labels)
        seen: set[str] = set()
        for dim, new in zip(self._labels, labels):
            if new in seen:
                raise ValueError(
                    f"rename would give two dimensions the name {new!r} "
                    f"(renaming {dim!r}); resulting names {list(labels)}"
                )
            seen.add(new)
        return self._derive(labels, self._sizes, self._offset, self._strides)

    def split(self, **kwargs: Sequence[str] | int) -> Shape:
        """Split dimensions, row-major: ``split(gpus=("dp", "tp"), dp=2)``.

        A keyword whose value is a tuple/list of names splits that existing
        dimension into the named new ones; a keyword whose value is an int gives
        the size of one new dimension.  At most one new size per split may be
        omitted (it is inferred); the sizes must multiply to the original size.
        """
        plans: dict[str, tuple[str, ...]] = {}
        given: dict[str, int] = {}
        for key, value in kwargs.items():
            if isinstance(value, (tuple, list)):
                if key not in self._extent._index:
                    raise _unknown_dim(key, self._labels)
                if not value:
                    raise ValueError(f"split({key}=...) needs at least one new dimension name")
                for name in value:
                    _check_label(name, f"new dimension name in split of {key!r}")
                plans[key] = tuple(value)
            else:
                n = _as_int(value)
                if n is None:
                    raise TypeError(
                        f"split({key}={value!r}): expected a tuple of new names (to split "
                        f"dimension {key!r}) or an int size (for new dimension {key!r})"
                    )
                if n <= 0:
                    raise ValueError(f"size of new dimension {key!r} must be positive, got {n}")
                given[key] = n
        new_names = [name for names in plans.values() for name in names]
        for key in given:
            if key not in new_names:
                raise ValueError(
                    f"split() got size {key}={given[key]} but {key!r} is not one of the "
                    f"new dimension names {new_names}"
                )
        kept = [dim for dim in self._labels if dim not in plans]
        all_names = kept + new_names
        if len(set(all_names)) != len(all_names):
            dupes = sorted({n for n in all_names if all_names.count(n) > 1})
            raise ValueError(
                f"split() would create duplicate dimension names {dupes}; "
                f"resulting names {all_names}"
            )
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        for dim, size, stride in zip(self._labels, self._sizes, self._strides):
            if dim not in plans:
                labels.append(dim)
                sizes.append(size)
                strides.append(stride)
                continue
            names = plans[dim]
            unknown = [n for n in names if n not in given]
            known = math.prod(given[n] for n in names if n in given)
            if len(unknown) > 1:
                raise ValueError(
                    f"split of {dim!r} into {list(names)}: give the sizes of all but one "
                    f"of the new dimensions; missing {unknown}"
                )
            if unknown:
                if size % known:
                    raise ValueError(
                        f"cannot split dimension {dim!r} of size {size} into {list(names)}: "
                        f"{size} is not divisible by {known}"
                    )
                part = {unknown[0]: size // known}
            else:
                if known != size:
                    raise ValueError(
                        f"cannot split dimension {dim!r} of size {size} into {list(names)}: "
                        f"sizes {[given[n] for n in names]} multiply to {known}, not {size}"
                    )
                part = {}
            new_sizes = [given.get(n) or part[n] for n in names]
            inner = stride
            new_strides = [0] * len(names)
            for k in range(len(names) - 1, -1, -1):
                new_strides[k] = inner
                inner *= new_sizes[k]
            labels.extend(names)
            sizes.extend(new_sizes)
            strides.extend(new_strides)
        return self._derive(tuple(labels), tuple(sizes), self._offset, tuple(strides))

    def flatten(self, name: str) -> Shape:
        """Merge all dimensions into one called ``name``, in row-major order."""
        _check_label(name)
        n = self.nelem
        if self._explicit is not None:
            return Shape._from_explicit((name,), (n,), self._explicit)
        dims = [(s, st) for s, st in zip(self._sizes, self._strides) if s > 1]
        contiguous = all(
            outer[1] == inner[1] * inner[0] for outer, inner in zip(dims, dims[1:])
        )
        if contiguous:
            stride = dims[-1][1] if dims else 0
            return Shape._strided((name,), (n,), self._offset, (stride,))
        return Shape._from_explicit((name,), (n,), tuple(self.ranks()))

    # -- display ------------------------------------------------------------
    def to_table(self) -> str:
        """Text picture of this view's flat ranks (0..nelem-1, not global indices)."""
        labels, sizes = self._labels, self._sizes
        if not labels:
            return "(single point)"
        if len(labels) == 1:
            return f"{labels[0]}: {list(range(sizes[0]))}"
        rows, cols = sizes[-2], sizes[-1]
        corner = f"{labels[-2]}\\{labels[-1]}"
        width = max(len(str(self.nelem - 1)), len(str(cols - 1)))
        first = max(len(corner), len(str(rows - 1)))

        def grid(base: int) -> list[str]:
            lines = [corner.rjust(first) + "".join(f" {c:>{width}}" for c in range(cols))]
            for r in range(rows):
                cells = "".join(f" {base + r * cols + c:>{width}}" for c in range(cols))
                lines.append(f"{r:>{first}}{cells}")
            return lines

        if len(labels) == 2:
            return "\n".join(grid(0))
        blocks = []
        lead = itertools.product(*(range(s) for s in sizes[:-2]))
        for k, coords in enumerate(lead):
            header = ", ".join(f"{d}={c}" for d, c in zip(labels[:-2], coords)) + ":"
            body = "\n".join("  " + line for line in grid(k * rows * cols))
            blocks.append(f"{header}\n{body}")
        return "\n\n".join(blocks)


# --------------------------------------------------------------------------
# MeshTrait
# --------------------------------------------------------------------------


class MeshTrait:
    """Shape operations shared by HostMesh, ProcMesh, ActorMesh and ValueMesh.

    Exists so every mesh type slices, reshapes and iterates the same way; the
    subclass supplies ``_shape`` and ``_new_with_shape`` and all logic stays in
    :class:`Shape`.
    """

    __slots__ = ()

    _shape: Shape

    def _new_with_shape(self, shape: Shape) -> Self:
        raise NotImplementedError(f"{type(self).__name__} must implement _new_with_shape")

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Number of members, or the size of one dimension, or the product over a tuple of them."""
        return self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dimension, by name (Monarch's ``mesh.sizes``)."""
        return dict(self._shape.extent)

    def slice(self, **selectors: int | slice | range) -> Self:
        return self._new_with_shape(self._shape.slice(**selectors))

    def rename(self, **renames: str) -> Self:
        return self._new_with_shape(self._shape.rename(**renames))

    def split(self, **kwargs: Sequence[str] | int) -> Self:
        return self._new_with_shape(self._shape.split(**kwargs))

    def flatten(self, name: str) -> Self:
        return self._new_with_shape(self._shape.flatten(name))

    def to_table(self) -> str:
        return self._shape.to_table()

    def points(self) -> list[Point]:
        return self._shape.points()

    def __len__(self) -> int:
        return self._shape.nelem

    def __iter__(self) -> Iterator[tuple[Point, Self]]:
        shape = self._shape
        for point in shape.points():
            yield point, self._new_with_shape(shape.slice(**point.coords))


#: Public attribute names of every mesh; an endpoint may not use one of them.
MESH_ATTRIBUTE_NAMES: frozenset[str] = frozenset(
    name for name in vars(MeshTrait) if not name.startswith("_")
)
