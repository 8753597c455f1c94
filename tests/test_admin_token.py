"""The admin token (it grants a pdb prompt in the job's processes) stays with its user:
not in a log another user can read, not on a command line (``ps`` shows every user's),
and ``hpcmesh debug``/``top`` take it only from where this user alone could have put it.

The attacker is a second local account (``other_user``) on the same host.
"""

import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

import pytest
from ci_gate import import_or_skip
from other_user import SYSTEM_PYTHON

from hpcmesh.actor import Actor, debug_controller, endpoint
from hpcmesh.token_http import url_token
from hpcmesh.job import LocalJob

PROMPT = "(hpcmesh-pdb) "
HPCMESH = [sys.executable, "-m", "hpcmesh"]


def shared_dir() -> str:
    """A folder every user can read, as a project directory on a login node often is."""
    d = tempfile.mkdtemp(prefix="hpcmesh-shared-")
    os.chmod(d, 0o755)
    return d


def env_without_urls(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("ADMIN_URL", "TELEMETRY_URL"))}
    return dict(env, PYTHONPATH=os.getcwd(), **extra)


# -- the log ---------------------------------------------------------------------------------
JOB_CLIENT = r'''
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from hpcmesh.job import LocalJob
job = LocalJob(hosts=("hosts",)).enable_admin().enable_telemetry(include_dashboard=True)
state = job.state(cached_path=sys.argv[1])
logging.getLogger("job").info("up: %r", state)
with open(sys.argv[2], "w") as f:       # for the test (a file only root may read)
    f.write(" ".join([state.admin_url, state.telemetry_url, state.dashboard_url]))
print("up", flush=True)
sys.stdin.read()
'''

#: The attacker: every ``token=`` in a log it can read, tried on every port the log names.
USE_THE_LOG = r'''
import re, sys, urllib.error, urllib.request
text = open(sys.argv[1]).read()
tokens = set(re.findall(r"token=([A-Za-z0-9_-]{8,})", text))
ports = set(re.findall(r"127\.0\.0\.1:(\d+)", text))
got = []
for port in ports:
    for token in tokens:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tree?token={token}", timeout=10)
            got.append((port, 200))
        except urllib.error.HTTPError as e:
            got.append((port, e.code))
print(len(tokens), len(ports), got)
'''


def test_a_job_log_gives_another_user_no_token(other_user, tmp_path):
    logs = shared_dir()
    log_path = os.path.join(logs, "job.log")       # as a job's output file often is: 0644
    cache = tmp_path / ".hpcmesh" / "default" / "state.pkl"
    with open(log_path, "w") as log:
        client = subprocess.Popen([sys.executable, "-c", JOB_CLIENT, str(cache),
                                   str(tmp_path / "urls")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  text=True, env=env_without_urls())
    try:
        assert client.stdout.readline() == "up\n", open(log_path).read()
        res = other_user.python(USE_THE_LOG, log_path)
        print(res.stdout, res.stderr)
        assert "200" not in res.stdout.split(" ", 2)[2], res.stdout
        text = open(log_path).read()
        urls = (tmp_path / "urls").read_text().split()
        tokens = {url_token(url) for url in urls}
        assert "" not in tokens
        assert not any(t in text for t in tokens), text
        # where the services are is still said, with the token shown as elided
        assert f"127.0.0.1:{urlsplit(urls[0]).port}" in text, text
        assert "token=…" in text, text
    finally:
        client.stdin.close()
        client.wait(timeout=60)
        shutil.rmtree(logs, ignore_errors=True)


# -- the command line of hpcmesh debug / hpcmesh top ---------------------------------------
class Debuggee(Actor):
    @endpoint
    def step(self, x: int) -> int:
        breakpoint()
        return x + 1


@pytest.fixture
def paused(tmp_path):
    """A job with the admin view (its services file in ``<tmp>/.hpcmesh/default``) and an
    actor of it that pauses at a breakpoint on each ``step``."""
    cache = tmp_path / ".hpcmesh" / "default" / "state.pkl"
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=str(cache))
    pm = state.hosts.spawn_procs(per_host={"gpus": 1}, name="dbgtok")
    try:
        yield state, pm.spawn("d", Debuggee), tmp_path
    finally:
        pm.stop().get(timeout=30)
        from hpcmesh.admin.server import stop_admin
        stop_admin()


