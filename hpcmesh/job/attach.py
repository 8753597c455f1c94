"""Waiting for host agents that dial back to this client (batch workers, submitit workers).

A launch script starts ``hpcmesh worker --attach <client addresses>`` with the
job's token and secret; each agent probes the client's advertised addresses,
keeps the first that completes the handshake, and says hello with its token.
``AttachWaiter`` collects those hellos into HostRefs, in a stable order.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..actor.host_mesh import HostRef
from ..runtime.client import client_runtime
from ..runtime.node import NodeRef
from ..errors import HpcmeshError


class AttachTimeout(HpcmeshError, TimeoutError):
    """Not every expected host agent attached in time."""


class AttachWaiter:
    """Collects agents whose hello carries ``job_token``. Create it before launching workers."""

    def __init__(self, job_token: str, expected: int):
        self.job_token = job_token
        self.expected = expected
        self.hosts: dict[str, tuple[str, NodeRef, dict]] = {}
        self._cond = threading.Condition()
        self.node = client_runtime().node
        self.node.on_peer_hello.append(self._on_hello)

    def _on_hello(self, node, ref: NodeRef, info: dict, conn) -> None:
        if info.get("role") != "agent" or info.get("job_token") != self.job_token:
            return
        with self._cond:
            self.hosts[ref.node_id] = (info.get("host", "?"), ref, info)
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop collecting hellos (``wait`` does when it returns or raises; a launch that
        fails before it waits must, or the node would keep calling this waiter)."""
        try:
            self.node.on_peer_hello.remove(self._on_hello)
        except ValueError:
            pass

    @property
    def attached(self) -> int:
        return len(self.hosts)

    def wait(self, timeout: float, poll: Callable[[], str | None] | None = None,
             poll_interval: float = 0.5) -> list[HostRef]:
        """Wait until ``expected`` agents attached. ``poll`` is called between waits and may
        raise (the job failed) or return a progress string; returns HostRefs sorted by
        (Slurm node id, hostname)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                with self._cond:
                    if len(self.hosts) >= self.expected:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise AttachTimeout(
                            f"{len(self.hosts)} of {self.expected} host agents attached within "
                            f"{timeout:.0f} s")
                    self._cond.wait(min(left, poll_interval))
                if poll is not None:
                    poll()
        finally:
            self.stop()
        entries = sorted(self.hosts.values(),
                         key=lambda e: (int(e[2].get("slurm_nodeid") or 0), e[0]))
        return [HostRef(ref, host) for host, ref, info in entries]
