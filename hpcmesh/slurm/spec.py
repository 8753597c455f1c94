"""Declarative Slurm job specs: meshes of nodes, and how to load them with good errors.

A :class:`JobSpec` names one or more meshes (``trainers: 4 nodes``, ...) and the
Slurm resources each needs. It comes from YAML (:func:`load_job_spec`), a dict
(:meth:`JobSpec.from_dict`, e.g. the ``job:`` section of a hosts file) or Monarch's
``SlurmJob`` keywords (:meth:`JobSpec.from_monarch_kwargs`). Every mistake is reported
before anything is submitted, as ``file:line: problem; allowed: ... (did you mean ...)``,
because a bad key found after an hour in the queue is an hour lost.

YAML forms accepted::

    job_name: train            # optional
    log_dir: .hpcmesh/logs     # optional
    same_allocation: true      # several meshes share one sbatch job (node ranges)
    spare_nodes: 1             # extra nodes held idle to replace a lost host (SPEC §12)
    defaults: {partition: gpu, time: "02:00:00"}   # applied to every mesh
    meshes:
      trainers: {nodes: 4, gpus_per_node: 8}
      generators: 2            # an int is a node count

or a flat single mesh (the keys of one mesh plus ``job_name``/``log_dir``), which
becomes one mesh named ``hosts``.
"""

from __future__ import annotations

import dataclasses
import keyword
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..yaml_lines import (Invalid, SchemaError, Where, allowed_suffix, check_keys, count,
                          describe, load_yaml)
from .parsing import (MAX_HOSTS, MAX_MEM_MB, MAX_PER_NODE, SlurmParseError,
                      parse_slurm_duration, whole_number)

__all__ = [
    "SpecError",
    "MeshSpec",
    "JobSpec",
    "load_job_spec",
    "parse_job_spec",
    "parse_yaml_with_lines",
    "MESH_KEYS",
    "JOB_KEYS",
    "SHARED_ALLOCATION_KEYS",
    "DEFAULT_SIGNAL",
    "DEFAULT_LOG_DIR",
    "DEFAULT_MESH_NAME",
]

DEFAULT_SIGNAL = "USR1@90"
DEFAULT_LOG_DIR = ".hpcmesh/logs"
DEFAULT_JOB_NAME = "hpcmesh"
DEFAULT_MESH_NAME = "hosts"

#: Keys of one mesh (and of ``defaults``), sorted as error messages list them.
MESH_KEYS = (
    "account", "constraint", "cpus_per_task", "env", "exclusive", "gpus_per_node", "mem",
    "nodes", "ntasks_per_node", "partition", "python", "qos", "requeue", "sbatch_extra",
    "setup", "signal", "time",
)
#: Top-level keys of a multi-mesh spec.
JOB_KEYS = ("defaults", "job_name", "log_dir", "meshes", "same_allocation", "spare_nodes")
# A mapping without "meshes" is one flat mesh; "meshes" is listed so a typo of it is suggested.
_FLAT_KEYS = tuple(sorted(set(MESH_KEYS) | {"job_name", "log_dir", "meshes", "spare_nodes"}))
#: Keys that describe the whole sbatch allocation, so meshes sharing one must agree on them.
SHARED_ALLOCATION_KEYS = (
    "partition", "account", "qos", "time", "constraint", "exclusive", "mem",
    "gpus_per_node", "signal", "requeue", "sbatch_extra",
)


class SpecError(SchemaError):
    """A bad job spec. The message names file:line, the key or value, and what is allowed;
    ``source``, ``line``, ``key`` and ``allowed`` stay attributes for tools such as
    ``hpcmesh render`` (the yaml_lines family: ``SchemaError``)."""


# Bounds of the numbers in a spec: Slurm's own limits, so that a typo (or 2**70 nodes) is
# refused here, naming its key, rather than overflowing in sbatch or queueing for ever.
#: nodes, per mesh and per allocation: no more than one hostlist can name.
MAX_NODES = MAX_HOSTS
# ntasks_per_node, cpus_per_task and gpus_per_node: at most MAX_PER_NODE, as Slurm's
# counts per node are 16 bits.
#: time: sbatch reads --time into a signed 32-bit count of minutes (UNLIMITED: no limit).
MAX_TIME_MINUTES = 2**31 - 1
#: signal: sbatch's warning time is 16 bits of seconds; signal numbers end at SIGRTMAX.
MAX_SIGNAL_SECONDS = 65535
MAX_SIGNAL_NUMBER = 64


# --------------------------------------------------------------------------
# YAML with line numbers


