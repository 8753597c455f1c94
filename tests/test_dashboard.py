"""The telemetry dashboard, rendered in a real (headless) Chromium through selenium.

A LocalJob with telemetry and the dashboard, an actor mesh over two processes, calls (one
endpoint raises), one process SIGKILLed; then the page must show the mesh as a grid with one
failed and one spawned cell, the failure with its signal and its class, the endpoints and the actors' log
lines. Needs ``chromium`` and ``chromium-driver`` (scripts/system-packages.sh) and selenium
(the ``dev`` extra): skipped without them, except under CI (``CI`` set), where it fails.
"""

import os
import pathlib
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from ci_gate import skip_or_fail
from proc_helpers import processes_with_cmdline

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import LocalJob
from hpcmesh.telemetry import TelemetryConfig
from hpcmesh.telemetry.dashboard import parse_label, process_heatmaps

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MESH = "dashmesh"
LOG_LINE = "dashboard test: a line from the actor"


def _require_browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("python package selenium")
    if missing:
        why = (f"the dashboard test needs {', '.join(missing)} (bash scripts/system-packages.sh; "
               f"pip install -e '.[dev]')")
        skip_or_fail(why)


class DashWorker(Actor):
    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom for the dashboard")

    @endpoint
    def say(self, text: str) -> int:
        print(text, flush=True)
        return os.getpid()


@pytest.fixture
def stop_telemetry_after():
    yield
    from hpcmesh.telemetry.server import stop_telemetry
    stop_telemetry()


def _browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tmp_path / "chromium-profile"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,1400", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    return webdriver.Chrome(options=opts, service=service), str(profile)


@pytest.mark.timeout(120)
def test_the_dashboard_renders_a_failed_and_a_spawned_actor(tmp_path, monkeypatch,
                                                            stop_telemetry_after):
    _require_browser()
    monkeypatch.setenv("SE_OFFLINE", "true")          # never let Selenium Manager download
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    job = LocalJob().enable_telemetry(TelemetryConfig(include_dashboard=True, dashboard_port=0))
    state = job.state(cached_path=None)
    url = state.dashboard_url
    assert url and urlsplit(url).hostname == "127.0.0.1" and "token=" in url

    # without the token: a bare 401, nothing of the page
    p = urlsplit(url)
    for bare in (f"{p.scheme}://{p.netloc}/", f"{p.scheme}://{p.netloc}/api/dashboard",
                 f"{p.scheme}://{p.netloc}/?token=wrong"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bare, timeout=10)
        assert err.value.code == 401 and err.value.read() == b"", bare

    pm = state.hosts.spawn_procs({"gpus": 2})
    driver = profile = None
    try:
        m = pm.spawn(MESH, DashWorker)
        for i in range(20):
            assert m.ping.call(i).get(timeout=60) is not None
        with pytest.raises(Exception, match="boom for the dashboard"):
            m.slice(gpus=0).boom.call_one().get(timeout=60)
        m.say.call(LOG_LINE).get(timeout=60)
        victim = pm.pids[1]
        os.kill(victim, signal.SIGKILL)

        t0 = time.monotonic()
        driver, profile = _browser(tmp_path)
        driver.get(url)

        def shown(d):
            cells = d.find_elements(By.CSS_SELECTOR,
                                    f'div.mesh[data-mesh="{MESH}"] table.grid td.cell')
            if len(cells) != 2:
                return False
            status = sorted(c.get_attribute("data-status") for c in cells)
            ranks = sorted(c.get_attribute("data-rank") for c in cells)
            failures = d.find_element(By.ID, "failures").text
            endpoints = d.find_element(By.ID, "endpoints").text
            logs = d.find_element(By.ID, "logs").text
            return (status == ["failed", "spawned"] and ranks == ["0", "1"]
                    and "SIGKILL" in failures
                    and d.find_elements(By.CSS_SELECTOR, "#failures tr.failure")
                    # its class (SPEC §12) in a column of its own
                    and d.find_elements(By.CSS_SELECTOR,
                                        '#failures td.failure-class[data-class="signal"]')
                    and all(e in endpoints for e in ("ping", "boom", "say"))
                    and LOG_LINE in logs and plotted(d))

        def plotted(d):
            # the plots: the mesh's calls/s, the hosts' CPU, the killed process as a mark
            calls = d.find_elements(By.CSS_SELECTOR,
                                    'svg[data-title^="calls/s"] path.series title')
            cpu = d.find_elements(By.CSS_SELECTOR, 'svg[data-title^="CPU"] path.series')
            marks = d.find_elements(By.CSS_SELECTOR, 'svg line.mark[data-kind="failure"]')
            return (any(t.get_attribute("textContent") == MESH for t in calls)
                    and cpu and marks)

        try:
            WebDriverWait(driver, 15, poll_frequency=0.2).until(shown)
        except Exception:
            print("browser console:", driver.get_log("browser"))
            print("page text:", driver.find_element(By.TAG_NAME, "body").text)
            raise
        print(f"dashboard showed the killed process after {time.monotonic() - t0:.2f} s "
              f"(browser start included)")

        # the failed cell is the victim's, and says why
        failed = driver.find_element(By.CSS_SELECTOR,
                                     f'div.mesh[data-mesh="{MESH}"] td.cell[data-status="failed"]')
        assert failed.get_attribute("data-rank") == "1" and str(victim) in failed.text
        assert "SIGKILL" in (failed.get_attribute("title") or "")
        assert (failed.get_attribute("title") or "").startswith("[signal] ")
        screenshot(driver, tmp_path, "dashboard.png")
    finally:
        try:
            if driver is not None:
                _quit(driver, profile)
        finally:
            pm.stop().get(timeout=30)


