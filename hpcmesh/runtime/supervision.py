"""Where a mesh's failure goes, as in Monarch: to the ``__supervise__`` of the actor that
owns the mesh (``Supervisor``), and what that owner's own failure or stop takes with it;
a fault nobody handled reaches ``unhandled_fault_hook`` on the controller."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sys
import threading
from typing import Any, Callable, Mapping

from ..settings import env_number
from .actor_host import ActorThread
from .errors import USER_EXCEPTION, MeshFailure, MeshStoppedError
from .future import Future
from .node import Node

log = logging.getLogger("hpcmesh.client")


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called on the controller with each MeshFailure that no owner's ``__supervise__``
    handled. Replace it as ``hpcmesh.actor.unhandled_fault_hook = my_hook``: returning
    drops the fault; raising (this default raises SystemExit(1)) makes it fatal, as in
    Monarch: the failure is printed and the main thread gets a KeyboardInterrupt (only
    the main thread can run ``finally`` blocks and atexit cleanup), so the client exits
    killed by SIGINT. It runs on a thread of its own, one failure at a time."""
    sys.exit(1)


def _this_default() -> Callable[[MeshFailure], None]:
    return unhandled_fault_hook


_hook_reader: Callable[[], Callable[[MeshFailure], None]] = _this_default


def set_fault_hook_reader(reader: Callable[[], Callable[[MeshFailure], None]]) -> None:
    """Where :func:`run_unhandled_fault_hook` finds the hook the program installed: the
    public face (``hpcmesh.actor``, a layer above this one, whose attribute a program
    replaces) registers a reader of that attribute when it is imported, as it is read at
    each failure (it may be replaced at any time)."""
    global _hook_reader
    _hook_reader = reader


def run_unhandled_fault_hook(failure: MeshFailure) -> None:
    """The hook the program installed (looked up now: it may have been replaced), run."""
    hook = _hook_reader()
    try:
        hook(failure)
    except BaseException as e:  # noqa: BLE001 - SystemExit included: the fault is fatal
        why = "" if isinstance(e, SystemExit) else \
            f"\n(unhandled_fault_hook raised {type(e).__name__}: {e})"
        sys.stderr.write(f"Unhandled hpcmesh error on the controller:\n{failure.report()}"
                         f"{why}\n")
        sys.stderr.flush()
        main = threading.main_thread()
        if main.is_alive() and main is not threading.current_thread():
            signal.pthread_kill(main.ident, signal.SIGINT)