def parse_yaml_with_lines(text: str, source: str = "<string>") -> tuple[Any, dict[str, int], dict[str, str]]:
    """Load YAML keeping, for each dotted path (``meshes.trainers.nodes``, ``setup[1]``),
    its 1-based line and the raw text of plain scalars (yaml_lines.load_yaml; errors are
    SpecError).

    Raw text matters because YAML 1.1 reads ``time: 01:30:00`` as the number 5400 and
    ``account: 0123`` as octal; string-typed keys use the text as written.
    """
    return load_yaml(text, source, SpecError)


def _where(source: str, lines: Mapping[str, int] | None, raw: Mapping[str, str] | None,
           prefix: str = "") -> Where:
    return Where(source, lines, raw, prefix, kind=SpecError)


# --------------------------------------------------------------------------
# field validators (value -> normalized value, or Invalid)


def _pos_int(name: str, maximum: int, why: str, *, minimum: int = 1,
             optional: bool = False) -> Callable[[Any], Any]:
    def conv(value: Any) -> Any:
        if isinstance(value, str) and whole_number(value) is not None:
            value = whole_number(value)     # a count written as text ("4")
        return count(name, value, maximum=maximum, why=why, minimum=minimum,
                     optional=optional)
    return conv


_NODES_WHY = "the most one Slurm hostlist names"
_PER_NODE_WHY = "Slurm's limit per node"


def _gpus(value: Any) -> int | None:
    n = _pos_int("gpus_per_node", MAX_PER_NODE, _PER_NODE_WHY, minimum=0,
                 optional=True)(value)
    return n or None  # 0 GPUs and "no GPU request" render the same


def _bool(name: str) -> Callable[[Any], bool]:
    def conv(value: Any) -> bool:
        if not isinstance(value, bool):
            raise Invalid(f"{name} must be true or false, got {describe(value)}")
        return value
    return conv


_WORD = re.compile(r"^\S+$")


def _word(name: str, example: str) -> Callable[[Any], str | None]:
    def conv(value: Any) -> str | None:
        if value is None or value == "":
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not _WORD.match(value):
            raise Invalid(f"{name} must be one word like {example!r} (no spaces), got {describe(value)}")
        return value
    return conv


_MEM = re.compile(r"^([0-9]+)([KMGTkmgt]?)$")
_MB_PER_UNIT = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}


def _mem(value: Any) -> str | None:
    if value is None or value == "":
        return None
    m = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        mb: float = value
    else:
        m = _MEM.match(value.strip()) if isinstance(value, str) else None
        digits = m.group(1) if m else ""
        # past 20 digits it is too big anyway (and int() refuses 4300)
        mb = int(digits) * _MB_PER_UNIT[m.group(2).upper()] if 0 < len(digits) <= 20 \
            else MAX_MEM_MB + 1
    if mb > MAX_MEM_MB:
        raise Invalid(f"mem must be a size like '64G', '500M' or '0' (all of the node's memory; "
                       f"units K, M, G, T, default M; at most {MAX_MEM_MB // 1024**2}T), "
                       f"got {describe(value)}")
    return str(value) if m is None else m.group(1) + m.group(2).upper()


def _time(value: Any) -> str | None:
    if value is None or value == "":
        return None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    seconds: int | None = None
    if is_int and value >= 0:
        seconds = value * 60  # minutes, as sbatch reads a bare number
    elif isinstance(value, str) and value.strip().upper() in ("UNLIMITED", "INFINITE"):
        return value.strip().upper()
    elif isinstance(value, str) and value.strip():
        try:
            seconds = parse_slurm_duration(value)
        except SlurmParseError:
            pass
    if seconds is None or seconds > MAX_TIME_MINUTES * 60:
        raise Invalid("time must be minutes or 'HH:MM:SS', 'MM:SS', 'D-HH', 'D-HH:MM', "
                       f"'D-HH:MM:SS' (quote it in YAML), at most {MAX_TIME_MINUTES} minutes, "
                       f"or UNLIMITED, got {describe(value)}")
    return str(value) if is_int else value.strip()


_SIGNAL = re.compile(r"^(?:(?P<flags>[RB]{1,2}):)?(?:SIG)?(?P<sig>[A-Z0-9]{1,20})"
                     r"(?:@(?P<secs>[0-9]{1,20}))?$")
_SIGNAL_NAMES = frozenset(
    "HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM CHLD CONT STOP "
    "TSTP TTIN TTOU URG XCPU XFSZ VTALRM PROF WINCH IO PWR SYS".split())


