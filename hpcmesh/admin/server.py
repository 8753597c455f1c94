"""The admin HTTP server on the controller (standard library only: ``token_http``).

``GET /api/tree`` and ``GET /api/stack/<process>``, each behind the job's token: a login
node is shared, so the server binds to loopback unless told otherwise and every request
must carry the token (``?token=...`` or ``Authorization: Bearer ...``); without it a
request gets a bare 401. The token is in the URL that ``state().admin_url`` returns.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from urllib.parse import unquote

from ..runtime.client import ClientRuntime, client_runtime
from ..runtime.observe import stragglers
from ..runtime.observe.introspect import (ADMIN_URL_VARS, PYSPY_NATIVE_TIMEOUT_S,
                                          PYSPY_TIMEOUT_S, PySpyError)
from .config import MeshAdminConfig
from .debug import send_to, sessions_of
from ..token_http import TokenHandler, TokenServer, endpoint_url, redacted
from .tree import build_tree, process_status

log = logging.getLogger("hpcmesh.admin")

URL_VARS = ADMIN_URL_VARS     # where the URL is exported (see introspect)
#: How long the admin view waits for a process's event loop before the signal fallback.
LOOP_TIMEOUT_S = 2.0


#: The URL of ``path`` (``/api/tree``) on the server of ``admin_url``, keeping its token.
admin_endpoint = endpoint_url


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
                      "error": str(rec.failure) if rec.failure is not None else None,
                      "failure_class": (rec.failure.reason or None) if rec.failure is not None
                      else None,
                      "exit_status": (rec.failure.exit_status or None)
                      if rec.failure is not None else None})
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
              for st in rt.actor_meshes()]
    watch = stragglers.WATCH
    return build_tree(procs, reported, meshes,
                      [r.to_json() for r in list(watch.reports)] if watch is not None else ())


#: Where ``/api/stack/<process>`` gets the stacks, in the order it tries them, and the key
#: under which its answer says why one gave none.
STACK_SOURCES = {"event loop": "loop_error", "py-spy": "pyspy_error",
                 "faulthandler": "faulthandler_error"}
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def collect_stacks(rt: ClientRuntime, name: str, timeout: float = LOOP_TIMEOUT_S,
                   source: str | None = None, native: str | bool | None = None
                   ) -> tuple[int, dict]:
    """(HTTP status, document) for ``/api/stack/<name>[?source=...&native=1]``: from the
    process's event loop (fullest, cheapest); when that does not answer in ``timeout`` s,
    from ``py-spy dump`` run by its host agent; where py-spy is missing or fails, from
    faulthandler through the agent. ``source`` says which answered, ``loop_error`` /
    ``pyspy_error`` why those before it did not. ``source=`` (the query's) asks one of
    them only; ``native=1`` passes ``--native`` to py-spy."""
    if source is not None and source not in STACK_SOURCES:
        return 400, {"error": f"source={source!r}: the sources are "
                              f"{', '.join(STACK_SOURCES)} (default: in that order)"}
    if isinstance(native, str):
        if native.lower() not in _YES + _NO:
            return 400, {"error": f"native={native!r}: 1 (py-spy's --native) or 0"}
        native = native.lower() in _YES
    if native and source not in (None, "py-spy"):
        return 400, {"error": f"native=1 is py-spy's --native: not with source={source}"}
    if native:
        source = "py-spy"       # only py-spy has native frames: not the loop's answer
    rec = rt.procs.get(name)
    if rec is None:
        return 404, {"error": f"no process named {name!r}; the names are in /api/tree"}
    base = {"process": rec.name, "label": rec.label, "mesh": rec.mesh_name, "pid": rec.pid,
            "host": rec.host}
    if rec.node is None or rec.failure is not None:
        return 409, dict(base, error=f"process {rec.name} is not running "
                                     f"({rec.failure or 'not connected yet'})")
    errors: dict[str, str] = {}
    for src in STACK_SOURCES if source is None else (source,):
        try:
            if src == "event loop":
                threads = rt.node.rpc(rec.node, "admin_stacks").result(timeout=timeout)
                text = "\n".join(f"Thread {t['thread']} ({t['ident']}):\n{t['stack']}"
                                 for t in threads)
                return 200, dict(base, source=src, threads=threads, text=text)
            # the agent's own timeout first (it then says what happened), ours as a bound
            wait = (PYSPY_NATIVE_TIMEOUT_S if native else PYSPY_TIMEOUT_S) \
                if src == "py-spy" else timeout
            text = rt.node.rpc(rec.agent, "dump_stacks", rec.name, src,
                               bool(native)).result(timeout=wait + 4)
            return 200, dict(base, source=src, text=text, **errors)
        except Exception as e:  # noqa: BLE001 - the next source, or the answer, says why
            errors[STACK_SOURCES[src]] = (str(e) if isinstance(e, PySpyError) else
                                          f"{type(e).__name__}: {e}" if str(e) else
                                          f"{type(e).__name__}: no answer in time")
    why = "; ".join(f"{src}: {errors[key]}" for src, key in STACK_SOURCES.items()
                    if key in errors)
    return 502, dict(base, error=f"no stacks of process {rec.name} ({why})", **errors)


# -- the HTTP server ------------------------------------------------------------------------
class _Handler(TokenHandler):
    server_version = "hpcmesh-admin"

    def get(self, path: str, query: dict) -> tuple:
        rt = self.server.runtime
        if path == "/api/tree":
            return 200, collect_tree(rt)
        if path.startswith("/api/stack/"):
            return collect_stacks(rt, unquote(path[len("/api/stack/"):]),
                                  **{k: query[k][-1] for k in ("source", "native") if k in query})
        if path == "/api/debug":
            return 200, {"sessions": sessions_of(rt)}
        return 404, {"error": f"no endpoint {path!r}; there are /api/tree, "
                              f"/api/stack/<process> and /api/debug"}

    def post(self, path: str, body: bytes) -> tuple:
        """``POST /api/debug/<process>`` with ``{"session": N, "line": "..."}``: one line
        to a paused endpoint's pdb (``hpcmesh debug``); the only thing that is not GET."""
        if not path.startswith("/api/debug/"):
            return 405, {"error": "the admin view is read-only but for POST /api/debug/<process>"}
        try:
            doc = json.loads(body or b"{}")
            session, line = doc["session"], doc.get("line")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            session = line = None
        if type(session) is not int:        # (not 1e400, true, "1"; the session's number)
            return 400, {"error": 'the body must be JSON like {"session": 1, "line": "p x"}, '
                                  'session a whole number'}
        if line is not None and not isinstance(line, str):
            return 400, {"error": "line must be a string or null"}
        return 200, send_to(self.server.runtime, unquote(path[len("/api/debug/"):]), session,
                            line)


class AdminServer(TokenServer):
    def __init__(self, runtime: ClientRuntime, addr: str | None):
        self.runtime = runtime
        super().__init__(_Handler, addr, name="hpcmesh-admin")


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
            # (the token elided: the URL with it is state().admin_url and $HPCMESH_ADMIN_URL)
            log.info("admin view at %s", redacted(admin_endpoint(_server.url, "/api/tree")))
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
