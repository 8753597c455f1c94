"""An HTTP server that answers only requests carrying its token (standard library only).

The admin view, the telemetry query API and the dashboard all run on the controller, which
on a cluster is often a shared login node: each binds to loopback unless told otherwise,
and every request must carry the server's token (``?token=...`` or ``Authorization:
Bearer ...``). A request without it gets a bare 401: no body, no hint of what is served.
The token is in the URL the job hands out (``state().admin_url`` and the like), never in
a log: request lines are not logged, and where a log names a URL it shows
:func:`redacted`.

Anyone on the host can connect, though, token or not, and must not be able to keep the
token's holder out. So no connection gets a thread before its token is checked: one thread,
the gate, accepts every connection and reads its request head (non-blocking, all of them
at once). A head must arrive, whole, within ``head_timeout`` seconds of the connection
and ``max_head`` bytes (one sent a byte at a time is cut then). At most ``max_arriving``
connections are read at once, each holding a descriptor and no thread; at that many, a new
one pushes out the oldest (answered 503): another user holding connections open, idle or
slow, only ever keeps connections of their own waiting, while a client that sends its head
as it connects (any HTTP client does) is read at once. A head without the token is answered
401 by the gate and closed. One with it is served on a thread of its own, at most
``max_connections`` at once (503 past that: only token holders get there); its body and
answer get ``body_timeout``. One request per connection (HTTP/1.0): none stays open idle
after its answer. The job's own work does not go through these servers, and they take
from it at most a bounded number of threads and file descriptors.
"""

from __future__ import annotations

import errno
import hmac
import http.client
import io
import json
import logging
import re
import secrets
import selectors
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

log = logging.getLogger("hpcmesh.admin")

#: What stands for a token in what is shown or logged.
ELIDED = "…"
#: Where a server binds when not told: loopback, any free port.
DEFAULT_ADDR = "127.0.0.1:0"


def parse_addr(addr: str | None, what: str = "address") -> tuple[str, int]:
    """``host:port`` -> (host, port); errors name ``what`` (``admin_addr``) and say what is
    allowed."""
    text = DEFAULT_ADDR if addr is None else addr
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a 'host:port' string or None, got "
                        f"{type(addr).__name__}")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must look like 'host:port' (port 0-65535, 0 for any "
                         f"free port; '[::1]:0' for IPv6), got {addr!r}")
    return host, int(port)


def endpoint_url(url: str, path: str) -> str:
    """The URL of ``path`` (``/api/tree``) on the server of ``url``, keeping its token."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def url_token(url: str) -> str:
    """The token a server's URL carries ('' if none)."""
    return (parse_qs(urlsplit(url).query).get("token") or [""])[0]


def redacted(url: str) -> str:
    """``url`` with its token shown as ``…``: how a log or an error names a service."""
    parts = urlsplit(url)
    query = "&".join(f"token={ELIDED}" if field.split("=", 1)[0] == "token" else field
                     for field in parts.query.split("&")) if parts.query else ""
    return urlunsplit(parts._replace(query=query))


def request_json(url: str, path: str, doc: Any = None, *, timeout: float = 60.0,
                 busy_for: float = 5.0) -> Any:
    """GET ``path`` on the server of ``url`` (POST ``doc`` as JSON if given), with the token
    in an ``Authorization`` header rather than in the request line. A 503 (the server has
    as many connections as it serves) is asked again for up to ``busy_for`` s."""
    parts = urlsplit(url)
    req = urllib.request.Request(
        urlunsplit((parts.scheme, parts.netloc, path, "", "")),
        data=None if doc is None else json.dumps(doc).encode(),
        headers={"Authorization": f"Bearer {url_token(url)}",
                 "Content-Type": "application/json"})
    give_up = time.monotonic() + busy_for
    while True:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > give_up:
                raise
            e.close()
        time.sleep(0.2)