def screenshot(driver, tmp_path, name: str) -> None:
    """The page logged no error; its screenshot for a person to check, under ``tmp_path``
    and copied to ``$HPCMESH_TEST_ARTIFACTS`` when set."""
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors
    shot = tmp_path / name
    assert driver.save_screenshot(str(shot))
    print("dashboard screenshot:", shot)
    if os.environ.get("HPCMESH_TEST_ARTIFACTS"):
        out = os.environ["HPCMESH_TEST_ARTIFACTS"]
        os.makedirs(out, exist_ok=True)
        shutil.copy(shot, os.path.join(out, name))
        print("dashboard screenshot copied to", os.path.join(out, name))


def _quit(driver, profile: str) -> None:
    """Quit the browser; then neither chromedriver nor a Chromium of this profile may live."""
    proc = driver.service.process
    driver.quit()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            (proc is not None and proc.poll() is None) or processes_with_cmdline(profile)):
        time.sleep(0.1)
    left = processes_with_cmdline(profile)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc is None or proc.poll() is not None, "chromedriver outlived driver.quit()"
    assert not left, f"chromium outlived driver.quit() (now killed): {left}"


def test_the_document_places_each_process_of_a_mesh_in_its_heatmap():
    procs = [{"process": f"big-{h}-{g}", "mesh": "big", "label": f"hosts={h},gpus={g}",
              "host": f"node{h}", "pid": 100 + 8 * h + g,
              "new_status": "failed" if (h, g) == (3, 5) else "running",
              "reason": "died: killed by SIGKILL" if (h, g) == (3, 5) else None}
             for h in range(32) for g in range(8)]
    procs.append({"process": "late-0", "mesh": "late", "label": "gpus=1", "host": "n",
                  "pid": 1, "new_status": "running", "reason": None})
    procs.append({"process": "odd", "mesh": "late", "label": "not a label", "host": "n",
                  "pid": 2, "new_status": "running", "reason": None})
    actors = [{"id": "w.29", "mesh_id": "w", "mesh": "w", "rank": 29, "process": "big-3-5",
               "new_status": "failed", "calls": 40, "errors": 1, "rate": 2.5},
              {"id": "v.29", "mesh_id": "v", "mesh": "v", "rank": 29, "process": "big-3-5",
               "new_status": "spawned", "calls": 2, "errors": 0, "rate": 0.5}]
    meshes = [{"given_name": "big", "shape_json": '{"hosts": 32, "gpus": 8}'}]
    big, late = sorted(process_heatmaps(procs, meshes, actors), key=lambda m: m["name"])
    assert big["extent"] == {"hosts": 32, "gpus": 8} and len(big["cells"]) == 256
    assert sorted(c["rank"] for c in big["cells"]) == list(range(256))
    (cell,) = [c for c in big["cells"] if c["rank"] == 3 * 8 + 5]
    assert (cell["process"], cell["status"], cell["host"]) == ("big-3-5", "failed", "node3")
    assert (cell["calls"], cell["errors"], cell["rate"]) == (42, 1, 3.0)    # its actors'
    assert [a["mesh"] for a in cell["actors"]] == ["w", "v"]
    # a mesh with no row (telemetry enabled after it started): as far as its labels reach;
    # a label that is no point goes wherever the page finds room
    assert late["extent"] == {"gpus": 2}
    assert {c["process"]: c["rank"] for c in late["cells"]} == {"late-0": 1, "odd": None}
    assert parse_label("hosts=3,gpus=5") == {"hosts": 3, "gpus": 5}
    assert parse_label("0") is None and parse_label(None) is None


