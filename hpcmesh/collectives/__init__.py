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

The groups are torch's own: the mesh's members form a torch.distributed world (the
default process group, rank = flat rank; ``world.py``) and each group is a ``new_group`` of
it, so ``device_mesh()`` (a ``DeviceMesh`` whose ``mesh_dim_names`` are the dims),
``process_group(dims)``, DDP, FSDP2 and ``torch.distributed`` calls share them with these
functions. Only public torch API is used.

torch is imported only by this package in hpcmesh (nothing imports it unless the user
does). ``groups`` is the pure group math (no torch), ``check`` the ops and fingerprints,
``world`` the process's torch world, ``mesh`` the per-member ``MeshCollectives``; this
module is the API inside an actor.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..runtime.context import Rendezvous, context
from .errors import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError
from .groups import Dims, GroupSpec, compute_group
from .mesh import CHECK_ENV, DEFAULT_TIMEOUT_S, TIMEOUT_ENV, MeshCollectives, Timeout

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "GroupSpec",
    "MeshCollectives",
    "Rendezvous",
    "all_gather",
    "all_reduce",
    "attach",
    "barrier",
    "broadcast",
    "compute_group",
    "device_mesh",
    "get_collectives",
    "group_members",
    "group_rank",
    "group_size",
    "process_group",
    "reduce",
    "reduce_scatter",
]

_CACHE_ATTR = "_hpcmesh_collectives"


_fallback_cache: "weakref.WeakKeyDictionary[Any, MeshCollectives]" = weakref.WeakKeyDictionary()
_fallback_lock = threading.Lock()


def _current_member() -> tuple[Any, Any, Any]:
    """(point, rendezvous, owner for the cache) of the calling actor."""
    try:
        inst = context().actor_instance
        point = inst.rank
    except (AttributeError, LookupError, RuntimeError) as e:
        raise RuntimeError(
            "hpcmesh.collectives functions must be called from inside an actor endpoint "
            f"(no current actor instance: {e})"
        ) from e
    return point, getattr(inst, "rendezvous", None), inst


def attach(actor_instance: Any, *, timeout: Timeout = None, start_store: bool = True) -> MeshCollectives:
    """Create (once) the MeshCollectives of an actor instance.

    For custom runtimes: call right after spawning an actor of a mesh that has a
    rendezvous, so member 0 serves the store before anyone needs it (hpcmesh's own
    runtime serves it at spawn already: ``runtime/rendezvous.py``)."""
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
        served = getattr(owner, "rendezvous_store", None)
        if served is not None:          # member 0: the runtime serves the store since spawn
            mc.adopt_store(served)
            owner.rendezvous_store = None   # mc owns it now: its close() stops serving
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


def _view_extent(mc: MeshCollectives, extent: Any) -> Any:
    """The extent the call names dims in: ``extent`` if given; else, when the message came
    through a rename/split/flatten view (the same members, other dims), that view's; else
    the mesh's own (a slice keeps the mesh's dims: its groups are the mesh's groups)."""
    if extent is not None:
        return extent
    view = context().message_rank.extent
    if len(view) and view.nelem == mc.world_size and tuple(view.items()) != mc.extent:
        return view
    return None


def device_mesh(extent: Any = None, *, device_type: str | None = None):
    """The ``torch.distributed.DeviceMesh`` of the calling actor's mesh, ``mesh_dim_names``
    its dims (``("hosts", "gpus")``). Called through a rename/split view of the mesh (same
    members, other dims), the view's dims; ``extent=`` reshapes explicitly. Device type:
    cuda where the process has a GPU, else cpu (gloo)."""
    mc = get_collectives()
    if extent is None:
        view = context().message_rank.extent
        extent = _view_extent(mc, None)
        if len(view) and view.nelem != mc.world_size:
            raise ValueError(
                f"device_mesh(): this call came through a view of {view.nelem} of the mesh's "
                f"{mc.world_size} members ({dict(view)}); a DeviceMesh spans a whole world: call "
                "hpcmesh.spmd.setup_torch_elastic_env on that view and spawn its actors there, "
                "or pass extent= for the whole mesh")
    return mc.device_mesh(extent, device_type)


def process_group(dims: Dims = None, *, extent: Any = None):
    """The torch ``ProcessGroup`` of the calling actor's group along ``dims``."""
    mc = get_collectives()
    return mc.process_group(dims, extent=_view_extent(mc, extent))


def all_reduce(tensor, dims: Dims = None, op: Any = "sum", *, extent: Any = None, timeout: Timeout = None):
    """In-place reduce over the calling actor's group along ``dims``; returns ``tensor``."""
    mc = get_collectives()
    return mc.all_reduce(tensor, dims, op, extent=_view_extent(mc, extent), timeout=timeout)


def reduce(tensor, dst: int = 0, dims: Dims = None, op: Any = "sum", *, extent: Any = None,
           timeout: Timeout = None):
    """Reduce into group rank ``dst``'s ``tensor`` (others: unspecified)."""
    mc = get_collectives()
    return mc.reduce(tensor, dst, dims, op, extent=_view_extent(mc, extent), timeout=timeout)


def all_gather(tensor, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None):
    """Every group member's ``tensor``, ordered by group rank."""
    mc = get_collectives()
    return mc.all_gather(tensor, dims, extent=_view_extent(mc, extent), timeout=timeout)


def reduce_scatter(output, inputs, dims: Dims = None, op: Any = "sum", *, extent: Any = None,
                   timeout: Timeout = None):
    """Group rank i gets the reduction of all members' ``inputs[i]`` in ``output``."""
    mc = get_collectives()
    return mc.reduce_scatter(output, inputs, dims, op, extent=_view_extent(mc, extent), timeout=timeout)


def broadcast(tensor, src: int = 0, dims: Dims = None, *, extent: Any = None, timeout: Timeout = None):
    """Copy group rank ``src``'s ``tensor`` to every member; returns ``tensor``."""
    mc = get_collectives()
    return mc.broadcast(tensor, src, dims, extent=_view_extent(mc, extent), timeout=timeout)


def barrier(dims: Dims = None, *, extent: Any = None, timeout: Timeout = None) -> None:
    """Wait for every member of the group along ``dims``."""
    mc = get_collectives()
    mc.barrier(dims, extent=_view_extent(mc, extent), timeout=timeout)


def group_rank(dims: Dims = None, *, extent: Any = None) -> int:
    """Row-major rank over ``dims`` (mesh order) of the calling actor; no communication."""
    mc = get_collectives()
    return mc.group_rank(dims, extent=_view_extent(mc, extent))


def group_size(dims: Dims = None, *, extent: Any = None) -> int:
    """Product of the sizes of ``dims``; no communication."""
    mc = get_collectives()
    return mc.group_size(dims, extent=_view_extent(mc, extent))


def group_members(dims: Dims = None, *, extent: Any = None) -> list[int]:
    """Flat mesh ranks of the calling actor's group, ordered by group rank."""
    mc = get_collectives()
    return mc.group_members(dims, extent=_view_extent(mc, extent))

