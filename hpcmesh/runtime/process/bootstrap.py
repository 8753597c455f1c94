"""How a host agent starts a process: program, arguments and the exact environment rules.

The environment on the target host is built in four steps (SPEC §4):
(1) the agent's own environment if ``inherit_env`` else empty; (2) drop the
variables whose value is ``None``; (3) set the rest; (4) add hpcmesh's own
bootstrap variables, which the user cannot remove. Values are literal strings:
nothing is expanded, and the controller's environment is never sent implicitly.

"Inherit" means the *host agent's* environment. For ``this_host()`` the agent runs
inside the controller process, so local processes do see the controller's
environment unless ``inherit_env=False``; a remote agent passes on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Sequence

from ...private_files.modules import python_module

#: Variables hpcmesh always sets on the process it starts.
BOOTSTRAP_MODE_VAR = "HPCMESH_BOOTSTRAP_MODE"
PROCESS_NAME_VAR = "HPCMESH_PROCESS_NAME"
LOG_CHANNEL_VAR = "HPCMESH_LOG_CHANNEL"
#: hpcmesh's own process entry point (``python -m`` it).
PROC_MODULE = "hpcmesh.runtime.proc"
#: Set by a host agent started through ``hpcmesh.job.slurm_agent.agent_main`` (SlurmJob,
#: SlurmAllocation, ``sbatch/workers.sh``): the interpreter it runs, which its processes
#: run too (``job.agent_mesh.agent_bootstrap``: a compute node may lack the controller's).
AGENT_PYTHON_VAR = "HPCMESH_AGENT_PYTHON"
#: "1" in a host agent whose SIGTERM is a notice, not a stop (one in a Slurm job step:
#: Slurm's SIGTERM there is a preemption's or the job's end, SIGKILL follows after GraceTime
#: or KillWait; ``agent_main``), and so in the fork server and the processes it starts:
#: they keep running on SIGTERM, and the agent stops them with SIGHUP instead.
TERM_NOTICE_VAR = "HPCMESH_TERM_IS_NOTICE"


class BootstrapCommand:
    """Program + args + env overrides used to start each process of a ProcMesh."""

    __slots__ = ("program", "args", "_env", "inherit_env")

    def __init__(self, program: str, args: Sequence[str] = (), env: Mapping | None = None,
                 inherit_env: bool = True):
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand program must be a non-empty string, got {program!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("BootstrapCommand args must be a sequence of strings, "
                            f"got {args!r}")
        self.program = program
        self.args = list(args)
        self._env: dict[str, str | None] = _checked_env(env or {})
        self.inherit_env = bool(inherit_env)

    @property
    def env(self) -> dict[str, str | None]:
        """A copy: mutating it does not change the command."""
        return dict(self._env)

    @env.setter
    def env(self, mapping: Mapping) -> None:
        self._env = _checked_env(mapping)

    def with_env(self, mapping: Mapping) -> "BootstrapCommand":
        """A copy with ``mapping`` merged on top (``None`` deletes, ``""`` sets empty)."""
        merged = dict(self._env)
        merged.update(_checked_env(mapping))
        return BootstrapCommand(self.program, self.args, merged, self.inherit_env)

    def argv(self) -> list[str]:
        return [self.program, *self.args]

    def __eq__(self, other) -> bool:
        return isinstance(other, BootstrapCommand) and (
            self.program, self.args, self._env, self.inherit_env) == (
            other.program, other.args, other._env, other.inherit_env)

    def __repr__(self) -> str:
        return (f"BootstrapCommand(program={self.program!r}, args={self.args!r}, "
                f"env={self._env!r}, inherit_env={self.inherit_env})")

    def __reduce__(self):
        return BootstrapCommand, (self.program, self.args, self._env, self.inherit_env)


def _checked_env(mapping: Mapping) -> dict[str, str | None]:
    if not isinstance(mapping, Mapping):
        raise TypeError(f"env must be a mapping of str to str or None, got {type(mapping).__name__}")
    out: dict[str, str | None] = {}
    for k, v in mapping.items():
        if not isinstance(k, str) or not k or "=" in k:
            raise ValueError(f"environment variable name {k!r} is not valid "
                             f"(non-empty string without '=')")
        if v is not None and not isinstance(v, str):
            raise TypeError(f"environment value for {k} must be a string or None, "
                            f"got {type(v).__name__} {v!r}")
        out[k] = v
    return out


def default_bootstrap_cmd(python: str | None = None) -> BootstrapCommand:
    """Start the hpcmesh process entry point with ``python`` (default: this interpreter),
    with ``-P``: the current folder is not put first on its ``sys.path``."""
    program, *args = python_module(PROC_MODULE, python)
    return BootstrapCommand(program, args, {})


#: The ``/bin/sh`` script of ``job.agent_mesh.agent_bootstrap``: run ``$HPCMESH_AGENT_PYTHON``
#: (the host agent's own interpreter, which the controller cannot know) or else ``$1``.
AGENT_PYTHON_SCRIPT = r"""
py="${HPCMESH_AGENT_PYTHON:-$1}"
shift
exec "$py" "$@"
"""


def agent_python_command(python: str | None = None, env: Mapping[str, str] | None = None
                         ) -> BootstrapCommand:
    """The entry point run by the host agent's own python, chosen on the host (a ``/bin/sh``
    wrapper; ``python`` if the agent names none)."""
    return BootstrapCommand("/bin/sh", ["-c", AGENT_PYTHON_SCRIPT, "hpcmesh-proc",
                                        *python_module(PROC_MODULE, python)], dict(env or {}))


def unwrap_agent_python(cmd: BootstrapCommand, env: Mapping[str, str]) -> BootstrapCommand:
    """What ``agent_python_command``'s wrapper would exec with the process environment
    ``env`` (the interpreter and its arguments); any other command as it is. Lets the agent
    fork such a process from its fork server, as it does the default command, instead of
    starting a shell and a fresh interpreter for each."""
    if cmd.program != "/bin/sh" or cmd.args[:3] != ["-c", AGENT_PYTHON_SCRIPT, "hpcmesh-proc"] \
            or len(cmd.args) < 4:
        return cmd
    return BootstrapCommand(env.get(AGENT_PYTHON_VAR) or cmd.args[3], cmd.args[4:], cmd.env)


def runs_entry_point(cmd: BootstrapCommand) -> bool:
    """Whether ``cmd`` ends in ``-m hpcmesh.runtime.proc``: hpcmesh's own entry point, run
    directly or through a launcher that picks the interpreter (``slurm_bootstrap``'s shell).
    Those get hpcmesh's GPU binding; any other program chooses GPUs for itself."""
    return cmd.args[-2:] == ["-m", PROC_MODULE]


def build_environment(cmd: BootstrapCommand, agent_env: Mapping[str, str],
                      bootstrap_vars: Mapping[str, str],
                      defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """Apply the four steps; ``bootstrap_vars`` are hpcmesh's own and always win.

    ``defaults`` (the host's network choice for NCCL/gloo) go under everything else:
    a variable the agent's environment or the command sets, or deletes, wins."""
    env: dict[str, str] = dict(defaults or {})
    if cmd.inherit_env:
        env.update(agent_env)
    for k, v in cmd._env.items():
        if v is None:
            env.pop(k, None)
    for k, v in cmd._env.items():
        if v is not None:
            env[k] = v
    env.update(bootstrap_vars)
    return env
