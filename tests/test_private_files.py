"""hpcmesh.private_files: which files and folders hpcmesh trusts, and how it writes them.

The attacks by another account are in test_shared_node_files.py; here are the rules
themselves, with files root gives away (``os.lchown``) standing in for another user's.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmesh.private_files import (UntrustedPathError, append_file, create_file, open_file,
                                   private_dir, read_file, remove_file, runtime_dir, write_file,
                                   write_link)

NOBODY = 65534
REPO = Path(__file__).resolve().parent.parent


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_write_makes_0700_folders_and_a_0600_file_and_reads_it_back(tmp_path):
    top = tmp_path / "state"
    path = top / "ctx" / "state.pkl"
    assert write_file(str(path), b"one", top=str(top)) == str(path)
    write_file(str(path), b"two", top=str(top))                 # replaced, not appended
    assert read_file(str(path), top=str(top)) == b"two"
    assert mode(top) == mode(top / "ctx") == 0o700 and mode(path) == 0o600
    assert os.listdir(top / "ctx") == ["state.pkl"]             # no temporary file left


def test_missing_file_or_folder_is_not_found_not_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_file(str(tmp_path / "nope" / "f"), top=str(tmp_path))
    with pytest.raises(FileNotFoundError):
        read_file(str(tmp_path / "f"))
    remove_file(str(tmp_path / "nope" / "f"), top=str(tmp_path))     # nothing to do


@pytest.mark.parametrize("what", ["owner", "group-writable", "world-writable"])
def test_a_folder_on_the_way_that_others_control_is_refused(tmp_path, what):
    top = tmp_path / "state"
    write_file(str(top / "ctx" / "f"), b"x", top=str(top))
    if what == "owner":
        os.chown(top / "ctx", NOBODY, NOBODY)
        expected = f"owned by nobody (uid {NOBODY}), mode 0700"
    else:
        os.chmod(top / "ctx", 0o770 if what == "group-writable" else 0o707)
        expected = f"owned by root (uid 0), mode {'0770' if what == 'group-writable' else '0707'}"
    for call in (lambda: read_file(str(top / "ctx" / "f"), top=str(top), what="the cache"),
                 lambda: write_file(str(top / "ctx" / "f"), b"y", top=str(top), what="the cache")):
        with pytest.raises(UntrustedPathError) as e:
            call()
        assert str(e.value).startswith(f"refusing the cache {top}/ctx/f: {top}/ctx is a "
                                       f"folder {expected}; hpcmesh trusts only a folder "
                                       f"owned by this user, root (uid 0), that group and "
                                       f"others cannot write"), str(e.value)
        assert isinstance(e.value, PermissionError)


def test_a_file_others_own_or_can_write_is_not_read(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    os.chmod(f, 0o666)
    with pytest.raises(UntrustedPathError, match=r"it is a file owned by root \(uid 0\), "
                                                 r"mode 0666"):
        read_file(str(f))
    os.chmod(f, 0o600)
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match=r"it is a file owned by nobody"):
        read_file(str(f))


def test_our_own_symlink_is_followed_into_a_folder_we_trust(tmp_path):
    top = tmp_path / "state"
    write_file(str(top / "ctx" / "state.pkl"), b"cached", top=str(top))
    write_link(str(top / "current.pkl"), "ctx/state.pkl", top=str(top))
    assert read_file(str(top / "current.pkl"), top=str(top)) == b"cached"
    # written through the link: the target is replaced, the link stays
    assert write_file(str(top / "current.pkl"), b"new", top=str(top)) == \
        str(top / "ctx" / "state.pkl")
    assert os.readlink(top / "current.pkl") == "ctx/state.pkl"
    assert (top / "ctx" / "state.pkl").read_bytes() == b"new"
    # a target outside the top is checked from its own folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere / "x.pkl", top / "out.pkl")
    write_file(str(top / "out.pkl"), b"out", top=str(top))
    assert (elsewhere / "x.pkl").read_bytes() == b"out"
    os.chmod(elsewhere, 0o777)
    with pytest.raises(UntrustedPathError, match=f"{elsewhere} is a folder owned by root "
                                                 r"\(uid 0\), mode 0777"):
        read_file(str(top / "out.pkl"), top=str(top))
    # removing the cache removes what the link leads to, not the link
    remove_file(str(top / "current.pkl"), top=str(top))
    assert os.path.islink(top / "current.pkl") and not (top / "ctx" / "state.pkl").exists()


def test_a_symlink_somebody_else_owns_is_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "link")
    os.lchown(tmp_path / "link", NOBODY, NOBODY)
    for call in (lambda: read_file(str(tmp_path / "link")),
                 lambda: write_file(str(tmp_path / "link"), b"x"),
                 lambda: remove_file(str(tmp_path / "link"))):
        with pytest.raises(UntrustedPathError, match=r"it is a symlink owned by nobody"):
            call()
    assert target.read_bytes() == b"keep"


def test_a_symlinked_folder_below_the_top_is_refused(tmp_path):
    top = tmp_path / "state"
    top.mkdir(mode=0o700)
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", top / "ctx")
    with pytest.raises(UntrustedPathError, match=r"ctx is a symlink owned by root"):
        write_file(str(top / "ctx" / "f"), b"x", top=str(top))
    assert os.listdir(tmp_path / "real") == []


def test_the_top_may_be_our_own_symlink_to_a_folder_of_ours(tmp_path):
    (tmp_path / "scratch").mkdir(mode=0o700)
    os.symlink(tmp_path / "scratch", tmp_path / ".hpcmesh")
    write_file(str(tmp_path / ".hpcmesh" / "c" / "f"), b"x", top=str(tmp_path / ".hpcmesh"))
    assert (tmp_path / "scratch" / "c" / "f").read_bytes() == b"x"


def test_symlink_loops_end(tmp_path):
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(OSError) as e:
        read_file(str(tmp_path / "a"))
    assert e.value.errno == errno.ELOOP


def test_private_dir_tightens_a_readable_folder_of_ours_and_refuses_an_open_one(tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    private_dir(str(d))
    assert mode(d) == 0o700
    os.chmod(d, 0o777)
    with pytest.raises(UntrustedPathError, match=r"with mode 0700"):
        private_dir(str(d))
    assert mode(d) == 0o777                      # refused, not repaired: others wrote in it


def test_create_file_replaces_a_stale_file_and_never_follows_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "stacks-1.txt")      # ours, left by an earlier process
    with pytest.raises(FileExistsError):
        create_file(str(tmp_path / "stacks-1.txt"))
    fd = create_file(str(tmp_path / "stacks-1.txt"), replace=True,
                     flags=os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"stacks")
    os.close(fd)
    assert target.read_bytes() == b"keep"
    assert (tmp_path / "stacks-1.txt").read_bytes() == b"stacks"
    assert mode(tmp_path / "stacks-1.txt") == 0o600


def test_append_file_adds_to_a_log_of_ours_and_refuses_any_symlink(tmp_path):
    top = tmp_path / "logs"
    log = top / "mesh" / "p.out"
    with append_file(str(log), top=str(top), mode=0o644) as f:
        assert f.name == str(log)
        f.write(b"one\n")
    with append_file(str(log), top=str(top)) as f:         # the log of an earlier run
        f.write(b"two\n")
    assert log.read_bytes() == b"one\ntwo\n" and mode(log) == 0o644
    assert mode(top) == mode(top / "mesh") == 0o700
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, top / "mesh" / "q.out")             # even our own link is not followed
    with pytest.raises(UntrustedPathError, match=r"q\.out: it is a symlink owned by root"):
        append_file(str(top / "mesh" / "q.out"), top=str(top))
    assert target.read_bytes() == b"keep"
    os.chmod(log, 0o666)
    with pytest.raises(UntrustedPathError, match=r"mode 0666.*chmod go-w"):
        append_file(str(log), top=str(top))


def test_a_secret_goes_into_a_0700_folder_and_is_read_only_from_a_0600_file(tmp_path):
    d = tmp_path / "job"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    os.close(create_file(str(d / "secret"), secret=True))
    assert mode(d) == 0o700 and mode(d / "secret") == 0o600   # ours, only readable: tightened
    os.chmod(d, 0o770)
    with pytest.raises(UntrustedPathError, match=r"mode 0770; .*with mode 0700"):
        create_file(str(d / "secret2"), secret=True)
    os.chmod(d, 0o700)
    os.chmod(d / "secret", 0o640)
    with pytest.raises(UntrustedPathError, match=r"mode 0640; .*with mode 0600 \(others could "
                                                 r"have read it"):
        open_file(str(d / "secret"), secret=True)
    assert mode(d / "secret") == 0o640          # refused, not tightened: it may have leaked
    open_file(str(d / "secret")).close()         # not a secret: readable by others is fine


def test_a_shared_sticky_folder_of_ours_gets_no_chmod_advice(tmp_path):
    d = tmp_path / "tmp"
    d.mkdir()
    os.chmod(d, 0o1777)                         # what /tmp is to root
    with pytest.raises(UntrustedPathError) as e:
        read_file(str(d / "f"))
    assert "mode 1777" in str(e.value) and "chmod" not in str(e.value)
    assert "keep hpcmesh's files in a folder of this user's" in str(e.value)


def test_runtime_dir_is_a_private_subfolder_of_xdg_runtime_dir(tmp_path, monkeypatch):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert runtime_dir() == str(xdg / "hpcmesh") and mode(xdg / "hpcmesh") == 0o700
    os.chown(xdg, NOBODY, NOBODY)           # another user's session folder (after `su`)
    with pytest.raises(UntrustedPathError) as e:
        runtime_dir()
    assert f"{xdg} is a folder owned by nobody" in str(e.value)
    assert "set XDG_RUNTIME_DIR to a folder of this user's" in str(e.value)


def runtime_dir_in(tmp: Path) -> subprocess.CompletedProcess:
    """``runtime_dir()`` in a subprocess with ``TMPDIR=tmp`` (tempfile keeps the first one
    it saw), no session folder, and what a process it starts finds; then the mode the
    folder had while the process ran (a fresh one is removed at its exit)."""
    code = ("import os, subprocess, sys; from hpcmesh.private_files import runtime_dir;"
            "print(runtime_dir()); sys.stdout.flush();"
            "subprocess.run([sys.executable, '-c', 'from hpcmesh.private_files import "
            "runtime_dir; print(runtime_dir())'], check=True);"
            "print(oct(os.stat(runtime_dir()).st_mode & 0o7777))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "HPCMESH_RUNTIME_DIR")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}, check=True)


def test_runtime_dir_in_tmpdir(tmp_path):
    r = runtime_dir_in(tmp_path)
    out = str(tmp_path / f"hpcmesh-{os.geteuid()}")
    assert r.stdout.split() == [out, out, "0o700"] and mode(out) == 0o700 and r.stderr == ""


def test_a_runtime_dir_name_somebody_took_gives_way_to_a_fresh_folder(tmp_path):
    # the attack by another user is in test_shared_node_files; here, a file of ours there
    taken = tmp_path / f"hpcmesh-{os.geteuid()}"
    taken.write_text("")
    r = runtime_dir_in(tmp_path)
    fresh, child, fresh_mode = r.stdout.split()
    assert fresh == child and os.path.dirname(fresh) == str(tmp_path) and fresh_mode == "0o700"
    assert not os.path.exists(fresh)                # left empty: removed at exit
    assert os.path.basename(fresh).startswith(f"hpcmesh-{os.geteuid()}-")
    assert f"{taken} is a file owned by root (uid 0), mode 0644, not a folder" in r.stderr
    assert r.stderr.count(f"using {fresh} instead") == 1 and "Errno" not in r.stderr


def test_hpcmesh_runtime_dir_comes_first_and_must_be_ours_and_private(tmp_path, monkeypatch):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    chosen = tmp_path / "chosen"
    monkeypatch.setenv("HPCMESH_RUNTIME_DIR", str(chosen))
    assert runtime_dir() == str(chosen) and mode(chosen) == 0o700      # made when missing
    os.chmod(chosen, 0o770)
    with pytest.raises(UntrustedPathError, match=rf"\$HPCMESH_RUNTIME_DIR\) {chosen}: it is a "
                                                 rf"folder owned by root \(uid 0\), mode 0770;"
                                                 rf".*`chmod -R go-rwx {chosen}`.*unset "
                                                 rf"HPCMESH_RUNTIME_DIR"):
        runtime_dir()
    os.chmod(chosen, 0o700)
    os.chown(chosen, NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match=rf"owned by nobody .*`rm -r {chosen}`, as its "
                                                 r"owner or root, removes it"):
        runtime_dir()
    monkeypatch.setenv("HPCMESH_RUNTIME_DIR", "relative/run")
    with pytest.raises(ValueError, match=r"HPCMESH_RUNTIME_DIR='relative/run' is not an "
                                         r"absolute path"):
        runtime_dir()


def test_refusals_say_how_to_make_ours_trusted_or_remove_theirs(tmp_path):
    top = tmp_path / ".hpcmesh"
    write_file(str(top / "default" / "state.pkl"), b"x", top=str(top))
    os.chmod(top / "default", 0o777)            # a checkout made with umask 0: all below
    with pytest.raises(UntrustedPathError, match=rf"`chmod -R go-w {top}/default` makes it "
                                                 r"trusted"):
        read_file(str(top / "default" / "state.pkl"), top=str(top))
    os.chmod(top / "default", 0o700)
    os.chown(top / "default" / "state.pkl", NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match=rf"`rm {top}/default/state.pkl`, as its owner "
                                                 r"or root, removes it"):
        read_file(str(top / "default" / "state.pkl"), top=str(top))
    os.chown(top, NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match=rf"`rm -r {top}`, as its owner or root"):
        read_file(str(top / "default" / "state.pkl"), top=str(top))


def test_a_socket_path_over_the_limit_names_it(tmp_path, monkeypatch):
    from hpcmesh.runtime.node import Node
    xdg = tmp_path / ("x" * 90)
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    loop = asyncio.new_event_loop()
    try:
        node = Node(b"s" * 32, loop, role="test")
        with pytest.raises(ValueError, match=r"the Unix socket path .*\.sock is over 107 "
                                             r"bytes.*XDG_RUNTIME_DIR"):
            node.unix_address()
    finally:
        loop.close()


def test_the_one_walk_passes_through_root_s_and_sticky_folders_and_trusts_only_ours(tmp_path):
    """``walk``'s two rules, as the mounts use them: on the way (``PASS``) a folder of root's
    or ours, a sticky one too, and links of root's or ours are followed; the last name is
    held to the narrower rule (no sticky folder there), and ``TRUST`` takes only ours."""
    from hpcmesh.private_files import TRUST, walk
    sticky = tmp_path / "shared"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)                    # what /tmp is
    (sticky / "mine" / "sub").mkdir(parents=True)
    os.chmod(sticky / "mine", 0o755)
    os.symlink(sticky / "mine", tmp_path / "link")
    with walk(str(tmp_path / "link" / "sub"), what="t", last=TRUST) as d:   # on the way...
        assert d.path == str(sticky / "mine" / "sub") and stat.S_ISDIR(d.st.st_mode)
    with pytest.raises(UntrustedPathError, match=r"it is a folder owned by root \(uid 0\), "
                                                 r"mode 1777; .*every user may add to"):
        walk(str(sticky), what="t")             # ...but a sticky folder is no last name
    os.chown(sticky / "mine", NOBODY, NOBODY)
    for last in (TRUST, None):                  # nobody's: not even passed through
        with pytest.raises(UntrustedPathError, match=f"{sticky}/mine is a folder owned by "
                                                     r"nobody \(uid 65534\), mode 0755"):
            walk(str(sticky / "mine" / "x"), what="t", last=last)
    with walk(str(tmp_path), what="t") as top:  # TRUST (a chain from a top): no link at all
        with pytest.raises(UntrustedPathError, match=r"it is a symlink owned by root \(uid "
                                                     rf"0\), to {sticky}/mine; .*name the folder"):
            walk("link", what="t", named=str(tmp_path / "link"), start=top, way=TRUST,
                 last=TRUST)


def test_folder_modules_come_after_everything_else_and_only_when_trusted(tmp_path):
    """``private_files.modules``: a module, a package and a namespace package of the folder
    are found as ``python -m`` finds them, but after the standard library (a ``colorsys.py``
    there shadows nothing), with no bytecode written, and only when nobody else can write
    them (another user's is an ImportError, so an optional import falls back)."""
    import importlib
    from hpcmesh.private_files.modules import import_from_folder
    names = ("t28_mod", "t28_pkg", "t28_pkg.sub", "t28_ns", "t28_ns.m", "t28_theirs")
    (tmp_path / "t28_mod.py").write_text("X = 'mod'\n")
    (tmp_path / "t28_pkg").mkdir()
    (tmp_path / "t28_pkg" / "__init__.py").write_text("")
    (tmp_path / "t28_pkg" / "sub.py").write_text("X = 'sub'\n")
    (tmp_path / "t28_ns").mkdir()
    (tmp_path / "t28_ns" / "m.py").write_text("X = 'ns'\n")
    (tmp_path / "colorsys.py").write_text("raise SystemExit('shadowed the standard library')\n")
    (tmp_path / "t28_theirs.py").write_text("X = 'theirs'\n")
    os.chown(tmp_path / "t28_theirs.py", NOBODY, NOBODY)
    finder = import_from_folder(str(tmp_path))
    try:
        assert import_from_folder(str(tmp_path)) is finder          # once per folder
        assert importlib.import_module("t28_mod").X == "mod"
        assert importlib.import_module("t28_pkg.sub").X == "sub"
        assert importlib.import_module("t28_ns.m").X == "ns"
        sys.modules.pop("colorsys", None)   # imported afresh (an earlier test may have)
        assert importlib.import_module("colorsys").__file__ != str(tmp_path / "colorsys.py")
        with pytest.raises(ImportError, match=rf"refusing to import {tmp_path}/t28_theirs.py: "
                                              r"it is a file owned by nobody"):
            importlib.import_module("t28_theirs")
        assert not (tmp_path / "__pycache__").exists()
    finally:
        sys.meta_path.remove(finder)
        for name in names:
            sys.modules.pop(name, None)


def test_every_python_hpcmesh_starts_keeps_its_current_folder_off_sys_path():
    """``-P`` on each command hpcmesh builds for a Python of its own (issue 28): started
    with ``-m`` or ``-c`` in /tmp, it imported another user's ``sysconfig.py`` there first.
    The commands are built in one place: no other module of hpcmesh spells ``-m``."""
    import ast
    from hpcmesh.job.exec import python_argv, python_argv_remote
    from hpcmesh.job.slurm import slurm_bootstrap
    from hpcmesh.job.slurm_agent import agent_command
    from hpcmesh.job.ssh import SSHJob
    from hpcmesh.private_files.modules import RUN_MODULE, RUN_SCRIPT, python_module
    from hpcmesh.runtime.process.bootstrap import default_bootstrap_cmd, runs_entry_point
    assert python_module("m", "/py") == ["/py", "-P", "-m", "m"]
    assert agent_command("/py")[:3] == ["/py", "-P", "-c"]
    for cmd in (default_bootstrap_cmd(), slurm_bootstrap(python="/py")(None)):
        assert cmd.args[-3:] == ["-P", "-m", "hpcmesh.runtime.proc"] and runs_entry_point(cmd)
    assert " /py -P -m hpcmesh worker " in SSHJob(hosts="n1", python_exe="/py").remote_command(
        ["tcp://10.0.0.1:5"], "tok")
    assert python_argv("json.tool", ["x"]) == [sys.executable, "-P", "-c", RUN_MODULE,
                                                     "json.tool", "x"]
    assert f'exec "$HPCMESH_PYTHON" -P -c \'{RUN_MODULE}\' json.tool x' in \
        python_argv_remote("json.tool", ["x"])[2]
    for script, run in (("t.py", "t.py"), ("-t", "./-t")):    # a script's folder too
        assert python_argv(script, ["x"]) == [sys.executable, "-P", "-c", RUN_SCRIPT,
                                                    run, "x"]
        assert f'exec "$HPCMESH_PYTHON" -P -c \'{RUN_SCRIPT}\' {run} x' in \
            python_argv_remote(script, ["x"])[2]
    package = Path(__file__).resolve().parent.parent / "hpcmesh"
    spelled = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                     if any(isinstance(node, ast.Constant) and node.value == "-m"
                            for node in ast.walk(ast.parse(path.read_text()))))
    # (bootstrap recognises its entry point at the end of a user's command; spmd reads "-m"
    # in the argv a user gives it, to run that module in the actor)
    assert spelled == ["private_files/modules.py", "runtime/process/bootstrap.py",
                       "spmd/spmd_actor.py"]


