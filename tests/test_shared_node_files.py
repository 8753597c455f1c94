"""Another user of a shared login node against the files hpcmesh trusts (issue 28, items 2
and 4; SPEC §7): the job cache in a project's ``.hpcmesh``, the per-user runtime folder,
the job secret, the logs and exit actions of the host agent, and the services file.

Each test performs the attack as a second local account (the ``other_user`` fixture) and
checks that it no longer works: no code of theirs runs, nothing of ours is written where
they point, and the refusal names the path, its owner and its mode. The job's user is root
(this test process), as a privileged service account would be. The CLI and the runtime run
in subprocesses with their own cwd, ``TMPDIR`` and ``XDG_RUNTIME_DIR``.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import types
import uuid
from pathlib import Path

import pytest
from ci_gate import import_or_skip

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
           if k not in ("HPCMESH_CONTEXT", "HPCMESH_STATE_DIR", "XDG_RUNTIME_DIR", "TMPDIR",
                        "HPCMESH_RUNTIME_DIR")}
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
    """The refusal names the path, its owner and its mode, and the way out: make ours
    trusted again, or remove theirs."""
    hp = project / ".hpcmesh"
    assert "refusing the job cache" in text, text
    assert str(hp) in text, text
    if how == "into-ours":
        assert "owned by root (uid 0), mode 0777" in text, text
        assert f"`chmod -R go-w {hp}` makes it trusted" in text, text
    else:
        assert f"owned by {user.name} (uid {user.uid})" in text, text
        assert ("a symlink" if how == "link" else "a folder") in text, text
        assert f"`rm {'' if how == 'link' else '-r '}{hp}`, as its owner or root, removes it" \
            in text, text


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


# -- the modules of the current folder (`hpcmesh apply mod.attr`; issue 28 review) -------------
#: the user's own job spec module, in the folder they run `hpcmesh` from
OUR_JOBS = textwrap.dedent("""
    import sys, sysconfig
    import helper                    # our own module beside it: found as python -m finds it
    print("sysconfig from", sysconfig.__file__, file=sys.stderr)
    from hpcmesh.job import LocalJob
    local = LocalJob()
