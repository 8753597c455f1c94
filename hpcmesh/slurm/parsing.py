"""Pure parsers for what Slurm tells us: ``SLURM_*`` variables and squeue/sacct text.

Nothing here runs a command. Callers run ``squeue``/``sacct`` with the argv
returned by :func:`command_for_squeue` / :func:`command_for_sacct` and hand the
text to :func:`parse_squeue` / :func:`parse_sacct`. We parse ``--format`` /
``--parsable2`` text rather than ``--json`` because the JSON schema changed
between releases (22.05 vs 24.11: ``meta.Slurm`` vs ``meta.slurm``, ``job_state``
a string vs a list, plain numbers vs ``{set, infinite, number}`` objects), while
the ``-o`` text output stayed the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import hostlist  # python-hostlist
from ..errors import HpcmeshError

__all__ = [
    "SlurmParseError",
    "expand_hostlist",
    "compress_hostlist",
    "parse_tasks_per_node",
    "parse_gpu_count",
    "parse_slurm_duration",
    "parse_exit_code",
    "normalize_state",
    "SLURM_STATES_TERMINAL",
    "SLURM_STATES_ACTIVE",
    "Allocation",
    "clean_env_for_nested_srun",
    "SQUEUE_FORMAT",
    "SQUEUE_FIELDS",
    "JobRecord",
    "command_for_squeue",
    "parse_squeue",
    "squeue_job_unknown",
    "SACCT_FORMAT",
    "SACCT_FIELDS",
    "SacctRecord",
    "command_for_sacct",
    "parse_sacct",
    "sacct_unavailable",
    "parse_sbatch_parsable",
]


class SlurmParseError(HpcmeshError, ValueError):
    """Slurm output or a ``SLURM_*`` value we cannot understand; names input and expected form."""


# --------------------------------------------------------------------------
# hostlists and counts


def expand_hostlist(s: str) -> list[str]:
    """``node[01-04,07],gpu-a[1-2]`` -> ``['node01', ..., 'gpu-a2']``, in Slurm's order.

    Order is kept (not sorted) because rank assignment follows the nodelist.
    """
    if not isinstance(s, str):
        raise SlurmParseError(f"hostlist must be a string, got {type(s).__name__} {s!r}")
    text = s.strip()
    if not text:
        return []
    if any(c.isspace() for c in text):
        raise SlurmParseError(
            f"cannot expand hostlist {s!r}: it contains whitespace; expected a Slurm "
            "hostlist like 'node[01-04,07],gpu-a[1-2]'"
        )
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise SlurmParseError(
            f"cannot expand hostlist {s!r} ({exc}); expected a Slurm hostlist like "
            "'node[01-04,07],gpu-a[1-2]'"
        ) from None
    return list(names)


def compress_hostlist(names: Iterable[str]) -> str:
    """``['node01', 'node02', 'node07']`` -> ``'node[01-02,07]'`` (python-hostlist sorts)."""
    items = list(names)
    for name in items:
        if not isinstance(name, str) or not name or any(c in name for c in " \t\n,[]"):
            raise SlurmParseError(
                f"cannot compress host name {name!r}: expected plain host names like 'node01'"
            )
    return hostlist.collect_hostlist(items)


_TPN_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(s: str) -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]``; the form of SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE."""
    expected = "expected comma-separated counts like '4', '2(x3),1' or '1,2(x2)'"
    if not isinstance(s, str) or not s.strip():
        raise SlurmParseError(f"cannot parse tasks-per-node value {s!r}: {expected}")
    out: list[int] = []
    for part in s.strip().split(","):
        m = _TPN_ITEM.match(part.strip())
        if not m:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {s!r} at {part!r}: {expected}"
            )
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if repeat < 1:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {s!r}: repeat count in {part!r} must be >= 1"
            )
        out.extend([count] * repeat)
    return out


_GPU_ITEM = re.compile(r"^(?:[A-Za-z][\w.-]*:)*(\d+)$")


