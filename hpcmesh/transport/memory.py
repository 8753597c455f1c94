"""The in-memory twin of the socket backend: ``memory://name`` addresses.

The bytes stay real, only the sockets go. Two nodes in one process connect through a
pair of ``MemoryStream`` ends that behave as non-blocking stream sockets do (partial
sends, ``BlockingIOError`` when the peer's inbox is full or empty, ``recv`` of 0 once the
peer closed), so ``Connection`` runs its own framing, batching, back-pressure and close
code over them unchanged; the hpcmesh handshake runs too, through its state machine, so a
wrong secret is refused here as on a socket. What this backend leaves out: the kernel
(no syscalls, no fds), TLS, and other processes. Tests of dispatch, ordering and replies
run on it in milliseconds with no listener to bind and nothing to clean up.

Readiness is level-triggered, as a selector's is: a watched end whose inbox holds bytes
(or whose peer closed) has its reader called on its loop, again and again until drained.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading
from typing import Callable

from .addresses import Address
from .handshake import Handshake, HandshakeError

#: What one end's inbox holds before a send gets BlockingIOError (a socket's buffer).
INBOX_BYTES = 4 * 1024 * 1024

_listeners: dict[str, "MemoryListener"] = {}
_registry_lock = threading.Lock()
_dial_ids = itertools.count(1)


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    """Run ``fn`` on ``loop`` soon, from whichever thread asks."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:        # that loop is closed: nobody is left to tell
        pass


class MemoryStream:
    """One end of an in-memory stream: a socket's face (``recv_into``, ``send``,
    ``sendmsg``, ``close``) over the other end's inbox, plus ``readiness(loop)``, which
    ``Connection`` asks a stream that is not a socket for."""

    __slots__ = ("name", "peer", "_inbox", "_lock", "_closed", "_eof", "_loop",
                 "_reader", "_writer", "_read_due", "_write_due")

    def __init__(self, name: str):
        self.name = name
        self.peer: MemoryStream | None = None
        self._inbox = bytearray()
        self._lock = threading.Lock()      # guards this end's inbox and its watchers
        self._closed = False               # this end closed
        self._eof = False                  # the other end closed: recv gives 0 when drained
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: Callable[[], None] | None = None
        self._writer: Callable[[], None] | None = None
        self._read_due = False             # a reader call is scheduled
        self._write_due = False

    @staticmethod
    def pair(name_a: str, name_b: str) -> tuple["MemoryStream", "MemoryStream"]:
        a, b = MemoryStream(name_a), MemoryStream(name_b)
        a.peer, b.peer = b, a
        return a, b

    # -- the socket's face ----------------------------------------------------------
    def recv_into(self, view) -> int:
        with self._lock:
            inbox = self._inbox
            if not inbox:
                if self._eof or self._closed:
                    return 0
                raise BlockingIOError(errno.EAGAIN, "nothing to read")
            n = min(len(view), len(inbox))
            view[:n] = inbox[:n]
            del inbox[:n]
        peer = self.peer
        if peer is not None:
            peer._schedule_write()          # room again for a writer that waited
        return n

    def send(self, data) -> int:
        return self.sendmsg((data,))

    def sendmsg(self, buffers) -> int:
        peer = self.peer
        if self._closed:
            raise OSError(errno.EBADF, "send on a closed memory stream")
        with peer._lock:
            if peer._closed:
                raise BrokenPipeError(errno.EPIPE, f"{peer.name} closed the stream")
            room = INBOX_BYTES - len(peer._inbox)
            if room <= 0:
                raise BlockingIOError(errno.EAGAIN, "the peer's inbox is full")
            sent = 0
            for buf in buffers:
                view = memoryview(buf).cast("B")
                take = min(room - sent, view.nbytes)
                peer._inbox += view[:take]
                sent += take
                if sent >= room:
                    break
        peer._schedule_read()
        return sent

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reader = self._writer = None
            self._inbox.clear()
        peer = self.peer
        if peer is not None:
            with peer._lock:
                peer._eof = True
            peer._schedule_read()
            peer._schedule_write()      # a writer waiting on us learns of the close

    # -- readiness (what a selector gives a socket) ----------------------------------
    def readiness(self, loop: asyncio.AbstractEventLoop) -> "MemoryStream":
        self._loop = loop
        return self

    def on_readable(self, cb: Callable[[], None]) -> None:
        self._reader = cb
        if self._inbox or self._eof:
            self._schedule_read()

    def on_writable(self, cb: Callable[[], None]) -> None:
        self._writer = cb
        self._schedule_write()

    def writable_done(self) -> None:
        self._writer = None

    def stop(self) -> None:
        self._reader = self._writer = None

    def _schedule_read(self) -> None:
        with self._lock:
            if self._read_due or self._reader is None or self._loop is None:
                return
            self._read_due = True
        _call_on(self._loop, self._fire_read)

    def _fire_read(self) -> None:
        with self._lock:
            self._read_due = False
            reader = self._reader
        if reader is None:
            return
        reader()
        if self._inbox or (self._eof and not self._closed):     # level-triggered
            self._schedule_read()

    def _schedule_write(self) -> None:
        peer = self.peer
        with self._lock:
            if self._write_due or self._writer is None or self._loop is None:
                return
            if peer is not None and not peer._closed and len(peer._inbox) >= INBOX_BYTES:
                return                  # still full: the reader's next recv calls again
            self._write_due = True
        _call_on(self._loop, self._fire_write)

    def _fire_write(self) -> None:
        with self._lock:
            self._write_due = False
            writer = self._writer
        if writer is not None:
            writer()

    def __repr__(self) -> str:
        return f"<MemoryStream {self.name}{' closed' if self._closed else ''}>"


