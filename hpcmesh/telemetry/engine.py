"""SQL over the telemetry tables: Apache DataFusion on the store's Arrow batches.

DataFusion, not DuckDB, because it is Monarch's engine: a query written against Monarch's
telemetry (its dialect: ``approx_percentile_cont``, ``median``...) runs here unchanged, and
it reads Arrow record batches as they are. ``QueryEngine`` answers in the controller's
process; ``QueryEngineClient`` asks one over HTTP (``<telemetry_url>/api/query``, as
Monarch's client does) and gets Arrow IPC back.

The service is read-only and bounded, for whoever holds its URL: one SELECT-like statement
(DataFusion's ``SQLOptions`` refuse DDL, DML and other statements: COPY ... TO, INSERT,
CREATE EXTERNAL TABLE, SET...), run in a worker process (``query_worker.py``) with a
memory pool, killed at the time limit, and an answer of at most a row cap
(``QueryLimits``: ``HPCMESH_TELEMETRY_QUERY_*``).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from ..token_http import endpoint_url, url_token
from ..errors import HpcmeshError
from ..settings import env_number
from .query_worker import QueryWorker, WorkerError
from .schema import TABLES

ARROW_STREAM = "application/vnd.apache.arrow.stream"

TIMEOUT_VAR = "HPCMESH_TELEMETRY_QUERY_TIMEOUT"
MEMORY_VAR = "HPCMESH_TELEMETRY_QUERY_MEMORY_MB"
ROWS_VAR = "HPCMESH_TELEMETRY_QUERY_ROWS"

#: What the service runs, said in every refusal.
ALLOWED = ("one SELECT statement (or WITH ..., VALUES, EXPLAIN, SHOW, DESCRIBE) over the "
           "tables " + ", ".join(TABLES))


class TelemetryQueryError(HpcmeshError, ValueError):
    """A query the engine refused or stopped (a statement that is not a query, bad SQL, an
    unknown table or column, past a limit)."""


@dataclass(frozen=True)
class QueryLimits:
    """What one query may take: ``timeout_s`` of wall time (then its worker is killed),
    ``memory_mb`` of DataFusion's memory pool (its worker is killed if it grows by twice
    that), ``max_rows`` rows in the answer (more is refused, not cut)."""
    timeout_s: float = 30.0
    memory_mb: int = 512
    max_rows: int = 100_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "QueryLimits":
        """The limits ``HPCMESH_TELEMETRY_QUERY_TIMEOUT`` (seconds), ``..._MEMORY_MB``
        and ``..._ROWS`` set, these defaults for those unset; a bad value is a
        ``ValueError`` naming its variable."""
        d = cls()
        return cls(timeout_s=env_number(TIMEOUT_VAR, d.timeout_s, minimum=0.1, finite=True,
                                        env=env),
                   memory_mb=int(env_number(MEMORY_VAR, d.memory_mb, unit="megabytes",
                                            minimum=16, integer=True, finite=True, env=env)),
                   max_rows=int(env_number(ROWS_VAR, d.max_rows, unit="rows", minimum=1,
                                           integer=True, finite=True, env=env)))


class QueryEngine:
    """``query(sql) -> pyarrow.Table`` over the store; collects from every process first
    (``fresh=False`` skips that) so the answer includes the calls just made."""

    def __init__(self, store: Any, collector: Any = None, limits: QueryLimits | None = None):
        self.store = store
        self.collector = collector
        self.limits = limits or QueryLimits.from_env()
        self._worker = QueryWorker()
        weakref.finalize(self, self._worker.close)

    @property
    def worker(self) -> QueryWorker:
        """The handle on the query worker process: its pid, what was shipped to it."""
        return self._worker

    def tables(self) -> list[str]:
        return list(TABLES)

    def query(self, sql: str, fresh: bool = True) -> Any:
        if not isinstance(sql, str) or not sql.strip():
            raise TelemetryQueryError(f"query() takes an SQL string, got {sql!r}")
        if fresh and self.collector is not None:
            self.collector.collect()
        tables = {name: self.store.batches(name) for name in TABLES}
        lim = self.limits
        try:
            return self._worker.run(sql, tables, timeout_s=lim.timeout_s,
                                    memory_bytes=lim.memory_mb << 20, max_rows=lim.max_rows)
        except WorkerError as e:
            raise TelemetryQueryError(explain(e, lim)) from None

    def close(self) -> None:
        """Stop the query worker (a later query starts another)."""
        self._worker.close()


#: DataFusion's name of a statement its SQLOptions refused -> how SQL spells it, and why
#: it is refused (by default: what its kind does).
_REFUSED = {"COPY": ("COPY ... TO", "a statement that writes files"),
            "CreateExternalTable": ("CREATE EXTERNAL TABLE", "a statement that reads files "
                                    "into a new table"),
            "CreateMemoryTable": ("CREATE TABLE", None),
            "Insert Into": ("INSERT INTO", None),
            "SetVariable": ("SET", "a statement that changes the session's settings")}
_KIND_DOES = {"DML": "a statement that writes into a table or to files",
              "DDL": "a statement that changes the catalog",
              "Statement": "a statement that changes the session"}


def explain(e: WorkerError, limits: QueryLimits) -> str:
    """What was refused or stopped, and what is allowed."""
    msg = e.message.strip()
    refused = re.search(r"\b(DDL|DML|Statement) not supported: (.+)", msg)
    if e.kind == "failed" and refused:
        kind, name = refused.group(1), refused.group(2).strip()
        spelled, why = _REFUSED.get(name, (None, None))
        spelled = spelled or re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).upper()
        return (f"refused: {spelled} is {why or _KIND_DOES[kind]}; this telemetry SQL service "
                f"is read-only and runs {ALLOWED}")
    if e.kind == "failed" and "only supports a single SQL statement" in msg:
        return (f"refused: more than one statement; this telemetry SQL service is read-only "
                f"and runs {ALLOWED}")
    unsupported = re.search(r"Unsupported SQL statement: (.+)", msg)
    if e.kind == "failed" and unsupported:
        return (f"refused: {unsupported.group(1).strip()} is not a query; this telemetry "
                f"SQL service is read-only and runs {ALLOWED}")
    memory = (f"its memory limit of {limits.memory_mb} MB ({MEMORY_VAR}; a smaller query: "
              f"fewer rows, groups or columns, or a LIMIT)")
    if (e.kind == "failed" and "Resources exhausted" in msg) or e.kind == "memory":
        return f"the query needed more than {memory}: {msg}"
    if e.kind == "timeout":
        return (f"the query ran past its time limit of {limits.timeout_s:g} s ({TIMEOUT_VAR})"
                f" and was stopped")
    if e.kind == "rows":
        return (f"the answer has more than {limits.max_rows} rows, the cap ({ROWS_VAR}): add a "
                f"LIMIT, a WHERE or a GROUP BY")
    if e.kind == "bytes":
        return f"the answer is larger than {memory} ({msg})"
    if e.kind == "panic":
        return (f"DataFusion panicked on this query ({msg}): a bug in DataFusion; the "
                f"query was stopped and its worker replaced")
    if e.kind in ("crashed", "busy"):
        return msg
    return (f"telemetry query failed: {msg}\n(the tables: {', '.join(TABLES)}; their "
            f"columns are in docs/TELEMETRY.md)")


class QueryEngineClient:
    """Monarch's ``state.query_engine_client``: ``query(sql) -> pyarrow.Table``, over HTTP
    from any process that has the ``telemetry_url`` (it carries the token)."""

    def __init__(self, telemetry_url: str, timeout: float = 60.0):
        self.url = telemetry_url
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"QueryEngineClient({endpoint_url(self.url, '/api/query').split('?')[0]!r})"

    def query(self, sql: str) -> Any:
        import pyarrow as pa
        req = urllib.request.Request(
            endpoint_url(self.url, "/api/query").split("?")[0],
            data=json.dumps({"sql": sql}).encode(), method="POST",
            headers={"Content-Type": "application/json", "Accept": ARROW_STREAM,
                     "Authorization": f"Bearer {url_token(self.url)}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            if e.code == 400:
                raise TelemetryQueryError(detail) from None
            raise RuntimeError(f"the telemetry server at {req.full_url} answered {e.code}: "
                               f"{detail or e.reason}") from None
        return pa.ipc.open_stream(body).read_all()
