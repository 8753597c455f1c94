"""SSHJob / LoginJob against a private sshd on 127.0.0.1 (own config, host key and client key;
started and stopped here). Needs openssh-server (``apt-get install openssh-server``) and
root (sshd's privilege-separation directory /run/sshd)."""

import os
import shutil
import socket
import subprocess
import time

import pytest
from ci_gate import skip_or_fail
from proc_helpers import wait_gone

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import LoginJob, SSHJob

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "bin",
                  "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A private sshd: 127.0.0.1 only, key auth only, its own host key; yields ssh options."""
    if not os.path.exists(SSHD) or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        skip_or_fail("sshd/ssh/ssh-keygen not installed (apt-get install openssh-server "
                      "openssh-client)")
    if not os.path.isdir("/run/sshd"):
        if os.geteuid() != 0:
            skip_or_fail("sshd needs its privilege-separation directory /run/sshd (root)")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o700)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = _free_port()
    user = os.environ.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n"
        "UseDNS no\n")
    log = open(d / "sshd.log", "wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL)
    opts = ["-i", str(d / "client_key"), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-l", user]
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                skip_or_fail(f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}")
            r = subprocess.run(["ssh", "-o", "BatchMode=yes", "-p", str(port), *opts,
                                "127.0.0.1", "true"], capture_output=True, timeout=20)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                skip_or_fail(f"cannot ssh to the private sshd: {r.stderr.decode()[-300:]}")
            time.sleep(0.2)
        yield {"port": port, "args": opts}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname(), os.getpid()


def test_hostlists_and_arguments():
    # the hosts file's rule (hosts_file.expand_hosts, tested there), bounded, named per mesh
    assert SSHJob(hosts="node[1-3],gpu7").meshes == {"hosts": ["node1", "node2", "node3", "gpu7"]}
    hostile = ",".join(f"n{i}-[1-90000]" for i in range(20))     # 1.8 million names
    with pytest.raises(ValueError, match=r"^mesh 'w': hosts: .*more than 100000 hosts"):
        SSHJob(meshes={"w": hostile})
    with pytest.raises(ValueError, match=r"^mesh 'hosts': hosts\[1\]: host 'a' is listed twice"):
        SSHJob(hosts=["a", "a"])
    with pytest.raises(ValueError, match="at least one host"):
        SSHJob(hosts=[])
    with pytest.raises(ValueError, match="transport"):
        SSHJob(hosts="a", transport="ib")
    job = LoginJob(hosts="n[1-2]", python_exe="/opt/py")
    job.add_mesh("eval", ["e1"])
    assert job.meshes == {"hosts": ["n1", "n2"], "eval": ["e1"]}
    assert job.describe_meshes()["eval"] == "1 host(s) over ssh: e1"
    cmd = job.remote_command(["tcp://10.0.0.1:5"], "tok")
    assert cmd.startswith("exec env HPCMESH_JOB_TOKEN=tok")
    assert "/opt/py -P -m hpcmesh worker --secret-stdin --attach tcp://10.0.0.1:5" in cmd
    assert "SECRET=" not in cmd
    with pytest.raises(ValueError, match="no hosts"):
        SSHJob().apply()


def test_remote_agents_get_this_clients_tls(monkeypatch, tmp_path):
    job = SSHJob(hosts="n1", python_exe="/opt/py")
    monkeypatch.delenv("HPCMESH_TLS_CA", raising=False)
    assert "--ca" not in job.remote_command(["tcp://10.0.0.1:5"], "tok")
    monkeypatch.setenv("HPCMESH_TLS_CA", "trust_all_connections")
    cmd = job.remote_command(["tcp://10.0.0.1:5"], "tok")
    assert "--ca trust_all_connections" in cmd and "HPCMESH_TLS_CA=trust_all_connections" in cmd
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("HPCMESH_TLS_CA", str(ca))
    cmd = job.remote_command(["tcp://10.0.0.1:5"], "tok")
    assert f"--ca {ca}" in cmd
    assert f"HPCMESH_TLS_CERT={tmp_path / 'hpcmesh.pem'}" in cmd


def test_ssh_end_to_end_secret_stays_off_command_lines(sshd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = SSHJob(hosts=["127.0.0.1", "localhost"], python_exe=PY, ssh_args=sshd["args"],
                 ssh_port=sshd["port"], grace=30, workdir=str(tmp_path))
    state = job.state(cached_path=None)
    hosts = state.hosts
    assert dict(hosts.extent) == {"hosts": 2}
    vm = hosts.spawn_procs({"gpus": 2}).spawn("w", Where).where.call().get(timeout=60)
    assert {h for h, _p in vm.values()} == {socket.gethostname()}
    proc_pids = [p for _h, p in vm.values()]
    ssh_pids = job.ssh_pids["hosts"]
    agent_pids = [a["pid"] for a in job.agents["hosts"]]
    assert all(agent_pids) and len(set(agent_pids)) == 2
    secret = job.secret_hex
    for pid in ssh_pids + agent_pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode()
        assert secret not in cmdline and "HPCMESH_SECRET=" not in cmdline, cmdline
    with open(f"/proc/{agent_pids[0]}/cmdline", "rb") as f:
        assert b"--secret-stdin" in f.read()
    assert job.active
    job.kill()
    assert not job.active
    assert wait_gone(proc_pids + agent_pids + ssh_pids, 15) == [], "processes left after kill()"


def test_unreachable_host_fails_with_ssh_status(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dead_port = _free_port()
    job = SSHJob(hosts=["127.0.0.1"], python_exe=PY, ssh_port=dead_port,
                 ssh_args=["-o", "ConnectTimeout=5"], attach_timeout=30)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ssh to 127\.0\.0\.1 exited with status 255"):
        job.apply()
    assert time.monotonic() - t0 < 25
