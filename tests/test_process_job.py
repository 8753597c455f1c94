"""ProcessJob: local host agents as "hosts" (Monarch's ProcessJob), real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hpcmesh.actor import Actor, SupervisionError, endpoint
from hpcmesh.job import ProcessJob


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_bad_meshes_are_named():
    with pytest.raises(TypeError, match="mapping of mesh name"):
        ProcessJob({})
    with pytest.raises(ValueError, match="'trainers' needs a positive int"):
        ProcessJob({"trainers": 0})
    with pytest.raises(ValueError, match="Python identifier"):
        ProcessJob({"2x": 1})
    with pytest.raises(NotImplementedError, match="client scripts"):
        ProcessJob({"a": 1}).apply("client.py")


def test_a_dead_host_fails_its_processes_and_kill_leaves_nothing():
    job = ProcessJob({"hosts": 2})
    state = job.state(cached_path=None)
    agents = [p for ps in job.pids.values() for p in ps]
    workdir = job.workdir
    try:
        procs = state.hosts.spawn_procs({"gpus": 1})
        pids = procs.spawn("pid", Pid).pid.call().get(timeout=60).values()
        os.kill(agents[1], signal.SIGKILL)          # host 1 is gone, with its processes
        deadline = time.monotonic() + 15
        while _alive(pids[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids[1]), "the dead host's process outlived it"
        assert not job.active
        m = procs.slice(hosts=1).spawn("again", Pid)
        with pytest.raises(SupervisionError):
            m.pid.call().get(timeout=30)
    finally:
        job.kill()
    deadline = time.monotonic() + 10
    while [p for p in agents + pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)                 # the agents' processes end after their agent
    assert [p for p in agents + pids if _alive(p)] == []
    assert not os.path.exists(workdir)


def test_a_new_client_reconnects_through_the_cache(tmp_path):
    client = textwrap.dedent("""
        import os, sys
        from hpcmesh.actor import Actor, endpoint
        from hpcmesh.job import ProcessJob

        class Pid(Actor):
            @endpoint
            def agent(self):
                return os.getppid()

        job = ProcessJob({"trainers": 2})
        state = job.state(cached_path=sys.argv[1])
        print(sorted(job.pids["trainers"]),
              state.trainers.spawn_procs().spawn("p", Pid).agent.call().get().values())
        if sys.argv[2] == "kill":
            job.kill()
    """)
    path = str(tmp_path / "state.pkl")
    runs = []
    for what in ("keep", "kill"):
        r = subprocess.run([sys.executable, "-c", client, path, what], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        runs.append(r.stdout.strip())
    assert runs[0].split("]")[0] == runs[1].split("]")[0], runs     # the same agents
    agents = eval(runs[0].split("]")[0] + "]")
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in agents) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in agents)


def test_killing_the_job_is_no_failure_of_its_processes(unhandled_faults):
    job = ProcessJob({"hosts": 2})
    state = job.state(cached_path=None)
    procs = state.hosts.spawn_procs({"gpus": 2})
    pids = procs.spawn("pid", Pid).pid.call().get(timeout=60).values()
    before = len(unhandled_faults)
    job.kill()                          # the agents stop, and their processes with them
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    # sleep: a wrong failure report (of the exits, or of the agents found lost) would come
    # in meanwhile; the agents' processes are gone, and no event says that none will
    time.sleep(1.0)
    assert not any(_alive(p) for p in pids)
    assert unhandled_faults[before:] == []
