"""SPEC §4: BootstrapCommand and the environment a process gets, every recipe end to end."""

import os
import subprocess
import sys
import types

import pytest

from hpcmesh.actor import (Actor, BootstrapCommand, current_rank, default_bootstrap_cmd,
                           endpoint, this_host)
from hpcmesh.runtime.process.bootstrap import (BOOTSTRAP_MODE_VAR, LOG_CHANNEL_VAR,
                                               PROCESS_NAME_VAR, build_environment)
from hpcmesh.runtime.errors import SupervisionError

OWN_VARS = {BOOTSTRAP_MODE_VAR, PROCESS_NAME_VAR, LOG_CHANNEL_VAR}


class EnvProbe(Actor):
    @endpoint
    def env(self, *names):
        return {n: os.environ.get(n) for n in names}

    @endpoint
    def environ(self):
        return dict(os.environ)

    @endpoint
    def rank(self):
        return current_rank().rank


# ------------------------------------------------------------------------------------------
# the command object (pure)
# ------------------------------------------------------------------------------------------
def test_with_env_merges_overrides_deletes_and_sets_empty():
    base = BootstrapCommand("/usr/bin/python3", ["-m", "x"], {"A": "1", "KEEP": "k"})
    c = base.with_env({"A": "2", "B": ""}).with_env({"B": "3", "C": None})
    assert c.env == {"A": "2", "KEEP": "k", "B": "3", "C": None}
    assert base.env == {"A": "1", "KEEP": "k"}           # the original is untouched
    assert c.program == base.program and c.args == base.args
    assert c.with_env({"A": ""}).env["A"] == ""


def test_with_env_accepts_any_mapping_including_os_environ():
    c = default_bootstrap_cmd().with_env(os.environ)
    assert c.env["PATH"] == os.environ["PATH"]
    c2 = c.with_env(types.MappingProxyType({"PATH": None}))
    assert c2.env["PATH"] is None
    with pytest.raises(TypeError, match="mapping"):
        default_bootstrap_cmd().with_env([("A", "1")])
    with pytest.raises(TypeError, match="must be a string or None"):
        default_bootstrap_cmd().with_env({"A": 1})
    with pytest.raises(ValueError, match="not valid"):
        default_bootstrap_cmd().with_env({"A=B": "1"})


def test_env_property_is_a_copy_and_assignment_replaces():
    c = BootstrapCommand("/bin/true", [], {"A": "1"})
    e = c.env
    e["A"] = "changed"
    e["NEW"] = "x"
    assert c.env == {"A": "1"}
    c.env = {"B": "2"}
    assert c.env == {"B": "2"}
    c.env = os.environ
    assert c.env["PATH"] == os.environ["PATH"]


def test_build_environment_four_steps():
    agent_env = {"PATH": "/bin", "DROP": "x", "KEEP": "k"}
    own = {BOOTSTRAP_MODE_VAR: "proc", PROCESS_NAME_VAR: "p0", LOG_CHANNEL_VAR: "stdio"}
    cmd = BootstrapCommand("/bin/true", [], {"DROP": None, "NEW": "${PATH}:/opt/bin",
                                             BOOTSTRAP_MODE_VAR: None, PROCESS_NAME_VAR: "mine"})
    env = build_environment(cmd, agent_env, own)
    assert env == {"PATH": "/bin", "KEEP": "k", "NEW": "${PATH}:/opt/bin", **own}
    cmd.inherit_env = False
    assert build_environment(cmd, agent_env, own) == {"NEW": "${PATH}:/opt/bin", **own}


def test_default_bootstrap_cmd_runs_this_interpreter():
    # -P: not the current folder first on sys.path (a shared /tmp's sysconfig.py; issue 28)
    c = default_bootstrap_cmd()
    assert c.program == sys.executable and c.args == ["-P", "-m", "hpcmesh.runtime.proc"]
    assert c.inherit_env and c.env == {}


