"""``get_or_spawn_controller``: one actor per name for a whole controller, spawned on the
first ask in the controller's own process (Monarch's singleton "controller" actors: a
registry, a logger every actor reports to)."""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

from ..runtime.context import current_context_var
from ..runtime.future import Future
from ..runtime.node import Node, NodeRef, current_node
from ..transport import serialization
from .proc_mesh import this_proc

TActor = TypeVar("TActor")
SERVICE = "get_or_spawn_controller"

_controllers: dict[str, Future] = {}
_lock = threading.Lock()


def get_or_spawn_controller(name: str, actor_class: type[TActor], *args: Any,
                            **kwargs: Any) -> Future[TActor]:
    """A Future of the actor mesh (of one actor) named ``name``: spawned with ``args`` on the
    first call, on ``this_proc()`` of the controller; every later call, from the controller
    or from an actor it started, gets that same actor (its class and arguments are then
    ignored). A spawn that failed fails every call for that name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"get_or_spawn_controller needs a non-empty name, got {name!r}")
    if not isinstance(actor_class, type):
        raise TypeError(f"get_or_spawn_controller needs an actor class, got "
                        f"{type(actor_class).__name__}")
    node = current_node()
    if node is None or node.role != "proc":       # the controller's process
        return _local(name, actor_class, args, kwargs)
    controller = NodeRef(os.environ.get("HPCMESH_CONTROLLER_ID", ""), tuple(
        a for a in os.environ.get("HPCMESH_CONTROLLER", "").split(",") if a))
    return node.rpc(controller, SERVICE, name, serialization.dumps_by_value(actor_class),
                    args, kwargs)


def offer_controllers(node: Node) -> None:
    """Let the processes this controller starts ask it for controllers (spawn_procs)."""
    node.services.setdefault(SERVICE, _serve)


async def _serve(name: str, cls_blob: bytes, args: tuple, kwargs: dict):
    return await _local(name, serialization.loads(cls_blob), args, kwargs)


def _local(name: str, actor_class: type, args: tuple, kwargs: dict) -> Future:
    with _lock:
        ready = _controllers.get(name)
        if ready is None:
            # the controller's, whoever asked first: an actor of this process that asks
            # does not own it (its stop or failure would take everybody's controller)
            token = current_context_var.set(None)
            try:
                mesh = this_proc().spawn(name, actor_class, *args, **kwargs)
            finally:
                current_context_var.reset(token)
            ready = _controllers[name] = mesh.initialized
    return ready