""")
#: run by the attacker: write sys.argv[2] (Python that touches the marker) to sys.argv[1]
PLANT_FILE = "import os, sys; open(sys.argv[1], 'w').write(sys.argv[2])"
#: the two ways to run the command: the installed `hpcmesh` (no folder of its own on
#: sys.path: what -P gives) and `python -m hpcmesh` (Python puts the current folder first)
RUN = {"hpcmesh": [sys.executable, "-P", "-m", "hpcmesh"],
       "python -m": [sys.executable, "-m", "hpcmesh"]}


def touch(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')\n"


def stamped_pyc(source: Path, code: str) -> bytes:
    """Bytecode of ``code`` stamped with ``source``'s mtime and size: what Python's own
    loader takes from ``__pycache__`` for ``source`` without reading the source."""
    st = source.stat()
    return (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
            + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            + marshal.dumps(compile(code, str(source), "exec")))


@pytest.mark.parametrize("run", list(RUN))
def test_modules_planted_in_the_current_folder_shadow_nothing(other_user, shared_dir, tmp_path,
                                                              run):
    # `hpcmesh apply`/`exec` put the current folder first on sys.path: another user's
    # sysconfig.py in /tmp (or in a shared project folder) ran as root when root ran them
    # there, and so did bytecode they put in __pycache__ for our own module
    project = shared_dir(0o1777)
    (project / "myjobs.py").write_text(OUR_JOBS)
    (project / "helper.py").write_text("")
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(project / "sysconfig.py"), touch(marker))
    pyc = importlib.util.cache_from_source(str(project / "myjobs.py"))
    other_user.python("import os, sys; os.mkdir(os.path.dirname(sys.argv[1]));"
                      "open(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))",
                      pyc, stamped_pyc(project / "myjobs.py", touch(marker) + OUR_JOBS).hex())

    def hm_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*RUN[run], *args], cwd=project, env=hpcmesh_env(),
                              capture_output=True, text=True, timeout=120)
    try:
        r = hm_("apply", "myjobs.local")
        assert not marker.exists(), f"apply ({run}) ran the other user's code"
        assert r.returncode == 0, r.stderr
        assert f"sysconfig from {sysconfig.__file__}" in r.stderr
        r = hm_("exec", "--", "true")
        assert not marker.exists(), f"exec ({run}) ran the other user's code"
        assert r.returncode == 0, r.stderr
    finally:
        hm_("kill")


def test_a_job_spec_module_another_user_planted_is_refused(other_user, shared_dir, tmp_path):
    # in /tmp, `hpcmesh apply myjobs.local` imported whatever myjobs.py was there
    project = shared_dir(0o1777)
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(project / "myjobs.py"), touch(marker) + OUR_JOBS)
    r = subprocess.run([*RUN["hpcmesh"], "apply", "myjobs.local"], cwd=project,
                       env=hpcmesh_env(), capture_output=True, text=True, timeout=60)
    assert not marker.exists(), "`hpcmesh apply` ran the other user's module"
    assert r.returncode == 2, (r.stdout, r.stderr)
    theirs = project / "myjobs.py"
    assert (f"refusing to import {theirs}: it is a file owned by {other_user.name} "
            f"(uid {other_user.uid}), mode 0644") in r.stderr, r.stderr
    assert f"`rm {theirs}`, as its owner or root, removes it" in r.stderr


def test_a_job_spec_module_in_a_folder_others_can_write_is_refused(shared_dir, tmp_path):
    # our own module, but in a folder everybody may write (not sticky): anybody could have
    # replaced it, or could replace it between a check and the import
    project = shared_dir(0o777)
    marker = tmp_path / "ran"
    (project / "myjobs.py").write_text(touch(marker) + OUR_JOBS)
    (project / "helper.py").write_text("")
    r = subprocess.run([*RUN["hpcmesh"], "apply", "myjobs.local"], cwd=project,
                       env=hpcmesh_env(), capture_output=True, text=True, timeout=60)
    assert not marker.exists() and r.returncode == 2, (r.stdout, r.stderr)
    assert (f"refusing to import 'myjobs' from {project / 'myjobs.py'}: {project} is a folder "
            f"owned by root (uid 0), mode 0777") in r.stderr, r.stderr
    assert f"`chmod -R go-w {project}` makes it trusted" in r.stderr


#: the user's program, run (as root) with the shared folder as its current folder: actors
#: on processes started every way hpcmesh starts them import the standard library's
#: ``sysconfig`` and the user's own ``helper`` beside the program's current folder
WORKERS_IMPORT = textwrap.dedent("""
    import os, sys
    from hpcmesh.actor import Actor, default_bootstrap_cmd, endpoint, this_host
    from hpcmesh.job import ProcessJob

    class Probe(Actor):
        @endpoint
        def imports(self):
            import sysconfig
            import helper            # the user's own module in the current folder
            return sysconfig.__file__, helper.WHO, os.getcwd()

    job = ProcessJob({"hosts": 1})   # a host agent of its own: `python -m hpcmesh worker`
    ways = {"forked": this_host().spawn_procs(per_host={"gpus": 1}),
            # a PYTHON* variable the fork server was not started with: a plain exec
            "execd": this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=
                default_bootstrap_cmd().with_env({"PYTHONHASHSEED": "7"})),
            "agent": job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 1})}
    try:
        for way, procs in ways.items():
            for found in procs.spawn("probe", Probe).imports.call().get(timeout=60).values():
                print(way, *found, flush=True)
    finally:
        for procs in ways.values():
            procs.stop().get(timeout=30)
        job.kill()
""")


def test_workers_started_in_a_shared_folder_run_nothing_planted_there(other_user, shared_dir,
                                                                      tmp_path):
    # every Python hpcmesh starts with `-m` (actor processes, the fork server, host agents)
    # had its current folder first on sys.path: another user's sysconfig.py in /tmp ran as
    # root in the workers of a program started there, and so did their bytecode in
    # __pycache__ for the user's own module, and their hpcmesh/ in `python -m hpcmesh worker`
    project = shared_dir(0o1777)
    (project / "helper.py").write_text("WHO = 'our source'\n")
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(project / "sysconfig.py"), touch(marker))
    other_user.python("import os, sys; os.mkdir(os.path.dirname(sys.argv[1]))\n" + PLANT_FILE,
                      str(project / "hpcmesh" / "__init__.py"), touch(marker))
    pyc = importlib.util.cache_from_source(str(project / "helper.py"))
    other_user.python("import os, sys; os.mkdir(os.path.dirname(sys.argv[1]));"
                      "open(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))", pyc,
                      stamped_pyc(project / "helper.py",
                                  touch(marker) + "WHO = 'their bytecode'\n").hex())
    program = tmp_path / "program.py"          # the program itself lives in a folder of ours
    program.write_text(WORKERS_IMPORT)
    r = subprocess.run([sys.executable, str(program)], cwd=project, env=hpcmesh_env(),
                       capture_output=True, text=True, timeout=180)
    assert not marker.exists(), "a worker ran the other user's code"
    assert r.returncode == 0, r.stderr[-3000:]
    found = sorted(tuple(line.split()) for line in r.stdout.splitlines())
    stdlib = sysconfig.__file__
    assert found == [(way, stdlib, "our", "source", str(project))
                     for way in ("agent", "execd", "forked")], (found, r.stderr[-3000:])


#: the user's module that `exec_python(hosts, "ourmod", ...)` runs in a shared folder
EXEC_MODULE = textwrap.dedent("""
    import sys, sysconfig
    import helper                    # our own module beside it
    print(__name__, sys.argv[0], *sys.argv[1:], sysconfig.__file__, helper.WHO)
