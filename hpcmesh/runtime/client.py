"""The controller's runtime: its node (on a background thread), the local host
agent, and the bookkeeping that turns agent events into supervision errors. The lines its
processes print go to its console (``observe/console.py``); whether an end on a job's
agents is the job's own is asked through ``job_ends.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..log_tail import log_tail
from ..settings import check_process_settings, env_number
from ..shapes import Point
from ..transport.addresses import new_secret
from . import actor_host, relay
from .actor_host import shown_name
from .observe import stragglers, telemetry_recorder
from .errors import (AGENT_EXITED, ENDED_BY_SLURM, HOST_LOST, LOST_STATUS, MeshFailure,
                     SupervisionError, actor_failed, describe_actor, describe_exit, exit_class,
                     process_exit_words)
from .process import placement
from .future import Future, set_wait_hook
from .process.host_agent import HostAgent
from .observe.console import Console
from .messages import (EVENT_ACTOR_FAULT, EVENT_AGENT_EXIT, EVENT_AGENT_NOTICE, EVENT_EXIT,
                       EVENT_LOG, EVENT_LOG_FOLDED)
from .links import describe_peer
from .job_ends import JobEnds
from .node import Node, NodeRef, current_node, set_current_node
from .supervision import Supervisor
from .process.tuning import tune_malloc

log = logging.getLogger("hpcmesh.client")

#: How long a host agent whose connection closed gets to answer a new one before its host
#: counts as lost (a killed agent refuses at once; this bounds a host that went silent).
AGENT_PROBE_S = 2.0

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
    owner: Any = None            # ActorInstance that spawned this process (None: the client)
    stop_reason: str = ""        # why it ends on purpose (stopping), where not a stop()
    stop_class: str = ""         # that, as a class (AGENT_EXITED, ENDED_BY_SLURM; errors.py)
    ended_with_job: bool = False  # its job's scheduler ended it (end_with_job)


def _listen_addresses(node_id_unix: str) -> list[str]:
    addrs = [node_id_unix]
    from ..transport.netif import usable_candidates
    ifname = os.environ.get("HPCMESH_IFNAME")
    try:
        # An explicit choice that matches nothing raises: the user asked for it by name.
        cands = usable_candidates(ifname=ifname, source="HPCMESH_IFNAME") if ifname \
            else usable_candidates()
        hosts = [c.address for c in cands]
    except Exception as e:  # noqa: BLE001 - fall back to loopback, but say so
        if ifname:
            raise
        log.warning("interface discovery failed (%s); listening on 127.0.0.1 only", e)
        hosts = ["127.0.0.1"]
    for h in hosts:
        addrs.append(f"tcp://[{h}]:0" if ":" in h else f"tcp://{h}:0")
    return addrs


class TrackedActorMesh(Protocol):
    """What the runtime reads of an actor mesh it tracks (``track_actor_mesh``): the
    actor layer's mesh state, which sits a layer above and is not imported here."""
    actor_id: str
    name: str
    class_name: str
    proc_names: list[str]           # the processes its actors run in, one per actor
    nodes: list[NodeRef] | None     # the actors' nodes, once they are up
    failed: BaseException | None    # set once it was stopped (or its spawn failed)

    def describe_member(self, proc_name: str) -> str | None:
        """Its actor in that process, as failure messages name it; None if none."""


