"""The admin HTTP server on the controller (standard library only: ``ThreadingHTTPServer``).

``GET /api/tree`` and ``GET /api/stack/<process>``, each behind the job's token: a login
node is shared, so the server binds to loopback unless told otherwise and every request
must carry the token (``?token=...`` or ``Authorization: Bearer ...``); without it a
request gets a bare 401. The token is in the URL that ``state().admin_url`` returns.
"""

from __future__ import annotations

import atexit
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from ..runtime.client import ClientRuntime, client_runtime
from ..runtime.introspect import ADMIN_URL_VARS
from .config import MeshAdminConfig, parse_addr
from .tree import build_tree, process_status

log = logging.getLogger("hpcmesh.admin")

URL_VARS = ADMIN_URL_VARS     # where the URL is exported (see introspect)
#: How long the admin view waits for a process's event loop before the signal fallback.
LOOP_TIMEOUT_S = 2.0


def admin_endpoint(admin_url: str, path: str) -> str:
    """The URL of ``path`` (``/api/tree``) on the server of ``admin_url``, keeping its token."""
    parts = urlsplit(admin_url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


# -- what the endpoints answer ------------------------------------------------------------
def collect_tree(rt: ClientRuntime, timeout: float = LOOP_TIMEOUT_S) -> dict:
    """The tree now: every process this controller started, its actors as the process
    reports them (asked in parallel, ``timeout`` s in all)."""
    node = rt.node
    procs, asks = [], {}
    for rec in list(rt.procs.values()):
        connected = rec.node is not None and node.peer_connected(rec.node.node_id)
        status = process_status(failure=rec.failure, connected_once=rec.node is not None,
                                connected=connected, stopping=rec.stopping)
        procs.append({"name": rec.name, "label": rec.label, "mesh": rec.mesh_name,
                      "point": rec.point, "host": rec.host, "pid": rec.pid, "status": status,
                      "error": str(rec.failure) if rec.failure is not None else None})
        if status == "running":
            asks[rec.name] = node.rpc(rec.node, "admin_actors")
    deadline = time.monotonic() + timeout
    reported: dict[str, list | None] = {}
    for name, fut in asks.items():
        try:
            reported[name] = fut.result(timeout=max(0.01, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - not answering is shown as answered: false
            reported[name] = None
    meshes = [{"actor_id": st.actor_id, "name": st.name, "class": st.class_name,
               "proc_names": list(st.proc_names)}
              for st in list(getattr(rt, "actor_meshes", {}).values())]
    return build_tree(procs, reported, meshes)


def collect_stacks(rt: ClientRuntime, name: str, timeout: float = LOOP_TIMEOUT_S) -> tuple[int, dict]:
    """(HTTP status, document) for ``/api/stack/<name>``: from the process's event loop, or
    when that does not answer in ``timeout`` s, from faulthandler through its host agent."""
    rec = rt.procs.get(name)
    if rec is None:
        return 404, {"error": f"no process named {name!r}; the names are in /api/tree"}
    base = {"process": rec.name, "label": rec.label, "mesh": rec.mesh_name, "pid": rec.pid,
            "host": rec.host}
    if rec.node is None or rec.failure is not None:
        return 409, dict(base, error=f"process {rec.name} is not running "
                                     f"({rec.failure or 'not connected yet'})")
    try:
        threads = rt.node.rpc(rec.node, "admin_stacks").result(timeout=timeout)
        text = "\n".join(f"Thread {t['thread']} ({t['ident']}):\n{t['stack']}" for t in threads)
        return 200, dict(base, source="event loop", threads=threads, text=text)
    except Exception as e:  # noqa: BLE001 - the fallback below says what happened
        loop_error = f"{type(e).__name__}: {e}"
    try:
        text = rt.node.rpc(rec.agent, "dump_stacks", rec.name).result(timeout=timeout + 4)
    except Exception as e:  # noqa: BLE001
        return 502, dict(base, error=f"the process's event loop did not answer ({loop_error}) "
                                     f"and the faulthandler fallback failed: "
                                     f"{type(e).__name__}: {e}")
    return 200, dict(base, source="faulthandler", loop_error=loop_error, text=text)


# -- the HTTP server ------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    server_version = "hpcmesh-admin"
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

    def _send(self, code: int, doc: dict | None) -> None:
        body = b"" if doc is None else json.dumps(doc, default=str).encode()
        self.send_response(code)
        if doc is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _deny(self) -> bool:
        if self._authorized():
            return False
        self._send(401, None)
        return True

    def do_GET(self) -> None:  # noqa: N802
        if self._deny():
            return
        path = urlsplit(self.path).path.rstrip("/")
        rt = self.server.runtime
        try:
            if path == "/api/tree":
                self._send(200, collect_tree(rt))
            elif path.startswith("/api/stack/"):
                self._send(*collect_stacks(rt, unquote(path[len("/api/stack/"):])))
            else:
                self._send(404, {"error": f"no endpoint {path!r}; there are /api/tree and "
                                          f"/api/stack/<process>"})
        except Exception as e:  # noqa: BLE001 - a broken view must not kill the server
            log.exception("admin request %s failed", path)
            self._send(500, {"error": f"{type(e).__name__}: {e}"})

    def _not_allowed(self) -> None:
        if not self._deny():
            self._send(405, {"error": "the admin view is read-only: GET only"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _not_allowed  # noqa: N815


class AdminServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, runtime: ClientRuntime, addr: str | None):
        host, port = parse_addr(addr)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.runtime = runtime
        self.addr = addr
        self.token = secrets.token_urlsafe(32)
        self._thread = threading.Thread(target=self.serve_forever, name="hpcmesh-admin",
                                        daemon=True)
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


_server: AdminServer | None = None
_lock = threading.Lock()


def start_admin(config: MeshAdminConfig | None = None) -> str:
    """Start (or keep) this controller's admin server; its URL, which carries the token.
    Exported as ``MONARCH_ADMIN_URL``/``HPCMESH_ADMIN_URL`` for processes started later."""
    global _server
    config = config or MeshAdminConfig()
    rt = client_runtime()
    with _lock:
        if _server is not None and (_server.addr != config.admin_addr or _server.runtime is not rt):
            _server.close()
            _server = None
        if _server is None:
            _server = AdminServer(rt, config.admin_addr)
            log.info("admin view at %s", admin_endpoint(_server.url, "/api/tree"))
        for var in URL_VARS:
            os.environ[var] = _server.url
        return _server.url


def stop_admin() -> None:
    """Stop the admin server (at exit, or to free its port)."""
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None
            for var in URL_VARS:
                os.environ.pop(var, None)


atexit.register(stop_admin)
