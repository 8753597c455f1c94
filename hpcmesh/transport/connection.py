"""The thin I/O shell around the framing and handshake state machines.

A ``Connection`` owns one non-blocking socket and is driven by the event
loop's readiness callbacks (``add_reader``/``add_writer``) rather than an
asyncio transport: that lets us ``recv_into`` buffers the decoder chose and
``sendmsg`` scatter lists of out-of-band buffers without joining them.

Writes are thread-safe: a caller on another thread (a synchronous ``.get()``
user) writes its frame directly under a lock, which saves a thread handoff;
writes from the loop thread are batched once per loop pass. Small messages
queued together (replies written in one loop pass, a pipelining caller's
calls) travel as one batch frame.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import socket
import struct
import threading
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator

from ..settings import env_number
from .addresses import Address, parse_address, parse_bind_address
from .framing import (MAX_BATCH_COUNT, FrameDecoder, FrameError, encode_batch, encode_frame,
                      encode_lone)
from .handshake import BUSY, Handshake, HandshakeBusy, HandshakeError
from ..errors import HpcmeshError

if TYPE_CHECKING:
    import ssl

    from .tls import TLSSession

log = logging.getLogger("hpcmesh.transport")

_IOV_MAX = 512
_MAX_BATCH = 128
#: A batch of small messages is closed into a frame once it holds this many bytes.
_BATCH_BYTES = 256 * 1024
#: A caller thread writes its batch itself once it holds this many messages.
_CALLER_FLUSH = 256
_LONE_BYTES = 8192      # a lone message up to this size goes out joined, in one send()
HANDSHAKE_TIMEOUT = 10.0
#: Accepted connections that may be in their handshake at once; more are closed at once
#: (nobody needs the secret to open one, so they must not be able to use up the fds).
MAX_UNAUTHENTICATED = 128
#: Out of fds (EMFILE/ENFILE) or memory at accept: stop accepting this long, then retry.
ACCEPT_PAUSE = 0.25
#: A listener that turns connections away says so at most once per this many seconds.
ACCEPT_LOG_INTERVAL = 10.0
#: Failed handshakes logged one by one per ACCEPT_LOG_INTERVAL; past that, only counted.
DROP_LOG_BURST = 5
#: A dialer turned away with BUSY tries again after about this long, then twice as long
#: each time, up to BUSY_RETRY_MAX, until its timeout is spent. Hundreds of processes
#: retrying cost the machine (and the busy listener in it) in proportion to 1 / the cap.
BUSY_RETRY_FIRST = 0.02
BUSY_RETRY_MAX = 5.0
_BUSY_MESSAGE = ("the listener is busy: too many connections are in their handshake there "
                 "(a flood?)")
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: The first byte of a TLS record carrying a handshake (a ClientHello); the hpcmesh
#: handshake starts with its magic instead, so a listener tells them apart.
TLS_HANDSHAKE_BYTE = 0x16
#: Called (no arguments, the connection's lock held) before each write of frames to any
#: connection's socket, from whichever thread writes; None: nothing to call. The runtime's
#: telemetry sets it to date the calls queued by then (the transport knows nothing of it).
WRITE_HOOK: Callable[[], None] | None = None


class HandshakeClosed(HandshakeError):
    """The peer closed the connection before the handshake finished (which side had the
    wrong secret, if any, is known to the dialer)."""


class ConnectionClosed(HpcmeshError, ConnectionError):
    """The peer went away (or sent garbage and was dropped)."""


_NOTHING = memoryview(b"")
_TLS_READ = 256 * 1024      # ciphertext read per recv
_TLS_CHUNK = 256 * 1024     # plaintext encrypted per step


def _take(out: deque, limit: int) -> list:
    """Pop queued pieces from ``out`` up to about ``limit`` bytes; a bigger piece is split
    and its rest stays first in the queue."""
    taken, size = [], 0
    while out and size < limit:
        head = out[0]
        n = len(head) if isinstance(head, bytes) else memoryview(head).nbytes
        if size + n <= limit:
            taken.append(out.popleft())
            size += n
        else:
            view = memoryview(head).cast("B")
            rest = limit - size
            taken.append(view[:rest])
            out[0] = view[rest:]
            size = limit
    return taken


class _SelectorReadiness:
    """When a socket can be read or written, as the event loop's selector tells it."""

    __slots__ = ("loop", "fd")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket):
        self.loop = loop
        self.fd = sock.fileno()

    def on_readable(self, cb: Callable[[], None]) -> None:
        self.loop.add_reader(self.fd, cb)

    def on_writable(self, cb: Callable[[], None]) -> None:
        self.loop.add_writer(self.fd, cb)

    def writable_done(self) -> None:
        self.loop.remove_writer(self.fd)

    def stop(self) -> None:
        try:
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
        except (ValueError, OSError):
            pass


