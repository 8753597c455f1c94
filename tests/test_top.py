"""``hpcmesh top``: the rows from a real admin tree, and the textual app driven headless
(textual's ``run_test`` pilot) against a running job's admin view and telemetry."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from ci_gate import import_or_skip
from proc_helpers import wait_until
from test_admin import get_json, processes

from hpcmesh.actor import Actor, endpoint
from hpcmesh.admin.server import admin_endpoint
from hpcmesh.admin.services import read_services_file
from hpcmesh.admin.top import heatmap_lines, process_grid, process_rows
from hpcmesh.admin.tree import build_tree
from hpcmesh.shapes import Extent, Point
from hpcmesh.job import LocalJob


class Busy(Actor):
    @endpoint
    async def ping(self) -> int:
        return os.getpid()


def test_rows_of_a_tree():
    tree = {"hosts": [{"host": "node1", "processes": [
        {"name": "p-0", "mesh": "m", "label": "gpus=0", "pid": 7, "status": "failed",
         "error": "died: killed by SIGKILL\nmore", "actors": [
             {"mesh": "w", "point": {"rank": 0}, "status": "failed"}]},
        {"name": "p-1", "mesh": "m", "label": "gpus=1", "pid": 8, "status": "running",
         "error": None, "actors": [{"mesh": "w", "point": {"rank": 1}, "status": "running"}]}]}]}
    rows = process_rows(tree, {"p-1": 12.5})
    assert [(r["name"], r["status"], r["rate"], r["actors"], r["error"]) for r in rows] == [
        ("p-0", "failed", 0.0, "w[rank=0] failed", "died: killed by SIGKILL"),
        ("p-1", "running", 12.5, "w[rank=1]", "")]
    assert process_rows(tree)[0]["rate"] is None          # no telemetry: no rates
    # how it ended and its class, where the tree knows them: not the first 120 characters
    # of a Monarch-worded actor message that ends with them
    tree["hosts"][0]["processes"][0].update(
        error="The actor <train.W w{'gpus': 0/2}> and all its descendants have failed: "
              "the process this actor was running on failed: Killed(sig=9) ...",
        exit_status="killed by SIGKILL", failure_class="signal")
    assert process_rows(tree)[0]["error"] == "killed by SIGKILL (signal)"


def test_the_heatmap_lays_processes_out_as_their_mesh_hosts_down_gpus_across():
    extent = Extent({"hosts": 32, "gpus": 8})
    procs = [{"name": f"p-{r}", "mesh": "big", "point": Point(r, extent), "host": "h",
              "status": "failed" if r == 13 else "running"} for r in range(256)]
    procs.append({"name": "odd", "mesh": "small", "point": None, "status": "lost"})
    tree = build_tree(reversed(procs), {}, [])       # (the tree's order does not matter)
    big, small = sorted(process_grid(tree), key=lambda g: g["mesh"])
    assert big["extent"] == {"hosts": 32, "gpus": 8} and len(big["rows"]) == 32
    assert big["rows"][1][0] == "hosts=1" and len(big["rows"][1][1]) == 8
    assert big["rows"][1][1][5] == ("failed", "p-13")
    assert all(cell[0] == "running" for label, cells in big["rows"] for cell in cells
               if cell[1] != "p-13")
    assert small["rows"] == [("", [("lost", "odd")])]      # no point: a cell all the same
    # packed to the terminal's width: hosts=0..3 on a line of 4 groups of 8, and so on
    lines = heatmap_lines(big, width=4 * 9 + 2 * len("hosts=31") + 3)
    assert [label for label, _ in lines[:2]] == ["hosts=0..3", "hosts=4..7"]
    assert len(lines) == 8 and all(len(groups) == 4 for _, groups in lines)
    # a mesh whose processes the tree could not all place: the rest fill free cells
    tree = {"hosts": [{"host": "h", "processes": [
        {"name": "a", "mesh": "m", "rank": 1, "status": "running"},
        {"name": "b", "mesh": "m", "rank": None, "status": "running"},
        {"name": "c", "mesh": "m", "rank": 1, "status": "failed"}]}],
        "proc_meshes": {"m": {"gpus": 4}}}
    (grid,) = process_grid(tree)
    assert grid["rows"] == [("", [("running", "b"), ("running", "a"), ("failed", "c"), None])]


def test_top_shows_the_processes_their_rates_and_stacks(tmp_path):
    import_or_skip("textual")
    from textual.widgets import DataTable, Static
    from hpcmesh.admin.top import build_app
    job = LocalJob(hosts=("hosts",)).enable_admin().enable_telemetry()
    cache = tmp_path / ".hpcmesh" / "job_state.pkl"
    state = job.state(cached_path=str(cache))
    urls = read_services_file(os.path.dirname(os.path.realpath(cache)))
    assert urls["admin_url"] == state.admin_url and urls["telemetry_url"] == state.telemetry_url
    services = os.path.join(os.path.dirname(os.path.realpath(cache)), "services.json")
    assert oct(os.stat(services).st_mode & 0o777) == "0o600"     # the URLs carry the token
    pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="toptest")
    try:
        b = pm.spawn("busy", Busy)
        for _ in range(50):
            b.ping.call().get(timeout=60)
        os.kill(pm.pids[1], signal.SIGKILL)
        tree = admin_endpoint(state.admin_url, "/api/tree")
        wait_until(lambda: [p["status"] for p in processes(get_json(tree), "toptest")]
                   == ["running", "failed"], 30, "the admin view has the death")

        async def drive() -> tuple[list, str, str]:
            app = build_app(state.admin_url, state.telemetry_url, interval=0.5)
            async with app.run_test(size=(160, 40)) as pilot:
                async def until(what, done, timeout=30.0):
                    """Let the app run until ``done()`` holds (a busy machine draws late)."""
                    deadline = time.monotonic() + timeout
                    while not done():
                        assert time.monotonic() < deadline, f"top never showed {what}"
                        await pilot.pause(0.05)

                def table_rows():
                    tables = app.query(DataTable)
                    if not tables:
                        return []
                    t = tables.first()
                    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
                await until("the mesh's processes",
                            lambda: len([r for r in table_rows() if r[1] == "toptest"]) == 2)
                rows = table_rows()
                mine = [i for i, r in enumerate(rows) if r[1] == "toptest"]
                app.query_one(DataTable).move_cursor(row=mine[0])
                await pilot.press("s")
                first = "select a process and press s for its stacks"

                def shown(selector):
                    found = app.query(selector)
                    return str(found.first().render()) if found else ""
                await until("the stacks", lambda: shown("#stacktext") not in ("", first))
                stacks, status, heat = shown("#stacktext"), shown("#status"), shown("#heatmap")
                await pilot.press("f")      # only the processes not running
                await until("only the processes not running",
                            lambda: all(r[4] != "running" for r in table_rows()))
                return rows, stacks, status, heat, table_rows()
        rows, stacks, status, heat, trouble = asyncio.run(drive())
        assert 'toptest {"gpus": 2}' in heat
        assert [r[2] for r in trouble if r[1] == "toptest"] == ["gpus=1"]
        mine = sorted((r for r in rows if r[1] == "toptest"), key=lambda r: r[2])
        assert [(r[2], r[3], r[4]) for r in mine] == [
            ("gpus=0", str(pm.pids[0]), "running"), ("gpus=1", str(pm.pids[1]), "failed")]
        assert float(mine[0][5]) > 0 and "busy[gpus=0]" in mine[0][6]      # calls/s from SQL
        assert "SIGKILL" in mine[1][7]
        assert f"pid {pm.pids[0]}" in stacks and "Thread" in stacks
        assert "processes:" in status and "failed" in status
    finally:
        pm.stop().get(timeout=30)
        from hpcmesh.admin.server import stop_admin
        from hpcmesh.telemetry.server import stop_telemetry
        stop_telemetry()
        stop_admin()


def test_top_without_an_admin_url_says_where_it_looked(tmp_path):
    env = {k: v for k, v in os.environ.items() if "ADMIN_URL" not in k}
    res = subprocess.run([sys.executable, "-m", "hpcmesh", "top"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no admin URL" in res.stderr and "enable_admin()" in res.stderr
    assert "services.json" in res.stderr


@pytest.mark.parametrize("bad", ["--interval=x"])
def test_top_bad_option(bad):
    res = subprocess.run([sys.executable, "-m", "hpcmesh", "top", bad], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "invalid float value" in res.stderr
