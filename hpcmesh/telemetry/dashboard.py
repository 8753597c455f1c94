"""The dashboard's document, from SQL over the telemetry tables (pure: ``q`` runs a query
and returns rows as dicts, so this is testable without a job)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

#: Calls per second are counted over this window.
RATE_WINDOW_S = 10


def dashboard_document(q: Callable[[str], list[dict]], job: Any = None) -> dict:
    now_us = int(time.time() * 1e6)
    since = now_us - RATE_WINDOW_S * 1_000_000
    meshes = q("SELECT id, class, given_name, shape_json FROM meshes WHERE kind = 'actor' "
               "ORDER BY timestamp_us")
    actors = q("""
        SELECT a.id, a.mesh_id, a.rank, a.host, a.pid, s.new_status, s.reason
        FROM actors a LEFT JOIN (
            SELECT actor_id, new_status, reason,
                   ROW_NUMBER() OVER (PARTITION BY actor_id ORDER BY timestamp_us DESC) AS rn
            FROM actor_status_events) s
        ON s.actor_id = a.id AND s.rn = 1""")
    stats = q(f"""
        SELECT to_actor_id, COUNT(*) AS calls,
               SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS errors,
               SUM(CASE WHEN timestamp_us >= {since} THEN 1 ELSE 0 END) AS recent,
               approx_percentile_cont(duration_us, 0.5) AS p50_us,
               approx_percentile_cont(duration_us, 0.99) AS p99_us
        FROM messages GROUP BY to_actor_id""")
    by_actor = {s["to_actor_id"]: s for s in stats}
    grid = []
    for m in meshes:
        members = sorted((a for a in actors if a["mesh_id"] == m["id"]), key=lambda a: a["rank"])
        cells = []
        for a in members:
            s = by_actor.get(a["id"], {})
            cells.append({"rank": a["rank"], "actor_id": a["id"],
                          "status": a["new_status"] or "unknown", "reason": a["reason"],
                          "host": a["host"], "pid": a["pid"], "calls": s.get("calls", 0),
                          "errors": s.get("errors", 0),
                          "rate": (s.get("recent") or 0) / RATE_WINDOW_S,
                          "p50_us": s.get("p50_us"), "p99_us": s.get("p99_us")})
        try:
            extent = json.loads(m["shape_json"] or "{}")
        except ValueError:
            extent = {}
        grid.append({"id": m["id"], "name": m["given_name"], "class": m["class"],
                     "extent": extent, "actors": cells})
    endpoints = q("""
        SELECT endpoint, COUNT(*) AS calls,
               SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS errors,
               approx_percentile_cont(duration_us, 0.5) AS p50_us,
               approx_percentile_cont(duration_us, 0.99) AS p99_us
        FROM messages GROUP BY endpoint ORDER BY calls DESC LIMIT 50""")
    failures = q("""
        SELECT s.timestamp_us, COALESCE(a.full_name, s.actor_id) AS what, s.reason
        FROM actor_status_events s LEFT JOIN actors a ON a.id = s.actor_id
        WHERE s.new_status = 'failed'
        UNION ALL
        SELECT timestamp_us, CONCAT('process ', label, ' of ', mesh) AS what, reason
        FROM process_status_events WHERE new_status = 'failed'
        ORDER BY timestamp_us DESC LIMIT 30""")
    logs = q("SELECT timestamp_us, source, level, message FROM events "
             "ORDER BY timestamp_us DESC LIMIT 60")
    procs = q("""
        SELECT new_status, COUNT(*) AS n FROM (
            SELECT new_status, ROW_NUMBER() OVER (PARTITION BY process
                                                  ORDER BY timestamp_us DESC) AS rn
            FROM process_status_events) WHERE rn = 1 GROUP BY new_status""")
    return {"generated_us": now_us, "job": job, "meshes": grid, "endpoints": endpoints,
            "failures": failures, "logs": list(reversed(logs)),
            "processes": {p["new_status"]: p["n"] for p in procs}}

