"""remote_mount and gather_mount on a login node another user shares (issue 28, items 3 and
6). Each test performs the attack as a second local account (``other_user``) against a job
run by root, as a privileged service user would, and checks it no longer works.

- item 3: a mount point that another user made (a symlink in /tmp, a folder of theirs on the
  way to it) or re-pointed between two ``state()`` calls is refused, naming the path and
  what was found, and their "python" never runs;
- item 6: a folder gathered from a host never follows a symlink another user swapped in, and
  serves no link target that leads out of the folder, so a root-only file does not show
  through the client's mount.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import textwrap
import time

import pytest

from test_mounts import _venv                                 # skips/fails without FUSE

from hpcmesh.job import LocalJob
from hpcmesh.mounts.fuse_process import mount_fstype
from hpcmesh.runtime.process.exit_actions import unmount


@pytest.fixture
def shared_tmp():
    """A fresh name directly in /tmp (sticky, everybody's): where the README's example used
    to mount, and where another user can make a name first. Removed afterwards."""
    path = f"/tmp/hpcmesh-t28-{secrets.token_hex(4)}"
    yield path
    for p in (path, path + "-moved"):
        for mnt in (p, os.path.join(p, "mnt")):
            if mount_fstype(mnt):            # a mount whose server is gone is no isdir
                unmount(mnt)
        if os.path.islink(p):
            os.unlink(p)
        elif os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)


def _fake_python(other_user, folder: str) -> str:
    """``folder``/bin/python, made by the other user: a script that writes who ran it to a
    marker file of theirs. Returns the marker's path (absent while it never ran)."""
    marker = os.path.join(other_user.home, "ran-as")
    other_user.python(textwrap.dedent("""
        import os, sys
        folder, marker = sys.argv[1:]
        os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
        exe = os.path.join(folder, "bin", "python")
        with open(exe, "w") as f:
            f.write(f"#!/bin/sh\\nid -u > {marker}.$$ && mv {marker}.$$ {marker}\\nexit 1\\n")
        os.chmod(exe, 0o755)
        os.chmod(folder, 0o755)
    """), folder, marker)
    return marker


def _spawn_fails_or_runs(state) -> None:
    """Start a process of the mounted mesh (what the job's code does next); a start that
    fails is the expected end of an attack, not the test's failure."""
    procs = state.hosts.spawn_procs()
    try:
        procs.initialized.get(timeout=60)
    except Exception:  # noqa: BLE001 - the attacker's "python" is no hpcmesh worker
        pass
    finally:
        procs.stop().get(timeout=30)


def test_a_mount_point_another_user_made_a_symlink_is_refused(tmp_path, other_user,
                                                              shared_tmp):
    """The README's old example mounted at /tmp/venv. Another user makes that name first, a
    symlink to an empty folder of theirs: the mount lands in their folder; after the first
    state() they re-point the link at a folder with their own bin/python, and the next
    state()'s processes would start it as root."""
    venv = _venv(tmp_path)
    empty, evil = os.path.join(other_user.home, "empty"), os.path.join(other_user.home, "evil")
    marker = _fake_python(other_user, evil)
    other_user.python("import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], "
                      "0o777); os.symlink(sys.argv[1], sys.argv[2])", empty, shared_tmp)
    job = LocalJob().remote_mount(venv, mntpoint=shared_tmp, python_exe="bin/python")
    refused = None
    try:
        try:
            job.state(cached_path=None)
        except Exception as e:  # noqa: BLE001 - the fix refuses here
            refused = e
        # the attacker re-points their link, and the job goes on as it would
        other_user.python("import os, sys; os.symlink(sys.argv[1], sys.argv[2] + '.new'); "
                          "os.rename(sys.argv[2] + '.new', sys.argv[2])", evil, shared_tmp)
        if refused is None:
            try:
                _spawn_fails_or_runs(job.state(cached_path=None))
            except Exception as e:  # noqa: BLE001
                refused = e
    finally:
        job.kill()
    assert not os.path.exists(marker), (
        f"the other user's {evil}/bin/python ran as uid {open(marker).read().strip()}")
    assert refused is not None
    msg = str(refused)
    print(f"\nrefused: {msg}")
    assert shared_tmp in msg and "symlink" in msg and f"uid {other_user.uid}" in msg, msg
    assert mount_fstype(empty) is None and os.listdir(empty) == []


def test_a_mount_point_in_a_folder_of_another_user_is_refused(tmp_path, other_user,
                                                              shared_tmp):
    """Another user owns the folder the mount point is in: after the first state() they
    move it aside (the mount goes with it) and put one with their own bin/python in its
    place."""
    venv = _venv(tmp_path)
    other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o755)",
                      shared_tmp)
    mnt = os.path.join(shared_tmp, "mnt")
    job = LocalJob().remote_mount(venv, mntpoint=mnt, python_exe="bin/python")
    refused = marker = None
    try:
        try:
            job.state(cached_path=None)
        except Exception as e:  # noqa: BLE001 - the fix refuses here
            refused = e
        other_user.python("import os, sys; os.rename(sys.argv[1], sys.argv[1] + '-moved')",
                          shared_tmp)
        marker = _fake_python(other_user, mnt)
        if refused is None:
            try:
                _spawn_fails_or_runs(job.state(cached_path=None))
            except Exception as e:  # noqa: BLE001
                refused = e
    finally:
        job.kill()
    assert marker and not os.path.exists(marker), (
        f"the other user's {mnt}/bin/python ran as uid {open(marker).read().strip()}")
    assert refused is not None
    msg = str(refused)
    print(f"\nrefused: {msg}")
    assert shared_tmp in msg and f"owned by {other_user.name} (uid {other_user.uid})" in msg, msg


