"""The dashboard's plots: what the job did over the last minutes, in time buckets (pure:
``q`` runs a query and returns rows as dicts).

A long run is judged by its trend, not its totals: calls/s of each actor mesh falling,
a host whose memory climbs, a GPU gone idle, and when the job was requeued or a process
failed. Each series is a list of ``[bucket start in µs, value]`` over ``WINDOW_S``; a
bucket with no rows is absent (the page draws a gap, not a zero it does not know).
"""

from __future__ import annotations

from typing import Callable

from .schema import TABLES

#: How far back the plots reach, and how wide one point is.
WINDOW_S = 300
BUCKET_S = 5


def timeseries_document(q: Callable[[str], list[dict]], now_us: int,
                        mesh_names: dict[str, str]) -> dict:
    """``{"window_s", "bucket_s", "since_us", "now_us", "calls", "hosts", "marks"}``:
    ``calls`` one series per actor mesh (calls handled per second, its actors summed;
    ``mesh_names``: mesh id -> the name given at spawn), ``hosts`` per host its processes'
    CPU (percent of one core, summed), resident memory (bytes, summed) and, where it has
    GPUs, their mean utilisation; ``marks`` the moments to draw across every plot
    (process failures, and job events where the job records them)."""
    bucket_us = BUCKET_S * 1_000_000
    since = (now_us - WINDOW_S * 1_000_000) // bucket_us * bucket_us
    bucket = f"CAST(timestamp_us / {bucket_us} AS BIGINT) * {bucket_us}"
    calls = q(f"""
        SELECT a.mesh_id AS mesh, b, COUNT(*) AS n FROM (
            SELECT to_actor_id, {bucket} AS b FROM messages WHERE timestamp_us >= {since}) m
        JOIN actors a ON a.id = m.to_actor_id
        GROUP BY a.mesh_id, b ORDER BY b""")
    per_mesh: dict[str, list] = {}
    for r in calls:
        name = mesh_names.get(r["mesh"], r["mesh"])
        per_mesh.setdefault(name, []).append([r["b"], r["n"] / BUCKET_S])
    # a process's samples in a bucket are averaged first, then a host's processes summed:
    # a bucket with five samples of a process counts it once, not five times
    usage = q(f"""
        SELECT host, b, SUM(cpu) AS cpu, SUM(rss) AS rss FROM (
            SELECT host, process, {bucket} AS b, AVG(cpu_percent) AS cpu,
                   AVG(rss_bytes) AS rss
            FROM metric_process WHERE timestamp_us >= {since} GROUP BY host, process, b)
        GROUP BY host, b ORDER BY b""")
    gpus = q(f"""
        SELECT host, {bucket} AS b, AVG(utilization_percent) AS util FROM metric_gpu
        WHERE timestamp_us >= {since} GROUP BY host, b ORDER BY b""")
    hosts: dict[str, dict] = {}
    for r in usage:
        h = hosts.setdefault(r["host"] or "?", {"cpu": [], "rss": [], "gpu": []})
        h["cpu"].append([r["b"], round(r["cpu"] or 0.0, 1)])
        h["rss"].append([r["b"], int(r["rss"] or 0)])
    for r in gpus:
        h = hosts.setdefault(r["host"] or "?", {"cpu": [], "rss": [], "gpu": []})
        h["gpu"].append([r["b"], round(r["util"] or 0.0, 1)])
    return {"window_s": WINDOW_S, "bucket_s": BUCKET_S, "since_us": since, "now_us": now_us,
            "calls": [{"name": n, "points": p} for n, p in sorted(per_mesh.items())],
            "hosts": [dict(host=h, **s) for h, s in sorted(hosts.items())],
            "marks": _marks(q, since)}


def _marks(q: Callable[[str], list[dict]], since: int) -> list[dict]:
    """``[{"timestamp_us", "kind", "text"}]``: failures of processes (their class first),
    and the job's own events (requeued, preempted...) when its telemetry has a
    ``job_events`` table."""
    marks = [{"timestamp_us": r["timestamp_us"], "kind": "failure",
              "text": (f"[{r['failure_class']}] " if r["failure_class"] else "") +
                      (r["reason"] or f"process {r['label']} of {r['mesh']} failed")}
             for r in q(f"SELECT timestamp_us, mesh, label, reason, failure_class "
                        f"FROM process_status_events "
                        f"WHERE new_status = 'failed' AND timestamp_us >= {since} "
                        f"ORDER BY timestamp_us LIMIT 200")]
    if "job_events" in TABLES:
        marks += [{"timestamp_us": r["timestamp_us"], "kind": "job",
                   "text": f"Slurm job {r['job_id']} {r['kind']} ({r['reason']})"}
                  for r in q(f"SELECT timestamp_us, job_id, kind, reason FROM job_events "
                             f"WHERE timestamp_us >= {since} ORDER BY timestamp_us LIMIT 200")]
    return sorted(marks, key=lambda m: m["timestamp_us"])
