"""What a host agent does while it runs: its node, its HostAgent and its lease.

Two ways to meet a controller: it listens (``--listen``; the controller calls
``attach_to_workers``) and/or it dials the client (``--attach``; used by batch
scripts so workers find a client whose address they were given). Either way it
holds a lease: once a controller has been gone longer than the grace period,
it kills its processes and exits, so a crashed client leaves nothing running.

The process around it (event loop, signals, secret, TLS) is
:mod:`hpcmesh.runtime.process.agent_main`, the one entry point every launcher uses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

from ...transport.addresses import parse_address
from ..future import register_loop_thread
from .host_agent import HostAgent
from ..node import Node, set_current_node

log = logging.getLogger("hpcmesh.worker")


class Lease:
    """When a host agent ends: ``grace`` s after its last controller left, ``initial_wait``
    s after it started if no controller came (None: wait), or at once on ``stop(reason)``
    (a stop signal: see agent_main). Made before the agent's node exists, so a signal that
    comes while the agent is still starting is not lost."""

    def __init__(self, grace: float, initial_wait: float | None):
        self.grace = grace
        self.initial_wait = initial_wait
        self.done = asyncio.Event()
        self.reason = ""
        self.controllers: set[str] = set()
        self._timer = None
        #: who hears of a notice (``notice``): the agent, once it runs; those that came
        #: before it are kept for it
        self.on_notice = None
        self._notices: list[str] = []

    def watch(self, node: Node) -> None:
        """Start counting: follow the controllers that say hello to ``node`` and leave it."""
        node.on_peer_hello.append(self._hello)
        node.on_peer_closed.append(self._closed)
        if self.initial_wait is not None:
            self._timer = node.loop.call_later(
                self.initial_wait, self._expire,
                f"no controller connected within {self.initial_wait} s")

    def _hello(self, node, ref, info, conn) -> None:
        if info.get("role") == "client":
            self.controllers.add(ref.node_id)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _closed(self, node, peer_id, exc) -> None:
        if peer_id in self.controllers:
            self.controllers.discard(peer_id)
            if not self.controllers and self._timer is None:
                log.warning("controller gone; exiting in %.1f s unless one connects", self.grace)
                self._timer = node.loop.call_later(self.grace, self._expire,
                                                   f"controller gone for {self.grace} s")

    def _expire(self, reason: str) -> None:
        if not self.controllers:
            self.stop(reason)

    def notice(self, what: str) -> None:
        """A signal that is a notice, not a stop (SIGTERM in a Slurm step): the agent tells
        its controllers."""
        if self.on_notice is None:
            self._notices.append(what)
        else:
            self.on_notice(what)

    def hear_notices(self, callback) -> None:
        """``callback(what)`` for each notice from now on, and for those that came before."""
        self.on_notice = callback
        early, self._notices = self._notices, []
        for what in early:
            callback(what)

    def stop(self, reason: str) -> None:
        """End now, controller or not; the first reason given is the one reported."""
        if not self.done.is_set():
            self.reason = reason
            self.done.set()


async def serve(listen: list[str], attach: list[str], secret: bytes, lease: Lease,
                advertise_host: str | None = None, ready_file: str | None = None) -> str:
    """Listen, dial ``attach`` (first that answers), serve until ``lease`` ends; then SIGKILL
    the process group of everything the agent started, close the node and return why."""
    loop = asyncio.get_running_loop()
    register_loop_thread(loop)
    node = Node(secret, loop, role="agent", name=f"agent@{socket.gethostname()}",
                info={"slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                      "slurm_nodeid": os.environ.get("SLURM_NODEID"),
                      "job_token": os.environ.get("HPCMESH_JOB_TOKEN")})
    advertise_host = advertise_host or default_advertise_host(listen)
    node.listen(listen, advertise_host=advertise_host)
    set_current_node(node)
    agent = HostAgent(node, advertise_host=advertise_host)
    # HostMesh.shutdown(): the controller ends this agent (its processes were stopped first)
    node.services["shutdown_agent"] = lambda: lease.stop("shut down by its HostMesh")
    lease.watch(node)
    lease.hear_notices(agent.announce_notice)
    if ready_file:
        with open(ready_file, "w") as f:
            f.write("\n".join(node.addresses) + "\n")
    print(f"hpcmesh worker on {socket.gethostname()} listening on {', '.join(node.addresses)}",
          file=sys.stderr, flush=True)
    # dialing runs beside the lease: a stop signal must not wait for an address that hangs
    dialing = loop.create_task(_dial(node, attach, lease)) if attach else None
    await lease.done.wait()
    if dialing is not None:
        dialing.cancel()
    print(f"hpcmesh worker on {socket.gethostname()} exiting: {lease.reason}", file=sys.stderr,
          flush=True)
    agent.kill_all(lease.reason)       # its controllers are told first: no lost host
    await asyncio.sleep(0.05)
    node.close()
    return lease.reason


async def _dial(node: Node, attach: list[str], lease: Lease) -> None:
    """No client answering is not the end (one may still come through ``listen``, else the
    initial wait ends the agent); anything else going wrong here is a bug: end, loudly."""
    try:
        addr, _conn = await node.connect_first(attach, on_error=lambda a, why: print(
            f"hpcmesh worker: cannot attach to {a}: {why}", file=sys.stderr, flush=True))
        log.info("attached to client at %s", addr)
    except ConnectionError as e:
        print(f"hpcmesh worker: cannot attach: {e}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.exception("attaching to %s failed", ", ".join(attach))
        lease.stop(f"cannot attach: {type(e).__name__}: {e}")


def default_advertise_host(listen: list[str]) -> str:
    """The host the agent and its processes advertise: a specific listen host, else the
    interface hpcmesh picks for this host (IPoIB first), else loopback."""
    for url in listen:
        try:
            a = parse_address(url)
        except ValueError:
            continue
        if a.scheme == "tcp" and a.host not in ("0.0.0.0", "::", ""):
            return a.host
    from ...transport.netif import usable_candidates
    ifname = os.environ.get("HPCMESH_IFNAME")
    if ifname:      # an explicit choice that matches nothing is an error, not a fallback
        return usable_candidates(ifname=ifname, source="HPCMESH_IFNAME")[0].address
    try:
        return usable_candidates()[0].address
    except Exception as e:  # noqa: BLE001 - no usable interface: same-host use still works
        log.warning("cannot choose an address to advertise (%s); using 127.0.0.1", e)
        return "127.0.0.1"
