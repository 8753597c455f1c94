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
from .observe import telemetry_recorder
from .actor_host import ENDPOINT_ATTR, ActorHost
from .context import ActorInstance, Context, Rendezvous, current_context_var
from .errors import failure_class_of
from .node import Node, PortRef
from .rendezvous import needs_store, serve_store

log = logging.getLogger("hpcmesh.proc")


def is_async_actor(cls: type) -> bool:
    """An actor class whose endpoints are all ``async def`` (at least one): Monarch's async
    actor, whose constructor runs on the event loop's thread."""
    infos = [info for info in (getattr(getattr(cls, n, None), ENDPOINT_ATTR, None)
                               for n in dir(cls)) if info is not None]
    return bool(infos) and all(info.is_async for info in infos)


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
        instance.abort_actor = host.abort

        def construct() -> None:
            token = current_context_var.set(Context(instance, point))
            try:
                obj.__init__(*args, **kwargs)
            finally:
                current_context_var.reset(token)
        try:
            if is_async_actor(cls):
                # its endpoints run on this loop's thread: so does its constructor (as in
                # Monarch), and what it leaves in thread-local state (a threading.local,
                # torch.cuda.set_device) is theirs
                construct()
            else:
                await self.node.loop.run_in_executor(host.executor(), construct)
        except (Exception, KeyboardInterrupt, SystemExit) as e:  # noqa: BLE001
            # As in Monarch, that actor has failed (its calls raise a SupervisionError, its
            # owner is told); unlike Monarch, its process and the other actors there go on.
            host.fail_actor(host.raised_in(e, "__init__"), failure_class=failure_class_of(e))
        self.node.actors[actor_id] = host
        if (rec := telemetry_recorder.RECORDER) is not None and host.fault is None:
            rec.status(host.telemetry_id, "spawned")    # (its actors row: the spawner's)
        if host.fault is not None:
            return os.getpid()
        if needs_store(instance):
            await self.node.loop.run_in_executor(host.executor(), serve_store, instance)
        return os.getpid()

    async def stop_actors(self, actor_ids: list[str], quietly: bool = False) -> int:
        n = 0
        for aid in actor_ids:
            host = self.node.actors.pop(aid, None)
            if host is not None:
                await host.stop(quietly)
                n += 1
        return n

    def reserve_port(self, host: str) -> int:
        """A free TCP port on this host for a rendezvous (torch.distributed store)."""
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            return s.getsockname()[1]
