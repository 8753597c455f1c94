"""Telemetry and the admin view at the mission's shape: what one collection, the admin tree
and the dashboard cost with hundreds of processes.

    .venv/bin/python benchmarks/bench_observe_scale.py [--scenario process:32x8] [--reps 5]
    .venv/bin/python benchmarks/bench_observe_scale.py --scenario sim:32x8 --browser

``process:HxG``: a ``ProcessJob`` of H local host agents with G real processes each;
``sim:HxG``: H x G simulated processes (``simulated_hosts.py``: real controller, records,
connections; the processes are nodes of one simulating process, which record no
telemetry of their own). An actor mesh over all of them answers 20 calls, then, with the
periodic collector paused: one collection (wall, the controller's CPU, the drain calls
it made), ``GET /api/tree`` and ``GET /api/dashboard`` (each the median of ``--reps``);
``--browser``: the dashboard page in headless Chromium until its grid of H x G cells is
drawn (the first load starts the query worker). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import urllib.request
from urllib.parse import urlsplit

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scale import Noop  # noqa: E402

from hpcmesh.admin.server import admin_endpoint, start_admin, stop_admin  # noqa: E402
from hpcmesh.telemetry import TelemetryConfig  # noqa: E402
from hpcmesh.telemetry.server import current_service, start_telemetry, stop_telemetry  # noqa


def _median_ms(fn, reps: int) -> float:
    took = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return round(statistics.median(took) * 1e3, 1)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def _page_loads(url: str, n: int, loads: int = 3) -> list[float]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    os.environ["SE_OFFLINE"] = "true"
    import tempfile
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_dashboard import _browser, _quit
    driver, profile = _browser(pathlib.Path(tempfile.mkdtemp(prefix="bench-observe-")))
    try:
        out = []
        for _ in range(loads):
            t0 = time.perf_counter()
            driver.get(url)
            WebDriverWait(driver, 60, poll_frequency=0.02).until(lambda d: len(
                d.find_elements(By.CSS_SELECTOR, "div.procmesh .hc[data-key]")) >= n)
            out.append(round((time.perf_counter() - t0) * 1e3))
        return out
    finally:
        _quit(driver, profile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default="process:32x8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--browser", action="store_true")
    a = ap.parse_args()
    kind, _, shape = a.scenario.partition(":")
    hosts, per = (int(x) for x in shape.split("x"))
    config = TelemetryConfig(include_dashboard=True, dashboard_port=0)
    job = stop_simulation = None
    if kind == "process":
        from hpcmesh.job import ProcessJob
        job = ProcessJob({"hosts": hosts}).enable_admin().enable_telemetry(config)
        state = job.state(cached_path=None)
        admin, dashboard = state.admin_url, state.dashboard_url
        procs = state.hosts.spawn_procs(per_host={"gpus": per}, name="obs")
    elif kind == "sim":
        from simulated_hosts import simulated_proc_mesh
        dashboard = start_telemetry(config)["dashboard_url"]
        admin = start_admin()
        procs, stop_simulation = simulated_proc_mesh(hosts, per, name="obs")
    else:
        raise SystemExit(f"--scenario {a.scenario!r}: process:HxG or sim:HxG")
    try:
        actors = procs.spawn("noop", Noop)
        for _ in range(20):
            actors.ping.call().get(timeout=300)
        collector = current_service().collector
        collector.pause()
        collector.collect()
        node, calls = collector.rt.node, []
        rpc = node.rpc
        node.rpc = lambda ref, service, *args: (calls.append(service), rpc(ref, service,
                                                                           *args))[1]
        cpu0 = time.process_time()
        collect_ms = _median_ms(collector.collect, a.reps)
        cpu_ms = (time.process_time() - cpu0) / a.reps * 1e3
        del node.rpc
        p = urlsplit(dashboard)
        api = f"{p.scheme}://{p.netloc}/api/dashboard?{p.query}"
        out = {"scenario": a.scenario, "processes": hosts * per,
               "collect_ms": collect_ms, "collect_controller_cpu_ms": round(cpu_ms, 1),
               "drain_calls_per_collection": len(calls) / a.reps,
               "tree_ms": _median_ms(lambda: _get(admin_endpoint(admin, "/api/tree")),
                                     a.reps),
               "dashboard_doc_ms": _median_ms(lambda: _get(api), a.reps)}
        if a.browser:
            out["page_to_grid_ms"] = _page_loads(dashboard, hosts * per)
        print(json.dumps(out), flush=True)
        procs.stop().get(timeout=300)
    finally:
        stop_telemetry()
        stop_admin()
        if stop_simulation is not None:
            stop_simulation()
        if job is not None:
            job.kill()


if __name__ == "__main__":
    main()
