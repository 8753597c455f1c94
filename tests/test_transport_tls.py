"""TLS for TCP connections (SPEC §7): the sans-I/O session, settings errors, and real
agents with ``--ca`` (trust_all_connections and a CA bundle).

The end-to-end cases run their client in a subprocess: turning TLS on is for the
whole client runtime, which the rest of the suite shares."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from ci_gate import requires

from hpcmesh.transport import tls

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Outside CI a machine without the openssl command skips these; in CI they run (and fail
# if it is missing: tests/cluster/up.sh installs it).
needs_openssl = requires(
    None if shutil.which("openssl") else
    "the openssl command makes the test certificates (apt-get install openssl)")


# ------------------------------------------------------------------------------------------
# pure parts
# ------------------------------------------------------------------------------------------
@needs_openssl
def test_sessions_handshake_and_carry_data_in_memory():
    s = tls.TLSSettings(tls.TRUST_ALL)
    client = tls.TLSSession(tls.client_context(s), server_side=False)
    server = tls.TLSSession(tls.server_context(s), server_side=True)
    to_server, done_c, done_s = b"", False, False
    for _ in range(10):
        done_c, out = client.handshake_step(to_server if not done_c else b"")
        done_s, to_client = server.handshake_step(out)
        if to_client:
            done_c, to_server = client.handshake_step(to_client)
            if to_server:
                done_s, _ = server.handshake_step(to_server)
        if done_c and done_s:
            break
    assert done_c and done_s
    wire = client.encrypt([b"hello ", memoryview(b"world")])
    assert b"hello" not in wire                      # encrypted on the wire
    buf = bytearray(64)
    n = server.decrypt_into(wire, memoryview(buf))
    assert bytes(buf[:n]) == b"hello world"
    big = os.urandom(300_000)                         # several TLS records
    wire = client.encrypt([b"head", big])
    got, data = bytearray(), wire
    while n := server.decrypt_into(data, memoryview(buf := bytearray(70_000))):
        got += buf[:n]
        data = b""
    assert bytes(got) == b"head" + big


def test_settings_name_what_is_wrong(tmp_path):
    assert tls.settings(None, env={}) is None
    assert tls.settings(None, env={tls.ENV_CA: tls.TRUST_ALL}).trust_all
    with pytest.raises(tls.TLSConfigError, match=r"no-such.pem.*no such file.*CA bundle"):
        tls.settings(str(tmp_path / "no-such.pem"), env={})
    with pytest.raises(tls.TLSConfigError, match=r"expected a path to a CA bundle"):
        tls.settings(42, env={})
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    s = tls.settings(str(ca), env={})
    assert s.cert == str(tmp_path / "hpcmesh.pem") and s.key == str(tmp_path / "hpcmesh.key")
    with pytest.raises(tls.TLSConfigError, match=r"no certificate at .*hpcmesh.pem.*"
                                                 r"HPCMESH_TLS_CERT"):
        tls.server_context(s)
    with pytest.raises(tls.TLSConfigError, match=r"cannot load the CA bundle"):
        tls.client_context(s)


# ------------------------------------------------------------------------------------------
# real agents
# ------------------------------------------------------------------------------------------
def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _make_ca(d, name: str) -> tuple[str, str]:
    key, crt = str(d / f"{name}.key"), str(d / f"{name}.pem")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", key, "-out", crt)
    return crt, key


def _make_cert(d, ca: tuple[str, str], name: str) -> tuple[str, str]:
    key, csr, crt = str(d / f"{name}.key"), str(d / f"{name}.csr"), str(d / f"{name}.pem")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", key, "-out", csr)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-days", "2", "-out", crt)
    return crt, key


class _Agent:
    def __init__(self, tmp_path, ca: str, env_extra: dict | None = None):
        self.secret = os.urandom(32).hex()
        ready = tmp_path / f"ready-{time.monotonic_ns()}"
        env = dict(os.environ, HPCMESH_SECRET=self.secret, HPCMESH_LEASE_GRACE="5",
                   PYTHONPATH=ROOT, **(env_extra or {}))
        env.pop(tls.ENV_CA, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpcmesh", "worker", "--listen", "tcp://127.0.0.1:0",
             "--ca", ca, "--ready-file", str(ready), "--initial-wait", "60"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent did not start: {self.output()}")
            time.sleep(0.05)
        self.url = next(a for a in ready.read_text().split() if a.startswith("tcp://"))

    def output(self) -> str:
        self.stop()
        return self.proc.stdout.read() if self.proc.stdout else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _client(url: str, secret: str, ca, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        from hpcmesh.actor import Actor, endpoint, attach_to_workers

        class Echo(Actor):
            @endpoint
            async def echo(self, x):
                return x

        hosts = attach_to_workers([{url!r}], secret=bytes.fromhex({secret!r}), ca={ca!r},
                                  timeout=20)
        procs = hosts.spawn_procs(per_host={{"gpus": 2}})
        echo = procs.spawn("echo", Echo)
        print("ECHO", echo.echo.call(b"x" * 200_000).get(timeout=30).values()[0] == b"x" * 200_000,
              echo.echo.call(7).get(timeout=30).values(), flush=True)
        procs.stop().get(timeout=30)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, **(env_extra or {}))
    env.pop(tls.ENV_CA, None)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)


def _speaks_tls(url: str) -> bool:
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                return s.version() is not None
        except (ssl.SSLError, OSError):
            return False


@needs_openssl
def test_trust_all_connections_end_to_end(tmp_path):
    import glob
    import tempfile
    leftovers = os.path.join(tempfile.gettempdir(), "hpcmesh-tls-*")
    before = set(glob.glob(leftovers))
    agent = _Agent(tmp_path, tls.TRUST_ALL)
    try:
        assert _speaks_tls(agent.url)
        r = _client(agent.url, agent.secret, tls.TRUST_ALL)
        assert r.returncode == 0 and "ECHO True [7, 7]" in r.stdout, r.stdout + r.stderr
        # a client without TLS is refused with a reason on both sides, and the agent lives on
        r = _client(agent.url, agent.secret, None)
        assert r.returncode != 0
        assert "cannot attach to host agent" in r.stderr, r.stderr
        assert "give this end the same ca= / HPCMESH_TLS_CA" in r.stderr, r.stderr
        r = _client(agent.url, agent.secret, tls.TRUST_ALL)
        assert "ECHO True" in r.stdout, r.stdout + r.stderr
    finally:
        out = agent.output()
    assert "did not start TLS, which this node requires" in out, out
    # every process made its throwaway key pair, and none is left on disk
    assert set(glob.glob(leftovers)) <= before, set(glob.glob(leftovers)) - before


@needs_openssl
def test_ca_bundle_end_to_end_and_an_untrusted_agent(tmp_path):
    ca = _make_ca(tmp_path, "jobca")
    cert, key = _make_cert(tmp_path, ca, "agent")
    agent = _Agent(tmp_path, ca[0], {tls.ENV_CERT: cert, tls.ENV_KEY: key})
    try:
        r = _client(agent.url, agent.secret, ca[0], {tls.ENV_CERT: cert, tls.ENV_KEY: key})
        assert r.returncode == 0 and "ECHO True [7, 7]" in r.stdout, r.stdout + r.stderr
        other = tmp_path / "other"
        other.mkdir()
        other_ca = _make_ca(other, "otherca")
        ocert, okey = _make_cert(other, other_ca, "client")
        r = _client(agent.url, agent.secret, other_ca[0], {tls.ENV_CERT: ocert,
                                                           tls.ENV_KEY: okey})
        assert r.returncode != 0
        assert "not trusted by the CA bundle" in r.stderr, r.stderr
    finally:
        agent.stop()


@pytest.mark.parametrize("given", ["option", "environment"])
def test_worker_cli_names_a_bad_ca(tmp_path, given):
    """From --ca or from HPCMESH_TLS_CA (its default): a usage error, exit status 2."""
    missing = str(tmp_path / "missing.pem")
    env = dict(os.environ, HPCMESH_SECRET="ab" * 32, PYTHONPATH=ROOT)
    argv = [sys.executable, "-m", "hpcmesh", "worker"]
    if given == "option":
        argv += ["--ca", missing]
    else:
        env[tls.ENV_CA] = missing
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"--ca/{tls.ENV_CA}" in r.stderr and "missing.pem" in r.stderr, r.stderr
    assert "no such file" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_worker_cli_names_a_missing_certificate(tmp_path):
    """A CA bundle without this host's certificate beside it: said before the agent starts."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked before the certificate\n")
    r = subprocess.run([sys.executable, "-m", "hpcmesh", "worker", "--ca", str(ca)],
                       env=dict(os.environ, HPCMESH_SECRET="ab" * 32, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "no certificate at" in r.stderr and tls.ENV_CERT in r.stderr, r.stderr


@needs_openssl
def test_big_and_many_messages_over_tls_between_two_nodes():
    # The socket fills and drains many times: partial writes of ciphertext, records split
    # across reads, out-of-band buffers encrypted in place of sendmsg.
    from hpcmesh.runtime.node import MSG_DELIVER, Node
    secret = os.urandom(32)
    s = tls.TLSSettings(tls.TRUST_ALL)
    a = Node.start_in_thread(secret, role="test", name="a", listen=["tcp://127.0.0.1:0"])
    b = Node.start_in_thread(secret, role="test", name="b", listen=["tcp://127.0.0.1:0"])
    try:
        for n in (a, b):
            n.use_tls(s)
        got, done = [], threading.Event()

        def deliver(value):
            got.append(value)
            if len(got) == 202:
                done.set()
        port = b.open_port(deliver)
        big = os.urandom(24 * 1024 * 1024)
        a.send(port.node, (MSG_DELIVER, port.port_id, "first"))
        for i in range(100):
            a.send(port.node, (MSG_DELIVER, port.port_id, i))
        a.send(port.node, (MSG_DELIVER, port.port_id, big))
        for i in range(100, 200):
            a.send(port.node, (MSG_DELIVER, port.port_id, i))
        assert done.wait(60), len(got)
        assert got[0] == "first" and got[1:101] == list(range(100))
        assert got[101] == big and got[102:] == list(range(100, 200))
        conn = a.peers.get(b.node_id).conn
        assert conn.encrypted                  # it really went through TLS
    finally:
        a.shutdown_thread()
        b.shutdown_thread()