class Connection:
    """One authenticated stream to a peer: frames in, frames out. ``sock`` is a
    non-blocking socket, or a stream with a socket's face that brings its own readiness
    (``transport/memory.py``)."""

    __slots__ = ("loop", "sock", "peer", "_decoder", "_on_frames", "_on_close", "_lock", "_io",
                 "_out", "_flush_scheduled", "_writer_on", "_closed", "_loop_tid",
                 "_pending_frames", "_batch", "_batch_bytes", "info", "_tls", "_tls_out",
                 "_tls_in", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, peer: str,
                 on_frames: Callable, on_close: Callable, loop_tid: int,
                 leftover: bytes = b"", max_frame: int | None = None,
                 tls: TLSSession | None = None):
        self.loop = loop
        self.sock = sock
        self.peer = peer
        self._decoder = FrameDecoder(max_frame=max_frame) if max_frame else FrameDecoder()
        self._on_frames = on_frames
        self._on_close = on_close
        self._lock = threading.Lock()
        self._out: deque = deque()
        self._flush_scheduled = False
        self._writer_on = False
        self._closed = False
        self._loop_tid = loop_tid
        self._pending_frames = 0
        self._batch: list = []       # small pickled messages not yet framed, in send order
        self._batch_bytes = 0
        self._tls = tls                 # encrypt/decrypt through this (TCP with TLS on)
        self._tls_out = _NOTHING        # ciphertext encrypted and not yet written
        self._tls_in: bytearray | None = None   # the reused receive buffer for ciphertext
        self.info: dict = {}
        # a socket's readiness comes from the loop's selector; another stream (the memory
        # backend's) brings its own, with the same four calls
        self._io = (_SelectorReadiness(loop, sock) if isinstance(sock, socket.socket)
                    else sock.readiness(loop))
        if leftover:
            try:
                frames = self._decoder.feed(leftover)
            except FrameError as e:
                loop.call_soon(self.close, e)
                frames = []
            if frames:
                loop.call_soon(on_frames, self, frames)
        self._io.on_readable(self._on_readable)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def encrypted(self) -> bool:
        """Whether its frames go through TLS (TCP with TLS on)."""
        return self._tls is not None

    # -- reading ---------------------------------------------------------------
    def _on_readable(self) -> None:
        frames: list = []
        try:
            open_ = self._read_tls(frames) if self._tls is not None else self._read(frames)
        except (BlockingIOError, InterruptedError):
            open_ = True
        except FrameError as e:
            log.warning("dropping connection from %s: %s", self.peer, e)
            self.close(e)
            return
        except MemoryError:
            # Not a frame's buffer (the decoder drops a frame whose buffer cannot be had,
            # and the node fails the one message): the decoder's own memory. Close, so what
            # waits on this connection fails with the reason instead of hanging.
            err = ConnectionClosed(
                f"out of memory reading from {self.peer}: the connection is closed (send "
                f"smaller pieces, or give this process more memory)")
            log.warning("%s", err)
            if frames:                    # whole frames read before it still count
                self._on_frames(self, frames)
            self.close(err)
            return
        except OSError as e:        # ssl.SSLError included
            self.close(ConnectionClosed(f"connection to {self.peer} failed: {e}"))
            return
        if frames:
            self._on_frames(self, frames)
        if not open_:
            self.close(ConnectionClosed(f"peer {self.peer} closed the connection"))

    def _read(self, frames: list) -> bool:
        """Read what the socket has into the decoder; False once the peer has closed."""
        dec = self._decoder
        recv_into = self.sock.recv_into
        for _ in range(64):
            view = dec.next_buffer()
            n = recv_into(view)
            if n == 0:
                return False
            frames.extend(dec.advance(n))
            if n < view.nbytes:
                break
        return True

    def _read_tls(self, frames: list) -> bool:
        """Read ciphertext into one reused buffer (a fresh 256 KiB ``recv`` per read costs
        an allocation each time) and decrypt it straight into the decoder's buffer."""
        buf = self._tls_in
        if buf is None:
            buf = self._tls_in = bytearray(_TLS_READ)
        dec = self._decoder
        for _ in range(64):
            got = self.sock.recv_into(buf)
            if got == 0:
                return False
            data = memoryview(buf)[:got]
            with self._lock:    # the SSL object is shared with writers on other threads
                while True:
                    view = dec.next_buffer()
                    n = self._tls.decrypt_into(data, view)
                    data = b""
                    if n == 0:
                        break
                    frames.extend(dec.advance(n))
            if got < _TLS_READ:
                break
        return True

    # -- writing ---------------------------------------------------------------
    def send_msg(self, meta: bytes, cork: bool = False) -> None:
        """Queue one small message without out-of-band buffers; callable from any thread.

        Messages queued in the same loop pass (or while a pipelining caller keeps
        sending, ``cork``) share one batch frame; a lone request from another thread
        is written at once for the lowest latency."""
        self._queue(meta, len(meta), cork)

    def send_obj(self, msg: tuple, size: int, cork: bool = False,
                 flushed_by_caller: bool = False) -> None:
        """``send_msg`` for a message tuple of immutable builtin values (``size``: about
        its pickled bytes): queued as is and pickled with its whole batch, one ``dumps``
        per batch instead of one per message. ``flushed_by_caller``: on the loop thread,
        the caller calls ``flush_now`` soon, so no loop turn needs to be scheduled."""
        self._queue(msg, size, cork, flushed_by_caller)

    def _queue(self, item, size: int, cork: bool, flushed_by_caller: bool = False) -> None:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        on_loop = threading.get_ident() == self._loop_tid
        with self._lock:
            batch = self._batch
            if not (on_loop or cork or batch or self._out or self._writer_on):
                if size <= _LONE_BYTES:
                    self._send_lone(encode_lone(item))
                else:
                    self._out.extend(encode_batch([item]))
                    self._write_locked(foreign=True)
                return
            batch.append(item)
            self._batch_bytes += size
            if self._batch_bytes >= _BATCH_BYTES or len(batch) >= MAX_BATCH_COUNT:
                self._close_batch()
            elif not on_loop and len(batch) >= _CALLER_FLUSH and not self._writer_on:
                # A pipelining caller sends its own full batches: the loop thread may not
                # get the GIL for a while (up to the 5 ms switch interval) to do it.
                self._close_batch()
                self._write_locked(foreign=True)
                return
            if not self._flush_scheduled and not self._writer_on:
                if on_loop:
                    if flushed_by_caller:
                        return
                    self._flush_scheduled = True
                    self.loop.call_soon(self._flush)
                else:
                    self._flush_scheduled = True
                    self.loop.call_soon_threadsafe(self._flush)

    def send_frame(self, meta: bytes, buffers: list = (), cork: bool = False) -> None:
        """Queue one frame; callable from any thread.

        ``cork``: the caller has other messages in flight on this connection (it is
        pipelining), so hand the frame to the loop to send in a batch instead of paying
        a syscall per frame; a lone request is written at once for the lowest latency."""
        if not buffers:
            self.send_msg(meta, cork)
            return
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        parts = encode_frame(meta, buffers)
        if threading.get_ident() == self._loop_tid:
            with self._lock:
                if self._batch:
                    self._close_batch()
                self._out.extend(parts)
                self._pending_frames += 1
                if self._writer_on:
                    return
                if self._pending_frames >= _MAX_BATCH:
                    self._write_locked()
                elif not self._flush_scheduled:
                    self._flush_scheduled = True
                    self.loop.call_soon(self._flush)
            return
        with self._lock:
            if self._batch:
                self._close_batch()
            if self._out or self._writer_on or (cork and sum(map(len, parts)) < 65536):
                self._out.extend(parts)
                if not self._flush_scheduled and not self._writer_on:
                    self._flush_scheduled = True
                    self.loop.call_soon_threadsafe(self._flush)
                return
            self._out.extend(parts)
            self._write_locked(foreign=True)

    def _close_batch(self) -> None:
        """Lock held: turn the queued small messages into one frame, behind earlier frames."""
        self._out.extend(encode_batch(self._batch))
        self._batch = []
        self._batch_bytes = 0
        self._pending_frames += 1

    def flush_now(self) -> None:
        """Loop thread: write what is queued now instead of at the end of the loop pass
        (a lone reply should not wait for the next turn of the loop)."""
        if (self._batch or self._out or self._tls_out) and not self._writer_on and not self._closed:
            with self._lock:
                batch = self._batch
                if (len(batch) == 1 and not self._out and not self._writer_on
                        and self._batch_bytes <= _LONE_BYTES):
                    self._batch = []            # the usual case: one reply, sent joined
                    self._batch_bytes = 0
                    self._send_lone(encode_lone(batch[0]), foreign=False)
                    return
                if batch:
                    self._close_batch()
                if not self._writer_on:
                    self._write_locked()

    def _flush(self) -> None:
        with self._lock:
            self._flush_scheduled = False
            if self._batch:
                self._close_batch()
            if not self._writer_on and not self._closed:
                self._write_locked()

    def _send_lone(self, data: bytes, foreign: bool = True) -> None:
        """Lock held, nothing queued: one small frame (a caller's lone request, or a lone
        reply), written at once with one ``send()``. What the socket does not take (or an
        error) goes through ``_write_locked``, which queues it for the loop's writer (or
        closes); under TLS all of it does, to be encrypted. ``foreign``: not on the loop
        thread."""
        if (hook := WRITE_HOOK) is not None:
            hook()
        n = 0
        if self._tls is None:
            try:
                n = self.sock.send(data)
            except OSError:     # full (BlockingIOError), or failed: _write_locked meets
                pass            # a real error again and closes the connection
        if n < len(data):
            self._out.append(memoryview(data)[n:] if n else data)
            self._write_locked(foreign=foreign)

    def _write_locked(self, foreign: bool = False) -> None:
        if (hook := WRITE_HOOK) is not None:
            hook()
        out = self._out
        self._pending_frames = 0
        try:
            if self._tls is not None:
                self._write_tls()
                return
            while out:
                batch = list(out) if len(out) <= _IOV_MAX else [out[i] for i in range(_IOV_MAX)]
                sent = self.sock.sendmsg(batch)
                while sent:
                    head = out[0]
                    size = len(head) if isinstance(head, bytes) else head.nbytes
                    if sent >= size:
                        out.popleft()
                        sent -= size
                    else:
                        out[0] = memoryview(head)[sent:]
                        sent = 0
        except (BlockingIOError, InterruptedError):
            if not self._writer_on:
                self._writer_on = True
                if foreign:
                    self.loop.call_soon_threadsafe(self._add_writer)
                else:
                    self._add_writer()
        except OSError as e:
            out.clear()
            if foreign:
                self.loop.call_soon_threadsafe(self.close, ConnectionClosed(str(e)))
            else:
                self.loop.call_soon(self.close, ConnectionClosed(str(e)))

    def _write_tls(self) -> None:
        """Lock held: encrypt what is queued ``_TLS_CHUNK`` bytes at a time and write each
        piece of ciphertext until the socket is full (BlockingIOError goes to the caller, as
        for plain writes; the rest stays queued, plaintext or ciphertext).

        A chunk at a time, so the peer decrypts the first chunk while this side encrypts the
        next, and a 64 MiB buffer is never turned into one 64 MiB piece of ciphertext that
        each partial write would have to shift down (that made TLS bulk transfers
        quadratic)."""
        out = self._out
        send = self.sock.send
        while True:
            while self._tls_out:
                n = send(self._tls_out)
                self._tls_out = self._tls_out[n:]
            if not out:
                return
            self._tls_out = memoryview(self._tls.encrypt(_take(out, _TLS_CHUNK)))

    def _add_writer(self) -> None:
        if not self._closed:
            self._io.on_writable(self._on_writable)

    def _on_writable(self) -> None:
        with self._lock:
            self._writer_on = False
            self._io.writable_done()
            if self._batch:
                self._close_batch()
            self._write_locked()

    # -- closing ---------------------------------------------------------------
    def close(self, exc: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._io.stop()
        with self._lock:    # a writer on another thread may be walking the queue
            try:
                self.sock.close()
            except OSError:
                pass
            self._out.clear()
            self._tls_out = _NOTHING
            self._batch = []
        self._on_close(self, exc)


#: A TCP peer whose host vanished (power loss, network cut: no FIN, no RST) is noticed
#: after about this many seconds of silence, through kernel keepalive probes (no traffic
#: of ours, no cost on the message path). 0 turns it off. At most 254: half of it is the
#: idle time, the rest the count of 1 s probes, which Linux caps at 127. Keepalive probes
#: only an idle connection: one with data sent and not acknowledged is bounded by the same
#: time through TCP_USER_TIMEOUT (else the kernel retransmits for ~15 minutes).
KEEPALIVE_S = env_number("HPCMESH_KEEPALIVE", 4, maximum=254, note="0 turns it off")


#: Unix-socket buffer size: the default (~200 KiB) turns a 64 MiB message into ~1000
#: sendmsg/recv_into calls and as many loop wake-ups. TCP keeps the kernel's autotuning.
UNIX_SOCKET_BUFFER = 4 * 1024 * 1024


def tune_socket(sock: socket.socket) -> None:
    """What every connection's socket gets: non-blocking; big buffers for a unix socket;
    no Nagle delay and keepalive probes (``KEEPALIVE_S``) for TCP."""
    sock.setblocking(False)
    if sock.family == socket.AF_UNIX:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, UNIX_SOCKET_BUFFER)
            except OSError:
                pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if KEEPALIVE_S > 0:
            _keepalive(sock, KEEPALIVE_S)


