"""py-spy as a source of ``/api/stack/<process>``: a real actor stuck in C code that holds
the GIL (its event loop cannot answer), read by py-spy and by faulthandler; and how the
host agent's py-spy runner reports what went wrong (fake and real py-spy executables)."""

import asyncio
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from ci_gate import requires, skip_or_fail
from proc_helpers import wait_gone, wait_until
from test_admin import get, get_json, processes

from hpcmesh.actor import Actor, endpoint
from hpcmesh.admin import server as admin_server
from hpcmesh.admin.server import admin_endpoint
from hpcmesh.job import LocalJob
from hpcmesh.runtime.observe import introspect
from hpcmesh.runtime.observe.introspect import PySpyError, find_pyspy, pyspy_dump

NEEDS_PYSPY = None if find_pyspy() else "needs py-spy (pip install 'hpcmesh[stacks]')"


def stuck_in_the_regex() -> bool:
    # catastrophic backtracking: about 2**40 steps inside _sre, which holds the GIL all along
    return re.match(r"(a+)+$", "a" * 40 + "b") is not None


class Stuck(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def stuck(self, entered: str) -> bool:  # a sync endpoint: on its thread, holding the GIL
        open(entered, "w").close()
        return stuck_in_the_regex()


def stack(url: str, name: str, query: str = "") -> tuple[int, dict]:
    code, body = get(admin_endpoint(url, f"/api/stack/{name}") + query)
    return code, json.loads(body)


@requires(NEEDS_PYSPY)
def test_stacks_of_a_process_stuck_holding_the_gil(monkeypatch, tmp_path):
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    url = state.admin_url
    pm = pid = call = None
    try:
        for query, allowed in (("&source=gdb", "event loop, py-spy, faulthandler"),
                               ("&native=maybe", "native"),
                               ("&source=faulthandler&native=1", "py-spy")):
            code, doc = stack(url, "any", query)
            assert code == 400 and allowed in doc["error"], (query, doc)

        pm = state.hosts.spawn_procs(per_host={"gpus": 1}, name="pyspytest")
        a = pm.spawn("stuck", Stuck)
        pid = a.pid.call_one().get(timeout=60)
        (proc,) = processes(get_json(admin_endpoint(url, "/api/tree")), "pyspytest")
        name = proc["name"]
        call = a.stuck.call_one(str(tmp_path / "stuck"))
        wait_until((tmp_path / "stuck").exists, 30, "the endpoint is in the regex")

        # the loop does not answer (the GIL is held), py-spy does, within a few seconds
        t0 = time.monotonic()
        code, doc = stack(url, name)
        assert code == 200 and doc["source"] == "py-spy", doc
        assert "TimeoutError" in doc["loop_error"] and doc["pid"] == pid
        assert "stuck_in_the_regex" in doc["text"] and "active+gil" in doc["text"], doc["text"]
        assert time.monotonic() - t0 < 8
        # native frames on request: the regex engine's C functions, in a shared library
        code, doc = stack(url, name, "&source=py-spy&native=1")
        assert code == 200 and doc["source"] == "py-spy" and "loop_error" not in doc
        assert "stuck_in_the_regex" in doc["text"] and ".so" in doc["text"], doc["text"]
        # faulthandler on request: its C signal handler needs no GIL either
        t0 = time.monotonic()
        code, doc = stack(url, name, "&source=faulthandler")
        assert code == 200 and doc["source"] == "faulthandler", doc
        assert "stuck_in_the_regex" in doc["text"] and time.monotonic() - t0 < 5

        # without py-spy: faulthandler, saying why
        monkeypatch.setattr(introspect, "find_pyspy", lambda: None)
        code, doc = stack(url, name)
        assert code == 200 and doc["source"] == "faulthandler", doc
        assert doc["pyspy_error"].startswith("not installed") and "loop_error" in doc
        assert "stuck_in_the_regex" in doc["text"]
        code, doc = stack(url, name, "&source=" + quote("py-spy"))
        assert code == 502 and doc["pyspy_error"].startswith("not installed"), doc
        code, doc = stack(url, name, "&source=" + quote("event loop"))
        assert code == 502 and "TimeoutError" in doc["loop_error"], doc
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)      # it would not stop on its own
        if call is not None:
            with pytest.raises(Exception):
                call.get(timeout=30)
        if pm is not None:
            pm.stop().get(timeout=30)
        admin_server.stop_admin()
    assert pid is not None and wait_gone([pid]) == []


