"""ProcMesh: processes started on a HostMesh (or by MPI, or this process itself); spawn
actors on them, stop them.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import os
import pickle
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar, cast

from ..runtime.actor_services import ActorServices
from ..runtime.observe import telemetry_recorder as _tel
from ..runtime.client import (ProcRecord, client_runtime, current_or_client_node,
                              existing_client_runtime)
from ..runtime import context as _context
from ..runtime.context import Rendezvous
from ..runtime.errors import HOST_LOST, MeshStoppedError, class_path
from ..runtime.future import Future, completed, failed, gather, on_runtime_thread
from ..runtime.node import Node, NodeRef
from ..runtime.observe.spans import start_span
from ..settings import env_number
from ..shapes import Extent, MeshTrait, Point, Shape
from ..transport import serialization
from .endpoint import ENDPOINT_ATTR, Actor, check_endpoint_names, endpoint, warn_if_mixed

from .actor_mesh import ActorMesh, ActorMeshState, proc_mesh_stopped, stop_actor_mesh
from .mesh_view import MeshView, as_asyncio, chain, chain_any, spawning_actor

#: Seconds ProcMesh.stop() waits for a clean exit before SIGTERM, then SIGKILL (read at each
#: stop, so ``hpcmesh.config.configure(stop_grace=...)`` holds from then on).
DEFAULT_STOP_GRACE_S = 5.0
LAUNCH_WAIT = 60.0
#: What a host agent's stop_procs takes beyond the grace (2 s after SIGTERM, 5 s after
#: SIGKILL) plus 5 s for the answer to travel: past it, stop() gives up on that agent.
STOP_PROCS_SLACK = 12.0      # stop() of a mesh still starting waits this long for the agents
log = logging.getLogger("hpcmesh.actor")
TActor = TypeVar("TActor")


class ProcMeshState:
    """What every view of one ProcMesh shares. ``hosts`` is the HostMesh it runs on (typed
    loosely: host_mesh.py builds on this module), None when someone else started it."""

    def __init__(self, name: str, records: list[ProcRecord], ready: Future,
                 hosts: MeshTrait | None, launched: Future | None = None):
        self.name = name
        self.records = records
        self.ready = ready
        self.hosts = hosts
        # settles once every agent answered the spawn request (None: started by someone
        # else, e.g. an MPI launcher, before the mesh existed)
        self.launched = launched if launched is not None else completed(None)
        self.stopped = False
        self.in_this_process = False    # this_proc(): stop() stops its actors, not the process
        self.actor_meshes: list = []    # the _ActorMeshStates spawned on it


class ProcMesh(MeshView):
    """Processes started on a HostMesh; spawn actors on them."""

    @classmethod
    def from_records(cls, name: str, records: list[ProcRecord], extent: Extent,
                     hosts: MeshTrait | None, *, in_this_process: bool = False) -> "ProcMesh":
        """A mesh over processes started by someone else (an MPI launcher, this process
        itself: ``in_this_process``): ``records`` in row-major order of ``extent``, each
        ready once its process said hello."""
        state = ProcMeshState(name, records, gather([r.ready for r in records]), hosts)
        state.in_this_process = in_this_process
        return cls(state, Shape.from_extent(extent))

    @property
    def records(self) -> list[ProcRecord]:
        """The runtime's record of each process of this view, in order (a launcher that
        built the mesh with ``from_records`` finds its own records here)."""
        return [self._known_records()[g] for g in self._shape.ranks()]

    def _known_records(self) -> list[ProcRecord]:
        """Every process of the mesh; for a mesh still being asked of the process that
        spawned this actor (``proc_mesh`` read in an async endpoint), once the answer is
        in (waited for off the event loop)."""
        st = self._state
        if not st.records and not (st.ready.done() and st.ready.exception() is None):
            if not st.ready.done() and on_runtime_thread():
                raise RuntimeError(f"proc mesh {st.name!r} is still being asked of the "
                                   f"process that spawned this actor; `await "
                                   f"proc_mesh.initialized` first")
            st.ready.get()
        return st.records

    @property
    def stopped(self) -> bool:
        """Whether the whole mesh was stopped (``stop()`` on it, or on a view of all of it)."""
        return self._state.stopped

    @property
    def pids(self) -> list[int | None]:
        return [self._known_records()[g].pid for g in self._shape.ranks()]

    @property
    def host_ids(self) -> list[str]:
        """Which host agent started each member of this view (equal ids: the same host), for
        numbering members per host the way torchrun does (``hpcmesh.spmd``)."""
        return [self._known_records()[g].agent.node_id for g in self._shape.ranks()]

    @property
    def log_paths(self) -> list[dict]:
        return [self._known_records()[g].log_paths for g in self._shape.ranks()]

    def spawn(self, name: str, actor_class: type[TActor], *args, **kwargs) -> TActor:
        """Place one ``actor_class(*args, **kwargs)`` on every process of this view; an
        ActorMesh of them (typed as the actor class, as in Monarch, so that a type checker
        sees ``mesh.method`` as ``Endpoint[P, R]``)."""
        if self._state.stopped:
            raise MeshStoppedError(f"proc mesh {self.name!r} has been stopped; spawn new "
                                   f"processes", self.name)
        if not isinstance(actor_class, type):
            raise TypeError(f"spawn() needs an actor class, got {type(actor_class).__name__}")
        check_endpoint_names(actor_class)
        warn_if_mixed(actor_class)
        if (args or kwargs) and not on_runtime_thread():
            # Fail now on unpicklable arguments, and wait here (not later on the runtime's
            # loop) for actor meshes passed as arguments to finish starting.
            serialization.dumps((args, kwargs), f"arguments of {actor_class.__name__}()")
        endpoints = {n for n in dir(actor_class)
                     if getattr(getattr(actor_class, n, None), ENDPOINT_ATTR, None) is not None}
        cls_blob = (class_in_this_process(actor_class) if self._state.in_this_process
                    else serialization.dumps_by_value(actor_class))
        node = current_or_client_node()
        actor_id = uuid.uuid4().hex
        # a mesh still being asked of this actor's spawner has no records yet: they are
        # filled in below, before the actors are spawned (it is ready then)
        fetching = not self._state.ready.done() and not self._state.records
        recs = [] if fetching else [self._state.records[g] for g in self._shape.ranks()]
        extent = self._shape.extent
        owner = spawning_actor()
        # An actor owns what it spawns, on any processes (SPEC §3): its process's runtime
        # hears of their failures and offers them to its __supervise__.
        rt = existing_client_runtime() if owner is None else client_runtime()
        supervisor = rt.events if rt is not None else None
        methods = frozenset(n for n in dir(actor_class) if not n.startswith("__")) - endpoints
        state = ActorMeshState(actor_id, name, actor_class.__name__, endpoints,
                                [r.name for r in recs], recs, methods)
        state.owner = owner
        state.class_path, state.extent = class_path(actor_class), extent
        if rt is not None:
            rt.track_actor_mesh(state, owner)
        if self._state.in_this_process:
            self._state.actor_meshes.append(state)
        sp = None
        if (tel := _tel.RECORDER) is not None:
            tel.mesh(actor_id, "actor", actor_class.__name__, name,
                     json.dumps(dict(extent)), self._state.name)
            # telemetry's span: from the request until every actor has started
            sp = start_span("hpcmesh.spawn_actors", mesh=name, actor_mesh_id=actor_id,
                            actor_class=actor_class.__name__, proc_mesh=self._state.name,
                            extent=dict(extent))

        def start() -> Future:
            if fetching:
                recs[:] = [self._state.records[g] for g in self._shape.ranks()]
                state.proc_names[:] = [r.name for r in recs]
            # what each actor's context().actor_instance.proc_mesh asks this process for
            where = self._source(state.owner, node)
            nodes = [r.node for r in recs]
            first = recs[0]
            host = (first.node.addresses[-1].removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
                    if first.node.addresses else "127.0.0.1")

            def spawn_all(port_f: Future) -> Future:
                rdv = Rendezvous(host, port_f.value(), actor_id) if port_f.exception() is None \
                    else None
                calls = [node.rpc(n, "spawn_actor", actor_id, name, cls_blob, args, kwargs,
                                  Point(i, extent), rdv, supervisor, where)
                         for i, n in enumerate(nodes)]
                return gather(calls).then(lambda _: nodes)
            return chain_any(node.rpc(nodes[0], "reserve_rendezvous_port", host), spawn_all)

        ready = chain(self._state.ready, start)

        ready.add_done_callback(lambda f: state.open(
            f.value() if f.exception() is None else None, f.exception()))
        if owner is not None and not self._state.in_this_process:
            # processes somebody else owns die without telling this one: ask their agents
            ready.add_done_callback(lambda f: f.exception() is None and rt.watch_processes(
                state, recs, extent, owner))
        if _tel.RECORDER is not None:
            ready.add_done_callback(lambda f: f.exception() is None and _record_actors(
                actor_id, name, recs))
        if sp is not None:
            sp.end_after(ready)
        state.ready = ready
        return cast(TActor, ActorMesh(state, Shape.from_extent(extent)))

    def _source(self, owner, node: Node) -> "ProcMeshSource":
        """Where actors spawned on this view find it (its processes are up): the same few
        names for 2 processes as for 8,000. The view itself for actors in this very
        process (this_proc()); otherwise this process answers for it
        (``PROC_MESH_SERVICE``) until the mesh is stopped."""
        st = self._state
        who = ("the client" if owner is None
               else f"actor {owner.mesh_name}[{owner.rank.rank}]")
        spawner = f"{who} in process {node.name or node.role} (pid {os.getpid()})"
        extent = self._shape.extent
        if st.in_this_process:
            return ProcMeshSource(node.ref, spawner, "", st.name, extent, self)
        # by a key, not the shape: a view of chosen members (flatten() of a strided one)
        # lists them, and would make each request as long as the mesh again
        mesh = _identity(st)
        with _OFFER_LOCK:
            key = _KEY_OF.get((mesh, self._shape))
            if key is None:
                key = _KEY_OF[mesh, self._shape] = uuid.uuid4().hex
                _SPAWNED_ON[key] = _Offered(mesh, st, self._shape)
        node.services.setdefault(PROC_MESH_SERVICE, _proc_mesh_asked)
        return ProcMeshSource(node.ref, spawner, key, st.name, extent)

    def stop(self, grace: float | None = None) -> Future:
        """Stop the processes cleanly (actors' ``__cleanup__`` runs, then Python's own exit:
        atexit and finalizers run, as in Monarch); whatever has not exited after ``grace``
        seconds (default 5, ``HPCMESH_STOP_GRACE``) gets SIGTERM, then SIGKILL. A Future of
        {process name: exit code}."""
        if not self._state.records and not self._state.ready.done():
            # still being asked of this actor's spawner: which processes, once it answers
            return chain(self._state.ready, lambda: self.stop(grace))
        if _tel.RECORDER is None:
            return self._stop(grace)
        # telemetry's span: until every process has exited (or been given up on)
        sp = start_span("hpcmesh.stop", mesh=self._state.name, extent=dict(self.extent))
        fut = self._stop(grace)
        if sp is not None:
            sp.end_after(fut)
        return fut

    def _stop(self, grace: float | None) -> Future:
        st = self._state
        recs = [st.records[g] for g in self._shape.ranks()]
        node = current_or_client_node()
        grace = env_number("HPCMESH_STOP_GRACE", DEFAULT_STOP_GRACE_S, finite=True) \
            if grace is None else float(grace)
        if st.in_this_process:        # our own process: stop the actors spawned on it
            st.stopped = True
            return gather([stop_actor_mesh(am, "", proc_mesh_stopped(am.name, st.name))
                           for am in st.actor_meshes],
                          lambda _: {r.name: 0 for r in recs})
        for r in recs:
            r.stopping = True
        if self._shape.nelem == len(st.records):
            st.stopped = True
            _forget(st)                         # its actors' proc_mesh: asked no more
        rt = existing_client_runtime()
        stopping = {r.name for r in recs}
        for am in rt.actor_meshes() if rt is not None else ():
            # an actor mesh all of whose processes stop: later calls to it fail at once,
            # saying so (one with live members left is not the mesh's failure)
            if (isinstance(am, ActorMeshState) and am.failed is None and am.proc_names
                    and stopping.issuperset(am.proc_names)):
                am.failed = proc_mesh_stopped(am.name, st.name)

        async def stop_all():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            if not st.launched.done():
                # Still starting: wait for the agents' answer, or a process they are about
                # to start would miss the stop and outlive it (until its lease ran out).
                # Not bounded by the grace (which may be 0): by how long a start may take.
                try:
                    await asyncio.wait_for(as_asyncio(st.launched), LAUNCH_WAIT)
                except asyncio.TimeoutError:
                    log.warning("stopping %r: the host agents did not finish starting its "
                                "processes within %.0f s", st.name, LAUNCH_WAIT)
                deadline = loop.time() + grace      # the grace is for stopping

            async def ask(r: ProcRecord):
                if r.node is None or r.failure is not None:
                    return
                if _tel.SINK is not None:
                    await _last_drain(node, r)
                try:
                    await asyncio.wait_for(as_asyncio(node.rpc(r.node, "stop")), grace)
                except Exception:  # noqa: BLE001 - dead or hung: the agent deals with it
                    pass
            await asyncio.gather(*(ask(r) for r in recs))
            left = max(0.0, deadline - loop.time())
            # Per agent: processes that were asked to stop get what is left of the grace;
            # those that never connected (nobody could ask them) are terminated at once.
            calls: dict[tuple, tuple] = {}
            codes = {}
            for r in recs:
                if r.failure is not None and r.failure.reason == HOST_LOST:
                    codes[r.name] = None    # its agent is gone: nobody knows how it ended
                    continue
                g = left if r.node is not None else 0.0
                calls.setdefault((r.agent.node_id, g), (r.agent, [], g))[1].append(r.name)
            async def stop_procs(agent: NodeRef, names: list[str], g: float):
                # the agent takes at most g, then 2 s after SIGTERM, then 5 s after SIGKILL;
                # an agent that is stopped (SIGSTOP) or hung would keep stop() for ever
                bound = g + STOP_PROCS_SLACK
                try:
                    return await asyncio.wait_for(
                        as_asyncio(node.rpc(agent, "stop_procs", names, g)), bound)
                except asyncio.TimeoutError:
                    hosts = sorted({r.host or "?" for r in recs if r.name in names})
                    msg = (f"hpcmesh: stopping {st.name!r}: the host agent on "
                           f"{', '.join(hosts)} did not answer within {bound:g} s (stopped, "
                           f"hung or cut off?); gave up on {len(names)} process(es): "
                           f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
                    # once: through logging, which writes a warning to stderr where this
                    # process configured no logging (it used to be printed as well: twice)
                    log.warning("%s", msg)
                    return {n: None for n in names}
            results = await asyncio.gather(*(stop_procs(a, names, g)
                                             for a, names, g in calls.values()),
                                           return_exceptions=True)
            for res in results:
                if isinstance(res, dict):
                    codes.update(res)
                else:
                    log.warning("stopping processes of %r: %s", st.name, res)
            rt = existing_client_runtime()
            if rt is not None and rt.node is node:
                rt.flush_logs(st.name)      # their folded last lines, before stop() returns
            return codes
        return _run_on_loop(node, stop_all())

    async def logging_option(self, stream_to_client: bool = False,
                             aggregate_window_sec: int | None = None,
                             level: int = logging.INFO, *, ranks=None) -> None:
        """Monarch's log settings for these processes (this view's members).

        ``stream_to_client``: print their stdout/stderr here, each line prefixed with its
        process (``[hosts=0,gpus=3] ...``); hpcmesh's default at spawn is on, this call's
        default is off (as Monarch's was). Their per-process log files keep every line
        whatever is chosen here. ``level``: the level of each process's root logger.

        ``aggregate_window_sec``: fold alike lines (equal once every number in them is a
        placeholder: ``step 10 loss 0.31`` and ``step 10 loss 0.29``) printed within that
        many seconds into one line with their count and ranks, the first line's text shown:
        ``[256 similar log lines, hosts=0..31,gpus=0..7] step 10 loss 0.31``. Each host folds
        its processes' lines before they travel, and this client folds the hosts' again, so a
        line reaches the console at most two windows after it was printed; a process's end,
        ``stop()`` and the client's exit print what is still folded. 0 folds only what
        arrives together; None (the default) prints each line as it comes.

        ``ranks`` (keyword only, hpcmesh's; torchrun's ``--local-ranks-filter``): which of
        these members reach the console, the others' lines staying in their log files only:
        a rank or ranks of this view (``ranks=0``, ``ranks=[0, 8]``), or coordinates as for
        ``slice`` (``ranks={"gpus": 0}``: each host's first process). None: all."""
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
            raise ValueError(f"logging_option(level={level!r}): a logging level, an int "
                             f"0-255 such as logging.INFO")
        if aggregate_window_sec is not None:
            if not stream_to_client:
                raise ValueError("logging_option(aggregate_window_sec=...) needs "
                                 "stream_to_client=True: only streamed logs are aggregated")
            if isinstance(aggregate_window_sec, bool) or not isinstance(
                    aggregate_window_sec, (int, float)) or not 0 <= aggregate_window_sec < \
                    float("inf"):
                raise ValueError(f"logging_option(aggregate_window_sec="
                                 f"{aggregate_window_sec!r}): seconds >= 0, or None")
        shown = self._console_members(ranks)
        if shown is not None and not stream_to_client:
            raise ValueError("logging_option(ranks=...) needs stream_to_client=True: it "
                             "chooses which ranks' lines are streamed")
        await self.initialized
        st = self._state
        await st.launched         # the agents said which processes they read the output of
        members = self._shape.ranks()
        recs = [st.records[g] for g in members]
        per_agent: dict = {}
        for g, r in zip(members, recs):
            r.forward_logs = bool(stream_to_client) and (shown is None or g in shown)
            if r.log_paths:       # an hpcmesh host agent reads its output (not MPI's)
                per_agent.setdefault(r.agent, []).append((r.name, r.forward_logs))
        if st.in_this_process:
            logging.getLogger().setLevel(level)
            return
        node = current_or_client_node()
        window = None if aggregate_window_sec is None else float(aggregate_window_sec)
        await gather([node.rpc(r.node, "set_log_level", level) for r in recs] +
                     [node.rpc(agent, "log_options", procs, window, st.name)
                      for agent, procs in per_agent.items()])

    def _console_members(self, ranks) -> set[int] | None:
        """logging_option's ``ranks`` as the members (indices into the whole mesh) whose
        lines reach the console; None: all."""
        if ranks is None:
            return None
        if isinstance(ranks, Mapping):
            return set(self._shape.slice(**ranks).ranks())
        members = self._shape.ranks()
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = [ranks]
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
            raise TypeError(f"logging_option(ranks={ranks!r}): a rank, a list of ranks of "
                            f"this mesh (0..{len(members) - 1}), a dict of coordinates as "
                            f"for slice (ranks={{'gpus': 0}}), or None for all")
        out = set()
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(members):
                raise ValueError(f"logging_option(ranks=...): {r!r} is not a rank of this "
                                 f"mesh of {len(members)} (0..{len(members) - 1})")
            out.add(members[r])
        return out

    def __reduce__(self):
        """What travels to another actor: where each process is, not the controller's
        bookkeeping (its Futures hold callbacks and contexts, which cannot be pickled, and
        a copy of them would never settle). A mesh still starting is waited for, as an
        ActorMesh passed right after ``spawn()`` is."""
        st = self._state
        if not st.ready.done():
            if on_runtime_thread():
                raise RuntimeError(f"proc mesh {st.name!r} is not initialized yet; `await "
                                   f"procs.initialized` before passing it to another actor")
            st.ready.get()
        elif st.ready.exception() is not None:
            raise st.ready.exception()
        return rebuild_proc_mesh, (st.name, _places(st), st.hosts, self._shape)

    def __repr__(self) -> str:
        return f"ProcMesh({self.name!r}, {dict(self.extent)})"


#: How long stop() waits for a process's last telemetry (only while telemetry is on).
LAST_DRAIN_S = 1.0


async def _last_drain(node: Node, r: ProcRecord) -> None:
    """Hand what a process recorded since the telemetry's last collection to the collector
    before the process is stopped (bounded: a stuck process is stopped all the same)."""
    try:
        res = await asyncio.wait_for(as_asyncio(node.rpc(r.node, "telemetry_drain")),
                                     LAST_DRAIN_S)
    except Exception:  # noqa: BLE001 - gone or stuck: its last rows are lost, no more
        return
    sink = _tel.SINK
    if sink is not None:
        sink(res)


def _record_actors(actor_id: str, name: str, recs: list[ProcRecord]) -> None:
    """The telemetry's ``actors`` rows of a mesh that started (here, not in its processes:
    a process killed before its first collection would take them along)."""
    tel = _tel.RECORDER
    if tel is not None:
        for i, r in enumerate(recs):
            tel.actor(f"{actor_id}.{i}", actor_id, i, f"{name}[{i}]", r.name, r.host, r.pid)


def _places(st: ProcMeshState) -> list[tuple]:
    """Where each process of a mesh is: what travels of it (``rebuild_proc_mesh``)."""
    return [(r.name, r.mesh_name, r.point, r.agent, r.label, r.node, r.pid, r.host)
            for r in st.records]


def rebuild_proc_mesh(name: str, places: list[tuple], hosts, shape: Shape) -> ProcMesh:
    """A ProcMesh unpickled in another process: its processes are up (``__reduce__``
    waited for them), so every member is ready."""
    records = []
    for proc_name, mesh_name, point, agent, label, node, pid, host in places:
        rec = ProcRecord(proc_name, mesh_name, point, agent, label)
        rec.node, rec.pid, rec.host = node, pid, host
        rec.ready.set_result(node)
        records.append(rec)
    return ProcMesh(ProcMeshState(name, records, completed([r.node for r in records]), hosts),
                    shape)


@dataclass(frozen=True, slots=True)
class ProcMeshSource:
    """What a spawn request carries for ``context().actor_instance.proc_mesh``: who to ask
    (``spawner``, described for errors by ``spawner_name``), the view's ``key`` there, its
    name and extent. The mesh itself is ~235 bytes a process: sent with each of n spawn
    requests it made one spawn of n actors move n x n x 235 bytes (16 GB at 1024 x 8).
    ``local``: the view itself, for an actor spawned in the spawner's own process."""
    spawner: NodeRef
    spawner_name: str
    key: str
    name: str
    extent: Extent
    local: Any = field(default=None, compare=False)


@dataclass
class _Offered:
    """A view actors were spawned on, and its answer to them, pickled once (every actor
    of a spawn may ask for it)."""
    mesh: tuple
    state: ProcMeshState
    shape: Shape
    answer: tuple[bytes, list[bytes]] | None = None


#: The views that actors were spawned on from this process, by key, which those actors ask
#: for (``PROC_MESH_SERVICE``) the first time they read ``proc_mesh``. Dropped when the
#: whole mesh is stopped (its actors are gone then).
_SPAWNED_ON: dict[str, _Offered] = {}
#: (mesh, view) -> its key: one entry for copies of one mesh (an actor handed the same
#: mesh by every call, spawning on each copy, keeps one)
_KEY_OF: dict[tuple, str] = {}
_OFFER_LOCK = threading.Lock()


def _identity(st: ProcMeshState) -> tuple:
    """Which mesh ``st`` is, whichever copy of it: its name and its processes' (a process
    name is unique to one start; all of them, as an async endpoint's ``proc_mesh`` holds
    only its view's)."""
    names = hashlib.blake2b("\0".join(r.name for r in st.records).encode(), digest_size=16)
    return st.name, names.digest(), len(st.records)


def _forget(st: ProcMeshState) -> None:
    """The mesh of ``st`` was stopped: its actors are gone, nobody asks for it any more."""
    mesh = _identity(st)
    with _OFFER_LOCK:
        for key, offered in list(_SPAWNED_ON.items()):
            if offered.mesh == mesh:
                del _SPAWNED_ON[key]
                _KEY_OF.pop((mesh, offered.shape), None)


def views_answered_for(mesh: ProcMesh) -> list[Shape]:
    """The views of ``mesh`` (any copy of it) this process answers ``proc_mesh`` for: the
    ones actors were spawned on from here, until the mesh is stopped."""
    ident = _identity(mesh._state)
    with _OFFER_LOCK:
        return [o.shape for o in _SPAWNED_ON.values() if o.mesh == ident]


PROC_MESH_SERVICE = "proc_mesh_of_actor"
#: How long a thread reading ``proc_mesh`` waits for the spawner's answer.
PROC_MESH_WAIT = 60.0


def _proc_mesh_asked(key: str) -> tuple[bytes, list[bytes]]:
    """The service: the view registered as ``key``, pickled. Its processes are up (actors
    were spawned on it), so it is built apart from the mesh's own ``ready``, which a
    ``spawn_procs(bootstrap=)`` still running holds back."""
    offered = _SPAWNED_ON.get(key)
    if offered is None:
        raise MeshStoppedError("the proc mesh it was spawned on is no longer known there "
                               "(stopped since?)", key)
    if offered.answer is None:
        st = offered.state
        meta, bufs = serialization.dumps(rebuild_proc_mesh(
            st.name, _places(st), st.hosts, offered.shape), f"proc mesh {st.name!r}")
        offered.answer = meta, [bytes(b) for b in bufs]
    return offered.answer


def find_proc_mesh(src: ProcMeshSource) -> ProcMesh:
    """An actor's ``proc_mesh``, asked of its spawner: waited for off the event loop; on
    it (an async endpoint), a mesh at once whose ``initialized``, ``spawn`` and ``stop``
    wait for the answer (blocking the loop would stall the answer itself)."""
    if src.local is not None:
        return src.local
    node = current_or_client_node()

    def named(f: Future) -> Future:
        if f.exception() is None:
            return completed(serialization.loads(*f.value()))
        err = RuntimeError(f"context().actor_instance.proc_mesh: proc mesh {src.name!r} is "
                           f"asked of the process that spawned this actor, {src.spawner_name}"
                           f", which did not answer it: {type(f.exception()).__name__}: "
                           f"{f.exception()}")
        err.__cause__ = f.exception()
        return failed(err)
    asked = chain_any(node.rpc(src.spawner, PROC_MESH_SERVICE, src.key), named)
    if not on_runtime_thread():
        try:
            return asked.get(timeout=PROC_MESH_WAIT)
        except TimeoutError:
            raise RuntimeError(f"context().actor_instance.proc_mesh: proc mesh {src.name!r} "
                               f"was asked of the process that spawned this actor, "
                               f"{src.spawner_name}, which did not answer within "
                               f"{PROC_MESH_WAIT:g} s") from None
    # the view's own members, in order (its shape, which may list them, is not sent)
    st = ProcMeshState(src.name, [], Future(), None)

    def fill(got: ProcMesh) -> list:
        st.records[:] = got.records
        st.hosts = got._state.hosts
        return [r.node for r in st.records]
    st.ready = asked.then(fill)
    return ProcMesh(st, Shape.from_extent(src.extent))


class _Bootstrap(Actor):
    """Runs ``spawn_procs(bootstrap=...)``'s callable once in each new process (a sync
    actor: the callable may block, or wait on Futures)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    @endpoint
    def run(self) -> None:
        result = self.fn()
        if inspect.isawaitable(result):
            async def wait():
                return await result
            asyncio.run(wait())


def run_bootstrap(mesh: ProcMesh, fn: Callable[[], Any]) -> None:
    """Run ``fn`` on every process of ``mesh`` before anything else is spawned there: its
    ready Future (what spawns wait for) becomes "the processes are up and ``fn`` returned
    on each"; the helper actors are stopped either way."""
    state = mesh._state
    up = state.ready
    setup = mesh.spawn("bootstrap", _Bootstrap, fn)
    state.ready = chain_any(setup.run.call(), lambda ran: chain_any(
        setup.stop("the bootstrap function ran"),
        lambda _: failed(ran.exception()) if ran.exception() is not None else up))


def _run_on_loop(node: Node, coro) -> Future:
    """Run a coroutine on the node's loop; a Future of its result."""
    out = Future()

    def done(cf) -> None:
        if cf.cancelled():      # the loop closed under it (the runtime is shutting down)
            out.set_exception(RuntimeError(
                "the runtime stopped before this finished (the process is exiting)"))
            return
        exc = cf.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(cf.result())
    asyncio.run_coroutine_threadsafe(coro, node.loop).add_done_callback(done)
    return out


def class_in_this_process(cls: type) -> bytes:
    """An actor class for an actor in this very process: by reference, so the actor runs
    the class itself and shares its module's state; by value only if it cannot be found
    by name (a class defined inside a function)."""
    try:
        blob = pickle.dumps(cls, protocol=5)
        if pickle.loads(blob) is cls:
            return blob
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    return serialization.dumps_by_value(cls)


def this_proc() -> ProcMesh:
    """This process as a ProcMesh of one, with no dimensions (Monarch's ``this_proc()``).

    Actors spawned on it live in this process: their async endpoints run on its hpcmesh
    event loop (the controller's runtime thread, or an actor process's loop), sync ones on
    a thread of their own, and they share this process's memory. Calls to them go through
    the same Futures as to any actor. ``stop()`` stops the actors spawned through this
    handle; the process goes on."""
    node = current_or_client_node()
    ActorServices.attach(node)
    rec = ProcRecord(f"this_proc-{os.getpid()}-{uuid.uuid4().hex[:8]}", "this_proc",
                     Point(0, Extent({})), node.ref, "0")
    rec.node = node.ref
    rec.pid = os.getpid()
    rec.host = socket.gethostname()
    rec.ready.set_result(node.ref)
    return ProcMesh.from_records("this_proc", [rec], Extent({}), None, in_this_process=True)


_context.local_proc_mesh = this_proc     # the client's context().actor_instance.proc_mesh
_context.find_proc_mesh = find_proc_mesh   # an actor's