def _keepalive(sock: socket.socket, seconds: float) -> None:
    idle = max(1, int(seconds / 2))
    count = max(1, int(seconds) - idle)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", count)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            # the kernel acknowledges for a live peer however busy its program is: data
            # unacknowledged this long means its host is gone (or cut off)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            int((idle + count) * 1000))
    except OSError as e:   # not fatal: only slower detection of a vanished host
        log.debug("cannot set TCP keepalive: %s", e)


async def _run_handshake(loop, sock: socket.socket, hs: Handshake, timeout: float,
                         tls_ctx: ssl.SSLContext | None = None, server_side: bool = False,
                         first: bytes = b"") -> tuple[bytes, TLSSession | None]:
    """TLS first when asked, then the HMAC challenge-response (inside TLS).

    ``first``: bytes the listener already read to tell TLS from plain. Returns the
    plaintext read past the handshake and the TLS session (None for plain)."""
    session = None
    if tls_ctx is not None:
        import ssl

        from .tls import TLSSession
        session = TLSSession(tls_ctx, server_side)
    pending = [first] if first else []

    async def recv_raw() -> bytes:
        if pending:
            return pending.pop()
        return await loop.sock_recv(sock, 65536)

    async def tls_handshake() -> None:
        data = await recv_raw() if server_side else b""
        while True:
            try:
                done, out = session.handshake_step(data)
            except ssl.SSLCertVerificationError as e:
                raise HandshakeError(f"TLS: the peer's certificate is not trusted by the CA "
                                     f"bundle ({e.verify_message})") from None
            except ssl.SSLError as e:
                raise HandshakeError(f"TLS handshake failed: {e.reason or e}") from None
            if out:
                await loop.sock_sendall(sock, out)
            if done:
                return
            data = await recv_raw()
            if not data:
                raise HandshakeError("peer closed the connection during the TLS handshake "
                                     "(does it run with the same ca= / HPCMESH_TLS_CA?)")

    async def send(data: bytes) -> None:
        await loop.sock_sendall(sock, session.encrypt([data]) if session is not None else data)

    def plaintext(data: bytes = b"") -> bytes:
        """Feed ciphertext; all the plaintext the session has now (b"": needs more)."""
        out, buf = b"", bytearray(65536)
        while n := session.decrypt_into(data, memoryview(buf)):
            out += bytes(buf[:n])
            data = b""
        return out

    async def recv() -> bytes:
        if session is None:
            return await recv_raw()
        data = plaintext()
        while not data:
            raw = await recv_raw()
            if not raw:
                return b""
            data = plaintext(raw)
        return data

    async def go() -> bytes:
        if session is not None:
            await tls_handshake()
        first_out = hs.initial()
        if first_out:
            await send(first_out)
        leftover = b""
        while not hs.done:
            data = await recv()
            if hs.dialer and data.startswith(BUSY):
                raise HandshakeBusy(_BUSY_MESSAGE)
            if not data:
                raise HandshakeClosed(
                    "peer closed the connection during the handshake" + (
                        "" if session is not None else " (if it runs with TLS, give this end "
                        "the same ca= / HPCMESH_TLS_CA; else check the job secret, and that both "
                        "ends run the same hpcmesh version)"))
            reply, leftover = hs.receive(data)
            if reply:
                await send(reply)
        if session is not None:         # plaintext already decrypted past the handshake
            leftover += plaintext()
        return leftover
    return await asyncio.wait_for(go(), timeout), session


