"""remote_mount and gather_mount on this host (issue 17): real FUSE mounts, real processes,
kill -9 and a client killed. The Slurm test cluster's run (a mount namespace per node) is
tests/test_slurm_mounts.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ci_gate import skip_or_fail
from proc_helpers import processes_with_cmdline, wait_gone, wait_until

from hpcmesh.actor import Actor, endpoint, this_proc
from hpcmesh.job import LocalJob
from hpcmesh.mounts.fuse_process import MountError, fuse_problem, mount_fstype

if fuse_problem() is not None:
    skip_or_fail(f"needs FUSE: {fuse_problem()} (scripts/system-packages.sh installs fuse3)")


class Reader(Actor):
    @endpoint
    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    @endpoint
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    @endpoint
    def python(self) -> tuple[str, str]:
        import mounted_pkg
        return sys.prefix, mounted_pkg.__file__

    @endpoint
    def write(self, path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def _src(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "conf.txt").write_text(f"version 1 {tmp_path}\n")
    (src / "big.bin").write_bytes(os.urandom(6 << 20))
    os.symlink("pkg/conf.txt", src / "link")
    return src


def _fs_pids(mnt) -> list[int]:
    """The FUSE processes serving ``mnt`` (their command line names it)."""
    return [pid for pid, cmd in processes_with_cmdline(str(mnt)) if "hpcmesh.mounts.fuse" in cmd]


def _states(pids) -> dict:
    """Each pid's State line (or gone), for a failure's message."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                out[pid] = next((ln.split(":", 1)[1].strip() for ln in f
                                 if ln.startswith("State:")), "?")
        except OSError:
            out[pid] = "gone"
    return out


