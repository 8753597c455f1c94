"""The job's telemetry service on the controller: collector, store, SQL, HTTP, dashboard.

``start_telemetry(config)`` (what ``state()`` calls once ``job.enable_telemetry()`` was
set) starts one per controller process and returns the ``JobState`` fields:
``query_engine`` (in-process), ``query_engine_client`` (HTTP), ``telemetry_url`` (``POST
/api/query`` with ``{"sql": ...}`` answers Arrow IPC; ``GET /api/tables`` the schema) and,
with ``include_dashboard``, ``dashboard_url``. Both servers bind to loopback and need a
token, as the admin view does (``token_http.py``); the dashboard has a token of its
own, so that a URL shown on a screen or shared reads the dashboard and nothing else (its
server answers GET only, and its token opens neither the SQL service nor the admin view).
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import math
import os
import threading
import time
from importlib import resources
from typing import Any, Callable

from ..token_http import TokenHandler, TokenServer
from ..runtime.observe import telemetry_recorder
from ..runtime.client import ClientRuntime, client_runtime
from .collector import Collector
from .config import TelemetryConfig
from .engine import ARROW_STREAM, QueryEngine, QueryEngineClient, TelemetryQueryError
from .schema import TABLES
from .store import TelemetryStore

log = logging.getLogger("hpcmesh.telemetry")

URL_VARS = ("HPCMESH_TELEMETRY_URL",)


def _arrow_ipc(table: Any) -> bytes:
    import pyarrow as pa
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


class _QueryHandler(TokenHandler):
    server_version = "hpcmesh-telemetry"

    def get(self, path: str, query: dict) -> tuple:
        if path == "/api/tables":
            return 200, {name: [{"name": n, "type": ty, "doc": doc} for n, ty, doc in
                                t.all_columns] for name, t in TABLES.items()}
        return 404, {"error": f"no endpoint {path!r}; there are POST /api/query and GET "
                              f"/api/tables"}

    def post(self, path: str, body: bytes) -> tuple:
        if path != "/api/query":
            return 404, {"error": f"no endpoint {path!r}; POST to /api/query"}
        try:
            sql = query_body(body)
        except ValueError as e:
            return 400, {"error": str(e)}
        try:
            table = self.server.service.engine.query(sql)
        except TelemetryQueryError as e:
            return 400, {"error": str(e)}
        return 200, _arrow_ipc(table), ARROW_STREAM


def query_body(body: bytes) -> str:
    """The SQL of a ``POST /api/query`` body, which must be ``{"sql": "<text>"}``: anything
    else (not JSON, nested past Python's recursion limit, a number JSON cannot hold such as
    ``1e400`` or ``NaN``, another field) is a ``ValueError`` saying what is wrong."""
    def finite(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise ValueError(f"the number {text[:40]} is too large for a JSON number")
        return value

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not a JSON number")
    shape = 'the body must be JSON like {"sql": "SELECT ..."}'
    try:
        doc = json.loads(body or b"", parse_float=finite, parse_constant=constant)
    except RecursionError:
        raise ValueError(f"{shape}; this one is nested too deeply") from None
    except ValueError as e:      # also a body that is not UTF-8
        raise ValueError(f"{shape}; this one is not: {e}") from None
    if not isinstance(doc, dict):
        kind = {list: "an array", str: "a string", bool: "true or false",
                type(None): "null"}.get(type(doc), "a number")
        raise ValueError(f"{shape}; this one is {kind}")
    if not isinstance(doc.get("sql"), str):
        raise ValueError(f"{shape}; its \"sql\" is " + (
            "missing" if "sql" not in doc else f"not a string: {json.dumps(doc['sql'])[:40]}"))
    extra = sorted(set(doc) - {"sql"})
    if extra:
        raise ValueError(f"{shape}: \"sql\" is its only field, not "
                         f"{', '.join(map(repr, extra))}")
    return doc["sql"]


class _DashboardHandler(TokenHandler):
    server_version = "hpcmesh-dashboard"

    def get(self, path: str, query: dict) -> tuple:
        if path in ("/", "/index.html"):
            page = resources.files("hpcmesh.telemetry").joinpath("dashboard.html").read_bytes()
            return 200, page, "text/html; charset=utf-8"
        if path == "/api/dashboard":
            return 200, self.server.service.dashboard_document()
        return 404, {"error": f"no page {path!r}; the dashboard is at /"}


class TelemetryService:
    """One controller's telemetry: what ``start_telemetry`` starts and keeps."""

    def __init__(self, rt: ClientRuntime, config: TelemetryConfig, save_to: str | None,
                 job_status: Callable[[], dict | None] | None):
        self.rt = rt
        self.config = config
        self.save_to = save_to
        self.job_status = job_status
        self.store = TelemetryStore(config.retention_secs)
        self.loaded = self.store.load(save_to) if save_to and os.path.isdir(save_to) else 0
        self.collector = Collector(rt, self.store, snapshot_interval=config.snapshot_interval_secs,
                                   save_to=save_to)
        self.engine = QueryEngine(self.store, self.collector)
        self.query_server = TokenServer(_QueryHandler, None, name="hpcmesh-telemetry-http")
        self.query_server.service = self
        self.dashboard: TokenServer | None = None
        if config.include_dashboard:
            self.dashboard = self._dashboard_server(config.dashboard_port)
        self._job_cache: tuple[float, Any] = (0.0, None)
        self.collector.start()

    def _dashboard_server(self, port: int) -> TokenServer:
        # a token of its own (TokenServer makes one): the dashboard's URL is shown to
        # people, and must not open the SQL service
        try:
            srv = TokenServer(_DashboardHandler, f"127.0.0.1:{port}", name="hpcmesh-dashboard")
        except OSError as e:
            if e.errno != errno.EADDRINUSE or port == 0:
                raise
            srv = TokenServer(_DashboardHandler, "127.0.0.1:0", name="hpcmesh-dashboard")
            log.warning("dashboard_port %d is in use; the dashboard is on port %d instead",
                        port, srv.server_address[1])
        srv.service = self
        return srv

    @property
    def telemetry_url(self) -> str:
        return self.query_server.url

    @property
    def dashboard_url(self) -> str | None:
        return self.dashboard.url if self.dashboard is not None else None

    def fields(self) -> dict[str, Any]:
        """The JobState fields."""
        return {"query_engine": self.engine,
                "query_engine_client": QueryEngineClient(self.telemetry_url),
                "telemetry_url": self.telemetry_url, "dashboard_url": self.dashboard_url}

    def close(self) -> None:
        self.collector.stop()
        self.query_server.close()
        if self.dashboard is not None:
            self.dashboard.close()
        self.engine.close()

    # -- the dashboard's document ----------------------------------------------------
    def _job(self) -> Any:
        at, doc = self._job_cache
        if self.job_status is not None and time.monotonic() - at > 10:
            try:
                doc = self.job_status()
            except Exception as e:  # noqa: BLE001 - squeue may be slow or gone
                doc = {"error": f"{type(e).__name__}: {e}"}
            self._job_cache = (time.monotonic(), doc)
        return doc

    def dashboard_document(self) -> dict:
        """What the page draws: per actor mesh a grid of its actors (status, calls, call
        rate over the last 10 s, p50/p99), failures with reasons, the job, a log tail."""
        from .dashboard import dashboard_document
        self.collector.collect()
        return dashboard_document(lambda sql: self.engine.query(sql, fresh=False).to_pylist(),
                                  self._job())


