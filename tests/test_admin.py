"""The admin view (``job.enable_admin()``): real processes, a real HTTP server, real sockets."""

import inspect
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from proc_helpers import wait_until

from hpcmesh.actor import Actor, endpoint
from hpcmesh.admin import server as admin_server
from hpcmesh.admin.config import MeshAdminConfig
from hpcmesh.admin.server import admin_endpoint
from hpcmesh.admin.tree import build_tree
from hpcmesh.job import JobTrait, LocalJob
from hpcmesh.runtime.observe.introspect import find_pyspy
from hpcmesh.token_http import parse_addr


def wait_here_for_the_test(release: str, limit: float = 30) -> str:
    """Until the file ``release`` exists; ``<release>.<pid>`` says this process waits now."""
    open(f"{release}.{os.getpid()}", "w").close()
    deadline = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "released"


def wait_here_blocking_the_loop(release: str, limit: float = 30) -> str:
    return wait_here_for_the_test(release, limit)


class Waiter(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def env(self, name: str):
        return os.environ.get(name)

    @endpoint
    def hold(self, release: str) -> str:
        return wait_here_for_the_test(release)

    @endpoint
    async def block_loop(self, release: str) -> str:
        return wait_here_blocking_the_loop(release)     # time.sleep inside async def


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str) -> dict:
    code, body = get(url)
    assert code == 200, (code, body)
    return json.loads(body)


def without_token(url: str, path: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{path}"


def processes(tree: dict, mesh: str) -> list[dict]:
    return sorted((p for h in tree["hosts"] for p in h["processes"] if p["mesh"] == mesh),
                  key=lambda p: p["point"]["gpus"])


def test_enable_admin_is_configuration_only_and_chainable():
    assert list(inspect.signature(JobTrait.__init__).parameters) == ["self"]
    job = LocalJob()
    assert job.admin_config is None
    assert job.enable_admin() is job
    assert job.enable_admin(admin_addr="0.0.0.0:0").admin_config.admin_addr == "0.0.0.0:0"
    assert job.enable_admin(MeshAdminConfig("[::1]:0")) is job
    with pytest.raises(TypeError, match="not both"):
        job.enable_admin(MeshAdminConfig(), admin_addr="127.0.0.1:0")
    with pytest.raises(TypeError, match="unknown options port.*admin_addr"):
        job.enable_admin(port=3)
    with pytest.raises(ValueError, match="admin_addr must look like 'host:port'"):
        job.enable_admin(admin_addr="localhost")
    assert parse_addr(None) == ("127.0.0.1", 0) and parse_addr("[::1]:80") == ("::1", 80)


def test_tree_of_a_process_that_does_not_answer_uses_the_remembered_actors():
    procs = [{"name": "m-0", "label": "gpus=0", "mesh": "m", "point": {"gpus": 0},
              "host": "h", "pid": 1, "status": "failed", "error": "died: SIGKILL"}]
    meshes = [{"actor_id": "a", "name": "w", "class": "W", "proc_names": ["m-0"]}]
    tree = build_tree(procs, {}, meshes)
    (p,) = tree["hosts"][0]["processes"]
    assert p["answered"] is False
    assert p["actors"] == [{"actor_id": "a", "mesh": "w", "class": "W", "point": {"rank": 0},
                            "status": "failed", "error": "died: SIGKILL"}]


def test_admin_view_tree_stacks_token_and_failures(tmp_path):
    job = LocalJob(hosts=("hosts",)).enable_admin()
    state = job.state(cached_path=None)
    url = state.admin_url
    assert url and urlsplit(url).hostname == "127.0.0.1"        # loopback by default
    assert os.environ["MONARCH_ADMIN_URL"] == url == os.environ["HPCMESH_ADMIN_URL"]

    # no token, a wrong token: 401 and nothing else
    token = urlsplit(url).query.split("=", 1)[1]
    for target, headers in ((without_token(url, "/api/tree"), {}),
                            (without_token(url, "/api/tree?token=nope"), {}),
                            (without_token(url, "/api/stack/x"), {"Authorization": "Bearer no"}),
                            (without_token(url, "/nothing"), {})):
        code, body = get(target, headers)
        assert (code, body) == (401, b""), target
    code, _ = get(without_token(url, "/api/tree"), {"Authorization": f"Bearer {token}"})
    assert code == 200

    pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="admintest")
    try:
        w = pm.spawn("waiter", Waiter)
        pids = w.pid.call().get(timeout=60).values()
        # the URL is exported to processes started after the server is up
        assert w.slice(gpus=1).env.call_one("MONARCH_ADMIN_URL").get(timeout=30) == url

        tree = get_json(admin_endpoint(url, "/api/tree"))
        procs = processes(tree, "admintest")
        assert [p["pid"] for p in procs] == list(pids)
        assert [p["point"] for p in procs] == [{"gpus": 0}, {"gpus": 1}]
        for p in procs:
            assert p["status"] == "running" and p["answered"] and p["host"]
            (actor,) = [a for a in p["actors"] if a["mesh"] == "waiter"]
            assert actor["class"] == "Waiter" and actor["status"] == "running"
            assert actor["error"] is None

        # stacks: from the event loop while a sync endpoint waits on its thread ...
        release = str(tmp_path / "release")
        held = w.slice(gpus=0).hold.call_one(release)
        blocked = w.slice(gpus=1).block_loop.call_one(release)
        wait_until(lambda: all(os.path.exists(f"{release}.{pid}") for pid in pids), 30,
                   "both endpoints are waiting")
        doc = get_json(admin_endpoint(url, f"/api/stack/{procs[0]['name']}"))
        assert doc["source"] == "event loop" and doc["pid"] == pids[0]
        assert "wait_here_for_the_test" in doc["text"]
        # ... and from py-spy (faulthandler without it) when an async endpoint blocks the loop
        t0 = time.monotonic()
        doc = get_json(admin_endpoint(url, f"/api/stack/{procs[1]['name']}"))
        assert doc["source"] == ("py-spy" if find_pyspy() else "faulthandler"), doc
        assert "wait_here_blocking_the_loop" in doc["text"]
        assert time.monotonic() - t0 < 10
        # the tree still answers, the blocked process marked as not answering
        tree = get_json(admin_endpoint(url, "/api/tree"))
        assert [p["answered"] for p in processes(tree, "admintest")] == [True, False]
        open(release, "w").close()
        assert held.get(timeout=30) == blocked.get(timeout=30) == "released"
        code, _ = get(admin_endpoint(url, "/api/stack/no-such-process"))
        assert code == 404

        # kill -9 one process: failed, with the error, and so are its actors
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while True:
            p1 = processes(get_json(admin_endpoint(url, "/api/tree")), "admintest")[1]
            if p1["status"] == "failed" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert p1["status"] == "failed" and "SIGKILL" in p1["error"], p1
        (actor,) = [a for a in p1["actors"] if a["mesh"] == "waiter"]
        assert actor["status"] == "failed" and "SIGKILL" in actor["error"]
    finally:
        pm.stop().get(timeout=30)
    tree = get_json(admin_endpoint(url, "/api/tree"))
    assert processes(tree, "admintest")[0]["status"] == "stopped"