@pytest.mark.timeout(300)
def test_256_processes_are_a_heatmap_that_loads_within_a_second(tmp_path, monkeypatch,
                                                               stop_telemetry_after):
    """32 hosts x 8 simulated processes (``benchmarks/simulated_hosts.py``: real
    controller, records, connections and telemetry; the processes are nodes of one
    simulating process): the admin tree answers within a second and the dashboard shows a
    grid of 256 cells within a second of being asked, a process's details on a click."""
    _require_browser()
    monkeypatch.setenv("SE_OFFLINE", "true")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from simulated_hosts import simulated_proc_mesh
    from hpcmesh.admin.server import admin_endpoint, start_admin, stop_admin
    from hpcmesh.telemetry.server import start_telemetry

    url = start_telemetry(TelemetryConfig(include_dashboard=True,
                                          dashboard_port=0))["dashboard_url"]
    admin = start_admin()
    pm, stop_simulation = simulated_proc_mesh(hosts=32, per_host=8, name="big")
    driver = profile = None
    try:
        m = pm.spawn("heat", DashWorker)
        assert len(m.ping.call(1).get(timeout=120)) == 256

        def timed(fn) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        tree = admin_endpoint(admin, "/api/tree")
        took = [timed(lambda: urllib.request.urlopen(tree, timeout=30).read())
                for _ in range(3)]
        print(f"/api/tree of 256 processes: {', '.join(f'{t * 1e3:.0f}' for t in took)} ms")
        assert min(took) < 1.0

        driver, profile = _browser(tmp_path)
        cells = f'div.procmesh[data-mesh="big"] .hc[data-key]'

        def load() -> None:
            driver.get(url)
            WebDriverWait(driver, 30, poll_frequency=0.02).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, cells)) == 256)
        took = [timed(load) for _ in range(3)]      # the first starts the query worker
        print(f"dashboard with 256 cells shown: {', '.join(f'{t * 1e3:.0f}' for t in took)}"
              f" ms (page load to grid drawn)")
        assert min(took) < 1.0
        # (read in one script: the page redraws every second, the elements with it)
        def page(script: str):
            return driver.execute_script(script.replace("CELLS", cells))
        # hosts down, gpus across; a cell per process at its point, running
        heat = page("return [...document.querySelectorAll('CELLS')].map(c => "
                    "[Number(c.dataset.rank), c.dataset.status])")
        assert sorted(rank for rank, _ in heat) == list(range(256))
        assert {status for _, status in heat} == {"running"}
        labels = page("return [...document.querySelectorAll("
                      "'div.procmesh[data-mesh=\"big\"] .hl')].map(e => e.textContent)")
        assert labels == [f"hosts={h}" for h in range(32)]
        # the actor mesh of 256 is a heatmap too, not a table of 256 big cells
        assert page("return [document.querySelectorAll('div.mesh[data-mesh=\"heat\"] "
                    ".hc[data-key]').length, document.querySelectorAll("
                    "'div.mesh[data-mesh=\"heat\"] td').length]") == [256, 0]
        # a click keeps a process's details in the panel, through the page's refreshes
        page("document.querySelector('CELLS[data-rank=\"29\"]').click()")
        WebDriverWait(driver, 10).until(
            lambda d: "process big-3-5 (hosts=3,gpus=5)" in d.find_element(By.ID, "detail").text
            and d.find_elements(By.CSS_SELECTOR, ".hc.sel"))
        assert "heat[29]" in driver.find_element(By.ID, "detail").text
        # coloured by calls/s: each cell gets its colour from the scale
        from selenium.webdriver.support.ui import Select
        Select(driver.find_element(By.ID, "colour")).select_by_value("rate")
        WebDriverWait(driver, 10).until(lambda d: page(
            "return [...document.querySelectorAll('CELLS')].every(c => c.style.background)"))
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors
        driver.save_screenshot(str(tmp_path / "dashboard-256.png"))
    finally:
        try:
            if driver is not None:
                _quit(driver, profile)
        finally:
            stop_admin()
            pm.stop().get(timeout=60)
            stop_simulation()