class MemoryListener:
    """A listener on ``memory://name`` in this process: dials to that name are
    authenticated with the secret and handed to ``on_accept`` on the listener's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address: Address, secret: bytes,
                 on_accept: Callable):
        self.loop = loop
        self.address = address
        self.secret = secret
        self.on_accept = on_accept         # as the socket Listener's
        with _registry_lock:
            if address.path in _listeners:
                raise OSError(errno.EADDRINUSE, f"{address} is already listened on in this "
                                                f"process")
            _listeners[address.path] = self

    def accept(self, stream: MemoryStream, name: str) -> None:
        _call_on(self.loop, self.on_accept, stream, name, b"", None)

    def close(self) -> None:
        with _registry_lock:
            if _listeners.get(self.address.path) is self:
                del _listeners[self.address.path]


def _handshake(secret_dialer: bytes, secret_listener: bytes) -> None:
    """Run both sides of the hpcmesh handshake against each other (its state machine is
    I/O-free); raises HandshakeError as a socket dial would, naming which side refused."""
    dialer, listener = Handshake(secret_dialer, dialer=True), Handshake(secret_listener,
                                                                         dialer=False)
    out, side = dialer.initial(), listener
    while not (dialer.done and listener.done):
        if not out:
            raise HandshakeError("peer closed the connection during the handshake (check "
                                 "the job secret)")
        out, _ = side.receive(out)
        side = dialer if side is listener else listener


async def dial(address: Address, secret: bytes) -> tuple[MemoryStream, bytes, None]:
    """Connect to the in-process listener on ``address``; (stream, leftover, no TLS)."""
    with _registry_lock:
        listener = _listeners.get(address.path)
    if listener is None:
        raise ConnectionRefusedError(errno.ECONNREFUSED,
                                     f"nothing listens on {address} in this process")
    _handshake(secret, listener.secret)
    n = next(_dial_ids)
    ours, theirs = MemoryStream.pair(f"{address} dialer {n}", f"{address} accepted {n}")
    listener.accept(theirs, f"memory dialer {n}")
    return ours, b"", None