# -- the py-spy runner on its own ---------------------------------------------------------
@pytest.fixture
def target():
    """A Python process to point py-spy at (ended by the test)."""
    # sleep: a process that does nothing but live until the fixture ends it
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


def fake_pyspy(tmp_path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_find_pyspy_looks_beside_the_interpreter_then_on_path(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert find_pyspy() is None
    with pytest.raises(PySpyError, match="^not installed: .*hpcmesh\\[stacks\\]"):
        pyspy_dump(1)
    (tmp_path / "elsewhere").mkdir()
    on_path = fake_pyspy(tmp_path / "elsewhere", "exit 0")
    assert find_pyspy() == on_path
    beside = fake_pyspy(tmp_path / "bin", "exit 0")
    assert find_pyspy() == beside


def test_pyspy_dump_output_and_failures(tmp_path, target):
    exe = fake_pyspy(tmp_path, 'echo "$@"; echo "Thread 1 (idle): \\"MainThread\\""')
    assert pyspy_dump(target, exe=exe) == f'dump --pid {target}\nThread 1 (idle): "MainThread"\n'
    assert pyspy_dump(target, native=True, exe=exe).startswith(f"dump --pid {target} --native")

    exe = fake_pyspy(tmp_path, "echo \"Permission Denied: Try running again with elevated "
                               "permissions by going 'sudo env \\\"PATH=\\$PATH\\\" !!'\" >&2; "
                               "exit 1")
    with pytest.raises(PySpyError) as e:
        pyspy_dump(target, exe=exe)
    assert e.value.reason == "ptrace not permitted" and "Permission Denied" in str(e.value)

    exe = fake_pyspy(tmp_path, "echo 'Error: Failed to get process executable name.' >&2\n"
                               "echo 'Stack backtrace:' >&2; echo '   0: anyhow' >&2; exit 1")
    with pytest.raises(PySpyError) as e:
        pyspy_dump(target, exe=exe)
    assert e.value.reason == "failed" and "exit 1" in str(e.value)
    assert "executable name" in str(e.value) and "anyhow" not in str(e.value)

    exe = fake_pyspy(tmp_path, "exec sleep 30")
    t0 = time.monotonic()
    with pytest.raises(PySpyError, match="^timed out: .* 0.5 s"):
        pyspy_dump(target, timeout=0.5, exe=exe)
    assert time.monotonic() - t0 < 5

    # it travels back to the admin server as an RPC's exception
    again = pickle.loads(pickle.dumps(PySpyError("timed out", "after 5 s")))
    assert (again.reason, str(again)) == ("timed out", "timed out: after 5 s")


@requires(NEEDS_PYSPY)
def test_real_pyspy_that_may_not_trace_says_so(target):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        skip_or_fail("needs root and setpriv (util-linux) to run py-spy as another user")
    other_user = f'exec setpriv --reuid=65534 --regid=65534 --clear-groups {find_pyspy()} "$@"'
    with tempfile.TemporaryDirectory() as d:      # not tmp_path: 0700, nobody could run it
        os.chmod(d, 0o755)
        exe = fake_pyspy(Path(d), other_user)
        with pytest.raises(PySpyError) as e:
            pyspy_dump(target, exe=exe)
    assert e.value.reason == "ptrace not permitted", str(e.value)
    # and as root it can
    assert "Thread" in pyspy_dump(target)


@requires(NEEDS_PYSPY)
def test_dumps_of_one_process_asked_at_once_take_turns(target):
    # review: two admin views asking at once made all but one py-spy fail to attach, and
    # the failure read as "ptrace not permitted"; the agent runs them one at a time now,
    # and a failure while another tracer is attached names it
    from hpcmesh.runtime.observe.introspect import pyspy_failure, dump_stacks_by_pyspy

    async def four():
        return await asyncio.gather(*(dump_stacks_by_pyspy(target) for _ in range(4)))
    assert all("Thread" in text for text in asyncio.run(four()))
    reason, detail = pyspy_failure(1, "Error: Failed to suspend process: EPERM", tracer=77)
    assert reason == "failed" and "traced already (by pid 77)" in detail
