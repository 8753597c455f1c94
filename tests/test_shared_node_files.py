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

def hpcmesh_env(**extra: str) -> dict[str, str]:
    """The environment of an hpcmesh subprocess: this checkout, no inherited state folder,
    context or runtime folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPCMESH_CONTEXT", "HPCMESH_STATE_DIR", "XDG_RUNTIME_DIR", "TMPDIR")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


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
