"""The worker address forms Monarch programs use: ipc://, DIAL@BIND, a proc-id prefix, and
tcp://host:fdN (a listening socket handed down by a launcher). Real agents, real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from hpcmesh.actor import Actor, attach_to_workers, endpoint
from hpcmesh.transport.addresses import (Address, parse_address, parse_bind_address,
                                         parse_worker_address, split_alias)


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_forms_parse_to_what_is_dialled_and_what_is_bound():
    assert parse_address("ipc:///tmp/w.sock") == Address("unix", path="/tmp/w.sock")
    alias = "tcp://node7:4444@tcp://0.0.0.0:4444"
    assert split_alias(alias) == ("tcp://node7:4444", "tcp://0.0.0.0:4444")
    assert parse_address(alias) == Address("tcp", host="node7", port=4444)
    assert parse_bind_address(alias) == Address("tcp", host="0.0.0.0", port=4444)
    for prefixed in ("service@tcp://w:4444", "service<2MuAHeDjLCEd>@tcp://w:4444"):
        assert parse_address(prefixed) == Address("tcp", host="w", port=4444)
    assert parse_bind_address("service<x>@tcp://w:1@tcp://0.0.0.0:1").host == "0.0.0.0"
    assert parse_bind_address("tcp://127.0.0.1:fd7") == Address("tcp", "127.0.0.1", 0, "", 7)
    assert parse_bind_address("tcp://*:4444") == Address("tcp", host="0.0.0.0", port=4444)
    with pytest.raises(ValueError, match=r"joined by '@'.*ipc:///path"):
        parse_address("tcp://a:1tcp://b:2")
    with pytest.raises(ValueError, match=r"scheme must be tcp://, unix:// or ipc://"):
        parse_address("zmq://a:1")


def test_a_worker_address_takes_every_form_that_can_be_dialled():
    assert parse_worker_address("tcp://[::1]:5") == Address("tcp", host="::1", port=5)
    assert parse_worker_address("unix:///tmp/x") == Address("unix", path="/tmp/x")
    assert parse_worker_address("ipc:///tmp/x") == Address("unix", path="/tmp/x")
    # DIAL@BIND dials DIAL; BIND may be what only a listener means (0, *, fdN)
    for alias in ("tcp://node7:4444@tcp://0.0.0.0:0", "tcp://n:1@tcp://*:1",
                  "service<x>@tcp://n:1@tcp://127.0.0.1:fd3"):
        assert parse_worker_address(alias).scheme == "tcp"
    assert parse_worker_address("service@tcp://w:4444") == Address("tcp", host="w", port=4444)


@pytest.mark.parametrize("addr, fragment", [
    ("10.0.0.5:26600", "is not a URL; expected tcp://host:port (port 1-65535), unix:///absolute"
                       "/path or ipc:///absolute/path; Monarch's DIAL@BIND and service@ prefix "
                       "are taken too (did you mean 'tcp://10.0.0.5:26600'?)"),
    ("http://10.0.0.5:80", ": unknown scheme 'http'; allowed: tcp, unix, ipc (did you mean 'tcp'?)"),
    ("tcp://10.0.0.5", " has no port"),
    ("tcp://10.0.0.5:0", ": port 0 out of range 1-65535"),
    ("tcp://10.0.0.5:70000", ": bad port '70000'; port must be 1-65535"),
    ("tcp://10.0.0.5:http", ": bad port 'http'"),
    ("tcp://10.0.0.5:fd3", ": bad port 'fd3'"),
    ("tcp://*:26600", ": bad host name '*'"),
    ("tcp://:26600", " has no host"),
    ("tcp://a_b c:1", ": bad host name 'a_b c'"),
    ("tcp://10.0.0.5:1/x", ": unexpected path '/x'"),
    ("tcp://10.0.0.5:1?x", ": unexpected '?' or '#' part"),
    ("tcp://u@h:1", ": user names are not allowed"),
    ("unix://relative.sock", ": unix addresses need an absolute path (three slashes"),
    ("ipc://tmp/w.sock", ": ipc addresses need an absolute path (three slashes: ipc:///path)"),
    ("tcp://[fd00::zz]:1", ": bad IPv6 address"),
    ("tcp://a:0@tcp://0.0.0.0:0", " (the address to dial, 'tcp://a:0'): port 0 out of range"),
    ("tcp://a:1@zmq://b:1", "the scheme must be tcp://, unix:// or ipc://"),
])
def test_a_worker_address_that_cannot_be_dialled_says_why(addr, fragment):
    with pytest.raises(ValueError) as err:
        parse_worker_address(addr)
    assert str(err.value).startswith("bad address" if "zmq" in addr else f"worker {addr!r}")
    assert fragment in str(err.value), str(err.value)


def _worker(tmp_path, listen: str, secret: bytes, **popen) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / "ready"
    agent = subprocess.Popen([sys.executable, "-m", "hpcmesh", "worker", "--listen", listen,
                              "--ready-file", str(ready), "--grace", "30"],
                             env=dict(os.environ, HPCMESH_SECRET=secret.hex()),
                             stdout=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            raise AssertionError(f"the worker on {listen} never wrote its ready file")
        time.sleep(0.05)
    return agent, ready.read_text().split()[0]


def _use(addr: str, secret: bytes) -> int:
    procs = attach_to_workers([addr], secret=secret, timeout=30).spawn_procs()
    try:
        return procs.spawn("pid", Pid).pid.call_one().get(timeout=60)
    finally:
        procs.stop().get(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("form", ["ipc", "alias", "fd"])
def test_a_worker_serves_on_each_form(tmp_path, form):
    secret = os.urandom(32)
    popen, listener = {}, None
    if form == "ipc":
        listen = f"ipc://{tmp_path}/w.sock"
    elif form == "alias":
        port = _free_port()
        listen = f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        fd = listener.fileno()
        listen = f"tcp://127.0.0.1:fd{fd}"
        popen = {"pass_fds": (fd,)}
    agent, told = _worker(tmp_path, listen, secret, **popen)
    try:
        if form == "ipc":
            assert told == f"unix://{tmp_path}/w.sock"
        elif form == "alias":
            assert told == f"tcp://127.0.0.1:{port}"        # the DIAL side is advertised
        else:
            assert told == f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        assert _use(listen if form != "fd" else told, secret) > 0
    finally:
        agent.terminate()
        agent.wait(30)
        if listener is not None:
            listener.close()


def test_a_worker_refuses_an_fd_that_is_not_a_listening_socket(tmp_path):
    r, w = os.pipe()
    try:
        p = subprocess.run([sys.executable, "-m", "hpcmesh", "worker", "--listen",
                            f"tcp://127.0.0.1:fd{r}", "--grace", "1"], pass_fds=(r,),
                           env=dict(os.environ, HPCMESH_SECRET="ab" * 16),
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(r)
        os.close(w)
    assert p.returncode != 0
    assert f"fd {r} is not" in p.stderr, p.stderr


# -- issue 32 item 6: Monarch's ca="trust_all_connections" workers, attach that waits ----------
OPEN_WORKER = ("import sys\n"
               "from hpcmesh.actor import run_worker_loop_forever\n"
               "run_worker_loop_forever(address=sys.argv[1], ca='trust_all_connections',\n"
               "                        grace=30)\n")


@pytest.fixture
def keep_tls():
    """attach_to_workers(ca=...) turns TLS on for this client (and its environment) from
    then on: put back what the other tests of this process run with."""
    from hpcmesh.runtime.client import client_runtime
    node = client_runtime().node
    saved, saved_env = node.tls, os.environ.get("HPCMESH_TLS_CA")
    yield
    node.use_tls(saved)
    if saved_env is None:
        os.environ.pop("HPCMESH_TLS_CA", None)
    else:
        os.environ["HPCMESH_TLS_CA"] = saved_env


def _no_secret_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPCMESH_SECRET", "HPCMESH_SECRET_FILE", "HPCMESH_TLS_CA")}
    env.update(extra)
    return env


def test_a_worker_without_a_secret_needs_the_explicit_trust_all_opt_in(tmp_path):
    """No secret and no ca: refused, naming the opt-in; HPCMESH_TLS_CA=trust_all_connections
    in the environment is not that opt-in (only the argument is)."""
    code = ("from hpcmesh.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(address='ipc://{tmp_path}/w.sock')\n")
    for env in (_no_secret_env(), _no_secret_env(HPCMESH_TLS_CA="trust_all_connections")):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "needs the job secret" in r.stderr, r.stderr
        assert "ca='trust_all_connections' without a secret accepts any client" in r.stderr


def test_attach_waits_for_a_trust_all_worker_that_starts_later(tmp_path, keep_tls):
    sock = f"ipc://{tmp_path}/late.sock"
    agent = None
    try:
        def start_later() -> None:
            nonlocal agent
            agent = subprocess.Popen([sys.executable, "-c", OPEN_WORKER, sock],
                                     env=_no_secret_env(), stderr=subprocess.PIPE)
        import threading
        threading.Timer(0.5, start_later).start()
        hosts = attach_to_workers([sock], ca="trust_all_connections", timeout=60)
        procs = hosts.spawn_procs()
        try:
            assert procs.spawn("pid", Pid).pid.call_one().get(timeout=60) > 0
        finally:
            procs.stop().get(timeout=30)
        # the job secret stays the default: a client with one is refused by this worker
        with pytest.raises(ConnectionError, match="this job's secret"):
            attach_to_workers([sock], secret=os.urandom(32), timeout=10)
    finally:
        if agent is not None:
            agent.terminate()
            err = agent.communicate(timeout=30)[1].decode()
            assert "any client that can reach this address may run code here" in err


def test_attach_to_a_worker_that_never_comes_fails_as_monarch(tmp_path, keep_tls):
    from hpcmesh.actor.host_mesh import AttachFailed
    start = time.monotonic()
    for addr in (f"ipc://{tmp_path}/never.sock", f"tcp://127.0.0.1:{_free_port()}"):
        with pytest.raises(AttachFailed, match=r"^attach failed: cannot attach to host agent "
                                               r"at .*: no worker listening there within 1 s"):
            attach_to_workers([addr], ca="trust_all_connections", timeout=1)
    assert time.monotonic() - start < 20
    assert issubclass(AttachFailed, RuntimeError) and issubclass(AttachFailed, ConnectionError)
    # a reconnect to agents that were running tries their next address at once
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="No such file or directory") as failed:
        attach_to_workers([f"ipc://{tmp_path}/gone.sock"], timeout=30, wait=False)
    assert not isinstance(failed.value, AttachFailed) and time.monotonic() - start < 10


def test_a_worker_with_a_secret_refuses_a_trust_all_client_without_it(tmp_path, keep_tls):
    secret = os.urandom(32)
    agent, told = _worker(tmp_path, f"ipc://{tmp_path}/w.sock", secret)
    try:
        with pytest.raises(ConnectionError, match="ca='trust_all_connections' and none"):
            attach_to_workers([told], ca="trust_all_connections", timeout=10)
        assert _use(told, secret) > 0
    finally:
        agent.terminate()
        agent.wait(30)
