"""Telemetry of a job: what every process did, kept as Arrow tables and queried with SQL.

``job.enable_telemetry(TelemetryConfig(...))`` then ``state()``: ``state.query_engine``
(in this process) and ``state.query_engine_client`` (over HTTP, from anywhere with the
URL) answer ``query(sql) -> pyarrow.Table``; ``state.dashboard_url`` serves a live page.
``span("name", **attributes)`` (``with``, ``async with``, a decorator) records a timed
section of code in the ``spans`` table, from any process of the job. The tables are in
``schema.py`` and docs/TELEMETRY.md. Needs ``hpcmesh[telemetry]`` (pyarrow, datafusion);
importing this package does not load them.
"""

from ..runtime.observe.spans import Span, span
from .config import TelemetryConfig

__all__ = ["Span", "TelemetryConfig", "span"]