async def dial(loop, address: str | Address, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT,
               tls_ctx: ssl.SSLContext | None = None
               ) -> tuple[socket.socket, bytes, TLSSession | None]:
    """Connect and authenticate (over TLS for tcp:// when ``tls_ctx`` is given); returns
    the socket, any plaintext read past the handshake, and the TLS session.

    A listener at its cap of connections in their handshake answers BUSY (its flood
    defence; also what hundreds of processes dialing back at once meet): try again after a
    jittered, growing pause until ``timeout`` is spent, then raise HandshakeBusy. Every
    other failure is final at once."""
    addr = parse_address(address) if isinstance(address, str) else address
    if addr.scheme == "tcp" and addr.port == 0:
        raise ValueError(f"cannot dial {addr}: port 0 is only meaningful when listening")
    deadline = loop.time() + timeout
    pauses, tries = retry_pauses(), 0
    while True:
        tries += 1
        try:
            return await _dial_once(loop, addr, secret, max(0.0, deadline - loop.time()),
                                    tls_ctx)
        except HandshakeBusy as e:
            wait = next(pauses)
            if loop.time() + wait >= deadline:
                raise HandshakeBusy(f"{e}; still busy after {tries} tries in "
                                    f"{timeout:g} s") from None
            log.debug("%s is busy (try %d); trying again in %.2f s", addr, tries, wait)
            await asyncio.sleep(wait)


