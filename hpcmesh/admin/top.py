"""``hpcmesh top``: the admin tree of a running job in the terminal, live (textual).

It reads the controller's admin view over HTTP (``/api/tree``, ``/api/stack/<process>``)
and, when the job records telemetry, each process's calls per second (SQL over
``messages``). The rows are built by :func:`process_rows` (pure, tested on its own); the
app only draws them. Keys: ``s`` the stacks of the selected process, ``q`` quit.
"""

from __future__ import annotations

import json
import time
import urllib.error
from typing import Any

from ..shapes import point_label
from ..token_http import request_json

RATE_WINDOW_S = 5

STATUS_STYLE = {"running": "green", "failed": "bold red", "stopped": "dim", "starting": "yellow",
                "stopping": "yellow", "lost": "magenta"}


def process_rows(tree: dict, rates: dict[str, float] | None = None) -> list[dict]:
    """One row per process of ``/api/tree``: where it runs, its status and last error, its
    actors (mesh[rank] status), and its calls per second when telemetry gave them."""
    rows = []
    for h in tree.get("hosts", []):
        for p in h.get("processes", []):
            actors = ", ".join(f"{a.get('mesh')}[{_point_label(a.get('point'))}]"
                               + ("" if a.get("status") == "running" else f" {a.get('status')}")
                               for a in p.get("actors", []))
            rate = None if rates is None else rates.get(p["name"], 0.0)
            rows.append({"name": p["name"], "host": h["host"], "mesh": p.get("mesh"),
                         "point": p.get("label") or "", "pid": p.get("pid"),
                         "status": p.get("status"), "rate": rate, "actors": actors,
                         "error": (p.get("error") or "").splitlines()[0][:120]
                         if p.get("error") else ""})
    return rows


def _point_label(point: Any) -> str:
    if isinstance(point, dict):
        return point_label(point)
    return "?" if point is None else str(point)


def call_rates(telemetry_url: str | None, window_s: int = RATE_WINDOW_S) -> dict[str, float] | None:
    """Calls per second per process over the last ``window_s`` s (None without telemetry)."""
    if not telemetry_url:
        return None
    from ..telemetry.engine import QueryEngineClient
    since = int((time.time() - window_s) * 1e6)
    table = QueryEngineClient(telemetry_url, timeout=10).query(
        f"SELECT process, COUNT(*) AS n FROM messages WHERE timestamp_us >= {since} "
        f"GROUP BY process")
    return {r["process"]: r["n"] / window_s for r in table.to_pylist()}


def build_app(admin_url: str, telemetry_url: str | None = None, interval: float = 1.0):
    """The textual App (imported here: only ``hpcmesh top`` needs textual)."""
    from rich.text import Text
    from textual.app import App, ComposeResult
    from textual.containers import VerticalScroll
    from textual.widgets import DataTable, Footer, Header, Static

    class TopApp(App):
        TITLE = "hpcmesh top"
        BINDINGS = [("s", "stacks", "stacks of the selected process"), ("q", "quit", "quit")]
        CSS = "#stacks { height: 45%; border: round $accent; } #status { height: 1; }"

        def compose(self) -> ComposeResult:
            yield Header()
            yield Static("", id="status")
            yield DataTable(id="procs", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="stacks"):
                yield Static("select a process and press s for its stacks", id="stacktext")
            yield Footer()

        def on_mount(self) -> None:
            table = self.query_one(DataTable)
            for col in ("host", "mesh", "point", "pid", "status", "calls/s", "actors", "error"):
                table.add_column(col, key=col)
            self.refresh_tree()
            self.set_interval(interval, self.refresh_tree)

        def refresh_tree(self) -> None:
            status = self.query_one("#status", Static)
            try:
                tree = request_json(admin_url, "/api/tree", timeout=10, busy_for=0)
            except Exception as e:  # noqa: BLE001 - the controller may be gone: say so
                status.update(Text(f"admin view not reachable: {e}", style="bold red"))
                return
            try:
                rates = call_rates(telemetry_url)
            except Exception:  # noqa: BLE001 - rates are extra
                rates = None
            rows = process_rows(tree, rates)
            table = self.query_one(DataTable)
            keep = table.cursor_row
            table.clear()
            for r in rows:
                table.add_row(r["host"], r["mesh"], r["point"], str(r["pid"]),
                              Text(str(r["status"]), style=STATUS_STYLE.get(r["status"], "")),
                              "-" if r["rate"] is None else f"{r['rate']:.1f}", r["actors"],
                              Text(r["error"], style="red"), key=r["name"])
            if rows:
                table.move_cursor(row=min(keep, len(rows) - 1))
            by = {}
            for r in rows:
                by[r["status"]] = by.get(r["status"], 0) + 1
            status.update(f"{len(rows)} processes: " + ", ".join(f"{n} {s}" for s, n in
                                                                   sorted(by.items())))

        def action_stacks(self) -> None:
            table = self.query_one(DataTable)
            if not table.row_count:
                return
            name = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            out = self.query_one("#stacktext", Static)
            try:
                doc = request_json(admin_url, f"/api/stack/{name}", timeout=15)
                out.update(Text(f"{name} (pid {doc.get('pid')}, from the "
                                f"{doc.get('source')}):\n\n{doc.get('text', '')}"))
            except urllib.error.HTTPError as e:
                out.update(Text(f"{name}: {json.loads(e.read() or b'{}').get('error', e)}",
                                style="red"))
            except Exception as e:  # noqa: BLE001
                out.update(Text(f"{name}: {e}", style="red"))

    return TopApp()
