"""remote_mount and gather_mount on the Slurm test cluster (issue 17's Must show). Every
node there has its own mount namespace: a mount on node2 is seen by node2's processes only,
so what the actors see on each node came through that node's own FUSE mount.

- a SlurmJob mounts a venv with a package in it on 3 nodes; the actors start with the venv's
  python from the mount and import the package from it; an edit on the client is seen by
  the running actors after refresh() and by new ones after state();
- gather_mount shows each node's $SUBDIR directory on the client, from a tmpfs that only
  that node has;
- after kill(), after the client is SIGKILLed, and after scancel (Slurm kills every
  process of the job at once, fusermount3's auto_unmount helper included) no node has a
  mount left.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

from test_slurm_e2e import PREFIX, _listed, cluster  # noqa: F401 - cluster is a fixture
from test_mounts import _venv                                 # skips/fails without FUSE

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import SlurmJob
from hpcmesh.mounts.fuse_process import mount_fstype

NODE_EXEC = str(pathlib.Path(__file__).parent / "cluster" / "node-exec.sh")
NODES = (1, 2, 3)


def node_mounts(k: int, under: pathlib.Path, fstype: str = "fuse.hpcmesh") -> list[str]:
    """The mount points of ``fstype`` below ``under`` (this test's folder: what other runs
    left on a node is not this test's business) in node k's mount namespace."""
    out = subprocess.run([NODE_EXEC, str(k), "cat", "/proc/self/mountinfo"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [line.split()[4] for line in out.splitlines()
            if line.partition(" - ")[2].startswith(fstype + " ")
            and line.split()[4].startswith(str(under) + "/")]


class Worker(Actor):
    @endpoint
    def seen(self) -> dict:
        import socket
        import mounted_pkg
        importlib.reload(mounted_pkg)
        return {"host": socket.gethostname(), "prefix": sys.prefix,
                "python": sys.executable, "pkg": mounted_pkg.__file__,
                "value": mounted_pkg.VALUE}


def test_a_venv_mounted_on_three_nodes_runs_the_actors_and_follows_edits(cluster):
    venv = _venv(cluster)
    pkg = pathlib.Path(venv).glob("lib/python3*/site-packages/mounted_pkg/__init__.py")
    (init,) = list(pkg)
    init.write_text("VALUE = 1\n")
    mnt = cluster / "mnt"
    job = SlurmJob(meshes={"hosts": 3}, job_name=f"{PREFIX}-mount",
                   log_dir=str(cluster / "logs"), timeout=60, time_limit="10:00")
    job.remote_mount(venv, mntpoint=str(mnt), python_exe="bin/python")
    t0 = time.monotonic()
    state = job.state(cached_path=None)
    up = time.monotonic() - t0
    try:
        (mount,) = state.mounts
        push = mount.last_push
        print(f"\n3 nodes mounted in {up:.1f} s (with the job's start); the client uploaded "
              f"{push.uploaded_bytes} bytes for {push.stored_bytes} stored on the nodes")
        assert push.stored_bytes == 3 * push.uploaded_bytes > 0
        assert mount_fstype(str(mnt)) is None             # the login node has no mount
        for k in NODES:
            assert node_mounts(k, cluster) == [str(mnt)]
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        workers = procs.spawn("w", Worker)
        seen = [v for _, v in workers.seen.call().get(timeout=120).items()]
        assert sorted({s["host"] for s in seen}) == ["node1", "node2", "node3"]
        for s in seen:
            assert s["prefix"] == str(mnt)
            assert s["python"].startswith(str(mnt))
            assert s["pkg"].startswith(str(mnt) + "/lib/")
            assert s["value"] == 1

        edit = f"VALUE = 2  # {os.urandom(8).hex()}\n"       # content no store holds yet
        init.write_text(edit)
        mount.refresh()
        assert mount.last_push.uploaded_bytes == len(edit)
        assert [v["value"] for _, v in workers.seen.call().get(timeout=60).items()] == [2] * 6
        init.write_text("VALUE = 3  # through state()\n")
        state = job.state(cached_path=None)
        fresh = state.hosts.spawn_procs(per_host={"gpus": 1}).spawn("f", Worker)
        assert [v["value"] for _, v in fresh.seen.call().get(timeout=120).items()] == [3] * 3
    finally:
        job.kill()
    # scancel ends the mount processes; their agents unmount as they exit
    t0 = time.monotonic()
    left = {k: node_mounts(k, cluster) for k in NODES}
    while any(left.values()) and time.monotonic() - t0 < 15:
        time.sleep(0.1)
        left = {k: node_mounts(k, cluster) for k in NODES}
    print(f"\nafter kill(): no mount on any node {time.monotonic() - t0:.1f} s later")
    assert not any(left.values()), f"mounts left after kill(): {left}"


def test_gather_mount_shows_each_nodes_own_directory(cluster):
    local_only = cluster / "nodelocal"           # a tmpfs in each node's namespace only
    local_only.mkdir()
    for k in NODES:
        subprocess.run([NODE_EXEC, str(k), "mount", "-t", "tmpfs", "-o", "size=8m",
                        f"hpcm-test-node{k}", str(local_only)], check=True, timeout=30)
    gathered = cluster / "gathered"
    job = SlurmJob(meshes={"hosts": 3}, job_name=f"{PREFIX}-gather",
                   log_dir=str(cluster / "logs"), timeout=60, time_limit="10:00")
    job.gather_mount(str(local_only / "$SUBDIR"), str(gathered))
    try:
        state = job.state(cached_path=None)
        procs = state.hosts.spawn_procs()
        w = procs.spawn("w", Writer)
        w.write.call(str(local_only)).get(timeout=60)
        assert os.listdir(local_only) == []              # not on the login node
        assert sorted(os.listdir(gathered)) == ["hosts_0", "hosts_1", "hosts_2"]
        for i in range(3):
            assert (gathered / f"hosts_{i}" / "who.txt").read_text() == f"node{i + 1}\n"
    finally:
        job.kill()
        for k in NODES:
            subprocess.run([NODE_EXEC, str(k), "umount", str(local_only)], timeout=30)
    assert mount_fstype(str(gathered)) is None


class Writer(Actor):
    @endpoint
    def write(self, root: str) -> None:
        """who.txt in root/<this actor's $SUBDIR>: hosts_0 on node1, ..."""
        import socket
        from hpcmesh.actor import context
        from hpcmesh.shapes import subdir_for
        folder = os.path.join(root, subdir_for(dict(context().actor_instance.rank)))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "who.txt"), "w") as f:
            f.write(socket.gethostname() + "\n")


