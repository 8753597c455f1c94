"""The host agent's one signal policy (hpcmesh.runtime.process.agent_main), on a real
``hpcmesh worker`` process with a client connected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from proc_helpers import wait_gone

from hpcmesh.runtime.process.agent_main import exit_status


def _start_worker(tmp_path, notice):
    ready = tmp_path / "ready"
    secret = os.urandom(32)
    env = dict(os.environ, HPCMESH_SECRET=secret.hex(), HPCMESH_SLURM_NOTICE=str(notice))
    agent = subprocess.Popen([sys.executable, "-m", "hpcmesh", "worker", "--listen",
                              "tcp://127.0.0.1:0", "--ready-file", str(ready), "--grace", "30"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().endswith("\n")):
        assert agent.poll() is None, agent.stderr.read()
        assert time.monotonic() < deadline, "the worker wrote no ready file in 30 s"
        time.sleep(0.05)
    return agent, ready.read_text().split()[0], secret


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_worker_notes_usr1_and_stop_signals_kill_what_actors_started(tmp_path, stop):
    """SIGUSR1 (Slurm's time-limit warning) is a line in the notice file and the agent goes
    on serving; SIGTERM or SIGHUP, with the client still connected, ends it at once with
    exit 0, and neither its actor process nor what that started (a child, and a grandchild
    through a shell, all in the actor's process group) outlives it."""
    from hpcmesh.actor import Actor, attach_to_workers, endpoint

    class Tree(Actor):
        @endpoint
        def grow(self) -> list[int]:
            sh = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; exec sleep 600"],
                                  stdout=subprocess.PIPE, text=True)
            return [os.getpid(), sh.pid, int(sh.stdout.readline())]

        @endpoint
        def ping(self) -> str:
            return "pong"

    notice = tmp_path / "notice"
    agent, addr, secret = _start_worker(tmp_path, notice)
    pids: list[int] = []
    try:
        procs = attach_to_workers([addr], secret=secret, timeout=30).spawn_procs({"p": 1})
        tree = procs.spawn("tree", Tree)
        pids = tree.grow.call_one().get(timeout=60)
        assert wait_gone(pids, 0.3) == pids                 # all three running

        agent.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not (notice.exists() and notice.read_text().endswith("\n")):
            assert time.monotonic() < deadline, "SIGUSR1 left no notice"
            time.sleep(0.05)
        [entry] = [json.loads(line) for line in notice.read_text().splitlines()]
        assert entry["signal"] == "SIGUSR1" and entry["pid"] == agent.pid
        assert agent.poll() is None and tree.ping.call_one().get(timeout=30) == "pong"

        for r in procs.records:
            r.stopping = True           # we are about to kill them on purpose
        t0 = time.monotonic()
        agent.send_signal(getattr(signal, stop))
        assert agent.wait(15) == 0
        assert time.monotonic() - t0 < 10
        err = agent.stderr.read()
        assert f"exiting: received {stop}" in err and "recorded in" in err
        assert wait_gone(pids, 10) == [], f"survived {stop} to their agent"
    finally:
        _end(agent, pids)


def _end(agent: subprocess.Popen, pids: list[int]) -> None:
    """Whatever a test's agent and processes left running goes."""
    if agent.poll() is None:
        agent.kill()
        agent.wait()
    for pid in wait_gone(pids, 0):
        os.kill(pid, signal.SIGKILL)


def test_exit_status_of_an_agent():
    assert exit_status("received SIGHUP") == 0
    assert exit_status("controller gone for 30.0 s") == 0
    assert exit_status("no controller connected within 5.0 s") == 1


def _start_slurm_agent(tmp_path, secret: bytes, **slurm):
    """The Slurm host agent (``slurm_agent.agent_main``) as srun runs it, with the variables
    of a job step (``slurm``) but no Slurm; returns it and its address."""
    from hpcmesh.job.slurm_agent import AGENT_CODE, ready_name
    env = dict(os.environ, HPCMESH_SECRET=secret.hex(), SLURM_JOB_ID="4242", SLURM_PROCID="0",
               SLURM_RESTART_COUNT="0", HPCMESH_IFNAME="lo", **slurm)
    env.pop("HPCMESH_TERM_IS_NOTICE", None)
    agent = subprocess.Popen([sys.executable, "-c", AGENT_CODE, "--job-dir", str(tmp_path),
                              "--mesh", "m", "--grace", "30"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ready = tmp_path / ready_name("m", 0, "0")
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().endswith("\n")):
        assert agent.poll() is None, agent.stderr.read()
        assert time.monotonic() < deadline, "the agent wrote no ready file in 30 s"
        time.sleep(0.05)
    return agent, next(a for a in ready.read_text().split() if a.startswith("tcp://"))


def test_sigterm_in_a_slurm_step_is_a_notice_the_client_hears_at_once(tmp_path):
    """In a Slurm job step, SIGTERM is Slurm preempting the job (the partition's GraceTime,
    then SIGKILL) or ending it: the agent, its fork server and its processes keep running,
    the notice file has it, and the client hears of it at once (its job is asked whether
    it moved); the agent's own stop of its processes (SIGHUP there) and SIGHUP to the agent
    still end them at once."""
    from hpcmesh.actor import Actor, attach_to_workers, endpoint
    from hpcmesh.runtime.client import client_runtime

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    secret = os.urandom(32)
    agent, addr = _start_slurm_agent(tmp_path, secret, SLURM_STEP_ID="0")
    pids: list[int] = []
    asked: list[tuple[float, str]] = []
    try:
        hosts = attach_to_workers([addr], secret=secret, timeout=30)
        unwatch = client_runtime().watch_job_ends(
            [hosts.refs[0].agent.node_id], lambda what: asked.append((time.monotonic(), what)))
        procs = hosts.spawn_procs({"p": 2})
        actors = procs.spawn("pid", Pid)
        pids = sorted(actors.pid.call().get(timeout=60).values())
        assert len(pids) == 2 and wait_gone(pids, 0.2) == pids

        zygote = [c for c in _children(agent.pid) if c not in pids]
        assert len(zygote) == 1, zygote             # the fork server
        t0 = time.monotonic()
        # Slurm signals the step's tasks (proctrack/cgroup), or all its processes
        for pid in (agent.pid, *zygote, *pids):
            os.kill(pid, signal.SIGTERM)
        notice = tmp_path / "notice"
        deadline = time.monotonic() + 10
        while not (asked and notice.exists() and notice.read_text().endswith("\n")):
            assert agent.poll() is None, agent.stderr.read()
            assert time.monotonic() < deadline, f"no notice within 10 s (asked: {asked})"
            time.sleep(0.02)
        print(f"\nSIGTERM -> the client asked its job whether it moved: "
              f"{asked[0][0] - t0:.3f} s")
        assert asked[0][0] - t0 < 2.0 and "received SIGTERM" in asked[0][1], asked
        [entry] = [json.loads(line) for line in notice.read_text().splitlines()]
        assert (entry["signal"], entry["pid"], entry["slurm_job_id"]) == (
            "SIGTERM", agent.pid, "4242")
        # still serving: the agent, the fork server and the processes it forked
        assert sorted(actors.pid.call().get(timeout=30).values()) == pids
        assert sorted(procs.spawn("pid2", Pid).pid.call().get(timeout=60).values()) == pids
        assert agent.poll() is None

        assert wait_gone(zygote, 0.1) == zygote
        # SIGHUP is the agent's stop for its processes there (stop_procs), not SIGTERM
        procs.records[0].stopping = True        # ended on purpose
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGHUP)
        assert wait_gone(pids[:1], 5) == [], "SIGHUP did not stop an actor process"
        print(f"SIGHUP -> the actor process ended: {time.monotonic() - t0:.2f} s")
        t0 = time.monotonic()
        codes = procs.stop().get(timeout=30)
        stopped = time.monotonic() - t0
        assert wait_gone(pids, 5) == []
        print(f"stopping the mesh after the notice: {stopped:.2f} s, exit codes {codes}")
        assert sorted(codes.values()) == [0, 128 + signal.SIGHUP], codes
        assert stopped < 5.0
        unwatch()

        t0 = time.monotonic()
        agent.send_signal(signal.SIGHUP)        # SlurmJob.kill's stop: still at once
        assert agent.wait(15) == 0 and time.monotonic() - t0 < 5
        assert "exiting: received SIGHUP" in agent.stderr.read()
    finally:
        _end(agent, pids)


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def test_sigterm_outside_a_slurm_step_still_stops_the_slurm_agent(tmp_path):
    """The same agent without a job step (no ``SLURM_STEP_ID``: run by hand, or the batch
    script's own shell) keeps SIGTERM's meaning: stop now, exit 0."""
    secret = os.urandom(32)
    agent, _addr = _start_slurm_agent(tmp_path, secret)
    t0 = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(15) == 0 and time.monotonic() - t0 < 5
    assert "exiting: received SIGTERM" in agent.stderr.read()


def test_a_notice_of_a_job_that_moved_ends_its_run_at_once(tmp_path):
    """SIGTERM of a job's end (scancel, time limit, requeue: Slurm says the job moved): the
    calls on its processes fail at once with the job's words, and the client ends the old
    run's agent (and so its processes) instead of leaving them to Slurm's SIGKILL."""
    from hpcmesh.actor import Actor, SupervisionError, attach_to_workers, endpoint
    from hpcmesh.runtime.client import client_runtime
    from hpcmesh.runtime.errors import ENDED_BY_SLURM

    class Slow(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def sleep(self, s: float) -> None:
            time.sleep(s)       # sleep: the endpoint's work, a call in flight when the job moves

    secret = os.urandom(32)
    agent, addr = _start_slurm_agent(tmp_path, secret, SLURM_STEP_ID="0")
    pids: list[int] = []
    try:
        hosts = attach_to_workers([addr], secret=secret, timeout=30)
        moved = SupervisionError("Slurm job 4242 was cancelled (Slurm says CANCELLED)",
                                 exit_status="ended by Slurm (cancelled)",
                                 reason=ENDED_BY_SLURM)
        unwatch = client_runtime().watch_job_ends([hosts.refs[0].agent.node_id],
                                                  lambda what: moved)
        procs = hosts.spawn_procs({"p": 1})
        slow = procs.spawn("slow", Slow)
        pids = list(slow.pid.call().get(timeout=60).values())
        call = slow.sleep.call(600)
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        with pytest.raises(SupervisionError, match="was cancelled") as e:
            call.get(timeout=30)
        failed = time.monotonic() - t0
        assert e.value.reason == ENDED_BY_SLURM
        assert agent.wait(15) == 0
        gone = time.monotonic() - t0
        assert wait_gone(pids, 5) == []
        print(f"\nSIGTERM of a job that moved -> the call failed: {failed:.3f} s, its agent "
              f"was gone: {gone:.2f} s")
        assert failed < 3 and gone < 5
        assert "exiting: shut down by its HostMesh" in agent.stderr.read()
        unwatch()
    finally:
        _end(agent, pids)
