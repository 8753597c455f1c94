"""Tests for hpcmesh.shapes: Extent, Point, Shape views, to_table, MeshTrait."""

from __future__ import annotations

import itertools
import math
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcmesh.shapes import MESH_ATTRIBUTE_NAMES, Extent, MeshTrait, Point, Shape, point_label

HS = settings(max_examples=200, deadline=None)


def grid(**dims: int) -> Shape:
    return Shape.from_extent(Extent(dims))


# ==========================================================================
# Extent
# ==========================================================================


class TestExtent:
    """Extent is the shared vocabulary for mesh sizes; pin its API and errors."""

    def test_from_mapping(self) -> None:
        e = Extent({"hosts": 2, "gpus": 4})
        assert e.labels == ["hosts", "gpus"]
        assert e.sizes == [2, 4]
        assert e.nelem == 8
        assert len(e) == 2
        assert list(e.keys()) == ["hosts", "gpus"]
        assert list(e) == ["hosts", "gpus"]
        assert e["gpus"] == 4
        assert dict(e) == {"hosts": 2, "gpus": 4}
        assert "hosts" in e and "cpus" not in e and 3 not in e

    def test_from_labels_and_sizes(self) -> None:
        assert Extent(["hosts", "gpus"], [2, 4]) == Extent({"hosts": 2, "gpus": 4})
        assert Extent(("a",), (3,)).sizes == [3]

    def test_empty(self) -> None:
        for e in (Extent(), Extent({}), Extent([], [])):
            assert len(e) == 0
            assert e.nelem == 1
            assert e.labels == [] and e.sizes == []
            assert repr(e) == "Extent({})"

    def test_labels_sizes_are_copies(self) -> None:
        e = Extent({"a": 2})
        e.labels.append("x")
        e.sizes.append(9)
        assert e.labels == ["a"] and e.sizes == [2]

    def test_equality_order_sensitive_between_extents(self) -> None:
        a = Extent({"hosts": 2, "gpus": 4})
        b = Extent({"gpus": 4, "hosts": 2})
        assert a != b
        assert a == Extent({"hosts": 2, "gpus": 4})
        assert a != Extent({"hosts": 2, "gpus": 3})

    def test_equality_with_dicts(self) -> None:
        a = Extent({"hosts": 2, "gpus": 4})
        assert a == {"hosts": 2, "gpus": 4}
        assert {"hosts": 2, "gpus": 4} == a
        assert a != {"hosts": 2}
        assert a != {"hosts": 2, "gpus": 5}
        assert a != [("hosts", 2), ("gpus", 4)]
        assert a != "hosts"

    def test_hashable(self) -> None:
        a = Extent({"hosts": 2, "gpus": 4})
        assert hash(a) == hash(Extent(["hosts", "gpus"], [2, 4]))
        assert len({a, Extent({"hosts": 2, "gpus": 4}), Extent({"gpus": 4, "hosts": 2})}) == 2

    def test_repr(self) -> None:
        assert repr(Extent({"hosts": 2, "gpus": 4})) == "Extent({'hosts': 2, 'gpus': 4})"

    def test_unknown_key(self) -> None:
        e = Extent({"hosts": 2, "gpus": 4})
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'.*\['hosts', 'gpus'\]"):
            e["cpus"]
        assert e.get("cpus") is None
        assert e.get("gpus") == 4

    def test_immutable(self) -> None:
        e = Extent({"a": 1})
        with pytest.raises(AttributeError, match="Extent is immutable"):
            e.sizes = [2]  # type: ignore[misc]

    def test_pickle(self) -> None:
        e = Extent({"hosts": 2, "gpus": 4})
        assert pickle.loads(pickle.dumps(e)) == e

    @pytest.mark.parametrize(
        ("arg", "match"),
        [
            ({"": 2}, "non-empty"),
            ({"1abc": 2}, r"'1abc' is not a valid identifier"),
            ({"a-b": 2}, r"'a-b' is not a valid identifier"),
            ({3: 2}, r"dimension name 3 is not a str"),
            ({"gpus": 0}, r"size of dimension 'gpus' must be positive, got 0"),
            ({"gpus": -1}, r"size of dimension 'gpus' must be positive, got -1"),
            ({"gpus": 2.0}, r"size of dimension 'gpus' must be an int, got 2.0"),
            ({"gpus": "4"}, r"size of dimension 'gpus' must be an int"),
            ({"gpus": True}, r"size of dimension 'gpus' must be an int, got True"),
        ],
    )
    def test_validation(self, arg: dict[Any, Any], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            Extent(arg)

    def test_duplicate_names(self) -> None:
        with pytest.raises(ValueError, match=r"duplicate dimension name 'a'"):
            Extent(["a", "b", "a"], [1, 2, 3])

    def test_length_mismatch(self) -> None:
        with pytest.raises(ValueError, match=r"2 labels \['a', 'b'\] but 1 sizes \[3\]"):
            Extent(["a", "b"], [3])

    def test_bad_call_forms(self) -> None:
        with pytest.raises(TypeError, match="mapping"):
            Extent(["a", "b"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="labels must be a sequence"):
            Extent("ab", [1, 2])


# ==========================================================================
# Point
# ==========================================================================


class TestPoint:
    """Points travel to actors and callbacks; pin rank/coords, equality, pickling."""

    ext = Extent({"hosts": 2, "gpus": 4})

    def test_basics(self) -> None:
        p = Point(6, self.ext)
        assert p.rank == 6
        assert p.extent == self.ext
        assert p["hosts"] == 1 and p["gpus"] == 2
        assert p.coords == {"hosts": 1, "gpus": 2}
        assert list(p) == ["hosts", "gpus"]
        assert len(p) == 2
        assert dict(p) == {"hosts": 1, "gpus": 2}
        assert "gpus" in p and "cpus" not in p
        assert p.size("gpus") == 4
        assert repr(p) == str(p) == "{'hosts': 1/2, 'gpus': 2/4}"   # Monarch's format

    def test_label(self) -> None:
        # the one way a member is named in process names, logs, admin and the debugger
        assert point_label(Point(6, self.ext)) == "hosts=1,gpus=2"
        assert point_label({"gpus": 3}) == "gpus=3"        # coords as they come over JSON
        assert point_label(Point(0, Extent({}))) == "0"   # a mesh with no dimensions

    def test_extent_as_plain_mapping(self) -> None:
        assert Point(6, {"hosts": 2, "gpus": 4}) == Point(6, self.ext)

    def test_unknown_dim(self) -> None:
        p = Point(0, self.ext)
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'; valid dimensions are \['hosts', 'gpus'\]"):
            p["cpus"]

    def test_rank_out_of_range(self) -> None:
        with pytest.raises(IndexError, match=r"rank 8 out of range"):
            Point(8, self.ext)
        with pytest.raises(IndexError, match=r"rank -1 out of range"):
            Point(-1, self.ext)
        with pytest.raises(TypeError, match="rank must be an int"):
            Point(1.0, self.ext)  # type: ignore[arg-type]

    def test_zero_dims(self) -> None:
        p = Point(0, Extent())
        assert p.coords == {} and len(p) == 0 and repr(p) == "{}"

    def test_equality_and_hash(self) -> None:
        assert Point(3, self.ext) == Point(3, Extent({"hosts": 2, "gpus": 4}))
        assert hash(Point(3, self.ext)) == hash(Point(3, Extent({"hosts": 2, "gpus": 4})))
        assert Point(3, self.ext) != Point(4, self.ext)
        # same rank, different extent
        assert Point(3, self.ext) != Point(3, Extent({"gpus": 4, "hosts": 2}))
        assert Point(3, self.ext) == {"hosts": 0, "gpus": 3}
        assert Point(3, self.ext) != self.ext
        assert Point(0, Extent({"a": 1})) != Extent({"a": 1})
        assert Point(3, self.ext) != 3

    def test_from_coords(self) -> None:
        p = Point.from_coords({"gpus": 2, "hosts": 1}, self.ext)
        assert p.rank == 6 and p == Point(6, self.ext)
        assert Point.from_coords({}, Extent()).rank == 0

    def test_from_coords_errors(self) -> None:
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'.*\['hosts', 'gpus'\]"):
            Point.from_coords({"hosts": 0, "gpus": 0, "cpus": 0}, self.ext)
        with pytest.raises(KeyError, match=r"missing coordinate for dimension 'gpus'"):
            Point.from_coords({"hosts": 0}, self.ext)
        with pytest.raises(IndexError, match=r"index 4 out of range for dimension 'gpus' of size 4"):
            Point.from_coords({"hosts": 0, "gpus": 4}, self.ext)
        with pytest.raises(IndexError, match=r"index -1 out of range for dimension 'hosts' of size 2"):
            Point.from_coords({"hosts": -1, "gpus": 0}, self.ext)
        with pytest.raises(TypeError, match=r"coordinate for dimension 'gpus' must be an int"):
            Point.from_coords({"hosts": 0, "gpus": "1"}, self.ext)

    def test_pickle(self) -> None:
        p = Point(5, self.ext)
        q = pickle.loads(pickle.dumps(p))
        assert q == p and q.coords == p.coords and q.extent == self.ext

    def test_immutable(self) -> None:
        with pytest.raises(AttributeError, match="Point is immutable"):
            Point(0, self.ext).rank = 3  # type: ignore[misc]


# ==========================================================================
# Shape: basics
# ==========================================================================


class TestShapeBasics:
    """Construction, queries and value semantics of views."""

    def test_from_extent(self) -> None:
        s = grid(hosts=2, gpus=4)
        assert s.extent == Extent({"hosts": 2, "gpus": 4})
        assert s.labels == ["hosts", "gpus"] and s.sizes == [2, 4]
        assert s.nelem == 8
        assert s.ranks() == list(range(8))
        assert Shape.from_extent({"x": 3}).ranks() == [0, 1, 2]

    def test_zero_dims(self) -> None:
        s = Shape.from_extent(Extent())
        assert s.nelem == 1 and s.ranks() == [0] and s.points() == [Point(0, Extent())]

    def test_points(self) -> None:
        s = grid(hosts=2, gpus=2)
        pts = s.points()
        assert [p.rank for p in pts] == [0, 1, 2, 3]
        assert [p.coords for p in pts] == [
            {"hosts": 0, "gpus": 0},
            {"hosts": 0, "gpus": 1},
            {"hosts": 1, "gpus": 0},
            {"hosts": 1, "gpus": 1},
        ]
        assert all(p.extent == s.extent for p in pts)

    def test_global_index(self) -> None:
        s = grid(hosts=2, gpus=4).slice(gpus=slice(1, 4, 2))  # ranks 1,3,5,7
        assert s.ranks() == [1, 3, 5, 7]
        assert [s.global_index(i) for i in range(4)] == [1, 3, 5, 7]
        assert [s.global_index(p) for p in s.points()] == [1, 3, 5, 7]
        assert s.global_index({"hosts": 1, "gpus": 0}) == 5

    def test_global_index_errors(self) -> None:
        s = grid(hosts=2, gpus=4)
        with pytest.raises(IndexError, match=r"rank 8 out of range for a view of 8 points"):
            s.global_index(8)
        with pytest.raises(ValueError, match=r"belongs to Extent\(\{'a': 8\}\)"):
            s.global_index(Point(0, Extent({"a": 8})))
        with pytest.raises(TypeError, match="Point, a coords mapping or an int"):
            s.global_index("3")  # type: ignore[arg-type]

    def test_rank_of(self) -> None:
        s = grid(hosts=2, gpus=4).slice(gpus=slice(None, None, -2))  # 3,1,7,5
        assert s.ranks() == [3, 1, 7, 5]
        assert [s.rank_of(g) for g in (3, 1, 7, 5)] == [0, 1, 2, 3]
        with pytest.raises(ValueError, match=r"global index 0 is not a member"):
            s.rank_of(0)

    def test_size(self) -> None:
        s = grid(hosts=2, gpus=4, cpus=3)
        assert s.size() == 24
        assert s.size("gpus") == 4
        assert s.size(("hosts", "cpus")) == 6
        with pytest.raises(KeyError, match="unknown dimension 'x'"):
            s.size("x")
        with pytest.raises(TypeError, match="dim must be None, a str or a tuple"):
            s.size(3)  # type: ignore[arg-type]

    def test_value_semantics(self) -> None:
        a = grid(hosts=2, gpus=4)
        b = Shape.from_extent({"hosts": 2, "gpus": 4})
        assert a == b and hash(a) == hash(b)
        assert a != grid(gpus=4, hosts=2)
        assert a != a.rename(hosts="h")
        assert a != a.slice(hosts=slice(0, 1))
        assert a != "shape"
        with pytest.raises(AttributeError, match="Shape is immutable"):
            a.extent = Extent({"gpus": 1})  # type: ignore[misc]

    def test_repr(self) -> None:
        s = grid(hosts=2, gpus=4)
        assert repr(s) == "Shape({'hosts': 2, 'gpus': 4}, offset=0, strides=[4, 1])"
        f = s.slice(gpus=slice(0, 3)).flatten("r")
        assert repr(f) == "Shape({'r': 6}, ranks=[0, 1, 2, 4, 5, 6])"

    def test_constructor(self) -> None:
        s = Shape(["hosts", "gpus"], 1, [2, 2], [4, 2])
        assert s.ranks() == [1, 3, 5, 7]
        assert s == grid(hosts=2, gpus=4).slice(gpus=slice(1, None, 2))

    def test_constructor_validation(self) -> None:
        with pytest.raises(ValueError, match=r"2 dimensions but 1 strides"):
            Shape(["a", "b"], 0, [2, 2], [1])
        with pytest.raises(ValueError, match=r"negative global index -1"):
            Shape(["a"], 0, [2], [-1])
        with pytest.raises(ValueError, match="more than once"):
            Shape(["a", "b"], 0, [2, 2], [1, 1])
        with pytest.raises(ValueError, match="offset must be a non-negative int"):
            Shape(["a"], -1, [2], [1])
        with pytest.raises(ValueError, match=r"stride 1.5 is not an int"):
            Shape(["a"], 0, [2], [1.5])
        with pytest.raises(ValueError, match="size of dimension 'a' must be positive"):
            Shape(["a"], 0, [0], [1])

    def test_from_ranks(self) -> None:
        assert Shape.from_ranks(["x"], [4], [0, 1, 2, 3]) == Shape.from_extent({"x": 4})
        s = Shape.from_ranks(["a", "b"], [2, 2], [9, 2, 7, 4])
        assert s.ranks() == [9, 2, 7, 4]
        assert s.slice(b=1).ranks() == [2, 4]
        with pytest.raises(ValueError, match=r"has 4 points but 3 global indices"):
            Shape.from_ranks(["a", "b"], [2, 2], [0, 1, 2])
        with pytest.raises(ValueError, match="distinct"):
            Shape.from_ranks(["a"], [2], [1, 1])
        with pytest.raises(ValueError, match="non-negative int, got -3"):
            Shape.from_ranks(["a"], [2], [1, -3])

    def test_pickle_strided_and_explicit(self) -> None:
        for s in (
            grid(hosts=2, gpus=4),
            grid(hosts=2, gpus=4).slice(hosts=1),
            grid(hosts=2, gpus=4).slice(gpus=slice(None, None, -1)).flatten("r"),
        ):
            t = pickle.loads(pickle.dumps(s))
            assert t == s and hash(t) == hash(s) and t.ranks() == s.ranks()


# ==========================================================================
# Shape.slice
# ==========================================================================


class TestSlice:
    """slice() is how users address sub-meshes; pin Python-like semantics and errors."""

    s = grid(hosts=2, gpus=4)

    def test_int_removes_dim(self) -> None:
        t = self.s.slice(hosts=1)
        assert t.extent == Extent({"gpus": 4})
        assert t.ranks() == [4, 5, 6, 7]
        u = self.s.slice(hosts=1, gpus=2)
        assert u.extent == Extent() and u.ranks() == [6] and u.nelem == 1

    def test_negative_int(self) -> None:
        assert self.s.slice(gpus=-1).ranks() == [3, 7]
        assert self.s.slice(gpus=-4).ranks() == [0, 4]

    def test_slice_keeps_dim(self) -> None:
        t = self.s.slice(gpus=slice(1, 3))
        assert t.extent == Extent({"hosts": 2, "gpus": 2})
        assert t.ranks() == [1, 2, 5, 6]
        assert self.s.slice(gpus=slice(0, 1)).extent == {"hosts": 2, "gpus": 1}

    def test_steps(self) -> None:
        assert self.s.slice(gpus=slice(None, None, 2)).ranks() == [0, 2, 4, 6]
        assert self.s.slice(gpus=slice(None, None, -1)).ranks() == [3, 2, 1, 0, 7, 6, 5, 4]
        assert self.s.slice(hosts=slice(None, None, -1), gpus=slice(3, 0, -2)).ranks() == [7, 5, 3, 1]

    def test_clamping(self) -> None:
        assert self.s.slice(gpus=slice(2, 100)).ranks() == [2, 3, 6, 7]
        assert self.s.slice(gpus=slice(-100, 1)).ranks() == [0, 4]

    def test_range(self) -> None:
        assert self.s.slice(gpus=range(1, 3)).ranks() == [1, 2, 5, 6]
        assert self.s.slice(gpus=range(3, -1, -2)).ranks() == [3, 1, 7, 5]
        assert self.s.slice(gpus=range(1, 3)) == self.s.slice(gpus=slice(1, 3))

    def test_no_selectors_is_identity(self) -> None:
        assert self.s.slice() == self.s

    def test_out_of_range_int(self) -> None:
        with pytest.raises(IndexError, match=r"index 5 out of range for dimension 'gpus' of size 4"):
            self.s.slice(gpus=5)
        with pytest.raises(IndexError, match=r"index 4 out of range for dimension 'gpus' of size 4"):
            self.s.slice(gpus=4)
        with pytest.raises(IndexError, match=r"index -3 out of range for dimension 'hosts' of size 2"):
            self.s.slice(hosts=-3)

    def test_unknown_dim(self) -> None:
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'; mesh dimensions are \['hosts', 'gpus'\]"):
            self.s.slice(cpus=0)
        # checked before any other error
        with pytest.raises(KeyError, match="cpus"):
            self.s.slice(gpus=99, cpus=0)

    def test_empty_selection(self) -> None:
        with pytest.raises(IndexError, match=r"selects nothing from dimension 'gpus' of size 4"):
            self.s.slice(gpus=slice(3, 1))
        with pytest.raises(IndexError, match=r"selects nothing from dimension 'hosts' of size 2"):
            self.s.slice(hosts=slice(5, None))
        with pytest.raises(IndexError, match=r"selects nothing from dimension 'gpus'"):
            self.s.slice(gpus=range(2, 2))

    def test_range_out_of_range(self) -> None:
        with pytest.raises(IndexError, match=r"index 5 \(from range\(0, 6\)\) out of range for dimension 'gpus' of size 4"):
            self.s.slice(gpus=range(6))
        with pytest.raises(IndexError, match=r"index -1 .* dimension 'gpus' of size 4"):
            self.s.slice(gpus=range(-1, 2))

    @pytest.mark.parametrize("bad", [1.0, "1", [0, 1], None, True, (0,)])
    def test_bad_type(self, bad: object) -> None:
        with pytest.raises(TypeError, match=r"index for dimension 'gpus' must be an int, slice or range"):
            self.s.slice(gpus=bad)  # type: ignore[arg-type]

    def test_bad_slice(self) -> None:
        with pytest.raises(ValueError, match=r"bad slice .* dimension 'gpus'.*zero"):
            self.s.slice(gpus=slice(None, None, 0))
        with pytest.raises(TypeError, match=r"bad slice .* dimension 'gpus'"):
            self.s.slice(gpus=slice("a", None))

    def test_slice_of_explicit_view(self) -> None:
        f = self.s.slice(gpus=slice(0, 3)).flatten("r")  # [0,1,2,4,5,6]
        assert f.slice(r=slice(1, None, 2)).ranks() == [1, 4, 6]
        assert f.slice(r=-1).ranks() == [6]
        assert f.slice(r=slice(None, None, -1)).ranks() == [6, 5, 4, 2, 1, 0]


# ==========================================================================
# rename / split / flatten
# ==========================================================================


class TestRename:
    """rename() only relabels; pin clashes and unknown names."""

    s = grid(hosts=2, gpus=4)

    def test_rename(self) -> None:
        t = self.s.rename(gpus="g")
        assert t.extent == Extent({"hosts": 2, "g": 4})
        assert t.ranks() == self.s.ranks()

    def test_swap(self) -> None:
        t = self.s.rename(hosts="gpus", gpus="hosts")
        assert t.labels == ["gpus", "hosts"] and t.sizes == [2, 4]

    def test_unknown(self) -> None:
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'; mesh dimensions are \['hosts', 'gpus'\]"):
            self.s.rename(cpus="c")

    def test_clash(self) -> None:
        with pytest.raises(ValueError, match=r"two dimensions the name 'hosts'"):
            self.s.rename(gpus="hosts")
        with pytest.raises(ValueError, match=r"two dimensions the name 'x'"):
            self.s.rename(gpus="x", hosts="x")

    def test_bad_new_name(self) -> None:
        with pytest.raises(ValueError, match=r"new name for dimension 'gpus' '2x' is not a valid identifier"):
            self.s.rename(gpus="2x")
        with pytest.raises(ValueError, match=r"new name for dimension 'gpus' 3 is not a str"):
            self.s.rename(gpus=3)  # type: ignore[arg-type]


class TestSplit:
    """split() reshapes one dimension row-major; pin inference and errors."""

    s = grid(hosts=2, gpus=4)

    def test_split_first_size_given(self) -> None:
        t = self.s.split(gpus=("dp", "tp"), dp=2)
        assert t.extent == Extent({"hosts": 2, "dp": 2, "tp": 2})
        assert t.ranks() == list(range(8))
        assert t.slice(tp=0).ranks() == [0, 2, 4, 6]
        assert t.slice(dp=1).ranks() == [2, 3, 6, 7]

    def test_split_second_size_given(self) -> None:
        t = self.s.split(gpus=("dp", "tp"), tp=1)
        assert t.extent == Extent({"hosts": 2, "dp": 4, "tp": 1})

    def test_split_both_sizes(self) -> None:
        assert self.s.split(gpus=("a", "b"), a=4, b=1).extent == {"hosts": 2, "a": 4, "b": 1}

    def test_split_three_ways_and_list(self) -> None:
        t = grid(r=24).split(r=["a", "b", "c"], a=2, c=3)
        assert t.extent == Extent({"a": 2, "b": 4, "c": 3})
        assert t.ranks() == list(range(24))
        assert t.slice(a=1, b=2, c=1).ranks() == [12 + 6 + 1]

    def test_split_reuses_own_name(self) -> None:
        t = self.s.split(gpus=("gpus", "tp"), tp=2)
        assert t.extent == Extent({"hosts": 2, "gpus": 2, "tp": 2})

    def test_split_of_sliced_view(self) -> None:
        t = grid(hosts=2, gpus=8).slice(gpus=slice(None, None, -2))  # 7,5,3,1 / 15,13,11,9
        u = t.split(gpus=("a", "b"), b=2)
        assert u.ranks() == t.ranks()
        assert u.slice(b=0).ranks() == [7, 3, 15, 11]

    def test_several_splits(self) -> None:
        t = grid(x=4, y=6).split(x=("x0", "x1"), y=("y0", "y1"), x0=2, y1=3)
        assert t.extent == Extent({"x0": 2, "x1": 2, "y0": 2, "y1": 3})
        assert t.ranks() == list(range(24))

    def test_empty_call_is_identity(self) -> None:
        assert self.s.split() == self.s

    def test_not_divisible(self) -> None:
        with pytest.raises(ValueError, match=r"cannot split dimension 'gpus' of size 4 into \['dp', 'tp'\]: 4 is not divisible by 3"):
            self.s.split(gpus=("dp", "tp"), dp=3)

    def test_wrong_product(self) -> None:
        with pytest.raises(ValueError, match=r"sizes \[2, 3\] multiply to 6, not 4"):
            self.s.split(gpus=("dp", "tp"), dp=2, tp=3)

    def test_missing_sizes(self) -> None:
        with pytest.raises(ValueError, match=r"give the sizes of all but one.*missing \['dp', 'tp'\]"):
            self.s.split(gpus=("dp", "tp"))

    def test_size_for_unknown_new_name(self) -> None:
        with pytest.raises(ValueError, match=r"size pp=2 but 'pp' is not one of the new dimension names \['dp', 'tp'\]"):
            self.s.split(gpus=("dp", "tp"), pp=2)
        with pytest.raises(ValueError, match=r"'hosts' is not one of the new dimension names"):
            self.s.split(gpus=("dp", "tp"), hosts=2)

    def test_unknown_dim(self) -> None:
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'; mesh dimensions are \['hosts', 'gpus'\]"):
            self.s.split(cpus=("a", "b"), a=1)

    def test_duplicate_names(self) -> None:
        with pytest.raises(ValueError, match=r"duplicate dimension names \['hosts'\]"):
            self.s.split(gpus=("hosts", "tp"), tp=2)
        with pytest.raises(ValueError, match=r"duplicate dimension names \['a'\]"):
            self.s.split(gpus=("a", "a"), a=2)

    def test_bad_names_and_sizes(self) -> None:
        with pytest.raises(ValueError, match=r"new dimension name in split of 'gpus' '1a' is not a valid identifier"):
            self.s.split(gpus=("1a", "b"), b=2)
        with pytest.raises(ValueError, match=r"needs at least one new dimension name"):
            self.s.split(gpus=())
        with pytest.raises(ValueError, match=r"size of new dimension 'dp' must be positive, got 0"):
            self.s.split(gpus=("dp", "tp"), dp=0)
        with pytest.raises(TypeError, match=r"expected a tuple of new names"):
            self.s.split(gpus="dp")  # type: ignore[arg-type]


class TestFlatten:
    """flatten() must work for any view, strided or not."""

    s = grid(hosts=2, gpus=4)

    def test_flatten_identity(self) -> None:
        f = self.s.flatten("rank")
        assert f.extent == Extent({"rank": 8}) and f.ranks() == list(range(8))
        assert f == grid(rank=8)

    def test_flatten_contiguous_slice(self) -> None:
        f = self.s.slice(hosts=1).flatten("r")
        assert f.ranks() == [4, 5, 6, 7]
        assert f == Shape(["r"], 4, [4], [1])
        # stepped but still expressible with one stride
        g = self.s.slice(gpus=slice(None, None, 2)).flatten("r")
        assert g.ranks() == [0, 2, 4, 6] and g == Shape(["r"], 0, [4], [2])

    def test_flatten_non_contiguous_falls_back(self) -> None:
        t = self.s.slice(gpus=slice(0, 3))
        f = t.flatten("r")
        assert f.extent == Extent({"r": 6})
        assert f.ranks() == [0, 1, 2, 4, 5, 6]
        assert [f.global_index(i) for i in range(6)] == [0, 1, 2, 4, 5, 6]
        assert [f.rank_of(g) for g in (0, 1, 2, 4, 5, 6)] == list(range(6))
        # going back restores an equal (strided) view
        back = f.split(r=("hosts", "gpus"), hosts=2)
        assert back == t and hash(back) == hash(t)
        assert repr(back) == repr(t)

    def test_flatten_zero_dims(self) -> None:
        f = self.s.slice(hosts=1, gpus=3).flatten("r")
        assert f.extent == Extent({"r": 1}) and f.ranks() == [7]

    def test_flatten_bad_name(self) -> None:
        with pytest.raises(ValueError, match=r"'a b' is not a valid identifier"):
            self.s.flatten("a b")

    def test_equal_regardless_of_representation(self) -> None:
        # explicit list that happens to be strided is canonicalised
        assert Shape.from_ranks(["r"], [4], [3, 5, 7, 9]) == Shape(["r"], 3, [4], [2])
        assert hash(Shape.from_ranks(["r"], [4], [3, 5, 7, 9])) == hash(Shape(["r"], 3, [4], [2]))
        assert Shape.from_ranks(["a", "b"], [1, 1], [5]) == grid(a=1, b=6, c=1).slice(b=slice(5, 6)).slice(c=0)


# ==========================================================================
# to_table
# ==========================================================================


class TestToTable:
    """Golden text for to_table(), which users read in logs and docs."""

    def test_zero_dims(self) -> None:
        assert Shape.from_extent(Extent()).to_table() == "(single point)"

    def test_one_dim(self) -> None:
        assert grid(gpus=4).to_table() == "gpus: [0, 1, 2, 3]"
        assert grid(hosts=2, gpus=4).slice(hosts=1).to_table() == "gpus: [0, 1, 2, 3]"

    def test_two_dims(self) -> None:
        assert grid(hosts=2, gpus=4).to_table() == (
            "hosts\\gpus 0 1 2 3\n"
            "         0 0 1 2 3\n"
            "         1 4 5 6 7"
        )

    def test_two_dims_slice_uses_view_ranks(self) -> None:
        t = grid(hosts=2, gpus=4).slice(gpus=slice(1, 3))
        assert t.to_table() == (
            "hosts\\gpus 0 1\n"
            "         0 0 1\n"
            "         1 2 3"
        )

    def test_two_dims_wide(self) -> None:
        assert grid(h=3, g=4).to_table() == (
            "h\\g  0  1  2  3\n"
            "  0  0  1  2  3\n"
            "  1  4  5  6  7\n"
            "  2  8  9 10 11"
        )

    def test_three_dims(self) -> None:
        assert grid(hosts=2, x=2, y=3).to_table() == (
            "hosts=0:\n"
            "  x\\y  0  1  2\n"
            "    0  0  1  2\n"
            "    1  3  4  5\n"
            "\n"
            "hosts=1:\n"
            "  x\\y  0  1  2\n"
            "    0  6  7  8\n"
            "    1  9 10 11"
        )

    def test_four_dims_headers(self) -> None:
        text = grid(a=2, b=2, c=1, d=2).to_table()
        headers = [line for line in text.splitlines() if line.endswith(":")]
        assert headers == ["a=0, b=0:", "a=0, b=1:", "a=1, b=0:", "a=1, b=1:"]
        assert text.splitlines()[-1] == "    0 6 7"


# ==========================================================================
# MeshTrait
# ==========================================================================


class FakeMesh(MeshTrait):
    """Minimal mesh used to exercise the mixin."""

    def __init__(self, shape: Shape, tag: str = "fake") -> None:
        self._shape = shape
        self.tag = tag

    def _new_with_shape(self, shape: Shape) -> FakeMesh:
        return FakeMesh(shape, self.tag)


class TestMeshTrait:
    """Every mesh type gets its shape API from the mixin; check the wiring."""

    m = FakeMesh(grid(hosts=2, gpus=4))

    def test_extent_size_len(self) -> None:
        assert self.m.extent == Extent({"hosts": 2, "gpus": 4})
        assert self.m.size() == 8 and len(self.m) == 8
        assert self.m.size("gpus") == 4
        assert self.m.size(("hosts", "gpus")) == 8
        assert self.m.size(()) == 1
        with pytest.raises(KeyError, match=r"unknown dimension 'cpus'"):
            self.m.size("cpus")

    def test_views_return_same_type(self) -> None:
        for view in (
            self.m.slice(hosts=1),
            self.m.rename(gpus="g"),
            self.m.split(gpus=("a", "b"), a=2),
            self.m.flatten("r"),
        ):
            assert isinstance(view, FakeMesh) and view.tag == "fake"
        assert self.m.slice(hosts=1)._shape.ranks() == [4, 5, 6, 7]
        assert self.m.flatten("r").extent == {"r": 8}
        assert self.m.rename(gpus="g").extent == {"hosts": 2, "g": 4}
        assert self.m.split(gpus=("a", "b"), a=2).extent == {"hosts": 2, "a": 2, "b": 2}

    def test_errors_propagate(self) -> None:
        with pytest.raises(IndexError, match="index 5 out of range for dimension 'gpus' of size 4"):
            self.m.slice(gpus=5)

    def test_iteration(self) -> None:
        view = self.m.slice(gpus=slice(1, 3))
        items = list(view)
        assert [p.rank for p, _ in items] == [0, 1, 2, 3]
        assert [p.coords for p, _ in items][2] == {"hosts": 1, "gpus": 0}
        for _, single in items:
            assert isinstance(single, FakeMesh)
            assert len(single) == 1 and single.extent == Extent()
        assert [single._shape.ranks()[0] for _, single in items] == [1, 2, 5, 6]
        assert view.points() == [p for p, _ in items]

    def test_to_table(self) -> None:
        assert self.m.to_table() == grid(hosts=2, gpus=4).to_table()

    def test_attribute_names(self) -> None:
        assert MESH_ATTRIBUTE_NAMES == frozenset(
            {"extent", "size", "slice", "rename", "split", "flatten", "to_table", "points",
             "sizes"}
        )
        assert isinstance(MESH_ATTRIBUTE_NAMES, frozenset)


# ==========================================================================
# Property tests against a reference model
# ==========================================================================

NAMES = ("a", "b", "c", "d")


class Model:
    """Reference: labels, sizes and a nested list of global indices, sliced with plain Python."""

    def __init__(self, labels: list[str], sizes: list[int], nested: Any) -> None:
        self.labels, self.sizes, self.nested = labels, sizes, nested

    @classmethod
    def of(cls, shape: Shape) -> Model:
        return cls(shape.labels, shape.sizes, nest(shape.ranks(), shape.sizes))

    def flat(self) -> list[int]:
        return unnest(self.nested, len(self.sizes))

    def slice(self, sel: dict[str, Any]) -> Model:
        labels, sizes, nested = list(self.labels), list(self.sizes), self.nested
        # deepest first so shallower depths stay valid when a level is removed
        for depth in reversed(range(len(labels))):
            dim = labels[depth]
            if dim not in sel:
                continue
            s = sel[dim]
            nested = at_depth(nested, depth, s)
            if isinstance(s, int):
                del labels[depth], sizes[depth]
            else:
                n = len(range(sizes[depth])[s]) if isinstance(s, slice) else len(s)
                if n == 0:
                    raise IndexError("empty")
                sizes[depth] = n
        return Model(labels, sizes, nested)


def nest(flat: list[int], sizes: list[int]) -> Any:
    if not sizes:
        return flat[0]
    if len(sizes) == 1:
        return list(flat)
    step = math.prod(sizes[1:])
    return [nest(flat[i * step:(i + 1) * step], sizes[1:]) for i in range(sizes[0])]


def unnest(nested: Any, ndim: int) -> list[int]:
    if ndim == 0:
        return [nested]
    return [x for sub in nested for x in unnest(sub, ndim - 1)]


def at_depth(nested: Any, depth: int, s: Any) -> Any:
    if depth == 0:
        if isinstance(s, range):
            return [nested[i] for i in s]
        return nested[s]
    return [at_depth(x, depth - 1, s) for x in nested]


@st.composite
def extents(draw: st.DrawFn, max_dims: int = 4) -> Extent:
    n = draw(st.integers(0, max_dims))
    sizes = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    return Extent(list(NAMES[:n]), sizes)


@st.composite
def selector(draw: st.DrawFn, size: int, allow_empty: bool = True) -> Any:
    kind = draw(st.sampled_from(["int", "slice", "range"]))
    if kind == "int":
        return draw(st.integers(-size, size - 1))
    if kind == "slice":
        bound = st.none() | st.integers(-size - 2, size + 2)
        step = draw(st.none() | st.integers(-3, 3).filter(bool))
        s = slice(draw(bound), draw(bound), step)
        if not allow_empty and not range(size)[s]:
            return slice(None, None, step)
        return s
    start = draw(st.integers(0, size - 1))
    step = draw(st.integers(-size, size).filter(bool))
    count_max = (size - 1 - start) // step + 1 if step > 0 else start // -step + 1
    count = draw(st.integers(1, count_max))
    return range(start, start + count * step, step)


@st.composite
def selections(draw: st.DrawFn, shape: Shape, allow_empty: bool = True) -> dict[str, Any]:
    out = {}
    for dim, size in zip(shape.labels, shape.sizes):
        if draw(st.booleans()):
            out[dim] = draw(selector(size, allow_empty))
    return out


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    """Random views: sliced identity or explicit views, sometimes flattened and re-split
    into other dimensions (explicit, non-strided, when the slice was not contiguous)."""
    ext = draw(extents())
    if draw(st.integers(0, 3)) == 0:
        # arbitrary members in arbitrary order: almost never strided
        pool = draw(st.permutations(range(ext.nelem + 3)))
        s = Shape.from_ranks(ext.labels, ext.sizes, pool[: ext.nelem])
    else:
        s = Shape.from_extent(ext)
    s = s.slice(**draw(selections(s, allow_empty=False)))
    mode = draw(st.sampled_from(["plain", "round_trip", "reshape"]))
    if mode == "round_trip" and s.labels:
        labels, sizes = s.labels, s.sizes
        back = s.flatten("flat").split(flat=tuple(labels), **dict(zip(labels[:-1], sizes[:-1])))
        assert back == s
    elif mode == "reshape":
        ranks = s.ranks()
        rest, new_sizes = s.nelem, []
        for _ in range(draw(st.integers(0, 2))):
            d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
            new_sizes.append(d)
            rest //= d
        new_sizes.append(rest)
        names = ("p", "q", "r")[: len(new_sizes)]
        s = s.flatten("flat").split(flat=names, **dict(zip(names[1:], new_sizes[1:])))
        assert s.sizes == new_sizes and s.ranks() == ranks
    if draw(st.booleans()):
        s = s.rename(**{d: d.upper() for d in s.labels})
    return s


def compose(shape: Shape, k1: dict[str, Any], k2: dict[str, Any]) -> dict[str, Any]:
    """One selection on ``shape`` equivalent to ``slice(**k1)`` then ``slice(**k2)``."""
    out: dict[str, Any] = {}
    for dim, size in zip(shape.labels, shape.sizes):
        r: Any = range(size)
        if dim in k1:
            s1 = k1[dim]
            r = s1 if isinstance(s1, range) else r[s1]
        if dim in k2:
            s2 = k2[dim]
            if isinstance(s2, range):
                r = range(r[s2.start], r.start + r.step * (s2.start + len(s2) * s2.step), r.step * s2.step)
            else:
                r = r[s2]
        if dim in k1 or dim in k2:
            out[dim] = r
    return out


@HS
@given(st.data())
def test_slice_of_slice_matches_model_and_composition(data: st.DataObject) -> None:
    base = data.draw(shapes())
    model = Model.of(base)
    k1 = data.draw(selections(base))
    try:
        m1 = model.slice(k1)
    except IndexError:
        with pytest.raises(IndexError, match="selects nothing"):
            base.slice(**k1)
        return
    s1 = base.slice(**k1)
    assert (s1.labels, s1.sizes, s1.ranks()) == (m1.labels, m1.sizes, m1.flat())
    k2 = data.draw(selections(s1))
    try:
        m2 = m1.slice(k2)
    except IndexError:
        with pytest.raises(IndexError, match="selects nothing"):
            s1.slice(**k2)
        return
    s2 = s1.slice(**k2)
    assert (s2.labels, s2.sizes, s2.ranks()) == (m2.labels, m2.sizes, m2.flat())
    direct = base.slice(**compose(base, k1, k2))
    assert direct == s2 and hash(direct) == hash(s2)
    assert direct.ranks() == s2.ranks()
    assert [s2.global_index(p) for p in s2.points()] == s2.ranks()
    assert [s2.rank_of(g) for g in s2.ranks()] == list(range(s2.nelem))


@HS
@given(st.data())
def test_reshapes_keep_members_and_order(data: st.DataObject) -> None:
    s = data.draw(shapes())
    ranks = s.ranks()
    # rename: a random permutation of names
    perm = data.draw(st.permutations(s.labels))
    r = s.rename(**dict(zip(s.labels, perm)))
    assert r.labels == list(perm) and r.sizes == s.sizes and r.ranks() == ranks
    # flatten
    f = s.flatten("all")
    assert f.extent == Extent({"all": s.nelem}) and f.ranks() == ranks
    # split of a dimension into two, one size given
    if s.labels:
        i = data.draw(st.integers(0, len(s.labels) - 1))
        dim, size = s.labels[i], s.sizes[i]
        outer = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        which = data.draw(st.sampled_from(["outer", "inner"]))
        given_size = {"x_o": outer} if which == "outer" else {"x_i": size // outer}
        sp = s.split(**{dim: ("x_o", "x_i")}, **given_size)
        assert sp.labels == s.labels[:i] + ["x_o", "x_i"] + s.labels[i + 1:]
        assert sp.sizes == s.sizes[:i] + [outer, size // outer] + s.sizes[i + 1:]
        assert sp.ranks() == ranks
        assert sp.flatten("all") == f
        assert sp.flatten(dim).split(**{dim: tuple(sp.labels)}, **dict(zip(sp.labels[1:], sp.sizes[1:]))) == sp


@HS
@given(extents(), st.data())
def test_point_coords_round_trip(ext: Extent, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, ext.nelem - 1))
    p = Point(rank, ext)
    reference = list(itertools.product(*(range(n) for n in ext.sizes)))[rank]
    assert tuple(p.coords.values()) == reference
    assert list(p.coords) == ext.labels
    q = Point.from_coords(p.coords, ext)
    assert q == p and q.rank == rank and hash(q) == hash(p)
    assert pickle.loads(pickle.dumps(p)) == p


@HS
@given(shapes(), st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_shape_pickle_round_trip(s: Shape, protocol: int) -> None:
    t = pickle.loads(pickle.dumps(s, protocol=protocol))
    assert t == s and hash(t) == hash(s)
    assert t.ranks() == s.ranks() and t.extent == s.extent
    assert t.to_table() == s.to_table()