""")


def test_exec_python_runs_our_module_of_a_shared_folder_and_nothing_planted_there(
        other_user, shared_dir, tmp_path):
    # exec_python ran `python -m ourmod` in the working directory: the other user's
    # sysconfig.py there, their bytecode for our module in __pycache__, or a module of theirs
    # ran as root. Both ways it runs: streamed (on_output) and into files (output_dir).
    from hpcmesh.actor import this_host
    from hpcmesh.job.exec import exec_python
    project = shared_dir(0o1777)
    (project / "ourmod.py").write_text(EXEC_MODULE)
    (project / "helper.py").write_text("WHO = 'ours'\n")
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(project / "sysconfig.py"), touch(marker))
    other_user.python(PLANT_FILE, str(project / "theirmod.py"), touch(marker))
    pyc = importlib.util.cache_from_source(str(project / "ourmod.py"))
    other_user.python("import os, sys; os.mkdir(os.path.dirname(sys.argv[1]));"
                      "open(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))", pyc,
                      stamped_pyc(project / "ourmod.py", touch(marker) + EXEC_MODULE).hex())
    lines: list[tuple[str, str]] = []

    def collect(_label: str, stream: str, line: str) -> None:
        lines.append((stream, line))
    streamed = exec_python(this_host(), "ourmod", ["x", "y"], workdir=str(project),
                           on_output=collect).get(timeout=60)
    out = tmp_path / "out"
    to_files = exec_python(this_host(), "ourmod", ["x", "y"], workdir=str(project),
                           output_dir=str(out)).get(timeout=60)
    assert not marker.exists(), "exec_python ran the other user's code"
    ran = f"__main__ {project / 'ourmod.py'} x y {sysconfig.__file__} ours"
    assert (streamed, lines) == (0, [("stdout", ran)])
    assert to_files == 0 and [p.read_text() for p in out.glob("*.stdout")] == [ran + "\n"]
    lines.clear()
    assert exec_python(this_host(), "theirmod", workdir=str(project),
                       on_output=collect).get(timeout=60) == 1
    assert not marker.exists(), "exec_python ran the other user's module"
    theirs = project / "theirmod.py"
    assert any(f"refusing to import {theirs}: it is a file owned by {other_user.name}" in line
               for _stream, line in lines), lines


#: the user's script that `exec_python(hosts, "train.py")` runs in a shared folder
EXEC_SCRIPT = textwrap.dedent("""
    import sys, json
    import helper                    # our own module beside it
    print(__name__, __file__, *sys.argv[1:], json.__file__, helper.WHO)
