"""``MeshCollectives``: one member's groups, store and ops along mesh dimensions.

Why no ``init_process_group``: one process may host several actor meshes and the user may
want their own default group. Each MeshCollectives therefore uses its mesh's ``TCPStore``
(served by member 0 at the controller-provided rendezvous: ``runtime/rendezvous.py``) and
builds backend objects (``ProcessGroupGloo`` for CPU tensors, ``ProcessGroupNCCL`` for CUDA
tensors) directly, each under its own ``PrefixStore``. Only the members of a group take part
in creating it, so a subset of the mesh can form a group without the others' help.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Union

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

from .check import describe_fingerprint, fingerprint, resolve_op, validate_reduce
from .errors import CollectiveError, CollectiveMismatchError
from .groups import Dims, GroupSpec, compute_group, extent_items, format_extent

Timeout = Union[float, int, timedelta, None]

TIMEOUT_ENV = "HPCMESH_COLLECTIVE_TIMEOUT"
CHECK_ENV = "HPCMESH_COLLECTIVE_CHECK"
DEFAULT_TIMEOUT_S = 60.0
_R = dist.ReduceOp


def as_timedelta(timeout: Timeout, default: timedelta | None = None) -> timedelta:
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


def check_from_env() -> bool | None:
    raw = os.environ.get(CHECK_ENV)
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{CHECK_ENV}={raw!r}: use 1/0 (or true/false)")


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
        self.extent = extent_items(extent)
        self.world_size = math.prod(s for _, s in self.extent)
        if isinstance(point_rank, bool) or not isinstance(point_rank, int):
            raise TypeError(f"point_rank must be an int, got {point_rank!r}")
        if not 0 <= point_rank < self.world_size:
            raise ValueError(
                f"rank {point_rank} outside a mesh of {self.world_size} members (extent {format_extent(self.extent)})"
            )
        self.rank = point_rank
        self.rendezvous = rendezvous
        self.timeout = as_timedelta(timeout)
        env_check = check_from_env()
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
        items = extent_items(extent)
        n = math.prod(s for _, s in items)
        if n != self.world_size:
            raise ValueError(
                f"extent {format_extent(items)} has {n} members but the mesh "
                f"{format_extent(self.extent)} has {self.world_size}; an extent override "
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
                    f"is None; mesh extent {format_extent(self.extent)}): the runtime must spawn "
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
                    f"{self.timeout.total_seconds():g}s): {first_line(e)}"
                    + ("" if master else "; member 0 serves it from attach() or its first collective")
                ) from e
            return self._store

    def adopt_store(self, store: Any) -> None:
        """Use the store this member's process serves already (the runtime starts member 0's
        at spawn, so groups that leave member 0 out can meet before it calls anything)."""
        with self._lock:
            store.set_timeout(self.timeout)
            self._store = store

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
                    f"the same collective): {first_line(e)}"
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
            raise CollectiveError(f"{opname} along {spec.describe()} was refused by {kind}: {first_line(e)}") from e
        try:
            work.wait()
        except Exception as e:
            msg = first_line(e)
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
        mine = torch.tensor(fingerprint(opname, redop, root, tensor), dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(spec.size)]
        opts = AllgatherOptions()
        opts.timeout = timeout
        self._run(spec, "gloo", f"{opname} (consistency check)", timeout, lambda: pg.allgather([rows], [mine], opts))
        seen = [r.tolist() for r in rows]
        if all(r == seen[0] for r in seen):
            return
        by_sig: dict[str, list[int]] = {}
        for member, row in zip(spec.members, seen):
            by_sig.setdefault(describe_fingerprint(row), []).append(member)
        detail = "; ".join(f"members {m} called {sig}" for sig, m in by_sig.items())
        raise CollectiveMismatchError(
            f"{opname}: group members disagree on the collective along {spec.describe()}: {detail}"
        )

    def _prepare(self, opname: str, dims: Dims, extent: Any, tensor: torch.Tensor | None, timeout: Timeout):
        if not isinstance(tensor, (torch.Tensor, type(None))):
            raise TypeError(f"{opname}: expected a torch.Tensor, got {type(tensor).__name__}")
        spec = self.group(dims, extent=extent)
        td = as_timedelta(timeout, self.timeout)
        return spec, td

    def _go(self, spec, opname, redop, root, tensor, td):
        """Common path: pick the backend, optionally check, return it."""
        device = tensor.device if tensor is not None else torch.device("cpu")
        kind = "gloo" if device.type == "cpu" else "nccl"
        if redop:
            validate_reduce(opname, redop, tensor, kind)
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
        name, red = resolve_op(op)
        spec, td = self._prepare("all_reduce", dims, extent, tensor, timeout)
        if spec.size == 1 and name != "custom":
            validate_reduce("all_reduce", name, tensor, "gloo" if tensor.device.type == "cpu" else "nccl")
            return tensor
        pg, kind = self._go(spec, "all_reduce", name, 0, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = AllreduceOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.timeout = td
        self._run(spec, kind, "all_reduce", td, lambda: pg.allreduce([wire_view(buf)], opts))
        if emulate_avg:
            self._avg_fixup(buf, spec.size)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def reduce(self, tensor: torch.Tensor, dst: int = 0, dims: Dims = None, op: Any = "sum", *,
               extent: Any = None, timeout: Timeout = None) -> torch.Tensor:
        """Reduce into ``tensor`` on group rank ``dst``; other members'
        tensors are left unspecified (as in torch.distributed)."""
        name, red = resolve_op(op)
        spec, td = self._prepare("reduce", dims, extent, tensor, timeout)
        check_root("reduce", "dst", dst, spec)
        if spec.size == 1 and name != "custom":
            validate_reduce("reduce", name, tensor, "gloo" if tensor.device.type == "cpu" else "nccl")
            return tensor
        pg, kind = self._go(spec, "reduce", name, dst, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = ReduceOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.rootRank = dst
        opts.rootTensor = 0
        opts.timeout = td
        self._run(spec, kind, "reduce", td, lambda: pg.reduce([wire_view(buf)], opts))
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
                  lambda: pg.allgather([[wire_view(o) for o in outs]], [wire_view(inp)], opts))
        return outs

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], dims: Dims = None,
                       op: Any = "sum", *, extent: Any = None, timeout: Timeout = None) -> torch.Tensor:
        """``output`` on group rank i becomes the reduction of every member's
        ``inputs[i]``; returns ``output``."""
        name, red = resolve_op(op)
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
            validate_reduce("reduce_scatter", name, output, "gloo" if output.device.type == "cpu" else "nccl")
            output.copy_(inputs[0])
            return output
        pg, kind = self._go(spec, "reduce_scatter", name, 0, output, td)
        emulate_avg = name == "avg" and kind == "gloo"
        out = output if output.is_contiguous() else output.contiguous()
        ins = [wire_view(t.contiguous()) for t in inputs]
        opts = ReduceScatterOptions()
        opts.reduceOp = _R.SUM if emulate_avg else red
        opts.timeout = td
        self._run(spec, kind, "reduce_scatter", td, lambda: pg.reduce_scatter([wire_view(out)], [ins], opts))
        if emulate_avg:
            self._avg_fixup(out, spec.size)
        if out is not output:
            output.copy_(out)
        return output

    def broadcast(self, tensor: torch.Tensor, src: int = 0, dims: Dims = None, *, extent: Any = None,
                  timeout: Timeout = None) -> torch.Tensor:
        """Copy group rank ``src``'s ``tensor`` into every member's; returns it."""
        spec, td = self._prepare("broadcast", dims, extent, tensor, timeout)
        check_root("broadcast", "src", src, spec)
        if spec.size == 1:
            return tensor
        pg, kind = self._go(spec, "broadcast", "", src, tensor, td)
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        opts = BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        opts.timeout = td
        self._run(spec, kind, "broadcast", td, lambda: pg.broadcast([wire_view(buf)], opts))
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


def wire_view(t: torch.Tensor) -> torch.Tensor:
    """Complex tensors travel as their real view (gloo lacks complex
    gather/broadcast; sum/avg are elementwise on the real view)."""
    return torch.view_as_real(t) if t.is_complex() else t


def first_line(e: BaseException) -> str:
    """torch errors can carry C++ frames after the first line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_root(opname: str, what: str, root: Any, spec: GroupSpec) -> None:
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < spec.size:
        raise ValueError(
            f"{opname}: {what}={root!r} must be a group rank in [0, {spec.size}) for {spec.describe()}"
        )