def test_run_module_is_python_m_with_the_folders_modules_last(tmp_path):
    """``python -P -c RUN_MODULE mod args`` (``exec_python``'s modules): ``__main__``,
    ``sys.argv`` and the exit of ``python -m``; the folder's module found (checked), a
    ``colorsys.py`` there shadows nothing, a missing module is named without a traceback."""
    from hpcmesh.private_files.modules import run_module_argv
    (tmp_path / "t28_main.py").write_text(
        "import sys, colorsys\n"
        "print(__name__, sys.argv, colorsys.__file__ != 'colorsys.py')\n"
        "sys.exit(3)\n")
    (tmp_path / "colorsys.py").write_text("raise SystemExit('shadowed the standard library')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run(run_module_argv("t28_main", ["a", "b c"]), cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (
        3, f"__main__ {[str(tmp_path / 't28_main.py'), 'a', 'b c']} True\n", "")
    r = subprocess.run(run_module_argv("t28_nothing"), cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (1, f"{sys.executable}: No module named t28_nothing\n")


def test_a_folder_module_runs_the_source_that_was_checked(tmp_path):
    """The finder checks a file on a descriptor and reads the source from that descriptor:
    a file put in its place after the check (a rename over it) is not what runs."""
    import importlib.util
    from hpcmesh.private_files.modules import FolderModules
    (tmp_path / "t28_checked.py").write_text("WHO = 'checked'\n")
    spec = FolderModules(str(tmp_path)).find_spec("t28_checked")
    (tmp_path / "swapped.py").write_text("WHO = 'swapped in'\n")
    os.replace(tmp_path / "swapped.py", tmp_path / "t28_checked.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.WHO, module.__file__) == ("checked", str(tmp_path / "t28_checked.py"))
