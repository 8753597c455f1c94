"""SQL over the telemetry tables: Apache DataFusion on the store's Arrow batches.

DataFusion, not DuckDB, because it is Monarch's engine: a query written against Monarch's
telemetry (its dialect: ``approx_percentile_cont``, ``median``...) runs here unchanged, and
it reads Arrow record batches as they are. ``QueryEngine`` runs in the controller's
process; ``QueryEngineClient`` asks one over HTTP (``<telemetry_url>/api/query``, as
Monarch's client does) and gets Arrow IPC back.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ..admin.token_http import endpoint_url, url_token
from ..errors import HpcmeshError
from .schema import TABLES
from .store import plain_schema

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class TelemetryQueryError(HpcmeshError, ValueError):
    """A query the engine refused (bad SQL, an unknown table or column)."""


def _datafusion():
    try:
        import datafusion
    except ImportError:
        raise ImportError("hpcmesh telemetry queries need datafusion (and pyarrow): pip "
                          "install 'hpcmesh[telemetry]'") from None
    return datafusion


class QueryEngine:
    """``query(sql) -> pyarrow.Table`` over the store; collects from every process first
    (``fresh=False`` skips that) so the answer includes the calls just made."""

    def __init__(self, store: Any, collector: Any = None):
        self.store = store
        self.collector = collector

    def tables(self) -> list[str]:
        return list(TABLES)

    def query(self, sql: str, fresh: bool = True) -> Any:
        if not isinstance(sql, str) or not sql.strip():
            raise TelemetryQueryError(f"query() takes an SQL string, got {sql!r}")
        if fresh and self.collector is not None:
            self.collector.collect()
        df = _datafusion()
        ctx = df.SessionContext()
        for name in TABLES:
            ctx.register_record_batches(name, [self.store.batches(name)])
        try:
            table = ctx.sql(sql).to_arrow_table()
            # plain strings out (the store keeps some dictionary-encoded, a dictionary per
            # batch: pyarrow's own group_by or combine_chunks could not unify them)
            return table.cast(plain_schema(table.schema))
        except Exception as e:  # noqa: BLE001 - DataFusion raises plain Exceptions
            raise TelemetryQueryError(f"telemetry query failed: {e}\n(the tables: "
                                      f"{', '.join(TABLES)}; their columns are in "
                                      f"docs/TELEMETRY.md)") from None


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
