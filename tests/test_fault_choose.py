"""choose() sends to members that are alive (real processes, kill -9)."""

from __future__ import annotations

import os

from proc_helpers import wait_gone, wait_until


def test_choose_avoids_a_member_whose_process_died():
    # before: round-robin among the least loaded, and a dead member has nothing in flight,
    # so every other choose() went to it and failed
    import signal

    from hpcmesh.actor import Actor, endpoint, this_host
    from hpcmesh.runtime.client import client_runtime
    from hpcmesh.runtime.peers import LOST_LOAD

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        mesh = procs.spawn("pid", Pid)
        pids = mesh.pid.call().get(timeout=60).values()
        for r in procs.records:
            r.stopping = True                  # a kill on purpose: no supervision noise
        os.kill(pids[1], signal.SIGKILL)
        assert wait_gone([pids[1]], 10) == []
        dead = next(r.node.node_id for r in procs.records if r.pid == pids[1])
        wait_until(lambda: client_runtime().node.load(dead) == LOST_LOAD, 10,
                   "the client has heard of the exit")       # what choose() weighs
        chosen = [mesh.pid.choose().get(timeout=30) for _ in range(12)]
        assert set(chosen) == {pids[0], pids[2]}, chosen
    finally:
        procs.stop().get(timeout=30)
