"""What an actor starts goes when its process goes (real processes).

A subprocess an actor starts (and what that starts) lives in the actor process's process
group; when the process ends, stopped, crashed or killed with SIGKILL, its agent kills
what is left of the group.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from proc_helpers import wait_gone

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host


class Starter(Actor):
    @endpoint
    def start(self) -> list[int]:
        import subprocess
        # a child, and a grandchild through a shell: both in this process's group
        child = subprocess.Popen(["sleep", "600"])
        shell = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"],
                                 stdout=subprocess.PIPE, text=True)
        grandchild = int(shell.stdout.readline())
        return [os.getpid(), child.pid, shell.pid, grandchild]


@pytest.mark.parametrize("how", ["stop", "sigkill"])
def test_what_an_actor_started_is_gone_with_its_process(how):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        pids = procs.spawn("starter", Starter).start.call_one().get(timeout=30)
        actor_pid, started = pids[0], pids[1:]
        assert wait_gone(started, 0.5) == started        # all running
        t0 = time.monotonic()
        if how == "stop":
            procs.stop().get(timeout=30)
        else:
            for r in procs.records:
                r.stopping = True           # a kill on purpose: no supervision noise
            os.kill(actor_pid, signal.SIGKILL)
        left = wait_gone(started, 10)
        took = time.monotonic() - t0
        print(f"\n{how}: the actor's child, shell and grandchild gone {took:.2f} s after")
        assert left == [], f"still alive after {how}: {left}"
        assert wait_gone([actor_pid], 5) == []
    finally:
        try:
            procs.stop().get(timeout=30)
        except SupervisionError:
            pass