def _gone_within(mnt, seconds: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if mount_fstype(str(mnt)) is None:
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def test_a_mount_serves_the_tree_read_only_and_refresh_reaches_running_processes(tmp_path):
    src, mnt = _src(tmp_path), tmp_path / "mnt"
    job = LocalJob().remote_mount(str(src), mntpoint=str(mnt), python_exe=None)
    state = job.state(cached_path=None)
    try:
        assert mount_fstype(str(mnt)) == "fuse.hpcmesh"
        assert (mnt / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert os.readlink(mnt / "link") == "pkg/conf.txt"
        assert (mnt / "link").read_text() == (src / "pkg" / "conf.txt").read_text()
        with pytest.raises(OSError):
            (mnt / "pkg" / "conf.txt").write_text("no")
        (mount,) = state.mounts
        fs_pids = _fs_pids(mnt)
        assert len(fs_pids) == 1
        procs = state.hosts.spawn_procs()
        reader = procs.spawn("r", Reader)
        assert reader.read.call_one(str(mnt / "pkg" / "conf.txt")).get(timeout=30).startswith(
            "version 1")
        assert reader.exists.call_one(str(mnt / "link")).get(timeout=30)     # now cached

        # a second state() with nothing changed moves no data
        job.state(cached_path=None)
        assert mount.last_push.uploaded_bytes == 0
        # an edit: only that file travels, the running process sees it, no remount
        (src / "pkg" / "conf.txt").write_text(f"version 2 {tmp_path}\n")
        (src / "new.txt").write_text(f"new {tmp_path}\n")
        (src / "link").unlink()
        t0 = time.monotonic()
        state = job.state(cached_path=None)
        took = time.monotonic() - t0
        assert mount.last_push.uploaded_bytes == 2 * len(f"version 2 {tmp_path}\n") - 6
        assert reader.read.call_one(str(mnt / "pkg" / "conf.txt")).get(timeout=30).startswith(
            "version 2")
        assert reader.read.call_one(str(mnt / "new.txt")).get(timeout=30) == f"new {tmp_path}\n"
        assert not reader.exists.call_one(str(mnt / "link")).get(timeout=30)
        assert sorted(os.listdir(mnt)) == ["big.bin", "new.txt", "pkg"]
        assert _fs_pids(mnt) == fs_pids
        print(f"\nrefresh after an edit: {took * 1000:.0f} ms")
        procs.stop().get(timeout=30)
    finally:
        job.kill()
    assert mount_fstype(str(mnt)) is None
    assert wait_gone(fs_pids, 10) == []


def _venv(tmp_path) -> str:
    """A venv of its own (no pip) that reaches hpcmesh through a .pth, with a package."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv",
                    "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    here = [p for p in sys.path if p.endswith("site-packages")]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (site / "hpcmesh_dev.pth").write_text("\n".join([*here, repo]) + "\n")
    (site / "mounted_pkg").mkdir()
    (site / "mounted_pkg" / "__init__.py").write_text("")
    return str(venv)


def test_processes_start_with_the_python_of_the_mounted_venv(tmp_path):
    venv, mnt = _venv(tmp_path), tmp_path / "mnt"
    job = LocalJob().remote_mount(venv, mntpoint=str(mnt), python_exe="bin/python")
    state = job.state(cached_path=None)
    try:
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        seen = procs.spawn("r", Reader).python.call().get(timeout=60)
        for _, (prefix, pkg) in seen.items():
            assert prefix == str(mnt)
            assert pkg.startswith(str(mnt) + "/lib/")
        procs.stop().get(timeout=30)
    finally:
        job.kill()


def test_a_mount_point_that_holds_files_is_refused(tmp_path):
    src, mnt = _src(tmp_path), tmp_path / "busy"
    mnt.mkdir()
    (mnt / "precious.txt").write_text("keep")
    job = LocalJob().remote_mount(str(src), mntpoint=str(mnt), python_exe=None)
    with pytest.raises(Exception, match=r"already holds files \(precious.txt\)"):
        job.state(cached_path=None)
    job.kill()
    assert (mnt / "precious.txt").read_text() == "keep"
    assert mount_fstype(str(mnt)) is None


def test_without_fuse_the_error_says_why_and_names_sync_workspace(tmp_path, monkeypatch):
    from hpcmesh.mounts import fuse_process
    from hpcmesh.mounts.mount_actor import MountActor
    monkeypatch.setattr(fuse_process.shutil, "which", lambda name: None)
    actor = this_proc().spawn("nofuse", MountActor, str(tmp_path / "store"))
    with pytest.raises(Exception) as e:
        actor.prepare.call_one(str(tmp_path / "mnt")).get(timeout=30)
    assert "fusermount3 is not installed" in str(e.value)
    assert "sync_workspace" in str(e.value)
    with pytest.raises(MountError):
        raise MountError("a MountError is an OSError and an HpcmeshError")


def test_bad_arguments_are_named_at_once(tmp_path):
    job = LocalJob()
    with pytest.raises(NotADirectoryError, match="is not a directory on the client"):
        job.remote_mount(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="mntpoint must be an absolute path"):
        job.remote_mount(str(tmp_path), mntpoint="rel")
    with pytest.raises(ValueError, match="python_exe is a path relative to the mount point"):
        job.remote_mount(str(tmp_path), python_exe="/usr/bin/python3")
    with pytest.raises(TypeError, match="unknown options backend"):
        job.remote_mount(str(tmp_path), backend="rdma")
    with pytest.raises(ValueError, match="remote_mount_point must be an absolute path"):
        job.gather_mount("out/$SUBDIR", str(tmp_path / "g"))
    job.remote_mount(str(tmp_path), mntpoint=str(tmp_path / "m"), meshes=["nope"])
    with pytest.raises(KeyError, match=r"names meshes \['nope'\].*its meshes are \['hosts'\]"):
        job.state(cached_path=None)


def test_kill_9_of_the_mount_process_unmounts(tmp_path):
    src, mnt = _src(tmp_path), tmp_path / "mnt"
    job = LocalJob().remote_mount(str(src), mntpoint=str(mnt), python_exe=None)
    state = job.state(cached_path=None)
    try:
        (mount,) = state.mounts
        fs_pids = _fs_pids(mnt)
        (pid,) = mount.pids
        os.kill(pid, signal.SIGKILL)
        took = _gone_within(mnt, 10)
        print(f"\nmount process SIGKILLed: unmounted after {took and took * 1000:.0f} ms")
        assert took is not None
        assert wait_gone([pid, *fs_pids], 10) == []
    finally:
        job.kill()


CLIENT = textwrap.dedent("""
    import sys
    from hpcmesh.job import LocalJob
    job = LocalJob().remote_mount(sys.argv[1], mntpoint=sys.argv[2], python_exe=None)
    job.state(cached_path=None)
    print("mounted", flush=True)
    sys.stdin.read()
""")


def test_a_client_killed_by_sigkill_leaves_no_mount_and_no_process(tmp_path):
    src, mnt = _src(tmp_path), tmp_path / "mnt"
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = dict(os.environ, HPCMESH_LEASE_GRACE="2")
    client = subprocess.Popen([sys.executable, str(script), str(src), str(mnt)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert client.stdout.readline().strip() == b"mounted"
        fs_pids = _fs_pids(mnt)
        assert fs_pids and mount_fstype(str(mnt)) == "fuse.hpcmesh"
        client.kill()
        client.wait()
        took = _gone_within(mnt, 20)
        assert took is not None, (
            f"still mounted 20 s after the client's SIGKILL (lease grace 2 s); its file "
            f"system's processes: {_states(fs_pids)}")
        print(f"\nclient SIGKILLed (lease grace 2 s): unmounted after {took * 1000:.0f} ms")
        assert wait_gone(fs_pids, 10) == []
    finally:
        if client.poll() is None:
            client.kill()


def test_gather_mount_shows_each_hosts_directory_read_only(tmp_path):
    local = tmp_path / "gathered"
    job = LocalJob().gather_mount(str(tmp_path / "out" / "$SUBDIR"), str(local))
    state = job.state(cached_path=None)
    try:
        assert os.listdir(local) == ["0"]               # this_host(): no dimensions
        assert os.listdir(local / "0") == []            # nothing written there yet
        procs = state.hosts.spawn_procs()
        procs.spawn("w", Reader).write.call_one(str(tmp_path / "out" / "0" / "log.txt"),
                                               "step 1\n").get(timeout=30)
        # the kernel caches the listing for a second: the file shows when that has expired
        wait_until((local / "0" / "log.txt").exists, 10, "the file shows in the mount")
        assert (local / "0" / "log.txt").read_text() == "step 1\n"
        with pytest.raises(OSError):
            (local / "0" / "log.txt").write_text("no")
        procs.stop().get(timeout=30)
    finally:
        job.kill()
    assert mount_fstype(str(local)) is None


def test_an_exit_action_unmounts_only_the_mount_it_names(tmp_path):
    """What an agent does once a mount's process is gone (runtime/process/exit_actions.py): the
    action names the mount's source, so a newer mount at the same path stays."""
    import json
    from hpcmesh.runtime.process.exit_actions import mounts_at, run_exit_actions
    src, mnt = _src(tmp_path), tmp_path / "mnt"
    job = LocalJob().remote_mount(str(src), mntpoint=str(mnt), python_exe=None)
    job.state(cached_path=None)
    try:
        ((fstype, source),) = mounts_at(str(mnt))
        assert fstype == "fuse.hpcmesh" and source.startswith("hpcmesh-")
        actions = tmp_path / "p.exit-actions"
        actions.write_text(json.dumps({"unmount": str(mnt), "source": "hpcmesh-other"}) + "\n")
        run_exit_actions(str(actions))
        assert mounts_at(str(mnt)) == [(fstype, source)] and not actions.exists()
        actions.write_text("not json\n" + json.dumps({"unmount": str(mnt), "source": source})
                           + "\n")
        run_exit_actions(str(actions))
        assert mounts_at(str(mnt)) == []
    finally:
        job.kill()
