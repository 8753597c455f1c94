"""``hpcmesh worker``: a standalone host agent.

Two ways to meet a controller: it listens (``--listen``; the controller calls
``attach_to_workers``) and/or it dials the client (``--attach``; used by batch
scripts so workers find a client whose address they were given). Either way it
holds a lease: once a controller has been gone longer than the grace period,
it kills its processes and exits, so a crashed client leaves nothing running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

from ..settings import env_number
from ..transport import tls
from ..transport.addresses import parse_address, secret_from_env
from .future import register_loop_thread
from .host_agent import HostAgent
from .loop import new_event_loop
from .node import Node, set_current_node

log = logging.getLogger("hpcmesh.worker")


class _Lease:
    def __init__(self, node: Node, agent: HostAgent, grace: float, initial_wait: float | None):
        self.node = node
        self.agent = agent
        self.grace = grace
        self.done = asyncio.Event()
        self.reason = ""
        self.controllers: set[str] = set()
        self._timer = None
        node.on_peer_hello.append(self._hello)
        node.on_peer_closed.append(self._closed)
        if initial_wait is not None:
            self._timer = node.loop.call_later(initial_wait, self._expire,
                                               f"no controller connected within {initial_wait} s")

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

    def stop(self, reason: str) -> None:
        """End now, controller or not (a signal from scancel or the batch script)."""
        self.reason = reason
        self.done.set()


async def serve(listen: list[str], attach: list[str], secret: bytes, grace: float,
                initial_wait: float | None, advertise_host: str | None,
                ready_file: str | None = None) -> str:
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
    lease = _Lease(node, agent, grace, initial_wait)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lease.stop, f"received {signal.Signals(sig).name}")
    if ready_file:
        with open(ready_file, "w") as f:
            f.write("\n".join(node.addresses) + "\n")
    print(f"hpcmesh worker on {socket.gethostname()} listening on {', '.join(node.addresses)}",
          file=sys.stderr, flush=True)
    if attach:
        try:
            addr, _conn = await node.connect_first(attach, on_error=lambda a, why: print(
                f"hpcmesh worker: cannot attach to {a}: {why}", file=sys.stderr, flush=True))
            log.info("attached to client at %s", addr)
        except ConnectionError as e:
            print(f"hpcmesh worker: cannot attach: {e}", file=sys.stderr, flush=True)
    await lease.done.wait()
    print(f"hpcmesh worker on {socket.gethostname()} exiting: {lease.reason}", file=sys.stderr,
          flush=True)
    agent.kill_all()
    await asyncio.sleep(0.05)
    node.close()
    return lease.reason


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
    from ..transport.netif import advertise_addresses
    ifname = os.environ.get("HPCMESH_IFNAME")
    if ifname:      # an explicit choice that matches nothing is an error, not a fallback
        return advertise_addresses(ifname=ifname, source="HPCMESH_IFNAME")[0]
    try:
        return advertise_addresses()[0]
    except Exception as e:  # noqa: BLE001 - no usable interface: same-host use still works
        log.warning("cannot choose an address to advertise (%s); using 127.0.0.1", e)
        return "127.0.0.1"


def run_worker_loop_forever(address: str | list[str] = "tcp://0.0.0.0:0", *,
                            attach: list[str] = (), secret: bytes | None = None,
                            grace: float | None = None, initial_wait: float | None = None,
                            advertise_host: str | None = None, ready_file: str | None = None,
                            ca=None) -> str:
    """Run a host agent until its lease expires; returns why it stopped."""
    secret = secret or secret_from_env()
    if secret is None:
        raise ValueError("the worker needs the job secret: set HPCMESH_SECRET (hex) or "
                         "HPCMESH_SECRET_FILE (a file of mode 0600), or pass secret=")
    listen = [address] if isinstance(address, str) else list(address)
    grace = env_number("HPCMESH_LEASE_GRACE", 30) if grace is None else grace
    tls_settings = tls.settings(ca)
    if tls_settings is not None:
        # The agent's node reads it at start, and every process it spawns inherits it.
        os.environ.update(tls_settings.env())
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(serve(listen, list(attach), secret, grace, initial_wait,
                                             advertise_host, ready_file))
    finally:
        loop.close()
