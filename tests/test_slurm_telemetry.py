"""Telemetry and the admin view on the Slurm test cluster (issue 16's Must show): SQL about
the calls a SlurmJob's actors on two nodes just handled, and a process killed on a node
seen as failed, with its signal, within a second.

Apart from tests/test_slurm_e2e.py (whose fixture and names it shares) because the Slurm
24.11 run of those (tests/cluster/slurm24/) has no pyarrow/DataFusion: this runs on 22.05.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
import urllib.error
import urllib.request

from ci_gate import import_or_skip

from test_slurm_e2e import PREFIX, cluster  # noqa: F401 - cluster is a fixture

import_or_skip("datafusion")

from hpcmesh.actor import Actor, debug_controller, endpoint  # noqa: E402
from hpcmesh.admin.server import admin_endpoint  # noqa: E402
from hpcmesh.job import SlurmJob  # noqa: E402
from hpcmesh.telemetry import TelemetryConfig  # noqa: E402


class Node(Actor):
    @endpoint
    def host(self) -> str:
        return os.environ.get("SLURMD_NODENAME", "?")

    @endpoint
    def work(self, seconds: float) -> float:
        time.sleep(seconds)     # sleep: the endpoint's work is to take this long
        return seconds

    @endpoint
    def stuck_until(self, release: str) -> str:
        while not os.path.exists(release):
            time.sleep(0.02)
        return "released"

    @endpoint
    def paused(self, x: int) -> int:
        y = x + 1
        breakpoint()
        return y


def _render_in_chromium(url: str, tmp_path, job_id: str) -> None:
    """The dashboard of the Slurm job in headless Chromium: the grid of mesh n (3 spawned,
    the killed one failed) and the Slurm job RUNNING with its time left."""
    from test_dashboard import _browser, _quit, _require_browser
    _require_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver, profile = _browser(tmp_path)
    try:
        driver.get(url)

        def shown(d) -> bool:
            cells = d.find_elements(By.CSS_SELECTOR, 'div.mesh[data-mesh="n"] td.cell')
            job = d.find_element(By.ID, "job").text
            return (sorted(c.get_attribute("data-status") for c in cells) ==
                    ["failed", "spawned", "spawned", "spawned"]
                    and f"Slurm job {job_id} RUNNING" in job and "left" in job)
        try:
            WebDriverWait(driver, 20, poll_frequency=0.2).until(shown)
        except Exception:
            print("page text:", driver.find_element(By.TAG_NAME, "body").text)
            raise
        shot = tmp_path / "slurm-dashboard.png"
        assert driver.save_screenshot(str(shot))
        print("dashboard of the Slurm job, screenshot:", shot)
        if os.environ.get("HPCMESH_TEST_ARTIFACTS"):
            import shutil
            os.makedirs(os.environ["HPCMESH_TEST_ARTIFACTS"], exist_ok=True)
            shutil.copy(shot, os.environ["HPCMESH_TEST_ARTIFACTS"])
    finally:
        _quit(driver, profile)


def test_telemetry_and_admin_on_two_nodes(cluster):
    job = SlurmJob(meshes={"hosts": 2}, job_name=f"{PREFIX}-telemetry",
                   log_dir=str(cluster / "logs"), timeout=60, time_limit="10:00")
    job.enable_telemetry(TelemetryConfig(include_dashboard=True, dashboard_port=0))
    job.enable_admin()
    state = job.state(cached_path=None)
    try:
        pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="teltrain")
        nodes = pm.spawn("n", Node)
        hosts = nodes.host.call().get(timeout=60)
        assert sorted(set(hosts.values())) == ["node1", "node2"]
        for _ in range(10):
            nodes.work.call(0.005).get(timeout=60)
        per_proc = state.query_engine.query("""
            SELECT a.process, a.host, COUNT(*) AS calls,
                   approx_percentile_cont(m.duration_us, 0.5) AS p50
            FROM messages m JOIN actors a ON m.to_actor_id = a.id
            WHERE m.endpoint = 'work' GROUP BY a.process, a.host ORDER BY a.process""").to_pylist()
        assert [r["calls"] for r in per_proc] == [10] * 4
        assert sorted({r["host"] for r in per_proc}) == ["node1", "node2"]
        assert all(r["p50"] >= 5000 for r in per_proc)
        # the same question through the HTTP client, from anywhere with the URL
        n = state.query_engine_client.query(
            "SELECT COUNT(*) AS n FROM messages WHERE endpoint = 'work'").to_pylist()
        assert n == [{"n": 40}]
        # workers on the nodes report their CPU and memory
        seen = state.query_engine.query(
            "SELECT DISTINCT process FROM metric_process").to_pylist()
        assert {r["process"] for r in seen} >= {r["process"] for r in per_proc}

        # the stack of an actor stuck in a sync endpoint on node2, from the admin view
        release = str(cluster / "release")
        stuck = nodes.slice(hosts=1, gpus=0).stuck_until.call_one(release)
        name = [p for p in state.query_engine.query(
            f"SELECT process FROM process_status_events WHERE pid = {pm.pids[2]}").to_pylist()
        ][0]["process"]
        deadline = time.monotonic() + 10
        text = ""
        while "stuck_until" not in text and time.monotonic() < deadline:
            with urllib.request.urlopen(admin_endpoint(state.admin_url, f"/api/stack/{name}"),
                                        timeout=30) as r:
                text = json.loads(r.read())["text"]
        assert "in stuck_until" in text, text
        open(release, "w").close()
        assert stuck.get(timeout=30) == "released"
        # without the token: 401 and nothing else, on every server of the job
        for url in (state.admin_url, state.telemetry_url, state.dashboard_url):
            bare = url.split("?")[0] + "api/tree"
            try:
                urllib.request.urlopen(bare, timeout=10)
                raise AssertionError(f"{bare} answered without the token")
            except urllib.error.HTTPError as e:
                assert (e.code, e.read()) == (401, b"")
        # a breakpoint on node2, attached to from the client and continued
        held = nodes.slice(hosts=1, gpus=1).paused.call_one(41)
        deadline = time.monotonic() + 20
        sessions = []
        while not sessions and time.monotonic() < deadline:
            sessions = debug_controller().list()
            time.sleep(0.05)
        assert [(s["host"], s["rank"]) for s in sessions] == [("node2", 3)], sessions
        out = io.StringIO()
        assert debug_controller().attach(stdin=io.StringIO("p y * 2\nc\n"), stdout=out)
        assert "84" in out.getvalue() and "(hpcmesh-pdb)" in out.getvalue()
        assert held.get(timeout=30) == 42

        victim = pm.pids[3]          # hosts=1, gpus=1: on node2
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        got = tree_error = None
        while time.monotonic() - t0 < 5 and (got is None or tree_error is None):
            rows = state.query_engine.query(
                f"SELECT reason, failure_class FROM process_status_events WHERE pid = "
                f"{victim} AND new_status = 'failed'").to_pylist()
            if rows and got is None:
                got = (time.monotonic() - t0, rows[0]["reason"], rows[0]["failure_class"])
            with urllib.request.urlopen(admin_endpoint(state.admin_url, "/api/tree"),
                                        timeout=10) as r:
                tree = json.loads(r.read())
            mine = [p for h in tree["hosts"] for p in h["processes"] if p["pid"] == victim]
            if mine and mine[0]["status"] == "failed" and tree_error is None:
                tree_error = (time.monotonic() - t0, mine[0]["error"])
            time.sleep(0.05)
        assert got and tree_error, (got, tree_error)
        print(f"\nSIGKILL on node2: failed in SQL after {got[0] * 1000:.0f} ms, in the admin "
              f"tree after {tree_error[0] * 1000:.0f} ms")
        assert got[0] < 1.0 and "SIGKILL" in got[1] and "node2" in got[1]
        assert got[2] == "signal"       # its failure class (SPEC §12): not out of memory
        assert tree_error[0] < 1.0 and "SIGKILL" in tree_error[1]
        failed = state.query_engine.query(
            "SELECT a.full_name FROM actor_status_events s JOIN actors a ON s.actor_id = a.id "
            "WHERE s.new_status = 'failed'").to_pylist()
        assert failed == [{"full_name": "n[3]"}]
        with urllib.request.urlopen(state.dashboard_url.replace("/?", "/api/dashboard?"),
                                    timeout=30) as r:
            doc = json.loads(r.read())
        jobs = doc["job"]["slurm_jobs"]
        assert jobs[0]["job_id"] == job.job_id and jobs[0]["state"] == "RUNNING"
        assert 0 < jobs[0]["time_left_s"] <= 600
        (mesh,) = [m for m in doc["meshes"] if m["name"] == "n"]
        assert [c["status"] for c in mesh["actors"]] == ["spawned"] * 3 + ["failed"]
        _render_in_chromium(state.dashboard_url, cluster, job.job_id)
    finally:
        job.kill()
        from hpcmesh.telemetry.server import stop_telemetry
        from hpcmesh.admin.server import stop_admin
        stop_telemetry()
        stop_admin()
