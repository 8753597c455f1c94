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
from ..errors import HpcmeshError, excerpt
from ..runtime.process.gpu_binding import gpu_indexes

__all__ = [
    "SlurmParseError",
    "expand_hostlist",
    "compress_hostlist",
    "parse_tasks_per_node",
    "parse_gpu_count",
    "parse_slurm_duration",
    "parse_exit_code",
    "normalize_state",
    "SLURM_STATES",
    "SLURM_STATES_TERMINAL",
    "SLURM_STATES_ACTIVE",
    "SLURM_STATES_LIVE",
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
    "excerpt",
    "whole_number",
    "slurm_job_id",
    "slurm_restart_count",
    "slurm_task_rank",
    "MAX_HOSTS",
    "MAX_PER_NODE",
    "MAX_MEM_MB",
]


class SlurmParseError(HpcmeshError, ValueError):
    """Slurm output or a ``SLURM_*`` value we cannot understand; names input and expected form."""


# --------------------------------------------------------------------------
# bounds, and hostlists

#: Most hosts one hostlist may name: python-hostlist's own limit, far above the largest
#: Slurm clusters. No node count is allowed above it.
MAX_HOSTS = hostlist.MAX_SIZE
#: Longest ``SLURM_*`` value (and hostlist) read: Linux refuses an environment string
#: longer than 128 KiB (MAX_ARG_STRLEN), so nothing longer came from Slurm.
MAX_VALUE_CHARS = 128 * 1024
#: Largest per-node count (tasks, CPUs, GPUs) and restart count: Slurm keeps them in 16
#: bits, with 65534 and 65535 meaning "not set" and "unlimited".
MAX_PER_NODE = 65533
#: Largest job or step id (32 bits in Slurm).
MAX_ID = 2**32 - 1
#: Largest memory in MB (per node, CPU or GPU): 1 EiB, far above any node and far
#: inside Slurm's 64-bit field.
MAX_MEM_MB = 2**40
# Bracket groups in one host name ("n[1-2]x[1-2]" has 2); Slurm's own hostlists have
# at most 5 dimensions.
_MAX_GROUPS = 8
_MAX_DIGITS = 18
_EXAMPLE_HOSTLIST = "'node[01-04,07],gpu-a[1-2]'"
_DIGITS = re.compile(r"[0-9]{1,20}")


def whole_number(text: str) -> int | None:
    """``text`` (spaces around it aside) as a whole number when it is 1 to 20 ASCII digits;
    None otherwise. Stricter than int(), which also takes a sign, '_' and the digits of
    other scripts, and raises past 4300 digits."""
    text = text.strip()
    return int(text) if _DIGITS.fullmatch(text) else None


class _BadHostlist(Exception):
    """Why a hostlist cannot be expanded (the caller names the hostlist)."""


def _hostlist_parts(text: str) -> list[str]:
    """Split at the commas outside brackets; brackets must pair and not nest."""
    parts, start, inside = [], 0, False
    for i, c in enumerate(text):
        if c == "[":
            if inside:
                raise _BadHostlist("nested brackets")
            inside = True
        elif c == "]":
            if not inside:
                raise _BadHostlist("unbalanced brackets")
            inside = False
        elif c == "," and not inside:
            parts.append(text[start:i])
            start = i + 1
    if inside:
        raise _BadHostlist("unbalanced brackets")
    parts.append(text[start:])
    return [p for p in parts if p]


def _range_numbers(group: str) -> list[tuple[int, int, int]]:
    """``01-04,07`` -> ``[(1, 4, 2), (7, 7, 2)]`` (low, high, zero-padded width)."""
    out = []
    for item in group.split(","):
        low, dash, high = item.partition("-")
        high = high if dash else low
        if not (low.isascii() and low.isdigit() and high.isascii() and high.isdigit()):
            raise _BadHostlist(f"bad range {excerpt(item)}")
        if len(low) > _MAX_DIGITS or len(high) > _MAX_DIGITS:
            raise _BadHostlist(f"range {excerpt(item)} has numbers of more than "
                               f"{_MAX_DIGITS} digits")
        if int(high) < int(low):
            raise _BadHostlist(f"range {excerpt(item)} starts after it stops")
        out.append((int(low), int(high), len(low)))
    return out