class _TimedReader(io.RawIOBase):
    """The raw stream under a handler's ``rfile``: first what the gate read already, then
    the socket, every read ending by the connection's current deadline and within its byte
    budget, however the client paces its bytes."""

    def __init__(self, sock: socket.socket, read: bytes, seconds: float, budget: int,
                 what: str):
        self.sock, self.read_ahead = sock, memoryview(read)
        self.limit(seconds, budget, what)

    def limit(self, seconds: float, budget: int, what: str) -> None:
        self.seconds, self.deadline = seconds, time.monotonic() + seconds
        self.budget, self.what = budget, what

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self.read_ahead:
            n = min(len(buf), len(self.read_ahead))
            buf[:n] = self.read_ahead[:n]
            self.read_ahead = self.read_ahead[n:]
            return n
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{self.what} not in within {self.seconds:g} s")
        if self.budget <= 0:
            raise ConnectionAbortedError(f"{self.what} over its size limit")
        self.sock.settimeout(left)
        n = self.sock.recv_into(buf, min(len(buf), self.budget))
        self.budget -= n
        return n


def carries_token(query: dict, headers: Any, token: str) -> bool:
    """Whether a request carries ``token``: ``Authorization: Bearer <token>`` in
    ``headers`` or ``token=<token>`` in its parsed ``query``."""
    want = token.encode()
    got = headers.get("Authorization", "")
    if got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), want):
        return True
    return any(hmac.compare_digest(value.encode(), want) for value in query.get("token", []))


