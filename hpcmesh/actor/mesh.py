"""HostMesh, ProcMesh, ActorMesh and ValueMesh: named, sliceable views over remote things.

Every mesh is a ``Shape`` (pure geometry, see ``hpcmesh.shapes``) over shared
state; slicing makes a new view of the same state, so a message sent to a
slice reaches exactly those members. Creation is asynchronous: a mesh is
returned at once and calls made before it is ready are sent when it is.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import os
import pickle
import socket
import sys
import threading
import uuid
from typing import Any, Callable, Iterator

from ..runtime.actor_services import ActorServices
from ..runtime.bootstrap import BootstrapCommand, default_bootstrap_cmd
from ..runtime.client import (ProcRecord, client_runtime, current_or_client_node,
                              existing_client_runtime)
from ..runtime.context import Rendezvous
from ..runtime.context import current_context_var
from ..runtime.errors import SupervisionError
from ..runtime.future import Future, completed, failed, forward, gather, on_runtime_thread
from ..runtime.messages import call_msg
from ..runtime.node import Node, NodeRef
from ..settings import env_number
from ..shapes import Extent, MeshTrait, Point, Shape
from ..transport import serialization, tls
from ..transport.serialization import is_plain
from ..transport.addresses import parse_address
from ..transport.handshake import HandshakeError
from .endpoint import ENDPOINT_ATTR, check_endpoint_names

_mesh_counter = itertools.count()
#: Seconds ProcMesh.stop() waits for a clean exit before SIGTERM, then SIGKILL.
DEFAULT_STOP_GRACE = env_number("HPCMESH_STOP_GRACE", 5)
LAUNCH_WAIT = 60.0      # stop() of a mesh still starting waits this long for the agents
log = logging.getLogger("hpcmesh.actor")


def _owner():
    """The actor spawning a mesh (it supervises what it spawns), or None on the client."""
    ctx = current_context_var.get()
    return ctx.actor_instance if ctx is not None else None


def _label(point: Point) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items()) or "0"


def _chain(ready: Future, fn: Callable[[], Future]) -> Future:
    """A Future of ``fn()``'s Future, started once ``ready`` succeeds."""
    return _chain_any(ready, lambda f: failed(f.exception()) if f.exception() is not None
                      else fn())


def _run_on_loop(node: Node, coro) -> Future:
    """Run a coroutine on the node's loop; a Future of its result."""
    out = Future()

    def done(cf) -> None:
        exc = cf.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(cf.result())
    asyncio.run_coroutine_threadsafe(coro, node.loop).add_done_callback(done)
    return out


# ---------------------------------------------------------------------------------------
# ValueMesh
# ---------------------------------------------------------------------------------------
class ValueMesh(MeshTrait):
    """Results of ``call()``: one value per member, same extent as the mesh called."""

    def __init__(self, shape: Shape, values: list):
        self._shape = shape
        self._values = values

    def _new_with_shape(self, shape: Shape) -> "ValueMesh":
        return ValueMesh(shape, self._values)

    def __iter__(self) -> Iterator[tuple[Point, Any]]:
        for rank, g in enumerate(self._shape.ranks()):
            yield Point(rank, self._shape.extent), self._values[g]

    def values(self) -> list:
        return [self._values[g] for g in self._shape.ranks()]

    def items(self):
        return list(iter(self))

    def __getitem__(self, key) -> Any:
        if isinstance(key, int):
            if not 0 <= key < self._shape.nelem:
                raise IndexError(f"rank {key} out of range for a ValueMesh of {self._shape.nelem}")
            return self._values[self._shape.ranks()[key]]
        return self._values[self._shape.global_index(key)]

    def get(self, rank: int) -> Any:
        """The value of the member with flat ``rank`` in this view (Monarch's ``get``)."""
        return self[operator.index(rank)]

    def item(self, **coords: int) -> Any:
        view = self.slice(**coords) if coords else self
        if view._shape.nelem != 1 or len(view._shape.extent):
            raise ValueError(f"item() needs a coordinate for every dimension of "
                             f"{dict(self.extent)}; got {coords}")
        return view._values[view._shape.ranks()[0]]

    def __eq__(self, other) -> bool:
        return isinstance(other, ValueMesh) and self.extent == other.extent and \
            self.values() == other.values()

    def __repr__(self) -> str:
        return f"ValueMesh({dict(self.extent)}, {self.values()!r})"

    def __reduce__(self):
        return ValueMesh, (Shape.from_extent(self._shape.extent), self.values())