def test_a_sigkilled_client_leaves_no_mount_on_any_node(cluster):
    venv = _venv(cluster)
    mnt = cluster / "mnt"
    script = cluster / "client.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={{"hosts": 3}}, job_name="{PREFIX}-mountvictim",
                       log_dir="{cluster / 'logs'}", progress=False, time_limit="10:00")
        job.remote_mount({venv!r}, mntpoint={str(mnt)!r}, python_exe="bin/python")
        job.state(cached_path=None)
        print("READY", job.job_id, flush=True)
        time.sleep(600)     # sleep: lives on until the test kills it
    """))
    env = dict(os.environ, HPCMESH_LEASE_GRACE="3")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        jid = line.split()[1]
        seen = {k: node_mounts(k, cluster) for k in NODES}
        assert all(v == [str(mnt)] for v in seen.values()), seen
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        left = {k: node_mounts(k, cluster) for k in NODES}
        while any(left.values()) and time.monotonic() - t0 < 30:
            time.sleep(0.2)
            left = {k: node_mounts(k, cluster) for k in NODES}
        took = time.monotonic() - t0
        print(f"\nclient SIGKILLed (lease grace 3 s): every node unmounted after {took:.1f} s")
        assert not any(left.values()), f"mounts left: {left}"
        while _listed(jid) and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        assert not _listed(jid)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_scancel_of_the_job_leaves_no_mount_on_any_node(cluster):
    """The agent's exit undoes its processes' mounts (runtime/process/exit_actions.py): Slurm's kill
    takes fusermount3 along, so auto_unmount alone would leave dead mounts behind."""
    venv = _venv(cluster)
    mnt = cluster / "mnt"
    job = SlurmJob(meshes={"hosts": 3}, job_name=f"{PREFIX}-mountcancel",
                   log_dir=str(cluster / "logs"), timeout=60, time_limit="10:00")
    job.remote_mount(venv, mntpoint=str(mnt), python_exe=None)
    job.state(cached_path=None)
    try:
        assert all(node_mounts(k, cluster) == [str(mnt)] for k in NODES)
        subprocess.run(["scancel", job.job_id], check=True, timeout=30)
        t0 = time.monotonic()
        while _listed(job.job_id) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        left = {k: node_mounts(k, cluster) for k in NODES}
        print(f"\nscancel: job gone after {time.monotonic() - t0:.1f} s, mounts left: {left}")
        assert not any(left.values()), f"mounts left: {left}"
    finally:
        job.kill()


def test_a_client_inside_the_allocation_mounts_too(cluster):
    """BatchJob's client, run by the job itself (client_script): its state() applies the
    remote_mount it declares, and its workers run the mounted venv's python."""
    venv = _venv(cluster)
    mnt = cluster / "mnt"
    log_dir = cluster / "logs"
    client = cluster / "client_in_allocation.py"
    client.write_text(textwrap.dedent(f"""
        import sys
        from hpcmesh.actor import Actor, endpoint
        from hpcmesh.job import BatchJob, SlurmJob

        class W(Actor):
            @endpoint
            def prefix(self):
                import socket, sys
                return socket.gethostname(), sys.prefix

        job = BatchJob(SlurmJob(meshes={{"workers": 2}}, job_name="{PREFIX}-mountclient",
                                log_dir="{log_dir}"))
        job.remote_mount({venv!r}, mntpoint={str(mnt)!r}, python_exe="bin/python")
        state = job.state()
        seen = state.workers.spawn_procs().spawn("w", W).prefix.call().get(timeout=60)
        print("MOUNTED IN ALLOCATION", sorted(seen.values()), len(state.mounts), flush=True)
    """))
    job = SlurmJob(meshes={"workers": 2}, job_name=f"{PREFIX}-mountclient", log_dir=str(log_dir),
                   progress=False)
    job.apply(client_script=str(client))
    deadline = time.monotonic() + 90
    while _listed(job.job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listed(job.job_id), "the job should end when its client script ends"
    out = open(job.log_paths()[0]).read()
    # two nodes of the job (whichever Slurm gave: one still winding up an earlier
    # test's step is passed over), each running the mounted venv's python
    seen = re.search(r"MOUNTED IN ALLOCATION (\[.*\]) 1$", out, re.M)
    assert seen, out + open(job.log_paths()[0][:-4] + ".err").read()
    pairs = ast.literal_eval(seen.group(1))
    assert len({h for h, _ in pairs}) == 2 and {p for _, p in pairs} == {str(mnt)}, out
    assert all(h in {f"node{k}" for k in NODES} for h, _ in pairs), out
    assert all(node_mounts(k, cluster) == [] for k in NODES)
