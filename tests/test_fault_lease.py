"""The lease holds while an endpoint blocks the actor's loop (real processes, kill -9).

A controller dies (SIGKILL) while its actor runs an endpoint that never yields. The actor
process must still end within the lease grace (plus the watchdog's margin), and what it
started with it. Before the watchdog thread (runtime/process/lease_watchdog.py) the process lived on
until the endpoint returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from proc_helpers import wait_gone

from hpcmesh.runtime.process.lease_watchdog import LeaseClock, controller_up

CONTROLLER = textwrap.dedent("""
    import os, subprocess, sys, time
    from hpcmesh.actor import Actor, endpoint, this_host

    BLOCKING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocking")

    class Blocker(Actor):
        @endpoint
        def start_child(self) -> list[int]:
            child = subprocess.Popen(["sleep", "300"])
            return [os.getpid(), child.pid]

        @endpoint
        async def block(self, blocking: str) -> None:
            open(blocking, "w").close()
            time.sleep(120)     # sleep: never yields: the loop is blocked for two minutes

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("blocker", Blocker)
    pids = mesh.start_child.call_one().get(timeout=60)
    mesh.block.broadcast(BLOCKING)
    deadline = time.monotonic() + 60
    while not os.path.exists(BLOCKING):       # the endpoint is running
        assert time.monotonic() < deadline, "the endpoint never started"
        time.sleep(0.05)
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(600)     # sleep: lives on until the test kills it
""")


@pytest.mark.parametrize("grace", [1.0])
def test_an_actor_blocked_in_an_endpoint_still_ends_when_its_controller_dies(tmp_path, grace):
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    env = dict(os.environ, HPCMESH_LEASE_GRACE=str(grace))
    ctl = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                           env=env, start_new_session=True)
    pids: list[int] = []
    try:
        line = ctl.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, f"controller printed {line!r}"
        assert wait_gone(pids, 0.5) == pids          # actor and its child both running
        t0 = time.monotonic()
        os.killpg(ctl.pid, signal.SIGKILL)            # the controller and its own agent
        ctl.wait(timeout=10)
        left = wait_gone(pids, grace + 10)
        took = time.monotonic() - t0
        print(f"\nblocked actor and its child gone {took:.2f} s after the controller's "
              f"SIGKILL (grace {grace} s)")
        assert left == [], f"still alive {took:.1f} s after the controller died: {left}"
        assert took < grace + 6
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if ctl.poll() is None:
            os.killpg(ctl.pid, signal.SIGKILL)
            ctl.wait(timeout=10)


def test_the_lease_clock_counts_only_an_unbroken_absence():
    clock = LeaseClock(2.0)
    assert not clock.observe(0.0, None) and clock.gone_since is None     # not connected yet
    assert not clock.observe(1.0, True)
    assert not clock.observe(2.0, False) and clock.gone_since == 2.0
    assert not clock.observe(3.5, False)
    assert not clock.observe(3.9, True) and clock.gone_since is None      # it came back
    assert not clock.observe(4.0, False)
    assert clock.observe(6.0, False)


def test_a_hung_up_socket_reads_as_down_without_being_read():
    import socket
    a, b = socket.socketpair()
    try:
        b.sendall(b"unread data stays unread")
        assert controller_up(a.fileno()) is True
        b.close()
        assert controller_up(a.fileno()) is False
        assert a.recv(100) == b"unread data stays unread"     # the watchdog read nothing
        assert controller_up(-1) is False and controller_up(None) is None
    finally:
        a.close()
