"""The services that let a node host actors: spawn one, stop some, reserve a port.

An actor process offers them to its controller (``proc.py``); the controller's own node
offers them too once ``this_proc()`` is used, so actors can live in the controller's
process (as Monarch's ``this_proc().spawn(...)`` does).
"""

from __future__ import annotations

import logging
import os
import socket

from ..transport import serialization
from .actor_host import ActorHost
from .context import ActorInstance, Context, Rendezvous, current_context_var
from .errors import ActorError
from .messages import format_exception
from .node import Node, PortRef
from .rendezvous import needs_store, serve_store

log = logging.getLogger("hpcmesh.proc")


class ActorServices:
    """``spawn_actor``, ``stop_actors`` and ``reserve_rendezvous_port`` on one node.

    The names are the node's service names: distinct from the host agent's
    (``reserve_master_port``), since the controller's node offers both once ``this_proc()``
    is used, and one name for two signatures made the agent's unreachable there."""

    def __init__(self, node: Node):
        self.node = node
        node.services.update({
            "spawn_actor": self.spawn_actor,
            "stop_actors": self.stop_actors,
            "reserve_rendezvous_port": self.reserve_port,
        })

    @classmethod
    def attach(cls, node: Node) -> "ActorServices":
        """The node's ActorServices, made on first use."""
        existing = node.actor_services
        if existing is None:
            existing = node.actor_services = cls(node)
        return existing

    async def spawn_actor(self, actor_id: str, mesh_name: str, cls_blob: bytes, args: tuple,
                          kwargs: dict, point, rendezvous: Rendezvous | None,
                          supervisor: PortRef | None) -> int:
        cls = serialization.loads(cls_blob)
        instance = ActorInstance(rank=point, actor_id=actor_id, mesh_name=mesh_name,
                                 class_name=cls.__name__, proc_name=self.node.name,
                                 rendezvous=rendezvous)
        obj = cls.__new__(cls)
        instance.actor = obj
        host = ActorHost(self.node, instance, obj, supervisor)

        def construct() -> None:
            token = current_context_var.set(Context(instance, point))
            try:
                obj.__init__(*args, **kwargs)
            finally:
                current_context_var.reset(token)
        try:
            await self.node.loop.run_in_executor(host.executor(), construct)
        except Exception as e:  # noqa: BLE001
            raise ActorError(type(e).__qualname__, str(e), format_exception(e), point,
                             cls.__name__, "__init__") from None
        self.node.actors[actor_id] = host
        if needs_store(instance):
            await self.node.loop.run_in_executor(host.executor(), serve_store, instance)
        return os.getpid()

    async def stop_actors(self, actor_ids: list[str]) -> int:
        n = 0
        for aid in actor_ids:
            host = self.node.actors.pop(aid, None)
            if host is not None:
                await host.stop()
                n += 1
        return n

    def reserve_port(self, host: str) -> int:
        """A free TCP port on this host for a rendezvous (torch.distributed store)."""
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            return s.getsockname()[1]
