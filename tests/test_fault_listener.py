"""A listener under an unauthenticated flood (real processes, loopback only).

Nobody needs the job secret to open a TCP connection to a host agent. A flood of idle ones
must neither exhaust its file descriptors for good, nor make it spin or fill its log; once
the flood ends (or its connections time out in the handshake), a client with the secret
attaches as usual.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time

import pytest

from hpcmesh.actor import Actor, attach_to_workers, endpoint


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_agent(tmp_path, secret: bytes, **popen) -> tuple[subprocess.Popen, str]:
    """An ``hpcmesh worker`` on loopback, once it listens: (process, address)."""
    ready = tmp_path / "ready"
    agent = subprocess.Popen(
        [sys.executable, "-m", "hpcmesh", "worker", "--listen", "tcp://127.0.0.1:0",
         "--ready-file", str(ready), "--grace", "60"],
        env=dict(os.environ, HPCMESH_SECRET=secret.hex()), stdout=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            agent.wait()
            raise AssertionError("the agent never wrote its ready file")
        time.sleep(0.05)
    return agent, ready.read_text().split()[0]


def _limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.parametrize("n, fd_limit", [(300, True), (1000, False)])
def test_a_flood_of_idle_connections_neither_spins_nor_floods_the_log(tmp_path, n, fd_limit):
    secret = os.urandom(32)
    err = open(tmp_path / "agent.err", "w+")
    agent, addr = _start_agent(tmp_path, secret, stderr=err,
                               preexec_fn=_limit_fds if fd_limit else None)
    flood: list[socket.socket] = []
    try:
        host, port = addr[len("tcp://"):].rsplit(":", 1)
        for _ in range(n):          # 300: more than the agent has fds for
            s = socket.create_connection((host, int(port)), timeout=5)
            flood.append(s)
        time.sleep(0.5)
        cpu0, lines0 = _cpu_seconds(agent.pid), len(open(err.name).readlines())
        time.sleep(4)
        cpu = _cpu_seconds(agent.pid) - cpu0
        lines = len(open(err.name).readlines()) - lines0
        print(f"\n{n} idle connections{' at a 256-fd limit' if fd_limit else ''}: agent CPU "
              f"{cpu:.2f} s in 4 s, {lines} log lines")
        assert cpu < 0.5, f"the agent spins: {cpu:.2f} s of CPU in 4 s"
        assert lines < 10, open(err.name).read()[-2000:]
        assert agent.poll() is None
        for s in flood:
            s.close()
        flood.clear()
        hosts = attach_to_workers([addr], secret=secret, timeout=30)
        procs = hosts.spawn_procs({"p": 1})
        assert procs.spawn("pid", Pid).pid.call_one().get(timeout=60) > 0
        procs.stop().get(timeout=30)
    finally:
        for s in flood:
            s.close()
        agent.kill()
        agent.wait()
        err.close()


def test_attach_waits_out_an_agent_at_its_handshake_cap(tmp_path):
    # with MAX_UNAUTHENTICATED idle connections in their handshake, the agent closes new
    # ones at once (they see a reset): attach_to_workers takes that as "busy" and tries
    # again within its timeout, instead of failing at once
    import threading

    from hpcmesh.transport.connection import MAX_UNAUTHENTICATED
    secret = os.urandom(32)
    agent, addr = _start_agent(tmp_path, secret, stderr=subprocess.DEVNULL)
    flood: list[socket.socket] = []
    try:
        host, port = addr[len("tcp://"):].rsplit(":", 1)
        for _ in range(MAX_UNAUTHENTICATED + 8):
            flood.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        result: dict = {}

        def attach():
            try:
                result["hosts"] = attach_to_workers([addr], secret=secret, timeout=20)
            except Exception as e:  # noqa: BLE001 - the assertion below shows it
                result["error"] = e
        t = threading.Thread(target=attach)
        t0 = time.monotonic()
        t.start()
        time.sleep(1.5)                      # attach is being turned away meanwhile
        for s in flood:
            s.close()
        flood.clear()
        t.join(25)
        assert "error" not in result, result.get("error")
        assert len(result["hosts"].hostnames) == 1
        assert time.monotonic() - t0 >= 1.5     # it did wait for the flood to end
    finally:
        for s in flood:
            s.close()
        agent.kill()
        agent.wait()