def test_a_mount_point_re_pointed_between_two_states_is_refused(tmp_path, other_user,
                                                                shared_tmp):
    """The first state() mounts at a folder of ours in /tmp; the user then moves that
    folder away (mv) and the other user, watching /tmp, takes the name with a symlink to a
    folder holding their mnt/bin/python. The next state() must check again before any
    process starts with that path."""
    venv = _venv(tmp_path)
    mnt = os.path.join(shared_tmp, "mnt")
    job = LocalJob().remote_mount(venv, mntpoint=mnt, python_exe="bin/python")
    evil = os.path.join(other_user.home, "evil")
    marker = _fake_python(other_user, os.path.join(evil, "mnt"))
    refused = None
    try:
        job.state(cached_path=None)
        assert mount_fstype(mnt) == "fuse.hpcmesh"
        made = os.lstat(shared_tmp)
        os.rename(shared_tmp, shared_tmp + "-moved")
        other_user.python("import os, sys; os.symlink(*sys.argv[1:])", evil, shared_tmp)
        try:
            _spawn_fails_or_runs(job.state(cached_path=None))
        except Exception as e:  # noqa: BLE001 - the fix refuses here
            refused = e
    finally:
        job.kill()
    assert not os.path.exists(marker), (
        f"the other user's {evil}/mnt/bin/python ran as uid {open(marker).read().strip()}")
    assert refused is not None
    msg = str(refused)
    print(f"\nrefused: {msg}")
    assert shared_tmp in msg and "symlink" in msg and f"uid {other_user.uid}" in msg, msg
    # the folders on the way to a missing mount point are made private
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (0, 0o700), \
        f"{shared_tmp} made with uid {made.st_uid}, mode {oct(made.st_mode)}"


def test_a_mounted_python_that_links_into_a_folder_of_another_user_is_refused(tmp_path,
                                                                              other_user):
    """The mounted tree's bin/python is a link out of the mount (as a venv's is) to a file
    in a folder another user owns: whatever they put there would start as the job's
    processes. A link out is followed only through root's and our own folders."""
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    theirs = os.path.join(other_user.home, "py")
    marker = _fake_python(other_user, theirs)
    os.symlink(os.path.join(theirs, "bin", "python"), src / "bin" / "python")
    mnt = tmp_path / "mnt"
    job = LocalJob().remote_mount(str(src), mntpoint=str(mnt), python_exe="bin/python")
    refused = None
    try:
        _spawn_fails_or_runs(job.state(cached_path=None))
    except Exception as e:  # noqa: BLE001 - the fix refuses here
        refused = e
    finally:
        job.kill()
    assert not os.path.exists(marker), (
        f"the other user's {theirs}/bin/python ran as uid {open(marker).read().strip()}")
    assert refused is not None
    msg = str(refused)
    print(f"\nrefused: {msg}")
    assert f"the interpreter bin/python under the mount point {mnt}" in msg, msg
    assert (f"{other_user.home} is a folder owned by {other_user.name} (uid {other_user.uid})"
            in msg), msg
    assert f"mnt/bin/python -> {theirs}/bin/python" in msg, msg


def test_a_mount_point_that_no_longer_holds_our_mount_is_refused(tmp_path, shared_tmp):
    """The check is by the mount's device and inode, not by the path: a folder of our own
    at the same path (the mount moved away) is not our mount either."""
    venv = _venv(tmp_path)
    mnt = os.path.join(shared_tmp, "mnt")
    job = LocalJob().remote_mount(venv, mntpoint=mnt, python_exe="bin/python")
    try:
        job.state(cached_path=None)
        os.rename(shared_tmp, shared_tmp + "-moved")
        os.makedirs(os.path.join(mnt, "bin"), mode=0o700)
        shutil.copy("/bin/true", os.path.join(mnt, "bin", "python"))
        with pytest.raises(Exception) as e:
            job.state(cached_path=None)
    finally:
        job.kill()
    print(f"\nrefused: {e.value}")
    assert f"the mount point {mnt}" in str(e.value) and "not the mount" in str(e.value), \
        str(e.value)