def test_the_public_entry_point_name_runs_the_process_main():
    # `-m hpcmesh.runtime.proc` is what users' bootstrap commands end in (README); the code
    # moved to runtime/process/proc.py, and the old name must still run it, not just import
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCMESH_SECRET")}
    out = subprocess.run([sys.executable, "-P", "-m", "hpcmesh.runtime.proc"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "no HPCMESH_SECRET/HPCMESH_SECRET_FILE" in out.stderr


# ------------------------------------------------------------------------------------------
# real processes
# ------------------------------------------------------------------------------------------
def test_inherit_env_false_starts_from_empty_but_keeps_hpcmesh_vars(monkeypatch):
    # set only in this (controller) process, after the runtime is up
    this_host()
    monkeypatch.setenv("HPCMESH_TEST_CONTROLLER_ONLY", "secret-ish")
    cmd = BootstrapCommand(sys.executable, ["-m", "hpcmesh.runtime.proc"],
                           {"MINE": "1", BOOTSTRAP_MODE_VAR: None, PROCESS_NAME_VAR: None,
                            LOG_CHANNEL_VAR: None}, inherit_env=False)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    try:
        env = pm.spawn("p", EnvProbe).slice(gpus=0).environ.call_one().get(timeout=30)
        assert env["MINE"] == "1"
        assert "HPCMESH_TEST_CONTROLLER_ONLY" not in env
        assert "PATH" not in env and "HOME" not in env
        assert env[BOOTSTRAP_MODE_VAR] == "proc"          # None in env= cannot remove these
        assert env[PROCESS_NAME_VAR] and env[LOG_CHANNEL_VAR]
        # nothing else of the controller's environment leaked in
        leaked = {k for k in env if k in os.environ and not k.startswith("HPCMESH_")}
        assert leaked <= {"LC_CTYPE"}, leaked             # (set by Python itself on startup)
    finally:
        pm.stop().get(timeout=30)


def test_inherited_env_is_the_agents_and_values_are_literal():
    # The local host agent lives in the controller process, so with inherit_env=True a
    # local process sees the controller's (= agent's) environment. Values are never expanded.
    literal = {"P": "${PATH}:/opt/bin", "H": "$HOME", "T": "~/x", "Q": "`echo hi` $(id)"}
    cmd = default_bootstrap_cmd().with_env({**literal, "EMPTY": "", "HOME": None})
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    try:
        env = pm.spawn("p", EnvProbe).slice(gpus=0).environ.call_one().get(timeout=30)
        for k, v in literal.items():
            assert env[k] == v
        assert env["EMPTY"] == "" and "HOME" not in env
        assert env["PATH"] == os.environ["PATH"]
        assert env[PROCESS_NAME_VAR] != "mine"
    finally:
        pm.stop().get(timeout=30)


def test_callable_bootstrap_command_gets_each_point_and_affects_that_call_only():
    seen = []

    def per_point(point):
        seen.append(dict(point.coords))
        return default_bootstrap_cmd().with_env({"GPU_ID": str(point["gpus"]),
                                                 "HOST_ID": str(point["hosts"]),
                                                 "RANK_SEEN": str(point.rank)})
    hosts = this_host()
    pm = hosts.spawn_procs(per_host={"hosts": 2, "gpus": 2}, bootstrap_command=per_point)
    pm2 = None
    try:
        assert seen == [{"hosts": h, "gpus": g} for h in (0, 1) for g in (0, 1)]
        vm = pm.spawn("p", EnvProbe).env.call("GPU_ID", "HOST_ID", "RANK_SEEN").get(timeout=30)
        for point, env in vm:
            assert env == {"GPU_ID": str(point["gpus"]), "HOST_ID": str(point["hosts"]),
                           "RANK_SEEN": str(point.rank)}
        # the same HostMesh, a second call without it: the default command
        pm2 = hosts.spawn_procs(per_host={"gpus": 1})
        assert pm2.spawn("q", EnvProbe).slice(gpus=0).env.call_one("GPU_ID").get(
            timeout=30) == {"GPU_ID": None}
    finally:
        pm.stop().get(timeout=30)
        if pm2 is not None:
            pm2.stop().get(timeout=30)


def test_callable_returning_garbage_is_a_clear_error():
    with pytest.raises(TypeError, match="BootstrapCommand or a callable returning one.*gpus=0"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=lambda p: "python")


def test_a_process_that_exits_before_connecting_shows_its_last_stderr_lines():
    # trailing blank lines must not take the place of the line that says what broke
    cmd = BootstrapCommand("/bin/sh", ["-c", "echo 'it broke here' >&2; "
                                       "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo >&2; done; "
                                       "exit 3"])
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    with pytest.raises(SupervisionError, match=r"(?s)exited before it connected back "
                                               r"\(exit code 3\); last stderr lines:\nit broke here$"):
        pm.spawn("p", EnvProbe).rank.call().get(timeout=60)


def test_shell_wrapper_recipe():
    cmd = BootstrapCommand("/bin/sh", ["-c", 'export X=1; exec "$0" "$@"', sys.executable,
                                       "-m", "hpcmesh.runtime.proc"], {"Y": "$X-literal"})
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=cmd)
    try:
        vm = pm.spawn("p", EnvProbe).env.call("X", "Y").get(timeout=30)
        assert vm.values() == [{"X": "1", "Y": "$X-literal"}] * 2
    finally:
        pm.stop().get(timeout=30)


def test_nccl_and_gloo_interface_exported_unless_the_user_sets_them():
    from hpcmesh.runtime.client import client_runtime
    this_host()
    agent = client_runtime().local_host_agent
    expected = dict(agent.network_env())
    pinned = [v for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if v in os.environ]
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var in pinned:       # the user's own setting wins: the agent adds nothing
            assert var not in expected
            expected[var] = os.environ[var]
        else:
            assert expected.get(var)
    cmd = default_bootstrap_cmd()
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=lambda p: cmd if p[
        "gpus"] == 0 else cmd.with_env({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}))
    try:
        vm = pm.spawn("p", EnvProbe).env.call("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME").get(
            timeout=30)
        assert vm.values()[0] == {"NCCL_SOCKET_IFNAME": expected["NCCL_SOCKET_IFNAME"],
                                  "GLOO_SOCKET_IFNAME": expected["GLOO_SOCKET_IFNAME"]}
        assert vm.values()[1] == {"NCCL_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": "lo"}
    finally:
        pm.stop().get(timeout=30)


