"""A node's connections: how they are made, greeted and lost.

``Node`` routes messages; this module gives it the connections to route them on. It
owns the lifecycle of each: listening (with TLS when asked), dialing a peer for the first
message queued to it, trying a peer's addresses in turn (``connect_first``), the hello
that names each end, adopting a second connection to the same peer, and the loss of one
(its peer's pending replies failed after a grace for a precise exit report). It knows
the node only through what it is given (the peer table, the node's id and hello, a
callback for frames and one for failing replies), never the class itself.

Where the bytes go is the transport backend's business (``transport/backend.py``):
``memory://`` addresses make the same connections with no socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable

from ..errors import HpcmeshError
from ..private_files import runtime_dir
from ..settings import env_number
from ..transport import backend, serialization, tls
from ..transport.addresses import Address, parse_address, split_alias
from ..transport.connection import Connection, ConnectionClosed, HandshakeClosed
from ..transport.handshake import HandshakeBusy
from .errors import SupervisionError
from .messages import NodeRef, hello_msg
from .peers import Peer, PeerTable, unsettle

log = logging.getLogger("hpcmesh.runtime")

#: How long a caller waits for a precise exit report after a connection drops
#: before failing pending work with a generic "connection lost".
LOST_PEER_REPORT_WAIT = env_number("HPCMESH_LOST_PEER_WAIT", 1.0)

#: the longest path a Unix socket can be bound to (108 bytes with the final NUL)
UNIX_PATH_MAX = 107


def describe_peer(node_id: str, info: dict | None) -> str:
    """``name (host, pid N)`` of a peer from its hello, for messages a user reads."""
    if not info:
        return f"node {node_id[:8]}"
    return (f"{info.get('name') or info.get('role') or 'node ' + node_id[:8]} "
            f"({info.get('host', '?')}, pid {info.get('pid', '?')})")


def describe_conn(conn: Connection) -> str:
    """The peer of ``conn`` for a log line: as its hello named it (name, host, pid), else
    the other end of its socket."""
    peer_id = conn.info.get("peer_id")
    return describe_peer(peer_id, conn.info.get("peer_info")) if peer_id else conn.peer


#: What a dial meets when a listener was there and closed it before the hellos: its cap of
#: connections in their handshake (the flood defence) closed it for room, or it found this
#: dialer's secret wrong (which the dialer cannot tell apart).
TURNED_AWAY = (HandshakeBusy, HandshakeClosed, ConnectionClosed, ConnectionResetError,
               BrokenPipeError)


class CannotConnect(HpcmeshError, ConnectionError):
    """``connect_first`` kept no connection: ``causes`` maps each address to what its
    attempt met (None: it did not finish in time, or was never started)."""

    def __init__(self, message: str, causes: dict[str, BaseException | None]):
        super().__init__(message)
        self.causes = causes

    @property
    def turned_away(self) -> bool:
        """A listener of the peer was there and closed an attempt (``TURNED_AWAY``)."""
        return any(isinstance(e, TURNED_AWAY) for e in self.causes.values())


def _retrieve(task: asyncio.Task) -> None:
    """Take a finished task's outcome (asyncio logs an exception nobody took)."""
    if not task.cancelled():
        task.exception()