class ClientRuntime:
    """One per process that owns meshes; created on first use.

    On the controller it runs its own node on a thread. Inside an actor process it
    reuses that process's node, so an actor can start processes and actors of its own
    and be their owner (``__supervise__``)."""

    def __init__(self, secret: bytes | None = None, node: Node | None = None):
        self._follower: placement.CallerFollower | None = None
        if node is None:
            # what the processes it starts will read: a typo fails here, named, not in each
            check_process_settings()
            late = stragglers.Settings.from_env()   # a bad value: named before anything starts
            tune_malloc(arena_max=1)     # before the loop thread starts: see tuning.py
            self.secret = secret or new_secret()
            self.node = Node.start_in_thread(self.secret, role="client", name="client")
            self.node.run_sync(self._setup())
            if placement.enabled():
                self._follower = placement.CallerFollower(self.node.loop_native_tid)
                set_wait_hook(self._follower.follow)
        else:
            self.secret = node.secret
            self.node = node
            node.on_stop.append(self.shutdown)    # the process stops: what it owns goes too
        self.procs: dict[str, ProcRecord] = {}
        # actor mesh id -> its state while someone holds it (the admin view's record of the
        # actors of a process that cannot be asked): see track_actor_mesh
        self._actor_meshes: weakref.WeakValueDictionary[str, TrackedActorMesh] = \
            weakref.WeakValueDictionary()
        # process name -> the actor meshes on it that an actor here spawned on processes
        # somebody else owns (their exits come here too: watch_processes); it also keeps
        # their record, so that they are stopped with their owner when nobody holds them
        self._watched: dict[str, list[tuple[TrackedActorMesh, Any, Point]]] = {}
        self._closing = False
        # id of the error a dead process's calls fail with -> (it, its ProcRecord, its
        # return code): to name each call it fails (``_name_failed_call``)
        self._dead: dict[int, tuple[SupervisionError, ProcRecord, int | None]] = {}
        self.node.ports.name_call = self._name_failed_call
        # where its meshes' failures go; what an owner's failure or stop takes with it
        self.supervisor = Supervisor(self.node, self.procs, self._actor_meshes,
                                     lambda: self._closing)
        actor_host.on_actor_failed.append(self.supervisor.end_descendants)
        actor_host.on_actor_stopped.append(self.supervisor.stop_descendants)
        self._local_agent: HostAgent | None = None
        self.events = self.node.open_port(self._on_event)
        self.node.on_peer_hello.append(self._on_hello)
        self.node.on_peer_closed.append(self._on_peer_closed)
        # host agent node id -> its hello (name, host, pid): to name it once it is gone
        self._agents: dict[str, dict] = {}
        self._agent_checks: set = set()      # the tasks asking agents whether they live
        # the jobs a scheduler may end as a whole, whose agents' ends wait for its verdict
        self.job_ends = JobEnds(self.node, self._end_with_job, lambda: self._closing)
        self.lease_grace = env_number("HPCMESH_LEASE_GRACE", 10, finite=True)
        # its processes' lines, prefixed with their ranks, folded again across hosts
        self.console = Console(self.node.loop, self.procs)
        set_current_node(self.node)
        if node is None:        # the controller: name its calls' stragglers and hangs
            stragglers.start(self, late)
        atexit.register(self.shutdown)

    async def _setup(self) -> None:
        self.node.listen(_listen_addresses(self.node.unix_address()))
        await placement.start_helper_threads_unpinned(self.node.loop)

    # -- local host agent ------------------------------------------------------------
    def local_agent(self) -> NodeRef:
        """The in-process host agent for this_host(): its services live on our own node."""
        if self._local_agent is None:
            advertise = next((a.rsplit(":", 1)[0].removeprefix("tcp://").strip("[]")
                              for a in self.node.addresses if a.startswith("tcp://")), "127.0.0.1")
            self._local_agent = HostAgent(self.node, advertise_host=advertise)
        return self.node.ref

    @property
    def local_host_agent(self) -> HostAgent | None:
        """The in-process host agent of this_host() (None until this_host() is used)."""
        return self._local_agent

    # -- events from agents and procs -------------------------------------------------
    def _on_hello(self, node, ref: NodeRef, info: dict, conn) -> None:
        if info.get("role") == "agent":
            self._agents[ref.node_id] = info
        name = info.get("proc_name")
        rec = self.procs.get(name) if name else None
        if rec is not None and rec.node is None:
            rec.node = ref
            rec.pid = info.get("pid")
            rec.host = info.get("host", rec.host)
            rec.ready.set_result(ref)
            if (tel := telemetry_recorder.RECORDER) is not None:
                tel.process_status(rec.name, rec.mesh_name, rec.label, rec.host, rec.pid,
                                   "running")

    def _on_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == EVENT_LOG:
            self.console.print_lines(*event[1:])
        elif kind == EVENT_LOG_FOLDED:
            self.console.fold(*event[1:])
        elif kind == EVENT_EXIT:
            self._on_exit(*event[1:])
        elif kind == EVENT_ACTOR_FAULT:
            self.report_failure(self.supervisor.owners.get(event[1]), event[2])
        elif kind == EVENT_AGENT_EXIT:
            self._on_agent_exit(*event[1:])
        elif kind == EVENT_AGENT_NOTICE:
            self._on_agent_notice(*event[1:])

    # -- its processes' lines (observe/console.py) -----------------------------------
    def flush_logs(self, mesh_name: str | None = None) -> None:
        """Print the folded lines still in a window, of one mesh or all (on the loop)."""
        self.console.flush(mesh_name)

    async def _flush_all_logs(self) -> None:
        """What the local agent and this client still fold goes out (this client ends)."""
        if self._local_agent is not None:
            self._local_agent.flush_logs()
        await asyncio.sleep(0)       # its folds are delivered here on the loop, in order
        self.flush_logs()

    def _on_exit(self, name: str, pid: int, returncode: int | None, host: str,
                 cause: tuple[str, str] | None = None, stop_asked: bool = False, *,
                 judged: bool = False) -> None:
        """A process ended. ``cause``: (failure class, why) where its agent could tell what
        ended it (the OOM killer, NCCL's watchdog); ``stop_asked``: its agent was asked to
        stop it (its end is on purpose); ``judged``: the job's scheduler was already asked
        whether the job itself moved (``watch_job_ends``)."""
        rec = self.procs.get(name)
        if rec is None:
            self._watched_exit(name, pid, returncode, host, stop_asked)
            return
        if rec.failure is not None:     # (lost with its host already)
            return
        if not rec.stopping and not judged and self.job_ends.held(
                rec.agent.node_id, f"process {rec.label} of mesh {rec.mesh_name!r} on host "
                f"{host} (pid {pid}) ended: {describe_exit(returncode)}",
                lambda: self._on_exit(name, pid, returncode, host, cause, stop_asked,
                                     judged=True)):
            return
        status = describe_exit(returncode)
        if rec.stopping:
            self._record_exit(rec, pid, host, status, rec.stop_class)
            if rec.node is not None:
                self.node.fail_peer(rec.node.node_id, self._stopped(rec, host, pid, status))
            return
        cls = cause[0] if cause else exit_class(returncode)
        why = f"{status}; {cause[1]}" if cause else status
        self._record_exit(rec, pid, host, why, cls)
        where = f"process {rec.label} of mesh {rec.mesh_name!r} on host {host} (pid {pid})"
        if rec.node is None:
            tail = log_tail(rec.log_paths.get("stderr"), 10)
            exc = SupervisionError(
                f"{where} exited before it connected back ({why})" +
                (f"; last stderr lines:\n{tail}" if tail else ""),
                rec.mesh_name, rec.point, host, pid, status, cls)
        else:
            exc = SupervisionError(self._died_message(rec, returncode, host, pid, why),
                                   rec.mesh_name, rec.point, host, pid, status, cls)
            self._dead[id(exc)] = (exc, rec, returncode)
        self.flush_logs(rec.mesh_name)      # what it printed last comes before its failure
        self._fail(rec, exc)
        if rec.owner is not None or rec.node is not None:
            # one that never connected fails the spawn: whoever waits for it is told
            self.report_failure(rec.owner, MeshFailure(rec.mesh_name, exc, rec.point))

    def _died_message(self, rec: ProcRecord, returncode: int | None, host: str, pid: int,
                      status: str, actors: list[str] | None = None) -> str:
        """A process died. With actors of this runtime's on it (or ``actors``): Monarch's
        words for the first, then hpcmesh's facts (which process, host, pid, how) and the
        other actors that were there; else the facts alone."""
        if actors is None:
            actors = [a for a in (m.describe_member(rec.name) for m in self.actor_meshes())
                      if a is not None]
        if not actors:
            return f"process {rec.label} of mesh {rec.mesh_name!r} on host {host} (pid {pid}) " \
                   f"died: {status}"
        others = f"; also on it: {', '.join(actors[1:])}" if len(actors) > 1 else ""
        return (f"The actor {actors[0]} and all its descendants have failed: "
                f"{process_exit_words(returncode)} (process {rec.label} of mesh "
                f"{rec.mesh_name!r} on host {host}, pid {pid}: {status}{others})")

    def _name_failed_call(self, exc: BaseException, actor_id: str,
                          endpoint: str, peer=None) -> BaseException:
        """The error of a call to ``endpoint`` of actor mesh ``actor_id`` that ``exc``
        fails: where ``exc`` is a process's death and this runtime tracks that mesh,
        Monarch's "Endpoint call m.ep() failed, The actor <that mesh's actor there> ...";
        where it is a lost host that names no process (a relaying agent could not reach the
        next one: ``relay._unreachable``), the process ``peer`` the call was to; else
        ``exc``."""
        if (peer is not None and type(exc) is SupervisionError and exc.point is None
                and exc.reason == HOST_LOST
                and (rec := self.procs.get(peer.relay_name)) is not None):
            return SupervisionError(
                f"process {rec.label} of mesh {rec.mesh_name!r} on host {rec.host} (pid "
                f"{rec.pid}): {exc}", rec.mesh_name, rec.point, rec.host, rec.pid,
                exc.exit_status, exc.reason)
        dead = self._dead.get(id(exc))
        mesh = self._actor_meshes.get(actor_id)
        if dead is None or dead[0] is not exc or mesh is None:
            return exc
        _, rec, returncode = dead
        actor = mesh.describe_member(rec.name)
        if actor is None:
            return exc
        text = self._died_message(rec, returncode, exc.host, exc.pid, exc.exit_status, [actor])
        return SupervisionError(f"Endpoint call {mesh.name}.{shown_name(endpoint)}() failed, "
                                f"{text}", exc.mesh, exc.point, exc.host, exc.pid,
                                exc.exit_status, exc.reason)

    def _fail(self, rec: ProcRecord, exc: SupervisionError) -> None:
        """``rec``'s process failed: it is gone for good, and what waits on it fails."""
        rec.failure = exc
        self._fail_waiters(rec, exc)
        if rec.on_failure is not None:
            rec.on_failure(rec, exc)

    def _fail_waiters(self, rec: ProcRecord, exc: SupervisionError) -> None:
        """What waits on ``rec``'s process fails with ``exc`` now: its start, if it never
        connected; else every call pending on it."""
        if rec.node is None:
            rec.ready.set_exception(exc)
        else:
            self.node.fail_peer(rec.node.node_id, exc)

    @staticmethod
    def _stopped(rec: ProcRecord, host: str, pid: int | None, status: str) -> SupervisionError:
        """What calls to a process that ended on purpose raise (with the class of why)."""
        why = f": {rec.stop_reason}" if rec.stop_reason else ""
        return SupervisionError(f"process {rec.label} of mesh {rec.mesh_name} was stopped{why}",
                                rec.mesh_name, rec.point, host, pid, status, rec.stop_class)

    # -- host agents that end ---------------------------------------------------------
    def _live_on(self, agent_id: str) -> list[ProcRecord]:
        """The processes started through agent ``agent_id`` that nobody stopped and that
        have not failed."""
        return [r for r in self.procs.values() if r.agent.node_id == agent_id
                and not r.stopping and r.failure is None]

    def _on_agent_exit(self, agent_id: str, host: str, reason: str, *,
                       judged: bool = False) -> None:
        """An agent says it is ending on purpose (a stop signal, its lease, its HostMesh's
        shutdown) and takes its processes: their end is no lost host, and no failure to
        supervise (the job's lifecycle, SPEC §12); calls to them fail now, saying why (an
        agent of a watched job: once its job said whether it moved)."""
        if not judged and self._live_on(agent_id) and self.job_ends.held(
                agent_id, f"the host agent on {host} is ending ({reason})",
                lambda: self._on_agent_exit(agent_id, host, reason, judged=True)):
            return
        for rec in self._live_on(agent_id):
            rec.stopping = True
            rec.stop_reason = f"its host agent on {host} exited ({reason})"
            rec.stop_class = AGENT_EXITED
            self._fail_waiters(rec, self._stopped(
                rec, host, rec.pid, f"killed by its host agent ({reason})"))

    def _on_agent_notice(self, agent_id: str, host: str, what: str) -> None:
        """An agent of a watched job got a notice (SIGTERM in a Slurm step) and goes on:
        the job is asked now whether it moved (scancel, time limit: its processes end
        with it at once, not when Slurm's SIGKILL comes) or only will (a preemption's
        GraceTime: nothing to do here; the program hears of it through the job's
        notices). Nothing is held: there is nothing to report if it did not move."""
        self.job_ends.notice(agent_id, f"the host agent on {host} {what}")

    def _on_peer_closed(self, node, peer_id: str, exc: BaseException | None) -> None:
        """The last connection to a peer closed. If it is an agent with live processes of
        ours, ask it for a new one: an agent that does not answer is gone, and so is its
        host, as far as its processes go (SPEC §3)."""
        if self._closing or node.closed or peer_id == node.node_id:
            return
        recs = self._live_on(peer_id)
        if recs:
            task = node.loop.create_task(self._check_agent(recs[0].agent, exc))
            self._agent_checks.add(task)         # (the loop keeps only a weak reference)
            task.add_done_callback(self._agent_checks.discard)

    async def _check_agent(self, agent: NodeRef, closed: BaseException | None) -> None:
        try:
            await self.node.connect_first(agent.addresses, expect=agent.node_id,
                                          timeout=AGENT_PROBE_S)
            return              # alive: it was the connection, now replaced
        except Exception as e:  # noqa: BLE001 - whatever it was, the agent cannot be reached
            why = str(e) or type(e).__name__
        if not self._closing:
            self._host_lost(agent.node_id, f"its connection closed ({closed or 'closed'}) "
                            f"and it did not answer a new one ({why})")

    def host_lost(self, agent_id: str, why: str) -> None:
        """Agent ``agent_id``'s host is gone, as someone outside the runtime knows (Slurm
        took its node out of the running job) while it may still answer: its processes are
        lost, as when it stops answering (already judged: the job did not move), and the
        agent is asked to end, taking them with it (nobody else will). From any thread."""
        def lost() -> None:
            self._host_lost(agent_id, why, judged=True)
            self.node.rpc(self.node.ref_of(agent_id), "shutdown_agent")   # if it listens
        self.node.loop.call_soon_threadsafe(lost)

    def _host_lost(self, agent_id: str, why: str, *, judged: bool = False) -> None:
        """Agent ``agent_id`` is gone: its processes are lost with it (they end by
        themselves, their parent gone). Every call pending on each fails now; each owner is
        told once per mesh (its ``__supervise__``, else ``unhandled_fault_hook``)."""
        recs = self._live_on(agent_id)
        if not recs:
            return
        if not judged and self.job_ends.held(
                agent_id, f"the host agent of {recs[0].host or '?'} is gone: {why}",
                lambda: self._host_lost(agent_id, why, judged=True)):
            return
        info = self._agents.get(agent_id)
        host = recs[0].host or (info or {}).get("host", "?")
        agent = f"its host agent {describe_peer(agent_id, info)} is gone: {why}"
        log.info("host %s lost: %s", host, agent)
        def pid(rec: ProcRecord) -> str:
            return f"pid {rec.pid}" if rec.pid is not None else "not started yet"
        meshes: dict[tuple, list[ProcRecord]] = {}
        for rec in recs:
            exc = SupervisionError(
                f"process {rec.label} of mesh {rec.mesh_name!r} on host {host} ({pid(rec)}) "
                f"was lost with its host: {agent}", rec.mesh_name, rec.point, host, rec.pid,
                LOST_STATUS, HOST_LOST)
            self._record_exit(rec, rec.pid, host, LOST_STATUS, HOST_LOST)
            self._fail(rec, exc)
            meshes.setdefault((rec.mesh_name, id(rec.owner)), []).append(rec)
        relayed = self._lost_with_relay(agent_id, host, agent)
        for (mesh, _), lost in meshes.items():
            owner = lost[0].owner
            if owner is None and all(r.node is None for r in lost):
                continue      # none had connected: the failed spawn tells whoever waits
            which = ", ".join(f"{r.label} ({pid(r)})" for r in lost)
            error = SupervisionError(
                f"host {host} of mesh {mesh!r} was lost, and its {len(lost)} process(es) "
                f"of the mesh with it ({which}): {agent}", mesh, None, host, None,
                LOST_STATUS, HOST_LOST)
            self.report_failure(owner, MeshFailure(mesh, error))
        for (mesh, _), lost in relayed.items():
            which = ", ".join(f"{r.label} (pid {r.pid})" for r in lost)
            error = SupervisionError(
                f"host {host} was lost while messages to {len(lost)} process(es) of mesh "
                f"{mesh!r} on other hosts went through its agent ({which}): {agent}", mesh,
                None, host, None, LOST_STATUS, HOST_LOST)
            self.report_failure(lost[0].owner, MeshFailure(mesh, error))

    def _lost_with_relay(self, agent_id: str, host: str, agent: str) -> dict:
        """Agent ``agent_id`` relayed in a tree (``relay.cast_tree``): the calls it headed
        to other hosts' processes fail, naming it, and so does each process below it
        whose relayed messages it may have held unforwarded (nothing says whether they
        arrived: going on could skip a broadcast unseen; their calls fail with them).
        Those processes, by mesh."""
        relay.fail_relayed(self.node, agent_id, SupervisionError(
            f"relayed through the host agent of host {host}, which was lost: {agent}",
            None, None, host, None, LOST_STATUS, HOST_LOST))
        meshes: dict[tuple, list[ProcRecord]] = {}
        for p in self.node.peers.values():
            # relayed through it: as the head, or an agent further down (not its own)
            if p.relay_path and p.relay_sent != p.relay_acked and (
                    p.relay_via.node_id == agent_id
                    or any(r.node_id == agent_id for r in p.relay_path[:-1])):
                rec = self.procs.get(p.relay_name)
                if rec is None or rec.failure is not None or rec.node is None \
                        or rec.node.node_id != p.ref.node_id:
                    continue
                self._fail(rec, SupervisionError(
                    f"process {rec.label} of mesh {rec.mesh_name!r} on host {rec.host} (pid "
                    f"{rec.pid}): messages to it went through the host agent of host {host}, "
                    f"lost before they were known to arrive: {agent}", rec.mesh_name,
                    rec.point, rec.host, rec.pid, LOST_STATUS, HOST_LOST))
                meshes.setdefault((rec.mesh_name, id(rec.owner)), []).append(rec)
        return meshes

    # -- jobs a scheduler may end as a whole (SPEC §12): job_ends.py ------------------
    def watch_job_ends(self, agent_ids, explain: Callable[[str], SupervisionError | None]
                       ) -> Callable[[], None]:
        """These host agents are one job's, which its scheduler may end as a whole: an
        unasked end on them waits for ``explain``'s verdict (``JobEnds.watch``). Returns
        the undo."""
        return self.job_ends.watch(agent_ids, explain)

    def end_with_job(self, agent_ids, error: SupervisionError) -> None:
        """The job of these agents ended, was requeued or preempted: every process on them
        is gone with it, no fault (``JobEnds.end``)."""
        self.job_ends.end(agent_ids, error)

    def _end_with_job(self, agent_ids: frozenset, error: SupervisionError,
                      reword: bool) -> None:
        """(loop) Every process on these agents ended with their job (``JobEnds``'s verdict,
        or ``end_with_job``), in ``error``'s words; ``reword``: those that did already take
        them too."""
        for rec in list(self.procs.values()):
            if rec.agent.node_id not in agent_ids:
                continue
            first = rec.failure is None and not rec.stopping
            if not first and not (reword and rec.ended_with_job and rec.node is not None):
                continue        # stopped on purpose, failed for a reason of its own, or done
            host = rec.host or self._agents.get(rec.agent.node_id, {}).get("host", "?")
            status = error.exit_status or "ended with its job"
            cls = error.reason or ENDED_BY_SLURM    # (Slurm's OUT_OF_MEMORY, NODE_FAIL say more)
            if first:
                rec.stopping = rec.ended_with_job = True
                rec.stop_reason = error.message
                rec.stop_class = cls
                self._record_exit(rec, rec.pid, host, f"{status}: {error.message}", cls)
            self._fail(rec, SupervisionError(
                f"{error.message} (process {rec.label} of mesh {rec.mesh_name!r} on host "
                f"{host})", rec.mesh_name, rec.point, host, rec.pid, status, cls))

    def _record_exit(self, rec: ProcRecord, pid: int, host: str, status: str,
                     failure_class: str | None = None) -> None:
        """The telemetry of a process's end: its own row, and one per actor it hosted
        (those cannot say so themselves), with the failure's class."""
        tel = telemetry_recorder.RECORDER
        if tel is None:
            return
        ended = "stopped" if rec.stopping else "failed"
        why = (f"process {rec.label} of mesh {rec.mesh_name} on host {host} (pid {pid}) "
               f"{'was stopped' if rec.stopping else 'died'}: {status}")
        tel.process_status(rec.name, rec.mesh_name, rec.label, host, pid, ended, why,
                           failure_class)
        for actor_id, st in list(self._actor_meshes.items()):
            names = st.proc_names
            if rec.name in names:
                tel.status(f"{actor_id}.{names.index(rec.name)}", ended, why, failure_class)

    # -- the actor meshes this process spawned ------------------------------------
    def track_actor_mesh(self, mesh: TrackedActorMesh, owner: Any = None) -> None:
        """``mesh`` was spawned from this process by ``owner`` (the ActorInstance of the
        spawning actor; None: this process's own code). A failure of one of its actors is
        offered to that owner (``report_failure``), the owner's failure stops it
        (``end_descendants``), its actors' ends are recorded with their processes', and
        the admin view lists it, while somebody holds it (it is kept weakly)."""
        if owner is not None:
            self.supervisor.owners[mesh.actor_id] = owner
        self._actor_meshes[mesh.actor_id] = mesh

    def watch_processes(self, mesh: TrackedActorMesh, records: list[ProcRecord],
                        extent: Any, owner: Any) -> None:
        """``owner`` (an actor of this process) spawned ``mesh`` on processes somebody else
        owns (a ProcMesh it was given), one actor on each of ``records``, in order: it owns
        the actor mesh, so a process of it that dies is offered to its ``__supervise__``, as
        its actors' failures are (``extent``: the actor mesh's). Their host agents tell
        this process of their exits too."""
        by_agent: dict[str, tuple[NodeRef, list[str]]] = {}
        for i, rec in enumerate(records):
            if rec.name in self.procs:      # ours: its exit comes here anyway
                continue
            self._watched.setdefault(rec.name, []).append((mesh, owner, Point(i, extent)))
            by_agent.setdefault(rec.agent.node_id, (rec.agent, []))[1].append(rec.name)

        def ended(f: Future) -> None:
            if f.exception() is None:       # (an agent without the service: MPI ranks)
                for name, code in f.value().items():
                    self._watched_exit(name, None, code, "", False)
        for agent, names in by_agent.values():
            self.node.rpc(agent, "watch_procs", names, self.events).add_done_callback(ended)

    def _watched_exit(self, name: str, pid: int | None, returncode: int | None, host: str,
                      stop_asked: bool) -> None:
        """A process that actors of this process spawned actors on ended (``watch_processes``):
        unless it was stopped (by its owner), each such actor mesh that still runs failed
        there, and its owner's ``__supervise__`` is offered that."""
        watched = self._watched.pop(name, [])
        if stop_asked or returncode == 0 or self._closing:
            return      # stopped on purpose: a clean exit, or the agent was asked to
        status = describe_exit(returncode)
        for mesh, owner, point in watched:
            if mesh.failed is not None:     # stopped already
                continue
            where = f"process {name}" + (f" on host {host}" if host else "") + \
                (f" (pid {pid})" if pid is not None else "")
            why = actor_failed(describe_actor(mesh.class_name, mesh.name, point),
                               f"the process this actor was running on died: {status} "
                               f"({where})", mesh.name, point)
            exc = SupervisionError(why.message, mesh.name, point, host, pid, status)
            if mesh.nodes is not None:      # calls to it pending here fail now, saying why
                self.node.fail_peer(mesh.nodes[point.rank].node_id, exc)
            self.report_failure(owner, MeshFailure(mesh.name, exc, point))

    def actor_meshes(self) -> list[TrackedActorMesh]:
        """The actor meshes tracked here that somebody still holds."""
        return list(self._actor_meshes.values())

    # -- supervision by owning actors (supervision.py) -------------------------------
    def report_failure(self, owner, failure: MeshFailure) -> None:
        """A member of a mesh ``owner`` spawned failed: to the owner's ``__supervise__``,
        else to ``unhandled_fault_hook`` (``Supervisor.report_failure``)."""
        self.supervisor.report_failure(owner, failure)

    def wait_for_fault_hook(self, timeout: float) -> None:
        """Wait until ``unhandled_fault_hook`` has run for every failure offered to it so
        far (``Supervisor.wait_for_fault_hook``)."""
        self.supervisor.wait_for_fault_hook(timeout)

    # -- shutdown ---------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill what the local agent started, close the node. Runs at interpreter exit."""
        global _runtime
        self._closing = True
        if self.console.folding() or (self._local_agent is not None and self._local_agent.folding):
            if self.node.on_loop_thread():
                self.flush_logs()
            elif self.node.loop.is_running():
                try:
                    self.node.run_sync(self._flush_all_logs(), timeout=2.0)
                except Exception:  # noqa: BLE001 - the loop ended meanwhile: the files keep them
                    pass
        if stragglers.WATCH is not None and stragglers.WATCH.runtime is self:
            stragglers.stop()
        if self.supervisor.end_descendants in actor_host.on_actor_failed:
            actor_host.on_actor_failed.remove(self.supervisor.end_descendants)
        if self.supervisor.stop_descendants in actor_host.on_actor_stopped:
            actor_host.on_actor_stopped.remove(self.supervisor.stop_descendants)
        if self._local_agent is not None:
            self._local_agent.kill_all()
        if self._follower is not None:
            set_wait_hook(None)
            self._follower.release()
            self._follower = None
        if self.node.role != "proc":     # an actor process's node belongs to that process
            self.node.shutdown_thread(2.0)
        if _runtime is self:
            _runtime = None
            set_current_node(None)


