"""The worker side of an MPI launch: the proc runtime of one rank (a lease on any client),
and on rank 0 the host-agent services of the whole job (``stop_procs``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

from ..runtime.node import Node, NodeRef
from ..runtime.process.proc import ProcRuntime
from .layout import MPILayout

log = logging.getLogger("hpcmesh.mpi")

#: exit code of a rank whose controller lease expired (same as ProcRuntime)
EXIT_LEASE = 3
#: how long rank 0, asked to ``stop``, waits for the ``stop_procs`` that follows
STOP_PROCS_WAIT = 10.0


class MPIProcRuntime(ProcRuntime):
    """ProcRuntime with a lease on *any* client (the controller is not known in advance).

    On rank 0 it also plays the host agent of the whole job (``stop_procs``)."""

    def __init__(self, node: Node, world_rank: int, grace: float, attach_timeout: float | None):
        super().__init__(node, NodeRef("", ()), grace)
        self.world_rank = world_rank
        self.clients: set[str] = set()
        self.agent: RankZeroAgent | None = None
        self.abort_requested = False
        self.stopping = False
        self.exit_reason = ""
        self.info: dict = {}
        node.services["mpi_info"] = lambda: dict(self.info)
        if attach_timeout is not None:
            self._lease_timer = node.loop.call_later(
                attach_timeout, self._lease_expired,
                f"no controller connected within {attach_timeout:g} s")

    # -- lease: any client counts ------------------------------------------------------
    def controller_fd(self) -> int | None:
        """The lease watchdog's view (see ``ProcRuntime.controller_fd``): the socket of a
        connected client; -1 once every client is gone; None before the first one. Runs on
        the watchdog's thread, from the moment ``ProcRuntime.__init__`` starts it."""
        node = self.node
        for client in list(getattr(self, "clients", ())):
            p = node.peers.get(client)
            conn = p.conn if p is not None else None
            if conn is not None:
                try:
                    return conn.sock.fileno()
                except (OSError, AttributeError):
                    continue
        return -1 if self._controller_seen else None

    def _on_peer_hello(self, node, ref, info, conn) -> None:
        if info.get("role") != "client":
            return
        self.clients.add(ref.node_id)
        self._controller_seen = True
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _on_peer_closed(self, node, peer_id, exc) -> None:
        if node.closed or self.done.is_set() or self.stopping or peer_id not in self.clients:
            return
        if node.peer_connected(peer_id):
            return   # a newer connection from the same client replaced this one
        self.clients.discard(peer_id)
        if not self.clients and self._lease_timer is None:
            log.warning("rank %d lost its controller; exiting in %.1f s unless one connects",
                        self.world_rank, self.grace)
            self._lease_timer = node.loop.call_later(
                self.grace, self._lease_expired, f"controller gone for {self.grace:g} s")

    def _lease_expired(self, reason: str = "controller gone") -> None:
        self._lease_timer = None
        self.clients = {c for c in self.clients if self.node.peer_connected(c)}
        if self.clients or self.done.is_set():
            return
        print(f"hpcmesh.mpi rank {self.world_rank}: {reason}, exiting", file=sys.stderr,
              flush=True)
        self.exit_reason = reason
        self.exit_code = EXIT_LEASE
        self.done.set()

    # -- stop: rank 0 stays until stop_procs has seen the others go ---------------------
    async def stop(self) -> int:
        self.stopping = True
        await self.actor_services.stop_actors(list(self.node.actors))
        if self.agent is None:
            self.node.loop.call_later(0.02, self.done.set)
        else:
            self.agent.stopping_self = True
            self.node.loop.call_later(STOP_PROCS_WAIT, self.done.set)
        self.exit_reason = "stopped by the controller"
        return os.getpid()


class RankZeroAgent:
    """The host-agent services of an MPI job, on rank 0's node."""

    def __init__(self, rt: MPIProcRuntime, layout: MPILayout):
        self.rt = rt
        self.node = rt.node
        self.layout = layout
        self.rank_of = {e.node_id: e.world_rank for e in layout.entries}
        self.gone: set[int] = set()
        self.codes: dict[int, int] = {}
        self.stopping_self = False
        self.changed = asyncio.Event()
        self.node.services.update({
            "stop_procs": self.stop_procs,
            "spawn_procs": self.spawn_procs,
            "host_info": self.host_info,
            "mpi_rank_exit": self.rank_exit,
        })
        self.node.on_peer_closed.append(self._closed)

    def _closed(self, node, peer_id, exc) -> None:
        r = self.rank_of.get(peer_id)
        if r is not None and not node.peer_connected(peer_id):
            self.gone.add(r)
            self.changed.set()

    def rank_exit(self, world_rank: int, code: int) -> None:
        self.codes[world_rank] = code
        self.gone.add(world_rank)
        self.changed.set()

    def host_info(self) -> dict:
        return {"hostname": socket.gethostname(), "pid": os.getpid(), "mpi": True,
                "world_size": len(self.layout.entries), "hosts": list(self.layout.hosts)}

    def spawn_procs(self, *args) -> None:
        raise NotImplementedError(
            "the hosts of an MPI-launched ProcMesh cannot start more processes: under MPI the "
            "launcher (mpiexec/srun) decides the processes; start a bigger MPI job instead")

    async def stop_procs(self, names: list[str], grace: float = 5.0) -> dict:
        """Wait until the named ranks are gone; abort the MPI job if some are not."""
        ranks = {}
        for n in names:
            try:
                ranks[n] = int(n.rsplit("-r", 1)[1])
            except (IndexError, ValueError):
                log.warning("stop_procs: %r is not a process of this MPI job", n)
        me = self.rt.world_rank
        deadline = self.node.loop.time() + grace
        while True:
            waiting = [r for r in ranks.values() if r != me and r not in self.gone]
            left = deadline - self.node.loop.time()
            if not waiting or left <= 0:
                break
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass
        codes = {}
        for n, r in ranks.items():
            if r == me:
                codes[n] = 0 if self.stopping_self else None
            else:   # the code a rank reported on its way out; None if it just vanished
                codes[n] = self.codes.get(r)
        if waiting:
            everyone = set(ranks.values()) >= set(range(len(self.layout.entries)))
            log.error("MPI ranks %s did not exit within %.1f s of stop%s", sorted(waiting),
                      grace, "; aborting the MPI job" if everyone else "")
            if everyone:
                self.rt.abort_requested = True
                self.stopping_self = True
        if self.stopping_self:
            self.node.loop.call_later(0.05, self.rt.done.set)
        return codes