def wait_for_session(timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not debug_controller().list():
        assert time.monotonic() < deadline, "no paused session"
        time.sleep(0.05)


def read_until(fd: int, marker: str, timeout: float = 30.0) -> str:
    buf = ""
    deadline = time.monotonic() + timeout
    while marker not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; got:\n{buf}"
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk.decode("utf-8", "replace")
    assert marker in buf, buf
    return buf


def exit_status_draining(fd: int, proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """``proc``'s exit status, reading what it writes to the pty meanwhile (a full pty
    would block it before it reads its input)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"still running after {timeout} s"
        if select.select([fd], [], [], 0.1)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                pass
    return proc.returncode


#: The attacker: what /proc shows another user of a process of ours.
PEEK = r'''
import sys
pid = sys.argv[1]
print(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
try:
    open(f"/proc/{pid}/environ", "rb").read()
    print("environ readable")
except PermissionError:
    print("environ: permission denied")
'''


def peek(other_user, pid: int) -> str:
    return other_user.python(PEEK, str(pid)).stdout


def url_file(tmp_path, url: str) -> str:
    path = tmp_path / "admin-url"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(url + "\n")
    return str(path)


@pytest.mark.parametrize("way", ["argv", "services file", "url file", "stdin", "environment"])
def test_hpcmesh_debug_shows_another_user_no_token(other_user, paused, way):
    """``hpcmesh debug`` attached to a paused endpoint, the URL handed to it each way a user
    may: what another user reads of it in /proc carries no token. A URL on the command
    line is refused (by then it was visible: the refusal says how to pass it instead)."""
    state, d, tmp = paused
    token = url_token(state.admin_url)
    call = d.step.call_one(1)
    wait_for_session()
    env = env_without_urls(HPCMESH_STATE_DIR=str(tmp / ".hpcmesh"))
    argv, first_line = [*HPCMESH, "debug"], ""
    if way == "argv":
        argv.append(state.admin_url)
    elif way == "url file":
        argv += ["--url-file", url_file(tmp, state.admin_url)]
    elif way == "stdin":
        argv += ["--url-file", "-"]
        first_line = state.admin_url + "\n"
    elif way == "environment":
        env["HPCMESH_ADMIN_URL"] = state.admin_url
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp)
    try:
        if first_line:
            proc.stdin.write(first_line.encode())
            proc.stdin.flush()
        if way == "argv":
            out = proc.communicate(timeout=60)[0].decode()
            assert proc.returncode == 2 and "--url-file" in out, out
            assert "ps" in out and token not in out, out
            assert not call.done()          # it did not attach
            proc = subprocess.Popen([*HPCMESH, "debug", "--list"], env=env, cwd=tmp)
            assert proc.wait(timeout=60) == 0
            return
        out = read_until(proc.stdout.fileno(), PROMPT)
        assert "attached to d[gpus=0]" in out, out
        seen = peek(other_user, proc.pid)
        assert "hpcmesh debug" in seen and token not in seen, seen
        assert "environ: permission denied" in seen, seen
        proc.stdin.write(b"c\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if not call.done():
            debug_controller().attach(stdin=open(os.devnull))
        call.get(timeout=30)


@pytest.mark.parametrize("way", ["argv", "services file", "url file"])
def test_hpcmesh_top_shows_another_user_no_token(other_user, tmp_path, way):
    import_or_skip("textual")
    cache = tmp_path / ".hpcmesh" / "default" / "state.pkl"
    state = LocalJob(hosts=("hosts",)).enable_admin().state(cached_path=str(cache))
    token = url_token(state.admin_url)
    env = env_without_urls(HPCMESH_STATE_DIR=str(tmp_path / ".hpcmesh"), TERM="xterm")
    argv = [*HPCMESH, "top"]
    if way == "argv":
        argv.append(state.admin_url)
    elif way == "url file":
        argv += ["--url-file", url_file(tmp_path, state.admin_url)]
    main, child = pty.openpty()
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, env=env,
                            cwd=tmp_path, close_fds=True)
    os.close(child)
    try:
        if way == "argv":
            out = read_until(main, "--url-file")
            assert proc.wait(timeout=60) == 2 and token not in out, out
            return
        read_until(main, "processes")          # it drew the tree: it has the URL
        seen = peek(other_user, proc.pid)
        assert "hpcmesh top" in seen and token not in seen, seen
        os.write(main, b"q")
        assert exit_status_draining(main, proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
        from hpcmesh.admin.server import stop_admin
        stop_admin()


# -- the services file -----------------------------------------------------------------------
#: The attacker's stand-in for an admin view: it prints each request it gets.
FAKE_ADMIN = r'''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("got", self.command, self.path, self.headers.get("Authorization"), flush=True)
        body = b'{"sessions": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
'''


def test_a_services_file_planted_by_another_user_is_not_read(other_user):
    """Another user's ``.hpcmesh/default/services.json`` in a shared project directory,
    naming their own server: ``hpcmesh debug`` there must not talk to it (it would type
    this user's pdb lines into it)."""
    project = shared_dir()
    os.chmod(project, 0o777)
    fake = other_user.popen([SYSTEM_PYTHON, "-c", FAKE_ADMIN], stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(fake.stdout.readline())
        planted = r'''
import json, os, sys
os.makedirs(os.path.join(sys.argv[1], ".hpcmesh", "default"))
path = os.path.join(sys.argv[1], ".hpcmesh", "default", "services.json")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, json.dumps({"admin_url": f"http://127.0.0.1:{sys.argv[2]}/?token=theirs"}).encode())
'''
        other_user.python(planted, project, str(port))
        res = subprocess.run([*HPCMESH, "debug", "--list"], cwd=project, capture_output=True,
                             text=True, timeout=60, env=env_without_urls())
        services = os.path.join(project, ".hpcmesh", "default", "services.json")
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert services in res.stderr and f"uid {other_user.uid}" in res.stderr, res.stderr
        fake.kill()
        assert "got" not in fake.communicate(timeout=30)[0]
    finally:
        if fake.poll() is None:
            fake.kill()
        shutil.rmtree(project, ignore_errors=True)


def test_a_services_file_others_can_read_is_refused(tmp_path):
    folder = tmp_path / ".hpcmesh" / "default"
    folder.mkdir(parents=True)
    path = folder / "services.json"
    path.write_text('{"admin_url": "http://127.0.0.1:1/?token=abc"}')
    os.chmod(path, 0o644)
    res = subprocess.run([*HPCMESH, "debug", "--list"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env_without_urls())
    assert res.returncode == 2 and str(path) in res.stderr, res.stderr
    assert "0644" in res.stderr and "0600" in res.stderr, res.stderr
    # a --url-file too
    res = subprocess.run([*HPCMESH, "debug", "--list", "--url-file", str(path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=env_without_urls())
    assert res.returncode == 2 and "0644" in res.stderr, res.stderr


def test_a_planted_temporary_file_does_not_get_the_urls(other_user, tmp_path):
    """Writing the services file in a folder another user may write to (a sticky shared
    one) is refused outright, naming the folder; a file they made in advance under the old
    temporary name never receives the URLs."""
    from hpcmesh.admin.services import write_services_file
    from hpcmesh.private_files import UntrustedPathError
    folder = shared_dir()
    os.chmod(folder, 0o1777)
    try:
        other_user.python("import os, sys\nfor n in ('services.json.tmp',):\n"
                          "    fd = os.open(os.path.join(sys.argv[1], n), os.O_CREAT | "
                          "os.O_WRONLY, 0o666)\n    os.fchmod(fd, 0o666)\n", folder)
        with pytest.raises(UntrustedPathError) as e:
            write_services_file(folder, {"admin_url": "http://127.0.0.1:1/?token=secret"})
        assert folder in str(e.value) and "1777" in str(e.value), str(e.value)
        res = other_user.python("import sys, os\nfor n in os.listdir(sys.argv[1]):\n"
                                "    try: print(n, open(os.path.join(sys.argv[1], n)).read())\n"
                                "    except OSError as e: print(n, e)\n", folder)
        assert "services.json.tmp" in res.stdout and "secret" not in res.stdout, res.stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)