def parse_gpu_count(s: str) -> int:
    """GPUs per node from ``2``, ``gpu:2``, ``a100:4``, ``gpu:a100:4`` or ``a100:2,v100:1`` (summed)."""
    expected = "expected a count with optional type like '2', 'gpu:2', 'a100:4' or 'a100:2,v100:1'"
    if not isinstance(s, str) or not s.strip():
        raise SlurmParseError(f"cannot parse GPU count {s!r}: {expected}")
    total = 0
    for part in s.strip().split(","):
        item = re.sub(r"\(.*\)$", "", part.strip())  # scontrol-style "(S:0-1)" socket suffix
        m = _GPU_ITEM.match(item)
        if not m:
            raise SlurmParseError(f"cannot parse GPU count {s!r} at {part!r}: {expected}")
        total += int(m.group(1))
    return total


_DURATION = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
_NO_DURATION = {"UNLIMITED", "INFINITE", "INVALID", "NOT_SET", "PARTITION_LIMIT", "N/A", "NONE", ""}


def parse_slurm_duration(s: str | None) -> int | None:
    """Seconds from any Slurm time form (``M``, ``M:SS``, ``H:MM:SS``, ``D-HH[:MM[:SS]]``).

    Returns None for ``UNLIMITED``, ``INVALID``, ``NOT_SET``, ``Partition_Limit`` or empty,
    since those mean "no number", not zero. A bare number is minutes, as in ``--time``.
    """
    if s is None:
        return None
    text = s.strip()
    if text.upper() in _NO_DURATION:
        return None
    m = _DURATION.match(text)
    if not m:
        raise SlurmParseError(
            f"cannot parse Slurm duration {s!r}: expected minutes, M:SS, H:MM:SS, D-HH, "
            "D-HH:MM or D-HH:MM:SS (or UNLIMITED)"
        )
    if m.group("days") is not None:
        d, h = int(m.group("days")), int(m.group("dh"))
        mi, sec = int(m.group("dm") or 0), int(m.group("ds") or 0)
        return ((d * 24 + h) * 60 + mi) * 60 + sec
    a, b, c = m.group("a"), m.group("b"), m.group("c")
    if c is not None:  # H:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # M:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # minutes


def parse_exit_code(s: str | None) -> tuple[int | None, int | None]:
    """sacct ``ExitCode`` ``'0:15'`` -> ``(0, 15)`` (exit status, signal); empty -> (None, None)."""
    if s is None or not s.strip():
        return None, None
    m = re.match(r"^(\d+)(?::(\d+))?$", s.strip())
    if not m:
        raise SlurmParseError(
            f"cannot parse exit code {s!r}: expected 'status:signal' like '0:0' or '1:15'"
        )
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


# --------------------------------------------------------------------------
# job states

# Long names of squeue's compact codes (%t), so either column can be parsed.
_SHORT_STATES = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
    "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED", "R": "RUNNING",
    "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD", "RQ": "REQUEUED",
    "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING", "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT", "S": "SUSPENDED", "ST": "STOPPED", "TO": "TIMEOUT",
}

#: The job will not run again (this run is over and nothing will requeue it by itself).
SLURM_STATES_TERMINAL = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT",
})
#: The job holds or may still get nodes (held and requeued jobs included: they can run again).
SLURM_STATES_ACTIVE = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED",
    "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESV_DEL_HOLD", "SPECIAL_EXIT",
})


def normalize_state(s: str) -> str:
    """``'cancelled by 0'`` / ``'CANCELLED+'`` / ``'CA'`` -> ``'CANCELLED'``."""
    if not isinstance(s, str) or not s.strip():
        raise SlurmParseError(f"empty job state {s!r}: expected a Slurm state like RUNNING")
    word = s.strip().split()[0].upper().rstrip("+")
    return _SHORT_STATES.get(word, word)


def _state_detail(s: str) -> str:
    parts = s.strip().split(None, 1)
    return parts[1] if len(parts) > 1 else ""


# --------------------------------------------------------------------------
# SLURM_* environment -> Allocation