""")


def test_exec_python_runs_our_script_of_a_shared_folder_and_nothing_planted_there(
        other_user, shared_dir, tmp_path):
    # `python train.py` puts the script's folder first on sys.path: the other user's json.py
    # beside our script in /tmp ran as root; so did it for a script named '-x.py'
    import json
    from hpcmesh.actor import this_host
    from hpcmesh.job.exec import exec_python
    project = shared_dir(0o1777)
    for script in ("train.py", "-dash.py"):
        (project / script).write_text(EXEC_SCRIPT)
    (project / "helper.py").write_text("WHO = 'ours'\n")
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(project / "json.py"), touch(marker))
    lines: list[tuple[str, str]] = []

    def collect(_label: str, stream: str, line: str) -> None:
        lines.append((stream, line))
    streamed = exec_python(this_host(), "train.py", ["x"], workdir=str(project),
                           on_output=collect).get(timeout=60)
    out = tmp_path / "out"
    to_files = exec_python(this_host(), "-dash.py", ["y"], workdir=str(project),
                           output_dir=str(out)).get(timeout=60)
    assert not marker.exists(), "exec_python ran the other user's json.py"
    assert (streamed, lines) == (0, [("stdout", f"__main__ train.py x {json.__file__} ours")])
    assert to_files == 0 and [p.read_text() for p in out.glob("*.stdout")] == [
        f"__main__ ./-dash.py y {json.__file__} ours\n"]


def test_exec_python_of_a_module_name_never_runs_a_file_of_that_name(other_user, shared_dir,
                                                                      tmp_path):
    """A file another user names like a module (``mypkg.train``, ``json.tool``) in a shared
    working folder: the name is still a module's (decided by the name alone), so their file
    does not run as a script, on either path."""
    from hpcmesh.actor import this_host
    from hpcmesh.job.exec import exec_python
    project = shared_dir(0o1777)
    marker = tmp_path / "ran-their-code"
    for name in ("mypkg.train", "json.tool"):
        other_user.python(PLANT_FILE, str(project / name), touch(marker))
    lines: list[tuple[str, str]] = []
    code = exec_python(this_host(), "mypkg.train", workdir=str(project),
                       on_output=lambda _l, stream, line: lines.append((stream, line))
                       ).get(timeout=60)
    out = tmp_path / "out"
    json_tool = exec_python(this_host(), "json.tool", ["--help"], workdir=str(project),
                            output_dir=str(out)).get(timeout=60)
    assert not marker.exists(), "exec_python ran the other user's file as a script"
    assert code == 1 and any("No module named 'mypkg'" in line for _s, line in lines), lines
    assert json_tool == 0 and "usage" in "".join(p.read_text() for p in out.glob("*.stdout"))


def import_error(name: str) -> ImportError | None:
    """What ``import name`` raised (None if it worked): the test looks at what the attack
    did before it looks at the error."""
    import importlib
    try:
        importlib.import_module(name)
    except ImportError as e:
        return e
    return None


@pytest.fixture
def fresh_imports():
    """Finders and modules a test adds in this process, removed afterwards."""
    finders, modules = list(sys.meta_path), set(sys.modules)
    yield
    sys.meta_path[:] = finders
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_a_folder_above_the_current_one_that_another_user_owns_is_refused(
        other_user, shared_dir, tmp_path, fresh_imports):
    # the folder above ours was theirs: after `import pkg` they renamed ours away, put their
    # own in its place, and `import pkg.jobs.trainers` ran their trainers.py as root
    import importlib
    from hpcmesh.private_files.modules import import_from_folder
    above = shared_dir(0o755)
    other_user.own(str(above))
    ours = above / "alice"
    (ours / "t28h1_pkg" / "jobs").mkdir(parents=True)
    (ours / "t28h1_pkg" / "__init__.py").write_text("")
    (ours / "t28h1_pkg" / "jobs" / "__init__.py").write_text("")
    (ours / "t28h1_pkg" / "jobs" / "trainers.py").write_text("WHO = 'ours'\n")
    marker = tmp_path / "ran-their-code"
    import_from_folder(str(ours))
    refused = import_error("t28h1_pkg")
    other_user.python("import os, sys; os.rename(sys.argv[1], sys.argv[1] + '.gone');"
                      "os.makedirs(sys.argv[2]); open(sys.argv[3], 'w').write('');"
                      "open(sys.argv[4], 'w').write(sys.argv[5])",
                      str(ours), str(ours / "t28h1_pkg" / "jobs"),
                      str(ours / "t28h1_pkg" / "jobs" / "__init__.py"),
                      str(ours / "t28h1_pkg" / "jobs" / "trainers.py"), touch(marker))
    import_error("t28h1_pkg.jobs.trainers")
    assert not marker.exists(), "an import ran the other user's trainers.py"
    assert isinstance(refused, ImportError), refused
    assert (f"refusing to import 't28h1_pkg' from {ours / 't28h1_pkg'}: {above} is a folder "
            f"owned by {other_user.name} (uid {other_user.uid}), mode 0755") in str(refused)


def test_nothing_in_a_package_that_others_can_write_is_imported(other_user, shared_dir,
                                                                 tmp_path, fresh_imports):
    # our package in a shared folder: a subfolder others could write (0777), a module of
    # ours others could write (0666), a __pycache__ they could write; their helper.py,
    # their jobs/trainers.py and their bytecode for our sub.py ran as root
    import importlib
    from hpcmesh.private_files.modules import import_from_folder
    project = shared_dir(0o1777)
    pkg = project / "t28h2_pkg"
    (pkg / "jobs").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    for folder in (pkg / "jobs", pkg / "__pycache__"):
        os.chmod(folder, 0o777)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text("WHO = 'our source'\n")
    (pkg / "helper.py").write_text("WHO = 'ours'\n")
    os.chmod(pkg / "helper.py", 0o666)
    (pkg / "jobs" / "__init__.py").write_text("")
    marker = tmp_path / "ran-their-code"
    other_user.python(PLANT_FILE, str(pkg / "helper.py"), touch(marker))
    other_user.python(PLANT_FILE, str(pkg / "jobs" / "trainers.py"), touch(marker))
    other_user.python("import sys; open(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))",
                      importlib.util.cache_from_source(str(pkg / "sub.py")),
                      stamped_pyc(pkg / "sub.py", touch(marker) + "WHO = 'their bytecode'\n")
                      .hex())
    import_from_folder(str(project))
    assert importlib.import_module("t28h2_pkg.sub").WHO == "our source"
    helper = import_error("t28h2_pkg.helper")
    trainers = import_error("t28h2_pkg.jobs.trainers")
    assert not marker.exists(), "an import ran the other user's code"
    assert (f"refusing to import {pkg / 'helper.py'}: it is a file owned by root (uid 0), "
            f"mode 0666") in str(helper), helper
    assert (f"refusing to import {pkg / 'jobs'}: it is a folder owned by root (uid 0), "
            f"mode 0777") in str(trainers), trainers
    with pytest.raises(ModuleNotFoundError, match="t28h2_pkg.nothing"):
        importlib.import_module("t28h2_pkg.nothing")


def test_an_empty_folder_another_user_made_does_not_hide_our_module(other_user, shared_dir,
                                                                    fresh_imports):
    # Python takes mymod.py over a folder mymod/ without __init__.py; the finder checked the
    # folder first, so their empty mymod/ in a sticky folder made our mymod.py unimportable
    import importlib
    from hpcmesh.private_files.modules import import_from_folder
    project = shared_dir(0o1777)
    (project / "t28l1_mod.py").write_text("WHO = 'ours'\n")
    other_user.python("import os, sys; os.mkdir(sys.argv[1])", str(project / "t28l1_mod"))
    import_from_folder(str(project))
    assert import_error("t28l1_mod") is None
    assert importlib.import_module("t28l1_mod").WHO == "ours"


# -- the runtime folder (issue 28 item 4) ------------------------------------------------------
START_RUNTIME = textwrap.dedent("""
    import os
    from hpcmesh.actor import Actor, endpoint, this_host
    from hpcmesh.private_files import runtime_dir

    class Where(Actor):
        @endpoint
        def where(self):
            return runtime_dir()

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print("started", runtime_dir(), oct(os.stat(runtime_dir()).st_mode & 0o7777))
    print("workers", *sorted(set(procs.spawn("w", Where).where.call().get(timeout=60).values())))