_runtime: ClientRuntime | None = None
_runtime_lock = threading.Lock()


def client_runtime() -> ClientRuntime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                node = current_node()
                # inside an actor process: own meshes through this process's node
                _runtime = ClientRuntime(node=node) if node is not None and \
                    node.role == "proc" else ClientRuntime()
    return _runtime


def install_client_runtime(secret: bytes) -> ClientRuntime:
    """This process's client runtime, created with ``secret`` if it has none yet: a process
    that joins a job started elsewhere (the controller of an MPI launch) speaks with that
    job's secret, not a new one. One that exists already is returned as it is."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = ClientRuntime(secret)
        return _runtime


def existing_client_runtime() -> ClientRuntime | None:
    return _runtime


def expect_exits(agent_ids: set[str]) -> None:
    """The processes this controller started through these agents are about to end on
    purpose (their job is being killed): their exits fail calls to them, as any stop does,
    but are no failure to supervise or report."""
    rt = _runtime
    if rt is None:
        return
    for rec in list(rt.procs.values()):
        if rec.agent.node_id in agent_ids:
            rec.stopping = True


def current_or_client_node() -> Node:
    """The node messages of this thread go out on: an actor process's own node, else the
    controller's (its ClientRuntime started on first use)."""
    node = current_node()
    return node if node is not None else client_runtime().node