def test_processes_start_in_the_agents_current_directory(tmp_path, monkeypatch):
    """Forked from the fork server or exec'd, a process starts where the agent is now."""
    from hpcmesh.actor import Actor, BootstrapCommand, endpoint, this_host

    class Where(Actor):
        @endpoint
        def cwd(self):
            import os as _os
            return _os.getcwd()

    monkeypatch.chdir(tmp_path)
    forked = this_host().spawn_procs({"gpus": 1})
    execd = this_host().spawn_procs({"gpus": 1}, bootstrap_command=BootstrapCommand(
        "/bin/sh", ["-c", 'exec "$0" "$@"', sys.executable, "-m", "hpcmesh.runtime.proc"]))
    try:
        for pm in (forked, execd):
            assert pm.spawn("w", Where).cwd.call().get(timeout=30).values() == [str(tmp_path)]
    finally:
        forked.stop().get(timeout=30)
        execd.stop().get(timeout=30)


def test_processes_get_their_own_group_in_the_controllers_session():
    """Forked or exec'd, a process leads a process group of its own (the agent's ``killpg``
    reaches what it starts; a terminal's Ctrl-C does not) but stays in the controller's
    session: a new session would also mean a new scheduler autogroup (see zygote._child)."""
    from hpcmesh.actor import Actor, BootstrapCommand, endpoint, this_host

    class Ids(Actor):
        @endpoint
        def ids(self):
            import os as _os
            return _os.getpid(), _os.getpgid(0), _os.getsid(0)

    forked = this_host().spawn_procs({"gpus": 2})
    execd = this_host().spawn_procs({"gpus": 1}, bootstrap_command=BootstrapCommand(
        "/bin/sh", ["-c", 'exec "$0" "$@"', sys.executable, "-m", "hpcmesh.runtime.proc"]))
    try:
        seen = (forked.spawn("i", Ids).ids.call().get(timeout=30).values()
                + execd.spawn("i", Ids).ids.call().get(timeout=30).values())
    finally:
        forked.stop().get(timeout=30)
        execd.stop().get(timeout=30)
    assert len(seen) == 3
    for pid, pgid, sid in seen:
        assert pgid == pid, (pid, pgid)
        assert sid == os.getsid(0), (pid, sid, os.getsid(0))


def test_the_agent_python_wrapper_unwraps_to_what_it_would_exec():
    """agent_bootstrap's shell runs the agent's own python: the agent sees through it (and
    forks such processes from its fork server instead of a shell and an interpreter each)."""
    from hpcmesh.runtime.process.bootstrap import (AGENT_PYTHON_VAR, PROC_MODULE,
                                                   agent_python_command, runs_entry_point,
                                                   unwrap_agent_python)
    cmd = agent_python_command("/usr/bin/python3", {"X": "1"})
    assert runs_entry_point(cmd)
    mine = unwrap_agent_python(cmd, {AGENT_PYTHON_VAR: sys.executable})
    assert (mine.program, mine.args, mine.env) == (sys.executable, ["-P", "-m", PROC_MODULE],
                                                   {"X": "1"})
    assert unwrap_agent_python(cmd, {}).program == "/usr/bin/python3"
    other = BootstrapCommand("/bin/sh", ["-c", "exec python -m x", "n"])
    assert unwrap_agent_python(other, {AGENT_PYTHON_VAR: sys.executable}) is other