class Supervisor:
    """The supervision of the meshes one client runtime spawned (Monarch's ownership).

    ``owners``: actor mesh id -> the ActorInstance that spawned it (absent: the process's
    own code, whose failures go to ``unhandled_fault_hook``). It reads the runtime's
    process table ``procs`` (name -> ProcRecord: its ``owner``; it marks those it stops
    ``stopping``) and its tracked actor meshes ``meshes`` (id -> TrackedActorMesh);
    ``closing()``: the runtime is shutting down (processes killed at exit are no failure)."""

    def __init__(self, node: Node, procs: Mapping[str, Any], meshes: Mapping[str, Any],
                 closing: Callable[[], bool]):
        self.node = node
        self._procs = procs
        self._meshes = meshes
        self._closing = closing
        self.owners: dict[str, Any] = {}
        self._hook_thread: ActorThread | None = None

    def report_failure(self, owner, failure: MeshFailure) -> None:
        """A member of a mesh ``owner`` spawned failed: offer it to the owner's
        ``__supervise__``; with no owner (this process's own code spawned it), to
        ``unhandled_fault_hook`` on the controller."""
        if owner is not None:
            self.supervise(owner, failure)
        elif self.node.role == "proc":    # no hook in an actor process: say so, at least
            log.error("unhandled failure: %s", failure)
            print(f"hpcmesh: unhandled failure: {failure.report()}", file=sys.stderr,
                  flush=True)
        elif not self._closing():         # (processes killed at exit are no failure)
            if self._hook_thread is None:
                self._hook_thread = ActorThread("hpcmesh-unhandled-fault-hook")
            self._hook_thread.submit(run_unhandled_fault_hook, failure)

    def wait_for_fault_hook(self, timeout: float) -> None:
        """Wait until ``unhandled_fault_hook`` has run for every failure offered to it so
        far (it runs on a thread of its own, in order)."""
        thread = self._hook_thread
        if thread is not None:
            thread.submit(lambda: None).result(timeout=timeout)

    def supervise(self, owner, failure: MeshFailure) -> None:
        """Offer ``failure`` to the owning actor's ``__supervise__``; a true result handles
        it. Otherwise that actor fails too (as in Monarch), which its own owner hears of,
        up to ``unhandled_fault_hook`` on the controller."""
        host = self.node.actors.get(owner.actor_id)
        if host is None or host.fault is not None:   # stopped, or failed already
            return
        handler = getattr(owner.actor, "__supervise__", None)

        async def offer() -> None:
            handled = False
            why = ""
            cls = failure.reason or USER_EXCEPTION   # the cause below, unless its handler raised
            if handler is not None:
                try:
                    if inspect.iscoroutinefunction(handler):
                        handled = bool(await handler(failure))
                    else:
                        handled = bool(await self.node.loop.run_in_executor(
                            host.executor(), handler, failure))
                except Exception as e:  # noqa: BLE001 - a failing handler does not handle it
                    log.exception("__supervise__ of %s raised", owner.class_name)
                    why = f" (__supervise__ raised {type(e).__name__}: {e})"
                    cls = USER_EXCEPTION
            else:           # (a sync handler ran on the actor's thread, after that call)
                await host.between_calls()
            if not handled:
                host.fail_actor(f"it did not handle the failure of mesh {failure.mesh_name!r} "
                                f"that it owns{why}: {failure.error.message}",
                                failure_class=cls)
        self.node.call_soon(lambda: self.node.loop.create_task(offer()))

    def end_descendants(self, owner) -> None:
        """An actor that failed takes what it spawned with it (Monarch: the actor "and all
        its descendants have failed"): its actor meshes are stopped and its processes
        stopped at once, quietly (their ends are no further failure). Fire and forget: on
        the event loop, which must not wait."""
        for actor_id, who in list(self.owners.items()):
            if who is not owner:
                continue
            state = self._meshes.get(actor_id)
            for n in dict.fromkeys((state.nodes if state is not None else None) or ()):
                self.node.rpc(n, "stop_actors", [actor_id])
        by_agent: dict[str, tuple] = {}
        for rec in list(self._procs.values()):
            if rec.owner is owner and not rec.stopping and rec.failure is None:
                rec.stopping = True
                by_agent.setdefault(rec.agent.node_id, (rec.agent, []))[1].append(rec.name)
        for agent, names in by_agent.values():
            self.node.rpc(agent, "stop_procs", names, 0.0)

    async def stop_descendants(self, owner, grace: float | None = None) -> None:
        """An actor that is stopped stops what it spawned, as in Monarch: its actor meshes
        (their ``__cleanup__`` runs; later calls raise that they were stopped), then its
        processes, cleanly (as ``ProcMesh.stop()``: they get ``grace`` seconds, default
        ``HPCMESH_STOP_GRACE``, before SIGTERM). On the event loop; bounded by the grace."""
        grace = env_number("HPCMESH_STOP_GRACE", 5.0, finite=True) if grace is None else grace
        calls = []
        for actor_id, who in list(self.owners.items()):
            if who is not owner:
                continue
            state = self._meshes.get(actor_id)
            if state is None or state.nodes is None or state.failed is not None:
                continue
            state.failed = MeshStoppedError(
                f"actor mesh {state.name!r} was stopped: the actor that spawned it, "
                f"{owner.mesh_name}, was stopped", state.name)
            calls += [self.node.rpc(n, "stop_actors", [actor_id])
                      for n in dict.fromkeys(state.nodes)]
        recs = [r for r in self._procs.values()
                if r.owner is owner and not r.stopping and r.failure is None]
        for r in recs:
            r.stopping = True
            r.stop_reason = f"the actor that spawned it, {owner.mesh_name}, was stopped"
        calls += [self.node.rpc(r.node, "stop") for r in recs if r.node is not None]
        loop = self.node.loop
        deadline = loop.time() + grace
        if calls:
            await asyncio.wait([asyncio.ensure_future(self._settled(c)) for c in calls],
                               timeout=grace)
        by_agent: dict[str, tuple] = {}
        for r in recs:
            by_agent.setdefault(r.agent.node_id, (r.agent, []))[1].append(r.name)
        left = max(0.0, deadline - loop.time())
        for agent, names in by_agent.values():
            # they exit (finalizers run) within what is left of the grace, else SIGTERM
            self.node.rpc(agent, "stop_procs", names, left)

    @staticmethod
    async def _settled(f: Future) -> None:
        try:
            await f
        except Exception:  # noqa: BLE001 - gone already: stopped all the same
            pass
