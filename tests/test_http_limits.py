"""The controller's HTTP services (admin view, telemetry, dashboard) under a flood from
another user of the login node, and their answers to requests that break a handler.

The attacker is a second local account (``other_user``): it cannot authenticate, but it can
open connections to any port on loopback. The servers must bound what that costs the
controller (threads, file descriptors), cut a request head that dribbles in, and keep
answering the token's holder, and the job's own work must go on meanwhile.
"""

import json
import os
import queue
import resource
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from other_user import SYSTEM_PYTHON
from proc_helpers import wait_until

from hpcmesh.actor import Actor, endpoint
from hpcmesh.admin.server import admin_endpoint
from hpcmesh.job import LocalJob
from hpcmesh.token_http import TokenHandler, TokenServer

#: What the servers promise (with defaults for an older server, so that this test runs,
#: and fails, on it).
ARRIVING = getattr(TokenServer, "max_arriving", 64)
HEAD_TIMEOUT_S = getattr(TokenServer, "head_timeout", 5.0)
MAX_HEAD = getattr(TokenServer, "max_head", 64 * 1024)

#: The attacker: ``ports``, idle connections, slow ones (a request head sent a byte at a
#: time) per port. It dials them all without waiting to be accepted, and keeps that many
#: open, dialling again each one the server closes (up to 2000 a second), until its stdin
#: closes. It prints ``ready`` once it was connected that many times, and at the end a
#: JSON summary: the answers it got, how long its slow connections stayed open.
FLOOD = r"""
import json, resource, selectors, socket, sys, time
ports = [int(p) for p in sys.argv[1].split(",")]
idle_n, slow_n = int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
dialled = dial_errors = 0
def dial(port, kind):
    global dialled
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    sel.register(s, selectors.EVENT_READ, [kind, port, time.monotonic(), False])
    dialled += 1
for port in ports:
    for _ in range(slow_n):
        dial(port, "slow")
for i in range(idle_n):
    dial(ports[i % len(ports)], "idle")
answers, redial, slow_open = {}, [], []
ready = False
last_drip = last_redial = time.monotonic()
credit = 0.0
running = True
while running:
    for key, _ in sel.select(0.05):
        if key.data == "stdin":
            running = False
            continue
        kind, port, opened, _ = key.data
        try:
            data = key.fileobj.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if data:
            first = data.split(b"\r\n", 1)[0].decode(errors="replace")
            answers[first] = answers.get(first, 0) + 1
            continue                # the close follows
        sel.unregister(key.fileobj)
        key.fileobj.close()
        if kind == "slow":
            slow_open.append(time.monotonic() - opened)
        redial.append((port, kind))
    if not ready and dialled >= idle_n + slow_n * len(ports):
        ready = True
        print("ready", flush=True)
    now = time.monotonic()
    credit, last_redial = min(credit + (now - last_redial) * 2000, 2000), now
    allowed = min(len(redial), int(credit))
    credit -= allowed
    for port, kind in redial[:allowed]:
        try:
            dial(port, kind)
        except OSError:
            dial_errors += 1
    del redial[:allowed]
    if now - last_drip > 0.2:      # the slowloris: one byte of header at a time
        last_drip = now
        for key in list(sel.get_map().values()):
            if key.data != "stdin" and key.data[0] == "slow":
                try:
                    key.fileobj.send(b"x" if key.data[3] else
                                     b"GET /api/tree HTTP/1.1\r\nX-Slow: ")
                    key.data[3] = True
                except OSError:
                    pass
now = time.monotonic()
slow_open += [now - k.data[2] for k in sel.get_map().values()
              if k.data != "stdin" and k.data[0] == "slow"]
print(json.dumps({"answers": answers, "dialled": dialled, "dial_errors": dial_errors,
                  "slow_longest_open": round(max(slow_open, default=0), 2)}), flush=True)
"""


class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()


def threads_and_fds() -> tuple[int, int]:
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return threads, len(os.listdir("/proc/self/fd"))


class Peak:
    """The highest thread and fd counts of this process (the controller), sampled."""

    def __init__(self):
        self.threads, self.fds = threads_and_fds()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            t, f = threads_and_fds()
            self.threads, self.fds = max(self.threads, t), max(self.fds, f)

    def stop(self) -> "Peak":
        self._stop.set()
        self._thread.join()
        return self


