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
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for pid in wait_gone(pids, 0):
            os.kill(pid, signal.SIGKILL)


def test_exit_status_of_an_agent():
    assert exit_status("received SIGHUP") == 0
    assert exit_status("controller gone for 30.0 s") == 0
    assert exit_status("no controller connected within 5.0 s") == 1
