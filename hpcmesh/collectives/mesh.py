"""``MeshCollectives``: one member's groups, store and ops along mesh dimensions.

Everything here is torch's public API: the mesh's members form a torch.distributed world
(``world.py``: the default process group, formed over the mesh's ``TCPStore``, which member 0
serves at the controller-provided rendezvous: ``runtime/rendezvous.py``), a group along some
dims is a ``new_group`` of it, and the ops are ``torch.distributed``'s own. So a user's DDP,
FSDP2 or ``dist.all_reduce(t, group=mesh.get_group("gpus"))`` and these functions see the
same groups. What this layer adds: dims by name, a fingerprint check that turns a mismatched
collective into an error on every member, and a timeout that names op, dims and members.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Union

import torch
import torch.distributed as dist

from ..runtime.errors import COLLECTIVE_TIMEOUT, failure_class_of
from ..runtime.torch_store import tcp_store
from ..settings import (COLLECTIVE_TIMEOUT_VAR, DEFAULT_COLLECTIVE_TIMEOUT_S,
                        MAX_COLLECTIVE_TIMEOUT_S, collective_timeout, env_flag)
from . import world as world_mod
from .check import describe_fingerprint, fingerprint, resolve_op, validate_reduce
from .errors import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError
from .groups import Dims, GroupSpec, compute_group, extent_items, format_extent

Timeout = Union[float, int, timedelta, None]

TIMEOUT_ENV = COLLECTIVE_TIMEOUT_VAR
CHECK_ENV = "HPCMESH_COLLECTIVE_CHECK"
DEFAULT_TIMEOUT_S = DEFAULT_COLLECTIVE_TIMEOUT_S
_R = dist.ReduceOp


def as_timedelta(timeout: Timeout, default: timedelta | None = None) -> timedelta:
    if timeout is None:
        if default is not None:
            return default
        return timedelta(seconds=collective_timeout())   # checked as the controller did
    if isinstance(timeout, timedelta):
        td = timeout
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        if not 0 < timeout <= MAX_COLLECTIVE_TIMEOUT_S:     # also refuses nan and inf
            raise ValueError(f"timeout must be a number of seconds > 0 and at most "
                             f"{MAX_COLLECTIVE_TIMEOUT_S:.0f}, got {timeout!r}")
        td = timedelta(seconds=float(timeout))
    else:
        raise TypeError(f"timeout must be seconds or a timedelta, got {timeout!r}")
    if td.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {td}")
    return td


def check_from_env() -> bool | None:
    """``HPCMESH_COLLECTIVE_CHECK`` as a flag, None when unset (the op's own default)."""
    raw = os.environ.get(CHECK_ENV)
    if raw is None or raw.strip() == "":
        return None
    return env_flag(CHECK_ENV, False)


class MeshCollectives:
    """Collectives for one member of one actor mesh.

    Holds the member's flat rank and extent, the rendezvous and the store; its groups live
    in the process's torch world (``world.py``), one per set of members. Usable directly
    (tests, custom runtimes) or through the module-level functions inside an actor.

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
        self._world: world_mod.World | None = None
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

    # ---- store, world and groups -----------------------------------------

    def _get_store(self) -> Any:
        """Connect (or, on member 0, serve) the TCPStore the mesh's world meets in."""
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
                self._store = tcp_store(rdv.addr, rdv.port, master=master,
                                        world_size=self.world_size, timeout=self.timeout)
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

    def world(self) -> world_mod.World:
        """The torch world of this mesh in this process (formed on first use)."""
        with self._lock:
            w = self._world
            if w is not None and w is world_mod.current():
                return w
            prefix = self._prefix()

            def store(generation: int) -> Any:
                return dist.PrefixStore(f"{prefix}/hpcmesh.world/{generation}", self._get_store())
            elastic = world_mod.elastic_world(self.rank, self.world_size, self.timeout)
            if elastic is not None:     # setup_torch_elastic_env's: serves every mesh like it
                key, elastic_store = elastic
                self._world = world_mod.world_for(key, self.rank, self.world_size, elastic_store,
                                                  self.timeout, any_mesh=True)
                return self._world
            if world_mod.current() is None and not dist.is_initialized():
                self._get_store()       # a missing rendezvous is named before torch is touched
            self._world = world_mod.world_for(prefix, self.rank, self.world_size, store,
                                              self.timeout)
            return self._world

    def process_group(self, dims: Dims = None, *, extent: Any = None) -> Any:
        """The torch ``ProcessGroup`` of this member's group along ``dims``: usable with any
        ``torch.distributed`` call, DDP's ``process_group=`` and ``DeviceMesh.from_group``."""
        return self._group_for(self.group(dims, extent=extent), torch.device("cpu"), "process_group")

    def backend(self, dims: Dims = None, device: Any = "cpu", *, extent: Any = None) -> Any:
        """The process group for tensors on ``device`` (kept for older callers: the same
        ``ProcessGroup`` serves CPU tensors with gloo and CUDA tensors with NCCL)."""
        return self._group_for(self.group(dims, extent=extent), torch.device(device), "backend")

    def _group_for(self, spec: GroupSpec, device: torch.device, opname: str) -> Any:
        kind = backend_kind(device, opname)
        if kind == "nccl" and not dist.is_nccl_available():
            raise CollectiveError(
                f"{opname}: tensor is on {device}, which needs the NCCL backend, but NCCL "
                f"is not available in this torch build ({torch.__version__}); move the "
                "tensor to the CPU to use gloo"
            )
        key = (kind, spec.members)
        with self._lock:
            w = self.world()
            if self._broken.get(key, (None,))[0] == w.generation:
                raise CollectiveError(
                    f"{opname}: the {kind} group for {spec.describe()} is unusable after an "
                    f"earlier failure: {self._broken[key][1]}; set up a new world "
                    "(hpcmesh.spmd.setup_torch_elastic_env, or a new mesh) to go on"
                )
            try:
                return w.group(tuple(spec.members), self.timeout)
            except Exception as e:
                raise CollectiveError(
                    f"{opname}: creating the group for {spec.describe()} failed: {first_line(e)}"
                ) from e

    def device_mesh(self, extent: Any = None, device_type: str | None = None) -> Any:
        """A ``torch.distributed.DeviceMesh`` over the mesh (or a reshape of it), its
        ``mesh_dim_names`` the dims, each dim backed by the same groups the ops use."""
        from torch.distributed.device_mesh import DeviceMesh

        items = self._extent_for(extent)
        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        groups = [self._group_for(self.group(name, extent=extent), torch.device(device_type),
                                  "device_mesh") for name, _ in items]
        if device_type == "cuda" and self.world_size > 1:
            self._check_own_gpus()
        layout = torch.arange(self.world_size, dtype=torch.int).reshape([s for _, s in items])
        return DeviceMesh.from_group(groups, device_type, mesh=layout,
                                     mesh_dim_names=tuple(name for name, _ in items))

    def _check_own_gpus(self) -> None:
        """NCCL cannot put two ranks on one GPU: say which members share one, on every
        member, instead of failing deep inside the first collective."""
        import socket

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        mine = torch.tensor(gpu_identity(socket.gethostname(), str(getattr(props, "uuid", ""))
                                         or f"index {torch.cuda.current_device()}"),
                            dtype=torch.int64)
        spec = self.group(None)
        rows = [torch.empty_like(mine) for _ in range(spec.size)]
        pg = self._group_for(spec, torch.device("cpu"), "device_mesh")
        self._run(spec, "gloo", "device_mesh (GPU check)", self.timeout,
                  lambda: dist.all_gather(rows, mine, group=pg, async_op=True))
        shared = members_sharing_a_gpu([tuple(r.tolist()) for r in rows])
        if shared:
            raise CollectiveError(
                f"device_mesh: members {shared} use the same GPU (NCCL needs one GPU per rank): "
                "each process selects its GPU with torch.cuda.set_device(int(os.environ["
                "'LOCAL_RANK'])) under spawn_procs' default gpu_binding='host'; with "
                "gpu_binding='process' a host needs a GPU per process")

    def _prefix(self) -> str:
        rdv = self.rendezvous
        return "" if rdv is None else str(rdv.prefix)

    def _mark_broken(self, spec: GroupSpec, kind: str, why: str) -> None:
        with self._lock:
            w = self._world
            self._broken[(kind, spec.members)] = (w.generation if w else None, why)

    # ---- running ops -----------------------------------------------------

    def _want_check(self, device: torch.device) -> bool:
        return self.check if self.check is not None else device.type == "cpu"

    def _run(self, spec: GroupSpec, kind: str, opname: str, timeout: timedelta, start) -> None:
        """Start a torch op and wait, turning failures into CollectiveError.

        A failed/timed-out group is left in an undefined state (peers may be mid-transfer),
        so it is marked unusable rather than reused."""
        try:
            work = start()
        except Exception as e:
            # Refused before any byte moved (unsupported op/dtype): the group
            # itself is fine, so it is not marked unusable.
            raise CollectiveError(f"{opname} along {spec.describe()} was refused by {kind}: {first_line(e)}") from e
        try:
            if not work.wait(timeout):
                raise TimeoutError(f"not done after {timeout.total_seconds():g}s")
        except Exception as e:
            msg = first_line(e)
            self._mark_broken(spec, kind, f"{opname}: {msg}")
            timed_out = isinstance(e, TimeoutError) or failure_class_of(e) == COLLECTIVE_TIMEOUT
            raise (CollectiveTimeoutError if timed_out else CollectiveError)(
                f"{opname} along {spec.describe()} failed on member {self.rank} "
                f"(timeout {timeout.total_seconds():g}s; a member died, hung, or called "
                f"a different collective): {msg}"
            ) from e

    def _consistency_check(
        self, spec: GroupSpec, opname: str, redop: str, root: int, tensor: torch.Tensor | None, timeout: timedelta
    ) -> None:
        pg = self._group_for(spec, torch.device("cpu"), opname)
        mine = torch.tensor(fingerprint(opname, redop, root, tensor), dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(spec.size)]
        self._run(spec, "gloo", f"{opname} (consistency check)", timeout,
                  lambda: dist.all_gather(rows, mine, group=pg, async_op=True))
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
        """Common path: pick the group, optionally check, return it."""
        device = tensor.device if tensor is not None else torch.device("cpu")
        kind = backend_kind(device, opname)
        if redop:
            validate_reduce(opname, redop, tensor, kind)
        pg = self._group_for(spec, device, opname)
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
            validate_reduce("all_reduce", name, tensor, backend_kind(tensor.device, "all_reduce"))
            return tensor
        pg, kind = self._go(spec, "all_reduce", name, 0, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        red = _R.SUM if emulate_avg else red
        self._run(spec, kind, "all_reduce", td,
                  lambda: dist.all_reduce(wire_view(buf), op=red, group=pg, async_op=True))
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
            validate_reduce("reduce", name, tensor, backend_kind(tensor.device, "reduce"))
            return tensor
        pg, kind = self._go(spec, "reduce", name, dst, tensor, td)
        emulate_avg = name == "avg" and kind == "gloo"
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        red = _R.SUM if emulate_avg else red
        self._run(spec, kind, "reduce", td,      # dst: a world rank, as in every torch release
                  lambda: dist.reduce(wire_view(buf), spec.members[dst], op=red, group=pg,
                                      async_op=True))
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
        self._run(spec, kind, "all_gather", td,
                  lambda: dist.all_gather([wire_view(o) for o in outs], wire_view(inp), group=pg,
                                          async_op=True))
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
            validate_reduce("reduce_scatter", name, output, backend_kind(output.device, "reduce_scatter"))
            output.copy_(inputs[0])
            return output
        pg, kind = self._go(spec, "reduce_scatter", name, 0, output, td)
        emulate_avg = name == "avg" and kind == "gloo"
        out = output if output.is_contiguous() else output.contiguous()
        ins = [wire_view(t.contiguous()) for t in inputs]
        red = _R.SUM if emulate_avg else red
        self._run(spec, kind, "reduce_scatter", td,
                  lambda: dist.reduce_scatter(wire_view(out), ins, op=red, group=pg, async_op=True))
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
        self._run(spec, kind, "broadcast", td,
                  lambda: dist.broadcast(wire_view(buf), spec.members[src], group=pg, async_op=True))
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def barrier(self, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None) -> None:
        """Wait until every group member reaches the barrier (a one-element gloo all_reduce:
        ``dist.barrier`` would pick the CUDA backend of a mixed group)."""
        spec, td = self._prepare("barrier", dims, extent, None, timeout)
        if spec.size == 1:
            return
        pg, kind = self._go(spec, "barrier", "", 0, None, td)
        token = torch.zeros(1)
        self._run(spec, kind, "barrier", td,
                  lambda: dist.all_reduce(token, group=pg, async_op=True))

    def close(self) -> None:
        """Leave the mesh's world (destroyed if hpcmesh formed it for this mesh) and drop the
        store (member 0 stops serving it). Members still using its groups will fail."""
        with self._lock:
            self._closed = True
            w, self._world = self._world, None
            if w is not None and w is world_mod.current() and w.key == self._prefix():  # ours
                world_mod.destroy()
            self._store = None


def gpu_identity(host: str, device: str) -> tuple[int, int]:
    """A GPU as two numbers every member can all-gather: (host, device id) hashed."""
    return zlib.crc32(host.encode()), zlib.crc32(device.encode())


def members_sharing_a_gpu(identities: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Groups of members (flat ranks) whose GPU identities are equal."""
    by_gpu: dict[tuple[int, int], list[int]] = {}
    for member, ident in enumerate(identities):
        by_gpu.setdefault(tuple(ident), []).append(member)
    return [m for m in by_gpu.values() if len(m) > 1]


def backend_kind(device: torch.device, opname: str) -> str:
    """Which torch backend serves tensors on ``device``: gloo for CPU, NCCL for CUDA."""
    if device.type == "cpu":
        return "gloo"
    if device.type == "cuda":
        return "nccl"
    raise CollectiveError(
        f"{opname}: no collective backend for tensors on {device} "
        "(hpcmesh uses gloo for CPU tensors and NCCL for CUDA tensors)"
    )

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
