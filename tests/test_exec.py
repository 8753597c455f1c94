"""exec_command / BashActor on this host: real processes, real files."""

import os
import sys

import pytest

from hpcmesh.actor import ActorError, this_host
from hpcmesh.job.exec import exec_command, exec_python, point_label, subdir_for
from proc_helpers import wait_gone


def _collect():
    lines = []
    return lines, (lambda label, stream, line: lines.append((label, stream, line)))




def test_subdir_and_label():
    assert subdir_for({"hosts": 0, "gpus": 1}) == "hosts_0_gpus_1"
    assert subdir_for({}) == "0"
    assert point_label({"hosts": 2}) == "hosts=2"


def test_exit_code_is_the_maximum_and_env_per_point():
    lines, cb = _collect()
    code = exec_command(this_host(), 'echo "$HPCMESH_RANK_gpus/$HPCMESH_SIZE_gpus $HPCMESH_RANK '
                        '$HPCMESH_NRANKS $HPCMESH_SUBDIR"; exit $((HPCMESH_RANK_gpus + 1))',
                        per_host={"gpus": 3}, on_output=cb).get(timeout=60)
    assert code == 3
    got = sorted((label, line) for label, stream, line in lines)
    assert got == [("gpus=0", "0/3 0 3 gpus_0"), ("gpus=1", "1/3 1 3 gpus_1"),
                   ("gpus=2", "2/3 2 3 gpus_2")]


def test_two_dims_rank_and_point_restrict_but_keep_full_coordinates():
    lines, cb = _collect()
    cmd = 'echo "$HPCMESH_SUBDIR $HPCMESH_RANK $HPCMESH_SIZE_a $HPCMESH_SIZE_b"'
    assert exec_command(this_host(), cmd, per_host={"a": 2, "b": 3}, rank=4,
                        on_output=cb).get(timeout=60) == 0
    assert lines == [("a=1,b=1", "stdout", "a_1_b_1 4 2 3")]
    lines.clear()
    assert exec_command(this_host(), cmd, per_host={"a": 2, "b": 3}, point={"a": 1},
                        on_output=cb).get(timeout=60) == 0
    assert sorted(ln for _l, _s, ln in lines) == ["a_1_b_0 3 2 3", "a_1_b_1 4 2 3",
                                                  "a_1_b_2 5 2 3"]
    with pytest.raises(IndexError, match="dimension 'b' of size 3"):
        exec_command(this_host(), "true", per_host={"a": 2, "b": 3}, point={"b": 3})
    with pytest.raises(KeyError, match="'c'"):
        exec_command(this_host(), "true", per_host={"a": 2}, point={"c": 0})


def test_argv_commands_env_workdir_and_no_secret(tmp_path):
    lines, cb = _collect()
    code = exec_command(this_host(), [sys.executable, "-c",
                                      "import os; print(os.getcwd()); print(os.environ['X']); "
                                      "print('HPCMESH_SECRET' in os.environ, "
                                      "'HPCMESH_CONTROLLER' in os.environ)"],
                        env={"X": "a b $HOME"}, workdir=str(tmp_path), on_output=cb).get(timeout=60)
    assert code == 0
    assert [ln for _l, _s, ln in lines] == [str(tmp_path), "a b $HOME", "False False"]
    lines.clear()
    assert exec_command(this_host(), ["no-such-program-xyz"], on_output=cb).get(timeout=60) == 127
    assert "command not found" in lines[0][2]
    with pytest.raises(ActorError, match="workdir"):
        exec_command(this_host(), "true", workdir=str(tmp_path / "missing")).get(timeout=60)


def test_output_dir_with_and_without_subdir(tmp_path):
    out = tmp_path / "runs" / "$SUBDIR"
    assert exec_command(this_host(), "echo out-$HPCMESH_RANK_gpus; echo err >&2",
                        per_host={"gpus": 2}, output_dir=str(out)).get(timeout=60) == 0
    for g in (0, 1):
        d = tmp_path / "runs" / f"gpus_{g}"
        assert (d / "stdout").read_text() == f"out-{g}\n"
        assert (d / "stderr").read_text() == "err\n"
    flat = tmp_path / "flat"
    assert exec_command(this_host(), "echo hi", per_host={"gpus": 2},
                        output_dir=str(flat)).get(timeout=60) == 0
    assert sorted(os.listdir(flat)) == ["gpus_0.stderr", "gpus_0.stdout", "gpus_1.stderr",
                                        "gpus_1.stdout"]


def test_signal_exit_code_and_streaming_many_lines():
    lines, cb = _collect()
    code = exec_command(this_host(), "seq 1 3000; kill -9 $$", on_output=cb).get(timeout=60)
    assert code == 128 + 9
    assert [ln for _l, s, ln in lines if s == "stdout"] == [str(i) for i in range(1, 3001)]


