"""The ``/api/tree`` document, built from plain records (pure: no runtime, no sockets).

hosts -> processes -> actors. A process's actors come from the process itself when it
answered (``introspect.actor_report``); otherwise from what the controller remembers of the
actor meshes spawned on it, with the process's status, since their state cannot be asked.
"""

from __future__ import annotations

from typing import Any, Iterable


def process_status(*, failure: Any, connected_once: bool, connected: bool,
                   stopping: bool) -> str:
    """running / failed / stopped, or starting (not connected yet), stopping (asked to,
    still connected) and lost (the connection dropped and no exit was reported yet)."""
    if failure is not None:
        return "failed"
    if not connected_once:
        return "starting"
    if stopping:
        return "stopping" if connected else "stopped"
    return "running" if connected else "lost"


def point_json(point: Any) -> Any:
    """A mesh point as JSON: its coordinates by dimension name when it is a mapping."""
    if point is None:
        return None
    if hasattr(point, "items"):
        try:
            return {str(k): int(v) for k, v in point.items()}
        except (TypeError, ValueError):
            pass
    return str(point)


def remembered_actors(proc_name: str, proc_status: str, proc_error: str | None,
                      meshes: Iterable[dict]) -> list[dict]:
    """The actors of ``proc_name`` from the controller's records of actor meshes (each
    ``{actor_id, name, class, proc_names}``): for a process that did not answer."""
    status = {"failed": "failed", "stopped": "stopped"}.get(proc_status, "unknown")
    out = []
    for m in meshes:
        names = list(m.get("proc_names", ()))
        if proc_name in names:
            out.append({"actor_id": m.get("actor_id"), "mesh": m.get("name"),
                        "class": m.get("class"), "point": {"rank": names.index(proc_name)},
                        "status": status,
                        "error": proc_error if status == "failed" else None})
    return out


def build_tree(procs: Iterable[dict], actors_by_proc: dict[str, list[dict] | None],
               meshes: Iterable[dict], stragglers: Iterable[dict] = ()) -> dict:
    """``procs``: one dict per process (name, label, mesh, point, host, pid, status, error);
    ``actors_by_proc``: what each process reported (None or absent: it did not answer).
    A process whose point is a mesh ``Point`` also gets its ``rank`` there, and
    ``proc_meshes`` the extent of each such mesh: where a grid of many processes puts
    each (``hpcmesh top``'s heatmap). ``stragglers``: the controller's recent straggler
    and hang reports (``Report.to_json``), newest last; a process late in one whose call
    has not finished gets ``straggler`` (report id, kind, seconds, its group's headline)."""
    meshes = list(meshes)
    stragglers = list(stragglers)
    late: dict[str, dict] = {}
    for r in stragglers:
        if r.get("finished_after_s") is None:
            for g in r.get("groups", ()):
                for m in g.get("members", ()):
                    late[m["process"]] = {"report": r["id"], "kind": r["kind"],
                                          "waited_s": m["waited_s"], "headline": g["headline"]}
    hosts: dict[str, list[dict]] = {}
    extents: dict[str, dict] = {}
    for p in procs:
        reported = actors_by_proc.get(p["name"])
        actors = reported if reported is not None else \
            remembered_actors(p["name"], p["status"], p.get("error"), meshes)
        point = p.get("point")
        entry = dict(p, point=point_json(point), answered=reported is not None,
                     actors=actors, rank=getattr(point, "rank", None),
                     straggler=late.get(p["name"]))
        if entry["rank"] is not None:
            extents.setdefault(p.get("mesh"), point_json(point.extent))
        hosts.setdefault(p.get("host") or "(unknown host)", []).append(entry)
    return {"hosts": [{"host": h, "processes": ps} for h, ps in sorted(hosts.items())],
            "proc_meshes": extents, "stragglers": stragglers}