# Step ids Slurm uses for its special steps (slurm.h, 20.11 and later).
_SPECIAL_STEPS = {
    "4294967290": "interactive",  # SLURM_INTERACTIVE_STEP
    "4294967291": "batch",        # SLURM_BATCH_SCRIPT
    "4294967292": "extern",       # SLURM_EXTERN_CONT
}


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise SlurmParseError(f"{name}={raw!r} is not an integer") from None


def _env_str(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip():
            return raw.strip()
    return None


def _env_hosts(env: Mapping[str, str], name: str) -> list[str]:
    try:
        return expand_hostlist(env[name])
    except SlurmParseError as exc:
        raise SlurmParseError(f"{name}: {exc}") from None


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in, as ``SLURM_*`` variables describe it.

    Memory values are in MB, as Slurm exports them. ``tasks_per_node`` is what
    SLURM_TASKS_PER_NODE says for the current context (inside an srun step it is the
    step's layout, which may cover fewer nodes than ``nodes``). List fields make
    instances unhashable; compare them with ``==``.
    """

    job_id: str
    nodes: list[str]
    tasks_per_node: list[int] = field(default_factory=list)
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    cpus_on_node: int | None = None
    cpus_per_node: list[int] = field(default_factory=list)
    mem_per_node: int | None = None
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    partition: str | None = None
    job_name: str | None = None
    account: str | None = None
    cluster: str | None = None
    step_id: str | None = None
    step_nodes: list[str] = field(default_factory=list)
    node_name: str | None = None
    submit_host: str | None = None
    submit_dir: str | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def in_step(self) -> bool:
        """True inside an ``srun`` step (not the batch script, salloc shell or extern step)."""
        return self.step_id is not None and self.step_id.isdigit()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Allocation | None":
        """Read an allocation from ``env``; None when SLURM_JOB_ID is unset (no allocation).

        Raises SlurmParseError when the variables contradict each other (a node count
        that does not match the nodelist) or cannot be parsed, naming the variables.
        """
        job_id = _env_str(env, "SLURM_JOB_ID", "SLURM_JOBID")
        if job_id is None:
            return None

        # SLURM_JOB_NODELIST is the whole job; inside a step SLURM_NODELIST is the step's.
        if _env_str(env, "SLURM_JOB_NODELIST"):
            list_var = "SLURM_JOB_NODELIST"
        elif _env_str(env, "SLURM_NODELIST"):
            list_var = "SLURM_NODELIST"
        else:
            raise SlurmParseError(
                f"SLURM_JOB_ID={job_id} is set but neither SLURM_JOB_NODELIST nor "
                "SLURM_NODELIST is; expected a hostlist like 'node[01-04]'"
            )
        nodes = _env_hosts(env, list_var)
        if not nodes:
            raise SlurmParseError(f"{list_var}={env[list_var]!r} names no nodes")

        # Cross-check each count against the list it describes: the job's pair, and
        # SLURM_NNODES/SLURM_NODELIST, which srun rewrites to the step's values.
        step_list_var = "SLURM_NODELIST" if _env_str(env, "SLURM_NODELIST") else list_var
        for nvar, lvar in (("SLURM_JOB_NUM_NODES", list_var), ("SLURM_NNODES", step_list_var)):
            count = _env_int(env, nvar)
            if count is None:
                continue
            listed = nodes if lvar == list_var else _env_hosts(env, lvar)
            if count != len(listed):
                raise SlurmParseError(
                    f"{nvar}={count} does not match {lvar}={env[lvar]!r}, which names "
                    f"{len(listed)} node(s)"
                )

        def counts(name: str) -> list[int]:
            raw = _env_str(env, name)
            if raw is None:
                return []
            try:
                return parse_tasks_per_node(raw)
            except SlurmParseError as exc:
                raise SlurmParseError(f"{name}: {exc}") from None

        gpus = _env_int(env, "SLURM_GPUS_ON_NODE")
        if gpus is None:
            raw = _env_str(env, "SLURM_GPUS_PER_NODE")
            if raw is not None:
                try:
                    gpus = parse_gpu_count(raw)
                except SlurmParseError as exc:
                    raise SlurmParseError(f"SLURM_GPUS_PER_NODE: {exc}") from None
        if gpus is None:
            # Index lists ("0,1,2,3") of the GPUs on this node; count them as a last resort.
            raw = _env_str(env, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
            if raw is not None:
                gpus = len([g for g in raw.split(",") if g.strip()])

        step_raw = _env_str(env, "SLURM_STEP_ID", "SLURM_STEPID")
        step_id = _SPECIAL_STEPS.get(step_raw, step_raw) if step_raw is not None else None
        step_nodes = (
            _env_hosts(env, "SLURM_STEP_NODELIST") if _env_str(env, "SLURM_STEP_NODELIST") else []
        )

        return cls(
            job_id=job_id,
            nodes=nodes,
            tasks_per_node=counts("SLURM_TASKS_PER_NODE"),
            gpus_per_node=gpus,
            cpus_per_task=_env_int(env, "SLURM_CPUS_PER_TASK"),
            cpus_on_node=_env_int(env, "SLURM_CPUS_ON_NODE"),
            cpus_per_node=counts("SLURM_JOB_CPUS_PER_NODE"),
            mem_per_node=_env_int(env, "SLURM_MEM_PER_NODE"),
            mem_per_cpu=_env_int(env, "SLURM_MEM_PER_CPU"),
            mem_per_gpu=_env_int(env, "SLURM_MEM_PER_GPU"),
            partition=_env_str(env, "SLURM_JOB_PARTITION"),
            job_name=_env_str(env, "SLURM_JOB_NAME"),
            account=_env_str(env, "SLURM_JOB_ACCOUNT"),
            cluster=_env_str(env, "SLURM_CLUSTER_NAME"),
            step_id=step_id,
            step_nodes=step_nodes,
            node_name=_env_str(env, "SLURMD_NODENAME"),
            submit_host=_env_str(env, "SLURM_SUBMIT_HOST"),
            submit_dir=_env_str(env, "SLURM_SUBMIT_DIR"),
        )


# --------------------------------------------------------------------------
# environment hygiene for `srun --overlap` inside an allocation

# Removed by prefix. Each one describes the *calling* step/task, and srun reads
# several of them back as if they were options for the new step.
_NESTED_DROP_PREFIXES: tuple[tuple[str, str], ...] = (
    # CPU masks of the outer step's tasks; reapplied to the new step they point at
    # CPUs it may not own ("CPU binding outside of job step allocation").
    ("SLURM_CPU_BIND", "outer step's CPU binding"),
    # Same for memory binding (NUMA masks of the outer tasks).
    ("SLURM_MEM_BIND", "outer step's memory binding"),
    # SLURM_STEP_ID, _NODELIST, _NUM_NODES, _NUM_TASKS, _TASKS_PER_NODE, _GPUS,
    # _LAUNCHER_PORT, _RESV_PORTS...: identity and layout of the outer step; srun
    # sets fresh ones for the new step, anything launched otherwise must not see stale ones.
    ("SLURM_STEP_", "outer step's identity/layout"),
    # --ntasks-per-node/-socket/-core/-gpu/-tres read back as input: the outer
    # layout, not the one-agent-per-node layout we ask for explicitly.
    ("SLURM_NTASKS_PER_", "outer task layout (input for srun)"),
    # Rendezvous of the calling MPI rank's PMIx server; a non-MPI child would attach to it.
    ("PMIX_SERVER_URI", "outer MPI rank's PMIx server"),
)

_NESTED_DROP: dict[str, str] = {
    "SLURM_STEPID": "outer step id (old name)",
    # Identity of the calling task; srun sets these per new task.
    "SLURM_PROCID": "calling task's rank",
    "SLURM_LOCALID": "calling task's local rank",
    "SLURM_NODEID": "calling task's node index",
    "SLURM_TASK_PID": "calling task's pid",
    "SLURM_GTIDS": "calling step's task ids",
    "SLURM_LAUNCH_NODE_IPADDR": "outer srun's address",
    "SLURM_SRUN_COMM_HOST": "outer srun's address",
    "SLURM_SRUN_COMM_PORT": "outer srun's port",
    # srun reads these as -n: with the job's --ntasks=8 still exported, a step of
    # 2 nodes x 1 task asks for 8 tasks and srun ignores --ntasks-per-node.
    "SLURM_NTASKS": "job task count (input for srun -n)",
    "SLURM_NPROCS": "job task count (old name of SLURM_NTASKS)",
    # -m layout of the outer launch; "arbitrary" with a hostfile would break the step.
    "SLURM_DISTRIBUTION": "outer task distribution (input for srun -m)",
    # Per-task resources of the outer layout. A host agent is one task per node and
    # must see every GPU/CPU of the node; these would confine it to one task's share,
    # and SLURM_TRES_PER_TASK=cpu:N contradicting --cpus-per-task is a fatal srun error.
    "SLURM_TRES_PER_TASK": "outer per-task TRES (conflicts with --cpus-per-task)",
    "SLURM_GPUS_PER_TASK": "outer per-task GPUs",
    "SLURM_CPUS_PER_GPU": "outer per-GPU CPUs (exclusive with --cpus-per-task)",
    "SLURM_GPU_BIND": "outer per-task GPU binding",
    # --exact/--exclusive read back from the environment contradict --overlap.
    "SLURM_EXACT": "input for srun --exact (contradicts --overlap)",
    "SLURM_EXCLUSIVE": "input for srun --exclusive (contradicts --overlap)",
    # Rank identity of a calling MPI process (PMI-1/2 and PMIx); the new step is not that rank.
    "PMI_FD": "outer MPI rank's PMI socket",
    "PMI_RANK": "outer MPI rank",
    "PMI_SIZE": "outer MPI size",
    "PMIX_RANK": "outer MPI rank",
    "PMIX_NAMESPACE": "outer MPI namespace",
}

# srun refuses more than one of these ("SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and
# SLURM_MEM_PER_NODE are mutually exclusive"); the job exports two when it asked for
# one and the partition has a default for another. Keep the first in this order:
# per-node is what a one-agent-per-node step uses, then per-CPU, then per-GPU.
_MEM_VARS = ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU")


def _tres_cpu(value: str | None) -> int | None:
    """``cpu:4,gres/gpu:1`` -> 4 (the form of SLURM_TRES_PER_TASK)."""
    for part in (value or "").split(","):
        name, _, count = part.strip().partition(":")
        if name == "cpu" and count.isdigit():
            return int(count)
    return None


def clean_env_for_nested_srun(
    env: Mapping[str, str], cpus_per_task: int | None
) -> tuple[dict[str, str], list[str]]:
    """Environment and extra srun arguments for ``srun --overlap`` started inside an allocation.

    Returns ``(new_env, extra_args)``; ``env`` is not modified. The caller adds
    ``--overlap``, ``--nodes``/``--ntasks-per-node`` and the command itself.

    ``--cpus-per-task`` is restated explicitly because srun 22.05-23.02 stopped
    reading SLURM_CPUS_PER_TASK; with ``cpus_per_task=None`` it is taken from
    SLURM_CPUS_PER_TASK (or ``cpu:N`` in SLURM_TRES_PER_TASK). With no CPU count at
    all, ``--cpu-bind=none`` is passed instead: a single-task step would otherwise be
    bound to one CPU, and every process the host agent forks would share it.
    """
    out: dict[str, str] = {}
    for name, value in env.items():
        if name in _NESTED_DROP:
            continue
        if any(name.startswith(prefix) for prefix, _ in _NESTED_DROP_PREFIXES):
            continue
        out[name] = value

    # Inside a step, srun rewrote SLURM_NODELIST/SLURM_NNODES to the step's nodes, and
    # srun reads SLURM_NNODES back as -N; put the allocation's values back.
    for step_var, job_var in (("SLURM_NODELIST", "SLURM_JOB_NODELIST"),
                              ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")):
        if job_var in out and step_var in out:
            out[step_var] = out[job_var]
    # The calling step's task layout; srun computes the new step's.
    out.pop("SLURM_TASKS_PER_NODE", None)

    kept_mem = next((v for v in _MEM_VARS if v in out), None)
    for name in _MEM_VARS:
        if name != kept_mem:
            out.pop(name, None)

    if cpus_per_task is None:
        raw = (env.get("SLURM_CPUS_PER_TASK") or "").strip()
        if raw:
            try:
                cpus_per_task = int(raw)
            except ValueError:
                raise SlurmParseError(f"SLURM_CPUS_PER_TASK={raw!r} is not an integer") from None
        else:
            cpus_per_task = _tres_cpu(env.get("SLURM_TRES_PER_TASK"))
    if cpus_per_task is not None:
        if isinstance(cpus_per_task, bool) or not isinstance(cpus_per_task, int) or cpus_per_task < 1:
            raise ValueError(f"cpus_per_task must be a positive integer, got {cpus_per_task!r}")
        args = [f"--cpus-per-task={cpus_per_task}"]
    else:
        args = ["--cpu-bind=none"]
    return out, args


# --------------------------------------------------------------------------
# squeue

#: ``squeue --noheader --format=SQUEUE_FORMAT``: id|state|reason|nodes|name|#nodes|used|limit|partition
SQUEUE_FORMAT = "%i|%T|%r|%N|%j|%D|%M|%l|%P"
SQUEUE_FIELDS = ("job_id", "state", "reason", "nodes", "name", "num_nodes",
                 "time_used", "time_limit", "partition")
_SQUEUE_NAME_INDEX = SQUEUE_FIELDS.index("name")


@dataclass(frozen=True)
class JobRecord:
    """One squeue line. ``state`` is normalized (``RUNNING``); ``reason`` is squeue's text
    (``None`` for running jobs, ``Resources``/``Priority``/... while pending).
    ``job_id`` is a string: arrays and het jobs print ``123_4``, ``123_[1-5]``, ``123+0``.
    """

    job_id: str
    state: str
    reason: str
    nodes: list[str]
    name: str
    num_nodes: int | None
    time_used: str
    time_limit: str
    partition: str

    @property
    def is_terminal(self) -> bool:
        return self.state in SLURM_STATES_TERMINAL

    @property
    def is_active(self) -> bool:
        return self.state in SLURM_STATES_ACTIVE

    @property
    def time_used_seconds(self) -> int | None:
        return parse_slurm_duration(self.time_used)

    @property
    def time_limit_seconds(self) -> int | None:
        return parse_slurm_duration(self.time_limit)


def _job_id_list(job_ids: Iterable[str | int] | str | int) -> str:
    if isinstance(job_ids, (str, int)):
        job_ids = [job_ids]
    ids = [str(j).strip() for j in job_ids]
    if not ids or any(not j or "," in j or any(c.isspace() for c in j) for j in ids):
        raise ValueError(f"expected one or more job ids like '1234', got {ids!r}")
    return ",".join(ids)


def command_for_squeue(job_ids: Iterable[str | int] | str | int) -> list[str]:
    """argv for squeue on these jobs, in the format :func:`parse_squeue` reads.

    ``--states=all`` keeps jobs that just ended visible (until MinJobAge), so a
    poller sees COMPLETED/FAILED instead of the job vanishing.
    """
    return ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all",
            f"--jobs={_job_id_list(job_ids)}"]


def _split_fields(line: str, n: int, free: int) -> list[str] | None:
    """Split on ``|``; extra pipes belong to the free-text field at index ``free``."""
    parts = line.split("|")
    if len(parts) < n:
        return None
    extra = len(parts) - n
    if extra:
        parts = parts[:free] + ["|".join(parts[free:free + extra + 1])] + parts[free + extra + 1:]
    return parts


def parse_squeue(text: str) -> list[JobRecord]:
    """Parse ``squeue --noheader --format=SQUEUE_FORMAT`` output (blank lines and a header ignored)."""
    records: list[JobRecord] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = _split_fields(line.rstrip("\r\n"), len(SQUEUE_FIELDS), _SQUEUE_NAME_INDEX)
        if parts is None:
            raise SlurmParseError(
                f"squeue output line {lineno} {line!r}: expected {len(SQUEUE_FIELDS)} "
                f"'|'-separated fields from --format={SQUEUE_FORMAT!r}"
            )
        job_id, state, reason, nodes, name, num, used, limit, partition = (
            p if i == _SQUEUE_NAME_INDEX else p.strip() for i, p in enumerate(parts)
        )
        if job_id.upper() == "JOBID":  # a header line, if --noheader was forgotten
            continue
        try:
            num_nodes = int(num) if num else None
        except ValueError:
            raise SlurmParseError(
                f"squeue output line {lineno} {line!r}: node count {num!r} is not an integer"
            ) from None
        try:
            node_list = expand_hostlist(nodes) if nodes and nodes != "(null)" else []
            norm = normalize_state(state)
        except SlurmParseError as exc:
            raise SlurmParseError(f"squeue output line {lineno} {line!r}: {exc}") from None
        records.append(JobRecord(job_id=job_id, state=norm, reason=reason, nodes=node_list,
                                 name=name, num_nodes=num_nodes, time_used=used,
                                 time_limit=limit, partition=partition))
    return records


#: ``squeue --start --noheader --format=SQUEUE_START_FORMAT``: the scheduler's estimate
SQUEUE_START_FORMAT = "%i|%S"
_NO_ESTIMATE = {"", "N/A", "NONE", "UNKNOWN", "(NULL)"}


def command_for_squeue_start(job_ids: Iterable[str | int] | str | int) -> list[str]:
    """argv for the expected start time of pending jobs (read by :func:`parse_squeue_start`).

    Slurm estimates a start only once the backfill scheduler has planned the job (or a
    ``--begin`` time holds it); until then squeue prints ``N/A``.
    """
    return ["squeue", "--start", "--noheader", f"--format={SQUEUE_START_FORMAT}",
            f"--jobs={_job_id_list(job_ids)}"]


def parse_squeue_start(text: str) -> dict[str, str]:
    """``squeue --start`` lines -> {job id: expected start as Slurm prints it,
    ``2026-12-01T20:53:38``}; jobs without an estimate (``N/A``) are left out."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        job_id, sep, start = line.strip().partition("|")
        if not sep:
            raise SlurmParseError(f"squeue --start output line {lineno} {line!r}: expected "
                                  f"'<jobid>|<start>' from --format={SQUEUE_START_FORMAT!r}")
        if job_id.upper() == "JOBID":
            continue
        start = start.strip()
        if start.upper() not in _NO_ESTIMATE:
            out[job_id.strip()] = start
    return out


def squeue_job_unknown(stderr: str) -> bool:
    """True when squeue failed only because the job id is gone (purged after MinJobAge)."""
    return "invalid job id" in (stderr or "").lower()


# --------------------------------------------------------------------------
# sacct

#: ``sacct --parsable2 --noheader --format=SACCT_FORMAT``
SACCT_FORMAT = "JobID,State,ExitCode,NodeList,JobName,Elapsed"
SACCT_FIELDS = ("job_id", "state", "exit_code", "nodes", "name", "elapsed")
_SACCT_NAME_INDEX = SACCT_FIELDS.index("name")


@dataclass(frozen=True)
class SacctRecord:
    """One sacct line: the job itself (``123``) or one of its steps (``123.batch``, ``123.0``).

    ``state`` is normalized (``CANCELLED``); ``state_detail`` keeps the rest
    (``by 1000``). ``exit_code``/``signal`` come from ``ExitCode`` ``status:signal``.
    """

    job_id: str
    job: str
    step: str | None
    state: str
    state_detail: str
    exit_code: int | None
    signal: int | None
    nodes: list[str]
    name: str
    elapsed: str

    @property
    def is_step(self) -> bool:
        return self.step is not None

    @property
    def is_terminal(self) -> bool:
        return self.state in SLURM_STATES_TERMINAL

    @property
    def elapsed_seconds(self) -> int | None:
        return parse_slurm_duration(self.elapsed)


def command_for_sacct(
    job_ids: Iterable[str | int] | str | int, *, jobcomp: bool = False, steps: bool = True
) -> list[str]:
    """argv for sacct on these jobs in the format :func:`parse_sacct` reads.

    ``jobcomp=True`` adds ``-c`` (read the job-completion log instead of the accounting
    database, for clusters that have only that); ``steps=False`` adds ``-X``.
    """
    argv = ["sacct", "--parsable2", "--noheader", f"--format={SACCT_FORMAT}",
            f"--jobs={_job_id_list(job_ids)}"]
    if jobcomp:
        argv.insert(1, "-c")
    if not steps:
        argv.insert(1, "-X")
    return argv


def parse_sacct(text: str, *, include_steps: bool = True) -> list[SacctRecord]:
    """Parse ``sacct --parsable2 --noheader --format=SACCT_FORMAT`` (also ``-c`` and ``--parsable``).

    Tolerates step lines, ``CANCELLED by N``, ``None assigned`` node lists and empty
    exit codes (the job-completion log may leave some columns empty).
    """
    records: list[SacctRecord] = []
    n = len(SACCT_FIELDS)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        line = line.rstrip("\r\n")
        if line.endswith("|") and line.count("|") >= n:  # --parsable's trailing delimiter
            line = line[:-1]
        parts = _split_fields(line, n, _SACCT_NAME_INDEX)
        if parts is None:
            raise SlurmParseError(
                f"sacct output line {lineno} {line!r}: expected {n} '|'-separated fields "
                f"from --format={SACCT_FORMAT}"
            )
        job_id, state, exit_raw, nodes, name, elapsed = (
            p if i == _SACCT_NAME_INDEX else p.strip() for i, p in enumerate(parts)
        )
        if job_id.lower() == "jobid":
            continue
        job, _, step = job_id.partition(".")
        if not job:
            raise SlurmParseError(f"sacct output line {lineno} {line!r}: empty JobID")
        try:
            norm = normalize_state(state)
            code, sig = parse_exit_code(exit_raw)
            node_list = ([] if nodes in ("", "None assigned", "(null)", "None")
                         else expand_hostlist(nodes))
        except SlurmParseError as exc:
            raise SlurmParseError(f"sacct output line {lineno} {line!r}: {exc}") from None
        if step and not include_steps:
            continue
        records.append(SacctRecord(job_id=job_id, job=job, step=step or None, state=norm,
                                   state_detail=_state_detail(state), exit_code=code,
                                   signal=sig, nodes=node_list, name=name, elapsed=elapsed))
    return records


_NO_ACCOUNTING = (
    "accounting storage is disabled",
    "problem talking to the database",
    "slurmdbd",
    "jobcomp/none",
    "no job completion",
)


def sacct_unavailable(stderr: str) -> bool:
    """True when sacct failed because the cluster keeps no accounting (not an error for us)."""
    low = (stderr or "").lower()
    return any(s in low for s in _NO_ACCOUNTING)


# --------------------------------------------------------------------------
# scontrol


def parse_scontrol_restarts(text: str) -> int | None:
    """``Restarts=N`` (how often the job was requeued) from ``scontrol -o show job ID``;
    None when the output has no such field."""
    for word in (text or "").split():
        if word.startswith("Restarts="):
            value = word.split("=", 1)[1]
            return int(value) if value.isdigit() else None
    return None


# --------------------------------------------------------------------------
# sbatch


def parse_sbatch_parsable(stdout: str) -> tuple[str, str | None]:
    """``sbatch --parsable`` output ``'1234'`` or ``'1234;cluster'`` -> (job id, cluster or None)."""
    lines = [ln.strip() for ln in (stdout or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    job_id, _, cluster = last.partition(";")
    if not re.match(r"^\d+(?:_\d+)?$", job_id):
        raise SlurmParseError(
            f"cannot read a job id from sbatch --parsable output {stdout!r}: expected "
            "'<jobid>' or '<jobid>;<cluster>'"
        )
    return job_id, (cluster or None)
