"""The telemetry dashboard, rendered in a real (headless) Chromium through selenium.

A LocalJob with telemetry and the dashboard, an actor mesh over two processes, calls (one
endpoint raises), one process SIGKILLed; then the page must show the mesh as a grid with one
failed and one spawned cell, the failure with its signal, the endpoints and the actors' log
lines. Needs ``chromium`` and ``chromium-driver`` (scripts/system-packages.sh) and selenium
(the ``dev`` extra): skipped without them, except under CI (``CI`` set), where it fails.
"""

import os
import shutil
import signal
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
                    and all(e in endpoints for e in ("ping", "boom", "say"))
                    and LOG_LINE in logs)

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
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors

        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot))
        print("dashboard screenshot:", shot)
        if os.environ.get("HPCMESH_TEST_ARTIFACTS"):
            out = os.environ["HPCMESH_TEST_ARTIFACTS"]
            os.makedirs(out, exist_ok=True)
            shutil.copy(shot, os.path.join(out, "dashboard.png"))
            print("dashboard screenshot copied to", os.path.join(out, "dashboard.png"))
    finally:
        try:
            if driver is not None:
                _quit(driver, profile)
        finally:
            pm.stop().get(timeout=30)


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
