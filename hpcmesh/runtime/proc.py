"""Entry point of an actor process (``python -m hpcmesh.runtime.proc``).

Started by a host agent with the bootstrap variables; it listens (Unix socket
plus TCP on the host's chosen address), dials the controller, hosts actors,
and exits when told to stop or when the controller has been gone longer than
the lease grace period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

from ..settings import env_number
from ..transport import serialization
from ..transport.addresses import secret_from_env
from .actor_host import ActorHost
from .bootstrap import PROCESS_NAME_VAR
from .context import ActorInstance, Context, Rendezvous, _current
from .errors import ActorError
from .future import register_loop_thread
from .tuning import tune_malloc
from .node import Node, NodeRef, PortRef, _new_loop, format_exception, set_current_node

log = logging.getLogger("hpcmesh.proc")


class ProcRuntime:
    """Services a worker process offers to the controller."""

    def __init__(self, node: Node, controller: NodeRef, grace: float):
        self.node = node
        self.controller = controller
        self.grace = grace
        self.done = asyncio.Event()
        self.exit_code = 0
        self._lease_timer: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Task | None = None
        node.services.update({
            "spawn_actor": self.spawn_actor,
            "stop": self.stop,
            "stop_actors": self.stop_actors,
            "reserve_port": self.reserve_port,
            "ping": lambda: os.getpid(),
        })
        node.on_peer_closed.append(self._on_peer_closed)
        node.on_peer_hello.append(self._on_peer_hello)

    # -- lease --------------------------------------------------------------------
    def _on_peer_closed(self, node, peer_id, exc) -> None:
        if node.closed or self.done.is_set():
            return
        if peer_id == self.controller.node_id and self._lease_timer is None:
            log.warning("lost the controller; exiting in %.1f s unless it returns", self.grace)
            self._lease_timer = node.loop.call_later(self.grace, self._lease_expired)

    def _on_peer_hello(self, node, ref, info, conn) -> None:
        if ref.node_id == self.controller.node_id and self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _lease_expired(self) -> None:
        self._lease_timer = None
        if not self.node.peer_connected(self.controller.node_id):
            self.exit_code = 3
            self.done.set()     # first: stderr may be a pipe to the dead controller (EPIPE)
            try:
                print(f"hpcmesh: controller gone for {self.grace} s, exiting", file=sys.stderr,
                      flush=True)
            except (OSError, ValueError):
                pass

    # -- services -------------------------------------------------------------------
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
            token = _current.set(Context(instance, point))
            try:
                obj.__init__(*args, **kwargs)
            finally:
                _current.reset(token)
        try:
            await self.node.loop.run_in_executor(host.executor(), construct)
        except Exception as e:  # noqa: BLE001
            raise ActorError(type(e).__qualname__, str(e), format_exception(e), point,
                             cls.__name__, "__init__") from None
        self.node.actors[actor_id] = host
        if rendezvous is not None and point.rank == 0 and \
                getattr(sys.modules.get("torch"), "distributed", None) is not None:
            # The actor uses torch: member 0 serves the mesh's collective store now, so
            # groups that leave member 0 out (slices) can still meet.
            await self.node.loop.run_in_executor(host.executor(), _serve_collectives, instance)
        return os.getpid()

    async def stop_actors(self, actor_ids: list[str]) -> int:
        n = 0
        for aid in actor_ids:
            host = self.node.actors.pop(aid, None)
            if host is not None:
                await host.stop()
                n += 1
        return n

    async def stop(self) -> int:
        await self.stop_actors(list(self.node.actors))
        from .client import existing_client_runtime
        rt = existing_client_runtime()
        if rt is not None and rt.node is self.node:
            rt.shutdown()      # processes our actors started go with us
        self.node.loop.call_later(0.02, self.done.set)
        return os.getpid()

    def on_sigterm(self) -> None:
        """SIGTERM (the agent's force-stop, Slurm's end of job): stop cleanly, then exit."""
        if self._stopping is None and not self.done.is_set():
            self.exit_code = 128 + signal.SIGTERM
            self._stopping = self.node.loop.create_task(self.stop())

    def reserve_port(self, host: str) -> int:
        """A free TCP port on this host for a rendezvous (torch.distributed store)."""
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            return s.getsockname()[1]


def _serve_collectives(instance: ActorInstance) -> None:
    try:
        from .. import collectives
        collectives.attach(instance)
    except Exception as e:  # noqa: BLE001 - collectives then fail with their own clear error
        log.warning("could not start the collective store for %s: %s", instance.mesh_name, e)


async def _amain() -> int:
    env = os.environ
    secret = secret_from_env(env)
    if secret is None:
        print("hpcmesh proc: no HPCMESH_SECRET/HPCMESH_SECRET_FILE in the environment; "
              "this entry point is started by a host agent", file=sys.stderr)
        return 2
    name = env.get(PROCESS_NAME_VAR, f"proc-{os.getpid()}")
    controller_addrs = [a for a in env.get("HPCMESH_CONTROLLER", "").split(",") if a]
    controller = NodeRef(env.get("HPCMESH_CONTROLLER_ID", ""), tuple(controller_addrs))
    host = env.get("HPCMESH_ADVERTISE_HOST", "127.0.0.1")
    grace = env_number("HPCMESH_LEASE_GRACE", 10, env=env)
    loop = asyncio.get_running_loop()
    register_loop_thread(loop)
    node = Node(secret, loop, role="proc", name=name,
                info={"proc_name": name, "advertise_host": host})
    node.listen([node.unix_address(), f"tcp://{host}:0"])
    set_current_node(node)
    rt = ProcRuntime(node, controller, grace)
    loop.add_signal_handler(signal.SIGTERM, rt.on_sigterm)
    # A SIGTERM while still connecting (a mesh stopped as it starts) ends the process now:
    # there are no actors to clean up yet.
    connecting = asyncio.ensure_future(
        node.connect_first(controller_addrs, expect=controller.node_id or None))
    stopped = asyncio.ensure_future(rt.done.wait())
    await asyncio.wait((connecting, stopped), return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
    elif connecting.exception() is not None:
        stopped.cancel()
        e = connecting.exception()
        if not isinstance(e, ConnectionError):
            raise e
        print(f"hpcmesh proc {name}: cannot reach the controller: {e}", file=sys.stderr)
        return 4
    await stopped
    node.close()
    return rt.exit_code


def main() -> None:
    code = 1
    try:
        if os.environ.get("HPCMESH_LOG_CHANNEL"):
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
        logging.basicConfig(level=os.environ.get("HPCMESH_LOG_LEVEL", "WARNING"),
                            format="%(levelname)s %(name)s: %(message)s")
        tune_malloc()
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(_amain())
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - report, then still exit below
        try:
            import traceback
            traceback.print_exc()
        except Exception:  # noqa: BLE001
            pass
    finally:
        # Never hang on exit: a sync endpoint may still be running in an actor thread
        # (interpreter shutdown would join it), and stdout may be a pipe to a dead reader.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
