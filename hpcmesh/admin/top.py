"""``hpcmesh top``: the admin tree of a running job in the terminal, live (textual).

It reads the controller's admin view over HTTP (``/api/tree``, ``/api/stack/<process>``)
and, when the job records telemetry, each process's calls per second (SQL over
``messages``). Above the table of processes, a heatmap of each process mesh (a cell per
process, the mesh's leading dimensions down and its last across: hosts x gpus, coloured
by status), so that the one failed process of 256 shows at a glance. The rows and the
heatmap are built by :func:`process_rows` and :func:`process_grid` (pure, tested on their
own); the app only draws them. Keys: ``s`` the stacks of the selected process, ``f`` only
the processes that are not running, ``q`` quit.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
from typing import Any

from ..shapes import point_label, unravel
from ..token_http import request_json

RATE_WINDOW_S = 5

STATUS_STYLE = {"running": "green", "failed": "bold red", "stopped": "dim", "starting": "yellow",
                "stopping": "yellow", "lost": "magenta"}


def _process_error(p: dict) -> str:
    """What a row says of a failed process: how it ended and the failure's class where
    known (``killed by SIGKILL (signal)``), else its error's first line; "" if none."""
    if p.get("exit_status"):
        cls = p.get("failure_class")
        return p["exit_status"] + (f" ({cls})" if cls else "")
    return (p.get("error") or "").splitlines()[0][:120] if p.get("error") else ""


def process_rows(tree: dict, rates: dict[str, float] | None = None) -> list[dict]:
    """One row per process of ``/api/tree``: where it runs, its status and last error, its
    actors (mesh[rank] status), its calls per second when telemetry gave them, and
    ``late``: what the controller's straggler watch says of it while its call is out."""
    rows = []
    for h in tree.get("hosts", []):
        for p in h.get("processes", []):
            actors = ", ".join(f"{a.get('mesh')}[{_point_label(a.get('point'))}]"
                               + ("" if a.get("status") == "running" else f" {a.get('status')}")
                               for a in p.get("actors", []))
            rate = None if rates is None else rates.get(p["name"], 0.0)
            late = p.get("straggler")
            rows.append({"name": p["name"], "host": h["host"], "mesh": p.get("mesh"),
                         "point": p.get("label") or "", "pid": p.get("pid"),
                         "status": p.get("status"), "rate": rate, "actors": actors,
                         "error": _process_error(p),
                         "late": f"{late['kind']} {late['waited_s']:.0f} s: {late['headline']}"
                         if late else ""})
    return rows


