"""``breakpoint()`` in an endpoint, attached to from ``hpcmesh debug`` in a real pty."""

import os
import pty
import select
import subprocess
import sys
import time

from hpcmesh.actor import Actor, debug_controller, endpoint
from hpcmesh.job import LocalJob


class Debuggee(Actor):
    @endpoint
    def step(self, x: int) -> int:
        y = x * 2
        breakpoint()
        return y + 1

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint
    async def async_break(self) -> str:
        breakpoint()          # on the event loop's thread: skipped, with a message
        return "went on"


def read_until(fd: int, marker: str, timeout: float = 30.0) -> str:
    buf = ""
    deadline = time.monotonic() + timeout
    while marker not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; got:\n{buf}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:        # the child closed the pty
                break
            if not chunk:
                break
            buf += chunk.decode("utf-8", "replace")
    assert marker in buf, buf
    return buf


def test_attach_to_a_breakpoint_from_hpcmesh_debug_in_a_pty():
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="dbg")
    try:
        d = pm.spawn("d", Debuggee)
        other = pm.spawn("other", Debuggee)
        assert d.async_break.call().get(timeout=60).values() == ["went on"] * 2
        paused = d.slice(gpus=0).step.call_one(20)
        deadline = time.monotonic() + 20
        sessions = []
        while not sessions and time.monotonic() < deadline:
            sessions = debug_controller().list()
            time.sleep(0.05)
        (s,) = sessions
        assert (s["mesh"], s["rank"], s["point"], s["pid"]) == ("d", 0, {"gpus": 0},
                                                               pm.pids[0])
        # the rest goes on: the other member, and another actor in the paused one's process
        assert d.slice(gpus=1).ping.call_one().get(timeout=10) == "pong"
        assert other.slice(gpus=0).ping.call_one().get(timeout=10) == "pong"
        assert not paused.done()

        main, child = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "hpcmesh", "debug"], stdin=child,
                                stdout=child, stderr=child, close_fds=True,
                                env=dict(os.environ, PYTHONPATH=os.getcwd()))
        os.close(child)
        try:
            out = read_until(main, "(hpcmesh-pdb) ")
            assert "attached to d[gpus=0] (Debuggee)" in out and f"pid {pm.pids[0]}" in out
            os.write(main, b"p y\n")
            assert "40" in read_until(main, "(hpcmesh-pdb) ")
            os.write(main, b"p x + 1\n")
            assert "21" in read_until(main, "(hpcmesh-pdb) ")
            os.write(main, b"c\n")
            assert "detached; the endpoint continues" in read_until(main, "continues")
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(main)
        assert paused.get(timeout=30) == 41
        assert debug_controller().list() == []
        # a second breakpoint, and end of input (the user's ^D) continues it too
        again = d.slice(gpus=1).step.call_one(1)
        while not debug_controller().list():
            time.sleep(0.05)
        res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug"], input="",
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "detached" in res.stdout, res.stdout + res.stderr
        assert again.get(timeout=30) == 3
    finally:
        pm.stop().get(timeout=30)
        from hpcmesh.admin.server import stop_admin
        stop_admin()


def test_debug_with_nothing_paused_says_so():
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    try:
        res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug", state.admin_url],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "no actor is paused at a breakpoint()" in res.stderr
        res = subprocess.run([sys.executable, "-m", "hpcmesh", "debug", "--list",
                              state.admin_url], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "no actor is paused" in res.stdout
    finally:
        from hpcmesh.admin.server import stop_admin
        stop_admin()