def test_other_bind_address_is_explicit_and_still_needs_the_token():
    state = LocalJob(hosts=("hosts",)).enable_admin(admin_addr="0.0.0.0:0").state(cached_path=None)
    try:
        # bound to every interface: the URL names this host, for the others to reach it
        assert urlsplit(state.admin_url).hostname == socket.gethostname()
        port = urlsplit(state.admin_url).port
        code, body = get(f"http://127.0.0.1:{port}/api/tree")
        assert (code, body) == (401, b"")
        url = state.admin_url.replace(urlsplit(state.admin_url).hostname, "127.0.0.1")
        assert get(admin_endpoint(url, "/api/tree"))[0] == 200
    finally:
        admin_server.stop_admin()
    assert "MONARCH_ADMIN_URL" not in os.environ


def test_a_reconnecting_client_serves_the_admin_view_again(tmp_path):
    cache = str(tmp_path / "state.pkl")
    first = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=cache)
    try:
        from hpcmesh.job import job_load
        assert job_load(cache).admin_config == MeshAdminConfig()     # kept in the cache
        again = LocalJob(hosts=("hosts",)).state(cached_path=cache)   # the cached job's config
        assert again.admin_url == first.admin_url
        assert get(admin_endpoint(again.admin_url, "/api/tree"))[0] == 200
        assert LocalJob(hosts=("hosts",)).state(cached_path=None).admin_url is None
    finally:
        admin_server.stop_admin()
