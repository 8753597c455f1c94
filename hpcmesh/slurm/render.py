"""Render the sbatch script that starts a JobSpec's host agents.

The script is a pure function of its inputs (no clock, no host, no random), so
``hpcmesh render`` output can be diffed and cached, and a spec change is visible.
Its layout lives in ``hpcmesh/templates/sbatch.sh.tmpl``; this module fills it.
"""

from __future__ import annotations

import re
import shlex
import string
from importlib import resources
from typing import Mapping, Sequence

from .spec import JobSpec, MeshSpec, SpecError

__all__ = [
    "render_sbatch",
    "sbatch_test_only_command",
    "sbatch_submit_command",
    "TEMPLATE_NAME",
    "PLACEHOLDER_PYTHON",
    "PLACEHOLDER_MESH",
]

TEMPLATE_NAME = "sbatch.sh.tmpl"
#: In a worker command, replaced by the mesh's ``python`` executable.
PLACEHOLDER_PYTHON = "{python}"
#: In a worker command, replaced by the mesh name.
PLACEHOLDER_MESH = "{mesh}"


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _ScriptTemplate(string.Template):
    """``@@{name}`` placeholders, so the shell's own ``$x``/``${x}`` stay untouched."""

    delimiter = "@@"
    pattern = r"@@(?:(?P<escaped>@@)|(?P<named>(?!x)x)|\{(?P<braced>[a-z_]+)\}|(?P<invalid>))"


def _template() -> _ScriptTemplate:
    text = resources.files("hpcmesh").joinpath("templates").joinpath(TEMPLATE_NAME).read_text("utf-8")
    return _ScriptTemplate(text)


def sbatch_test_only_command(script_path: str) -> list[str]:
    """argv that asks Slurm to validate a script and estimate its start, submitting nothing."""
    return ["sbatch", "--test-only", str(script_path)]


def sbatch_submit_command(script_path: str) -> list[str]:
    """argv that submits a script; stdout is ``jobid[;cluster]`` (see parsing.parse_sbatch_parsable)."""
    return ["sbatch", "--parsable", str(script_path)]


def _worker_argv(worker_command: Sequence[str] | str) -> list[str]:
    if isinstance(worker_command, str):
        try:
            argv = shlex.split(worker_command)
        except ValueError as exc:
            raise ValueError(f"cannot split worker command {worker_command!r}: {exc}") from None
    else:
        argv = [str(a) for a in worker_command]
    if not argv:
        raise ValueError("worker command is empty; expected e.g. "
                         "['{python}', '-P', '-m', 'hpcmesh', 'worker', '--attach', 'tcp://...']")
    return argv


