"""Authentication and robustness of real listeners (controller, worker process, host agent).

Every connection must pass the HMAC handshake before any byte is unpickled; a
bad peer (wrong secret, garbage, truncated or oversized frames) loses only its
own connection and the listener keeps serving good peers.
"""

import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import time

import pytest

from hpcmesh.actor import Actor, attach_to_workers, endpoint, this_host
from hpcmesh.runtime.client import client_runtime
from hpcmesh.transport.addresses import new_secret, parse_address
from hpcmesh.transport.framing import encode_frame
from hpcmesh.transport.handshake import MAGIC, Handshake


class Echo(Actor):
    @endpoint
    def echo(self, v):
        return v

    @endpoint
    def pid(self):
        return os.getpid()


class _MakesFile:
    """Unpickling this creates a file: proof that a payload was (or was not) unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def _connect(url: str) -> socket.socket:
    a = parse_address(url)
    if a.scheme == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(a.path)
    else:
        s = socket.create_connection((a.host, a.port))
    s.settimeout(10)
    return s


def _authenticated(url: str, secret: bytes) -> socket.socket:
    """A raw socket that passed the handshake as a dialer."""
    s = _connect(url)
    hs = Handshake(secret, dialer=True)
    s.sendall(hs.initial())
    while not hs.done:
        data = s.recv(4096)
        assert data, "listener closed during the handshake"
        reply, _ = hs.receive(data)
        if reply:
            s.sendall(reply)
    return s


def _read_until_closed(s: socket.socket, timeout: float = 10.0) -> bool:
    """True once the peer closes the connection (EOF or reset) within ``timeout``."""
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def _frame(obj) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(pickle.dumps(obj, protocol=5), []))


@pytest.fixture(scope="module")
def echo():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    e = pm.spawn("echo", Echo)
    assert e.echo.call_one(1).get(timeout=30) == 1
    yield pm, e
    pm.stop().get(timeout=30)


def _controller_urls():
    return list(client_runtime().node.addresses)


def test_wrong_secret_is_dropped_and_logged_by_the_controller(echo, caplog):
    _, e = echo
    caplog.set_level(logging.WARNING, logger="hpcmesh.transport")
    for url in _controller_urls():
        s = _connect(url)
        hs = Handshake(new_secret(), dialer=True)
        s.sendall(hs.initial())
        s.recv(4096)                      # the listener's challenge
        s.sendall(os.urandom(32))         # an answer made without the job secret
        assert _read_until_closed(s), f"{url} kept a peer that failed authentication"
        s.close()
    deadline = time.monotonic() + 5
    while "dialer failed authentication" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "dropped unauthenticated connection" in caplog.text
    assert "dialer failed authentication" in caplog.text
    assert e.echo.call_one("still here").get(timeout=10) == "still here"


@pytest.mark.parametrize("payload", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    os.urandom(200),
    b"\xff" * 4096,
])
def test_garbage_instead_of_handshake_closes_only_that_connection(echo, payload):
    _, e = echo
    url = _controller_urls()[-1]
    s = _connect(url)
    s.sendall(payload)
    assert _read_until_closed(s)
    s.close()
    assert e.echo.call_one(3).get(timeout=10) == 3


def test_nothing_is_unpickled_before_the_handshake(echo, tmp_path):
    _, e = echo
    bomb = _frame(_MakesFile(str(tmp_path / "pwned-1")))
    # 1. the payload sent in place of the handshake
    s = _connect(_controller_urls()[0])
    s.sendall(bomb)
    assert _read_until_closed(s)
    s.close()
    # 2. a peer that sends a valid hello (magic + nonce) and then the payload as its answer
    s = _connect(_controller_urls()[-1])
    s.sendall(MAGIC + os.urandom(32))
    s.recv(4096)
    s.sendall(_frame(_MakesFile(str(tmp_path / "pwned-2"))) + bomb)
    assert _read_until_closed(s)
    s.close()
    assert not (tmp_path / "pwned-1").exists() and not (tmp_path / "pwned-2").exists()
    # Control: the very same bytes from an authenticated peer *are* unpickled, by the time
    # its connection is closed (as above, with no wait), so the check above would have
    # caught an unpickle before authentication. The bad message (not a protocol tuple) then
    # closes that connection only.
    s = _authenticated(_controller_urls()[-1], client_runtime().secret)
    s.sendall(_frame(_MakesFile(str(tmp_path / "control"))))
    assert _read_until_closed(s)
    s.close()
    assert (tmp_path / "control").exists()
    assert e.echo.call_one(4).get(timeout=10) == 4


def test_authenticated_peer_sending_bad_frames_loses_only_its_connection(echo):
    pm, e = echo
    secret = client_runtime().secret
    url = _controller_urls()[-1]
    # oversized frame header: a 2 GiB metadata claim
    s = _authenticated(url, secret)
    s.sendall(struct.pack("!IHH", 2**31, 0, 1))
    assert _read_until_closed(s)
    s.close()
    # oversized buffers: 2**62 bytes claimed in one out-of-band buffer
    s = _authenticated(url, secret)
    s.sendall(struct.pack("!IHHQ", 4, 1, 1, 2**62))
    assert _read_until_closed(s)
    s.close()
    # a frame whose metadata is not a pickle at all
    s = _authenticated(url, secret)
    s.sendall(b"".join(bytes(p) for p in encode_frame(b"\x00not a pickle", [])))
    assert _read_until_closed(s)
    s.close()
    # batch frames that lie: zero messages, a batch with buffers, a count that does not match
    for head in (struct.pack("!IHH", 4, 0, 0), struct.pack("!IHHQ", 4, 1, 3, 8)):
        s = _authenticated(url, secret)
        s.sendall(head + b"x" * 12)
        assert _read_until_closed(s)
        s.close()
    body = pickle.dumps([pickle.dumps((2, 1, None), protocol=5)] * 2, protocol=5)
    s = _authenticated(url, secret)
    s.sendall(struct.pack("!IHH", len(body), 0, 5) + body)
    assert _read_until_closed(s)
    s.close()
    # a truncated frame, then close
    s = _authenticated(url, secret)
    s.sendall(struct.pack("!IHH", 100, 0, 1) + b"x" * 10)
    s.close()
    # the worker process's own listener behaves the same
    proc_url = next(iter(client_runtime().procs[pm.records[0].name].node.addresses))
    s = _authenticated(proc_url, secret)
    s.sendall(struct.pack("!IHH", 2**31, 0, 1))
    assert _read_until_closed(s)
    s.close()
    s = _connect(proc_url)
    s.sendall(b"garbage" * 10)
    assert _read_until_closed(s)
    s.close()
    assert e.echo.call_one(5).get(timeout=10) == 5
    assert e.echo.call_one(b"x" * 200_000).get(timeout=10) == b"x" * 200_000


def test_worker_process_drops_wrong_secret_and_logs_it(echo):
    pm, e = echo
    rec = client_runtime().procs[pm.records[0].name]
    for url in rec.node.addresses:
        s = _connect(url)
        hs = Handshake(new_secret(), dialer=True)
        s.sendall(hs.initial())
        s.recv(4096)
        s.sendall(os.urandom(32))
        assert _read_until_closed(s)
        s.close()
    assert e.echo.call_one(6).get(timeout=10) == 6
    deadline = time.monotonic() + 5
    text = ""
    while time.monotonic() < deadline:
        with open(pm.log_paths[0]["stderr"]) as f:
            text = f.read()
        if text.count("dropped unauthenticated connection") >= 2:
            break
        time.sleep(0.1)
    assert text.count("dropped unauthenticated connection") >= 2, text


def _start_agent(tmp_path, secret: bytes, grace: float = 30):
    ready = tmp_path / "agent.addr"
    env = dict(os.environ, HPCMESH_SECRET=secret.hex(), HPCMESH_LOG_DIR=str(tmp_path / "logs"))
    code = ("import sys; from hpcmesh.runtime.process.worker import run_worker_loop_forever; "
            f"run_worker_loop_forever('tcp://127.0.0.1:0', grace={grace}, "
            f"ready_file={str(ready)!r})")
    errf = open(tmp_path / "agent.err", "wb")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                         stderr=errf)
    deadline = time.monotonic() + 20
    while not (ready.exists() and ready.read_text().strip()):
        assert p.poll() is None, (tmp_path / "agent.err").read_text()
        assert time.monotonic() < deadline, "agent did not start"
        time.sleep(0.05)
    return p, ready.read_text().split()[0]


def test_host_agent_drops_bad_peers_and_keeps_serving(tmp_path):
    secret = new_secret()
    agent, url = _start_agent(tmp_path, secret)
    try:
        # a peer with the wrong secret
        s = _connect(url)
        hs = Handshake(new_secret(), dialer=True)
        s.sendall(hs.initial())
        s.recv(4096)
        s.sendall(os.urandom(32))
        assert _read_until_closed(s)
        s.close()
        # garbage, and a pickle payload in place of the handshake
        s = _connect(url)
        s.sendall(_frame(_MakesFile(str(tmp_path / "pwned"))))
        assert _read_until_closed(s)
        s.close()
        # an authenticated peer sending an oversized frame
        s = _authenticated(url, secret)
        s.sendall(struct.pack("!IHH", 2**31, 0, 1))
        assert _read_until_closed(s)
        s.close()
        # a client holding the wrong secret cannot attach ...
        with pytest.raises(Exception, match="authentication"):
            attach_to_workers([url], secret=new_secret(), timeout=5)
        # ... and a good one still can, and can start processes there
        hosts = attach_to_workers([url], secret=secret, timeout=10)
        pm = hosts.spawn_procs(per_host={"gpus": 1})
        e = pm.spawn("e", Echo)
        assert e.echo.call_one(7).get(timeout=30) == 7
        pm.stop().get(timeout=30)
        assert agent.poll() is None
        assert not (tmp_path / "pwned").exists()
        err = (tmp_path / "agent.err").read_text()
        assert err.count("dropped unauthenticated connection") >= 2, err
    finally:
        agent.kill()
        agent.wait()


def test_malformed_hello_from_authenticated_peer_closes_only_it(echo):
    _, e = echo
    url = _controller_urls()[-1]
    for bad in [(0,), (0, 123, (), {}), (0, "id", (), "not a dict"), "not a tuple", ()]:
        s = _authenticated(url, client_runtime().secret)
        s.sendall(_frame(bad))
        assert _read_until_closed(s), bad
        s.close()
    assert e.echo.call_one(8).get(timeout=10) == 8
