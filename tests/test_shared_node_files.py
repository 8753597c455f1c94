"""Another user of a shared login node against the files hpcmesh trusts (issue 28, items 2
and 4; SPEC §7): the job cache in a project's ``.hpcmesh`` and the per-user runtime folder.

Each test performs the attack as a second local account (the ``other_user`` fixture) and
checks that it no longer works: no code of theirs runs, nothing of ours is written where
they point, and the refusal names the path, its owner and its mode. The job's user is root
(this test process), as a privileged service account would be. The CLI and the runtime run
in subprocesses with their own cwd, ``TMPDIR`` and ``XDG_RUNTIME_DIR``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: run by the attacker (Debian's python3): a pickle whose loading runs `touch MARKER`
PLANT_PICKLE = textwrap.dedent("""
    import os, pickle, sys
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + sys.argv[2],))
    os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
    with open(sys.argv[1], "wb") as f:
        pickle.dump(Payload(), f)
""")


def hpcmesh_env(**extra: str) -> dict[str, str]:
    """The environment of an hpcmesh subprocess: this checkout, no inherited state folder,
    context or runtime folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPCMESH_CONTEXT", "HPCMESH_STATE_DIR", "XDG_RUNTIME_DIR", "TMPDIR")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def hm(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcmesh", *args], cwd=cwd,
                          env=hpcmesh_env(**env), capture_output=True, text=True, timeout=60)