def _quote_cmd(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _env_lines(env: Mapping[str, str | None]) -> list[str]:
    out = []
    for name in sorted(env):
        value = env[name]
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        out.append(f"unset {name}" if value is None else f"export {name}={shlex.quote(str(value))}")
    return out


def _signal_parts(signal: str) -> tuple[str, str | None]:
    """``USR1@90`` -> (``B:USR1@90``, ``USR1``); the second is the signal to trap, if any."""
    flags, sep, rest = signal.partition(":")
    if not sep:
        flags, rest = "B", signal  # signal the batch shell, which forwards it (see template)
    sig = rest.split("@", 1)[0]
    if sig.startswith("SIG"):
        sig = sig[3:]
    return f"{flags}:{rest}", (sig if "B" in flags else None)


def _header(spec: JobSpec, meshes: list[MeshSpec], job_name: str,
            exclude: Sequence[str]) -> list[str]:
    first = meshes[0]  # allocation-wide keys are equal across meshes (JobSpec checks it)
    nodes = sum(m.nodes for m in meshes) + spec.spare_nodes
    d = [f"--job-name={job_name}", f"--nodes={nodes}",
         f"--ntasks-per-node={max(m.ntasks_per_node for m in meshes)}"]
    cpus = [m.cpus_per_task for m in meshes if m.cpus_per_task is not None]
    if cpus:
        d.append(f"--cpus-per-task={max(cpus)}")
    if first.gpus_per_node:
        d.append(f"--gpus-per-node={first.gpus_per_node}")
    for opt, value in (("mem", first.mem), ("time", first.time), ("partition", first.partition),
                       ("account", first.account), ("qos", first.qos),
                       ("constraint", first.constraint)):
        if value is not None:
            d.append(f"--{opt}={value}")
    if first.exclusive:
        d.append("--exclusive")
    d.append(f"--output={spec.log_dir}/{job_name}-%j.out")
    d.append(f"--error={spec.log_dir}/{job_name}-%j.err")
    if first.signal:
        d.append(f"--signal={_signal_parts(first.signal)[0]}")
    d.append("--requeue" if first.requeue else "--no-requeue")
    if spec.spare_nodes:
        d.append("--no-kill")   # a failed node leaves the job running, for a spare to replace
    if exclude:
        d.append(f"--exclude={','.join(exclude)}")
    d.extend(first.sbatch_extra)
    return [f"#SBATCH {x}" for x in d]


def _node_names(nodes: Sequence[str]) -> list[str]:
    """Node names for ``--exclude``, checked: a name with a comma, a space or a shell
    character would change what the line asks for."""
    out = []
    for n in nodes:
        if not isinstance(n, str) or not re.match(r"^[A-Za-z0-9_.\-\[\]]+$", n):
            raise ValueError(f"exclude: {n!r} is not a Slurm node name (letters, digits, "
                             f"'_', '.', '-', and [] ranges)")
        out.append(n)
    return out


def _mesh_block(mesh: MeshSpec, offset: int | None, argv: list[str], spares: bool) -> str:
    cmd = [a.replace(PLACEHOLDER_PYTHON, mesh.python).replace(PLACEHOLDER_MESH, mesh.name)
           for a in argv]
    srun = ["srun", f"--nodes={mesh.nodes}", f"--ntasks={mesh.nodes * mesh.ntasks_per_node}",
            f"--ntasks-per-node={mesh.ntasks_per_node}"]
    if mesh.cpus_per_task is not None:
        srun.append(f"--cpus-per-task={mesh.cpus_per_task}")  # srun 22.05+ does not inherit it
    else:
        srun.append("--cpu-bind=none")  # else the agent and all it forks share one CPU
    if spares and offset is None:
        offset = 0              # the spare nodes are the allocation's last: keep them free
    if offset is not None:
        srun.append(f"--relative={offset}")
    # with spares, a lost node ends only its own tasks (srun --no-kill), not the step's
    # tasks on the other nodes: their processes go on while a spare takes its place
    srun.append("--no-kill" if spares else "--kill-on-bad-exit=1")
    if offset is None:
        where = "every node of the allocation"
    elif mesh.nodes == 1:
        where = f"node {offset} of the allocation"
    else:
        where = f"nodes {offset}-{offset + mesh.nodes - 1} of the allocation"
    lines = [f"# mesh {mesh.name!r}: {where}, {mesh.ntasks_per_node} task(s) per node",
             "(",
             *_env_lines({**mesh.env, "HPCMESH_MESH_NAME": mesh.name})]
    if mesh.setup:
        lines.append("set +u  # setup scripts (module, conda, venv) often read unset variables")
        lines.extend(mesh.setup)  # verbatim: indenting would break heredocs
        lines.append("set -u")
    lines.append(f"exec {_quote_cmd(srun)} {_quote_cmd(cmd)}")
    lines.append(") &")
    lines.append('_hm_pids+=("$!")')
    return "\n".join(lines)


_FINISH = """\
# ---- wait for every step; the job ends with the first failure's status
_hm_rc=0
for _hm_pid in "${_hm_pids[@]}"; do
    _hm_wait "$_hm_pid"
    if [ "$_hm_status" -ne 0 ] && [ "$_hm_rc" -eq 0 ]; then
        _hm_rc=$_hm_status
    fi
done
exit "$_hm_rc"
"""

_FINISH_CLIENT = """\
# ---- the client runs here, inside the allocation; HPCMESH_BATCH_JOB=1 makes it
# attach to these host agents instead of submitting a new job
(
export HPCMESH_BATCH_JOB=1
exec @@{client}
) &
_hm_client=$!
_hm_wait "$_hm_client"
_hm_rc=$_hm_status
# the client is done: stop the host agents, end the job with the client's status
_hm_forward TERM
for _hm_pid in "${_hm_pids[@]}"; do
    _hm_wait "$_hm_pid"
done
exit "$_hm_rc"
"""


def render_sbatch(
    spec: JobSpec,
    worker_command: Sequence[str] | str,
    env: Mapping[str, str | None] | None = None,
    *,
    meshes: Sequence[str] | None = None,
    client_command: Sequence[str] | str | None = None,
    exclude: Sequence[str] = (),
) -> str:
    """The sbatch script that starts host agents for ``spec`` (or the ``meshes`` group of it).

    ``worker_command`` runs once per task of each mesh (an argv list, or a string
    split like a shell would); every argument is shell-quoted, so values are
    literal. ``{python}`` and ``{mesh}`` inside it become the mesh's python and
    name; each task also sees ``HPCMESH_MESH_NAME``. ``env`` is exported for all
    meshes (None unsets). With ``same_allocation: false`` pass ``meshes=[name]``
    (one script per mesh, job name ``<job_name>-<mesh>``); ``spec.allocation_groups()``
    lists the groups. ``client_command``, if given, runs on the batch host after
    the agents start, with ``HPCMESH_BATCH_JOB=1``; the job ends when it exits.
    ``exclude``: nodes Slurm must not give the job (``--exclude``: nodes it lost before).
    """
    groups = spec.allocation_groups()
    if meshes is None:
        if len(groups) != 1:
            raise ValueError(f"job spec {spec.job_name!r} has same_allocation: false, so each "
                             f"mesh is its own sbatch script; pass meshes=[name] with one of "
                             f"{', '.join(spec.meshes)}")
        names = groups[0]
    else:
        names = list(meshes)
        unknown = [n for n in names if n not in spec.meshes]
        if unknown:
            raise ValueError(f"unknown mesh {unknown[0]!r}; the spec has {', '.join(spec.meshes)}")
        if not names or not any(sorted(names, key=list(spec.meshes).index) == g for g in groups):
            raise ValueError(f"meshes {names!r} are not one allocation of this spec; its "
                             f"allocations are {groups!r}")
        names = sorted(names, key=list(spec.meshes).index)
    chosen = [spec.meshes[n] for n in names]
    job_name = spec.job_name if len(groups) == 1 else f"{spec.job_name}-{names[0]}"
    argv = _worker_argv(worker_command)

    blocks = []
    offset = 0
    for mesh in chosen:
        blocks.append(_mesh_block(mesh, offset if len(chosen) > 1 else None, argv,
                                  bool(spec.spare_nodes)))
        offset += mesh.nodes

    signal = chosen[0].signal
    trap_sig = _signal_parts(signal)[1] if signal else None
    traps = (f"trap '_hm_forward {trap_sig}' {trap_sig}" if trap_sig
             else "# (no batch-shell signal requested: nothing to forward)")

    if client_command is not None:
        finish = _FINISH_CLIENT.replace("@@{client}", _quote_cmd(_worker_argv(client_command)))
    else:
        finish = _FINISH
    summary = [f"#   {m.name}: {m.nodes} node(s), python {m.python}" for m in chosen]
    if spec.spare_nodes:
        summary.append(f"#   {spec.spare_nodes} spare node(s), idle until one replaces a lost "
                       f"host")
    exports = _env_lines(dict(env or {})) or ["# (none)"]
    try:
        return _template().substitute(
            directives="\n".join(_header(spec, chosen, job_name, _node_names(exclude))),
            job_name=job_name,
            mesh_summary="\n".join(summary),
            exports="\n".join(exports),
            traps=traps,
            mesh_blocks="\n\n".join(blocks),
            finish=finish.rstrip("\n"),
        )
    except (KeyError, ValueError) as exc:  # a broken template file, not a user error
        raise SpecError(f"template {TEMPLATE_NAME} is broken: {exc}") from None