class Links:
    """The connections of one node (its loop thread calls everything here, except
    ``connect``/``connect_first``, which are coroutines on that loop).

    ``owner`` is handed to the hello and closed hooks as their first argument (the node);
    ``on_frames(conn, frames)`` gets what each connection reads; ``deliver(port, value)``
    fails a reply port when its peer is lost."""

    def __init__(self, owner: Any, loop: asyncio.AbstractEventLoop, secret: bytes,
                 node_id: str, info: dict, peers: PeerTable, *,
                 on_frames: Callable[[Connection, list], None],
                 deliver: Callable[[int, Any], None]):
        self.owner = owner
        self.loop = loop
        self.secret = secret
        self.node_id = node_id
        self.info = info
        self.peers = peers
        self._on_frames = on_frames
        self._deliver = deliver
        self.loop_tid: int | None = None
        self.addresses: tuple[str, ...] = ()
        self._listeners: list = []
        self.tls: tls.TLSSettings | None = None
        self._tls_contexts: tuple | None = None
        #: run when a peer says hello: (node, peer_ref, info, conn)
        self.on_peer_hello: list[Callable] = []
        #: run when a peer is lost and what awaited it fails: (peer, exc)
        self.on_peer_failed: list[Callable] = []
        #: run when a peer's last connection closes: (node, peer_id, exc)
        self.on_peer_closed: list[Callable] = []
        self.closed = False

    # -- listening ---------------------------------------------------------------------
    @property
    def listeners(self) -> tuple:
        """The listeners bound so far (``listen``), in order."""
        return tuple(self._listeners)

    def listen(self, addresses: list[str], advertise_host: str | None = None) -> tuple[str, ...]:
        """Bind listeners; ``tcp://host:0`` picks an ephemeral port. Advertised in order.

        A wildcard listener (``0.0.0.0``/``::``) is advertised as ``advertise_host``:
        peers must be told an address they can dial, never the wildcard."""
        out = []
        for a in addresses:
            lst = backend.listen(self.loop, a, self.secret, self._on_accept, self._server_tls)
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
        return self.addresses

    def unix_address(self) -> str:
        path = os.path.join(runtime_dir(), self.node_id[:16] + ".sock")
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise ValueError(f"the Unix socket path {path} is over {UNIX_PATH_MAX} bytes, the "
                             f"limit of a socket's name: set HPCMESH_RUNTIME_DIR, "
                             f"XDG_RUNTIME_DIR or TMPDIR to a folder with a shorter path")
        return f"unix://{path}"

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

    # -- dialing ---------------------------------------------------------------------
    def flush_backlog(self, p: Peer) -> None:
        """Send what is queued for ``p`` if connected, else dial it (loop thread)."""
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
                                         expect=p.ref.node_id if p.ref else None,
                                         secret=p.secret)
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
        sock, leftover, session = await backend.dial(self.loop, address, secret or self.secret,
                                                     timeout, self._client_tls())
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
        raises CannotConnect naming every address and why it failed.

        Attempts still in their handshake when one wins are cancelled (their sockets
        close before any hello). One that came up as well is kept, read, as a spare of
        the peer (``on_hello``): each side sends on the connection whose hello it read
        first, and the peer's may be this one, with messages already on their way
        (issue 30: closing it lost a spawn's first call, or a relayed one, for good)."""
        addresses = list(addresses)
        if not addresses:
            raise ConnectionError("no address to connect to")
        errors: dict[str, str] = {}
        causes: dict[str, BaseException | None] = dict.fromkeys(addresses)
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
                    if exc is None:
                        if winner is None:
                            winner = (addr, t.result())
                    else:
                        causes[addr] = exc
                        errors[addr] = f"{type(exc).__name__}: {exc}" if str(exc) else \
                            type(exc).__name__
                        if on_error is not None:
                            on_error(addr, errors[addr])
                if not done and nxt >= len(addresses) and self.loop.time() >= deadline:
                    break
        finally:
            for t, addr in pending.items():
                t.cancel()
                # one whose cancellation came as it finished ends on its own: its outcome
                # is not an error to log ("Task exception was never retrieved")
                t.add_done_callback(_retrieve)
                errors.setdefault(addr, f"no handshake within {timeout:.0f} s")
        if winner is None:
            raise CannotConnect("cannot connect to any of " + "; ".join(
                f"{a} ({errors.get(a, 'not tried')})" for a in addresses), causes)
        return winner

    # -- greeting ----------------------------------------------------------------------
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

    def on_hello(self, conn: Connection, msg: tuple) -> None:
        """A peer said who it is (``MSG_HELLO``, already checked for shape): it becomes
        the connection to send to it on, unless one is up already."""
        _, peer_id, addresses, info = msg
        ref = NodeRef(peer_id, tuple(addresses))
        p = self.peers.peer(ref)
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
            self.flush_backlog(p)
        w = conn.info.pop("hello_waiter", None)
        if w is not None and not w.done():
            w.set_result(peer_id)
        for cb in list(self.on_peer_hello):
            try:
                cb(self.owner, ref, info, conn)
            except Exception:  # noqa: BLE001 - one bad hook must not stop the others
                log.exception("error in a peer-hello hook")

    def peer_name(self, node_id: str | None) -> str:
        """``name (host, pid N)`` of a peer from its hello, for messages a user reads."""
        if node_id is None or node_id == self.node_id:
            return "this process"
        p = self.peers.get(node_id)
        info = p.conn.info.get("peer_info") if p is not None and p.conn is not None else None
        return describe_peer(node_id, info)

    # -- loss --------------------------------------------------------------------------
    def _on_conn_closed(self, conn: Connection, exc: BaseException | None) -> None:
        w = conn.info.pop("hello_waiter", None)
        if w is not None and not w.done():
            w.set_exception(exc or ConnectionClosed(f"{conn.peer} closed during hello"))
        peer_id = conn.info.get("peer_id")
        if peer_id is None or conn.info.get("superseded"):
            return
        p = self.peers.get(peer_id)
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
                self.flush_backlog(p)
                return
        p.conn = None
        # named by what the peer said in its hello (name, host, pid); conn.peer is only the
        # other end of its socket (an address, or a Unix peer's pid and uid)
        reason = SupervisionError(f"connection to {describe_conn(conn)} lost: "
                                  f"{exc or 'closed'}")
        for cb in list(self.on_peer_closed):
            try:
                cb(self.owner, peer_id, exc)
            except Exception:  # noqa: BLE001 - pending work below must still be failed
                log.exception("error in a peer-closed hook")
        if p.inflight and not self.closed:
            self.loop.call_later(LOST_PEER_REPORT_WAIT, self._mark_lost, p, reason, False)
        elif p.lost is None:
            self.peers.set_lost(p, reason)

    def _mark_lost(self, p: Peer, exc: BaseException, immediate: bool) -> None:
        if p.conn is not None and not p.conn.closed:
            return   # reconnected meanwhile
        if p.lost is None or immediate:
            self.peers.set_lost(p, exc)
        self._fail_inflight(p, p.lost)

    def _fail_inflight(self, p: Peer, exc: BaseException) -> None:
        """Fail every reply port waiting on ``p`` (``p.lost`` already set)."""
        self._drop_backlog(p)
        self.peers.fail_inflight(p, exc, self._deliver)
        for cb in self.on_peer_failed:
            cb(p, exc)

    def fail_peer(self, peer_id: str, exc: BaseException) -> None:
        """Fail everything pending on a peer now (a precise exit report arrived)."""
        p = self.peers.by_id.get(peer_id)
        if p is None:
            p = self.peers.by_id.setdefault(peer_id, Peer(None))
        p.lost = exc
        extras, p.extras = p.extras, []
        for conn in [p.conn, *extras]:
            if conn is not None:
                conn.info["superseded"] = True
                conn.close()
        p.conn = None
        if p.settled:       # now, not with ``lost`` above: a cast that checked it in between
            unsettle()      # found it still connected (live)
        self._fail_inflight(p, exc)

    def close(self) -> None:
        """Close listeners and connections (loop thread)."""
        if self.closed:
            return
        self.closed = True
        for lst in self._listeners:
            lst.close()
        for p in self.peers.values():
            for conn in [p.conn, *p.extras]:
                if conn is not None:
                    conn.close()