def test_the_fork_server_imports_what_a_request_names_once_and_says_what_failed(
        tmp_path, monkeypatch, capsys):
    from hpcmesh.runtime.process import forkserver
    from hpcmesh.runtime.process.zygote import PRELOAD_VAR, ZYGOTE_IMPORTS_VAR, preload_names
    (tmp_path / "hpcm_probe_once.py").write_text("import builtins\n"
                                                 "builtins.hpcm_probe_count = getattr(builtins, 'hpcm_probe_count', 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {ZYGOTE_IMPORTS_VAR: "json", PRELOAD_VAR: " hpcm_probe_once, no_such_module_here ,json"}
    assert preload_names(env) == ["json", "hpcm_probe_once", "no_such_module_here"]
    import builtins
    try:
        forkserver.preload(env)
        forkserver.preload(env)
        assert builtins.hpcm_probe_count == 1
        err = capsys.readouterr().err
        assert err.count("could not import 'no_such_module_here'") == 1, err
    finally:
        sys.modules.pop("hpcm_probe_once", None)
        del builtins.hpcm_probe_count


def test_actor_processes_get_the_actor_api_and_the_users_preloads_from_the_fork_server(
        tmp_path, monkeypatch):
    """The actor API every actor process needs (and what HPCMESH_PRELOAD adds) is imported
    once by the host's fork server, so its processes start without importing it: a module
    the server imported was imported by their parent."""
    from hpcmesh.actor import Actor, endpoint
    from hpcmesh.job import ProcessJob

    (tmp_path / "hpcm_preload_probe.py").write_text("import os\nLOADED_IN = os.getpid()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("HPCMESH_PRELOAD", "hpcm_preload_probe")

    class Where(Actor):
        @endpoint
        def loaded(self):
            import os as _os
            import hpcm_preload_probe
            return (_os.environ.get("HPCMESH_ZYGOTE_IMPORTS"), hpcm_preload_probe.LOADED_IN,
                    _os.getpid(), _os.getppid())

    job = ProcessJob({"hosts": 1})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 2})
        for imports, loaded_in, pid, parent in procs.spawn("w", Where).loaded.call().get(
                timeout=60).values():
            assert imports == "hpcmesh.actor"
            assert loaded_in == parent != pid, (loaded_in, parent, pid)
        procs.stop().get(timeout=30)
    finally:
        job.kill()


def test_a_process_dead_before_its_agent_noted_it_fails_the_spawn():
    # The fork server reports a fork, then at once the exit of a process that died right
    # away (killed, a crash at start). An agent busy meanwhile reads both reports in one go,
    # before spawn_procs has noted the new pid: the exit was dropped, nothing reported the
    # process, and the spawn waited for it for ever.
    import signal
    import socket
    import time

    from hpcmesh.runtime.client import client_runtime
    from hpcmesh.runtime.process.zygote import MessageReader

    this_host()
    rt = client_runtime()
    agent = rt.local_host_agent
    deadline = time.monotonic() + 30
    while (agent.zygote is None or not agent.zygote.alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    zygote = agent.zygote
    assert zygote is not None and zygote.alive
    fd = zygote.sock.fileno()

    def reports() -> list:
        try:
            return MessageReader().feed(zygote.sock.recv(65536, socket.MSG_PEEK))
        except BlockingIOError:
            return []

    def busy_agent() -> None:
        # the process is forked, and dies, while the agent's loop does something else
        spawned = [m[2] for m in reports() if m[0] == "spawned"]
        if spawned:
            os.kill(spawned[0], signal.SIGKILL)
            until = time.monotonic() + 10
            while not any(m[0] == "exit" for m in reports()) and time.monotonic() < until:
                time.sleep(0.01)
            swap(False)
        zygote.on_readable()

    def swap(busy: bool) -> None:
        rt.node.loop.remove_reader(fd)
        rt.node.loop.add_reader(fd, busy_agent if busy else zygote.on_readable)
    rt.node.call_soon(swap, True)
    pm = None
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 1}, name="diedatonce")
        with pytest.raises(SupervisionError, match=r"exited before it connected back "
                                                   r"\(killed by SIGKILL"):
            pm.spawn("p", EnvProbe).env.call("X").get(timeout=30)
    finally:
        rt.node.call_soon(swap, False)
        if pm is not None:
            pm.stop().get(timeout=30)