""")


def test_runtime_folder_another_user_made_first_is_left_for_a_fresh_one(other_user,
                                                                       shared_dir):
    # /tmp/hpcmesh-<uid> made 0777 by another user was used silently (they could delete the
    # job's sockets, or plant files in it); then it was refused, and the job could not start
    # as long as their folder was there. Now hpcmesh makes a fresh folder of its own beside
    # it, says so once, and the processes it starts use that one too.
    tmp = shared_dir(0o1777)              # what /tmp is; TMPDIR points the process at it
    rt = tmp / f"hpcmesh-{os.geteuid()}"
    other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
                      str(rt))
    r = subprocess.run([sys.executable, "-c", START_RUNTIME], env=hpcmesh_env(TMPDIR=str(tmp)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.listdir(rt) == [], "the job put its sockets in the other user's folder"
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    fresh, mode = lines["started"].split()
    assert os.path.dirname(fresh) == str(tmp) and fresh != str(rt), fresh
    assert os.path.basename(fresh).startswith(f"hpcmesh-{os.geteuid()}-") and mode == "0o700"
    assert lines["workers"] == fresh, "the processes it started chose a folder of their own"
    warning = (f"refusing the runtime folder {rt}: it is a folder owned by {other_user.name} "
               f"(uid {other_user.uid}), mode 0777")
    assert r.stderr.count(warning) == 1, r.stderr
    assert f"`rm -r {rt}`, as its owner or root, removes it" in r.stderr
    assert f"using {fresh} instead" in r.stderr


PLANTED_STACKS = textwrap.dedent("""
    import os, sys
    from hpcmesh.runtime.observe.introspect import (STACK_SIGNAL, install_stack_dump_handler,
                                                    stack_file)
    print(os.getpid(), flush=True)
    sys.stdin.readline()                   # the other user plants the link now
    if install_stack_dump_handler():
        os.kill(os.getpid(), STACK_SIGNAL)     # what the admin view asks: a dump, now
        path = stack_file(os.getpid())         # (to ourselves: written before kill returns)
        print("installed", os.path.dirname(path), os.path.getsize(path) > 0, flush=True)
    else:                                      # (unhandled, the signal would end us)
        print("refused", flush=True)
