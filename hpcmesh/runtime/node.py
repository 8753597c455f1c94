"""One runtime per process: listeners, connections to peers, routing and replies.

Every hpcmesh process (controller, host agent, actor process) runs one
``Node``. Nodes talk in small tuples (see ``MSG_*``); a reply is just a
message to a *port* (an integer id on some node), so call replies, channels
and supervision events share one mechanism.

A node never blocks its loop: handlers run inline when they are short
(actor endpoints decide for themselves) and dialing is async.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

from ..private_files import runtime_dir
from ..settings import env_number
from ..transport import connection, serialization, tls
from ..transport.addresses import Address, parse_address, split_alias
from ..transport.connection import Connection, ConnectionClosed, Listener, dial
from .errors import SupervisionError
from .future import Future, register_loop_thread, unregister_loop_thread
from .peers import Peer, PeerTable
from .ports import PortTable
from .loop import finish_leftover_tasks, new_event_loop, running_loop
from .loop import yield_core as _yield_core     # a module global: tests count the turns
# the message codes are part of this module's face too (tests and tools send MSG_DELIVER)
from ..transport.framing import FrameError, check_frame_limits
from .messages import (ANSWERED_THROUGH_PORT, CHECK_LIMITS_OVER, MSG_CALL, MSG_DELIVER, MSG_FAIL,  # noqa: F401
                       MSG_HELLO, MSG_RESULT, MSG_RPC, PROTOCOL, Failure, NodeRef, PortRef,
                       BatchShare, MessageNotReceived, ReplyNotSent,
                       call_msg, deliver_msg, describe_exception,
                       encode_result, fail_msg, frozen_size, hello_msg, layout_problem,
                       rpc_msg)

log = logging.getLogger("hpcmesh.runtime")

#: How long a caller waits for a precise exit report after a connection drops
#: before failing pending work with a generic "connection lost".
LOST_PEER_REPORT_WAIT = env_number("HPCMESH_LOST_PEER_WAIT", 1.0)


#: the longest path a Unix socket can be bound to (108 bytes with the final NUL)
UNIX_PATH_MAX = 107

#: How long the loop thread polls for the rest of a fan-in once its first reply is in.
FANIN_POLL_WINDOW = env_number("HPCMESH_FANIN_POLL_US", 250, unit="microseconds",
                               note="0 turns the polling off") * 1e-6


def describe_peer(node_id: str, info: dict | None) -> str:
    """``name (host, pid N)`` of a peer from its hello, for messages a user reads."""
    if not info:
        return f"node {node_id[:8]}"
    return (f"{info.get('name') or info.get('role') or 'node ' + node_id[:8]} "
            f"({info.get('host', '?')}, pid {info.get('pid', '?')})")


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
        self._listeners: list[Listener] = []
        self.addresses: tuple[str, ...] = ()
        self.peers = PeerTable()
        self.ports = PortTable()
        # the tables' own dicts and counter, bound here for the hot paths (one attribute
        # lookup, not two, per call and per reply)
        self._peers = self.peers.by_id
        self._replies = self.ports.replies
        self._port_ids = self.ports.ids
        self._deliver_local = self.ports.deliver
        self._replied: set[Connection] = set()   # replies queued while handling frames
        self._handling_frames = False
        #: (connection, frames of one read not handled yet): a stack, as a handler that
        #: pauses (a breakpoint) turns the loop, which may handle more reads inside it
        self._unhandled: list[tuple[Connection, deque]] = []
        #: True while the messages of a batch frame are dispatched: a pipelining sender,
        #: whose calls an actor runs faster from its mailbox task than one by one inline.
        self.in_batch = False
        self.services: dict[str, Callable] = {}
        self.actors: dict[str, Any] = {}          # actor_id -> ActorInstance (worker side)
        self.actor_services: Any = None           # set by ActorServices.attach
        self.on_peer_hello: list[Callable] = []   # (node, peer_ref, info, conn)
        # run when the process this node serves is told to stop (an actor process's
        # ClientRuntime hooks in here, so processes its actors started stop with it)
        self.on_stop: list[Callable[[], None]] = []
        self.on_peer_closed: list[Callable] = []  # (node, peer_id, exc)
        self.closed = False
        self._thread: threading.Thread | None = None
        self.tls: tls.TLSSettings | None = None
        self._tls_contexts: tuple | None = None
        self.use_tls(tls.settings())     # HPCMESH_TLS_CA: set for everything a job starts
        self._fanins: list[tuple[Future, float]] = []   # polled for: (fan-in, deadline)
        self._polling = False

    # -- construction ---------------------------------------------------------------
    @classmethod
    def start_in_thread(cls, secret: bytes, *, role: str, name: str = "",
                        listen: list[str] = (), info: dict | None = None) -> "Node":
        """Run a node's event loop on a daemon thread (the controller's runtime)."""
        ready = threading.Event()
        box: dict = {}

        def main() -> None:
            loop = new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                # anything that fails before the loop runs (a bad TLS setting read by the
                # constructor, a port in use) goes to the caller, who would wait forever
                node = cls(secret, loop, role=role, name=name, info=info)
                node.loop_tid = threading.get_ident()
                node.loop_native_tid = threading.get_native_id()
                register_loop_thread(loop)
                node.listen(list(listen))
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
                ready.set()
                unregister_loop_thread(loop)
                loop.close()
                return
            box["node"] = node
            ready.set()
            try:
                loop.run_forever()
                finish_leftover_tasks(loop)
            finally:
                unregister_loop_thread(loop)
                loop.close()

        t = threading.Thread(target=main, name=f"hpcmesh-{role}", daemon=True)
        t.start()
        ready.wait()
        if "error" in box:
            raise box["error"]
        node = box["node"]
        node._thread = t
        return node

    def listen(self, addresses: list[str], advertise_host: str | None = None) -> None:
        """Bind listeners; ``tcp://host:0`` picks an ephemeral port. Advertised in order.

        A wildcard listener (``0.0.0.0``/``::``) is advertised as ``advertise_host``:
        peers must be told an address they can dial, never the wildcard."""
        out = []
        for a in addresses:
            lst = Listener(self.loop, a, self.secret, self._on_accept, self._server_tls)
            self._listeners.append(lst)
            addr = lst.address
            dial, bind = split_alias(a)
            if dial != bind:            # DIAL@BIND: peers are told DIAL
                told = parse_address(dial)
                addr = Address(told.scheme, host=told.host, port=told.port or addr.port,
                               path=told.path)
            elif advertise_host and addr.scheme == "tcp" and addr.host in ("0.0.0.0", "::"):
                addr = Address("tcp", host=advertise_host, port=addr.port)
            out.append(str(addr))
        self.addresses = tuple(out)

    # -- TLS (tcp:// only; see hpcmesh.transport.tls) ---------------------------------
    def use_tls(self, settings: tls.TLSSettings | None) -> None:
        """Encrypt TCP connections from now on (listeners then require TLS). Checked here,
        so a missing certificate is an error now, not on the first connection."""
        if settings is not None:
            self._tls_contexts = (tls.client_context(settings), tls.server_context(settings))
        else:
            self._tls_contexts = None
        self.tls = settings

    def _client_tls(self):
        return self._tls_contexts[0] if self._tls_contexts else None

    def _server_tls(self):
        return self._tls_contexts[1] if self._tls_contexts else None

    def unix_address(self) -> str:
        path = os.path.join(runtime_dir(), self.node_id[:16] + ".sock")
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise ValueError(f"the Unix socket path {path} is over {UNIX_PATH_MAX} bytes, the "
                             f"limit of a socket's name: set HPCMESH_RUNTIME_DIR, "
                             f"XDG_RUNTIME_DIR or TMPDIR to a folder with a shorter path")
        return f"unix://{path}"

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

    def reply_future(self, peer: NodeRef | str | None) -> tuple[Future, int]:
        """A one-shot reply port (its id is returned) whose first delivery resolves a
        Future; the Future fails if ``peer`` dies first.

        Callable from any thread. ``peer`` is the node expected to answer (a NodeRef,
        or a node id of a node already known). ``port_ref(id)`` names the port for a
        message that carries it."""
        if peer is None:
            p = None
        elif type(peer) is str:
            p = self._peers.get(peer)
        else:
            p = self._peers.get(peer.node_id) or self.peers.peer(peer)
        return self.ports.expect_reply(p)

    def port_ref(self, port_id: int) -> PortRef:
        return PortRef(NodeRef(self.node_id, self.addresses), port_id)

    # -- sending ---------------------------------------------------------------------
    def peer(self, ref: NodeRef) -> Peer:
        return self.peers.peer(ref)

    def send(self, target: NodeRef, msg: tuple, what: str = "message",
             buffers: list | None = None) -> None:
        """Send a message tuple to a node; thread-safe. Dials if needed (async).

        With ``buffers``, ``msg`` is a flat envelope of plain values (its payload was
        pickled already) and ``buffers`` are that payload's out-of-band buffers.
        Messages from one thread to one node go out in the order they were sent."""
        if target.node_id == self.node_id:
            if msg[0] == MSG_CALL and type(msg[3]) is tuple:
                msg = serialization.loads(serialization.dumps_envelope(msg))   # no sharing
            self._hand_over_local(msg, buffers or ())
            return
        if buffers is None:
            meta, bufs = serialization.dumps(msg, what)
        else:
            meta, bufs = serialization.dumps_envelope(msg), buffers
        if bufs or len(meta) > CHECK_LIMITS_OVER:
            check_frame_limits(len(meta), bufs)      # FrameError here, not at the peer
        self._send_encoded(target, meta, bufs)

    def _hand_over_local(self, msg: tuple, buffers) -> None:
        """A message to this node itself: dispatched on the loop. It counts as written
        (``connection.WRITE_HOOK``: telemetry dates the calls sent so far)."""
        if (hook := connection.WRITE_HOOK) is not None:
            hook()
        self.call_soon(self._dispatch_local, msg, buffers)

    def _send_encoded(self, target: NodeRef, meta: bytes, bufs: list) -> None:
        """Send one encoded frame (as ``send``); to this node itself it is decoded and
        dispatched on the loop."""
        if target.node_id == self.node_id:
            self._hand_over_local(serialization.loads(meta), bufs)
            return
        p = self._peers.get(target.node_id) or self.peer(target)
        conn = p.conn
        if conn is not None and not p.backlog and not conn.closed:
            try:
                if bufs:
                    conn.send_frame(meta, bufs, cork=len(p.inflight) > 1)
                else:
                    conn.send_msg(meta, len(p.inflight) > 1)
                return
            except ConnectionClosed:
                conn = None     # closed under us: nothing was written; treat as not connected
        if p.lost is not None and (conn is None or conn.closed):
            raise p.lost
        p.backlog.append((meta, bufs))
        self.call_soon(self._flush_backlog, p)

    def call_actor(self, target: NodeRef, actor_id: str, endpoint: str, payload: tuple,
                   rank: int, extent_items: tuple) -> Future:
        """Send a MSG_CALL whose ``payload`` (args, kwargs) holds builtin values only, with
        a fresh reply port; a Future of the reply. Thread-safe.

        The path every pipelined call takes, so the connected case is written out here
        rather than through ``reply_future`` and ``send``."""
        p = self._peers.get(target.node_id)
        conn = p.conn if p is not None else None
        if conn is not None and not p.backlog:
            fut = Future()
            pid = next(self._port_ids)
            self._replies[pid] = (fut, p)
            inflight = p.inflight
            inflight.add(pid)
            # call_msg() and call_payload_size() written out: every pipelined call passes
            # here, and two Python calls are ~2 % of its CPU
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
        fut, pid = self.reply_future(target)
        try:
            self.send(target, call_msg(actor_id, endpoint, payload, pid, rank, extent_items),
                      buffers=[])
        except (SupervisionError, ConnectionError) as e:
            self.close_port(pid)
            fut.set_exception(e)
        except FrameError as e:
            self.close_port(pid)
            fut.set_exception(serialization.SerializationError(
                f"the arguments of {endpoint} could not be sent: {e}"))
        return fut

    def poll_for_rest(self, fanin: Future, window: float | None = None) -> None:
        """Keep this loop polling its sockets, instead of sleeping between replies, until
        ``fanin`` settles or ``window`` seconds (``HPCMESH_FANIN_POLL_US``) have passed.

        Called when the first reply of a call() to several actors is in: the others are
        usually a few tens of µs behind. Sleeping between them costs a wake-up per reply,
        paid by the replying actor (an interprocessor interrupt, ~8 µs here) and by this
        thread; a fan-in over 4 actors takes ~10 % less time when the rest is polled for.
        Each turn yields the core (``sched_yield``) to whatever else is runnable on it, so
        the polling takes no time from the actors, only idle time; it is bounded by the
        window, so a slow member costs at most that much CPU.

        Only while somebody waits for ``fanin`` (``await`` or ``get()`` registered): a
        caller still running, for example still sending the fan-out when the first reply
        is in, would compete with the polling for the GIL and the core (measured: that
        undoes the gain). So it does nothing off the loop thread, where the one setting
        the first result is the caller itself."""
        window = FANIN_POLL_WINDOW if window is None else window
        if (window <= 0 or threading.get_ident() != self.loop_tid or fanin.done()
                or not fanin.waited_on()):
            return
        self._fanins.append((fanin, time.perf_counter() + window))
        if not self._polling:
            self._polling = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        """One polling turn: a ready callback makes the loop's next wait for I/O a poll."""
        now = time.perf_counter()
        self._fanins = [f for f in self._fanins if not f[0].done() and f[1] > now]
        if self._fanins and not self.closed:
            _yield_core()
            self.loop.call_soon(self._poll)
        else:
            self._fanins.clear()
            self._polling = False

    def _flush_backlog(self, p: Peer) -> None:
        """Loop thread: send queued frames if connected, else dial."""
        conn = p.conn
        if conn is not None and not conn.closed:
            backlog = p.backlog
            try:
                while backlog:
                    meta, bufs = backlog[0]
                    conn.send_frame(meta, bufs)   # into the connection's queue first ...
                    backlog.popleft()             # ... then off the backlog: order is kept
            except ConnectionClosed:
                pass   # the close handler decides what happens to the rest
            return
        if not p.backlog:
            return
        if p.lost is not None:
            self._drop_backlog(p)
        elif p.dialing is None:
            p.dialing = self.loop.create_task(self._dial_peer(p))

    def _drop_backlog(self, p: Peer) -> None:
        if p.backlog:
            log.warning("dropping %d message(s) for unreachable node %s: %s", len(p.backlog),
                        p.ref.node_id[:8] if p.ref else "?", p.lost)
            p.backlog.clear()

    async def _dial_peer(self, p: Peer) -> None:
        try:
            try:
                await self.connect_first(p.ref.addresses if p.ref else (),
                                         expect=p.ref.node_id if p.ref else None)
                return
            except Exception as e:  # noqa: BLE001 - every address failed
                why = str(e)
            exc = SupervisionError(f"cannot reach node {p.ref.node_id[:8] if p.ref else '?'}: "
                                   f"{why}")
            if p.inflight:
                # A dead process refuses connections before its exit report arrives; give the
                # precise report a moment to win, as when a live connection drops.
                self.loop.call_later(LOST_PEER_REPORT_WAIT, self._mark_lost, p, exc, False)
            else:
                self._mark_lost(p, exc, immediate=True)
        finally:
            p.dialing = None

    async def connect(self, address: str, expect: str | None = None,
                      timeout: float = 10.0, secret: bytes | None = None) -> Connection:
        """Dial an address, authenticate, exchange hellos; returns the connection.

        ``secret`` overrides the node's own for this connection (a client
        reattaching to a job started under another secret)."""
        sock, leftover, session = await dial(self.loop, address, secret or self.secret, timeout,
                                             self._client_tls())
        waiter = self.loop.create_future()
        conn = self._adopt(sock, address, leftover, hello_waiter=waiter, tls=session)
        self._send_hello(conn)
        peer_id = await asyncio.wait_for(waiter, timeout)
        if expect is not None and peer_id != expect:
            conn.close()
            raise ConnectionError(f"{address} is node {peer_id[:8]}, not the expected {expect[:8]}")
        return conn

    async def connect_first(self, addresses: list[str] | tuple[str, ...], expect: str | None = None,
                            timeout: float = 10.0, secret: bytes | None = None,
                            stagger: float = 0.25,
                            on_error: Callable[[str, str], None] | None = None
                            ) -> tuple[str, Connection]:
        """Probe addresses and keep the first that completes the handshake.

        Attempts start in the advertised order, each ``stagger`` seconds after the one
        before (or at once when it fails), so a blackholed first address costs a
        quarter second, not a whole connect timeout. Returns (address, connection);
        raises ConnectionError naming every address and why it failed."""
        addresses = list(addresses)
        if not addresses:
            raise ConnectionError("no address to connect to")
        errors: dict[str, str] = {}
        pending: dict[asyncio.Task, str] = {}
        winner: tuple[str, Connection] | None = None
        nxt = 0
        deadline = self.loop.time() + timeout
        try:
            while winner is None and (nxt < len(addresses) or pending):
                if nxt < len(addresses):
                    addr = addresses[nxt]
                    nxt += 1
                    left = max(0.1, deadline - self.loop.time())
                    pending[self.loop.create_task(
                        self.connect(addr, expect=expect, timeout=left, secret=secret))] = addr
                wait = stagger if nxt < len(addresses) else max(0.0, deadline - self.loop.time())
                done, _ = await asyncio.wait(pending, timeout=wait,
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    addr = pending.pop(t)
                    exc = t.exception()
                    if exc is None and winner is None:
                        winner = (addr, t.result())
                    elif exc is None:
                        t.result().close()
                    else:
                        errors[addr] = f"{type(exc).__name__}: {exc}" if str(exc) else \
                            type(exc).__name__
                        if on_error is not None:
                            on_error(addr, errors[addr])
                if not done and nxt >= len(addresses) and self.loop.time() >= deadline:
                    break
        finally:
            for t, addr in pending.items():
                t.cancel()
                errors.setdefault(addr, f"no handshake within {timeout:.0f} s")
        if winner is None:
            raise ConnectionError("cannot connect to any of " + "; ".join(
                f"{a} ({errors.get(a, 'not tried')})" for a in addresses))
        return winner

    def _send_hello(self, conn: Connection) -> None:
        meta, bufs = serialization.dumps(hello_msg(self.node_id, self.addresses, self.info))
        conn.send_frame(meta, bufs)

    def _on_accept(self, sock, peer_name: str, leftover: bytes, tls=None) -> None:
        conn = self._adopt(sock, peer_name, leftover, tls=tls)
        self._send_hello(conn)

    def _adopt(self, sock, peer_name: str, leftover: bytes, hello_waiter=None,
               tls=None) -> Connection:
        conn = Connection(self.loop, sock, peer_name, self._on_frames, self._on_conn_closed,
                          self.loop_tid, leftover, tls=tls)
        conn.info["hello_waiter"] = hello_waiter
        return conn

    # -- receiving -------------------------------------------------------------------
    def _on_frames(self, conn: Connection, frames: list) -> None:
        self._handling_frames = True
        try:
            self._handle_frames(conn, frames)
        finally:
            self._handling_frames = False
            self.in_batch = False
            # Replies produced while handling these frames leave now, in one write per
            # connection, rather than one loop turn later.
            dirty = self._replied
            while dirty:
                dirty.pop().flush_now()

    def _handle_frames(self, conn: Connection, frames: list) -> None:
        if len(frames) == 1:
            self._handle_frame_list(conn, frames)
            return
        rest = deque(frames)    # what take_unhandled_frames() may take from it
        self._unhandled.append((conn, rest))
        try:
            self._handle_frame_list(conn, _taken(rest))
        finally:
            self._unhandled.pop()

    def take_unhandled_frames(self) -> list[tuple[Connection, list]]:
        """A call paused while its frame was handled (a breakpoint, the loop turning
        inside it): the frames read with it and not handled yet, taken, in order, for the
        debugger to hand to the loop (``_on_frames``) ahead of any later read: else they
        would wait for the pause to end, and run after frames read later."""
        out = []
        for conn, rest in self._unhandled:
            if rest:
                out.append((conn, list(rest)))
                rest.clear()
        return out

    def _handle_frame_list(self, conn: Connection, frames) -> None:
        for fr in frames:
            if fr.dropped:
                try:
                    if not self._fail_dropped(conn, fr):
                        return
                except Exception:  # noqa: BLE001 - as _dispatch: the other frames go on
                    log.exception("error failing a message dropped from %s", conn.peer)
                continue
            try:
                if fr.count == 1:
                    msgs = (serialization.loads(fr.meta, fr.buffers),)
                else:
                    msgs = serialization.loads_batch(fr.meta, fr.count)
            except Exception as e:  # noqa: BLE001
                log.warning("closing connection from %s: undecodable message (%s: %s)",
                            self._conn_name(conn), type(e).__name__, e)
                conn.close(e)
                return
            origin = conn.info.get("peer_id")
            self.in_batch = batch = fr.count > 1
            # a batch carries no buffers; what goes instead tells each message its share of
            # the frame's bytes (the telemetry's ``messages.bytes``: nothing to compute)
            buffers = BatchShare(len(fr.meta) // fr.count) if batch else fr.buffers
            for msg in msgs:
                if type(msg) is not tuple or not msg:
                    log.warning("closing connection from %s: not a protocol message (%s)",
                                self._conn_name(conn), type(msg).__name__)
                    conn.close(ConnectionClosed(f"{conn.peer} sent a malformed message"))
                    return
                if msg[0] == MSG_HELLO:
                    if len(msg) != 4 or type(msg[1]) is not str or not isinstance(msg[3], dict):
                        log.warning("closing connection from %s: malformed hello", conn.peer)
                        conn.close(ConnectionClosed(f"{conn.peer} sent a malformed hello"))
                        return
                    self._on_hello(conn, msg)
                    origin = conn.info.get("peer_id")
                    continue
                try:
                    self._dispatch(msg, origin, buffers)
                except Exception as e:  # noqa: BLE001 - a bad message must not kill the node
                    problem = layout_problem(msg)
                    if problem is None:         # a well-formed message: a bug here
                        log.exception("error handling a message from %s", self._conn_name(conn))
                        continue
                    # the peer's doing (SPEC §7: a malformed frame closes that connection
                    # only): one line naming it, no traceback of this side's code
                    log.warning("closing connection from %s: malformed message (%s; %s)",
                                self._conn_name(conn), problem, describe_exception(e))
                    conn.close(ConnectionClosed(f"{conn.peer} sent a malformed message"))
                    return

    def _fail_dropped(self, conn: Connection, fr) -> bool:
        """A frame whose buffer could not be allocated here (the decoder read past it): fail
        the one call or result it carried. Its envelope holds no buffers for calls and
        results (their payload is pickled apart), so it still says whom to tell. Any other
        message cannot be answered: the connection closes, naming why. False if closed."""
        here = self.name or self.role
        what = (f"a buffer of {fr.dropped} bytes could not be allocated on {here} (host "
                f"{socket.gethostname()}, pid {os.getpid()}): out of memory")
        try:
            msg = serialization.loads(fr.meta) if fr.count == 1 else None
        except Exception:  # noqa: BLE001 - its envelope needed the buffers: not a call
            msg = None
        origin = conn.info.get("peer_id")
        if type(msg) is tuple and len(msg) >= 5 and msg[0] == MSG_CALL:
            log.warning("call of %s from %s not run: %s", msg[2], self._peer_name(origin), what)
            self.reply_to(origin, msg[4], Failure(MessageNotReceived(
                f"the arguments of {msg[2]} did not arrive: {what}; the call was not run "
                f"(send smaller pieces, or give that process more memory)")))
            return True
        if type(msg) is tuple and len(msg) == 3 and msg[0] == MSG_RESULT:
            log.warning("a value from %s dropped: %s", self._peer_name(origin), what)
            self._deliver_local(msg[1], Failure(MessageNotReceived(
                f"a value from {self._peer_name(origin)} (a result, or a message to a port) "
                f"did not arrive: {what} (send smaller pieces, or give this process more "
                f"memory)")))
            return True
        err = ConnectionClosed(f"out of memory reading from {conn.peer}: {what}; the "
                               f"connection is closed")
        log.warning("%s", err)
        conn.close(err)
        return False

    def _on_hello(self, conn: Connection, msg: tuple) -> None:
        _, peer_id, addresses, info = msg
        ref = NodeRef(peer_id, tuple(addresses))
        p = self.peer(ref)
        if p.ref is None or not p.ref.addresses:
            p.ref = ref
        conn.info["peer_id"] = peer_id
        conn.info["peer_info"] = info
        if p.conn is None or p.conn.closed:
            p.conn = conn
            p.lost = None
        elif p.conn is not conn:
            # A second connection to the same node (both dialed at once, or several
            # addresses probed): read from it, but keep sending on the first, so that
            # messages from here to there stay on one connection, in order.
            p.extras.append(conn)
        if p.backlog:
            self._flush_backlog(p)
        w = conn.info.pop("hello_waiter", None)
        if w is not None and not w.done():
            w.set_result(peer_id)
        for cb in list(self.on_peer_hello):
            try:
                cb(self, ref, info, conn)
            except Exception:  # noqa: BLE001 - one bad hook must not stop the others
                log.exception("error in a peer-hello hook")

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
            try:
                value = serialization.loads(msg[2], buffers)
            except Exception as e:  # noqa: BLE001 - fails this one call, not the connection
                value = Failure(serialization.SerializationError(
                    f"a result arrived from {self._peer_name(origin)} but cannot be "
                    f"unpickled here: {describe_exception(e)}. A result must unpickle on the "
                    f"caller (an exception class whose __init__ takes other arguments than "
                    f"it passes to Exception.__init__ does not; return plain data)"))
            self._deliver_local(msg[1], value)
        elif kind == MSG_FAIL:
            self._deliver_local(msg[1], Failure(msg[2]))
        elif kind == MSG_RPC:
            self._handle_rpc(msg)
        else:
            log.warning("unknown message kind %r", kind)

    @staticmethod
    def _conn_name(conn: Connection) -> str:
        """The peer of ``conn`` for a log line: as its hello named it (name, host, pid), else
        the other end of its socket."""
        peer_id = conn.info.get("peer_id")
        return describe_peer(peer_id, conn.info.get("peer_info")) if peer_id else conn.peer

    def _peer_name(self, node_id: str | None) -> str:
        """``name (host, pid N)`` of a peer from its hello, for messages a user reads."""
        if node_id is None or node_id == self.node_id:
            return "this process"
        p = self._peers.get(node_id)
        info = p.conn.info.get("peer_info") if p is not None and p.conn is not None else None
        return describe_peer(node_id, info)

    def _handle_rpc(self, msg: tuple) -> None:
        _, service, args, reply = msg
        fn = self.services.get(service)
        if fn is None:
            self._reply_error(reply, LookupError(
                f"node {self.name or self.role} has no service {service!r}; "
                f"known: {', '.join(sorted(self.services))}"))
            return
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001
            self._reply_error(reply, e)
            return
        if asyncio.iscoroutine(result):
            task = self.loop.create_task(result)

            def done(t: asyncio.Task) -> None:
                if t.cancelled():
                    self._reply_error(reply, RuntimeError(f"service {service} was cancelled"))
                elif t.exception() is not None:
                    self._reply_error(reply, t.exception())
                else:
                    self.reply(reply, t.result())
            task.add_done_callback(done)
        else:
            self.reply(reply, result)

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
                        # deliver_msg() written out: every reply of a pipelined caller
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

    # -- supervision -----------------------------------------------------------------
    def _on_conn_closed(self, conn: Connection, exc: BaseException | None) -> None:
        w = conn.info.pop("hello_waiter", None)
        if w is not None and not w.done():
            w.set_exception(exc or ConnectionClosed(f"{conn.peer} closed during hello"))
        peer_id = conn.info.get("peer_id")
        if peer_id is None or conn.info.get("superseded"):
            return
        p = self._peers.get(peer_id)
        if p is None:
            return
        if conn in p.extras:
            p.extras.remove(conn)
        if p.conn is not conn:
            return
        while p.extras:             # another connection to that node is still up: use it
            spare = p.extras.pop(0)
            if not spare.closed:
                p.conn = spare
                self._flush_backlog(p)
                return
        p.conn = None
        # named by what the peer said in its hello (name, host, pid); conn.peer is only the
        # other end of the socket (an address, or a Unix peer's pid and uid)
        reason = SupervisionError(f"connection to {describe_peer(peer_id, conn.info.get('peer_info'))}"
                                  f" lost: {exc or 'closed'}")
        for cb in list(self.on_peer_closed):
            try:
                cb(self, peer_id, exc)
            except Exception:  # noqa: BLE001 - pending work below must still be failed
                log.exception("error in a peer-closed hook")
        if p.inflight and not self.closed:
            self.loop.call_later(LOST_PEER_REPORT_WAIT, self._mark_lost, p, reason, False)
        elif p.lost is None:
            p.lost = reason

    def _mark_lost(self, p: Peer, exc: BaseException, immediate: bool) -> None:
        if p.conn is not None and not p.conn.closed:
            return   # reconnected meanwhile
        if p.lost is None or immediate:
            p.lost = exc
        self._fail_inflight(p, p.lost)

    def _fail_inflight(self, p: Peer, exc: BaseException) -> None:
        """Fail every reply port waiting on ``p`` (loop thread; ``p.lost`` already set)."""
        self._drop_backlog(p)
        self.peers.fail_inflight(p, exc, self._deliver_local)

    def fail_peer(self, peer_id: str, exc: BaseException) -> None:
        """Fail everything pending on a peer now (a precise exit report arrived)."""
        p = self._peers.get(peer_id)
        if p is None:
            p = self._peers.setdefault(peer_id, Peer(None))
        p.lost = exc
        extras, p.extras = p.extras, []
        for conn in [p.conn, *extras]:
            if conn is not None:
                conn.info["superseded"] = True
                conn.close()
        p.conn = None
        self._fail_inflight(p, exc)

    def ref_of(self, node_id: str) -> NodeRef:
        """How to reach node ``node_id``: this node, a peer we know the addresses of, or
        its id alone (a peer that has not said hello yet: replies then wait for it)."""
        return self.ref if node_id == self.node_id else self.peers.ref_of(node_id)

    def load(self, node_id: str) -> int:
        """Replies this node still awaits from ``node_id`` (``choose()`` picks the least)."""
        return self.peers.load(node_id)

    def peer_connected(self, peer_id: str) -> bool:
        return self.peers.connected(peer_id)

    # -- a call that pauses inside frame handling (runtime/debugger.py) -----------------
    def pause_frame_handling(self) -> tuple[bool, bool]:
        """The call being handled from a read pauses, with the loop turning inside it (a
        breakpoint in an async endpoint): replies stop being held back for the end of the
        read, which waits for the pause, and those held so far leave now. Returns what
        :meth:`resume_frame_handling` puts back when the call goes on. The frames of the
        read not handled yet: :meth:`take_unhandled_frames`."""
        paused = self._handling_frames, self.in_batch
        self._handling_frames = self.in_batch = False
        held = self._replied
        while held:
            held.pop().flush_now()
        return paused

    def resume_frame_handling(self, paused: tuple[bool, bool]) -> None:
        self._handling_frames, self.in_batch = paused

    def handle_frames(self, conn: Connection, frames: list) -> None:
        """Handle ``frames`` read from ``conn`` as its reader does: frames taken with
        :meth:`take_unhandled_frames` are handed back to the loop through here."""
        self._on_frames(conn, frames)

    # -- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        """Close listeners and connections (call on the loop thread)."""
        if self.closed:
            return
        self.closed = True
        for lst in self._listeners:
            lst.close()
        for p in list(self._peers.values()):
            for conn in [p.conn, *p.extras]:
                if conn is not None:
                    conn.close()

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


def _taken(rest: deque):
    """``rest``'s items, each removed as it is handed out (what is left can be taken over)."""
    while rest:
        yield rest.popleft()