def _expand_part(part: str, room: int, limit: int) -> list[str]:
    """One comma-free part (``x[1-2]y[1-3]``), expanded by python-hostlist once its size
    is known to be at most ``room`` hosts. The checks come first because python-hostlist
    has no total bound and recurses once per bracket group."""
    pieces = re.split(r"\[([^\]]*)\]", part)     # literal, group, literal, group, ..., literal
    groups = [_range_numbers(g) for g in pieces[1::2]]
    if len(groups) > _MAX_GROUPS:
        raise _BadHostlist(f"more than {_MAX_GROUPS} bracket ranges in one name")
    count = 1
    for ranges in groups:
        count *= sum(high - low + 1 for low, high, _ in ranges)
        if count > room:
            raise _BadHostlist(f"it names more than {limit} hosts")
    try:
        return hostlist.expand_hostlist(part, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise _BadHostlist(str(exc)) from None


def expand_hostlist(s: str, *, max_hosts: int = MAX_HOSTS, unique: bool = False) -> list[str]:
    """``node[01-04,07],gpu-a[1-2]`` -> ``['node01', ..., 'gpu-a2']``, in Slurm's order.

    The one hostlist expander of hpcmesh (Slurm's nodelists, ssh host lists). Order is
    kept (not sorted) because rank assignment follows the nodelist; a name given twice
    counts once, or with ``unique`` is an error (a list a person wrote). Bounded: at most
    ``max_hosts`` names (checked before any list is built, so ``n[1-999999999999]`` costs
    nothing) and ``MAX_VALUE_CHARS`` of text. Host names are not checked here.
    """
    if not isinstance(s, str):
        raise SlurmParseError(f"hostlist must be a string, got {type(s).__name__} {s!r}")
    text = s.strip()
    if not text:
        return []
    try:
        if len(text) > MAX_VALUE_CHARS:
            raise _BadHostlist(f"longer than {MAX_VALUE_CHARS} characters")
        if any(c.isspace() for c in text):
            raise _BadHostlist("it contains whitespace")
        names: dict[str, None] = {}
        for part in _hostlist_parts(text):
            for name in _expand_part(part, max_hosts - len(names), max_hosts):
                if unique and name in names:
                    raise SlurmParseError(f"hostlist {excerpt(s)} names {excerpt(name)} twice")
                names[name] = None
    except _BadHostlist as exc:
        raise SlurmParseError(f"cannot expand hostlist {excerpt(s)} ({exc}); expected a "
                              f"Slurm hostlist like {_EXAMPLE_HOSTLIST}") from None
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


# --------------------------------------------------------------------------
# counts


_TPN_ITEM = re.compile(r"^([0-9]{1,18})(?:\(x([0-9]{1,18})\))?$")


def parse_tasks_per_node(s: str, *, minimum: int = 0, max_nodes: int = MAX_HOSTS) -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]``; the form of SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE.

    Each count is from ``minimum`` to MAX_PER_NODE, and the repeats together describe at
    most ``max_nodes`` nodes: ``2(x1000000000)`` is refused before any list is built.
    """
    expected = "expected comma-separated counts like '4', '2(x3),1' or '1,2(x2)'"
    if not isinstance(s, str) or not s.strip():
        raise SlurmParseError(f"cannot parse tasks-per-node value {s!r}: {expected}")
    shown = excerpt(s)
    if len(s) > MAX_VALUE_CHARS:
        raise SlurmParseError(f"cannot parse tasks-per-node value {shown}: longer than "
                              f"{MAX_VALUE_CHARS} characters")
    items: list[tuple[int, int]] = []
    total = 0
    for part in s.strip().split(","):
        m = _TPN_ITEM.match(part.strip())
        if not m:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {shown} at {excerpt(part)}: {expected}"
            )
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if repeat < 1:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {shown}: repeat count in {part!r} must be >= 1"
            )
        if not minimum <= count <= MAX_PER_NODE:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {shown}: count {count} in {part!r} is "
                f"outside {minimum} to {MAX_PER_NODE}"
            )
        total += repeat
        if total > max_nodes:
            raise SlurmParseError(
                f"cannot parse tasks-per-node value {shown}: its counts describe more than "
                f"{max_nodes} node(s)"
            )
        items.append((count, repeat))
    return [count for count, repeat in items for _ in range(repeat)]


_GPU_ITEM = re.compile(r"^(?:[A-Za-z][\w.-]*:)*([0-9]{1,18})$", re.ASCII)


def parse_gpu_count(s: str) -> int:
    """GPUs per node from ``2``, ``gpu:2``, ``a100:4``, ``gpu:a100:4`` or ``a100:2,v100:1``
    (summed; at most MAX_PER_NODE)."""
    expected = "expected a count with optional type like '2', 'gpu:2', 'a100:4' or 'a100:2,v100:1'"
    if not isinstance(s, str) or not s.strip():
        raise SlurmParseError(f"cannot parse GPU count {s!r}: {expected}")
    if len(s) > MAX_VALUE_CHARS:
        raise SlurmParseError(f"cannot parse GPU count {excerpt(s)}: longer than "
                              f"{MAX_VALUE_CHARS} characters")
    total = 0
    for part in s.strip().split(","):
        item = re.sub(r"\(.*\)$", "", part.strip())  # scontrol-style "(S:0-1)" socket suffix
        m = _GPU_ITEM.match(item)
        if not m:
            raise SlurmParseError(f"cannot parse GPU count {excerpt(s)} at {excerpt(part)}: "
                                  f"{expected}")
        total += int(m.group(1))
    if total > MAX_PER_NODE:
        raise SlurmParseError(f"cannot parse GPU count {excerpt(s)}: {total} GPUs per node, "
                              f"more than {MAX_PER_NODE}")
    return total


# Each number at most 18 ASCII digits: int() of a 5000-digit one would raise its own error.
_DURATION = re.compile(
    r"^(?:(?P<days>\d{1,18})-(?P<dh>\d{1,18})(?::(?P<dm>\d{1,18})(?::(?P<ds>\d{1,18}))?)?"
    r"|(?P<a>\d{1,18})(?::(?P<b>\d{1,18})(?::(?P<c>\d{1,18}))?)?)$", re.ASCII
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
            f"cannot parse Slurm duration {excerpt(s)}: expected minutes, M:SS, H:MM:SS, D-HH, "
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
    m = re.match(r"^(\d{1,18})(?::(\d{1,18}))?$", s.strip(), re.ASCII)
    if not m:
        raise SlurmParseError(
            f"cannot parse exit code {excerpt(s)}: expected 'status:signal' like '0:0' or '1:15'"
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

#: Every job state squeue and sacct document (the JOB STATE CODES of Slurm 22.05 and 24.11:
#: the same 24), by long name.
SLURM_STATES = frozenset(_SHORT_STATES.values())
#: Over: this run ended and nothing will requeue it by itself.
SLURM_STATES_TERMINAL = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT",
})
#: Not over: Slurm still has the job (winding up, stopped, held and requeued jobs included).
#: The question "is it gone yet?" (a cancel waits until none of its jobs is in here).
SLURM_STATES_ACTIVE = SLURM_STATES - SLURM_STATES_TERMINAL
#: Alive for someone waiting on the job's programs: they run, or will run once Slurm gets to
#: them (pending, suspended, on its way back into the queue). Not the states of a run being
#: wound up (COMPLETING, STAGE_OUT), stopped by SIGSTOP until someone resumes it (STOPPED),
#: or held until a person acts (RESV_DEL_HOLD, SPECIAL_EXIT).
SLURM_STATES_LIVE = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "SIGNALING",
    "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
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


# A host name read from the environment may end up in a path or on a command line: letters,
# digits, '_', '.', '-', not starting with '-' or '.'.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")
# What _env_int takes for a CPU count and a memory size.
_CPUS = ("a whole number of CPUs", 1, MAX_PER_NODE)
_MEM = ("a whole number of MB", 0, MAX_MEM_MB)
# Names and paths (partition, account, job name, cluster, submit dir): one line, PATH_MAX long.
_MAX_TEXT = 4096


def _env_raw(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or not raw.strip() else raw


def _env_int(env: Mapping[str, str], name: str, what: str, minimum: int,
             maximum: int) -> int | None:
    """``env[name]`` as a whole number from ``minimum`` to ``maximum`` (ASCII digits only:
    no sign, '_' or other scripts' digits); None when unset or empty."""
    raw = _env_raw(env, name)
    if raw is None:
        return None
    value = whole_number(raw)
    if value is not None and minimum <= value <= maximum:
        return value
    raise SlurmParseError(f"{name}={excerpt(raw)}: expected {what} from {minimum} to {maximum}")


def _env_text(env: Mapping[str, str], name: str) -> str | None:
    """A name or path: printable (no newline or other control character), at most
    _MAX_TEXT characters; None when unset or empty."""
    raw = _env_raw(env, name)
    if raw is None:
        return None
    if len(raw) > _MAX_TEXT or not raw.isprintable():
        raise SlurmParseError(f"{name}={excerpt(raw)}: expected one line of printable text of "
                              f"at most {_MAX_TEXT} characters")
    return raw.strip()


def _env_label(env: Mapping[str, str], name: str) -> str | None:
    """A name that is only shown (the job's name): Slurm accepts a tab or other control
    character in it, so those become '?' (nothing reaches a terminal as an escape) instead
    of failing the whole allocation; still at most _MAX_TEXT characters."""
    raw = _env_raw(env, name)
    if raw is None:
        return None
    if len(raw) > _MAX_TEXT:
        raise SlurmParseError(f"{name}={excerpt(raw)}: expected at most {_MAX_TEXT} characters")
    return "".join(c if c.isprintable() else "?" for c in raw).strip()


def _env_host(env: Mapping[str, str], name: str) -> str | None:
    raw = _env_raw(env, name)
    if raw is None:
        return None
    if not _HOST_NAME.fullmatch(raw.strip()):
        raise SlurmParseError(f"{name}={excerpt(raw)}: expected a host name of letters, digits, "
                              "'_', '.' and '-', not starting with '-' or '.'")
    return raw.strip()


def _env_hosts(env: Mapping[str, str], name: str, max_hosts: int = MAX_HOSTS) -> list[str]:
    try:
        names = expand_hostlist(env[name], max_hosts=max_hosts)
    except SlurmParseError as exc:
        raise SlurmParseError(f"{name}: {exc}") from None
    for host in names:
        if not _HOST_NAME.fullmatch(host):
            raise SlurmParseError(f"{name}={excerpt(env[name])} names host {excerpt(host)}; "
                                  "expected host names of letters, digits, '_', '.' and '-', "
                                  "not starting with '-' or '.'")
    return names


def _env_gpu_indexes(env: Mapping[str, str], name: str) -> int | None:
    """How many GPUs an index list (``0,1,2,3``: SLURM_STEP_GPUS / SLURM_JOB_GPUS) names;
    the host agent reads the same list with the same check (``gpu_binding.gpu_indexes``)."""
    raw = _env_raw(env, name)
    if raw is None:
        return None
    try:
        return len(gpu_indexes(name, raw))
    except ValueError as exc:
        raise SlurmParseError(str(exc)) from None


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID (or its old name SLURM_JOBID), a job number from 1 to MAX_ID; None
    when unset. It names folders and goes on scancel's command line, so nothing else."""
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        value = _env_int(env, name, "a job id", 1, MAX_ID)
        if value is not None:
            return str(value)
    return None


def slurm_restart_count(env: Mapping[str, str]) -> int:
    """SLURM_RESTART_COUNT: how often the job was requeued, 0 when unset."""
    return _env_int(env, "SLURM_RESTART_COUNT", "a restart count", 0, MAX_PER_NODE) or 0


def slurm_task_rank(env: Mapping[str, str]) -> int:
    """This task's rank in its step: SLURM_PROCID, else SLURM_NODEID, else 0."""
    for name, maximum in (("SLURM_PROCID", MAX_ID), ("SLURM_NODEID", MAX_HOSTS - 1)):
        value = _env_int(env, name, "a task rank", 0, maximum)
        if value is not None:
            return value
    return 0


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
        job_id = slurm_job_id(env)
        if job_id is None:
            return None

        # SLURM_JOB_NODELIST is the whole job; inside a step SLURM_NODELIST is the step's.
        if _env_raw(env, "SLURM_JOB_NODELIST"):
            list_var = "SLURM_JOB_NODELIST"
        elif _env_raw(env, "SLURM_NODELIST"):
            list_var = "SLURM_NODELIST"
        else:
            raise SlurmParseError(
                f"SLURM_JOB_ID={job_id} is set but neither SLURM_JOB_NODELIST nor "
                "SLURM_NODELIST is; expected a hostlist like 'node[01-04]'"
            )
        nodes = _env_hosts(env, list_var)
        if not nodes:
            raise SlurmParseError(f"{list_var}={excerpt(env[list_var])} names no nodes")

        # Cross-check each count against the list it describes: the job's pair, and
        # SLURM_NNODES/SLURM_NODELIST, which srun rewrites to the step's values.
        step_list_var = "SLURM_NODELIST" if _env_raw(env, "SLURM_NODELIST") else list_var
        for nvar, lvar in (("SLURM_JOB_NUM_NODES", list_var), ("SLURM_NNODES", step_list_var)):
            count = _env_int(env, nvar, "a node count", 1, MAX_HOSTS)
            if count is None:
                continue
            listed = nodes if lvar == list_var else _env_hosts(env, lvar)
            if count != len(listed):
                raise SlurmParseError(
                    f"{nvar}={count} does not match {lvar}={excerpt(env[lvar])}, which names "
                    f"{len(listed)} node(s)"
                )

        def counts(name: str, minimum: int) -> list[int]:
            # one count per node of the allocation at most: a step covers some of them
            raw = _env_raw(env, name)
            if raw is None:
                return []
            try:
                return parse_tasks_per_node(raw, minimum=minimum, max_nodes=len(nodes))
            except SlurmParseError as exc:
                raise SlurmParseError(f"{name}: {exc}") from None

        gpus = _env_int(env, "SLURM_GPUS_ON_NODE", "a GPU count", 0, MAX_PER_NODE)
        if gpus is None:
            raw = _env_raw(env, "SLURM_GPUS_PER_NODE")
            if raw is not None:
                try:
                    gpus = parse_gpu_count(raw)
                except SlurmParseError as exc:
                    raise SlurmParseError(f"SLURM_GPUS_PER_NODE: {exc}") from None
        # Index lists ("0,1,2,3") of the GPUs on this node: checked whenever set (processes
        # are given them), counted as a last resort.
        listed = [_env_gpu_indexes(env, name) for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")]
        if gpus is None:
            gpus = next((n for n in listed if n is not None), None)

        step_raw = _env_int(env, "SLURM_STEP_ID", "a step id", 0, MAX_ID)
        if step_raw is None:
            step_raw = _env_int(env, "SLURM_STEPID", "a step id", 0, MAX_ID)
        step_id = _SPECIAL_STEPS.get(str(step_raw), str(step_raw)) if step_raw is not None \
            else None
        step_nodes = (_env_hosts(env, "SLURM_STEP_NODELIST", len(nodes))
                      if _env_raw(env, "SLURM_STEP_NODELIST") else [])

        return cls(
            job_id=job_id,
            nodes=nodes,
            tasks_per_node=counts("SLURM_TASKS_PER_NODE", 0),
            gpus_per_node=gpus,
            cpus_per_task=_env_int(env, "SLURM_CPUS_PER_TASK", *_CPUS),
            cpus_on_node=_env_int(env, "SLURM_CPUS_ON_NODE", *_CPUS),
            cpus_per_node=counts("SLURM_JOB_CPUS_PER_NODE", 1),
            mem_per_node=_env_int(env, "SLURM_MEM_PER_NODE", *_MEM),
            mem_per_cpu=_env_int(env, "SLURM_MEM_PER_CPU", *_MEM),
            mem_per_gpu=_env_int(env, "SLURM_MEM_PER_GPU", *_MEM),
            partition=_env_text(env, "SLURM_JOB_PARTITION"),
            job_name=_env_label(env, "SLURM_JOB_NAME"),
            account=_env_text(env, "SLURM_JOB_ACCOUNT"),
            cluster=_env_text(env, "SLURM_CLUSTER_NAME"),
            step_id=step_id,
            step_nodes=step_nodes,
            node_name=_env_host(env, "SLURMD_NODENAME"),
            submit_host=_env_host(env, "SLURM_SUBMIT_HOST"),
            submit_dir=_env_text(env, "SLURM_SUBMIT_DIR"),
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


def _tres_cpu(env: Mapping[str, str]) -> int | None:
    """``cpu:4,gres/gpu:1`` -> 4 (the form of SLURM_TRES_PER_TASK); None without ``cpu:``."""
    raw = _env_raw(env, "SLURM_TRES_PER_TASK")
    for part in (raw or "").split(","):
        name, _, count = part.strip().partition(":")
        if name == "cpu":
            cpus = whole_number(count)
            if cpus is not None and 1 <= cpus <= MAX_PER_NODE:
                return cpus
            raise SlurmParseError(f"SLURM_TRES_PER_TASK={excerpt(raw)}: expected 'cpu:N' with "
                                  f"N a whole number of CPUs from 1 to {MAX_PER_NODE}")
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
        cpus_per_task = _env_int(env, "SLURM_CPUS_PER_TASK", *_CPUS)
        if cpus_per_task is None:
            cpus_per_task = _tres_cpu(env)
    if cpus_per_task is not None:
        if isinstance(cpus_per_task, bool) or not isinstance(cpus_per_task, int) \
                or not 1 <= cpus_per_task <= MAX_PER_NODE:
            raise ValueError(f"cpus_per_task must be a positive integer (at most "
                             f"{MAX_PER_NODE}), got {cpus_per_task!r}")
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
        """Not over yet (see ``SLURM_STATES_ACTIVE``): what a cancel waits out."""
        return self.state in SLURM_STATES_ACTIVE

    @property
    def is_live(self) -> bool:
        """Its programs run or will run (see ``SLURM_STATES_LIVE``): what a wait for them,
        or the reuse of a cached job, needs."""
        return self.state in SLURM_STATES_LIVE

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
            return whole_number(value)
    return None


def parse_scontrol_preempt_time(text: str) -> str | None:
    """``PreemptTime`` from ``scontrol -o show job ID``: when Slurm chose the running job
    for preemption (it runs on for the partition's GraceTime), None when it did not."""
    for word in (text or "").split():
        if word.startswith("PreemptTime="):
            value = word.split("=", 1)[1]
            return None if value in ("", "None", "Unknown", "(null)") else value
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