class TokenHandler(BaseHTTPRequestHandler):
    """Base of the handlers: token check, JSON and byte answers. Subclasses define
    ``get(path, query)`` and/or ``post(path, body)``, returning (status, doc) for JSON or
    (status, bytes, content type); what they raise is answered 500 with the reason."""
    server_version = "hpcmesh"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()      # read through the deadline instead
        self._reader = _TimedReader(self.connection, self.server.read_ahead(self.connection),
                                    self.server.head_timeout, self.server.max_head,
                                    "the request head")
        self.rfile = io.BufferedReader(self._reader)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        # the head is in: what follows (the body, once the token checked out) gets longer
        self._reader.limit(self.server.body_timeout, self.server.max_body + 1,
                           "the request body")
        return ok

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002
        pass    # the request line holds the token: never write it to a shared log

    def _target(self) -> tuple[str, dict] | None:
        """(path, query) of the request, or None once it was answered 400."""
        try:
            parts = urlsplit(self.path)
            # (blank values kept: `?source=` is a wrong value, not no value)
            return parts.path, parse_qs(parts.query, keep_blank_values=True)
        except ValueError:
            self.send_doc(400, None)    # a bare 400: the token could not even be looked for
            return None

    def _authorized(self, query: dict) -> bool:
        return carries_token(query, self.headers, self.server.token)

    def send_bytes(self, code: int, body: bytes, content_type: str | None) -> None:
        self.connection.settimeout(self.server.body_timeout)
        self.send_response(code)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_doc(self, code: int, doc: dict | None) -> None:
        body = b"" if doc is None else json.dumps(doc, default=str).encode()
        self.send_bytes(code, body, None if doc is None else "application/json")

    def _checked(self) -> tuple[str, dict] | None:
        """(path, query) of an authorized request; None once it was answered."""
        target = self._target()
        if target is not None and not self._authorized(target[1]):
            self.send_doc(401, None)
            return None
        return target

    def _answer(self, fn, *args) -> None:
        try:
            res = fn(*args)
            code, body, ctype = res if len(res) == 3 else (
                res[0], json.dumps(res[1], default=str).encode(), "application/json")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException too: answer why
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning("%s %s failed: %s", self.command, urlsplit(self.path).path,
                        reason.splitlines()[0][:300])
            log.debug("%s %s failed", self.command, urlsplit(self.path).path, exc_info=True)
            code, body, ctype = 500, json.dumps({"error": reason}).encode(), "application/json"
        self.send_bytes(code, body, ctype)

    def do_GET(self) -> None:  # noqa: N802
        target = self._checked()
        if target is not None:
            self._answer(self.get, target[0].rstrip("/") or "/", target[1])

    def do_POST(self) -> None:  # noqa: N802
        target = self._checked()
        if target is None:
            return
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if not 0 <= n <= self.server.max_body:
            self.send_doc(413 if n > 0 else 400, {
                "error": f"a request body of 0 to {self.server.max_body} bytes, with its "
                         f"Content-Length, is needed"})
            return
        body = self.rfile.read(n)
        self._answer(self.post, target[0].rstrip("/"), body)

    def get(self, path: str, query: dict) -> tuple:
        return 405, {"error": "this server takes POST only"}

    def post(self, path: str, body: bytes) -> tuple:
        return 405, {"error": "this server is read-only: GET only"}

    def _not_allowed(self) -> None:
        if self._checked() is not None:
            self.send_doc(405, {"error": "GET and POST only"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = _not_allowed  # noqa: N815


#: What a connection past a cap gets before it is closed.
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nServer: hpcmesh\r\nRetry-After: 1\r\n"
         b"Content-Length: 0\r\nConnection: close\r\n\r\n")
#: The blank line that ends a request head (a bare LF ends lines too, as http.server reads).
_HEAD_END = re.compile(rb"\n\r?\n")


def _bare(code: int, reason: str) -> bytes:
    """A bodiless answer the gate sends itself (401 without the token, 400 unparseable)."""
    return (f"HTTP/1.0 {code} {reason}\r\nServer: hpcmesh\r\nContent-Length: 0\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode()


class _Arriving:
    """A connection whose request head is still coming in (no thread: the gate reads it)."""
    __slots__ = ("sock", "peer", "head", "deadline")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float):
        self.sock, self.peer, self.head, self.deadline = sock, peer, bytearray(), deadline


class TokenServer(HTTPServer):
    """``addr`` (``host:port``; None: loopback, any free port), served from a daemon
    thread; ``token``: a new one unless given (servers of one job may share one)."""
    #: Requests with the token served at once (a thread each); past it: 503. A job's own
    #: clients (a browser, ``hpcmesh top``, a few scripts) need a handful.
    max_connections = 32
    #: Connections whose head is still coming in; at this many, a new one pushes out the
    #: oldest (answered 503). Each holds a descriptor, no thread.
    max_arriving = 128
    #: Seconds for a connection's whole request head, bytes it may take.
    head_timeout = 5.0
    max_head = 64 * 1024
    #: Seconds for the body and for the answer once the token checked out; the body's size.
    body_timeout = 30.0
    max_body = 1 << 20
    #: The listen backlog: connections the kernel holds until the gate accepts them (it
    #: takes at most net.core.somaxconn, 4096 by default). Large, because a connection
    #: the kernel cannot queue is dropped and its client tries again only 1 s, then 3 s,
    #: later: another user's connections beyond what the gate holds wait here, in the
    #: kernel's memory, rather than crowd out the token holder's. Their own count of
    #: descriptors bounds them.
    request_queue_size = 4096
    #: Connections accepted in one turn of the gate before it reads what came in.
    _accept_batch = 256

    def __init__(self, handler: type[TokenHandler], addr: str | None, *,
                 token: str | None = None, name: str = "hpcmesh-http"):
        host, port = parse_addr(addr)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.name = name
        super().__init__((host, port), handler)
        self.addr = addr
        self.token = token or secrets.token_urlsafe(32)
        self.socket.setblocking(False)
        self._arriving: dict[socket.socket, _Arriving] = {}   # oldest first
        self._read_ahead: dict[socket.socket, bytes] = {}      # head (+ body) the gate read
        self._closing = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._gate, name=name, daemon=True)
        self._thread.start()

    # -- the gate: one thread reads every request head, and admits those with the token ---
    def _gate(self) -> None:
        try:
            while not self._closing:
                timeout = None
                if self._arriving:
                    oldest = next(iter(self._arriving.values()))
                    timeout = max(0.0, oldest.deadline - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    elif key.fileobj in self._arriving:     # (not dropped in this turn)
                        try:
                            self._read(key.data)
                        except Exception as e:  # noqa: BLE001 - that connection's end only
                            log.debug("%s: a request head failed: %r", self.name, e)
                            if key.fileobj in self._arriving:
                                self._drop(key.data, None)
                now = time.monotonic()
                while self._arriving:
                    oldest = next(iter(self._arriving.values()))
                    if oldest.deadline > now:
                        break
                    log.debug("%s: a request head not in within %g s: cut", self.name,
                              self.head_timeout)
                    self._drop(oldest, None)
        finally:
            for conn in list(self._arriving.values()):
                self._drop(conn, None)

    def _accept(self) -> None:
        for _ in range(self._accept_batch):
            try:
                sock, peer = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: give up the oldest arriving connection's, or,
                    # with none (the rest of the process holds them), wait rather than
                    # spin on a connection that stays pending
                    if self._arriving:
                        self._drop(next(iter(self._arriving.values())), _BUSY)
                        continue
                    time.sleep(0.1)
                return
            sock.setblocking(False)
            if len(self._arriving) >= self.max_arriving:
                self._drop(next(iter(self._arriving.values())), _BUSY)
            conn = _Arriving(sock, peer, time.monotonic() + self.head_timeout)
            self._arriving[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._read(conn)    # a client's head is usually in already: no turn to wait

    def _read(self, conn: _Arriving) -> None:
        seen = len(conn.head)
        try:
            data = conn.sock.recv(self.max_head + 4096 - seen)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, None)
            return
        conn.head += data
        end = _HEAD_END.search(conn.head, max(0, seen - 2))
        if end is None or end.end() > self.max_head:
            if end is not None or len(conn.head) >= self.max_head:
                log.debug("%s: a request head over %d bytes: cut", self.name, self.max_head)
                self._drop(conn, None)
            return
        self._release(conn)
        self._admit(conn.sock, conn.peer, bytes(conn.head[:end.end()]), bytes(conn.head))

    def _admit(self, sock: socket.socket, peer: Any, head: bytes, read: bytes) -> None:
        """A whole head is in: a thread to serve it if it carries the token (and one is
        free), else the gate's own short answer."""
        answer = None
        try:
            line, _, rest = head.partition(b"\n")
            words = line.decode("iso-8859-1").split()
            headers = http.client.parse_headers(io.BytesIO(rest))
            query = parse_qs(urlsplit(words[1] if len(words) > 1 else "").query)
            if not carries_token(query, headers, self.token):
                answer = _bare(401, "Unauthorized")
        except (ValueError, http.client.HTTPException):
            answer = _bare(400, "Bad Request")
        if answer is None and not self._slots.acquire(blocking=False):
            answer = _BUSY
        if answer is not None:
            self._send_and_close(sock, answer)
            return
        sock.settimeout(self.body_timeout)     # (the handler's reads set their own)
        self._read_ahead[sock] = read
        try:
            threading.Thread(target=self._serve, args=(sock, peer),
                             name=f"{self.name}-request", daemon=True).start()
        except RuntimeError:        # no thread to be had
            self._read_ahead.pop(sock, None)
            self._slots.release()
            sock.setblocking(False)
            self._send_and_close(sock, _BUSY)

    def _release(self, conn: _Arriving) -> None:
        del self._arriving[conn.sock]
        self._selector.unregister(conn.sock)

    def _drop(self, conn: _Arriving, answer: bytes | None) -> None:
        self._release(conn)
        if answer is None:
            self.shutdown_request(conn.sock)
        else:
            self._send_and_close(conn.sock, answer)

    def _send_and_close(self, sock: socket.socket, answer: bytes) -> None:
        try:
            sock.send(answer)       # a socket's empty buffer takes it, or it is lost
        except OSError:
            pass
        self.shutdown_request(sock)

    def read_ahead(self, sock: socket.socket) -> bytes:
        """What the gate read of ``sock`` (its head, perhaps part of its body): the
        handler's stream starts with it."""
        return self._read_ahead.pop(sock, b"")

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - the client's problem (gone, too slow): its own
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("%s: a connection ended: %s", self.name, sys.exc_info()[1])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()      # reachable from elsewhere: say where
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/?token={self.token}"

    def close(self) -> None:
        """Stop the gate (the connections still arriving are closed), then the socket;
        requests already admitted finish on their threads."""
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self.server_close()