def process_grid(tree: dict) -> list[dict]:
    """Per process mesh of ``/api/tree``: its processes laid out as in the mesh, ``rows``
    of (label, cells), the leading dimensions down and the last across (hosts x gpus); a
    cell is (status, process name), None where the mesh has no process. A process the
    tree gives no rank is put in the first free cell."""
    extents = tree.get("proc_meshes") or {}
    by_mesh: dict[str, list[dict]] = {}
    for h in tree.get("hosts", []):
        for p in h.get("processes", []):
            by_mesh.setdefault(p.get("mesh"), []).append(p)
    out = []
    for mesh, procs in by_mesh.items():
        extent = extents.get(mesh) or {"process": len(procs)}
        dims, sizes = list(extent), [int(v) for v in extent.values()]
        cols = max(sizes[-1], 1) if sizes else 1
        slots: list = [None] * (math.ceil(max(math.prod(sizes), len(procs)) / cols) * cols)
        loose = []
        for p in procs:
            rank = p.get("rank")
            if isinstance(rank, int) and 0 <= rank < len(slots) and slots[rank] is None:
                slots[rank] = (p.get("status"), p["name"])
            else:
                loose.append((p.get("status"), p["name"]))
        for i, slot in enumerate(slots):
            if not loose:
                break
            if slot is None:
                slots[i] = loose.pop(0)
        rows = []
        for r in range(len(slots) // cols):
            lead = dict(zip(dims[:-1], unravel(r, sizes[:-1]))) if len(dims) > 1 and \
                r < math.prod(sizes[:-1]) else {}
            rows.append((point_label(lead) if lead else "", slots[r * cols:(r + 1) * cols]))
        out.append({"mesh": mesh, "extent": extent, "rows": rows})
    return out


def heatmap_lines(grid: dict, width: int) -> list[tuple[str, list[list]]]:
    """``grid``'s rows packed into lines of at most ``width`` characters: (label, the rows
    on the line), each row drawn as one character a cell and a space after it."""
    rows = grid["rows"]
    label_w = max((len(label) for label, _ in rows), default=0) * 2 + 3
    cols = len(rows[0][1]) if rows else 1
    per_line = max(1, (width - label_w) // (cols + 1))
    out = []
    for i in range(0, len(rows), per_line):
        part = rows[i:i + per_line]
        first, last = part[0][0], part[-1][0]
        label = first if len(part) == 1 else \
            f"{first}..{last.rpartition('=')[2] if ',' not in first else last}"
        out.append((label, [cells for _, cells in part]))
    return out


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
        BINDINGS = [("s", "stacks", "stacks of the selected process"),
                    ("f", "trouble", "only processes not running (again: all)"),
                    ("q", "quit", "quit")]
        CSS = ("#stacks { height: 45%; border: round $accent; } #status { height: 1; } "
               "#heat { height: auto; max-height: 40%; } #procs { height: 1fr; }")
        only_trouble = False
        tree: dict = {}
        rates: dict | None = None

        def compose(self) -> ComposeResult:
            yield Header()
            yield Static("", id="status")
            with VerticalScroll(id="heat"):
                yield Static("", id="heatmap")
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
                self.tree = request_json(admin_url, "/api/tree", timeout=10, busy_for=0)
            except Exception as e:  # noqa: BLE001 - the controller may be gone: say so
                status.update(Text(f"admin view not reachable: {e}", style="bold red"))
                return
            try:
                self.rates = call_rates(telemetry_url)
            except Exception:  # noqa: BLE001 - rates are extra
                self.rates = None
            self.draw()

        def draw(self) -> None:
            rows = process_rows(self.tree, self.rates)
            by = {}
            for r in rows:
                by[r["status"]] = by.get(r["status"], 0) + 1
            self.query_one("#status", Static).update(
                f"{len(rows)} processes: " + ", ".join(f"{n} {s}" for s, n in sorted(by.items()))
                + (" (f: showing those not running)" if self.only_trouble else ""))
            if self.only_trouble:
                rows = [r for r in rows if r["status"] != "running"]
            cells = {r["name"]: (r["host"], r["mesh"], r["point"], str(r["pid"]),
                                 Text(str(r["status"]), style=STATUS_STYLE.get(r["status"], "")),
                                 "-" if r["rate"] is None else f"{r['rate']:.1f}", r["actors"],
                                 Text(r["error"], style="red") if r["error"] or not r["late"]
                                 else Text(r["late"], style="yellow")) for r in rows}
            table = self.query_one(DataTable)
            if [k.value for k in table.rows] == list(cells):
                # the same processes: their cells change in place (the cursor and the
                # scroll stay; with hundreds of rows, clearing made the table jump)
                columns = [c.key for c in table.ordered_columns]
                for name, values in cells.items():
                    for col, value in zip(columns, values):
                        if str(table.get_cell(name, col)) != str(value):
                            table.update_cell(name, col, value)
            else:
                keep = table.cursor_row
                table.clear()
                for name, values in cells.items():
                    table.add_row(*values, key=name)
                if rows:
                    table.move_cursor(row=min(keep, len(rows) - 1))
            self.draw_heatmap()

        def draw_heatmap(self) -> None:
            table = self.query_one(DataTable)
            chosen = None
            if table.row_count:
                chosen = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            width = max(20, self.size.width - 2)
            text = Text()
            for grid in process_grid(self.tree):
                if text:
                    text.append("\n")
                text.append(f"{grid['mesh']} {json.dumps(grid['extent'])}\n", style="bold")
                lines = heatmap_lines(grid, width)
                label_w = max(len(label) for label, _ in lines) if lines else 0
                for label, groups in lines:
                    text.append(label.ljust(label_w + 1), style="dim")
                    for cells in groups:
                        for cell in cells:
                            if cell is None:
                                text.append(" ")
                                continue
                            style = STATUS_STYLE.get(cell[0], "") or "white"
                            text.append("■", style=style + (" reverse" if cell[1] == chosen
                                                            else ""))
                        text.append(" ")
                    text.append("\n")
            text.rstrip()
            self.query_one("#heatmap", Static).update(text)

        def on_data_table_row_highlighted(self, event) -> None:
            self.draw_heatmap()

        def action_trouble(self) -> None:
            self.only_trouble = not self.only_trouble
            self.draw()

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
