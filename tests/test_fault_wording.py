"""What a user reads when a connection to an actor's process is lost (real processes).

Before, the error named the connection's socket address (on an accepted connection the
controller's own socket) and no pid: "connection to procs0-... (unix:///tmp/...) lost"."""

from __future__ import annotations

import os
import time

import pytest
from proc_helpers import wait_until

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host
from hpcmesh.runtime.client import client_runtime


class Waiter(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def wait(self) -> None:
        import asyncio
        await asyncio.sleep(60)     # sleep: a call that stays pending until the test cuts it


def test_a_lost_connection_names_the_process_its_host_and_pid():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("waiter", Waiter)
        pid = mesh.pid.call_one().get(timeout=30)
        pending = mesh.wait.call_one()
        node = client_runtime().node
        node_id = procs.records[0].node.node_id
        wait_until(lambda: node.load(node_id) == 1, 10, "the call is out, awaiting its reply")
        peer = node.peers.get(node_id)
        node.call_soon(peer.conn.close, ConnectionResetError("cut"))   # a network cut
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=10)
        text = str(ei.value)
        assert f"pid {pid})" in text and "lost: cut" in text, text
        assert "unix://" not in text and procs.records[0].name in text
    finally:
        procs.stop().get(timeout=30)


def test_a_dial_closed_mid_handshake_is_not_reported_as_a_bad_secret(caplog):
    # connect_first tries a node's addresses in parallel and closes the losers, often in
    # their handshake: the listener used to log each as "dropped unauthenticated connection
    # ... check the job secret" (under actor-to-actor load, many of them)
    import logging
    import socket

    from hpcmesh.transport.addresses import new_secret, parse_address
    from hpcmesh.transport.handshake import Handshake

    caplog.set_level(logging.DEBUG, logger="hpcmesh.transport")
    node = client_runtime().node
    for url in node.addresses:
        a = parse_address(url)
        s = socket.socket(socket.AF_UNIX) if a.scheme == "unix" else socket.socket()
        s.connect(a.path if a.scheme == "unix" else (a.host, a.port))
        s.sendall(Handshake(new_secret(), dialer=True).initial())
        s.recv(4096)                       # the listener's challenge, then the dialer gives up
        s.close()
    deadline = time.monotonic() + 5
    while caplog.text.count("closed during the handshake") < len(node.addresses) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert caplog.text.count("closed during the handshake") == len(node.addresses)
    assert "dropped unauthenticated connection" not in caplog.text
    assert "check the job secret" not in caplog.text


def test_a_dial_reset_mid_handshake_is_not_reported_as_a_dropped_connection(caplog):
    # a losing dial closed with the listener's answer still unread reaches the listener as
    # a reset, not an end of file: at 512 processes spawning, a screenful of warnings
    import logging
    import socket
    import struct

    from hpcmesh.transport.addresses import new_secret, parse_address
    from hpcmesh.transport.handshake import Handshake

    caplog.set_level(logging.DEBUG, logger="hpcmesh.transport")
    node = client_runtime().node
    tcp = [u for u in node.addresses if parse_address(u).scheme == "tcp"]
    for url in tcp:
        a = parse_address(url)
        s = socket.create_connection((a.host, a.port))
        s.sendall(Handshake(new_secret(), dialer=True).initial())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:      # the challenge is in, unread
            if s.recv(1, socket.MSG_PEEK):
                break
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()                               # RST
    deadline = time.monotonic() + 5
    while caplog.text.count("closed during the handshake") < len(tcp) and \
            time.monotonic() < deadline:
        time.sleep(0.05)    # sleep: polling the listener's log on its own thread
    assert tcp and caplog.text.count("closed during the handshake") == len(tcp), caplog.text
    assert "dropped unauthenticated connection" not in caplog.text