_service: TelemetryService | None = None
_lock = threading.Lock()
_at_exit = False


def start_telemetry(config: TelemetryConfig | None = None, *, save_to: str | None = None,
                    job_status: Callable[[], dict | None] | None = None,
                    meshes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start (or keep) this controller's telemetry; the JobState fields. ``save_to``: the
    job's folder for the store (a reconnecting client loads it); ``meshes``: the job's
    HostMeshes, whose agents are sampled too."""
    global _service, _at_exit
    config = (config or TelemetryConfig()).check()
    rt = client_runtime()
    with _lock:
        if not _at_exit:     # after the runtime's own: so it runs first (LIFO), while
            atexit.register(stop_telemetry)     # the processes can still be drained
            _at_exit = True
        if _service is not None and (_service.config != config or _service.rt is not rt
                                     or _service.save_to != save_to):
            _service.close()
            _service = None
        if _service is None:
            _service = TelemetryService(rt, config, save_to, job_status)
            log.info("telemetry at %s", _service.telemetry_url.split("?")[0])
        elif job_status is not None:
            _service.job_status = job_status
        if meshes:
            _service.collector.watch_hosts(meshes)
        os.environ[telemetry_recorder.TELEMETRY_VAR] = "1"   # processes started from now on
        for var in URL_VARS:
            os.environ[var] = _service.telemetry_url
        return _service.fields()


def current_service() -> TelemetryService | None:
    return _service


def stop_telemetry() -> None:
    """Stop collecting and serving (at exit; the store is saved first)."""
    global _service
    with _lock:
        if _service is not None:
            _service.close()
            _service = None
            os.environ.pop(telemetry_recorder.TELEMETRY_VAR, None)
            for var in URL_VARS:
                os.environ.pop(var, None)
            telemetry_recorder.disable()