""")


#: a process on another host of the job: the runtime folder it uses, and what it inherited
SHOW_RUNTIME = ("import os; from hpcmesh.private_files import runtime_dir;"
                "print(runtime_dir(), os.environ['HPCMESH_RUNTIME_DIR'])")


@pytest.mark.parametrize("how", ["theirs", "missing"])
def test_an_inherited_fresh_runtime_folder_is_a_hint_on_another_host(other_user, shared_dir,
                                                                      how):
    # sbatch/srun carry HPCMESH_RUNTIME_DIR=/tmp/hpcmesh-<uid>-XXXX to the other nodes: there
    # anyone could make that known name first, and every process of the job failed
    tmp = shared_dir(0o1777)
    inherited = tmp / f"hpcmesh-{os.geteuid()}-a1b2c3d4"
    if how == "theirs":
        other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
                          str(inherited))
    r = subprocess.run([sys.executable, "-P", "-c", SHOW_RUNTIME], cwd=tmp, capture_output=True,
                       text=True, timeout=60,
                       env=hpcmesh_env(HPCMESH_RUNTIME_DIR=str(inherited), TMPDIR=str(tmp)))
    assert r.returncode == 0, r.stderr
    fresh, exported = r.stdout.split()
    assert fresh == exported != str(inherited) and os.path.dirname(fresh) == str(tmp)
    assert os.path.basename(fresh).startswith(f"hpcmesh-{os.geteuid()}-")
    assert r.stderr.count(f"using {fresh} instead") == 1, r.stderr
    if how == "theirs":
        assert (f"{inherited}: it is a folder owned by {other_user.name} (uid {other_user.uid})"
                f", mode 0777") in r.stderr, r.stderr
    else:
        assert f"{inherited} ($HPCMESH_RUNTIME_DIR, chosen on another host?) is not here" \
            in r.stderr, r.stderr
    assert not os.path.exists(fresh), "the empty fresh folder was left behind"


def test_planted_stack_file_link_gets_no_stack_dump(other_user, shared_dir, tmp_path):
    # a planted stacks-<pid>.txt symlink made a stack dump append to a root-only file; then
    # their folder was refused, and with it the stack dumps
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
    # their folder is left alone: the dump goes into a fresh one of ours
    assert p.returncode == 0 and out.split()[0] == "installed", (out, err)
    folder, written = out.split()[1:]
    assert os.path.dirname(folder) == str(tmp) and folder != str(rt) and written == "True"


# -- the job secret, the logs, the exit actions, the services file (issue 28, rest) -------------
FIXED_ID = uuid.UUID(int=0xFEED)      # the apply id / mesh uid the other user waited for


def fixed_uuid(monkeypatch, module) -> None:
    """Make ``module``'s random names predictable, as the attacker's inotify watch on a
    folder they control would make them in life: a stand-in for winning that race."""
    monkeypatch.setattr(module, "uuid", types.SimpleNamespace(uuid4=lambda: FIXED_ID))


def plant_link(user, link: Path, target: Path, *, folders: bool) -> None:
    """As ``user``: a symlink ``link`` -> ``target`` (and, with ``folders``, every folder
    from the project down to it, made theirs and 0777 as they would make them)."""
    user.python("import os, sys\n"
                "link, target, folders = sys.argv[1], sys.argv[2], sys.argv[3] == '1'\n"
                "if folders:\n"
                "    os.makedirs(os.path.dirname(link))\n"
                "    d = os.path.dirname(link)\n"
                "    while os.path.basename(d) != '.hpcmesh':\n"
                "        os.chmod(d, 0o777); d = os.path.dirname(d)\n"
                "    os.chmod(d, 0o777)\n"
                "os.symlink(target, link)", str(link), str(target), "1" if folders else "0")


def our_open_folders(project: Path, folder: Path) -> None:
    """Our own folders from ``.hpcmesh`` down to ``folder``, left 0777 (made under umask 0):
    the other user can plant in them."""
    folder.mkdir(parents=True)
    d = folder
    while d != project:
        os.chmod(d, 0o777)
        d = d.parent


@pytest.mark.parametrize("where", ["their-folder", "our-open-folder"])
def test_planted_secret_link_gets_no_secret(other_user, shared_dir, monkeypatch, where):
    # write_secret opened the secret's path O_CREAT|O_TRUNC, following a symlink: the other
    # user's link at .hpcmesh/submitit/secret-<id> got the job's key (their file, readable)
    import_or_skip("submitit")
    from hpcmesh.job import SubmititJob
    from hpcmesh.job import base
    project = shared_dir(0o777)
    folder = project / ".hpcmesh" / "submitit"
    secret = folder / f"secret-{FIXED_ID.hex[:12]}"
    stolen = Path(other_user.home) / "stolen"
    other_user.python("import os, sys; open(sys.argv[1], 'w').close(); os.chmod(sys.argv[1], 0o666)",
                      str(stolen))
    if where == "our-open-folder":
        our_open_folders(project, folder)
    plant_link(other_user, secret, stolen, folders=where == "their-folder")
    monkeypatch.chdir(project)
    monkeypatch.delenv("HPCMESH_STATE_DIR", raising=False)
    fixed_uuid(monkeypatch, base)
    job = SubmititJob(meshes={"workers": 1}, cluster="debug", grace=5, progress=False)
    try:
        refused = attempt(job.apply)
    finally:
        if job.job_ids:
            job.kill()
    assert stolen.read_bytes() == b"", "the job's secret went into their link"
    assert os.path.islink(secret), "their link was replaced, not refused"
    assert refused is not None and not job.job_ids, "the job started with the planted link"
    text = str(refused)
    assert f"refusing the job secret {secret}" in text, text
    if where == "their-folder":
        assert (f"{project / '.hpcmesh'} is a folder owned by {other_user.name} "
                f"(uid {other_user.uid}), mode 0777") in text, text
    else:
        assert f"{project / '.hpcmesh'} is a folder owned by root (uid 0), mode 0777" in text


WORKER_SECRET = "ab" * 32


@pytest.mark.parametrize("where", ["their-folder", "our-open-folder", "ours-readable"])
def test_secret_file_another_user_knows_is_refused(other_user, shared_dir, tmp_path, where):
    # a worker read HPCMESH_SECRET_FILE whoever wrote it or could read it: a key the other
    # user knows, so they could connect to the agent (root) and have it run their pickles
    write = ("import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644);"
             "os.write(fd, sys.argv[2].encode())")
    if where == "their-folder":
        folder = Path(other_user.home) / "job"
        other_user.python("import os, sys; os.mkdir(sys.argv[1])", str(folder))
    else:
        folder = shared_dir(0o777 if where == "our-open-folder" else 0o755)
    secret = folder / "secret"
    if where == "ours-readable":                # ours, but 0644: they read it
        secret.write_text(WORKER_SECRET)
        os.chmod(secret, 0o644)
        assert other_user.run(["cat", str(secret)]).stdout == WORKER_SECRET
    else:
        other_user.python(write, str(secret), WORKER_SECRET)
    sock = tmp_path / "w.sock"
    r = subprocess.run([sys.executable, "-m", "hpcmesh", "worker", "--listen", f"unix://{sock}",
                        "--initial-wait", "0.5"], cwd=tmp_path, capture_output=True, text=True,
                       env=hpcmesh_env(HPCMESH_SECRET_FILE=str(secret)), timeout=60)
    assert "listening on" not in r.stderr, "the worker took a key they know: " + r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"refusing the job secret {secret}" in r.stderr, r.stderr
    assert {"their-folder": f"{folder} is a folder owned by {other_user.name} "
                            f"(uid {other_user.uid})",
            "our-open-folder": f"{folder} is a folder owned by root (uid 0), mode 0777",
            "ours-readable": "it is a file owned by root (uid 0), mode 0644"}[where] \
        in r.stderr, r.stderr


SPAWN_AND_PRINT = textwrap.dedent("""
    import types, uuid
    import hpcmesh.actor.host_mesh as host_mesh
    from hpcmesh.actor import Actor, endpoint, this_host
    host_mesh.uuid = types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=0xFEED))

    class Say(Actor):
        @endpoint
        def say(self, text):
            print(text, flush=True)

    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="logs")
    procs.spawn("say", Say).say.call("A-LINE-OF-THE-JOB").get(timeout=60)
    procs.stop()
    print("spawned", flush=True)