def timed_get(url: str, timeout: float = 30) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except OSError as e:
        code = f"{type(e).__name__}: {e}"
    return code, time.monotonic() - t0


def lines_of(proc: subprocess.Popen) -> "queue.Queue[str]":
    out: queue.Queue[str] = queue.Queue()

    def pump():
        for line in proc.stdout:
            out.put(line)
        out.put("")
    threading.Thread(target=pump, daemon=True).start()
    return out


@pytest.fixture(autouse=True)
def services_stopped_after():
    """The admin and telemetry services a test here starts are the process's (module
    globals): stop them, or the next test file finds telemetry recording."""
    yield
    from hpcmesh.admin.server import stop_admin
    from hpcmesh.telemetry.server import stop_telemetry
    stop_telemetry()
    stop_admin()


@pytest.fixture
def login_node_fd_limit():
    """The controller with a login node's usual limit of 1024 open files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_another_user_holding_connections_cannot_keep_the_token_holder_out(
        other_user, login_node_fd_limit):
    """200 idle connections and slow request heads per server, re-opened as fast as the
    server closes them: the token's holder is still answered 200 in a couple of seconds,
    every time, the job's own work goes on, and the controller's threads and descriptors
    stay bounded (none left once the attacker is gone)."""
    job = LocalJob(hosts=("hosts",)).enable_admin().enable_telemetry(include_dashboard=True)
    state = job.state(cached_path=None)
    pm = None
    urls = [admin_endpoint(state.admin_url, "/api/tree"),
            admin_endpoint(state.telemetry_url, "/api/tables"),
            admin_endpoint(state.dashboard_url, "/api/dashboard")]
    ports = [urlsplit(url).port for url in urls]
    base_threads, base_fds = threads_and_fds()
    attacker = other_user.popen([SYSTEM_PYTHON, "-c", FLOOD, ",".join(map(str, ports)),
                                 str(200 * len(ports)), "20"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    out = lines_of(attacker)
    peak = Peak()
    answered: list[tuple] = []
    try:
        assert out.get(timeout=60) == "ready\n", attacker.stderr.read()
        # the job's own work, meanwhile: new processes, an actor, calls
        t0 = time.monotonic()
        pm = state.hosts.spawn_procs(per_host={"gpus": 2}, name="flooded")
        pinger = pm.spawn("pinger", Pinger)
        assert sorted(pinger.ping.call().get(timeout=60).values()) == sorted(pm.pids)
        spawned_in = time.monotonic() - t0
        # the token's holder, again and again for longer than a head may take to arrive
        until = time.monotonic() + HEAD_TIMEOUT_S + 2
        while time.monotonic() < until or len(answered) < 3 * len(urls):
            for url in urls:
                answered.append((url.split("?")[0], *timed_get(url, timeout=10)))
    finally:
        attacker.stdin.close()
        attacker.wait(timeout=60)
        peak.stop()
        rest = []
        while (line := out.get(timeout=10)):
            rest.append(line)
        print("attacker:", "".join(rest), attacker.stderr.read())
        attacker.stdout.close()
        attacker.stderr.close()
        if pm is not None:
            pm.stop().get(timeout=30)
    summary = json.loads(rest[-1])
    slowest = max(took for _, _, took in answered)
    print(f"threads {base_threads} -> peak {peak.threads}, fds {base_fds} -> peak {peak.fds}, "
          f"spawn and calls in {spawned_in:.1f} s, {len(answered)} requests of the token's "
          f"holder, the slowest in {slowest:.2f} s")
    assert spawned_in < 60
    assert summary["dialled"] > 3 * (200 + 20) * len(ports), summary   # it kept at it
    # every request with the token was answered, quickly
    late = [a for a in answered if a[1] != 200 or a[2] >= 2]
    assert not late, (len(answered), late)
    # no thread per connection, a descriptor per connection still arriving (bounded)
    assert peak.threads <= base_threads + 10, (peak.threads, base_threads)
    assert peak.fds <= base_fds + len(ports) * ARRIVING + 40, (peak.fds, base_fds)
    # no slow request head stayed longer than its time; the ones pushed out got a 503
    assert summary["slow_longest_open"] < HEAD_TIMEOUT_S + 2, summary
    assert summary["answers"].get("HTTP/1.0 503 Service Unavailable", 0) > 100, summary
    # and all of it is released once the attacker is gone
    wait_until(lambda: threads_and_fds()[0] <= base_threads + 2
               and threads_and_fds()[1] <= base_fds + 2, 30,
               f"back to {base_threads} threads and {base_fds} fds (now {threads_and_fds()})")
    assert timed_get(urls[0])[0] == 200


# -- what a handler that breaks answers -----------------------------------------------------
class PanicException(BaseException):
    """What pyo3 raises for a Rust panic (DataFusion's): a BaseException, not an Exception."""


class Breaking(TokenHandler):
    def get(self, path: str, query: dict) -> tuple:
        if path == "/panic":
            raise PanicException("called `Option::unwrap()` on a `None` value\nmore lines")
        if path == "/bug":
            raise KeyError("no such thing")
        return 200, {"ok": True}


def request(url: str, data: bytes | None = None) -> tuple[int, dict | None]:
    req = urllib.request.Request(url, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else None


def test_a_handler_that_raises_answers_with_the_reason(caplog):
    srv = TokenServer(Breaking, None)
    try:
        with caplog.at_level("DEBUG", logger="hpcmesh.admin"):
            code, doc = request(admin_endpoint(srv.url, "/panic"))
            assert code == 500 and "PanicException" in doc["error"], doc
            assert "Option::unwrap()" in doc["error"]
            code, doc = request(admin_endpoint(srv.url, "/bug"))
            assert code == 500 and doc["error"] == "KeyError: 'no such thing'", doc
            assert request(admin_endpoint(srv.url, "/fine")) == (200, {"ok": True})
        failed = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        assert len(failed) == 2 and not any(r.exc_info for r in failed), failed
        assert "PanicException" in failed[0].getMessage()
        assert "\n" not in failed[0].getMessage()
        assert srv.token not in caplog.text
    finally:
        srv.close()


def test_a_debug_request_with_an_unusable_number_is_a_400():
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=None)
    try:
        for body in (b'{"session": 1e400}', b'{"session": -1e400}', b'{"session": NaN}',
                     b"[" * 100000, b'{"session": "x"}', b"[]"):
            code, doc = request(admin_endpoint(state.admin_url, "/api/debug/p"), body)
            assert code == 400 and "session" in doc["error"], (body[:30], code, doc)
    finally:
        from hpcmesh.admin.server import stop_admin
        stop_admin()


def test_a_request_that_cannot_be_parsed_is_a_400():
    srv = TokenServer(Breaking, None)
    try:
        port = srv.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET http://[x/fine?token=" + srv.token.encode() + b" HTTP/1.0\r\n\r\n")
            answer = s.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.0 400 "), answer
    finally:
        srv.close()



def test_a_request_head_over_its_size_limit_is_cut():
    srv = TokenServer(Breaking, None)
    try:
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as s:
            s.sendall(b"GET /fine HTTP/1.0\r\n")
            head = b"X-Pad: " + b"y" * 10000 + b"\r\n"      # (fewer than 100 headers)
            sent = 0
            try:
                while sent < 10 * MAX_HEAD:     # more than it takes
                    s.sendall(head)
                    sent += len(head)
            except OSError:
                pass
            try:
                answer = s.recv(100)
            except ConnectionResetError:
                answer = b""
        assert answer == b"", (sent, answer)        # hung up on, not answered
        # and the next one is served
        assert request(admin_endpoint(srv.url, "/fine")) == (200, {"ok": True})
    finally:
        srv.close()


def test_the_gate_answers_a_head_without_the_token_and_admits_one_that_arrives_in_pieces():
    """The gate reads heads itself: without the token a bare 401 (no handler ran); with it,
    however the head was split, the handler sees the whole request and its body."""
    srv = TokenServer(Breaking, None)
    try:
        port = srv.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /fine?token=wrong HTTP/1.0\r\n\r\n")
            assert s.makefile("rb").read().startswith(b"HTTP/1.0 401 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            sent = 0
            for piece in (b"GET /fi", b"ne HTTP/1.0\r\nAuthorization: Bea",
                          b"rer " + srv.token.encode() + b"\r"):
                s.sendall(piece)
                sent += len(piece)
                # private: the gate's head buffer, to send the next piece once it is read
                wait_until(lambda: [len(c.head) for c in srv._arriving.values()] == [sent],
                           10, f"the gate reading {sent} bytes")
            s.sendall(b"\n\r\n")
            answer = s.makefile("rb").read()
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b'{"ok": true}'), answer
    finally:
        srv.close()
