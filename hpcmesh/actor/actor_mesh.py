"""ActorMesh: actors spawned on a ProcMesh, and ``mesh.endpoint``'s ways to call them
(``call_one``, ``call``, ``broadcast``, ``choose``, ``stream``).

Creation is asynchronous: a mesh is returned at once and calls made before it is ready are
sent when it is.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import threading
from typing import Any, Callable, Generic, ParamSpec, TypeVar

from ..runtime import relay
from ..runtime.observe import telemetry_recorder as _tel
from ..runtime.actor_host import shown_name
from ..runtime.observe import stragglers as _stragglers
from ..runtime.client import current_or_client_node
from ..runtime.errors import MeshStoppedError, SupervisionError, describe_actor, stopped_call
from ..runtime.future import (FanIn, Future, completed, failed, forward, gather,
                              on_runtime_thread)
from ..runtime.messages import call_msg
from ..runtime.node import NodeRef
from ..runtime.observe.spans import start_span
from ..shapes import Extent, Point, Shape
from ..transport import serialization
from ..transport.framing import FrameError
from ..transport.serialization import is_plain

from .mesh_view import MeshView, chain, chain_any
from .value_mesh import ValueMesh

log = logging.getLogger("hpcmesh.actor")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class ActorMeshState:
    def __init__(self, actor_id: str, name: str, class_name: str, endpoints: set,
                 proc_names: list[str], records: list | None, methods: frozenset = frozenset()):
        self.actor_id = actor_id
        self.name = name
        self.class_name = class_name
        self.endpoints = endpoints
        self.methods = methods      # the class's other attributes: see NotAnEndpoint
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
        #: ``module.Class`` and the mesh's extent, for messages (set by the spawner)
        self.class_path = class_name
        self.extent: Extent | None = None
        #: whether calls to several members fan out through their host agents
        #: (``HPCMESH_RELAY``, read once per mesh: all its views route alike)
        self.relay = records is not None and relay.relay_enabled()

    def describe_member(self, proc_name: str) -> str | None:
        """The actor this mesh has in process ``proc_name``, as Monarch's messages name it
        (``<train.Counter counters{'gpus': 1/2}>``); None if it has none there."""
        try:
            i = self.proc_names.index(proc_name)
        except ValueError:
            return None
        return describe_actor(self.class_path, self.name,
                              Point(i, self.extent) if self.extent is not None else None)

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


def proc_mesh_stopped(actor_mesh: str, proc_mesh: str) -> MeshStoppedError:
    """What calls to an actor mesh whose processes were stopped raise: Monarch's words,
    then which proc mesh."""
    return MeshStoppedError(f"actor mesh is stopped due to proc mesh shutdown (proc mesh "
                            f"{proc_mesh!r} of actor mesh {actor_mesh!r} was stopped)",
                            actor_mesh)


def stop_actor_mesh(st: ActorMeshState, reason: str,
                    error: MeshStoppedError | None = None) -> Future:
    """Stop the actors of one actor mesh on every process that hosts them, then fail later
    calls to it with a SupervisionError naming ``reason`` (or with ``error``). A Future of
    None (a member whose process is gone already counts as stopped)."""
    node = current_or_client_node()

    def stop_all() -> Future:
        return gather([node.rpc(n, "stop_actors", [st.actor_id])
                       for n in dict.fromkeys(st.nodes)])

    def mark(f: Future) -> Future:
        _TRAVELLED_PENDING.pop(st.actor_id, None)
        st.failed = error or MeshStoppedError(f"actor mesh {st.name!r} was stopped: {reason}",
                                              st.name)
        if f.exception() is not None and not isinstance(f.exception(), SupervisionError):
            return failed(f.exception())
        return completed(None)
    return chain_any(chain(st.ready, stop_all), mark)


def _gives_way(attr: str) -> property:
    """``attr`` of an ActorMesh, unless the actor class has an endpoint of that name: then
    the endpoint (see ``GIVES_WAY_TO_ENDPOINTS``)."""
    own = getattr(MeshView, attr)

    def get(self):
        if attr in self._state.endpoints:
            return self.__dict__.get(attr) or self.__getattr__(attr)
        return own.__get__(self, type(self))
    return property(get, doc=f"The mesh's {attr!r}, or the endpoint of that name if the "
                             f"actor class has one.")


class ActorMesh(MeshView, Generic[T]):
    """One actor per process; attribute access gives an endpoint to call. ``ActorMesh[T]``:
    a mesh of ``T`` actors (for annotations; spawn() is typed to return the actor class,
    as Monarch's is, so that a checker sees ``mesh.method`` as ``Endpoint[P, R]``)."""

    name = _gives_way("name")
    points = _gives_way("points")
    to_table = _gives_way("to_table")

    def __getattr__(self, item: str) -> "Endpoint[..., Any]":
        if item.startswith("__") or item in ("_state", "_shape"):
            raise AttributeError(item)
        st = self._state
        if item not in st.endpoints:
            if item in st.methods:
                return NotAnEndpoint(self, item)
            raise AttributeError(
                f"{st.class_name} has no endpoint {item!r}; endpoints: "
                f"{', '.join(sorted(st.endpoints)) or '(none)'}")
        ep = self.__dict__[item] = Endpoint(self, item)   # views are immutable: keep it
        return ep

    def stop(self, reason: str = "stopped by the client") -> Future:
        """Stop every actor of this actor mesh (the whole mesh, whatever this view selects):
        their calls in progress are cancelled, then their ``__cleanup__`` runs, and what
        they spawned is stopped too (as in Monarch); their processes go on. Later calls raise a
        ``SupervisionError`` naming the mesh and ``reason``. A Future of None."""
        if _tel.RECORDER is None:
            return stop_actor_mesh(self._state, reason)
        st = self._state        # telemetry's span: until every actor has stopped
        sp = start_span("hpcmesh.stop_actors", mesh=st.name, actor_mesh_id=st.actor_id,
                        extent=dict(self._shape.extent))
        fut = stop_actor_mesh(st, reason)
        if sp is not None:
            sp.end_after(fut)
        return fut

    def _result_shape(self) -> Shape:
        """The shape of this view's call() results (made once: a call() over hundreds of
        members should cost the caller per host, not per member, where it can)."""
        shape = self.__dict__.get("_result_shape_cache")
        if shape is None:
            shape = self.__dict__["_result_shape_cache"] = Shape.from_extent(
                self._shape.extent)
        return shape

    def _targets(self) -> list:
        """[(rank, NodeRef)] of this view's members, for the straggler watch (made once
        the mesh is live: its nodes no longer change)."""
        targets = self.__dict__.get("_targets_cache")
        if targets is None:
            nodes = self._state.nodes
            targets = [(r, nodes[g]) for r, g in self._members()[0]]
            self.__dict__["_targets_cache"] = targets
        return targets

    def _members(self) -> tuple[list[tuple[int, int]], tuple]:
        """[(rank in this view, global index)] and the view's extent as plain items (cached)."""
        m = self.__dict__.get("_members_cache")
        if m is None:
            shape = self._shape
            m = self.__dict__["_members_cache"] = (list(enumerate(shape.ranks())),
                                                   tuple(shape.extent.items()))
        return m

    def _relay_plan(self) -> tuple | None:
        """This view's members by host agent (``relay.plan``), once the mesh is live; None
        where nothing goes through an agent (relay off, a mesh rebuilt from a pickle,
        every member in this process's own host)."""
        if "_relay_cache" in self.__dict__:
            return self.__dict__["_relay_cache"]
        st = self._state
        if not st.relay or st.nodes is None:
            return None
        members, _ = self._members()
        node = current_or_client_node()
        groups, alone = relay.plan(node, [
            (r, st.records[g].name, st.nodes[g], st.records[g].agent) for r, g in members])
        # past a few dozen hosts, a tree of agents (HPCMESH_RELAY_FANOUT)
        plan = self.__dict__["_relay_cache"] = (groups, alone, relay.tree(node, groups)) \
            if groups else None
        return plan

    def _fan_out(self, endpoint: str, payload: tuple[Any, list | None], reply: bool,
                 errors: list | None = None, fan: FanIn | None = None) -> list:
        """Send one call (``reply``) or broadcast to every member of this view: one cast
        per host through its agent where that pays (``runtime/relay.py``), else straight.
        Each member's Future (None for a broadcast's), in member order; with ``fan``, every
        member's result goes to its slot there instead (relayed ones with no Future). A
        member whose message cannot leave: its Future fails, or (broadcast) its error goes
        to ``errors`` and the others still get theirs."""
        members, ext = self._members()

        def direct(slot: int) -> Future | None:
            r, g = members[slot]
            try:
                return self._send(g, r, ext, endpoint, payload, reply)
            except Exception as e:  # noqa: BLE001 - a dead member; the others still get it
                if reply:
                    return failed(e)
                if errors is not None:
                    errors.append(e)
                return None
        plan = self._relay_plan()
        if plan is None:
            out = [direct(slot) for slot in range(len(members))]
        else:
            groups, alone, heads = plan
            out = [None] * len(members)
            for slot in alone:
                out[slot] = direct(slot)
            st = self._state
            node = current_or_client_node()
            args, bufs = payload
            if heads is not None:
                relay.cast_tree(node, heads, st.actor_id, endpoint, args, bufs or [], ext,
                                reply, out, direct, fan)
                groups = ()
            for group in groups:
                # a broadcast goes through the agent even to one member: no ping of this
                # process's is then needed to keep its order (see relay.py)
                relay.cast(node, group, st.actor_id, endpoint, args, bufs or [], ext, reply,
                           out, direct, 2 if reply else 1, fan)
        if fan is not None:
            for slot, f in enumerate(out):
                if f is not None:
                    fan.follow(slot, f)
        return out

    def __reduce__(self):
        st = self._state
        if st.nodes is None:
            if on_runtime_thread():
                # Waiting here would stall the loop that brings the actors up: what travels
                # is where to ask for them (this process), and the receiver's calls wait
                # for the answer as ours wait for the spawn (Monarch's pending mesh).
                return rebuild_pending_actor_mesh, (
                    st.actor_id, st.name, st.class_name, sorted(st.endpoints), st.proc_names,
                    _offer_when_ready(st), self._shape, sorted(st.methods))
            st.ready.get()      # a mesh passed right after spawn(): wait until it is up
        return rebuild_actor_mesh, (st.actor_id, st.name, st.class_name, sorted(st.endpoints),
                                     st.proc_names, st.nodes, self._shape, sorted(st.methods))

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
            fut, port_id = node.reply_future(target, st.actor_id, endpoint)
        else:
            fut, port_id = None, None
        args, bufs = payload
        msg = call_msg(st.actor_id, endpoint, args, port_id, rank, extent_items)
        try:
            node.send(target, msg, buffers=bufs or [])
        except FrameError as e:      # too big for any frame: this call fails, named
            err = serialization.SerializationError(
                f"the arguments of {endpoint} could not be sent: {e}")
            if port_id is None:
                raise err from None
            node.close_port(port_id)
            fut.set_exception(err)
        except (SupervisionError, ConnectionError) as e:
            if port_id is not None:
                node.close_port(port_id)
                fut.set_exception(node.ports.failed_call(e, st.actor_id, endpoint))
            else:
                raise
        return fut

    def _when_ready(self, fn: Callable[[], Future], endpoint: str | None = None) -> Future:
        """Run ``fn`` now if the mesh is up, else queue it (in call order) until it is.
        Arguments were pickled by the caller already, so a queued ``fn`` cannot fail on them.
        ``endpoint``: the call's, for the error of a call to a stopped mesh."""
        st = self._state
        if st.failed is not None:     # spawn failed, or a failure below it went unhandled
            if endpoint is not None and isinstance(st.failed, MeshStoppedError):
                members, _ = self._members()
                actor = st.describe_member(st.proc_names[members[0][1]]) if members else None
                return failed(stopped_call(shown_name(endpoint), actor or repr(st.name),
                                           st.failed))
            return failed(st.failed)
        if st.live:
            return fn()
        out = Future()
        with st.lock:
            if not st.live and st.failed is None:
                st.pending.append((fn, out))
                return out
        return self._when_ready(fn, endpoint)


def rebuild_actor_mesh(actor_id, name, class_name, endpoints, proc_names, nodes, shape,
                       methods=()):
    st = ActorMeshState(actor_id, name, class_name, set(endpoints), proc_names, None,
                        frozenset(methods))
    st.nodes = list(nodes)
    st.live = True
    st.ready = Future()
    st.ready.set_result(st.nodes)
    return ActorMesh(st, shape)


#: Meshes that left this process while still starting: actor id -> their ``ready`` Future,
#: which the receivers ask for (``actor_mesh_nodes``). Dropped when the mesh is stopped.
_TRAVELLED_PENDING: dict[str, Future] = {}
NODES_SERVICE = "actor_mesh_nodes"


async def _nodes_when_ready(actor_id: str) -> list[NodeRef]:
    ready = _TRAVELLED_PENDING.get(actor_id)
    if ready is None:
        raise MeshStoppedError(f"actor mesh {actor_id[:8]} is no longer known to the process "
                               f"that sent it while it was starting (stopped since?)", actor_id)
    return list(await ready)


def _offer_when_ready(st: ActorMeshState) -> NodeRef:
    """Let other processes ask this one for the processes of ``st`` once it is up; the
    reference they ask through."""
    node = current_or_client_node()
    # The first state of this mesh here stays the one to ask: a copy received pending and
    # sent on from this process asks that one itself, and must not answer for it (a loop).
    _TRAVELLED_PENDING.setdefault(st.actor_id, st.ready)
    node.services.setdefault(NODES_SERVICE, _nodes_when_ready)
    return node.ref


def rebuild_pending_actor_mesh(actor_id, name, class_name, endpoints, proc_names, asked: NodeRef,
                               shape, methods=()):
    """An actor mesh that was still starting when it was sent: its calls are queued (as the
    sender's would be) until the process that sent it says where its actors are."""
    st = ActorMeshState(actor_id, name, class_name, set(endpoints), proc_names, None,
                        frozenset(methods))
    st.ready = current_or_client_node().rpc(asked, NODES_SERVICE, actor_id)
    st.ready.add_done_callback(lambda f: st.open(
        f.value() if f.exception() is None else None, f.exception()))
    return ActorMesh(st, shape)


class NotAnEndpoint:
    """``mesh.method`` for a method of the actor class that is not an endpoint (as in
    Monarch): calling it is an error; ``as_endpoint(mesh.method)`` calls it as one."""
    __slots__ = ("_mesh", "_name")

    def __init__(self, mesh: ActorMesh, name: str):
        self._mesh = mesh
        self._name = name

    def _advice(self) -> str:
        return (f"{self._mesh._state.class_name}.{self._name} is not an endpoint: decorate it "
                f"with @endpoint, or call it as one with as_endpoint(mesh.{self._name})"
                f".call(...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self._advice())

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        raise AttributeError(f"{item!r}: {self._advice()}")

    def __repr__(self) -> str:
        return f"NotAnEndpoint({self._mesh._state.class_name}.{self._name})"


def endpoint_of_plain_method(plain: NotAnEndpoint, prefix: str) -> "Endpoint":
    """What ``as_endpoint(mesh.method)`` returns: the Endpoint calling ``plain``'s method
    under ``prefix`` (``actor_host.AS_ENDPOINT`` or ``AS_ENDPOINT_PORT``), one per mesh view
    and prefix, as ``mesh.endpoint`` is one per view."""
    mesh, name = plain._mesh, prefix + plain._name
    ep = mesh.__dict__.get(name)
    if ep is None:
        ep = mesh.__dict__[name] = Endpoint(mesh, name)
    return ep


class Endpoint(Generic[P, R]):
    """``mesh.method``: the ways to call one endpoint on a mesh. ``Endpoint[P, R]`` for a
    method ``(self, *P) -> R`` (or ``-> Awaitable[R]``), what ``@endpoint`` makes of it."""
    __slots__ = ("_mesh", "_name", "_route", "_routes", "_one_site", "_sites")

    def __init__(self, mesh: ActorMesh, name: str):
        self._mesh = mesh
        self._name = name
        self._route: tuple | None = None     # call_one's fast path, once the mesh is live
        self._routes: tuple | None = None    # call's fast path, once the mesh is live
        #: where call_one notes its calls in telemetry's sent_messages; other methods'
        #: sites are made on their first call that records (_note_sent)
        self._one_site = _tel.SentSite()
        self._sites: dict | None = None

    def _members(self) -> tuple[list[tuple[int, int]], tuple]:
        return self._mesh._members()

    def _note_sent(self, method: str, one: bool = False) -> None:
        """This call in the telemetry's ``sent_messages`` (only while it records)."""
        if method == "call_one":
            site = self._one_site
        else:
            sites = self._sites
            if sites is None:
                sites = self._sites = {}
            site = sites.get(method)
            if site is None:
                site = sites[method] = _tel.SentSite()
        site.note(self._sent_fields, method, one)

    def _sent_fields(self, method: str, one: bool) -> tuple:
        """The ``sent_messages`` key fields of this endpoint called by ``method``: made
        once a log (json.dumps per call was a third of a call_one)."""
        shape = self._mesh._shape
        return (current_or_client_node().name, self._mesh._state.actor_id, self._name, method,
                json.dumps(dict(shape.extent)), 1 if one else shape.nelem)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the single member of this mesh; a Future of its value."""
        if _tel.RECORDER is not None:
            # twin of _note_sent(): SentSite.note written out, the least it can be: every
            # pipelined call passes here, and the caller's thread is the pipeline's critical
            # path (RESULTS.md's history, 2026-12-03: ~100 ns a call here cost pipelined
            # calls several per cent). SentSite says why the bound check is enough.
            log, calls, key = self._one_site.row
            if len(calls) < log.cap:
                calls.append(key)       # the transport's writes date it
            else:
                self._one_site.note(self._sent_fields, "call_one", True)
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
        return mesh._when_ready(lambda: mesh._send(g, 0, ext, self._name, payload, True),
                                self._name)

    def _fast_calls(self, args: tuple, kwargs: dict) -> tuple | None:
        """call()'s and stream()'s common case, kept short (as call_one's): a live mesh whose
        members are all reached directly, builtin arguments. Each member's Future and the
        routes taken; None: the general path."""
        routes = self._routes
        if routes is None or kwargs or not is_plain(args):
            return None
        node, st, targets, ext, _ = routes
        if st.failed is not None:
            return None
        name, payload = self._name, (args, kwargs)
        return [node.call_actor(t, st.actor_id, name, payload, r, ext)
                for r, t in targets], routes

    def _learn_routes(self, members: list, ext: tuple) -> None:
        """Once the mesh is live, what _fast_calls needs (never where members relay)."""
        mesh = self._mesh
        st = mesh._state
        if st.live and self._routes is None and mesh._relay_plan() is None:
            self._routes = (current_or_client_node(), st, [(r, st.nodes[g]) for r, g in members],
                            ext, Shape.from_extent(mesh._shape.extent))

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every member; a Future of a ValueMesh with this mesh's extent."""
        if _tel.RECORDER is not None:
            self._note_sent("call")
        fast = self._fast_calls(args, kwargs)
        if fast is not None:
            futs, (node, st, targets, _, result_shape) = fast
            # the straggler watch (runtime/observe/stragglers.py) until the result is made
            w = _stragglers.WATCH
            key = w.watch(futs, targets, st, self._name) if w is not None else None
            return gather(futs, lambda vals: ValueMesh(result_shape, vals) if key is None
                          else w.ended(key, ValueMesh(result_shape, vals)),
                          node.poll_for_rest)
        mesh = self._mesh
        members, ext = self._members()
        result_shape = mesh._result_shape()
        st = mesh._state
        self._learn_routes(members, ext)
        payload = mesh._payload(self._name, args, kwargs)

        def go() -> Future:
            # no Future per member where a reply needs none (a FanIn slot takes it)
            w = _stragglers.WATCH
            if w is None:
                fan = FanIn(len(members), lambda vals: ValueMesh(result_shape, vals),
                            current_or_client_node().poll_for_rest)
                mesh._fan_out(self._name, payload, True, fan=fan)
                return fan.out
            key = None

            def made(vals: list) -> ValueMesh:
                return w.ended(key, ValueMesh(result_shape, vals))
            fan = FanIn(len(members), made, current_or_client_node().poll_for_rest)
            slots = fan.all_slots()         # the straggler watch reads the members' slots
            key = w.watch(slots, mesh._targets(), st, self._name)
            mesh._fan_out(self._name, payload, True, fan=fan)
            return fan.out
        return mesh._when_ready(go, self._name)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every member without waiting; failures are reported through supervision.

        A member already known dead does not stop the others from getting the message;
        the failure is raised after all were sent (the controller raises on the next call)."""
        if _tel.RECORDER is not None:
            self._note_sent("broadcast")
        mesh = self._mesh
        members, ext = self._members()
        name = self._name
        payload = mesh._payload(name, args, kwargs)

        def go() -> Future:
            errors: list = []
            mesh._fan_out(name, payload, False, errors)
            done = Future()
            if errors:
                done.set_exception(errors[0])
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

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one member, picked round-robin among those with the least work in flight."""
        if _tel.RECORDER is not None:
            self._note_sent("choose", one=True)
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
        return mesh._when_ready(go, self._name)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> "ResultStream[R]":
        """Call every member; the results in arrival order: ``async for`` gives the values,
        ``for`` gives settled Futures (as Monarch's ``stream`` does)."""
        if _tel.RECORDER is not None:
            self._note_sent("stream")
        fast = self._fast_calls(args, kwargs)     # (Accumulator streams)
        if fast is not None:
            futs, (_, st, targets, _, _) = fast
            stream = ResultStream(len(futs))
            for i, f in enumerate(futs):
                stream._sent(i, f)
            if (w := _stragglers.WATCH) is not None:    # until the tick sees it end
                w.watch(futs, targets, st, self._name)
            return stream
        mesh = self._mesh
        members, ext = self._members()
        st = mesh._state
        self._learn_routes(members, ext)
        stream = ResultStream(len(members))
        payload = mesh._payload(self._name, args, kwargs)

        def go() -> Future:
            sent = []
            fanned = mesh._fan_out(self._name, payload, True)
            for i, ((r, g), f) in enumerate(zip(members, fanned)):
                stream._sent(i, f)
                sent.append((f, (r, mesh._state.nodes[g])))
            if (w := _stragglers.WATCH) is not None and sent:   # until the tick sees it end
                w.watch([f for f, _ in sent], [t for _, t in sent], mesh._state, self._name)
            out = Future()
            out.set_result(None)
            return out

        def not_started(f: Future) -> None:
            if f.exception() is not None:      # the mesh never came up: every item fails
                for i in range(len(members)):
                    stream._push_error(f.exception(), i)
        mesh._when_ready(go, self._name).add_done_callback(not_started)
        return stream

    def __call__(self, *args, **kwargs):
        raise TypeError(f"call an endpoint through call_one(), call(), broadcast(), choose() or "
                        f"stream(): e.g. mesh.{self._name}.call(...)")


def send(endpoint: Endpoint[P, R], args: tuple, kwargs: dict, port=None,
         selection: str = "all") -> None:
    """Monarch's ``send``: call ``endpoint`` without waiting, on every member
    (``selection="all"``) or on one (``"choose"``); each result goes to ``port`` (a
    ``Port``: its receiver gets the values, or the ActorError of a member that failed).
    Without a port the results are dropped, and a failure is reported as a broadcast's."""
    if selection not in ("all", "choose"):
        raise ValueError(f"send(selection={selection!r}): selection is 'all' or 'choose'")
    if not isinstance(endpoint, Endpoint):
        raise TypeError(f"send() takes an endpoint of an actor mesh (mesh.method), got "
                        f"{type(endpoint).__name__}")
    if port is None:
        if selection == "all":
            endpoint.broadcast(*args, **kwargs)
            return
        mesh = endpoint._mesh
        endpoint.choose(*args, **kwargs).add_done_callback(
            lambda f: f.exception() is not None and _report_broadcast_failure(
                mesh, endpoint._name, f.exception()))
        return
    if not callable(getattr(port, "send", None)) or not callable(getattr(port, "exception", None)):
        raise TypeError(f"send(port=...) takes a Port (from Channel.open()), got "
                        f"{type(port).__name__}")

    def answer(f: Future) -> None:
        if f.exception() is not None:
            port.exception(f.exception())
        else:
            port.send(f.value())
    if selection == "choose":
        endpoint.choose(*args, **kwargs).add_done_callback(answer)
        return
    if _tel.RECORDER is not None:
        endpoint._note_sent("send")
    mesh = endpoint._mesh
    members, ext = mesh._members()
    name = endpoint._name
    payload = mesh._payload(name, tuple(args), dict(kwargs))

    def go() -> Future:
        for f in mesh._fan_out(name, payload, True):
            f.add_done_callback(answer)
        return completed(None)
    mesh._when_ready(go, name).add_done_callback(
        lambda f: f.exception() is not None and port.exception(f.exception()))


def _report_broadcast_failure(mesh: ActorMesh, endpoint: str, exc: BaseException) -> None:
    log.error("broadcast %s.%s to actor mesh %r failed: %s", mesh._state.class_name, endpoint,
              mesh._state.name, exc)
    print(f"hpcmesh: broadcast failed: {mesh._state.class_name}.{endpoint} to actor mesh "
          f"{mesh._state.name!r}: {exc}", file=sys.stderr, flush=True)


class ResultStream(Generic[R]):
    """Results of a ``stream()`` call in the order they arrive.

    ``async for v in stream`` gives the values; a member that failed raises its error when
    its turn comes. ``for f in stream`` gives each member's Future once it is settled, so a
    Monarch program's ``for f in ep.stream(): f.get()`` runs unchanged, and one failure
    does not end the loop. Where a loop runs on this thread (async code, an actor), waiting
    would stall it: there ``for`` gives at once a Future of the i-th result to arrive, for
    ``for f in ep.stream(): await f``."""

    def __init__(self, n: int):
        self._n = n
        self._done: list[Future] = []          # completed futures, in arrival order
        self._cond = threading.Condition()
        self._async_waiters: list[tuple] = []  # (loop, asyncio.Future) to wake on arrival
        self._slots: dict[int, Future] = {}    # arrival index -> Future given out before it
        self._ranked: list[Future] | None = None   # in_mesh_order()'s, once asked for
        self._sent_futures: list[Future | None] = [None] * n  # member i's, once sent

    def __len__(self) -> int:
        return self._n

    def in_mesh_order(self) -> list[Future]:
        """One Future per member, in mesh order (rank 0 first), each settled when that
        member's result arrives: for a fold that must not depend on arrival order
        (``Accumulator``)."""
        with self._cond:
            if self._ranked is None:
                if None not in self._sent_futures:     # all sent (a live mesh): these
                    self._ranked = list(self._sent_futures)
                    return self._ranked
                self._ranked = [Future() for _ in range(self._n)]
                sent = [(i, f) for i, f in enumerate(self._sent_futures) if f is not None]
            else:
                sent = []
        for i, f in sent:
            forward(f, self._ranked[i])
        return self._ranked

    def _sent(self, i: int, f: Future) -> None:
        """Member ``i``'s call went out as ``f``."""
        with self._cond:
            self._sent_futures[i] = f
            ranked = self._ranked
        if ranked is not None and ranked[i] is not f:
            forward(f, ranked[i])
        f.add_done_callback(self._on_done)

    def _on_done(self, f: Future) -> None:
        with self._cond:
            slot = self._slots.pop(len(self._done), None) if self._slots else None
            self._done.append(f)
            self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        if slot is not None:
            forward(f, slot)
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:   # that loop is closed: nobody is waiting any more
                pass

    def _push_error(self, exc: BaseException, i: int) -> None:
        """Member ``i``'s call failed before it went out."""
        f = Future()
        f.set_exception(exc)
        self._sent(i, f)

    def __iter__(self):
        try:
            asyncio.get_running_loop()
            in_loop = True
        except RuntimeError:
            in_loop = on_runtime_thread()
        for i in range(self._n):
            with self._cond:
                if len(self._done) > i:
                    f = self._done[i]
                elif in_loop:
                    f = self._slots[i] = Future()
                else:
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