def retry_pauses() -> Iterator[float]:
    """The pauses of a dialer a busy listener turned away, one per try: from about
    BUSY_RETRY_FIRST, twice as long each time, up to BUSY_RETRY_MAX; each a random half to
    all of that, so that dialers turned away together come back apart. Never ends."""
    pause = BUSY_RETRY_FIRST
    while True:
        yield pause * (0.5 + random.random() / 2)
        pause = min(2 * pause, BUSY_RETRY_MAX)


async def _dial_once(loop, addr: Address, secret: bytes, timeout: float,
                     tls_ctx: ssl.SSLContext | None
                     ) -> tuple[socket.socket, bytes, TLSSession | None]:
    if addr.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = addr.path
        tls_ctx = None                  # one host, a 0600 socket file: no TLS
    else:
        infos = await loop.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"cannot resolve {addr.host}")
        family, _, _, _, target = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    tune_socket(sock)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, target), timeout)
        try:
            leftover, session = await _run_handshake(loop, sock, Handshake(secret, dialer=True),
                                                     timeout, tls_ctx)
        except (BrokenPipeError, ConnectionResetError):
            # the listener closed us at its cap before reading our hello: its BUSY may wait
            # unread behind the error our send or receive met
            if tls_ctx is None and _unread(sock).startswith(BUSY):
                raise HandshakeBusy(_BUSY_MESSAGE) from None
            raise
    except BaseException:
        sock.close()
        raise
    return sock, leftover, session