@pytest.fixture
def shared_dir():
    """Folders another user can reach, as a shared project folder or /tmp is: made in /tmp
    (pytest's tmp_path is 0700 root), removed afterwards with whatever was planted."""
    made: list[str] = []

    def make(mode: int) -> Path:
        d = tempfile.mkdtemp(prefix="hpcmesh-shared-", dir="/tmp")
        os.chmod(d, mode)
        made.append(d)
        return Path(d)

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def plant_cache(user, project: Path, how: str, marker: Path) -> None:
    """Put a code-running pickle where ``project``'s job cache is read from, as ``user``:
    ``folder``: their own ``.hpcmesh`` (a shared project folder, /tmp as the cwd);
    ``link``: ``.hpcmesh`` as their symlink to their own folder;
    ``into-ours``: our ``.hpcmesh`` was made group/world-writable (a checkout with umask 0)
    and they point its links at their pickle in their home."""
    evil = os.path.join(user.home, "evil", "state.pkl")
    user.python(PLANT_PICKLE, evil, str(marker))
    hp = project / ".hpcmesh"
    if how == "folder":
        user.python(PLANT_PICKLE, str(hp / "default" / "state.pkl"), str(marker))
        user.python("import os, sys; os.symlink('default/state.pkl', sys.argv[1])",
                    str(hp / "job_state.pkl"))
    elif how == "link":
        user.python("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                    os.path.dirname(evil), str(hp))
        user.python("import os, sys; os.mkdir(sys.argv[1]);"
                    "os.symlink(sys.argv[2], os.path.join(sys.argv[1], 'state.pkl'));"
                    "os.symlink('default/state.pkl', sys.argv[3])",
                    os.path.join(os.path.dirname(evil), "default"), evil,
                    os.path.join(os.path.dirname(evil), "job_state.pkl"))
    else:
        (hp / "default").mkdir(parents=True)
        os.chmod(hp, 0o777)
        os.chmod(hp / "default", 0o777)
        for name in ("job_state.pkl", "default/state.pkl"):
            user.python("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", evil,
                        str(hp / name))


def assert_refused(text: str, project: Path, user, how: str) -> None:
    """The refusal names the path, its owner and its mode."""
    assert "refusing the job cache" in text, text
    assert str(project / ".hpcmesh") in text, text
    if how == "into-ours":
        assert "owned by root (uid 0), mode 0777" in text, text
    else:
        assert f"owned by {user.name} (uid {user.uid})" in text, text
        assert ("a symlink" if how == "link" else "a folder") in text, text


SHARED_MODES = {"folder": 0o777, "link": 0o1777, "into-ours": 0o755}


def attempt(fn):
    """What ``fn()`` raised (None if nothing): the test looks at what the attack did
    before it looks at the error."""
    try:
        fn()
    except PermissionError as e:
        return e
    return None


@pytest.mark.parametrize("how", ["folder", "link", "into-ours"])
@pytest.mark.parametrize("command", ["status", "kill"])
def test_planted_job_cache_is_not_loaded_by_status_or_kill(other_user, shared_dir, tmp_path,
                                                           command, how):
    # issue 28 item 2: `hpcmesh status`/`kill` unpickled .hpcmesh/ from the cwd, whoever
    # made it; the marker is what the other user's code would have done as root
    project = shared_dir(SHARED_MODES[how])
    marker = tmp_path / "ran-their-code"
    plant_cache(other_user, project, how, marker)
    r = hm(command, cwd=project)
    assert not marker.exists(), f"`hpcmesh {command}` ran the planted pickle"
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert_refused(r.stderr, project, other_user, how)


@pytest.mark.parametrize("how", ["folder", "link", "into-ours"])
def test_planted_job_cache_is_not_loaded_by_state(other_user, shared_dir, tmp_path,
                                                  monkeypatch, how):
    from hpcmesh.job import LocalJob
    project = shared_dir(SHARED_MODES[how])
    marker = tmp_path / "ran-their-code"
    plant_cache(other_user, project, how, marker)
    evil = Path(other_user.home) / "evil" / "state.pkl"
    before = evil.read_bytes()
    monkeypatch.chdir(project)
    refused = attempt(lambda: LocalJob().state())
    assert not marker.exists(), "LocalJob().state() ran the planted pickle"
    assert evil.read_bytes() == before, "our job was written where they point"
    assert refused is not None, "LocalJob().state() used the planted cache"
    assert_refused(str(refused), project, other_user, how)


@pytest.mark.parametrize("where", ["their-folder", "our-open-folder"])
def test_dump_through_a_planted_symlink_leaves_its_target_alone(other_user, shared_dir,
                                                                tmp_path, monkeypatch, where):
    # issue 28 item 2: dump() followed a symlink another user put at the cache's path and
    # replaced the root-only file it named
    from hpcmesh.job import LocalJob
    precious = tmp_path / "root-only.conf"       # in a 0700 folder of root's
    precious.write_text("precious\n")
    os.chmod(precious, 0o600)
    project = shared_dir(0o1777 if where == "their-folder" else 0o755)
    hp = project / ".hpcmesh"
    if where == "our-open-folder":
        hp.mkdir()
        os.chmod(hp, 0o777)
        other_user.python("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                          str(precious), str(hp / "job_state.pkl"))
    else:
        other_user.python("import os, sys; os.mkdir(sys.argv[2]);"
                          "os.symlink(sys.argv[1], os.path.join(sys.argv[2], 'job_state.pkl'))",
                          str(precious), str(hp))
    monkeypatch.chdir(project)
    job = LocalJob()
    job.apply()
    refused = [attempt(lambda: job.dump(".hpcmesh/job_state.pkl")),
               attempt(lambda: LocalJob().state())]
    assert precious.read_bytes() == b"precious\n", "dump() wrote through their link"
    assert os.stat(precious).st_uid == 0 and (os.stat(precious).st_mode & 0o777) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["root-only.conf"]    # no temporary file beside it
    for e in refused:
        assert e is not None and "refusing the job cache" in str(e), e
        assert str(hp) in str(e), e


# -- the runtime folder (issue 28 item 4) ------------------------------------------------------
START_RUNTIME = textwrap.dedent("""
    from hpcmesh.actor import this_host
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    print("started", procs)
""")


def test_runtime_folder_another_user_made_first_is_refused(other_user, shared_dir):
    # /tmp/hpcmesh-<uid> made 0777 by another user was used silently: they could delete the
    # job's sockets, or plant files in it
    tmp = shared_dir(0o1777)              # what /tmp is; TMPDIR points the process at it
    rt = tmp / f"hpcmesh-{os.geteuid()}"
    other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
                      str(rt))
    r = subprocess.run([sys.executable, "-c", START_RUNTIME], env=hpcmesh_env(TMPDIR=str(tmp)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "started" not in r.stdout, r.stdout
    assert os.listdir(rt) == [], "the job put its sockets in the other user's folder"
    assert (f"refusing the runtime folder {rt}: it is a folder owned by {other_user.name} "
            f"(uid {other_user.uid}), mode 0777") in r.stderr, r.stderr
    assert "set TMPDIR to a folder of this user's" in r.stderr


PLANTED_STACKS = textwrap.dedent("""
    import os, sys
    from hpcmesh.runtime.introspect import STACK_SIGNAL, install_stack_dump_handler
    print(os.getpid(), flush=True)
    sys.stdin.readline()                   # the other user plants the link now
    if install_stack_dump_handler():
        print("installed", flush=True)
        os.kill(os.getpid(), STACK_SIGNAL)     # what the admin view asks: a dump, now
    else:                                      # (unhandled, the signal would end us)
        print("refused", flush=True)
""")


def test_planted_stack_file_link_gets_no_stack_dump(other_user, shared_dir, tmp_path):
    # a planted stacks-<pid>.txt symlink made a stack dump append to a root-only file
    precious = tmp_path / "root-only.log"
    precious.write_text("precious\n")
    tmp = shared_dir(0o1777)
    rt = tmp / f"hpcmesh-{os.geteuid()}"
    other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
                      str(rt))
    p = subprocess.Popen([sys.executable, "-c", PLANTED_STACKS],
                         env=hpcmesh_env(TMPDIR=str(tmp)), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(p.stdout.readline())
        other_user.python("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                          str(precious), str(rt / f"stacks-{pid}.txt"))
        out, err = p.communicate("go\n", timeout=60)
    finally:
        p.kill()
        p.wait()
    assert precious.read_bytes() == b"precious\n", "the stack dump went into their link"
    assert p.returncode == 0 and out.split() == ["refused"], (out, err)
