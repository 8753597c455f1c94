"""torch.distributed collectives along named mesh dimensions.

Actors of one ActorMesh form process groups along any subset of the mesh's
dimensions.  For extent ``{"hosts": H, "gpus": G}``::

    all_reduce(t, dims="gpus")            # actors sharing a ``hosts`` coordinate
    all_reduce(t, dims="hosts")           # actors sharing a ``gpus`` coordinate
    all_reduce(t, dims=("hosts", "gpus")) # everyone (same as dims=None)

A group is the set of members whose coordinates agree on every dimension *not*
in ``dims``; a member's rank in its group is its row-major rank over ``dims``
taken in mesh order.  ``extent={"dp": 4, "tp": 2}`` reinterprets the flat ranks
of the 8 members row-major in another shape (what ``rename``/``split`` views
of the same processes mean).

Why no ``init_process_group``: one process may host several actor meshes and
the user may want their own default group.  Each :class:`MeshCollectives`
therefore owns a ``TCPStore`` (served by member 0 at the controller-provided
rendezvous) and builds backend objects (``ProcessGroupGloo`` for CPU tensors,
``ProcessGroupNCCL`` for CUDA tensors) directly, each under its own
``PrefixStore``.  Only the members of a group take part in creating it, so a
group can be formed by a subset of the mesh without the others' help.

torch is imported here and only here in hpcmesh (nothing imports this module
unless the user does).
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import threading
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Union

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOptions,
    ReduceScatterOptions,
)

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "GroupSpec",
    "MeshCollectives",
    "Rendezvous",
    "all_gather",
    "all_reduce",
    "attach",
    "barrier",
    "broadcast",
    "compute_group",
    "get_collectives",
    "group_members",
    "group_rank",
    "group_size",
    "reduce",
    "reduce_scatter",
]

Dims = Union[str, Sequence[str], None]
Timeout = Union[float, int, timedelta, None]

TIMEOUT_ENV = "HPCMESH_COLLECTIVE_TIMEOUT"
CHECK_ENV = "HPCMESH_COLLECTIVE_CHECK"
DEFAULT_TIMEOUT_S = 60.0
_CACHE_ATTR = "_hpcmesh_collectives"


# --------------------------------------------------------------------------
# errors and small value types
# --------------------------------------------------------------------------


class CollectiveError(RuntimeError):
    """A collective (or the creation of its group) failed or timed out."""


class CollectiveMismatchError(CollectiveError):
    """Members of one group called different collectives or passed different
    shapes/dtypes; detected before the data moves, so the group stays usable
    (gloo would otherwise abort the whole process)."""


class _DimError(KeyError):
    """KeyError whose text is readable (plain KeyError shows a repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Rendezvous(NamedTuple):
    """Where member 0 serves the group store; the runtime passes an object
    with the same three attributes."""

    addr: str
    port: int
    prefix: str


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


# --------------------------------------------------------------------------
# pure helpers: extents, dims, groups
# --------------------------------------------------------------------------


def _extent_items(extent: Any) -> tuple[tuple[str, int], ...]:
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


def _fmt_extent(items: tuple[tuple[str, int], ...]) -> str:
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"


def _normalize_dims(dims: Dims, extent: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
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
            raise _DimError(
                f"unknown mesh dimension {d!r}; available dimensions: {names} "
                f"(mesh extent {_fmt_extent(extent)})"
            )
    chosen = set(wanted)
    return tuple(n for n in names if n in chosen)


def _unravel(rank: int, sizes: Sequence[int]) -> list[int]:
    coords = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        rank, coords[i] = divmod(rank, sizes[i])
    return coords


def _ravel(coords: Sequence[int], sizes: Sequence[int]) -> int:
    r = 0
    for c, s in zip(coords, sizes):
        r = r * s + c
    return r


def compute_group(rank: int, extent: Any, dims: Dims) -> GroupSpec:
    """The group of flat ``rank`` along ``dims`` (pure; usable without torch
    groups, e.g. by the controller to predict membership)."""
    items = _extent_items(extent)
    sizes = [s for _, s in items]
    world = math.prod(sizes)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a mesh of {world} members (extent {_fmt_extent(items)})")
    dims_t = _normalize_dims(dims, items)
    in_group = [name in dims_t for name, _ in items]
    mine = _unravel(rank, sizes)
    members = []
    for combo in itertools.product(*(range(s) for (n, s), g in zip(items, in_group) if g)):
        it = iter(combo)
        coords = [next(it) if g else c for c, g in zip(mine, in_group)]
        members.append(_ravel(coords, sizes))
    other_coords = [c for c, g in zip(mine, in_group) if not g]
    other_sizes = [s for s, g in zip(sizes, in_group) if not g]
    return GroupSpec(
        extent=items,
        dims=dims_t,
        members=tuple(members),
        rank=members.index(rank),
        index=_ravel(other_coords, other_sizes),
    )


def _as_timedelta(timeout: Timeout, default: timedelta | None = None) -> timedelta:
    if timeout is None:
        if default is not None:
            return default
        raw = os.environ.get(TIMEOUT_ENV)
        if raw is None or raw.strip() == "":
            return timedelta(seconds=DEFAULT_TIMEOUT_S)
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if isinstance(timeout, timedelta):
        td = timeout
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        td = timedelta(seconds=float(timeout))
    else:
        raise TypeError(f"timeout must be seconds or a timedelta, got {timeout!r}")
    if td.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {td}")
    return td


def _check_from_env() -> bool | None:
    raw = os.environ.get(CHECK_ENV)
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{CHECK_ENV}={raw!r}: use 1/0 (or true/false)")


# --------------------------------------------------------------------------
# reduce ops
# --------------------------------------------------------------------------

_R = dist.ReduceOp
_OP_NAMES = {
    "sum": _R.SUM,
    "product": _R.PRODUCT,
    "prod": _R.PRODUCT,
    "min": _R.MIN,
    "max": _R.MAX,
    "avg": _R.AVG,
    "mean": _R.AVG,
    "band": _R.BAND,
    "bor": _R.BOR,
    "bxor": _R.BXOR,
}
_CANON = {  # RedOpType -> canonical name
    _R.SUM: "sum",
    _R.PRODUCT: "product",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.AVG: "avg",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}


def _resolve_op(op: Any) -> tuple[str, Any]:
    """Return (canonical name or 'custom', value to hand to torch)."""
    if isinstance(op, str):
        key = op.strip().lower()
        if key not in _OP_NAMES:
            raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(_OP_NAMES)} or a torch.distributed.ReduceOp")
        red = _OP_NAMES[key]
        return _CANON[red], red
    if isinstance(op, _R.RedOpType):
        return _CANON.get(op, "custom"), op
    if isinstance(op, _R):
        # ReduceOp instances compare equal to RedOpType only from this side.
        for red, name in _CANON.items():
            if op == red:
                return name, red
        return "custom", op  # e.g. PREMUL_SUM with a factor
    raise TypeError(f"reduce op must be a name or torch.distributed.ReduceOp, got {op!r}")


# --------------------------------------------------------------------------
# fingerprints for the cheap pre-collective consistency check
# --------------------------------------------------------------------------

_MAX_SHAPE = 8
_DTYPES = {zlib.crc32(str(d).encode()) & 0x7FFFFFFF: d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_OPS = ("all_reduce", "reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
_OP_CODES: dict[int, str] = {}
for _o in _OPS:
    for _n in list(_CANON.values()) + ["custom", ""]:
        _OP_CODES[zlib.crc32(f"{_o}:{_n}".encode()) & 0x7FFFFFFF] = f"{_o}({_n})" if _n else _o


def _fingerprint(opname: str, redop: str, root: int, tensor: torch.Tensor | None) -> list[int]:
    code = zlib.crc32(f"{opname}:{redop}".encode()) & 0x7FFFFFFF
    if tensor is None:
        return [code, root, 0, -1, 0, 0, 0] + [-1] * _MAX_SHAPE
    shape = list(tensor.shape)
    dtype_code = zlib.crc32(str(tensor.dtype).encode()) & 0x7FFFFFFF
    shape_hash = zlib.crc32(repr(shape).encode()) & 0x7FFFFFFF
    padded = (shape + [-1] * _MAX_SHAPE)[:_MAX_SHAPE]
    return [code, root, dtype_code, tensor.dim(), tensor.numel(), shape_hash, 1] + padded


def _describe_fingerprint(row: Sequence[int]) -> str:
    code, root, dtype_code, ndim, numel, _h, has_tensor = row[:7]
    op = _OP_CODES.get(code, f"op#{code}")
    if not has_tensor:
        return op
    shape = [s for s in row[7 : 7 + min(ndim, _MAX_SHAPE)]]
    if ndim > _MAX_SHAPE:
        shape.append("...")
    dtype = str(_DTYPES.get(dtype_code, f"dtype#{dtype_code}")).replace("torch.", "")
    text = f"{op} {dtype}{shape} ({numel} elements)"
    if op.startswith(("reduce(", "broadcast")):
        text += f" root={root}"
    return text


# --------------------------------------------------------------------------
# the per-member object
# --------------------------------------------------------------------------


class MeshCollectives:
    """Collectives for one member of one actor mesh.

    Holds the member's flat rank and extent, the rendezvous, the group store
    and the cache of backend objects, keyed by (backend, extent, dims), so a
    group is built once and reused.  Usable directly (tests, custom runtimes)
    or through the module-level functions inside an actor.

    ``check``: before each collective, all-gather a small fingerprint (op,
    dtype, shape, root) and raise :class:`CollectiveMismatchError` on every
    member if they disagree; costs one tiny gloo round trip.  None means on
    for CPU (gloo aborts the whole process on a size mismatch) and off for
    CUDA; ``HPCMESH_COLLECTIVE_CHECK=0/1`` overrides the default.  All
    members must use the same setting.
    """

    def __init__(
        self,
        point_rank: int,
        extent: Any,
        rendezvous: Any,
        timeout: Timeout = None,
        *,
        check: bool | None = None,
    ) -> None:
        self.extent = _extent_items(extent)
        self.world_size = math.prod(s for _, s in self.extent)
        if isinstance(point_rank, bool) or not isinstance(point_rank, int):
            raise TypeError(f"point_rank must be an int, got {point_rank!r}")
        if not 0 <= point_rank < self.world_size:
            raise ValueError(
                f"rank {point_rank} outside a mesh of {self.world_size} members (extent {_fmt_extent(self.extent)})"
            )
        self.rank = point_rank
        self.rendezvous = rendezvous
        self.timeout = _as_timedelta(timeout)
        env_check = _check_from_env()
        self.check = check if check is not None else env_check
        self._store: Any = None
        self._groups: dict[tuple, Any] = {}
        self._broken: dict[tuple, str] = {}
        self._lock = threading.RLock()
        self._closed = False

    @classmethod
    def for_point(cls, point: Any, rendezvous: Any, timeout: Timeout = None, **kw: Any) -> "MeshCollectives":
        """Build from a Point (``.rank`` flat, ``.extent`` ordered mapping)."""
        return cls(int(point.rank), point.extent, rendezvous, timeout, **kw)

    # ---- groups (pure) ---------------------------------------------------

    def _extent_for(self, extent: Any) -> tuple[tuple[str, int], ...]:
        if extent is None:
            return self.extent
        items = _extent_items(extent)
        n = math.prod(s for _, s in items)
        if n != self.world_size:
            raise ValueError(
                f"extent {_fmt_extent(items)} has {n} members but the mesh "
                f"{_fmt_extent(self.extent)} has {self.world_size}; an extent override "
                "must reshape all members"
            )
        return items

    def group(self, dims: Dims = None, *, extent: Any = None) -> GroupSpec:
        """The group this member belongs to along ``dims`` (no communication)."""
        return compute_group(self.rank, self._extent_for(extent), dims)

    def group_rank(self, dims: Dims = None, *, extent: Any = None) -> int:
        return self.group(dims, extent=extent).rank

    def group_size(self, dims: Dims = None, *, extent: Any = None) -> int:
        return self.group(dims, extent=extent).size

    def group_members(self, dims: Dims = None, *, extent: Any = None) -> list[int]:
        return list(self.group(dims, extent=extent).members)

    # ---- store and backends ----------------------------------------------

    def _get_store(self) -> Any:
        """Connect (or, on member 0, serve) the TCPStore shared by all groups."""
        with self._lock:
            if self._closed:
                raise CollectiveError("MeshCollectives is closed")
            if self._store is not None:
                return self._store
            rdv = self.rendezvous
            if rdv is None:
                raise CollectiveError(
                    "this actor mesh has no collectives rendezvous (actor_instance.rendezvous "
                    f"is None; mesh extent {_fmt_extent(self.extent)}): the runtime must spawn "
                    "the mesh with a rendezvous (address and port of member 0) to use "
                    "hpcmesh.collectives with groups of more than one member"
                )
            master = self.rank == 0
            try:
                self._store = dist.TCPStore(
                    str(rdv.addr),
                    int(rdv.port),
                    self.world_size,
                    is_master=master,
                    timeout=self.timeout,
                    wait_for_workers=False,
                )
            except Exception as e:  # RuntimeError / DistNetworkError / DistStoreError
                what = "serve" if master else "connect to"
                raise CollectiveError(
                    f"member {self.rank} could not {what} the collectives store at "
                    f"{rdv.addr}:{rdv.port} (prefix {rdv.prefix!r}, timeout "
                    f"{self.timeout.total_seconds():g}s): {_first_line(e)}"
                    + ("" if master else "; member 0 serves it from attach() or its first collective")
                ) from e
            return self._store

    def start_store(self) -> None:
        """Create the store now (member 0: start serving), so that groups not
        containing member 0 do not wait for member 0's first collective."""
        if self.world_size > 1:
            self._get_store()

    def backend(self, dims: Dims = None, device: Any = "cpu", *, extent: Any = None) -> Any:
        """The torch backend object (ProcessGroupGloo/NCCL) for this member's
        group along ``dims``; for callers that need raw torch APIs."""
        spec = self.group(dims, extent=extent)
        return self._backend_for(spec, torch.device(device), "backend")

    def _backend_for(self, spec: GroupSpec, device: torch.device, opname: str) -> Any:
        if device.type == "cpu":
            kind = "gloo"
        elif device.type == "cuda":
            kind = "nccl"
        else:
            raise CollectiveError(
                f"{opname}: no collective backend for tensors on {device} "
                "(hpcmesh uses gloo for CPU tensors and NCCL for CUDA tensors)"
            )
        key = (kind, spec.extent, spec.dims)
        with self._lock:
            if key in self._broken:
                raise CollectiveError(
                    f"{opname}: the {kind} group for {spec.describe()} is unusable after an "
                    f"earlier failure: {self._broken[key]}"
                )
            pg = self._groups.get(key)
            if pg is not None:
                return pg
            if kind == "nccl" and not dist.is_nccl_available():
                raise CollectiveError(
                    f"{opname}: tensor is on {device}, which needs the NCCL backend, but NCCL "
                    f"is not available in this torch build ({torch.__version__}); move the "
                    "tensor to the CPU to use gloo"
                )
            store = dist.PrefixStore(spec.store_key(self._prefix(), kind), self._get_store())
            try:
                if kind == "gloo":
                    pg = dist.ProcessGroupGloo(store, spec.rank, spec.size, self.timeout)
                else:
                    pg = self._make_nccl(store, spec)
            except Exception as e:
                raise CollectiveError(
                    f"{opname}: creating the {kind} group for {spec.describe()} failed "
                    f"(timeout {self.timeout.total_seconds():g}s; every group member must call "
                    f"the same collective): {_first_line(e)}"
                ) from e
            self._groups[key] = pg
            return pg

    def _prefix(self) -> str:
        rdv = self.rendezvous
        return "" if rdv is None else str(rdv.prefix)

    def _make_nccl(self, store: Any, spec: GroupSpec) -> Any:
        """NCCL is imported/created only when a CUDA tensor shows up."""
        from torch.distributed import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = self.timeout
        try:
            opts.global_ranks_in_group = list(spec.members)
        except Exception:  # attribute differs across torch releases
            pass
        return ProcessGroupNCCL(store, spec.rank, spec.size, opts)

    def _mark_broken(self, spec: GroupSpec, kind: str, why: str) -> None:
        with self._lock:
            self._broken[(kind, spec.extent, spec.dims)] = why

    # ---- running ops -----------------------------------------------------

    def _want_check(self, device: torch.device) -> bool:
        return self.check if self.check is not None else device.type == "cpu"

    def _run(self, spec: GroupSpec, kind: str, opname: str, timeout: timedelta, start) -> None:
        """Start a torch op and wait, turning failures into CollectiveError.

        A failed/timed-out gloo group is left in an undefined state (peers may
        be mid-transfer), so it is marked unusable rather than reused."""
        try:
            work = start()
        except Exception as e:
            # Refused before any byte moved (unsupported op/dtype): the group
            # itself is fine, so it is not marked unusable.
            raise CollectiveError(f"{opname} along {spec.describe()} was refused by {kind}: {_first_line(e)}") from e
        try:
            work.wait()
        except Exception as e:
            msg = _first_line(e)
            self._mark_broken(spec, kind, f"{opname}: {msg}")
            raise CollectiveError(
                f"{opname} along {spec.describe()} failed on member {self.rank} "
                f"(timeout {timeout.total_seconds():g}s; a member died, hung, or called "
                f"a different collective): {msg}"
            ) from e

    def _consistency_check(
        self, spec: GroupSpec, opname: str, redop: str, root: int, tensor: torch.Tensor | None, timeout: timedelta
    ) -> None:
        pg = self._backend_for(spec, torch.device("cpu"), opname)
        mine = torch.tensor(_fingerprint(opname, redop, root, tensor), dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(spec.size)]
        opts = AllgatherOptions()
        opts.timeout = timeout
        self._run(spec, "gloo", f"{opname} (consistency check)", timeout, lambda: pg.allgather([rows], [mine], opts))
        seen = [r.tolist() for r in rows]
        if all(r == seen[0] for r in seen):
            return
        by_sig: dict[str, list[int]] = {}
        for member, row in zip(spec.members, seen):
            by_sig.setdefault(_describe_fingerprint(row), []).append(member)
        detail = "; ".join(f"members {m} called {sig}" for sig, m in by_sig.items())
        raise CollectiveMismatchError(
            f"{opname}: group members disagree on the collective along {spec.describe()}: {detail}"
        )

    def _prepare(self, opname: str, dims: Dims, extent: Any, tensor: torch.Tensor | None, timeout: Timeout):
        if not isinstance(tensor, (torch.Tensor, type(None))):
            raise TypeError(f"{opname}: expected a torch.Tensor, got {type(tensor).__name__}")
        spec = self.group(dims, extent=extent)
        td = _as_timedelta(timeout, self.timeout)
        return spec, td

    def _go(self, spec, opname, redop, root, tensor, td):
        """Common path: pick the backend, optionally check, return it."""
        device = tensor.device if tensor is not None else torch.device("cpu")
        kind = "gloo" if device.type == "cpu" else "nccl"
        if redop:
            _validate_reduce(opname, redop, tensor, kind)
        pg = self._backend_for(spec, device, opname)
        if self._want_check(device):
            self._consistency_check(spec, opname, redop, root, tensor, td)
        return pg, kind

    @staticmethod
    def _avg_fixup(t: torch.Tensor, n: int) -> None:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.div_(n)
        else:
            t.div_(n, rounding_mode="trunc")  # what NCCL's integer avg does

    def all_reduce(self, tensor: torch.Tensor, dims: Dims = None, op: Any = "sum", *, extent: Any = None,
                   timeout: Timeout = None) -> torch.Tensor:
        """Reduce ``tensor`` over the group in place; returns it."""
        name, red = _resolve_op(op)
        spec, td = self._prepare("all_reduce", dims, extent, tensor, timeout)
        if spec.size == 1 and name != "custom":
            _validate_reduce("all_reduce", name, tensor, "gloo" if tensor.device.type == "cpu" else "nccl")
            return tensor
        pg, kind = self._go(spec, "all_reduce", name, 0, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = AllreduceOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.timeout = td
        self._run(spec, kind, "all_reduce", td, lambda: pg.allreduce([_wire(buf)], opts))
        if emulate_avg:
            self._avg_fixup(buf, spec.size)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def reduce(self, tensor: torch.Tensor, dst: int = 0, dims: Dims = None, op: Any = "sum", *,
               extent: Any = None, timeout: Timeout = None) -> torch.Tensor:
        """Reduce into ``tensor`` on group rank ``dst``; other members'
        tensors are left unspecified (as in torch.distributed)."""
        name, red = _resolve_op(op)
        spec, td = self._prepare("reduce", dims, extent, tensor, timeout)
        _check_root("reduce", "dst", dst, spec)
        if spec.size == 1 and name != "custom":
            _validate_reduce("reduce", name, tensor, "gloo" if tensor.device.type == "cpu" else "nccl")
            return tensor
        pg, kind = self._go(spec, "reduce", name, dst, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = ReduceOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.rootRank = dst
        opts.rootTensor = 0
        opts.timeout = td
        self._run(spec, kind, "reduce", td, lambda: pg.reduce([_wire(buf)], opts))
        if spec.rank == dst:
            if emulate_avg:
                self._avg_fixup(buf, spec.size)
            if buf is not tensor:
                tensor.copy_(buf)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dims: Dims = None, *, extent: Any = None,
                   timeout: Timeout = None) -> list[torch.Tensor]:
        """Every member's ``tensor``, ordered by group rank (new tensors)."""
        spec, td = self._prepare("all_gather", dims, extent, tensor, timeout)
        if spec.size == 1:
            return [tensor.clone()]
        pg, kind = self._go(spec, "all_gather", "", 0, tensor, td)
        inp = tensor.contiguous()
        outs = [torch.empty_like(inp, memory_format=torch.contiguous_format) for _ in range(spec.size)]
        opts = AllgatherOptions()
        opts.timeout = td
        self._run(spec, kind, "all_gather", td,
                  lambda: pg.allgather([[_wire(o) for o in outs]], [_wire(inp)], opts))
        return outs

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], dims: Dims = None,
                       op: Any = "sum", *, extent: Any = None, timeout: Timeout = None) -> torch.Tensor:
        """``output`` on group rank i becomes the reduction of every member's
        ``inputs[i]``; returns ``output``."""
        name, red = _resolve_op(op)
        spec, td = self._prepare("reduce_scatter", dims, extent, output, timeout)
        inputs = list(inputs)
        if len(inputs) != spec.size:
            raise ValueError(
                f"reduce_scatter needs one input per group member: got {len(inputs)} inputs "
                f"for a group of {spec.size} ({spec.describe()})"
            )
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"reduce_scatter: inputs[{i}] is {type(t).__name__}, not a tensor")
            if t.shape != output.shape or t.dtype != output.dtype or t.device != output.device:
                raise ValueError(
                    f"reduce_scatter: inputs[{i}] is {t.dtype}{list(t.shape)} on {t.device} but "
                    f"output is {output.dtype}{list(output.shape)} on {output.device}; they must match"
                )
        if spec.size == 1 and name != "custom":
            _validate_reduce("reduce_scatter", name, output, "gloo" if output.device.type == "cpu" else "nccl")
            output.copy_(inputs[0])
            return output
        pg, kind = self._go(spec, "reduce_scatter", name, 0, output, td)
        emulate_avg = name == "avg" and kind == "gloo"
        out = output if output.is_contiguous() else output.contiguous()
        ins = [_wire(t.contiguous()) for t in inputs]
        opts = ReduceScatterOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.timeout = td
        self._run(spec, kind, "reduce_scatter", td, lambda: pg.reduce_scatter([_wire(out)], [ins], opts))
        if emulate_avg:
            self._avg_fixup(out, spec.size)
        if out is not output:
            output.copy_(out)
        return output

    def broadcast(self, tensor: torch.Tensor, src: int = 0, dims: Dims = None, *, extent: Any = None,
                  timeout: Timeout = None) -> torch.Tensor:
        """Copy group rank ``src``'s ``tensor`` into every member's; returns it."""
        spec, td = self._prepare("broadcast", dims, extent, tensor, timeout)
        _check_root("broadcast", "src", src, spec)
        if spec.size == 1:
            return tensor
        pg, kind = self._go(spec, "broadcast", "", src, tensor, td)
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        opts.timeout = td
        self._run(spec, kind, "broadcast", td, lambda: pg.broadcast([_wire(buf)], opts))
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def barrier(self, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None) -> None:
        """Wait until every group member reaches the barrier (gloo, CPU)."""
        spec, td = self._prepare("barrier", dims, extent, None, timeout)
        if spec.size == 1:
            return
        pg, kind = self._go(spec, "barrier", "", 0, None, td)
        opts = BarrierOptions()
        opts.timeout = td
        self._run(spec, kind, "barrier", td, lambda: pg.barrier(opts))

    def close(self) -> None:
        """Drop groups and the store (member 0 stops serving it).  Call from
        actor cleanup; members still using groups with this one will fail."""
        with self._lock:
            self._closed = True
            groups, self._groups = self._groups, {}
            for pg in groups.values():
                try:
                    pg.shutdown()
                except Exception:
                    pass
            self._store = None


def _wire(t: torch.Tensor) -> torch.Tensor:
    """Complex tensors travel as their real view (gloo lacks complex
    gather/broadcast; sum/avg are elementwise on the real view)."""
    return torch.view_as_real(t) if t.is_complex() else t


_BITWISE = ("band", "bor", "bxor")


def _validate_reduce(opname: str, name: str, t: torch.Tensor, kind: str) -> None:
    """Refuse locally what the backend would refuse only after the group is
    engaged (a refusal inside work.wait() leaves the group marked unusable)."""
    if name == "custom" and kind == "gloo":
        raise ValueError(f"{opname}: gloo supports only sum/product/min/max/avg/band/bor/bxor, not {name} ops")
    if t.is_complex() and name not in ("sum", "avg"):
        raise ValueError(f"{opname}: op={name!r} is not defined for complex tensors ({t.dtype}); use sum or avg")
    if name in _BITWISE and (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"{opname}: op={name!r} needs an integer or bool tensor, got {t.dtype}")
    if name == "avg" and t.dtype == torch.bool:
        raise ValueError(f"{opname}: op='avg' is not defined for bool tensors")


def _first_line(e: BaseException) -> str:
    """torch errors can carry C++ frames after the first line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check_root(opname: str, what: str, root: Any, spec: GroupSpec) -> None:
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < spec.size:
        raise ValueError(
            f"{opname}: {what}={root!r} must be a group rank in [0, {spec.size}) for {spec.describe()}"
        )


# --------------------------------------------------------------------------
# module-level API: the current actor's MeshCollectives
# --------------------------------------------------------------------------

_fallback_cache: "weakref.WeakKeyDictionary[Any, MeshCollectives]" = weakref.WeakKeyDictionary()
_fallback_lock = threading.Lock()


def _current_member() -> tuple[Any, Any, Any]:
    """(point, rendezvous, owner for the cache) of the calling actor.

    Imported lazily: hpcmesh.actor sits above this module's dependencies and
    may not be importable in a bare worker."""
    try:
        actor_mod = importlib.import_module("hpcmesh.actor")
    except ImportError as e:
        raise RuntimeError(
            "hpcmesh.collectives module functions need hpcmesh.actor (call them inside an "
            "actor endpoint) or use MeshCollectives directly"
        ) from e
    try:
        inst = actor_mod.context().actor_instance
        point = inst.rank
    except (AttributeError, LookupError, RuntimeError) as e:
        raise RuntimeError(
            "hpcmesh.collectives functions must be called from inside an actor endpoint "
            f"(no current actor instance: {e})"
        ) from e
    return point, getattr(inst, "rendezvous", None), inst


def attach(actor_instance: Any, *, timeout: Timeout = None, start_store: bool = True) -> MeshCollectives:
    """Create (once) the MeshCollectives of an actor instance.

    For the runtime: call right after spawning an actor of a mesh that has a
    rendezvous, so member 0 serves the store before anyone needs it."""
    mc = getattr(actor_instance, _CACHE_ATTR, None)
    if mc is None:
        mc = _cached_for(actor_instance, actor_instance.rank, getattr(actor_instance, "rendezvous", None), timeout)
    if start_store and mc.rendezvous is not None:
        mc.start_store()
    return mc


def _cached_for(owner: Any, point: Any, rendezvous: Any, timeout: Timeout) -> MeshCollectives:
    mc = getattr(owner, _CACHE_ATTR, None)
    if isinstance(mc, MeshCollectives):
        return mc
    with _fallback_lock:
        mc = getattr(owner, _CACHE_ATTR, None)
        if isinstance(mc, MeshCollectives):
            return mc
        try:
            mc = _fallback_cache.get(owner)
        except TypeError:
            mc = None
        if mc is not None:
            return mc
        mc = MeshCollectives.for_point(point, rendezvous, timeout)
        try:
            setattr(owner, _CACHE_ATTR, mc)
        except (AttributeError, TypeError):
            try:
                _fallback_cache[owner] = mc  # e.g. __slots__ instances
            except TypeError:
                raise RuntimeError(
                    f"cannot keep collectives state on actor instance {type(owner).__name__} "
                    "(no attribute assignment, no weak references)"
                ) from None
        return mc


def get_collectives() -> MeshCollectives:
    """The calling actor's MeshCollectives (created on first use)."""
    point, rendezvous, owner = _current_member()
    return _cached_for(owner, point, rendezvous, None)


def all_reduce(tensor, dims: Dims = None, op: Any = "sum", *, extent: Any = None, timeout: Timeout = None):
    """In-place reduce over the calling actor's group along ``dims``; returns ``tensor``."""
    return get_collectives().all_reduce(tensor, dims, op, extent=extent, timeout=timeout)


def reduce(tensor, dst: int = 0, dims: Dims = None, op: Any = "sum", *, extent: Any = None,
           timeout: Timeout = None):
    """Reduce into group rank ``dst``'s ``tensor`` (others: unspecified)."""
    return get_collectives().reduce(tensor, dst, dims, op, extent=extent, timeout=timeout)


def all_gather(tensor, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None):
    """Every group member's ``tensor``, ordered by group rank."""
    return get_collectives().all_gather(tensor, dims, extent=extent, timeout=timeout)


def reduce_scatter(output, inputs, dims: Dims = None, op: Any = "sum", *, extent: Any = None,
                   timeout: Timeout = None):
    """Group rank i gets the reduction of all members' ``inputs[i]`` in ``output``."""
    return get_collectives().reduce_scatter(output, inputs, dims, op, extent=extent, timeout=timeout)


def broadcast(tensor, src: int = 0, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None):
    """Copy group rank ``src``'s ``tensor`` to every member; returns ``tensor``."""
    return get_collectives().broadcast(tensor, src, dims, extent=extent, timeout=timeout)


def barrier(dims: Dims = None, *, extent: Any = None, timeout: Timeout = None) -> None:
    """Wait for every member of the group along ``dims``."""
    get_collectives().barrier(dims, extent=extent, timeout=timeout)


def group_rank(dims: Dims = None, *, extent: Any = None) -> int:
    """Row-major rank over ``dims`` (mesh order) of the calling actor; no communication."""
    return get_collectives().group_rank(dims, extent=extent)


def group_size(dims: Dims = None, *, extent: Any = None) -> int:
    """Product of the sizes of ``dims``; no communication."""
    return get_collectives().group_size(dims, extent=extent)


def group_members(dims: Dims = None, *, extent: Any = None) -> list[int]:
    """Flat mesh ranks of the calling actor's group, ordered by group rank."""
    return get_collectives().group_members(dims, extent=extent)


# --------------------------------------------------------------------------
# Notes for the benchmark engineer
# --------------------------------------------------------------------------
#
# Compare hpcmesh.collectives.all_reduce with raw torch.distributed gloo
# (64 MiB float32 = 16 Mi elements, 4 ranks, one process per rank):
#
# * Raw baseline, in each of 4 spawned processes:
#       dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
#                               rank=r, world_size=4)
#       t = torch.ones(16 * 2**20)
#       for _ in range(3): dist.all_reduce(t)              # warm-up (connects)
#       dist.barrier(); t0 = time.perf_counter()
#       for _ in range(N): dist.all_reduce(t)
#       dist.barrier(); dt = (time.perf_counter() - t0) / N
# * hpcmesh, same processes but no init_process_group:
#       mc = MeshCollectives(r, {"hosts": 1, "gpus": 4}, Rendezvous("127.0.0.1", port2, "bench"))
#       same loop with mc.all_reduce(t) (dims=None) and mc.barrier().
#   Also run through real actors (hpcmesh.collectives.all_reduce inside an
#   endpoint) once the runtime exists: that adds the context() lookup only.
# * Report both with HPCMESH_COLLECTIVE_CHECK=0 (pure gloo path; the number
#   should match raw within noise: same ProcessGroupGloo, same algorithm)
#   and with the default check on (adds one 15-int64 all_gather per call:
#   ~tens of µs locally, negligible at 64 MiB, visible for tiny tensors).
# * Report bus bandwidth as 2*(n-1)/n * bytes / dt (n=4), the median of
#   >= 10 iterations after warm-up, and the first-call latency separately
#   (group creation + store connect).  Pin GLOO_SOCKET_IFNAME (lo locally)
#   for both sides so they use the same interface; gloo's thread count
#   (ProcessGroupGloo.Options.threads, default 2) is the same for both.