def test_the_plots_are_rates_per_bucket_from_the_tables():
    # rows at known times through the real store and SQL engine: calls/s per mesh per
    # bucket, a host's processes averaged per bucket then summed, GPUs averaged, a failure
    # as a mark, nothing from before the window
    from hpcmesh.telemetry.engine import QueryEngine
    from hpcmesh.telemetry.store import TelemetryStore
    from hpcmesh.telemetry.timeseries import BUCKET_S, WINDOW_S, timeseries_document

    b = BUCKET_S * 1_000_000
    now = 1_000_000 * b + b // 2
    t0 = now - 2 * b - b // 2                # the start of the bucket two before now's
    old = now - (WINDOW_S + 60) * 1_000_000   # outside the window
    store = TelemetryStore(retention_secs=1e12)
    src = ("p0", "node1", 11)
    store.append("actors", [(t0, "m1.0", "m1", 0, "train[0]", "p0", "node1", 11),
                            (t0, "m1.1", "m1", 1, "train[1]", "p1", "node2", 12)])
    msg = lambda t, a: (t, a, "step", "client", 10, "ok", 8) + src
    store.append("messages", [msg(t0 + i, "m1.0") for i in range(10)] +
                 [msg(t0 + 1, "m1.1")] * 5 + [msg(t0 + b, "m1.0")] * 5 + [msg(old, "m1.0")])
    store.append("metric_process", [
        (t0, 50.0, 100, 3, "p0", "node1", 11), (t0 + 1, 70.0, 300, 3, "p0", "node1", 11),
        (t0, 10.0, 1000, 3, "p1", "node1", 12), (t0 + b, 5.0, 10, 3, "p0", "node1", 11),
        (old, 99.0, 1, 3, "p0", "node1", 11)])
    store.append("metric_gpu", [(t0, 0, "u0", "H100", 30.0, 1, 2, "agent", "node1", 9),
                                (t0, 1, "u1", "H100", 50.0, 1, 2, "agent", "node1", 9)])
    store.append("process_status_events", [
        (t0 + b, "p1", "procs", "gpus=1", "node2", 12, "failed",
         "process gpus=1 of mesh procs on host node2 (pid 12) died: killed by SIGKILL",
         "signal"),
        (old, "p9", "procs", "gpus=9", "node9", 19, "failed", "long ago", "signal")])
    store.append("job_events", [(t0 + 1, "requeued", "16", 1, "Slurm says PENDING")])
    engine = QueryEngine(store)
    ts = timeseries_document(lambda sql: engine.query(sql).to_pylist(), now, {"m1": "train"})
    assert ts["calls"] == [{"name": "train", "points": [[t0, 15 / BUCKET_S],
                                                          [t0 + b, 5 / BUCKET_S]]}]
    (host,) = ts["hosts"]
    assert host["host"] == "node1"
    assert host["cpu"] == [[t0, 70.0], [t0 + b, 5.0]]     # (50+70)/2 + 10, then 5
    assert host["rss"] == [[t0, 1200], [t0 + b, 10]]
    assert host["gpu"] == [[t0, 40.0]]
    assert [(m["kind"], m["timestamp_us"]) for m in ts["marks"]] == [("job", t0 + 1),
                                                                       ("failure", t0 + b)]
    assert ts["marks"][0]["text"] == "Slurm job 16 requeued (Slurm says PENDING)"
    ts["marks"].pop(0)
    assert "gpus=1" in ts["marks"][0]["text"] and "SIGKILL" in ts["marks"][0]["text"]
    assert ts["marks"][0]["text"].startswith("[signal] ")     # its class (SPEC §12)
    assert ts["since_us"] <= t0 and ts["now_us"] == now