def test_run_python_script_and_module(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys, os; print('args', sys.argv[1:], os.environ['HPCMESH_SUBDIR']);"
                      " sys.exit(5)\n")
    lines, cb = _collect()
    assert exec_python(this_host(), str(script), ["x", "y z"], per_host={"p": 2},
                       on_output=cb).get(timeout=60) == 5
    assert sorted(ln for _l, _s, ln in lines) == ["args ['x', 'y z'] p_0", "args ['x', 'y z'] p_1"]
    lines.clear()
    assert exec_python(this_host(), "json.tool", ["--help"], on_output=cb).get(timeout=60) == 0
    assert any("usage" in ln for _l, _s, ln in lines)
    # without on_output: run_python through the log-forwarding path
    assert exec_python(this_host(), str(script)).get(timeout=60) == 5


def test_a_script_named_like_a_python_option_runs_as_that_file(tmp_path):
    """Python read a bare ``-c...`` / ``-m...`` as its option: ``-cprint('CODE')#.py`` ran
    the name as code (issue 28). No module name starts with '-': it runs as ./ that file."""
    name = "-cprint('CODE')#.py"
    (tmp_path / name).write_text("print('FILE')\n")
    lines, cb = _collect()
    assert exec_python(this_host(), name, ["a"], workdir=str(tmp_path),
                       on_output=cb).get(timeout=60) == 0
    assert [ln for _l, _s, ln in lines] == ["FILE"]
    out = tmp_path / "out"                     # run_python, the path without on_output
    assert exec_python(this_host(), name, workdir=str(tmp_path),
                       output_dir=str(out)).get(timeout=60) == 0
    assert [p.read_text() for p in out.glob("*.stdout")] == ["FILE\n"]
    (tmp_path / "-mjson.tool").write_text("print('FILE, not json.tool')\n")   # no .py, no args
    lines.clear()
    assert exec_python(this_host(), "-mjson.tool", workdir=str(tmp_path),
                       on_output=cb).get(timeout=60) == 0
    assert [ln for _l, _s, ln in lines] == ["FILE, not json.tool"]
    with pytest.raises(ValueError, match="exec_python needs a script path or module name"):
        exec_python(this_host(), "")


def test_spawned_processes_are_stopped():
    from hpcmesh.runtime.client import client_runtime
    rt = client_runtime()
    before = set(rt.procs)
    assert exec_command(this_host(), "true", per_host={"p": 2}).get(timeout=60) == 0
    new = [rt.procs[n] for n in set(rt.procs) - before]
    assert len(new) == 2 and all(r.pid for r in new)
    assert wait_gone([r.pid for r in new], 10) == []


@pytest.mark.parametrize("made_by", ["other user", "us, writable by all"])
def test_output_dir_another_user_could_change_is_refused(tmp_path, other_user, made_by):
    """On a shared node another user makes the output folder first (or finds ours
    world-writable) and puts a symlink at the output file's name, to a file only we (root)
    may write: the command's output must not land there. The refusal names the folder,
    its owner and mode."""
    shared = f"/tmp/hpcmesh-t28-out-{os.getpid()}-{made_by[:2]}"
    victim = tmp_path / "victim.txt"
    victim.write_text("root's file\n")
    os.chmod(tmp_path, 0o755)           # (the victim's folder: the other user only passes)
    try:
        other_user.python("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)"
                          "; os.symlink(sys.argv[2], os.path.join(sys.argv[1], '0.stdout'))",
                          shared, str(victim))
        if made_by.startswith("us"):
            os.lchown(shared, 0, 0)
        owner = "root (uid 0)" if made_by.startswith("us") else \
            f"{other_user.name} (uid {other_user.uid})"
        with pytest.raises(ActorError) as e:
            exec_command(this_host(), "echo overwritten", output_dir=shared).get(timeout=60)
        msg = str(e.value)
        print(f"\nrefused: {msg}")
        assert victim.read_text() == "root's file\n"
        assert f"{shared}/0.stdout" in msg and f"{shared} is a folder owned by {owner}, " \
            f"mode 0777" in msg, msg
        # and its run with its own folder writes there, 0600 in a 0700 folder
        mine = tmp_path / "mine" / "out"
        assert exec_command(this_host(), "echo fine", output_dir=str(mine)).get(timeout=60) == 0
        assert (mine / "0.stdout").read_text() == "fine\n"
        assert oct(os.stat(mine).st_mode & 0o777) == "0o700"
        assert oct(os.stat(mine / "0.stdout").st_mode & 0o777) == "0o600"
    finally:
        if os.path.lexists(shared):
            for name in os.listdir(shared):
                os.unlink(os.path.join(shared, name))
            os.rmdir(shared)
