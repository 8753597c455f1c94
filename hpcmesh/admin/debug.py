"""Attach to ``breakpoint()`` sessions of a job's actors (``hpcmesh debug``,
``debug_controller()``).

The sessions live in the actors' processes (``runtime/observe/debugger.py``). The controller asks
its processes over the job's transport; ``hpcmesh debug`` in another terminal goes through
the controller's admin view (``GET /api/debug``, ``POST /api/debug/<process>``, behind its
token), which relays the same way. :func:`attach` is the prompt loop both use.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from ..runtime.client import ClientRuntime, client_runtime
from ..shapes import point_label
from ..token_http import request_json

#: A paused endpoint's session, as listed: process, host, pid, mesh, rank, point, session.
Session = dict


def sessions_of(rt: ClientRuntime, timeout: float = 5.0) -> list[Session]:
    """The open sessions of every running process this controller started."""
    node = rt.node
    asks = {rec.name: node.rpc(rec.node, "debug_sessions") for rec in list(rt.procs.values())
            if rec.node is not None and rec.failure is None
            and node.peer_connected(rec.node.node_id)}
    deadline = time.monotonic() + timeout
    out: list[Session] = []
    for fut in asks.values():
        try:
            out += fut.result(timeout=max(0.01, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - a process without the service, or busy: none
            continue
    return sorted(out, key=lambda s: (str(s.get("mesh")), s.get("rank") or 0, s["session"]))


def send_to(rt: ClientRuntime, process: str, session: int, line: str | None,
            timeout: float = 30.0) -> dict[str, Any]:
    rec = rt.procs.get(process)
    if rec is None or rec.node is None:
        return {"output": "", "ended": True, "error": f"no running process {process!r}"}
    return rt.node.rpc(rec.node, "debug_send", session, line).result(timeout=timeout)


def describe(s: Session) -> str:
    point = point_label(s["point"]) if s.get("point") is not None else s.get("rank")
    return (f"{s.get('mesh')}[{point}] ({s.get('actor_class')}) on {s.get('host')} pid "
            f"{s.get('pid')}, session {s['session']}")


def attach(session: Session, send: Callable[[str, int, str | None], dict],
           stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> bool:
    """The pdb prompt of ``session`` on ``stdin``/``stdout`` until the endpoint continues
    (``c``, ``q``, ``detach``, or end of input); True if it ended there."""
    res = send(session["process"], session["session"], None)
    while True:
        stdout.write(res.get("output", ""))
        if res.get("error"):
            stdout.write(res["error"] + "\n")
        stdout.flush()
        if res.get("ended"):
            stdout.write("hpcmesh: detached; the endpoint continues\n")
            stdout.flush()
            return True
        line = stdin.readline()
        res = send(session["process"], session["session"], line if line else "detach")


class DebugController:
    """``debug_controller()`` in the client: the sessions of this controller's processes."""

    def __init__(self, rt: ClientRuntime | None = None):
        self.rt = rt or client_runtime()

    def list(self) -> list[Session]:
        return sessions_of(self.rt)

    def send(self, process: str, session: int, line: str | None) -> dict[str, Any]:
        return send_to(self.rt, process, session, line)

    def attach(self, session: Session | int | None = None, stdin: TextIO = sys.stdin,
               stdout: TextIO = sys.stdout) -> bool:
        return attach(pick(self.list(), session), self.send, stdin, stdout)


def debug_controller() -> DebugController:
    return DebugController()


def pick(sessions: list[Session], which: Session | int | None) -> Session:
    """The session to attach to: the only one, or the one with that number."""
    if isinstance(which, dict):
        return which
    if not sessions:
        raise LookupError("no actor is paused at a breakpoint() (a process prints 'paused "
                          "at a breakpoint' when one does; under uvloop, async endpoints "
                          "do not pause: HPCMESH_UVLOOP=0)")
    if which is None:
        if len(sessions) > 1:
            raise LookupError("several sessions; pick one with --session N:\n" +
                              "\n".join(describe(s) for s in sessions))
        return sessions[0]
    for s in sessions:
        if s["session"] == which:
            return s
    raise LookupError(f"no session {which}; open ones:\n" +
                      "\n".join(describe(s) for s in sessions))


# -- through the admin view, for `hpcmesh debug` ---------------------------------------------
class AdminDebugClient:
    """The sessions through the admin view at ``admin_url`` (the token travels in a
    header, not in the request line)."""

    def __init__(self, admin_url: str):
        self.url = admin_url

    def list(self) -> list[Session]:
        return request_json(self.url, "/api/debug")["sessions"]

    def send(self, process: str, session: int, line: str | None) -> dict[str, Any]:
        return request_json(self.url, f"/api/debug/{process}",
                            {"session": session, "line": line})