def _unread(sock: socket.socket) -> bytes:
    """What the peer sent that is still queued on ``sock`` (b"": nothing, or an error)."""
    try:
        return sock.recv(len(BUSY), socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return b""


def inherited_listener(fd: int, address: str) -> socket.socket:
    """The listening TCP socket a launcher handed down as fd ``fd`` (``tcp://host:fdN``)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise ValueError(f"{address}: fd {fd} is not an open socket ({e.strerror})") from None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6) \
            or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError(f"{address}: fd {fd} is not a listening TCP socket")
    return sock


def accepted_peer_name(sock: socket.socket, peer) -> str:
    """Who is at the other end of an accepted connection, as the log and errors name it:
    a TCP peer's address and port; for a Unix socket (whose peer address is empty) the
    process the kernel says connected, by pid and uid (SO_PEERCRED). On a shared login
    node that is what tells another user's process from one of the job's."""
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (AttributeError, OSError, struct.error):      # not Linux, or not a Unix socket
        return peer or "a local process (its pid and uid unknown)"
    return f"local process (pid {pid}, uid {uid})"


class Listener:
    """Accepts connections, authenticates them, and hands them to ``on_accept``."""

    def __init__(self, loop, address: str, secret: bytes, on_accept: Callable,
                 tls_ctx: Callable[[], ssl.SSLContext | None] = lambda: None):
        self.loop = loop
        self._secret = secret
        #: what an authenticated connection is handed to (a test may wrap it: refuse some)
        self.on_accept = on_accept
        self._tls_ctx = tls_ctx         # asked per connection: TLS can be turned on later
        addr = parse_bind_address(address)
        if addr.scheme == "unix":
            try:
                os.unlink(addr.path)
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(addr.path)
            os.chmod(addr.path, 0o600)
            self.address = addr
        elif addr.fd is not None:
            sock = inherited_listener(addr.fd, address)
            self.address = Address("tcp", host=addr.host, port=sock.getsockname()[1])
        else:
            family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr.host, addr.port))
            self.address = Address("tcp", host=addr.host, port=sock.getsockname()[1])
        sock.listen(1024)
        sock.setblocking(False)
        self.sock = sock
        #: Accepted connections whose handshake is not finished, oldest first.
        self._in_handshake: dict[asyncio.Task, socket.socket] = {}
        self._started: set[asyncio.Task] = set()    # of those, the ones whose task ran
        self._spoke: set[asyncio.Task] = set()      # and of these, the ones that sent a byte
        #: Spoken connections evicted at the cap but let finish, oldest first (_evict_one).
        self._outside_cap: dict[asyncio.Task, socket.socket] = {}
        self._refused = 0                   # turned away in the current logging interval
        self._refused_since = -1e9          # when that interval began
        self._warned = False                # whether it said so already
        self._drop_window = -1e9            # when the current logging interval began
        self._drops_logged = 0              # failed handshakes logged in it
        self._drops_unlogged = 0            # and not logged, since the last line
        self._last_drop_reason = ""
        self._paused = False
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        for _ in range(64):
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF_RESOURCES:
                    # Out of file descriptors (or memory): the pending connection stays in
                    # the backlog and the socket stays readable, so retrying now would spin.
                    # Stop accepting for a moment; the handshake deadline frees fds.
                    self._pause(f"accept failed: {e}")
                else:
                    log.warning("accept failed on %s: %s", self.address, e)
                return
            if len(self._in_handshake) >= MAX_UNAUTHENTICATED:
                self._evict_one()
            tune_socket(conn)
            task = self.loop.create_task(self._authenticate(conn, peer))
            self._in_handshake[task] = conn

    def _evict_one(self) -> None:
        """At the cap of connections in their handshake, make room for the new one by
        closing the oldest that has been read and found silent (a dialer speaks first, at
        once: a silent one is a probe or a flood), else the oldest not read yet, else the
        oldest of all. Refusing the newcomer instead would let anyone who keeps
        MAX_UNAUTHENTICATED idle connections open keep every real dialer out; this way a
        flood only shortens each connection's time to finish its handshake
        (MAX_UNAUTHENTICATED connections' worth of arrivals).

        The oldest of all has spoken and has our answer: its dialer may be done with its
        side and cannot tell that it was closed for room (hundreds of processes dialing
        back at once meet this), so it may finish outside the cap, among at most
        MAX_UNAUTHENTICATED such; past that, the oldest of those is closed."""
        pending = self._in_handshake
        victim = next((t for t in pending if t in self._started and t not in self._spoke),
                      None) or next((t for t in pending if t not in self._started), None) \
            or next(iter(pending))
        sock = pending.pop(victim)
        if victim in self._spoke:
            self._outside_cap[victim] = sock
            if len(self._outside_cap) <= MAX_UNAUTHENTICATED:
                return
            victim = next(iter(self._outside_cap))
            sock = self._outside_cap.pop(victim)
        # One that has not spoken may be a dialer whose hello we have not read: BUSY tells it
        # to try again (not inside TLS, where it would be garbage). One that has spoken has
        # our answer, and its side of the handshake may be over: BUSY would reach it as a
        # frame; it sees the connection close instead.
        if victim not in self._spoke and (self.address.scheme != "tcp" or
                                          self._tls_ctx() is None):
            try:
                sock.send(BUSY)
            except OSError:
                pass
        if victim not in self._started:
            sock.close()        # its task never runs once cancelled: nothing else closes it
        victim.cancel()
        self._note_refused(f"{MAX_UNAUTHENTICATED} connections are in their handshake; "
                           f"closing the oldest", MAX_UNAUTHENTICATED)

    def _note_refused(self, why: str, warn_at: int = 1) -> None:
        """Count a turned-away connection; warn once per ACCEPT_LOG_INTERVAL, from the
        ``warn_at``-th in it. Connections closed for room at the cap warn only once as many
        as the cap were closed: a flood fills it again and again, while hundreds of
        processes dialing back at once overflow it by a few, which come back (BUSY), and
        a user starting them should not read "refusing connections" (a debug line says
        it). Out of fds, the first one warns."""
        now = self.loop.time()
        if now - self._refused_since >= ACCEPT_LOG_INTERVAL:
            self._refused_since, self._refused, self._warned = now, 0, False
        self._refused += 1
        if not self._warned and self._refused >= warn_at:
            self._warned = True
            log.warning("listener %s refusing connections: %s (%d refused in the last %.1f s)",
                        self.address, why, self._refused, now - self._refused_since)
        elif self._refused == 1:
            log.debug("listener %s turned a connection away: %s (dialers told BUSY come "
                      "back)", self.address, why)

    def _note_dropped(self, name: str, reason: str) -> None:
        """Log a connection that failed its handshake (a wrong secret, another version: a
        user needs to see each), but no more than DROP_LOG_BURST lines per
        ACCEPT_LOG_INTERVAL: past that they are counted, and the count is logged when the
        interval ends (a flood of garbage is two lines, not one per connection)."""
        now = self.loop.time()
        if now - self._drop_window >= ACCEPT_LOG_INTERVAL:
            self._drop_window, self._drops_logged = now, 0
        if self._drops_logged < DROP_LOG_BURST:
            self._drops_logged += 1
            log.warning("dropped unauthenticated connection from %s on %s: %s", name,
                        self.address, reason)
            return
        if not self._drops_unlogged:
            self.loop.call_later(self._drop_window + ACCEPT_LOG_INTERVAL - now,
                                 self._log_unlogged_drops)
        self._drops_unlogged += 1
        self._last_drop_reason = reason

    def _log_unlogged_drops(self) -> None:
        n, self._drops_unlogged = self._drops_unlogged, 0
        if n:
            log.warning("dropped %d more unauthenticated connections on %s in the last %.0f s "
                        "without logging each (the last: %s)", n, self.address,
                        ACCEPT_LOG_INTERVAL, self._last_drop_reason)

    def _pause(self, why: str) -> None:
        self._note_refused(why)
        if self.stop_accepting():
            self.loop.call_later(ACCEPT_PAUSE, self.accept_again)

    def stop_accepting(self) -> bool:
        """Leave new connections in the kernel's backlog until ``accept_again`` (loop
        thread): out of fds, or a test holding dialers back. False if already stopped."""
        if self._paused:
            return False
        self._paused = True
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            return False
        return True

    def accept_again(self) -> None:
        self._paused = False
        if self.sock.fileno() >= 0:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def handshakes(self) -> list[tuple[object, str]]:
        """The connections in their handshake, oldest first: (the peer's address, how far:
        ``accepted``, ``reading`` (its task ran), ``spoke`` (it sent a byte)). What the flood
        defence chooses among when it must close one."""
        out = []
        for task, sock in self._in_handshake.items():
            try:
                peer = sock.getpeername()
            except OSError:
                peer = None
            out.append((peer, "spoke" if task in self._spoke else
                        "reading" if task in self._started else "accepted"))
        return out

    async def _authenticate(self, sock: socket.socket, peer) -> None:
        name = accepted_peer_name(sock, peer)
        me = asyncio.current_task()
        self._started.add(me)
        deadline = self.loop.time() + HANDSHAKE_TIMEOUT     # one budget for sniff + handshake
        try:
            tls_ctx = self._tls_ctx() if self.address.scheme == "tcp" else None
            try:
                # A dialer speaks at once: what it sent is read now, not a few loop passes
                # later (wait_for's task), in which a slow loop took it for silent and
                # evicted it first; a crowd of dialers met nothing else.
                first = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                first = await asyncio.wait_for(self.loop.sock_recv(sock, 4096),
                                               HANDSHAKE_TIMEOUT)
                if me not in self._in_handshake:
                    # evicted as its first bytes came in (wait_for then returns them rather
                    # than the cancellation): it was told BUSY and dials again; going on
                    # would answer it outside the cap and log its reset as a failed handshake
                    sock.close()
                    return
            self._spoke.add(me)
            if first and (first[0] == TLS_HANDSHAKE_BYTE) != (tls_ctx is not None):
                raise HandshakeError(
                    "peer started TLS, but this node runs without it (give both ends the same "
                    "ca= / HPCMESH_TLS_CA)" if tls_ctx is None else
                    "peer did not start TLS, which this node requires (give both ends the "
                    "same ca= / HPCMESH_TLS_CA)")
            leftover, session = await _run_handshake(
                self.loop, sock, Handshake(self._secret, dialer=False),
                max(0.0, deadline - self.loop.time()), tls_ctx, server_side=True, first=first)
        except (HandshakeClosed, ConnectionResetError, BrokenPipeError,
                ConnectionAbortedError):
            # A dial that lost a race to another address of this node (connect_first), a
            # port probe, or a dialer that found our answer signed with another secret: the
            # dialing side reports which. Nothing for this side's log but a debug line. (A
            # dialer that closes with our answer unread resets the connection: the same.)
            log.debug("connection from %s on %s closed during the handshake", name,
                      self.address)
            sock.close()
            return
        except (HandshakeError, OSError, asyncio.TimeoutError) as e:
            self._note_dropped(name, str(e) or type(e).__name__)
            sock.close()
            return
        except BaseException:       # evicted, cancelled (the node is closing), a bug: no leak
            sock.close()
            raise
        finally:
            self._in_handshake.pop(me, None)
            self._outside_cap.pop(me, None)
            self._started.discard(me)
            self._spoke.discard(me)
        self.on_accept(sock, name, leftover, session)

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            pass
        self.sock.close()
        if self.address.scheme == "unix":
            try:
                os.unlink(self.address.path)
            except OSError:
                pass
