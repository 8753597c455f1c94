"""An HTTP server that answers only requests carrying its token (standard library only).

The admin view, the telemetry query API and the dashboard all run on the controller, which
on a cluster is often a shared login node: each binds to loopback unless told otherwise,
and every request must carry the server's token (``?token=...`` or ``Authorization:
Bearer ...``). A request without it gets a bare 401: no body, no hint of what is served.
The token is in the URL the job hands out (``state().admin_url`` and the like), never in
a log (request lines are not logged).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from .config import parse_addr

log = logging.getLogger("hpcmesh.admin")


def endpoint_url(url: str, path: str) -> str:
    """The URL of ``path`` (``/api/tree``) on the server of ``url``, keeping its token."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def url_token(url: str) -> str:
    """The token a server's URL carries ('' if none)."""
    return (parse_qs(urlsplit(url).query).get("token") or [""])[0]


class TokenHandler(BaseHTTPRequestHandler):
    """Base of the handlers: token check, JSON and byte answers. Subclasses define
    ``get(path, query)`` and/or ``post(path, body)``, returning (status, doc) for JSON or
    (status, bytes, content type)."""
    server_version = "hpcmesh"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002
        pass    # the request line holds the token: never write it to a shared log

    def _authorized(self) -> bool:
        token = self.server.token.encode()
        got = self.headers.get("Authorization", "")
        if got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), token):
            return True
        for value in parse_qs(urlsplit(self.path).query).get("token", []):
            if hmac.compare_digest(value.encode(), token):
                return True
        return False

    def send_bytes(self, code: int, body: bytes, content_type: str | None) -> None:
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

    def _deny(self) -> bool:
        if self._authorized():
            return False
        self.send_doc(401, None)
        return True

    def _answer(self, fn, *args) -> None:
        path = urlsplit(self.path).path
        try:
            res = fn(*args)
        except Exception as e:  # noqa: BLE001 - a broken view must not kill the server
            log.exception("%s %s failed", self.command, path)
            res = (500, {"error": f"{type(e).__name__}: {e}"})
        if len(res) == 3:
            self.send_bytes(*res)
        else:
            self.send_doc(*res)

    def do_GET(self) -> None:  # noqa: N802
        if self._deny():
            return
        parts = urlsplit(self.path)
        # (blank values kept: `?source=` is a wrong value, not no value)
        self._answer(self.get, parts.path.rstrip("/") or "/",
                     parse_qs(parts.query, keep_blank_values=True))

    def do_POST(self) -> None:  # noqa: N802
        if self._deny():
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
        self._answer(self.post, urlsplit(self.path).path.rstrip("/"), body)

    def get(self, path: str, query: dict) -> tuple:
        return 405, {"error": "this server takes POST only"}

    def post(self, path: str, body: bytes) -> tuple:
        return 405, {"error": "this server is read-only: GET only"}

    def _not_allowed(self) -> None:
        if not self._deny():
            self.send_doc(405, {"error": "GET and POST only"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = _not_allowed  # noqa: N815


class TokenServer(ThreadingHTTPServer):
    """``addr`` (``host:port``; None: loopback, any free port), served from a daemon
    thread; ``token``: a new one unless given (servers of one job may share one)."""
    daemon_threads = True
    max_body = 1 << 20

    def __init__(self, handler: type[TokenHandler], addr: str | None, *,
                 token: str | None = None, name: str = "hpcmesh-http"):
        host, port = parse_addr(addr)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), handler)
        self.addr = addr
        self.token = token or secrets.token_urlsafe(32)
        self._thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()      # reachable from elsewhere: say where
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/?token={self.token}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
