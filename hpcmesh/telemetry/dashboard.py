"""The dashboard's document, from SQL over the telemetry tables (pure: ``q`` runs a query
and returns rows as dicts, so this is testable without a job).

A job of 256 processes must stay readable and load in well under a second: processes
come as one heatmap per process mesh (its leading dimensions down, the last across: hosts
x gpus), each cell one process with its status and its actors' calls, and the page draws
big actor meshes as heatmaps too. The document is built from as few queries as before
(each is a round trip to the query worker): a process's calls are its actors'.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from ..shapes import Point
from .timeseries import timeseries_document

#: Calls per second are counted over this window.
RATE_WINDOW_S = 10
#: Processes named late (``stragglers``) this recently are marked on the heatmaps.
STRAGGLER_WINDOW_S = 600
#: Straggler and hang reports the page lists, newest first.
STRAGGLER_REPORTS_SHOWN = 10


def dashboard_document(q: Callable[[str], list[dict]], job: Any = None) -> dict:
    now_us = int(time.time() * 1e6)
    since = now_us - RATE_WINDOW_S * 1_000_000
    all_meshes = q("SELECT id, kind, class, given_name, shape_json FROM meshes "
                   "WHERE kind IN ('actor', 'proc') ORDER BY timestamp_us")
    meshes = [m for m in all_meshes if m["kind"] == "actor"]
    actors = q("""
        SELECT a.id, a.mesh_id, a.rank, a.process, a.host, a.pid, s.new_status, s.reason,
               s.failure_class
        FROM actors a LEFT JOIN (
            SELECT actor_id, new_status, reason, failure_class,
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
    late = q(f"""
        SELECT report_id, timestamp_us, kind, mesh, endpoint, point, process, host, pid,
               waited_s, stack_group, group_size, headline
        FROM stragglers WHERE timestamp_us >= {now_us - STRAGGLER_WINDOW_S * 1_000_000}
        ORDER BY timestamp_us DESC, report_id DESC, stack_group, point LIMIT 5000""")
    newest = newest_straggler_rows(late)
    grid = []
    for m in meshes:
        members = sorted((a for a in actors if a["mesh_id"] == m["id"]), key=lambda a: a["rank"])
        cells = []
        for a in members:
            s = by_actor.get(a["id"], {})
            cells.append({"rank": a["rank"], "actor_id": a["id"],
                          "status": a["new_status"] or "unknown", "reason": a["reason"],
                          "failure_class": a["failure_class"],
                          "host": a["host"], "pid": a["pid"], "calls": s.get("calls", 0),
                          "errors": s.get("errors", 0),
                          "rate": (s.get("recent") or 0) / RATE_WINDOW_S,
                          "p50_us": s.get("p50_us"), "p99_us": s.get("p99_us"),
                          "straggler": newest.get(a["process"])})
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
        SELECT s.timestamp_us, COALESCE(a.full_name, s.actor_id) AS what, s.failure_class,
               s.reason
        FROM actor_status_events s LEFT JOIN actors a ON a.id = s.actor_id
        WHERE s.new_status = 'failed'
        UNION ALL
        SELECT timestamp_us, CONCAT('process ', label, ' of ', mesh) AS what, failure_class,
               reason
        FROM process_status_events WHERE new_status = 'failed'
        ORDER BY timestamp_us DESC LIMIT 30""")
    logs = q("SELECT timestamp_us, source, level, message FROM events "
             "ORDER BY timestamp_us DESC LIMIT 60")
    procs = q("""
        SELECT process, mesh, label, host, pid, new_status, reason, failure_class FROM (
            SELECT process, mesh, label, host, pid, new_status, reason, failure_class,
                   ROW_NUMBER() OVER (PARTITION BY process ORDER BY timestamp_us DESC) AS rn
            FROM process_status_events) WHERE rn = 1""")
    counts: dict[str, int] = {}
    for p in procs:
        counts[p["new_status"]] = counts.get(p["new_status"], 0) + 1
    names = {m["id"]: m["given_name"] for m in meshes}
    return {"generated_us": now_us, "job": job, "meshes": grid, "endpoints": endpoints,
            "timeseries": with_straggler_marks(timeseries_document(q, now_us, names), late),
            "failures": failures, "logs": list(reversed(logs)), "processes": counts,
            "stragglers": straggler_reports(late),
            "proc_meshes": process_heatmaps(
                procs, [m for m in all_meshes if m["kind"] == "proc"],
                [dict(a, mesh=names.get(a["mesh_id"]), **_stats(by_actor.get(a["id"], {})))
                 for a in actors], late)}


def with_straggler_marks(ts: dict, rows: list[dict]) -> dict:
    """The plots' ``marks`` with one more per straggler or hang report (``rows``: the
    ``stragglers`` table's) within their window."""
    late: dict[int, list[dict]] = {}
    for r in rows:
        if r["kind"] != "finished" and r["timestamp_us"] >= ts["since_us"]:
            late.setdefault(r["report_id"], []).append(r)
    marks = []
    for rs in late.values():
        biggest = min(rs, key=lambda r: r["stack_group"])
        marks.append({"timestamp_us": rs[0]["timestamp_us"], "kind": rs[0]["kind"],
                      "text": f"{rs[0]['kind']}: {len(rs)} late in {rs[0]['mesh']}."
                              f"{rs[0]['endpoint']} ({biggest['headline']})"})
    return dict(ts, marks=sorted(ts["marks"] + marks, key=lambda m: m["timestamp_us"]))


def newest_straggler_rows(rows: list[dict]) -> dict[str, dict]:
    """Per process late in a call not finished yet, what its newest ``stragglers`` row
    (``rows``: newest first) says of it: what marks its cells."""
    finished = {r["report_id"] for r in rows if r["kind"] == "finished"}
    newest: dict[str, dict] = {}
    for r in rows:
        if r["report_id"] in finished:      # its call finished: no longer late
            continue
        if r["process"] not in newest:
            newest[r["process"]] = {k: r[k] for k in ("kind", "waited_s", "headline",
                                                      "endpoint")}
    return newest


def straggler_reports(rows: list[dict]) -> list[dict]:
    """The ``stragglers`` rows (newest first) as reports: per report its call, and its
    groups (stack headline, how many, which points), newest report first."""
    reports: dict[int, dict] = {}
    finished = {r["report_id"]: r["waited_s"] for r in rows if r["kind"] == "finished"}
    for r in rows:
        if r["kind"] == "finished":
            continue
        rep = reports.get(r["report_id"])
        if rep is None:
            if len(reports) == STRAGGLER_REPORTS_SHOWN:
                continue
            rep = reports[r["report_id"]] = {
                "id": r["report_id"], "timestamp_us": r["timestamp_us"], "kind": r["kind"],
                "mesh": r["mesh"], "endpoint": r["endpoint"], "groups": {},
                "finished_after_s": finished.get(r["report_id"])}
        g = rep["groups"].setdefault(r["stack_group"], {"headline": r["headline"],
                                                       "count": r["group_size"], "points": []})
        g["points"].append(r["point"])
    return [dict(rep, groups=[rep["groups"][k] for k in sorted(rep["groups"])])
            for rep in reports.values()]


def _stats(s: dict) -> dict:
    return {"calls": s.get("calls") or 0, "errors": s.get("errors") or 0,
            "rate": (s.get("recent") or 0) / RATE_WINDOW_S}


def parse_label(label: str | None) -> dict[str, int] | None:
    """A process's point from its label (``hosts=3,gpus=5``, as ``shapes.point_label``
    writes it); None for anything else."""
    try:
        coords = {}
        for part in (label or "").split(","):
            dim, _, value = part.partition("=")
            coords[dim] = int(value)
        return coords if all(coords) else None
    except ValueError:
        return None


def process_heatmaps(procs: list[dict], proc_meshes: list[dict],
                     actors: list[dict], late: list[dict] = ()) -> list[dict]:
    """Per process mesh, what its heatmap needs: ``extent`` (from the mesh's row, else as
    far as its processes' labels reach; the page puts its leading dimensions down and the
    last across) and a cell per process at ``rank`` (row-major; None: its label does not
    fit the extent) with its status, where it runs, its actors and their calls, and
    ``straggler`` (None, or its newest row of ``late``: the ``stragglers`` table's, newest
    first) to mark it."""
    newest = newest_straggler_rows(late)
    extents = {}
    for m in proc_meshes:
        try:
            extents[m["given_name"]] = {str(k): int(v) for k, v in
                                        json.loads(m["shape_json"] or "{}").items()}
        except (ValueError, TypeError, AttributeError):
            pass
    by_proc: dict[str, list[dict]] = {}
    for a in actors:
        by_proc.setdefault(a.get("process"), []).append(a)
    groups: dict[str, list[dict]] = {}
    for p in procs:
        groups.setdefault(p["mesh"] or "", []).append(p)
    out = []
    for mesh, members in groups.items():
        coords = {p["process"]: parse_label(p["label"]) for p in members}
        extent = extents.get(mesh)
        if extent is None:      # no row of the mesh (telemetry came later): the labels'
            extent = {}
            for c in coords.values():
                for dim, v in (c or {}).items():
                    extent[dim] = max(extent.get(dim, 0), v + 1)
        cells = []
        for p in sorted(members, key=lambda p: p["process"]):
            mine = by_proc.get(p["process"], [])
            cells.append({
                "process": p["process"], "label": p["label"], "host": p["host"],
                "pid": p["pid"], "status": p["new_status"], "reason": p["reason"],
                "failure_class": p.get("failure_class"),
                "rank": _rank(coords[p["process"]], extent),
                "calls": sum(a["calls"] for a in mine), "errors": sum(a["errors"] for a in mine),
                "rate": sum(a["rate"] for a in mine),
                "straggler": newest.get(p["process"]),
                "actors": [{"mesh": a["mesh"], "rank": a["rank"],
                            "status": a["new_status"] or "unknown"} for a in mine]})
        out.append({"name": mesh, "extent": extent, "cells": cells})
    return out


def _rank(coords: dict[str, int] | None, extent: dict[str, int]) -> int | None:
    """Where ``coords`` is in ``extent`` (None: it is not a point of it)."""
    try:
        return Point.from_coords(coords, extent).rank if coords else None
    except (ValueError, LookupError, TypeError):
        return None

