"""What the log and the errors call a peer: the peer, never this node's own socket.

On a connection a Unix listener accepted, the socket address Python hands back is empty,
and hpcmesh used to name such a peer by the listener's own path: "dropped unauthenticated
connection from unix:///.../ctl.sock", "connection to ... lost: peer unix:///.../ctl.sock
closed the connection". A login node is shared: the log must say who it was (the kernel
tells: SO_PEERCRED, the peer's pid and uid). A malformed message from a peer that did
authenticate was logged as a traceback at ERROR; one line naming the peer says it."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest
from proc_helpers import wait_until

from hpcmesh.runtime.node import Node
from hpcmesh.transport.addresses import new_secret

#: A peer with the secret (a process of the job, as root like the test): it dials, says
#: hello, then does what argv[3] says.
PEER = textwrap.dedent("""
    import asyncio, os, sys
    from hpcmesh.runtime.messages import MSG_CALL
    from hpcmesh.runtime.node import Node
    from hpcmesh.transport import serialization

    async def main():
        node = Node(bytes.fromhex(sys.argv[2]), asyncio.get_running_loop(), role="proc",
                    name="peer")
        node.services["exit"] = lambda: os._exit(0)     # the call is never answered
        conn = await node.connect(sys.argv[1])
        if sys.argv[3] == "malformed":
            conn.send_frame(*serialization.dumps((MSG_CALL, "a call without its fields")))
        while not conn.closed:
            await asyncio.sleep(0.05)
    asyncio.run(main())
""")


@pytest.fixture
def listener():
    """A controller-like node listening on a Unix socket of its own; its path (in a folder
    another user can reach: pytest's tmp_path sits in a 0700 one)."""
    folder = tempfile.mkdtemp(prefix="hpcmesh-peer-names-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "ctl.sock")
    node = Node.start_in_thread(new_secret(), role="client", name="ctl",
                                listen=[f"unix://{path}"])
    hellos: list = []
    node.on_peer_hello.append(lambda n, ref, info, conn: hellos.append(ref))
    node.test_hellos = hellos
    try:
        yield node, path
    finally:
        node.shutdown_thread(5)
        shutil.rmtree(folder, ignore_errors=True)


def _start_peer(node: Node, path: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PEER, f"unix://{path}", node.secret.hex(),
                             mode], env=dict(os.environ))


def test_an_unauthenticated_peer_is_named_by_its_uid_and_pid(listener, other_user, caplog):
    node, path = listener
    os.chmod(path, 0o666)            # reachable by the other user (a real one is 0600)
    caplog.set_level(logging.WARNING, logger="hpcmesh.transport")
    attacker = other_user.popen([
        "/usr/bin/python3", "-c",
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n' * 4); s.recv(100); s.close()", path])
    try:
        lines = wait_until(lambda: [r.getMessage() for r in caplog.records
                                    if "dropped unauthenticated connection" in r.getMessage()],
                           15, "the dropped connection is logged")
    finally:
        attacker.wait(10)
    print(f"\n{lines}")
    assert len(lines) == 1, lines
    who = lines[0].split(" from ", 1)[1].split(" on ", 1)[0]
    assert path not in who and f"uid {other_user.uid}" in who and \
        f"pid {attacker.pid}" in who, lines[0]

    # over TCP, the peer's address and port
    tcp = Node.start_in_thread(node.secret, role="client", name="tcp",
                               listen=["tcp://127.0.0.1:0"])
    try:
        host, port = tcp.addresses[0].removeprefix("tcp://").rsplit(":", 1)
        r = other_user.python(
            "import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); "
            "print(s.getsockname()[1]); s.sendall(b'garbage' * 10); s.recv(100)", host, port)
        theirs = f"127.0.0.1:{r.stdout.strip()}"
        lines = wait_until(lambda: [r.getMessage() for r in caplog.records
                                    if "dropped unauthenticated connection" in r.getMessage()
                                    and tcp.addresses[0] in r.getMessage()],
                           15, "the dropped TCP connection is logged")
        assert len(lines) == 1 and f" from {theirs} on " in lines[0], lines
    finally:
        tcp.shutdown_thread(5)


def test_a_lost_connection_names_the_peer_not_our_own_socket(listener):
    node, path = listener
    peer = _start_peer(node, path, "exit")
    try:
        wait_until(lambda: node.test_hellos, 15, "the peer says hello")
        ref = node.test_hellos[0]
        pending = node.rpc(ref, "exit")
        with pytest.raises(Exception) as ei:
            pending.get(timeout=15)
    finally:
        peer.wait(10)
    text = str(ei.value)
    print(f"\n{type(ei.value).__name__}: {text}")
    assert "lost" in text and path not in text, text
    assert f"pid {peer.pid}" in text and f"uid {os.getuid()}" in text, text


def test_a_malformed_message_from_an_authenticated_peer_is_one_line(listener, caplog):
    node, path = listener
    caplog.set_level(logging.DEBUG, logger="hpcmesh")
    peer = _start_peer(node, path, "malformed")
    try:
        # the connection is closed (SPEC §7: a malformed frame closes that connection
        # only): the peer sees it and exits
        assert peer.wait(15) == 0
    finally:
        if peer.poll() is None:
            peer.kill()
    about = [r for r in caplog.records if r.levelno >= logging.WARNING and
             "malformed" in r.getMessage()]
    for r in caplog.records:
        print(f"{r.levelname} {r.name}: {r.getMessage()}")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert len(about) == 1, caplog.text
    line = about[0].getMessage()
    assert path not in line and f"pid {peer.pid}" in line, line
    assert socket.gethostname() in line
