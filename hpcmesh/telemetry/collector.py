"""Drains every process's recorder into the store, about once a second, on its own thread.

The controller's collector asks each host agent for its host (``telemetry_drain_host``:
the agent drains its processes over their Unix sockets and answers with all their rows,
its own process and GPU samples included), so a collection costs the controller one call
per host, not per process; processes with no such agent (those of ``this_host()``, whose
agent is the controller itself, MPI ranks, simulated ones) it asks itself
(``telemetry_drain``). All in parallel, bounded by a timeout; and its own recorder (what
the controller saw: meshes, sends, process exits, log lines). A query collects first, so
it sees the calls made just before it. Every ``snapshot_interval_secs`` it also records
each process's stacks and saves the store.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from ..runtime.observe import telemetry_recorder
from ..runtime.client import ClientRuntime
from ..settings import env_number
from .schema import TABLES
from .store import TelemetryStore

log = logging.getLogger("hpcmesh.telemetry")

INTERVAL_VAR = "HPCMESH_TELEMETRY_INTERVAL"
#: How long a collection waits for the processes' answers (a stuck one is skipped).
DRAIN_TIMEOUT_S = 2.0
#: Of that, how much less a host agent waits for its processes, so its answer (with those
#: that did answer) is in before the collection gives up on the whole host.
AGENT_MARGIN_S = 0.5


class Collector:
    def __init__(self, rt: ClientRuntime, store: TelemetryStore, *,
                 snapshot_interval: float = 30.0, save_to: str | None = None):
        self.rt = rt
        self.store = store
        self.interval = env_number(INTERVAL_VAR, 1.0, minimum=0.01, finite=True)
        self.snapshot_interval = snapshot_interval
        self.save_to = save_to
        self.recorder = telemetry_recorder.enable(sample_gpus=True)
        self.who = {"name": rt.node.name, "host": socket.gethostname(), "pid": os.getpid()}
        self.extra_agents: dict[str, Any] = {}     # host agents of the job's meshes
        # agents that do not drain their host (no telemetry_drain_host: an MPI job's rank 0,
        # a simulated host): their processes are asked one by one
        self.direct_agents: set[str] = set()
        self.collections = 0
        # a process's buffer was half full at the last collection: the next comes at once,
        # so that a fast caller's rows are kept rather than dropped
        self._hurry = False
        self._lock = threading.Lock()
        # held by the thread through one round of periodic work; pause() waits on it
        self._periodic = threading.Lock()
        self._paused = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcmesh-telemetry",
                                        daemon=True)

    def start(self) -> "Collector":
        telemetry_recorder.SINK = self.ingest     # the last drain of a stopping process
        self._thread.start()
        return self

    def stop(self) -> None:
        if telemetry_recorder.SINK == self.ingest:
            telemetry_recorder.SINK = None
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=DRAIN_TIMEOUT_S + 2)
        try:
            self.collect()
            self.save()
        except Exception:  # noqa: BLE001 - at exit: keep what we have
            log.exception("telemetry: the last collection failed")

    def pause(self) -> None:
        """No periodic collection until ``resume()``; returns once one under way has
        finished. The interval's timer goes on: a collection due meanwhile is skipped,
        not run late at ``resume()``, so collections keep their pace over the time not
        paused. ``collect()`` still runs when asked (a query asks). The processes' rows
        wait in their bounded buffers. For a timed section that must not share the
        machine with a collection; ``benchmarks/`` compares telemetry on and off so."""
        self._paused = True
        with self._periodic:
            pass

    def resume(self) -> None:
        self._paused = False

    def watch_hosts(self, meshes: dict[str, Any]) -> None:
        """Also drain the host agents of these HostMeshes (their GPUs, before any process
        runs there)."""
        for mesh in meshes.values():
            for ref in getattr(mesh, "refs", ()):
                if ref.agent.node_id != self.rt.node.node_id:
                    self.extra_agents[ref.agent.node_id] = ref.agent

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        next_snapshot = time.monotonic() + self.snapshot_interval
        while not self._stop.wait(0.05 if self._hurry else self.interval):
            with self._periodic:
                if self._paused:
                    continue
                try:
                    self.collect()
                    if self.snapshot_interval > 0 and time.monotonic() >= next_snapshot:
                        next_snapshot = time.monotonic() + self.snapshot_interval
                        self.snapshot_stacks()
                        self.save()
                    self.store.prune()
                except Exception:  # noqa: BLE001 - telemetry must never take the job down
                    log.exception("telemetry collection failed")

    # -- one collection --------------------------------------------------------------
    def _targets(self) -> tuple[dict[str, tuple[Any, list]], dict[str, Any]]:
        """({agent id: (agent, [(process name, its NodeRef)])}: hosts whose agent drains
        them; {node id: NodeRef}: nodes drained one by one)."""
        node = self.rt.node
        me = node.node_id
        hosts: dict[str, tuple[Any, list]] = {}
        direct: dict[str, Any] = {}
        for rec in list(self.rt.procs.values()):
            running = rec.node is not None and rec.failure is None and \
                node.peer_connected(rec.node.node_id) and rec.node.node_id != me
            agent_id = rec.agent.node_id
            if agent_id != me and agent_id not in self.direct_agents and \
                    node.peer_connected(agent_id):
                procs = hosts.setdefault(agent_id, (rec.agent, []))[1]
                if running and rec.node.node_id != agent_id:    # (else: the agent's own)
                    procs.append((rec.name, rec.node))
                continue
            if running:
                direct[rec.node.node_id] = rec.node
            if agent_id != me:
                direct.setdefault(agent_id, rec.agent)
        for agent_id, ref in list(self.extra_agents.items()):
            if node.peer_connected(agent_id) and agent_id not in direct:
                if agent_id in self.direct_agents:
                    direct[agent_id] = ref
                else:
                    hosts.setdefault(agent_id, (ref, []))
        return hosts, direct

    def collect(self, timeout: float = DRAIN_TIMEOUT_S) -> int:
        """Drain every process now; how many answered (the controller included)."""
        with self._lock:
            node = self.rt.node
            deadline = time.monotonic() + timeout
            hosts, direct = self._targets()
            agent_wait = max(0.0, timeout - AGENT_MARGIN_S)
            host_asks = {aid: (procs, node.rpc(ref, "telemetry_drain_host", procs, agent_wait))
                         for aid, (ref, procs) in hosts.items()}
            asks = [node.rpc(ref, "telemetry_drain") for ref in direct.values()]
            drains = [self.recorder.drain(
                lambda nid: telemetry_recorder.peer_name(node, nid), self.who)]
            for aid, (procs, fut) in host_asks.items():
                try:
                    res = fut.result(timeout=max(0.01, deadline - time.monotonic()))
                except LookupError as e:
                    if type(e) is not LookupError:      # (a KeyError: a bug, said there)
                        continue
                    # an agent with no such service (Services.run): ask its processes
                    self.direct_agents.add(aid)
                    asks += [node.rpc(ref, "telemetry_drain") for _, ref in procs]
                    continue
                except Exception:  # noqa: BLE001 - gone or stuck: next time, maybe
                    continue
                drains += res.get("drains", ())
                missed = set(res.get("missed", ()))
                asks += [node.rpc(ref, "telemetry_drain") for name, ref in procs
                         if name in missed]
            for fut in asks:
                try:
                    drains.append(fut.result(timeout=max(0.01, deadline - time.monotonic())))
                except Exception:  # noqa: BLE001 - gone or stuck: next time, maybe
                    continue
            self._hurry = False
            self.ingest(*drains)
            self.collections += 1
            return len(drains)

    def ingest(self, *drains: dict) -> None:
        """Drains' rows into the store, one record batch per table for all of them: a
        batch per process and table each second would leave a query of a big job wading
        through hundreds of thousands of tiny batches."""
        rows_of: dict[str, list] = {}
        keyed: dict[str, list] = {}
        half = telemetry_recorder.buffer_rows() // 2
        ts = telemetry_recorder.now_us()
        for res in drains:
            who = res.get("who") or {}
            src = (who.get("name"), who.get("host"), who.get("pid"))
            for name, rows in res.get("tables", {}).items():
                if name not in TABLES or not rows:
                    continue
                if len(rows) >= half:
                    self._hurry = True
                if isinstance(rows, (telemetry_recorder.KeyedRows,
                                     telemetry_recorder.SentRows)):
                    keyed.setdefault(name, []).append(
                        (rows, src if TABLES[name].from_source else ()))
                    continue
                if TABLES[name].from_source:
                    rows = [tuple(r) + src for r in rows]
                rows_of.setdefault(name, []).extend(rows)
            p = res.get("process")
            if p:
                rows_of.setdefault("metric_process", []).append(
                    (p["timestamp_us"], float(p["cpu_percent"]), int(p["rss_bytes"]),
                     int(p["threads"])) + src)
            rows_of.setdefault("metric_gpu", []).extend(
                (ts, g["gpu"], g["uuid"], g["name"], g["utilization_percent"],
                 g["memory_used_bytes"], g["memory_total_bytes"]) + src
                for g in res.get("gpus") or ())
            rows_of.setdefault("telemetry_drops", []).extend(
                (ts, t, int(n)) + src for t, n in (res.get("dropped") or {}).items())
        for name, parts in keyed.items():
            self.store.append_keyed_parts(name, parts)
        for name, rows in rows_of.items():
            self.store.append(name, rows)

    def snapshot_stacks(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Each running process's threads now, into ``stack_snapshots``."""
        node = self.rt.node
        asks = {}
        for rec in list(self.rt.procs.values()):
            if rec.node is not None and rec.failure is None and node.peer_connected(
                    rec.node.node_id) and rec.node.node_id != node.node_id:
                asks[rec.name] = (rec, node.rpc(rec.node, "admin_stacks"))
        deadline = time.monotonic() + timeout
        rows = []
        for rec, fut in asks.values():
            try:
                threads = fut.result(timeout=max(0.01, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001
                continue
            ts = telemetry_recorder.now_us()
            rows += [(ts, t["thread"], t["stack"], rec.name, rec.host, rec.pid)
                     for t in threads]
        self.store.append("stack_snapshots", rows)

    def save(self) -> None:
        if self.save_to:
            self.store.save(self.save_to)
