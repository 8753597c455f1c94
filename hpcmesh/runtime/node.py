"""One runtime per process: routing messages to peers, actors, services and replies.

Every hpcmesh process (controller, host agent, actor process) runs one ``Node``. Nodes
talk in small tuples (see ``MSG_*``); a reply is just a message to a *port* (an integer id
on some node), so call replies, channels and supervision events share one mechanism. The
connections it routes over are ``runtime/links.py``'s, what they read is decoded into
messages by ``runtime/inbound.py``; where their bytes go, the transport backend's
(sockets, or ``memory://`` in tests).

A node never blocks its loop: handlers run inline when they are short (actor endpoints
decide for themselves) and dialing is async.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import threading
import uuid
from typing import Any, Callable

from ..settings import env_number
from ..transport import connection, serialization, tls
from ..transport.connection import Connection, ConnectionClosed
from ..transport.framing import FrameError, check_frame_limits
from .errors import SupervisionError
from .fanin import FaninPoller
from . import host_share, relay
from .future import Future
from .inbound import FrameReader
from .links import Links
from .loop import running_loop, start_loop_thread
from .peers import Peer, PeerTable, unsettle
from .ports import PortTable
from .services import Services
# the message codes are part of this module's face too (tests and tools send MSG_DELIVER)
from .messages import (ANSWERED_THROUGH_PORT, CHECK_LIMITS_OVER, MSG_CALL, MSG_DELIVER, MSG_FAIL,  # noqa: F401
                       MSG_CAST, MSG_CAST_REPLY, MSG_CAST_TREE, MSG_CAST_UP, MSG_RESULT, MSG_RPC,
                       PROTOCOL, Failure, NodeRef, PortRef,
                       ReplyNotSent, call_msg, cast_reply_msg, deliver_msg, encode_result,
                       fail_msg, frozen_size, rpc_msg, unreadable_result)

log = logging.getLogger("hpcmesh.runtime")

#: How long the loop thread polls for the rest of a fan-in once its first reply is in.
FANIN_POLL_WINDOW = env_number("HPCMESH_FANIN_POLL_US", 250, unit="microseconds",
                               note="0 turns the polling off") * 1e-6


class Node:
    """The per-process runtime. Create with ``Node.start_in_thread`` (controller) or
    construct inside a running loop (workers)."""

    def __init__(self, secret: bytes, loop: asyncio.AbstractEventLoop, *, role: str,
                 name: str = "", info: dict | None = None):
        self.secret = secret
        self.loop = loop
        self.role = role
        self.name = name
        self.node_id = uuid.uuid4().hex
        self.info = {"role": role, "name": name, "pid": os.getpid(),
                     "host": socket.gethostname(), **(info or {})}
        self.loop_tid = threading.get_ident() if running_loop() is loop else None
        #: The loop thread's kernel id (for its CPU affinity: see placement.py).
        self.loop_native_tid = threading.get_native_id() if running_loop() is loop else None
        self.addresses: tuple[str, ...] = ()
        self.peers = PeerTable()
        self.ports = PortTable()
        #: the connections: listeners, dials, hellos, loss (this node routes over them)
        self.links = Links(self, loop, secret, self.node_id, self.info, self.peers,
                           on_frames=self._on_frames, deliver=self.ports.deliver)
        self.links.loop_tid = self.loop_tid
        self.on_peer_hello = self.links.on_peer_hello     # hooks: see Links
        self.on_peer_closed = self.links.on_peer_closed
        # a lost process's slots in the call()s relayed to it (one port per host share)
        self.links.on_peer_failed.append(lambda p, exc: host_share.fail_member(self, p, exc))
        # the tables' own dicts and counter, bound here for the hot paths (one attribute
        # lookup, not two, per call and per reply)
        self._peers = self.peers.by_id
        self._replies = self.ports.replies
        self._port_ids = self.ports.ids
        self._deliver_local = self.ports.deliver
        self._replied: set[Connection] = set()   # replies queued while handling frames
        self._handling_frames = False
        #: what the connections read, decoded into messages and handed to _dispatch
        self.reader = FrameReader(self, self._dispatch)
        #: True while the messages of a batch frame are dispatched: a pipelining sender,
        #: whose calls an actor runs faster from its mailbox task than one by one inline.
        self.in_batch = False
        self.services = Services()      # what peers may call by name (Node.rpc)
        self.actors: dict[str, Any] = {}          # actor_id -> ActorInstance (worker side)
        self.actor_services: Any = None           # set by ActorServices.attach
        # run when the process this node serves is told to stop (an actor process's
        # ClientRuntime hooks in here, so processes its actors started stop with it)
        self.on_stop: list[Callable[[], None]] = []
        self.closed = False
        self._thread: threading.Thread | None = None
        self.use_tls(tls.settings())     # HPCMESH_TLS_CA: set for everything a job starts
        self.fanin = FaninPoller(loop)     # polls for the rest of a call()'s replies
        #: what handles a MSG_CAST here (a host agent's ``cast_relay.CastRelay``; None: refused)
        self.cast_handler: Callable[[tuple, str | None, list], None] | None = None

    # -- construction ---------------------------------------------------------------
    @classmethod
    def start_in_thread(cls, secret: bytes, *, role: str, name: str = "",
                        listen: list[str] = (), info: dict | None = None) -> "Node":
        """Run a node's event loop on a daemon thread (the controller's runtime)."""
        def build(loop: asyncio.AbstractEventLoop) -> "Node":
            node = cls(secret, loop, role=role, name=name, info=info)
            node._runs_on_this_thread()
            node.listen(list(listen))
            return node
        node, node._thread = start_loop_thread(build, f"hpcmesh-{role}")
        return node

    def _runs_on_this_thread(self) -> None:
        """This thread is (or will run) the node's loop."""
        self.loop_tid = self.links.loop_tid = threading.get_ident()
        self.loop_native_tid = threading.get_native_id()

    # -- connections (runtime/links.py) --------------------------------------------------
    def listen(self, addresses: list[str], advertise_host: str | None = None) -> None:
        """Bind listeners (``Links.listen``); their addresses are advertised in order."""
        self.addresses = self.links.listen(addresses, advertise_host)

    def use_tls(self, settings: tls.TLSSettings | None) -> None:
        """Encrypt TCP connections from now on (``Links.use_tls``)."""
        self.links.use_tls(settings)

    @property
    def tls(self) -> tls.TLSSettings | None:
        return self.links.tls

    def unix_address(self) -> str:
        return self.links.unix_address()

    async def connect(self, address: str, expect: str | None = None,
                      timeout: float = 10.0, secret: bytes | None = None) -> Connection:
        """Dial, authenticate and exchange hellos (``Links.connect``)."""
        return await self.links.connect(address, expect, timeout, secret)

    async def connect_first(self, addresses, expect: str | None = None, timeout: float = 10.0,
                            secret: bytes | None = None, stagger: float = 0.25,
                            on_error: Callable[[str, str], None] | None = None
                            ) -> tuple[str, Connection]:
        """The first of ``addresses`` that completes the handshake (``Links.connect_first``)."""
        return await self.links.connect_first(addresses, expect, timeout, secret, stagger,
                                              on_error)

    def fail_peer(self, peer_id: str, exc: BaseException) -> None:
        """Fail everything pending on a peer now (a precise exit report arrived)."""
        self.links.fail_peer(peer_id, exc)

    @property
    def ref(self) -> NodeRef:
        return NodeRef(self.node_id, self.addresses)

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.loop_tid

    def run_sync(self, coro, timeout: float | None = None):
        """Run a coroutine on the node's loop from another thread and wait for it."""
        if self.on_loop_thread():
            raise RuntimeError("run_sync called on the runtime's own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn: Callable, *args) -> None:
        if self.on_loop_thread():
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    # -- ports -------------------------------------------------------------------------
    def open_port(self, callback: Callable[[Any], None], once: bool = False) -> PortRef:
        return PortRef(self.ref, self.ports.open(callback, once))

    def close_port(self, port: PortRef | int) -> None:
        self.ports.close(port if isinstance(port, int) else port.port_id)

    def reply_future(self, peer: NodeRef | str | None, actor_id: str | None = None,
                     endpoint: str | None = None) -> tuple[Future, int]:
        """A one-shot reply port (its id is returned) whose first delivery resolves a
        Future; the Future fails if ``peer`` dies first (naming the endpoint call
        ``actor_id``, ``endpoint`` it is for, if given: ``PortTable.failed_call``).

        Callable from any thread. ``peer`` is the node expected to answer (a NodeRef,
        or a node id of a node already known). ``port_ref(id)`` names the port for a
        message that carries it."""
        if peer is None:
            p = None
        elif type(peer) is str:
            p = self._peers.get(peer)
        else:
            p = self._peers.get(peer.node_id) or self.peers.peer(peer)
        return self.ports.expect_reply(p, actor_id, endpoint)

    def port_ref(self, port_id: int) -> PortRef:
        return PortRef(NodeRef(self.node_id, self.addresses), port_id)

    # -- sending ---------------------------------------------------------------------
    def peer(self, ref: NodeRef) -> Peer:
        return self.peers.peer(ref)

    def send(self, target: NodeRef, msg: tuple, what: str = "message",
             buffers: list | None = None, cork: bool | None = None) -> None:
        """Send a message tuple to a node; thread-safe. Dials if needed (async).

        With ``buffers``, ``msg`` is a flat envelope of plain values (its payload was
        pickled already) and ``buffers`` are that payload's out-of-band buffers.
        Messages from one thread to one node go out in the order they were sent.
        ``cork``: whether to leave the write to the loop, batched with what follows (None:
        when other replies are awaited from that node; False: a lone message, written now)."""
        if target.node_id == self.node_id:
            if msg[0] == MSG_CALL and type(msg[3]) is tuple:
                msg = serialization.loads(serialization.dumps_envelope(msg))   # no sharing
            self._hand_over_local(msg, buffers or ())
            return
        if msg[0] == MSG_CALL:
            p = self._peers.get(target.node_id)
            if p is not None and p.relay_sent != p.relay_acked and \
                    relay.relay_one(self, p, target, msg, buffers or []):    # behind relayed ones
                return
        if buffers is None:
            meta, bufs = serialization.dumps(msg, what)
        else:
            meta, bufs = serialization.dumps_envelope(msg), buffers
        if bufs or len(meta) > CHECK_LIMITS_OVER:
            check_frame_limits(len(meta), bufs)      # FrameError here, not at the peer
        self._send_encoded(target, meta, bufs, cork)

    def _hand_over_local(self, msg: tuple, buffers) -> None:
        """A message to this node itself: dispatched on the loop. It counts as written
        (``connection.WRITE_HOOK``: telemetry dates the calls sent so far)."""
        if (hook := connection.WRITE_HOOK) is not None:
            hook()
        self.call_soon(self._dispatch_local, msg, buffers)

    def _send_encoded(self, target: NodeRef, meta: bytes, bufs: list,
                      cork: bool | None = None) -> None:
        """Send one encoded frame (as ``send``); to this node itself it is decoded and
        dispatched on the loop."""
        if target.node_id == self.node_id:
            self._hand_over_local(serialization.loads(meta), bufs)
            return
        p = self._peers.get(target.node_id) or self.peer(target)
        conn = p.conn
        if conn is not None and not p.backlog and not conn.closed:
            if cork is None:
                cork = len(p.inflight) > 1
            try:
                if bufs:
                    conn.send_frame(meta, bufs, cork=cork)
                else:
                    conn.send_msg(meta, cork)
                return
            except ConnectionClosed:
                conn = None     # closed under us: nothing was written; treat as not connected
        if p.lost is not None and (conn is None or conn.closed):
            raise p.lost
        p.backlog.append((meta, bufs))
        self.call_soon(self.links.flush_backlog, p)

    def call_actor(self, target: NodeRef, actor_id: str, endpoint: str, payload: tuple,
                   rank: int, extent_items: tuple) -> Future:
        """Send a MSG_CALL whose ``payload`` (args, kwargs) holds builtin values only, with
        a fresh reply port; a Future of the reply. Thread-safe.

        The path every pipelined call takes, so the connected case is written out here
        rather than through ``reply_future`` and ``send``."""
        p = self._peers.get(target.node_id)
        conn = p.conn if p is not None else None
        if conn is not None and not p.backlog and p.relay_sent == p.relay_acked:
            fut = Future()
            pid = next(self._port_ids)
            self._replies[pid] = (fut, p, actor_id, endpoint)
            inflight = p.inflight
            inflight.add(pid)
            if p.settled:
                unsettle()      # a cast to its host group must now go behind this call
            # twin of call_msg(): written out, as every pipelined call passes here and two
            # Python calls are ~2 % of its CPU (tests/test_twins.py holds them equal)
            msg = (MSG_CALL, actor_id, endpoint, payload, pid, rank, extent_items)
            size = frozen_size(payload[0]) if not payload[1] else -1
            try:
                if 0 <= size <= CHECK_LIMITS_OVER:   # immutable: pickled later, in a batch
                    conn.send_obj(msg, size + 64, len(inflight) > 1)
                else:
                    meta = pickle.dumps(msg, PROTOCOL)
                    if len(meta) > CHECK_LIMITS_OVER:
                        check_frame_limits(len(meta))    # a huge string argument, say
                    conn.send_msg(meta, len(inflight) > 1)
                return fut
            except FrameError as e:
                self.close_port(pid)
                fut.set_exception(serialization.SerializationError(
                    f"the arguments of {endpoint} could not be sent: {e}"))
                return fut
            except ConnectionClosed:
                self.close_port(pid)    # nothing was written: take the general path
        fut, pid = self.reply_future(target, actor_id, endpoint)
        try:
            self.send(target, call_msg(actor_id, endpoint, payload, pid, rank, extent_items),
                      buffers=[])
        except (SupervisionError, ConnectionError) as e:
            self.close_port(pid)
            fut.set_exception(self.ports.failed_call(e, actor_id, endpoint))
        except FrameError as e:
            self.close_port(pid)
            fut.set_exception(serialization.SerializationError(
                f"the arguments of {endpoint} could not be sent: {e}"))
        return fut

    def poll_for_rest(self, fanin: Future, window: float | None = None) -> None:
        """Keep this loop polling its sockets, instead of sleeping between replies, until
        ``fanin`` settles or ``window`` seconds (``HPCMESH_FANIN_POLL_US``) have passed
        (``runtime/fanin.py`` says why). Called when the first reply of a call() to several
        actors is in; only on the loop thread and while somebody waits for ``fanin``."""
        window = FANIN_POLL_WINDOW if window is None else window
        if (window <= 0 or threading.get_ident() != self.loop_tid or fanin.done()
                or not fanin.waited_on()):
            return
        self.fanin.add(fanin, window)

    # -- receiving -------------------------------------------------------------------
    def _on_frames(self, conn: Connection, frames: list) -> None:
        self._handling_frames = True
        try:
            self.reader.handle(conn, frames)
        finally:
            self._handling_frames = False
            self.in_batch = False
            # Replies produced while handling these frames leave now, in one write per
            # connection, rather than one loop turn later.
            dirty = self._replied
            while dirty:
                dirty.pop().flush_now()

    def take_unhandled_frames(self) -> list[tuple[Connection, list]]:
        """The frames read with a paused call and not handled yet (``UnhandledFrames``)."""
        return self.reader.take_unhandled()

    def _dispatch_local(self, msg: tuple, buffers: list = ()) -> None:
        try:
            self._dispatch(msg, self.node_id, list(buffers))
        except Exception:  # noqa: BLE001
            log.exception("error handling a local message")

    def _dispatch(self, msg: tuple, origin: str | None, buffers: list) -> None:
        kind = msg[0]
        if kind == MSG_CALL:
            inst = self.actors.get(msg[1])
            if inst is None:
                self.reply_to(origin, msg[4], Failure(LookupError(
                    f"no actor {msg[1]} on this process ({self.name}); it was never spawned "
                    f"here or has been stopped")))
                return
            inst.handle_call(msg, origin, buffers)
        elif kind == MSG_DELIVER:
            self._deliver_local(msg[1], msg[2])
        elif kind == MSG_RESULT:
            raw = self.ports.raw
            if raw and msg[1] in raw:       # a reply this host agent relays unread
                raw.discard(msg[1])
                self._deliver_local(msg[1], relay.RawResult(msg[2], list(buffers)))
                return
            try:
                value = serialization.loads(msg[2], buffers)
            except Exception as e:  # noqa: BLE001 - fails this one call, not the connection
                value = unreadable_result(self.links.peer_name(origin), e)
            self._deliver_local(msg[1], value)
        elif kind == MSG_FAIL:
            self._deliver_local(msg[1], Failure(msg[2]))
        elif kind == MSG_RPC:
            self._handle_rpc(msg)
        elif kind == MSG_CAST_REPLY:
            relay.on_cast_reply(self, origin, msg[1], buffers)
        elif kind == MSG_CAST or kind == MSG_CAST_TREE or kind == MSG_CAST_UP:
            if self.cast_handler is None:
                if kind == MSG_CAST_UP:
                    return          # answers for a relay this node is not
                err = LookupError(f"{self.name or self.role} relays no calls (not a host agent)")
                ports = msg[6] if kind == MSG_CAST else list(relay.tree_ports(msg[6], msg[7]))
                ports = [ports] if type(ports) is int else ports    # a host share's one port
                to = origin if kind == MSG_CAST else msg[1][0]
                if to is not None and ports:
                    if kind == MSG_CAST_TREE:
                        self.peers.peer(NodeRef(msg[1][0], tuple(msg[1][1])))
                    # ALL: every member of a host share (a member's own port: no number)
                    self.send(self.ref_of(to), cast_reply_msg(
                        [(port, MSG_FAIL, err, 0, host_share.ALL) for port in ports]),
                        buffers=[])
                return
            self.cast_handler(msg, origin, buffers)
        else:
            log.warning("unknown message kind %r", kind)

    def _handle_rpc(self, msg: tuple) -> None:
        _, service, args, reply = msg
        self.services.run(service, args, self.loop, here=self.name or self.role,
                          answer=lambda value: self.reply(reply, value),
                          fail=lambda exc: self._reply_error(reply, exc))

    def reply_to(self, origin: str | None, port_id: int | None, value: Any) -> None:
        """Answer a call: deliver ``value`` (or a failure) to port ``port_id`` of the
        node the call came from (``ANSWERED_THROUGH_PORT``: the endpoint answered
        through its response port itself, nothing to send)."""
        if port_id is None or origin is None or value is ANSWERED_THROUGH_PORT:
            return
        if type(value) is not Failure:
            # Fast path: the caller's connection is up and nothing is queued before us.
            p = self._peers.get(origin)
            conn = p.conn if p is not None else None
            if conn is not None and not p.backlog:
                size = frozen_size(value)
                if 0 <= size <= CHECK_LIMITS_OVER:   # immutable: pickled later, in a batch
                    try:
                        # twin of deliver_msg(): written out, every reply of a pipelined
                        # caller passes here (tests/test_twins.py holds them equal)
                        conn.send_obj((MSG_DELIVER, port_id, value), size + 16,
                                      flushed_by_caller=self._handling_frames)
                        self._replied.add(conn)
                    except ConnectionClosed:
                        pass        # the caller is gone; its supervision says why
                    return
                meta, bufs = encode_result(port_id, value)     # raises ReplyNotSent
                try:
                    if bufs:
                        conn.send_frame(meta, bufs)
                    else:
                        conn.send_msg(meta)
                        self._replied.add(conn)
                except ConnectionClosed:
                    pass            # the caller is gone; its supervision says why
                return
        if origin == self.node_id:
            target = self.ref
        else:
            p = self._peers.get(origin)
            if p is None or p.ref is None:
                log.debug("cannot reply to unknown node %s", origin[:8])
                return
            target = p.ref
        if isinstance(value, Failure):
            self._reply_error(PortRef(target, port_id), value.exc)
            return
        self.reply(PortRef(target, port_id), value)

    def reply(self, port: PortRef | None, value: Any) -> None:
        """Deliver ``value`` to ``port`` (a result, a channel message); one that cannot be
        sent fails the port instead."""
        if port is None:
            return
        try:
            self.send_value(port, value)
        except ReplyNotSent as e:
            self._reply_error(port, e)
        except (ConnectionError, SupervisionError) as e:
            log.debug("cannot deliver reply to %s: %s", port.node.node_id[:8], e)

    def send_value(self, port: PortRef, value: Any, what: str = "result") -> None:
        """Send ``value`` to ``port``: to this process by reference, to another encoded as
        a result (``encode_result``: the receiver unpickles it apart, so a value it cannot
        read fails that port alone); raises ReplyNotSent before sending anything."""
        if port.node.node_id == self.node_id:
            self.call_soon(self._dispatch_local, deliver_msg(port.port_id, value))
            return
        meta, bufs = encode_result(port.port_id, value, what)
        self._send_encoded(port.node, meta, bufs)

    def _reply_error(self, port: PortRef | None, exc: BaseException) -> None:
        if port is None:
            log.warning("unhandled error with nobody to tell: %s", exc)
            return
        try:
            self.send(port.node, fail_msg(port.port_id, exc), "error")
        except serialization.SerializationError:
            self.send(port.node, fail_msg(port.port_id, RuntimeError(
                f"{type(exc).__name__}: {exc}")), "error")
        except (ConnectionError, SupervisionError) as e:
            log.debug("cannot deliver error to %s: %s", port.node.node_id[:8], e)

    def rpc(self, target: NodeRef, service: str, *args) -> Future:
        """Call a service on another node (or this one); a Future of its result."""
        fut, pid = self.reply_future(target if target.node_id != self.node_id else None)
        port = self.port_ref(pid)
        try:
            self.send(target, rpc_msg(service, args, port), f"arguments of {service}")
        except BaseException as e:  # noqa: BLE001
            self.close_port(port)
            fut.set_exception(e)
        return fut

    def ref_of(self, node_id: str) -> NodeRef:
        """How to reach node ``node_id``: this node, a peer we know the addresses of, or
        its id alone (a peer that has not said hello yet: replies then wait for it)."""
        return self.ref if node_id == self.node_id else self.peers.ref_of(node_id)

    def load(self, node_id: str) -> int:
        """Replies this node still awaits from ``node_id`` (``choose()`` picks the least)."""
        return self.peers.load(node_id)

    def peer_connected(self, peer_id: str) -> bool:
        return self.peers.connected(peer_id)

    # -- a call that pauses inside frame handling (runtime/observe/debugger.py) -----------------
    def pause_frame_handling(self) -> tuple[bool, bool]:
        """A call handled from a read pauses, the loop turning inside it (a breakpoint):
        replies are no longer held for the read's end, and those held leave now. Returns
        what ``resume_frame_handling`` puts back (the rest: ``take_unhandled_frames``)."""
        paused = self._handling_frames, self.in_batch
        self._handling_frames = self.in_batch = False
        held = self._replied
        while held:
            held.pop().flush_now()
        return paused

    def resume_frame_handling(self, paused: tuple[bool, bool]) -> None:
        self._handling_frames, self.in_batch = paused

    def handle_frames(self, conn: Connection, frames: list) -> None:
        """Handle ``frames`` read from ``conn`` as its reader does (``take_unhandled_frames``'s)."""
        self._on_frames(conn, frames)

    # -- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        """Close listeners and connections (call on the loop thread)."""
        if self.closed:
            return
        self.closed = True
        self.fanin.closed = True
        self.links.close()

    def shutdown_thread(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        def stop() -> None:
            self.close()
            for host in self.actors.values():
                host.stopped = True     # actors living here (this_proc()) end with the loop
            self.loop.stop()
        try:
            self.loop.call_soon_threadsafe(stop)
        except RuntimeError:
            return
        self._thread.join(timeout)


_current_node: Node | None = None


def set_current_node(node: Node | None) -> None:
    """The node that meshes in this process send through (the client's or the worker's)."""
    global _current_node
    _current_node = node


def current_node() -> Node | None:
    return _current_node