def _readlink_when_cached_expired(path: str, timeout: float = 10.0) -> str:
    """readlink of a name the kernel may still hold as the folder it was (EINVAL until its
    cached attributes expire, ATTR_TIMEOUT); what it raises then, as 'errno N'."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.readlink(path)
        except OSError as e:
            if e.errno != errno.EINVAL or time.monotonic() > deadline:
                return f"errno {e.errno}"
            time.sleep(0.05)


def _gathered_with_a_folder_of_theirs(shared_tmp: str, other_user) -> tuple[str, str]:
    """``shared_tmp``/secret (root's, 0700, holding key.txt) and the folder ``shared`` of the
    other user's inside ``shared_tmp``/out/0, the host's folder a gather_mount of
    ``shared_tmp``/out/$SUBDIR shows: (the secret folder, their folder)."""
    os.mkdir(shared_tmp, 0o755)
    secret = os.path.join(shared_tmp, "secret")
    os.mkdir(secret, 0o700)
    with open(os.path.join(secret, "key.txt"), "w") as f:
        f.write("root's secret\n")
    theirs = os.path.join(shared_tmp, "out", "0", "shared")   # this_host(): no dimensions
    os.makedirs(theirs)
    other_user.own(theirs)
    return secret, theirs


def test_gather_mount_does_not_follow_a_symlink_another_user_swapped_in(other_user,
                                                                         shared_tmp):
    """The host's gathered folder holds a folder the other user owns. The client holds one of
    its subfolders open through its mount; the other user then swaps that subfolder on the
    host for a symlink to a folder only root may read. A name opened in the held folder must
    not be served from root's folder by the host (it was, before: the host followed the
    link). The other user cannot enter the client's mount at all (no allow_other)."""
    secret, theirs = _gathered_with_a_folder_of_theirs(shared_tmp, other_user)
    os.mkdir(os.path.join(theirs, "sub"))
    other_user.own(os.path.join(theirs, "sub"))
    local = os.path.join(shared_tmp, "gathered")
    job = LocalJob().gather_mount(os.path.join(shared_tmp, "out", "$SUBDIR"), local)
    job.state(cached_path=None)
    try:
        # the file is root's: the other user cannot read it directly, nor enter our mount
        direct = other_user.python("open(__import__('sys').argv[1]).read()",
                                   os.path.join(secret, "key.txt"), check=False)
        assert "PermissionError" in direct.stderr, direct
        peek = other_user.python("import os, sys; os.listdir(sys.argv[1])", local,
                                 check=False)
        assert "PermissionError" in peek.stderr, peek
        held = os.open(os.path.join(local, "0", "shared", "sub"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            other_user.python(textwrap.dedent("""
                import os, sys
                host_sub, secret = sys.argv[1:]
                os.rename(host_sub, host_sub + ".old")
                os.symlink(secret, host_sub)       # a symlink to root's folder from here on
            """), os.path.join(theirs, "sub"), secret)
            try:
                fd = os.open("key.txt", os.O_RDONLY, dir_fd=held)
            except OSError as e:
                got = f"REFUSED {e.errno} {e.strerror}"
            else:
                with os.fdopen(fd) as f:
                    got = "READ " + f.read()
        finally:
            os.close(held)
        print(f"\nkey.txt in the held folder after the swap: {got.strip()}")
        assert "root's secret" not in got, got
        assert got.startswith("REFUSED"), got
        # what the client's mount shows of the link, once the kernel's cached folder
        # expires: a link whose target (absolute: a path of the client's) is not given
        assert _readlink_when_cached_expired(os.path.join(local, "0", "shared", "sub")) \
            == f"errno {errno.EACCES}"
    finally:
        job.kill()
    assert mount_fstype(local) is None


def test_gather_mount_serves_no_link_out_of_the_gathered_folder(other_user, shared_tmp):
    """The other user plants links in a folder of theirs under the gathered one, to a file
    only root may read on the client: absolute, climbing out with '..', and climbing out
    through a link of theirs that leads to the folder's top (``a/top -> ../..``, then
    ``../a/top/../../secret``, which reads as a name under the folder). The client, root,
    reads each link through its mount and copies the folder following links
    (``shutil.copytree``): root's file must not come through, links that stay inside work."""
    secret, theirs = _gathered_with_a_folder_of_theirs(shared_tmp, other_user)
    local = os.path.join(shared_tmp, "gathered")          # so local/.. is shared_tmp
    other_user.python(textwrap.dedent("""
        import os, sys
        theirs, secret = sys.argv[1:]
        os.mkdir(os.path.join(theirs, "a"))
        os.symlink("../..", os.path.join(theirs, "a", "top"))    # the gathered folder
        b = os.path.join(theirs, "b")
        os.mkdir(b)
        with open(os.path.join(b, "data.txt"), "w") as f:
            f.write("theirs\\n")
        for name, target in (("absolute", secret + "/key.txt"),
                             ("climbs", "../../../../secret/key.txt"),
                             ("through", "../a/top/../../secret/key.txt"),
                             ("fine", "data.txt"), ("fine_up", "../b/data.txt")):
            os.symlink(target, os.path.join(b, name))
    """), theirs, secret)
    job = LocalJob().gather_mount(os.path.join(shared_tmp, "out", "$SUBDIR"), local)
    job.state(cached_path=None)
    try:
        mine = os.path.join(local, "0", "shared", "b")
        seen = {}
        for name in ("absolute", "climbs", "through", "fine", "fine_up"):
            try:
                with open(os.path.join(mine, name)) as f:
                    seen[name] = f.read()
            except OSError as e:
                seen[name] = f"errno {e.errno}"
        copy = os.path.join(shared_tmp, "copy")
        with pytest.raises(shutil.Error) as err:
            shutil.copytree(mine, copy)
        copied = {}
        for name in os.listdir(copy):
            with open(os.path.join(copy, name)) as f:
                copied[name] = f.read()
    finally:
        job.kill()
    print(f"\nread through the mount: {seen}\ncopied: {copied}\ncopytree: {err.value}")
    assert "root's secret\n" not in list(seen.values()) + list(copied.values())
    refused = f"errno {errno.EACCES}"
    assert seen == {"absolute": refused, "climbs": refused, "through": refused,
                    "fine": "theirs\n", "fine_up": "theirs\n"}, seen
    assert copied == {"data.txt": "theirs\n", "fine": "theirs\n", "fine_up": "theirs\n"}, \
        copied
    assert sorted(os.path.basename(src) for src, _, _ in err.value.args[0]) == [
        "absolute", "climbs", "through"], err.value
    assert mount_fstype(local) is None


def test_which_link_targets_stay_inside():
    from hpcmesh.mounts.fuse_gather import link_stays_inside
    inside = [("f", "l"), ("d/f", "l"), ("./f", "l"), (".", "l"), ("..", "a/l"),
              ("../b/f", "a/l"), ("../../x", "a/b/l"), ("a//b/", "l")]
    out = [("/etc/passwd", "l"), ("..", "l"), ("../x", "l"), ("../../x", "a/l"),
           ("a/../../x", "l"), ("a/..", "l"), ("x/../f", "d/l"), ("", "l")]
    assert [link_stays_inside(t, p) for t, p in inside] == [True] * len(inside)
    assert [link_stays_inside(t, p) for t, p in out] == [False] * len(out)


def test_the_walks_refuse_what_another_user_could_redirect(tmp_path, other_user):
    """The walks on their own (``private_files.walk``): names under a gathered root never
    follow a link or climb out; a walk checks every folder and link outside a trusted root,
    loops end in ELOOP; a missing mount point is made 0700 with the folders on the way."""
    from hpcmesh.mounts.fuse_process import open_mount_point
    from hpcmesh.mounts.gather import beneath
    from hpcmesh.private_files import UntrustedPathError, walk
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "f").write_text("x")
    os.symlink("dir", root / "link")
    os.symlink("loop", root / "loop")
    with walk(str(root), what="t") as top:
        with beneath(top, "dir/f", "t") as (d, name):
            assert os.stat(name, dir_fd=d).st_size == 1
        with beneath(top, "link", "t") as (d, name):     # the link itself, as a link
            assert os.readlink(name, dir_fd=d) == "dir"
        with pytest.raises(NotADirectoryError):
            with beneath(top, "link/f", "t"):
                pass
        with pytest.raises(PermissionError, match="climbs out"):
            with beneath(top, "dir/../../x", "t"):
                pass
    with walk(str(root / "link" / "f"), what="t") as r:
        assert r.path == str(root / "dir" / "f")
    with pytest.raises(OSError) as e:
        with walk(str(root / "loop"), what="t"):
            pass
    assert e.value.errno == errno.ELOOP
    with walk(str(root), what="t") as top:                     # ".." out of a trusted root
        with walk("../root/dir/f", what="t", start=top, way=None) as r:
            assert r.path == str(root / "dir" / "f")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    other_user.own(str(theirs))
    with pytest.raises(UntrustedPathError, match=f"{theirs} is a folder owned by "
                                                 f"{other_user.name} \\(uid {other_user.uid}\\)"):
        with walk(str(theirs / "x"), what="t"):
            pass
    with open_mount_point(str(tmp_path / "new" / "mnt"), "t", create=True) as d:
        assert stat.S_IMODE(d.st.st_mode) == 0o700 and d.st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