# ---------------------------------------------------------------------------------------
# HostMesh
# ---------------------------------------------------------------------------------------
class HostRef:
    """A host agent: where to send spawn requests for this host."""
    __slots__ = ("agent", "hostname", "secret")

    def __init__(self, agent: NodeRef, hostname: str, secret: bytes | None = None):
        self.agent = agent
        self.hostname = hostname
        self.secret = secret

    def __repr__(self) -> str:
        return f"HostRef({self.hostname})"


class HostMesh(MeshTrait):
    """Hosts that run an hpcmesh host agent."""

    def __init__(self, hosts: list[HostRef], shape: Shape, name: str = "hosts"):
        self._hosts = hosts
        self._shape = shape
        self.name = name

    def _new_with_shape(self, shape: Shape) -> "HostMesh":
        return HostMesh(self._hosts, shape, self.name)

    @property
    def hostnames(self) -> list[str]:
        return [self._hosts[g].hostname for g in self._shape.ranks()]

    def spawn_procs(self, per_host: dict[str, int] | None = None,
                    bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] |
                    None = None, name: str | None = None, *,
                    forward_logs: bool = True) -> "ProcMesh":
        """Start processes on every host of this mesh; per-host dims are appended."""
        per_host = dict(per_host or {})
        for k, v in per_host.items():
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"per_host must map dimension names to positive ints; got "
                                 f"{k!r}: {v!r}")
            if k in self._shape.extent:
                raise ValueError(f"per_host dimension {k!r} is already a dimension of the host "
                                 f"mesh {dict(self.extent)}; pick another name")
        rt = client_runtime()
        node = rt.node
        owner = _owner()
        extent = Extent({**dict(self._shape.extent), **per_host})
        mesh_name = name or f"procs{next(_mesh_counter)}"
        uid = uuid.uuid4().hex[:8]
        per = Extent(per_host).nelem
        host_ranks = self._shape.ranks()
        records: list[ProcRecord] = []
        by_host: dict[int, list] = {}
        for i in range(extent.nelem):
            point = Point(i, extent)
            cmd = bootstrap_command(point) if callable(bootstrap_command) and not isinstance(
                bootstrap_command, BootstrapCommand) else bootstrap_command
            if cmd is None:
                cmd = default_bootstrap_cmd()
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command must be a BootstrapCommand or a callable "
                                f"returning one; for {_label(point)} got {type(cmd).__name__}")
            host = self._hosts[host_ranks[i // per]]
            rec = ProcRecord(f"{mesh_name}-{uid}-{i}", mesh_name, point, host.agent,
                             _label(point), forward_logs=forward_logs, owner=owner)
            rec.host = host.hostname
            records.append(rec)
            rt.procs[rec.name] = rec
            by_host.setdefault(i // per, []).append((rec.name, cmd, _label(point), i))
        first_agent = self._hosts[host_ranks[0]].agent

        launched = Future()

        def spawn_all(rdv: Future) -> None:
            """Once host 0 named MASTER_ADDR/PORT, ask every host's agent to start its share."""
            master = rdv.value() if rdv.exception() is None else None
            answers = []
            for hi, reqs in by_host.items():
                host = self._hosts[host_ranks[hi]]
                recs = [r for r in records if r.agent == host.agent]
                try:
                    reqs = [(n, c, lbl, _torchrun_env(i, extent, per, master))
                            for n, c, lbl, i in reqs]
                    f = node.rpc(host.agent, "spawn_procs", reqs, node.ref, rt.events,
                                 rt.secret.hex(), rt.lease_grace, f"{mesh_name}-{uid}")
                except BaseException as e:  # noqa: BLE001 - fail these procs, never hang them
                    f = failed(e)
                f.add_done_callback(lambda fut, recs=recs: on_spawned(fut, recs))
                answers.append(f)
            # stop() waits for this: the agents have answered, whether they started all
            if not answers:
                launched.set_result(None)
            left = itertools.count(len(answers) - 1, -1)
            for a in answers:
                a.add_done_callback(lambda _a: next(left) == 0 and launched.set_result(None))

        def on_spawned(f: Future, recs: list[ProcRecord]) -> None:
            if f.exception() is not None:
                for r in recs:
                    r.ready.set_exception(f.exception())
                return
            info = {n: (pid, paths) for n, pid, paths in f.value()}
            for r in recs:
                if r.name in info:
                    r.pid, r.log_paths = info[r.name]
        node.rpc(first_agent, "reserve_port").add_done_callback(spawn_all)
        state = _ProcMeshState(mesh_name, records, gather([r.ready for r in records]), self,
                               launched)
        return ProcMesh(state, Shape.from_extent(extent))

    def __repr__(self) -> str:
        return f"HostMesh({dict(self.extent)}, hosts={self.hostnames})"


def _torchrun_env(rank: int, extent: Extent, per_host: int,
                  master: tuple[str, int] | None) -> dict[str, str]:
    """torchrun's variables, so a user's own ``init_process_group()`` works; they sit
    under the bootstrap command's env (which can override or remove them)."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(extent.nelem),
           "LOCAL_RANK": str(rank % per_host), "LOCAL_WORLD_SIZE": str(per_host),
           "GROUP_RANK": str(rank // per_host)}
    if master is not None:
        env["MASTER_ADDR"], env["MASTER_PORT"] = master[0], str(master[1])
    return env


def _class_in_this_process(cls: type) -> bytes:
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
    mesh = ProcMesh.from_records("this_proc", [rec], Extent({}), None)
    mesh._state.in_this_process = True
    return mesh


def this_host() -> HostMesh:
    """The local host as a HostMesh with no dimensions."""
    rt = client_runtime()
    ref = HostRef(rt.local_agent(), socket.gethostname())
    return HostMesh([ref], Shape.from_extent(Extent({})), "this_host")


def use_tls(ca) -> None:
    """Encrypt this client's TCP connections from now on (``ca``: a CA bundle path or
    ``"trust_all_connections"``), and have the agents and processes it starts from now
    on do the same (``HPCMESH_TLS_CA`` in the environment they inherit)."""
    settings = tls.settings(ca)
    node = client_runtime().node
    if settings is not None and settings != node.tls:
        node.use_tls(settings)
        os.environ.update(settings.env())


def attach_to_workers(workers: list[str], *, name: str = "hosts", secret: bytes | None = None,
                      timeout: float = 30.0, ca: Any = None) -> HostMesh:
    """Connect to running host agents (``hpcmesh worker --listen ADDR``); a HostMesh over them.

    ``ca``: TLS for TCP connections, as the agents were started with (``--ca``): a CA
    bundle path that certifies the agents, or ``"trust_all_connections"`` (encrypt,
    verify nothing). It applies to this client's connections from now on and to the
    processes it starts."""
    if ca is not None:
        use_tls(ca)
    if isinstance(workers, str):
        workers = [workers]
    rt = client_runtime()
    node = rt.node
    hosts = []

    for addr in workers:
        parse_address(addr)        # a malformed URL: ValueError naming it and the forms

    async def connect_all():
        async def one(addr: str):
            try:
                conn = await node.connect(addr, timeout=timeout, secret=secret)
            except HandshakeError as e:
                raise ConnectionError(f"cannot attach to host agent at {addr}: {e} (was it "
                                      f"started with this job's secret?)") from None
            except (asyncio.TimeoutError, TimeoutError):
                raise ConnectionError(f"cannot attach to host agent at {addr}: no hpcmesh "
                                      f"handshake within {timeout} s (is an hpcmesh worker "
                                      f"listening there?)") from None
            except OSError as e:
                reason = (os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0
                          else e.strerror or str(e))
                raise ConnectionError(f"cannot attach to host agent at {addr}: {reason}") from e
            info = conn.info.get("peer_info", {})
            if info.get("role") != "agent":
                raise ConnectionError(f"{addr} is a {info.get('role')!r} node, not a host agent")
            return HostRef(NodeRef(conn.info["peer_id"], (addr,)), info.get("host", addr), secret)
        return await asyncio.gather(*(one(a) for a in workers))
    hosts = node.run_sync(connect_all(), timeout + 5)
    return HostMesh(list(hosts), Shape.from_extent(Extent({name: len(hosts)})), name)


# ---------------------------------------------------------------------------------------
# ProcMesh
# ---------------------------------------------------------------------------------------
class _ProcMeshState:
    def __init__(self, name: str, records: list[ProcRecord], ready: Future, hosts: HostMesh,
                 launched: Future | None = None):
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


class _SharedStateMesh(MeshTrait):
    """A view (shape) over state shared by every slice of one mesh."""

    def __init__(self, state, shape: Shape):
        self._state = state
        self._shape = shape

    def _new_with_shape(self, shape: Shape):
        return type(self)(self._state, shape)

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def initialized(self) -> Future:
        """Resolves (to this mesh) once every member is up."""
        return self._state.ready.then(lambda _: self)


class ProcMesh(_SharedStateMesh):
    """Processes started on a HostMesh; spawn actors on them."""

    @classmethod
    def from_records(cls, name: str, records: list[ProcRecord], extent: Extent,
                     hosts: HostMesh | None) -> "ProcMesh":
        """A mesh over processes started by someone else (an MPI launcher, this process
        itself): ``records`` in row-major order of ``extent``, each ready once its process
        said hello."""
        state = _ProcMeshState(name, records, gather([r.ready for r in records]), hosts)
        return cls(state, Shape.from_extent(extent))

    @property
    def pids(self) -> list[int | None]:
        return [self._state.records[g].pid for g in self._shape.ranks()]

    @property
    def log_paths(self) -> list[dict]:
        return [self._state.records[g].log_paths for g in self._shape.ranks()]

    def spawn(self, name: str, actor_class: type, *args, **kwargs) -> "ActorMesh":
        """Place one ``actor_class(*args, **kwargs)`` on every process of this view."""
        if self._state.stopped:
            raise RuntimeError(f"proc mesh {self.name!r} has been stopped; spawn new processes")
        if not isinstance(actor_class, type):
            raise TypeError(f"spawn() needs an actor class, got {type(actor_class).__name__}")
        check_endpoint_names(actor_class)
        if (args or kwargs) and not on_runtime_thread():
            # Fail now on unpicklable arguments, and wait here (not later on the runtime's
            # loop) for actor meshes passed as arguments to finish starting.
            serialization.dumps((args, kwargs), f"arguments of {actor_class.__name__}()")
        endpoints = {n for n in dir(actor_class)
                     if getattr(getattr(actor_class, n, None), ENDPOINT_ATTR, None) is not None}
        cls_blob = (_class_in_this_process(actor_class) if self._state.in_this_process
                    else serialization.dumps_by_value(actor_class))
        node = current_or_client_node()
        actor_id = uuid.uuid4().hex
        recs = [self._state.records[g] for g in self._shape.ranks()]
        extent = self._shape.extent
        rt = existing_client_runtime()
        supervisor = rt.events if rt is not None else None
        state = _ActorMeshState(actor_id, name, actor_class.__name__, endpoints,
                                [r.name for r in recs], recs)
        state.owner = _owner()
        if rt is not None:
            rt.actor_meshes[actor_id] = state     # so an unhandled failure below it finds it
        if self._state.in_this_process:
            self._state.actor_meshes.append(state)

        def start() -> Future:
            nodes = [r.node for r in recs]
            first = recs[0]
            host = (first.node.addresses[-1].removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
                    if first.node.addresses else "127.0.0.1")

            def spawn_all(port_f: Future) -> Future:
                rdv = Rendezvous(host, port_f.value(), actor_id) if port_f.exception() is None \
                    else None
                calls = [node.rpc(n, "spawn_actor", actor_id, name, cls_blob, args, kwargs,
                                  Point(i, extent), rdv, supervisor)
                         for i, n in enumerate(nodes)]
                return gather(calls).then(lambda _: nodes)
            return _chain_any(node.rpc(nodes[0], "reserve_port", host), spawn_all)

        ready = _chain(self._state.ready, start)

        ready.add_done_callback(lambda f: state.open(
            f.value() if f.exception() is None else None, f.exception()))
        state.ready = ready
        return ActorMesh(state, Shape.from_extent(extent))

    def stop(self, grace: float | None = None) -> Future:
        """Stop the processes cleanly (actors' ``__cleanup__`` runs); whatever has not exited
        after ``grace`` seconds (default 5, ``HPCMESH_STOP_GRACE``) gets SIGTERM, then
        SIGKILL. A Future of {process name: exit code}."""
        st = self._state
        recs = [st.records[g] for g in self._shape.ranks()]
        node = current_or_client_node()
        grace = DEFAULT_STOP_GRACE if grace is None else float(grace)
        if st.in_this_process:        # our own process: stop the actors spawned on it
            st.stopped = True
            return gather([_stop_actor_mesh(am, "the this_proc() mesh it was spawned on was "
                                                "stopped") for am in st.actor_meshes],
                          lambda _: {r.name: 0 for r in recs})
        for r in recs:
            r.stopping = True
        if self._shape.nelem == len(st.records):
            st.stopped = True

        async def stop_all():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            if not st.launched.done():
                # Still starting: wait for the agents' answer, or a process they are about
                # to start would miss the stop and outlive it (until its lease ran out).
                # Not bounded by the grace (which may be 0): by how long a start may take.
                try:
                    await asyncio.wait_for(_as_asyncio(st.launched), LAUNCH_WAIT)
                except asyncio.TimeoutError:
                    log.warning("stopping %r: the host agents did not finish starting its "
                                "processes within %.0f s", st.name, LAUNCH_WAIT)
                deadline = loop.time() + grace      # the grace is for stopping

            async def ask(r: ProcRecord):
                if r.node is None or r.failure is not None:
                    return
                try:
                    await asyncio.wait_for(_as_asyncio(node.rpc(r.node, "stop")), grace)
                except Exception:  # noqa: BLE001 - dead or hung: the agent deals with it
                    pass
            await asyncio.gather(*(ask(r) for r in recs))
            left = max(0.0, deadline - loop.time())
            # Per agent: processes that were asked to stop get what is left of the grace;
            # those that never connected (nobody could ask them) are terminated at once.
            calls: dict[tuple, tuple] = {}
            for r in recs:
                g = left if r.node is not None else 0.0
                calls.setdefault((r.agent.node_id, g), (r.agent, [], g))[1].append(r.name)
            results = await asyncio.gather(*(_as_asyncio(node.rpc(a, "stop_procs", names, g))
                                             for a, names, g in calls.values()),
                                           return_exceptions=True)
            codes = {}
            for res in results:
                if isinstance(res, dict):
                    codes.update(res)
                else:
                    log.warning("stopping processes of %r: %s", st.name, res)
            return codes
        return _run_on_loop(node, stop_all())

    def __repr__(self) -> str:
        return f"ProcMesh({self.name!r}, {dict(self.extent)})"


def _chain_any(first: Future, fn: Callable[[Future], Future]) -> Future:
    """Like _chain, but ``fn`` also runs (and sees the failure) when ``first`` fails."""
    out = Future()

    def go(f: Future) -> None:
        try:
            inner = fn(f)
        except BaseException as e:  # noqa: BLE001
            out.set_exception(e)
            return
        forward(inner, out)
    first.add_done_callback(go)
    return out


async def _as_asyncio(f: Future):
    return await f


# ---------------------------------------------------------------------------------------
# ActorMesh
# ---------------------------------------------------------------------------------------
class _ActorMeshState:
    def __init__(self, actor_id: str, name: str, class_name: str, endpoints: set,
                 proc_names: list[str], records: list | None):
        self.actor_id = actor_id
        self.name = name
        self.class_name = class_name
        self.endpoints = endpoints
        self.proc_names = proc_names
        self.records = records      # controller only
        self.nodes: list[NodeRef] | None = None
        self.ready: Future | None = None
        self.rr = itertools.count()
        self.lock = threading.Lock()
        # Calls made before the actors are up wait here, in call order; ``live`` turns True
        # only once they have all been sent, so a later call can never overtake one of them.
        self.live = False
        self.failed: BaseException | None = None
        self.owner = None           # the actor that spawned this mesh (None: the client)
        self.pending: list[tuple[Callable[[], Future], Future]] = []

    def open(self, nodes: list[NodeRef] | None, exc: BaseException | None) -> None:
        """The spawn finished (``exc`` if it failed): send or fail the waiting calls."""
        if exc is None:
            self.nodes = nodes
        while True:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    if exc is None:
                        self.live = True
                    else:
                        self.failed = exc
                    return
            for fn, out in batch:
                if exc is not None:
                    out.set_exception(exc)
                    continue
                try:
                    inner = fn()
                except BaseException as e:  # noqa: BLE001
                    out.set_exception(e)
                    continue
                forward(inner, out)


def _stop_actor_mesh(st: _ActorMeshState, reason: str) -> Future:
    """Stop the actors of one actor mesh on every process that hosts them, then fail later
    calls to it with a SupervisionError naming ``reason``. A Future of None (a member whose
    process is gone already counts as stopped)."""
    node = current_or_client_node()

    def stop_all() -> Future:
        return gather([node.rpc(n, "stop_actors", [st.actor_id])
                       for n in dict.fromkeys(st.nodes)])

    def mark(f: Future) -> Future:
        st.failed = SupervisionError(f"actor mesh {st.name!r} was stopped: {reason}", st.name)
        if f.exception() is not None and not isinstance(f.exception(), SupervisionError):
            return failed(f.exception())
        return completed(None)
    return _chain_any(_chain(st.ready, stop_all), mark)


def _gives_way(attr: str) -> property:
    """``attr`` of an ActorMesh, unless the actor class has an endpoint of that name: then
    the endpoint (see ``GIVES_WAY_TO_ENDPOINTS``)."""
    own = getattr(_SharedStateMesh, attr)

    def get(self):
        if attr in self._state.endpoints:
            return self.__dict__.get(attr) or self.__getattr__(attr)
        return own.__get__(self, type(self))
    return property(get, doc=f"The mesh's {attr!r}, or the endpoint of that name if the "
                             f"actor class has one.")


class ActorMesh(_SharedStateMesh):
    """One actor per process; attribute access gives an endpoint to call."""

    name = _gives_way("name")
    points = _gives_way("points")
    to_table = _gives_way("to_table")

    def __getattr__(self, item: str) -> "Endpoint":
        if item.startswith("__") or item in ("_state", "_shape"):
            raise AttributeError(item)
        st = self._state
        if item not in st.endpoints:
            raise AttributeError(
                f"{st.class_name} has no endpoint {item!r}; endpoints: "
                f"{', '.join(sorted(st.endpoints)) or '(none)'}")
        ep = self.__dict__[item] = Endpoint(self, item)   # views are immutable: keep it
        return ep

    def stop(self, reason: str = "stopped by the client") -> Future:
        """Stop every actor of this actor mesh (the whole mesh, whatever this view selects):
        their ``__cleanup__`` runs, their processes go on. Later calls raise a
        ``SupervisionError`` naming the mesh and ``reason``. A Future of None."""
        return _stop_actor_mesh(self._state, reason)

    def _members(self) -> tuple[list[tuple[int, int]], tuple]:
        """[(rank in this view, global index)] and the view's extent as plain items (cached)."""
        m = self.__dict__.get("_members_cache")
        if m is None:
            shape = self._shape
            m = self.__dict__["_members_cache"] = (list(enumerate(shape.ranks())),
                                                   tuple(shape.extent.items()))
        return m

    def __reduce__(self):
        st = self._state
        if st.nodes is None:
            if on_runtime_thread():
                raise RuntimeError(f"actor mesh {st.name!r} is not initialized yet; "
                                   f"`await mesh.initialized` before passing it to another actor")
            st.ready.get()      # a mesh passed right after spawn(): wait until it is up
        return _rebuild_actor_mesh, (st.actor_id, st.name, st.class_name, sorted(st.endpoints),
                                     st.proc_names, st.nodes, self._shape)

    def __repr__(self) -> str:
        st = self._state
        return f"ActorMesh({st.name!r}, {st.class_name}, {dict(self.extent)})"

    # -- sending ---------------------------------------------------------------------
    def _payload(self, endpoint: str, args: tuple, kwargs: dict) -> tuple[Any, list | None]:
        """The arguments, ready to send; every member's message shares them.

        On a live mesh, arguments made only of builtin values travel inside the message
        itself, pickled when it is sent: ``((args, kwargs), None)``. Otherwise they are
        pickled now, once: ``(bytes, out-of-band buffers)`` (a call queued until the mesh
        is up must not see later changes to its arguments)."""
        if self._state.live and is_plain(args) and (not kwargs or is_plain(kwargs)):
            return (args, kwargs), None
        return serialization.dumps((args, kwargs),
                                   f"arguments of {self._state.class_name}.{endpoint}")

    def _send(self, g: int, rank: int, extent_items: tuple, endpoint: str,
              payload: tuple[Any, list | None], reply: bool) -> Future | None:
        st = self._state
        node = current_or_client_node()
        target = st.nodes[g]
        if reply:
            fut, port_id = node.reply_future(target)
        else:
            fut, port_id = None, None
        args, bufs = payload
        msg = call_msg(st.actor_id, endpoint, args, port_id, rank, extent_items)
        try:
            node.send(target, msg, buffers=bufs or [])
        except (SupervisionError, ConnectionError) as e:
            if port_id is not None:
                node.close_port(port_id)
                fut.set_exception(e)
            else:
                raise
        return fut

    def _when_ready(self, fn: Callable[[], Future]) -> Future:
        """Run ``fn`` now if the mesh is up, else queue it (in call order) until it is.
        Arguments were pickled by the caller already, so a queued ``fn`` cannot fail on them."""
        st = self._state
        if st.failed is not None:     # spawn failed, or a failure below it went unhandled
            return failed(st.failed)
        if st.live:
            return fn()
        out = Future()
        with st.lock:
            if not st.live and st.failed is None:
                st.pending.append((fn, out))
                return out
        return self._when_ready(fn)


def _rebuild_actor_mesh(actor_id, name, class_name, endpoints, proc_names, nodes, shape):
    st = _ActorMeshState(actor_id, name, class_name, set(endpoints), proc_names, None)
    st.nodes = list(nodes)
    st.live = True
    st.ready = Future()
    st.ready.set_result(st.nodes)
    return ActorMesh(st, shape)


class Endpoint:
    """``mesh.method``: the ways to call one endpoint on a mesh."""
    __slots__ = ("_mesh", "_name", "_route", "_routes")

    def __init__(self, mesh: ActorMesh, name: str):
        self._mesh = mesh
        self._name = name
        self._route: tuple | None = None     # call_one's fast path, once the mesh is live
        self._routes: tuple | None = None    # call's fast path, once the mesh is live

    def _members(self) -> tuple[list[tuple[int, int]], tuple]:
        return self._mesh._members()

    def call_one(self, *args, **kwargs) -> Future:
        """Call the single member of this mesh; a Future of its value."""
        route = self._route
        if route is not None and not kwargs and is_plain(args):
            # The common case, kept short: a live mesh, arguments made of builtin values.
            node, target, st, actor_id, ext = route
            if st.failed is None:
                return node.call_actor(target, actor_id, self._name, (args, kwargs), 0, ext)
        return self._call_one(args, kwargs)

    def _call_one(self, args: tuple, kwargs: dict) -> Future:
        mesh = self._mesh
        shape = mesh._shape
        if shape.nelem != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor, but {mesh._state.name!r} has "
                f"extent {dict(shape.extent)} ({shape.nelem} actors); use call() or slice it "
                f"first, "
                f"e.g. mesh.slice(**{{dim: 0 for dim in mesh.extent}})")
        members, ext = mesh._members()
        g = members[0][1]
        st = mesh._state
        if st.live and self._route is None:
            self._route = (current_or_client_node(), st.nodes[g], st, st.actor_id, ext)
        payload = mesh._payload(self._name, args, kwargs)
        return mesh._when_ready(lambda: mesh._send(g, 0, ext, self._name, payload, True))

    def call(self, *args, **kwargs) -> Future:
        """Call every member; a Future of a ValueMesh with this mesh's extent."""
        routes = self._routes
        if routes is not None and not kwargs and is_plain(args):
            # The common case, kept short (as in call_one): live mesh, builtin arguments.
            node, st, targets, ext, result_shape = routes
            if st.failed is None:
                name, payload = self._name, (args, kwargs)
                futs = [node.call_actor(t, st.actor_id, name, payload, r, ext)
                        for r, t in targets]
                return gather(futs, lambda vals: ValueMesh(result_shape, vals),
                              node.poll_for_rest)
        mesh = self._mesh
        members, ext = self._members()
        result_shape = Shape.from_extent(mesh._shape.extent)
        st = mesh._state
        if st.live and self._routes is None:
            self._routes = (current_or_client_node(), st, [(r, st.nodes[g]) for r, g in members], ext,
                            result_shape)
        payload = mesh._payload(self._name, args, kwargs)

        def go() -> Future:
            futs = [mesh._send(g, r, ext, self._name, payload, True) for r, g in members]
            return gather(futs, lambda vals: ValueMesh(result_shape, vals),
                          current_or_client_node().poll_for_rest)
        return mesh._when_ready(go)

    def broadcast(self, *args, **kwargs) -> None:
        """Send to every member without waiting; failures are reported through supervision.

        A member already known dead does not stop the others from getting the message;
        the failure is raised after all were sent (the controller raises on the next call)."""
        mesh = self._mesh
        members, ext = self._members()
        name = self._name
        payload = mesh._payload(name, args, kwargs)

        def go() -> Future:
            first = None
            for r, g in members:
                try:
                    mesh._send(g, r, ext, name, payload, False)
                except Exception as e:  # noqa: BLE001 - a dead member; the others still get it
                    first = first or e
            done = Future()
            if first is not None:
                done.set_exception(first)
            else:
                done.set_result(None)
            return done
        f = mesh._when_ready(go)
        if f.done():
            if f.exception() is not None:
                raise f.exception()
            return
        # Sent later (the mesh is still starting): a failure then has nobody to raise to.
        f.add_done_callback(lambda fut: fut.exception() is not None and _report_broadcast_failure(
            mesh, name, fut.exception()))

    def choose(self, *args, **kwargs) -> Future:
        """Call one member, picked round-robin among those with the least work in flight."""
        mesh = self._mesh
        members, ext = self._members()
        st = mesh._state
        payload = mesh._payload(self._name, args, kwargs)

        def go() -> Future:
            node = current_or_client_node()
            start = next(st.rr)
            best = None
            for k in range(len(members)):
                r, g = members[(start + k) % len(members)]
                load = node.load(st.nodes[g].node_id)
                if best is None or load < best[0]:
                    best = (load, g, r)
                    if load == 0:
                        break
            return mesh._send(best[1], best[2], ext, self._name, payload, True)
        return mesh._when_ready(go)

    def stream(self, *args, **kwargs) -> "ResultStream":
        """Call every member; the results in arrival order: ``async for`` gives the values,
        ``for`` gives settled Futures (as Monarch's ``stream`` does)."""
        mesh = self._mesh
        members, ext = self._members()
        stream = ResultStream(len(members))
        payload = mesh._payload(self._name, args, kwargs)

        def go() -> Future:
            for r, g in members:
                try:
                    f = mesh._send(g, r, ext, self._name, payload, True)
                except BaseException as e:  # noqa: BLE001
                    stream._push_error(e)
                    continue
                f.add_done_callback(stream._on_done)
            out = Future()
            out.set_result(None)
            return out

        def not_started(f: Future) -> None:
            if f.exception() is not None:      # the mesh never came up: every item fails
                for _ in members:
                    stream._push_error(f.exception())
        mesh._when_ready(go).add_done_callback(not_started)
        return stream

    def __call__(self, *args, **kwargs):
        raise TypeError(f"call an endpoint through call_one(), call(), broadcast(), choose() or "
                        f"stream(): e.g. mesh.{self._name}.call(...)")


def _report_broadcast_failure(mesh: ActorMesh, endpoint: str, exc: BaseException) -> None:
    log.error("broadcast %s.%s to actor mesh %r failed: %s", mesh._state.class_name, endpoint,
              mesh._state.name, exc)
    print(f"hpcmesh: broadcast failed: {mesh._state.class_name}.{endpoint} to actor mesh "
          f"{mesh._state.name!r}: {exc}", file=sys.stderr, flush=True)


class ResultStream:
    """Results of a ``stream()`` call in the order they arrive.

    ``async for v in stream`` gives the values; a member that failed raises its error when
    its turn comes. ``for f in stream`` gives each member's Future once it is settled, so a
    Monarch program's ``for f in ep.stream(): f.get()`` runs unchanged, and one failure
    does not end the loop."""

    def __init__(self, n: int):
        self._n = n
        self._done: list[Future] = []          # completed futures, in arrival order
        self._cond = threading.Condition()
        self._async_waiters: list[tuple] = []  # (loop, asyncio.Future) to wake on arrival

    def __len__(self) -> int:
        return self._n

    def _on_done(self, f: Future) -> None:
        with self._cond:
            self._done.append(f)
            self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:   # that loop is closed: nobody is waiting any more
                pass

    def _push_error(self, exc: BaseException) -> None:
        f = Future()
        f.set_exception(exc)
        self._on_done(f)

    def __iter__(self):
        for i in range(self._n):
            with self._cond:
                if len(self._done) <= i and on_runtime_thread():
                    raise RuntimeError("iterating a stream synchronously on the hpcmesh event-loop "
                                       "thread would deadlock; use `async for`")
                while len(self._done) <= i:
                    self._cond.wait()
                f = self._done[i]
            yield f

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        for i in range(self._n):
            while True:
                with self._cond:
                    if len(self._done) > i:
                        f = self._done[i]
                        break
                    waiter = loop.create_future()
                    self._async_waiters.append((loop, waiter))
                await waiter
            yield f.get()       # done already: returns the value or raises its error


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
