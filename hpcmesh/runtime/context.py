"""What code running inside an actor can ask about itself (``context()``)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable

from ..shapes import Extent, Point
from .errors import describe_actor


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where an actor mesh's members meet for torch.distributed (set by the controller)."""
    addr: str
    port: int
    prefix: str


@dataclass(eq=False)
class ActorInstance:
    """The running actor as seen from inside: its point in the mesh it was spawned in."""
    rank: Point
    actor_id: str = ""
    mesh_name: str = ""
    class_name: str = ""
    proc_name: str = ""
    rendezvous: Rendezvous | None = None
    rendezvous_store: Any = None         # member 0's torch TCPStore (rendezvous.py)
    actor: Any = None                    # the user's object
    extras: dict = field(default_factory=dict)
    #: ``abort_actor(reason)``: fails this actor (set by the runtime when it spawns one)
    abort_actor: Any = field(default=None, repr=False)
    #: where to find the ProcMesh it was spawned on, as the spawner sent it: a reference
    #: of a constant size, not the mesh (see ``proc_mesh``)
    proc_mesh_source: Any = field(default=None, repr=False)

    @property
    def proc_mesh(self) -> Any:
        """The ProcMesh this actor was spawned on (Monarch's ``proc_mesh``): the view the
        spawner spawned it on; on the client, ``this_proc()``. Asked of the spawner's
        process on first use (sending it with every spawn request made one spawn cost
        n x n), then kept."""
        pm = self.extras.get("proc_mesh")
        if pm is None:
            if self.proc_mesh_source is not None and find_proc_mesh is not None:
                pm = find_proc_mesh(self.proc_mesh_source)
            elif local_proc_mesh is not None and not self.actor_id:
                pm = local_proc_mesh()
            else:
                raise RuntimeError(f"actor {self.mesh_name!r} was spawned without its proc "
                                   f"mesh (by hand, not through ProcMesh.spawn)")
            self.extras["proc_mesh"] = pm
        return pm

    @property
    def extent(self) -> Extent:
        return self.rank.extent

    def __str__(self) -> str:
        """As Monarch prints an actor instance (its log prefix ``[actor=...]`` shows it):
        ``<module.Class mesh{'gpus': 1/2}>``, without Monarch's ``<root>.`` path of
        owners; ``<root>`` on the client."""
        if not self.actor_id:
            return "<root>"
        module = type(self.actor).__module__ if self.actor is not None else ""
        return describe_actor(f"{module}.{self.class_name}" if module else self.class_name,
                              self.mesh_name, self.rank)

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor, as Monarch's ``Instance.abort``: the call in progress (the one
        that aborted) still finishes and answers; calls queued or made later raise a
        SupervisionError ("... actor explicitly aborted due to: ``reason``"), and the
        owner's ``__supervise__`` (or ``unhandled_fault_hook``) gets a MeshFailure."""
        if self.abort_actor is None:
            raise RuntimeError("abort() fails the actor it is called in; the client is not "
                               "an actor (end the program instead)")
        self.abort_actor(reason)


@dataclass(frozen=True)
class Context:
    actor_instance: ActorInstance
    message_rank: Point


#: ``this_proc()``, which the actor layer registers: the client's ``proc_mesh``.
local_proc_mesh: Callable[[], Any] | None = None
#: ``find_proc_mesh(source)``, which the actor layer registers: an actor's ``proc_mesh``
#: from the reference its spawner sent.
find_proc_mesh: Callable[[Any], Any] | None = None

#: The context of the endpoint (or constructor) running now; the runtime sets it around each
#: call, ``context()`` reads it. None outside actors.
current_context_var: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "hpcmesh_context", default=None)
_client_context: Context | None = None


def context() -> Context:
    """The current actor's context; on the controller, a context whose point has no dims."""
    ctx = current_context_var.get()
    if ctx is not None:
        return ctx
    global _client_context
    if _client_context is None:
        p = Point(0, Extent({}))
        _client_context = Context(ActorInstance(rank=p, mesh_name="client", class_name="Client"), p)
    return _client_context


def current_actor_name() -> str:
    """Which actor is running, for logs: its mesh's name and its rank in it (``"trainers[3]"``);
    ``"client"`` on the controller. (Monarch's function of this name returns its actor id.)"""
    inst = context().actor_instance
    if not inst.actor_id:
        return inst.mesh_name
    return f"{inst.mesh_name}[{inst.rank.rank}]"


def current_rank() -> Point:
    """This actor's point in the mesh the current message was sent to (as in Monarch):
    through ``mesh.slice(gpus=1)`` it is the point in that slice. The point in the mesh the
    actor was spawned in is ``context().actor_instance.rank``."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes of the mesh the current message was sent to, by dimension."""
    return dict(context().message_rank.extent)
