"""The controller's runtime: its node (on a background thread), the local host
agent, and the bookkeeping that turns agent events into supervision errors and
prefixed log lines.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..transport.addresses import new_secret
from .errors import SupervisionError, describe_exit
from .future import Future
from .host_agent import HostAgent
from .tuning import tune_malloc
from .node import Node, NodeRef, set_current_node

log = logging.getLogger("hpcmesh.client")


@dataclass(eq=False)
class ProcRecord:
    """What the controller knows about one process it asked an agent to start."""
    name: str
    mesh_name: str
    point: Any
    agent: NodeRef
    label: str
    ready: Future = field(default_factory=Future)   # resolves to the proc's NodeRef
    node: NodeRef | None = None
    pid: int | None = None
    host: str = ""
    log_paths: dict = field(default_factory=dict)
    failure: SupervisionError | None = None
    stopping: bool = False
    forward_logs: bool = True
    on_failure: Callable | None = None


def _listen_addresses(node_id_unix: str) -> list[str]:
    addrs = [node_id_unix]
    from ..transport.netif import advertise_addresses
    ifname = os.environ.get("HPCMESH_IFNAME")
    try:
        # An explicit choice that matches nothing raises: the user asked for it by name.
        hosts = advertise_addresses(ifname=ifname, source="HPCMESH_IFNAME") if ifname \
            else advertise_addresses()
    except Exception as e:  # noqa: BLE001 - fall back to loopback, but say so
        if ifname:
            raise
        log.warning("interface discovery failed (%s); listening on 127.0.0.1 only", e)
        hosts = ["127.0.0.1"]
    for h in hosts:
        addrs.append(f"tcp://[{h}]:0" if ":" in h else f"tcp://{h}:0")
    return addrs


class ClientRuntime:
    """One per controller process; created on first use."""

    def __init__(self, secret: bytes | None = None):
        tune_malloc()
        self.secret = secret or new_secret()
        self.node = Node.start_in_thread(self.secret, role="client", name="client")
        self.node.run_sync(self._setup())
        self.procs: dict[str, ProcRecord] = {}
        self._local_agent: HostAgent | None = None
        self.events = self.node.open_port(self._on_event)
        self.node.on_peer_hello.append(self._on_hello)
        self.lease_grace = float(os.environ.get("HPCMESH_LEASE_GRACE", "10"))
        self._print_lock = threading.Lock()
        set_current_node(self.node)
        atexit.register(self.shutdown)

    async def _setup(self) -> None:
        self.node.listen(_listen_addresses(self.node.unix_address()))

    # -- local host agent ------------------------------------------------------------
    def local_agent(self) -> NodeRef:
        """The in-process host agent for this_host(): its services live on our own node."""
        if self._local_agent is None:
            advertise = next((a.rsplit(":", 1)[0].removeprefix("tcp://").strip("[]")
                              for a in self.node.addresses if a.startswith("tcp://")), "127.0.0.1")
            self._local_agent = HostAgent(self.node, advertise_host=advertise)
        return self.node.ref

    # -- events from agents and procs -------------------------------------------------
    def _on_hello(self, node, ref: NodeRef, info: dict, conn) -> None:
        name = info.get("proc_name")
        rec = self.procs.get(name) if name else None
        if rec is not None and rec.node is None:
            rec.node = ref
            rec.pid = info.get("pid")
            rec.host = info.get("host", rec.host)
            rec.ready.set_result(ref)

    def _on_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == "log":
            self._print_log(*event[1:])
        elif kind == "exit":
            self._on_exit(*event[1:])
        elif kind == "endpoint_failed":
            _, actor_id, err = event
            log.error("a broadcast to actor mesh %s failed: %s", actor_id[:8], err)
            print(f"hpcmesh: broadcast failed: {err}", file=sys.stderr)

    def _print_log(self, name: str, stream: str, lines: list[str]) -> None:
        rec = self.procs.get(name)
        if rec is not None and not rec.forward_logs:
            return
        prefix = f"[{rec.label}] " if rec is not None else f"[{name}] "
        out = sys.stdout if stream == "stdout" else sys.stderr
        text = "".join(f"{prefix}{ln}\n" for ln in lines)
        with self._print_lock:
            out.write(text)
            out.flush()

    def _on_exit(self, name: str, pid: int, returncode: int | None, host: str) -> None:
        rec = self.procs.get(name)
        if rec is None:
            return
        status = describe_exit(returncode)
        if rec.stopping:
            if rec.node is not None:
                self.node.fail_peer(rec.node.node_id, SupervisionError(
                    f"process {rec.label} of mesh {rec.mesh_name} was stopped",
                    rec.mesh_name, rec.point, host, pid, status))
            return
        where = f"process {rec.label} of mesh {rec.mesh_name!r} on host {host} (pid {pid})"
        if rec.node is None:
            tail = _tail(rec.log_paths.get("stderr"))
            exc = SupervisionError(
                f"{where} exited before it connected back ({status})" +
                (f"; last stderr lines:\n{tail}" if tail else ""),
                rec.mesh_name, rec.point, host, pid, status)
            rec.failure = exc
            rec.ready.set_exception(exc)
        else:
            exc = SupervisionError(f"{where} died: {status}", rec.mesh_name, rec.point, host,
                                   pid, status)
            rec.failure = exc
            self.node.fail_peer(rec.node.node_id, exc)
            print(f"hpcmesh: supervision: {exc}", file=sys.stderr)
        if rec.on_failure is not None:
            rec.on_failure(rec, exc)

    # -- shutdown ---------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill what the local agent started, close the node. Runs at interpreter exit."""
        global _runtime
        if self._local_agent is not None:
            self._local_agent.kill_all()
        self.node.shutdown_thread(2.0)
        if _runtime is self:
            _runtime = None
            set_current_node(None)


def _tail(path: str | None, n: int = 10) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError:
        return ""


_runtime: ClientRuntime | None = None
_runtime_lock = threading.Lock()


def client_runtime() -> ClientRuntime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = ClientRuntime()
    return _runtime


def existing_client_runtime() -> ClientRuntime | None:
    return _runtime