def _signal(value: Any) -> str | None:
    if value is None or value is False or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    m = _SIGNAL.match(value.strip().upper()) if isinstance(value, str) else None
    sig = m.group("sig") if m else ""
    if m and not (sig in _SIGNAL_NAMES or sig.isdigit() and 1 <= int(sig) <= MAX_SIGNAL_NUMBER):
        m = None
    if not m:
        raise Invalid("signal must look like 'USR1@90' (signal, then seconds before the time "
                       f"limit; optional 'B:' prefix; a number from 1 to {MAX_SIGNAL_NUMBER}) "
                       f"or null, got {describe(value)}")
    if int(m.group("secs") or 0) > MAX_SIGNAL_SECONDS:
        raise Invalid(f"signal's warning time must be at most {MAX_SIGNAL_SECONDS} seconds "
                       f"(sbatch's limit), got {describe(value)}")
    return value.strip().upper()


def _python(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise Invalid(f"python must be the Python executable (a string like 'python3'), got {describe(value)}")
    return value.strip()


def _lines(name: str) -> Callable[[Any], list[str]]:
    def conv(value: Any) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            return [ln for ln in value.splitlines() if ln.strip()]
        if not isinstance(value, (list, tuple)):
            raise Invalid(f"{name} must be a list of shell lines, got {describe(value)}")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                item = str(item)
            if not isinstance(item, str):
                raise Invalid(f"{name}[{i}] must be a string (a shell line), got {describe(item)}")
            out.append(item)
        return out
    return conv


def _extra(value: Any) -> list[str]:
    """sbatch options: ``['--reservation=foo', '--qos', 'high']`` -> one entry per option."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise Invalid(f"sbatch_extra: cannot split {value!r}: {exc}") from None
    if not isinstance(value, (list, tuple)):
        raise Invalid(f"sbatch_extra must be a list of sbatch options like '--reservation=foo', "
                       f"got {describe(value)}")
    out: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or "\n" in item or not item.strip():
            raise Invalid(f"sbatch_extra[{i}] must be an sbatch option (a one-line string), "
                           f"got {describe(item)}")
        item = item.strip()
        if item.startswith("#SBATCH"):
            item = item[len("#SBATCH"):].strip()
        if item.startswith("-"):
            out.append(item)
        elif out and "=" not in out[-1] and " " not in out[-1]:
            # A value after its option, as in argv: ["--qos", "high"].
            sep = "=" if out[-1].startswith("--") else " "
            out[-1] = f"{out[-1]}{sep}{item}"
        else:
            raise Invalid(f"sbatch_extra[{i}] must be an sbatch option starting with '-' "
                           f"(like '--reservation=foo'), got {item!r}")
    return out


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env(value: Any) -> dict[str, str | None]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Invalid(f"env must be a mapping of variable names to strings, got {describe(value)}")
    out: dict[str, str | None] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise Invalid(f"env: {describe(k, kind=False)} is not a valid environment variable "
                          "name")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if v is not None and not isinstance(v, str):
            raise Invalid(f"env value of {k} must be a string (quote it in YAML) or null to "
                           f"unset it, got {describe(v)}")
        out[k] = v
    return out


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "nodes": _pos_int("nodes", MAX_NODES, _NODES_WHY),
    "gpus_per_node": _gpus,
    "ntasks_per_node": _pos_int("ntasks_per_node", MAX_PER_NODE, _PER_NODE_WHY),
    "cpus_per_task": _pos_int("cpus_per_task", MAX_PER_NODE, _PER_NODE_WHY,
                              optional=True),
    "mem": _mem,
    "time": _time,
    "partition": _word("partition", "gpu"),
    "account": _word("account", "myproject"),
    "qos": _word("qos", "normal"),
    "constraint": _word("constraint", "a100&ib"),
    "exclusive": _bool("exclusive"),
    "sbatch_extra": _extra,
    "setup": _lines("setup"),
    "python": _python,
    "env": _env,
    "signal": _signal,
    "requeue": _bool("requeue"),
}
# Keys whose values are strings: YAML's re-typing of plain scalars is undone for them.
_TEXT_KEYS = {"mem", "time", "partition", "account", "qos", "constraint", "python", "signal"}

# sbatch's short options, as the long ones they stand for: the tables below name those.
_SHORT_OPTIONS = {
    "-t": "--time", "-p": "--partition", "-A": "--account", "-q": "--qos",
    "-C": "--constraint", "-c": "--cpus-per-task", "-N": "--nodes", "-n": "--ntasks",
    "-J": "--job-name", "-o": "--output", "-e": "--error",
}
# sbatch options that have their own key: given in sbatch_extra (Monarch's slurm_args
# style) they are moved into that key, so meshes sharing an allocation are compared on them.
_OPTION_KEYS = {
    "--time": "time",
    "--partition": "partition",
    "--account": "account",
    "--qos": "qos",
    "--constraint": "constraint",
    "--mem": "mem",
    "--gpus-per-node": "gpus_per_node",
    "--cpus-per-task": "cpus_per_task",
    "--ntasks-per-node": "ntasks_per_node",
    "--signal": "signal",
    "--exclusive": "exclusive",
    "--requeue": "requeue", "--no-requeue": "requeue",
}
# sbatch options the renderer owns; in sbatch_extra they would break the mesh layout.
_OWNED_OPTIONS = {
    "--nodes": "nodes",
    "--ntasks": "nodes and ntasks_per_node",
    "--job-name": "job_name",
    "--output": "log_dir",
    "--error": "log_dir",
}
_MEM_OPTIONS = ("--mem-per-cpu", "--mem-per-gpu")


def _split_option(entry: str) -> tuple[str, str | None]:
    if entry.startswith("--"):
        m = re.match(r"^(--[^=\s]+)(?:[=\s]\s*(.*))?$", entry)
        if m is None:
            return entry, None
        return m.group(1), (m.group(2).strip() if m.group(2) is not None else None)
    name, rest = entry[:2], entry[2:].lstrip("= ").strip()
    return _SHORT_OPTIONS.get(name, name), rest or None


# --------------------------------------------------------------------------
# the spec dataclasses


@dataclass
class MeshSpec:
    """Resources for one mesh of hosts; one host agent task per node unless ntasks_per_node says more.

    ``time`` is a Slurm time string (``"02:00:00"``, ``"1-00:00:00"``) or minutes;
    ``signal`` (default ``USR1@90``) asks Slurm to warn the job that many seconds
    before its end, so actors can checkpoint; ``env`` values of None unset a variable.
    """

    name: str
    nodes: int = 1
    gpus_per_node: int | None = None
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    sbatch_extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    python: str = "python3"
    env: dict[str, str | None] = field(default_factory=dict)
    signal: str | None = DEFAULT_SIGNAL
    requeue: bool = False

    def __post_init__(self) -> None:
        _check_mesh_name(self.name, lambda msg: SpecError(msg))
        for key in MESH_KEYS:
            try:
                setattr(self, key, _CONVERTERS[key](getattr(self, key)))
            except Invalid as exc:
                raise SpecError(f"mesh {self.name!r}: {exc}", key=key) from None
        # Direct construction cannot tell "left at default" from "set to the default";
        # the loaders pass what was written instead (_build_mesh).
        explicit = {k for k in MESH_KEYS if getattr(self, k) != _field_default(k)}
        values = {k: getattr(self, k) for k in MESH_KEYS}
        try:
            _lift_extras(values, explicit)
        except _Located as exc:
            raise SpecError(f"mesh {self.name!r}: {exc.message}", key="sbatch_extra") from None
        for key, value in values.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Located(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index, self.message = index, message


def _lift_extras(values: dict[str, Any], explicit: set[str]) -> None:
    """Move sbatch_extra options that have their own key into that key (in place)."""
    kept: list[str] = []
    for i, entry in enumerate(values["sbatch_extra"]):
        name, val = _split_option(entry)
        if name in _OWNED_OPTIONS:
            raise _Located(i, f"sbatch_extra {entry!r} is set by hpcmesh from "
                              f"{_OWNED_OPTIONS[name]}; remove it")
        if name in _MEM_OPTIONS and values["mem"] is not None:
            raise _Located(i, f"sbatch_extra {entry!r} cannot be combined with mem "
                              f"({values['mem']!r}): sbatch refuses both; keep one")
        key = _OPTION_KEYS.get(name)
        if key is None:
            kept.append(entry)
            continue
        if key in ("exclusive", "requeue"):
            if val is not None:  # --exclusive=user etc.: a different request, keep verbatim
                if key in explicit and values[key]:
                    raise _Located(i, f"sbatch_extra {entry!r} contradicts {key}: true")
                kept.append(entry)
                continue
            new: Any = name != "--no-requeue"
        else:
            try:
                new = _CONVERTERS[key](val)
            except Invalid:
                new = None
            if new is None:  # not in our form (typed GPUs "a100:4"...): keep verbatim
                if values[key] is not None and values[key] != _field_default(key):
                    raise _Located(i, f"sbatch_extra {entry!r} contradicts {key}: "
                                      f"{describe(values[key], kind=False)}; set only {key}")
                kept.append(entry)
                continue
        if key in explicit and values[key] != new:
            raise _Located(i, f"sbatch_extra {entry!r} contradicts {key}: "
                              f"{describe(values[key], kind=False)}; set only {key}")
        values[key] = new
    values["sbatch_extra"] = kept


def _field_default(key: str) -> Any:
    f = next(f for f in dataclasses.fields(MeshSpec) if f.name == key)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _check_mesh_name(name: Any, fail: Callable[[str], SpecError]) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
            or name.startswith("_"):
        raise fail(f"mesh name {describe(name, kind=False)} must be a Python identifier not starting with '_' "
                   "(it becomes an attribute of the job state, e.g. state.trainers)")


def _check_job_name(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9_.+-]+$", value):
        raise Invalid(f"job_name must be one word of letters, digits and _.+- (it names the "
                       f"log files), got {describe(value)}")
    return value


def _spare_nodes(value: Any) -> int:
    """How many spare nodes: a whole number from 0 (none); the most is checked against the
    meshes' nodes by JobSpec."""
    if isinstance(value, str) and whole_number(value) is not None:
        value = whole_number(value)
    return count("spare_nodes", value, minimum=0, maximum=MAX_NODES, why=_NODES_WHY)


def _check_log_dir(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value) \
            or "%" in value:
        raise Invalid(f"log_dir must be a directory path without spaces or '%', got {describe(value)}")
    return value.rstrip("/") or "/"


def _shared_mismatch(meshes: Mapping[str, MeshSpec]) -> tuple[str, str, str] | None:
    """First (key, mesh_a, mesh_b) where meshes sharing one allocation disagree."""
    specs = list(meshes.values())
    for key in SHARED_ALLOCATION_KEYS:
        for other in specs[1:]:
            if getattr(other, key) != getattr(specs[0], key):
                return key, specs[0].name, other.name
    return None


def _mismatch_message(meshes: Mapping[str, MeshSpec], key: str, a: str, b: str) -> str:
    return (f"meshes {a!r} and {b!r} share one allocation (same_allocation: true) but differ in "
            f"{key} ({describe(getattr(meshes[a], key), kind=False)} vs "
            f"{describe(getattr(meshes[b], key), kind=False)}); "
            "make them equal (e.g. under defaults) or set same_allocation: false")


@dataclass
class JobSpec:
    """One or more meshes to start under Slurm.

    With ``same_allocation`` (the default) all meshes live in one sbatch job, mesh
    after mesh in allocation order (:meth:`node_ranges`); otherwise each mesh is its
    own job. ``defaults`` is recorded for reference: :meth:`from_dict` and
    :meth:`from_monarch_kwargs` have already applied it to every mesh.
    ``spare_nodes``: that many more nodes in the allocation, after the meshes' own, kept
    idle so that a lost host can be replaced without a new job (the job then asks Slurm
    for ``--no-kill``, so the loss of a node does not end it).
    """

    job_name: str = DEFAULT_JOB_NAME
    meshes: dict[str, MeshSpec] = field(default_factory=dict)
    log_dir: str = DEFAULT_LOG_DIR
    same_allocation: bool = True
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    spare_nodes: int = 0

    def __post_init__(self) -> None:
        try:
            self.job_name = _check_job_name(self.job_name)
            self.log_dir = _check_log_dir(self.log_dir)
            self.same_allocation = _bool("same_allocation")(self.same_allocation)
        except Invalid as exc:
            raise SpecError(str(exc)) from None
        try:
            self.spare_nodes = _spare_nodes(self.spare_nodes)
        except Invalid as exc:
            raise SpecError(str(exc), key="spare_nodes") from None
        if not self.meshes:
            raise SpecError("a job spec needs at least one mesh (meshes: {name: nodes})")
        for name, mesh in self.meshes.items():
            if not isinstance(mesh, MeshSpec):
                raise SpecError(f"meshes[{name!r}] must be a MeshSpec, got {type(mesh).__name__}")
            if mesh.name != name:
                raise SpecError(f"meshes[{name!r}] holds a MeshSpec named {mesh.name!r}; "
                                "the key and the name must match")
        if self.same_allocation and len(self.meshes) > 1:
            bad = _shared_mismatch(self.meshes)
            if bad:
                raise SpecError(_mismatch_message(self.meshes, *bad), key=bad[0])
            if self.total_nodes > MAX_NODES:
                raise SpecError(f"the meshes share one allocation (same_allocation: true) and "
                                f"ask for {self.total_nodes} nodes in all; at most {MAX_NODES} "
                                f"({_NODES_WHY})", key="meshes")
        if self.spare_nodes and len(self.allocation_groups()) > 1:
            raise SpecError(f"spare_nodes ({self.spare_nodes}) needs the meshes in one "
                            f"allocation, where a spare can replace a host of any of them; "
                            f"set same_allocation: true, or spare_nodes: 0",
                            key="spare_nodes")
        most = max(sum(self.meshes[n].nodes for n in g) for g in self.allocation_groups())
        if self.spare_nodes > MAX_NODES - most:
            raise SpecError(f"spare_nodes must be at most {MAX_NODES - most} (the meshes ask "
                            f"for {most} nodes and one allocation holds at most {MAX_NODES}: "
                            f"{_NODES_WHY}), got {self.spare_nodes}", key="spare_nodes")

    # -- layout helpers for the launcher

    @property
    def total_nodes(self) -> int:
        return sum(m.nodes for m in self.meshes.values())

    def allocation_groups(self) -> list[list[str]]:
        """Mesh names per sbatch job: one group of all meshes, or one group per mesh."""
        names = list(self.meshes)
        return [names] if self.same_allocation else [[n] for n in names]

    def node_ranges(self) -> dict[str, range]:
        """Each mesh's node indexes within its allocation's node list (srun ``--relative``).

        Index into the allocation's expanded nodelist (SLURM_JOB_NODELIST or squeue %N
        expanded) to get the mesh's hosts.
        """
        out: dict[str, range] = {}
        for group in self.allocation_groups():
            start = 0
            for name in group:
                n = self.meshes[name].nodes
                out[name] = range(start, start + n)
                start += n
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :meth:`from_dict` reads back to an equal spec."""
        return {
            "job_name": self.job_name,
            "log_dir": self.log_dir,
            "same_allocation": self.same_allocation,
            **({"spare_nodes": self.spare_nodes} if self.spare_nodes else {}),
            "meshes": {n: {k: v for k, v in m.to_dict().items() if k != "name"}
                       for n, m in self.meshes.items()},
        }

    # -- constructors

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>", *,
                  lines: Mapping[str, int] | None = None, raw: Mapping[str, str] | None = None,
                  prefix: str = "", mesh_name: str = DEFAULT_MESH_NAME) -> "JobSpec":
        """Validate plain data into a JobSpec.

        ``lines`` maps dotted paths (``meshes.trainers.nodes``, ``setup[0]``; under
        ``prefix`` such as ``job`` when the spec sits inside another file) to lines, as
        :func:`parse_yaml_with_lines` and ``hpcmesh.hosts_file.HostsConfig.lines`` record
        them, so errors read ``source:line: ...``. ``raw`` holds the scalars' text.
        A mapping without ``meshes`` is one flat mesh named ``mesh_name``.
        """
        return _from_dict(d, _where(source, lines, raw, prefix), mesh_name)

    @classmethod
    def from_monarch_kwargs(
        cls,
        meshes: Mapping[str, Any],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | int | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        *,
        monarch_port: int | None = None,
        job_start_timeout: int | None = None,
        **extra: Any,
    ) -> "JobSpec":
        """Build a spec from ``monarch.job.SlurmJob``'s keywords, with its defaults.

        ``meshes`` values may be node counts, dicts of mesh keys, or MeshSpecs (used as
        they are). The job-wide keywords become ``defaults`` for dict/int meshes;
        ``slurm_args`` become ``sbatch_extra`` (``--qos=x`` style options are moved to
        their keys). ``monarch_port``/``job_start_timeout`` are accepted and ignored here:
        they belong to the launcher, not the sbatch script.
        """
        del monarch_port, job_start_timeout
        if extra:
            allowed = sorted(set(_MONARCH_KWARGS) | {"monarch_port", "job_start_timeout"})
            name = next(iter(extra))
            raise TypeError(f"SlurmJob got an unexpected keyword argument {name!r}"
                            f"{allowed_suffix(allowed, name)}")
        if isinstance(slurm_args, str):
            slurm_args = [slurm_args]
        defaults: dict[str, Any] = {"python": python_exe, "ntasks_per_node": ntasks_per_node,
                                    "exclusive": exclusive, "sbatch_extra": list(slurm_args)}
        for key, value in (("time", time_limit), ("partition", partition),
                           ("gpus_per_node", gpus_per_node), ("cpus_per_task", cpus_per_task),
                           ("mem", mem), ("account", account), ("qos", qos)):
            if value is not None:
                defaults[key] = value
        if not isinstance(meshes, Mapping):
            raise SpecError(f"meshes must be a mapping of mesh name to node count, got {describe(meshes)}",
                            source="SlurmJob(...)", key="meshes")
        data: dict[str, Any] = {"job_name": job_name, "meshes": dict(meshes), "defaults": defaults}
        if log_dir is not None:
            data["log_dir"] = log_dir
        return _from_dict(data, _where("SlurmJob(...)", None, None), DEFAULT_MESH_NAME)


_MONARCH_KWARGS = ("meshes", "python_exe", "slurm_args", "job_name", "ntasks_per_node",
                   "time_limit", "partition", "log_dir", "exclusive", "gpus_per_node",
                   "cpus_per_task", "mem", "account", "qos")


# --------------------------------------------------------------------------
# dict -> JobSpec with located errors


def _convert(ctx: Where, key: str, value: Any, path: str) -> Any:
    if key == "signal" and value is False:
        value = None  # `signal: false` turns the warning off; its text is not a signal name
    elif key in _TEXT_KEYS:
        value = ctx.text(path, value)
    elif key == "env" and isinstance(value, Mapping):
        value = {k: ctx.text(f"{path}.{k}", v) for k, v in value.items()}
    elif key in ("setup", "sbatch_extra") and isinstance(value, list):
        value = [ctx.text(f"{path}[{i}]", v) for i, v in enumerate(value)]
    try:
        return _CONVERTERS[key](value)
    except Invalid as exc:
        message = str(exc)
        m = re.match(r"^\w+\[(\d+)\]", message)
        at = f"{path}[{m.group(1)}]" if m and key in ("setup", "sbatch_extra") else path
        raise ctx.error(at, message) from None


def _from_dict(d: Any, ctx: Where, mesh_name: str) -> JobSpec:
    top = ctx.path() or "the job spec"
    if d is None:
        raise ctx.error(ctx.path(), f"empty job spec; expected a mapping with keys "
                        f"{', '.join(JOB_KEYS)} (or one mesh's keys)")
    if not isinstance(d, Mapping):
        raise ctx.error(ctx.path(), f"{top} must be a mapping, got {describe(d)}")
    flat = "meshes" not in d
    where = f"{ctx.prefix}" if ctx.prefix else "the job spec"
    if flat and "defaults" in d:
        raise ctx.error(ctx.path("defaults"), "defaults applies to meshes, but there is no "
                        "'meshes:'; add meshes or put the keys at the top level")
    check_keys(ctx, d, _FLAT_KEYS if flat else JOB_KEYS, where, ())

    job: dict[str, Any] = {}
    for key, conv in (("job_name", _check_job_name), ("log_dir", _check_log_dir),
                      ("same_allocation", _bool("same_allocation")),
                      ("spare_nodes", _spare_nodes)):
        if key in d and d[key] is not None:
            value = ctx.text(ctx.path(key), d[key]) if key in ("job_name", "log_dir") \
                else d[key]
            try:
                job[key] = conv(value)
            except Invalid as exc:
                raise ctx.error(ctx.path(key), str(exc)) from None

    if flat:
        defaults_src: Mapping[str, Any] = {}
        mesh_items: list[tuple[str, Any, tuple[str, ...]]] = [
            (mesh_name, {k: v for k, v in d.items() if k in MESH_KEYS}, ())]
    else:
        defaults_src = d.get("defaults") or {}
        if not isinstance(defaults_src, Mapping):
            raise ctx.error(ctx.path("defaults"), f"defaults must be a mapping of mesh keys, "
                            f"got {describe(defaults_src)}", allowed=MESH_KEYS)
        check_keys(ctx, defaults_src, MESH_KEYS, "defaults", ("defaults",))
        meshes_src = d["meshes"]
        if not isinstance(meshes_src, Mapping) or not meshes_src:
            raise ctx.error(ctx.path("meshes"), "meshes must be a non-empty mapping of mesh name "
                            f"to node count or mesh keys, got {describe(meshes_src)}")
        mesh_items = [(name, value, ("meshes", name)) for name, value in meshes_src.items()]

    meshes: dict[str, MeshSpec] = {}
    origins: dict[str, dict[str, str]] = {}
    for name, value, base in mesh_items:
        mpath = ctx.path(*base)
        _check_mesh_name(name, lambda msg: ctx.error(mpath, msg))
        if isinstance(value, MeshSpec):
            if value.name != name:
                value = dataclasses.replace(value, name=name)
            meshes[name] = value
            origins[name] = {}
            continue
        if isinstance(value, str) and whole_number(value) is not None:
            value = whole_number(value)
        if isinstance(value, int) and not isinstance(value, bool):
            value = {"nodes": value}
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ctx.error(mpath, f"mesh {name!r} must be a node count or a mapping of mesh keys, "
                            f"got {describe(value)}", allowed=MESH_KEYS)
        if base:
            check_keys(ctx, value, MESH_KEYS, f"mesh {name!r}", base)
        meshes[name], origins[name] = _build_mesh(ctx, name, value, base, defaults_src)

    spec_kwargs = dict(job, meshes=meshes, defaults=dict(defaults_src))
    if job.get("same_allocation", True) and len(meshes) > 1:
        bad = _shared_mismatch(meshes)
        if bad:
            key, _, other = bad
            at = origins[other].get(key) or ctx.path("meshes", other)
            raise ctx.error(at, _mismatch_message(meshes, *bad))
    try:
        return JobSpec(**spec_kwargs)
    except SpecError as exc:  # anything not caught with a location above
        raise ctx.error(ctx.path(exc.key) if exc.key else ctx.path(), exc.problem) from None


def _build_mesh(ctx: Where, name: str, src: Mapping[str, Any], base: tuple[str, ...],
                defaults: Mapping[str, Any]) -> tuple[MeshSpec, dict[str, str]]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    extra_paths: list[str] = []
    for key in MESH_KEYS:
        in_mesh, in_defaults = key in src, key in defaults
        if key in ("setup", "sbatch_extra"):
            merged: list[str] = []
            for present, source_map, path in ((in_defaults, defaults, ctx.path("defaults", key)),
                                              (in_mesh, src, ctx.path(*base, key))):
                if present:
                    items = _convert(ctx, key, source_map[key], path)
                    merged.extend(items)
                    if key == "sbatch_extra":
                        extra_paths.extend(f"{path}[{i}]" for i in range(len(items)))
                    origin[key] = path
            if in_mesh or in_defaults:
                values[key] = merged
        elif key == "env":
            merged_env: dict[str, str | None] = {}
            if in_defaults:
                merged_env.update(_convert(ctx, key, defaults[key], ctx.path("defaults", key)))
                origin[key] = ctx.path("defaults", key)
            if in_mesh:
                merged_env.update(_convert(ctx, key, src[key], ctx.path(*base, key)))
                origin[key] = ctx.path(*base, key)
            if in_mesh or in_defaults:
                values[key] = merged_env
        elif in_mesh or in_defaults:
            path = ctx.path(*base, key) if in_mesh else ctx.path("defaults", key)
            values[key] = _convert(ctx, key, src[key] if in_mesh else defaults[key], path)
            origin[key] = path
    if "nodes" not in values:
        raise ctx.error(ctx.path(*base), f"mesh {name!r} needs 'nodes' (a positive integer)")
    explicit = set(values)
    full = {k: values.get(k, _field_default(k)) for k in MESH_KEYS}
    try:
        _lift_extras(full, explicit)
    except _Located as exc:
        at = extra_paths[exc.index] if exc.index < len(extra_paths) else ctx.path(*base)
        raise ctx.error(at, exc.message) from None
    for key in MESH_KEYS:
        if key not in origin and full[key] != _field_default(key):
            origin[key] = origin.get("sbatch_extra", ctx.path(*base))
    try:
        return MeshSpec(name=name, **full), origin
    except SpecError as exc:
        raise ctx.error(origin.get(exc.key or "", ctx.path(*base)), exc.problem) from None


# --------------------------------------------------------------------------
# files


def parse_job_spec(text: str, source: str = "<string>", *, mesh_name: str = DEFAULT_MESH_NAME) -> JobSpec:
    """A JobSpec from YAML text; errors name ``source`` and the line."""
    data, lines, raw = parse_yaml_with_lines(text, source)
    return _from_dict(data, _where(source, lines, raw), mesh_name)


def load_job_spec(path: str | os.PathLike, *, mesh_name: str = DEFAULT_MESH_NAME) -> JobSpec:
    """Read a YAML job spec file (see the module docstring for its forms)."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise SpecError("no such file", source=name) from None
    except IsADirectoryError:
        raise SpecError("is a directory, expected a YAML job spec", source=name) from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text ({exc.reason})", source=name) from None
    except OSError as exc:
        raise SpecError(f"cannot read ({exc.strerror or exc})", source=name) from None
    return parse_job_spec(text, name, mesh_name=mesh_name)