""")


@pytest.mark.parametrize("where", ["their-folder", "our-open-folder"])
def test_planted_log_link_gets_no_log_lines(other_user, shared_dir, tmp_path, where):
    # the host agent opened .hpcmesh/logs/<mesh>/<proc>.out with open("ab"), following
    # the other user's link: the job's output was appended to a root-only file
    precious = tmp_path / "root-only.log"       # in a 0700 folder of root's
    precious.write_text("precious\n")
    os.chmod(precious, 0o600)
    project = shared_dir(0o777)
    logs = project / ".hpcmesh" / "logs" / f"logs-{FIXED_ID.hex[:8]}"
    if where == "our-open-folder":
        our_open_folders(project, logs)
    plant_link(other_user, logs / f"logs-{FIXED_ID.hex[:8]}-0.out", precious,
               folders=where == "their-folder")
    r = subprocess.run([sys.executable, "-c", SPAWN_AND_PRINT], cwd=project,
                       env=hpcmesh_env(), capture_output=True, text=True, timeout=120)
    # the agent (in that process) wrote whatever it read before stop() returned
    assert precious.read_bytes() == b"precious\n", "the job's log went into their link"
    assert r.returncode != 0 and "spawned" not in r.stdout, (r.stdout, r.stderr)
    assert f"refusing the log folder {logs}" in r.stderr, r.stderr
    owner = (f"owned by {other_user.name} (uid {other_user.uid})" if where == "their-folder"
             else "owned by root (uid 0)")
    assert f"{project / '.hpcmesh' / 'logs'} is a folder {owner}, mode 0777" in r.stderr, \
        r.stderr


def test_planted_exit_actions_are_not_carried_out(other_user, shared_dir, monkeypatch):
    # the agent read <proc>.exit-actions in the log folder, whoever wrote it, and unmounted
    # what it named (as root: any FUSE mount of the node whose source they name)
    from hpcmesh.runtime.process import exit_actions
    folder = shared_dir(0o777)                  # a log folder the other user can write in
    theirs = folder / "logs-0.exit-actions"
    other_user.python("import json, sys; open(sys.argv[1], 'w').write(json.dumps("
                      "{'unmount': '/home/someone/mnt', 'source': 'their-fs'}) + '\\n')",
                      str(theirs))
    asked = []
    monkeypatch.setattr(exit_actions, "unmount_if_ours", lambda *a: asked.append(a))
    exit_actions.run_exit_actions(str(theirs))
    assert asked == [], "the agent carried out their exit actions"
    assert theirs.exists(), "the agent removed their file"


def test_exit_action_is_not_written_through_a_planted_link(other_user, shared_dir, tmp_path,
                                                           monkeypatch):
    # a process recorded its unmount by appending to $HPCMESH_EXIT_ACTIONS, following a link
    from hpcmesh.runtime.process import exit_actions
    folder = shared_dir(0o777)
    precious = tmp_path / "root-only.conf"
    precious.write_text("precious\n")
    link = folder / "logs-1.exit-actions"
    plant_link(other_user, link, precious, folders=False)
    monkeypatch.setenv(exit_actions.VAR, str(link))
    refused = attempt(lambda: exit_actions.register_unmount("/mnt/x", "hpcmesh-1"))
    assert precious.read_bytes() == b"precious\n", "the exit action went into their link"
    assert refused is not None and f"refusing the exit-actions file {link}" in str(refused)
    assert f"{folder} is a folder owned by root (uid 0), mode 0777" in str(refused)


def test_planted_services_file_is_named_not_ignored(other_user, shared_dir):
    # `hpcmesh debug`/`top` read .hpcmesh/<context>/services.json; a refused one (another
    # user's) read as "no admin URL", which hid that somebody had planted it
    project = shared_dir(0o777)
    services = project / ".hpcmesh" / "default" / "services.json"
    other_user.python("import json, os, sys; os.makedirs(os.path.dirname(sys.argv[1]));"
                      "open(sys.argv[1], 'w').write(json.dumps({'admin_url': "
                      "'http://127.0.0.1:9/?token=theirs'}))", str(services))
    r = hm("debug", "--list", cwd=project)
    assert r.returncode == 2, (r.returncode, r.stderr)     # a usage error, as for a bad URL
    assert "no admin URL" not in r.stderr, r.stderr
    assert f"refusing the services file {services}" in r.stderr, r.stderr
    assert f"owned by {other_user.name} (uid {other_user.uid})" in r.stderr, r.stderr


def test_planted_mpi_address_file_is_refused(other_user, shared_dir):
    # the address file carries the job's secret and the agent to dial: one another user wrote
    # (0666, in a sticky shared folder) sent attach_to_mpi() to their own listener
    from hpcmesh.mpi import ADDRESS_FILE_FORMAT, attach_to_mpi
    folder = shared_dir(0o1777)
    path = folder / "addr.json"
    doc = {"format": ADDRESS_FILE_FORMAT, "secret": "00" * 32, "extent": {"hosts": 1},
           "world_size": 1, "hosts": ["h"], "agent": {"node_id": "x" * 32,
                                                      "addresses": ["tcp://127.0.0.1:9"]},
           "procs": []}
    other_user.python("import json, os, sys; fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY,"
                      " 0o666); os.fchmod(fd, 0o666); os.write(fd, sys.argv[2].encode())",
                      str(path), json.dumps(doc))
    from hpcmesh.private_files import UntrustedPathError
    with pytest.raises(UntrustedPathError) as e:
        attach_to_mpi(str(path), timeout=5)
    assert "refusing the MPI address file" in str(e.value), str(e.value)
    assert str(folder) in str(e.value) or str(path) in str(e.value), str(e.value)


def test_slurm_job_in_a_log_folder_others_can_write_is_refused_before_submitting(
        other_user, shared_dir, slurm_cluster):
    # the job folder (secret, batch script, ready files) sat in log_dir unchecked: in a
    # group- or world-writable logs/ another user swapped it for theirs while the job was
    # pending, and the batch script's stamp and Slurm's --output clobbered files through
    # their links. Now log_dir itself must be ours and closed to others.
    import subprocess as sp
    from hpcmesh.job import SlurmJob
    from hpcmesh.private_files import UntrustedPathError
    logs = shared_dir(0o777)
    before = sp.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    job = SlurmJob(meshes={"hosts": 1}, log_dir=str(logs), job_name="t28-logdir")
    with pytest.raises(UntrustedPathError) as e:
        job.state(cached_path=None)
    assert str(logs) in str(e.value) and "0777" in str(e.value), str(e.value)
    after = sp.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(after) <= set(before), f"a job was submitted: {set(after) - set(before)}"
    assert os.listdir(logs) == [], os.listdir(logs)
