"""Hosts configuration for ``hosts_from_config``: the YAML schema and its parser.

``hosts_from_config(var="HPCMESH_HOSTS")`` reads the YAML file named by that
environment variable (or an explicit path). This module holds the pure part:
reading and validating that file into a :class:`HostsConfig`. Starting host
agents from it lives elsewhere (it needs I/O); keeping parsing pure lets every
mistake be reported before anything is launched, with the file and line.

Schema
------

Top level is a mapping::

    scheduler: slurm            # required: local | slurm | ssh | static
    network:                    # optional: which interface to bind/advertise
      ifname: ib0               #   a name, glob (ib*), comma list, or a list
      # cidr: 10.0.0.0/8        #   or: addresses inside a network (str or list)
    transport:                  # optional
      tls: false                #   true to wrap connections in TLS
      ca: /path/to/ca.pem       #   CA bundle, or "trust_all_connections";
                                #   giving ca without tls implies tls: true

plus the keys of the chosen scheduler (a key of another scheduler is an
error, so a half-edited file cannot silently run on the wrong hosts):

``local``
    ``processes_per_host`` (optional positive int): default per-host process
    count for ``spawn_procs`` on the local host.
``slurm``
    ``job`` (optional mapping): the job spec used only when the controller runs
    outside an allocation (``nodes``, ``gpus_per_node``, ``cpus_per_task``,
    ``mem``, ``time``, ``partition``, ``account``, ``qos``, ``constraint``,
    ``exclusive``, ``sbatch_extra``, ``setup``, ``python``). It is kept as a
    plain dict here and validated by ``hpcmesh.slurm.spec``.
    ``srun_args`` (optional): extra arguments for ``srun --overlap`` inside an
    allocation.
``ssh``
    ``hosts`` (required): a list of host names, each of which may be a hostlist
    expression, or one hostlist string such as ``node[01-04],gpu-a[1-2]``; a name may
    be ``user@host``, and none may be given twice (``expand_hosts``, which SSHJob
    uses too).
    ``ssh_args`` (optional): extra ``ssh`` arguments. ``python`` (optional):
    the Python executable on the remote hosts.
``static``
    ``workers`` (required): list of already-running host agents' addresses, as
    ``attach_to_workers`` takes them (``transport.addresses.parse_worker_address``):
    ``tcp://host:port`` (port 1-65535, IPv6 as ``tcp://[addr]:port``),
    ``unix:///absolute/path`` or ``ipc:///absolute/path``, also Monarch's
    ``DIAL@BIND`` and ``service@`` prefix.

Argument lists (``srun_args``, ``ssh_args``) may be YAML lists or a single
string split with shell rules. Top-level keys starting with ``x-`` are
ignored, so they can hold YAML anchors. A relative ``transport.ca`` is
relative to the config file.

Errors raise :class:`HostsFileError` (a ``ValueError``; ``ConfigError`` is its first
name), worded as ``file:line: problem; allowed: a, b (did you mean 'b'?)``; it is of
``yaml_lines``' family, whose kit reads this file as it reads job specs.
:attr:`HostsConfig.lines` maps dotted keys to lines so later validators (the
job spec) can report ``file:line`` too, via :meth:`HostsConfig.error`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .errors import HpcmeshError
from .slurm.parsing import MAX_HOSTS, SlurmParseError, expand_hostlist
from .transport.addresses import Address, is_host_name, parse_worker_address
from .transport.tls import TRUST_ALL
from .yaml_lines import (Invalid, SchemaError, Where, check_keys, count, describe, load_yaml,
                         nearest_line)

__all__ = [
    "SCHEDULERS",
    "HostsFileError",
    "ConfigError",
    "HostsConfig",
    "load_hosts_config",
    "parse_hosts_config",
    "expand_hosts",
    "HostListError",
]

SCHEDULERS = ("local", "slurm", "ssh", "static")
COMMON_KEYS = ("scheduler", "network", "transport")
SCHEDULER_KEYS: dict[str, tuple[str, ...]] = {
    "local": ("processes_per_host",),
    "slurm": ("job", "srun_args"),
    "ssh": ("hosts", "ssh_args", "python"),
    "static": ("workers",),
}
NETWORK_KEYS = ("ifname", "cidr")
TRANSPORT_KEYS = ("tls", "ca")


class HostsFileError(SchemaError):
    """A bad hosts file; the message names file, line, key and fix. Of the yaml_lines
    family (``SchemaError``), as a job spec's ``SpecError`` is: ``source``, ``line``
    (1-based or None), ``key`` (dotted path), ``value``, ``allowed`` stay attributes."""


#: The name this error had first; kept for the code that catches it.
ConfigError = HostsFileError


@dataclass
class HostsConfig:
    """A validated hosts file. Fields of other schedulers keep their defaults."""

    scheduler: str
    path: str | None = None
    source: str = "<string>"
    # local
    processes_per_host: int | None = None
    # slurm
    job: dict[str, Any] | None = None
    srun_args: list[str] = field(default_factory=list)
    # ssh (hosts are expanded, in file order)
    hosts: list[str] = field(default_factory=list)
    ssh_args: list[str] = field(default_factory=list)
    python: str | None = None
    # static
    workers: list[str] = field(default_factory=list)
    # network: the explicit interface choice for netif.rank_candidates
    # (names/globs or CIDRs, comma-separated), None = automatic
    network_ifname: str | None = None
    # transport
    tls: bool = False
    tls_ca: str | None = None
    # dotted key ("job.nodes", "workers[1]") -> 1-based line
    lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def line_of(self, key: str) -> int | None:
        """Line of ``key``, or of its nearest recorded parent."""
        return nearest_line(self.lines, key)

    def where(self, key: str) -> str:
        """``file:line`` for messages about ``key``."""
        line = self.line_of(key)
        return f"{self.source}:{line}" if line is not None else self.source

    def error(self, key: str, message: str, *, value: Any = None,
              allowed: Sequence[str] = ()) -> HostsFileError:
        """A HostsFileError located at ``key`` (for validators outside this module)."""
        return HostsFileError(message, source=self.source, line=self.line_of(key),
                              key=key, value=value, allowed=allowed)


# --------------------------------------------------------------------------
# reading (yaml_lines' kit: values by dotted path, errors at their line)


def _mapping(w: Where, value: Any, path: str, what: str,
             allowed: Sequence[str] | None = None) -> Mapping[str, Any]:
    """``value`` (at ``path``) as a mapping with string keys, ``allowed`` ones if given."""
    if not isinstance(value, Mapping):
        raise w.error(path, f"{what} must be a mapping, got {describe(value)}")
    check_keys(w, value, allowed, what, (path,) if path else ())
    return value


# --------------------------------------------------------------------------
# field validators


def _string_list(w: Where, value: Any, key: str, *, split: bool) -> list[str]:
    """A list of strings; with ``split`` a single string is shell-split."""
    if value is None:
        return []
    if isinstance(value, str):
        if not split:
            return [value]
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise w.error(key, f"{key}: cannot split {value!r}: {exc}", value=value) from None
    if not isinstance(value, list):
        raise w.error(key, f"{key} must be a list of strings, got {describe(value)}",
                      value=value)
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise w.error(f"{key}[{i}]", f"{key}[{i}] must be a string, got {describe(item)}",
                          value=item)
        out.append(str(item))
    return out


class HostListError(HpcmeshError, ValueError):
    """A bad ssh host list. ``index`` is the list item at fault (None for one string),
    ``first`` the item that named a repeated host first; ``problem`` the message without
    the item's name, for callers that locate it themselves (a file's line)."""

    def __init__(self, problem: str, what: str = "hosts", index: int | None = None,
                 first: int | None = None, name: str | None = None) -> None:
        self.problem, self.index, self.first, self.name = problem, index, first, name
        where = what if index is None else f"{what}[{index}]"
        also = "" if first is None else f" (also at index {first})"
        super().__init__(f"{where}: {problem}{also}")


_USER_RE = re.compile(r"[\w.-]+")
_HOST_NAME_RULE = ("expected a host name of letters, digits, '.', '-' and '_', "
                   "optionally after 'user@'")


def expand_hosts(spec: str | Iterable[str], what: str = "hosts") -> list[str]:
    """The hosts to reach over ssh, in order, from one hostlist string
    (``node[01-04],gpu-a[1-2]``) or a list of host names and hostlists.

    Expansion is slurm.parsing's bounded ``expand_hostlist`` (at most ``MAX_HOSTS``
    names in all); each name must be a host name, optionally ``user@host``, none may be
    given twice (one agent per host; a repeat is a slip) and there must be one at least.
    Raises HostListError, naming the value ``what`` (and the item).
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        index = None if isinstance(spec, str) else i
        if not isinstance(item, str) or not item.strip():
            raise HostListError(f"must be a host name or hostlist, got {describe(item)}",
                                what, index)
        try:
            names = expand_hostlist(item, unique=True)
        except SlurmParseError as exc:
            raise HostListError(str(exc), what, index) from None
        for name in names:
            user, _, host = name.rpartition("@")
            if not is_host_name(host) or (user and not _USER_RE.fullmatch(user)):
                raise HostListError(f"bad host name {name!r} in {item!r}; {_HOST_NAME_RULE}",
                                    what, index)
            if name in seen:
                raise HostListError(f"host {name!r} is listed twice", what, index, seen[name],
                                    name)
            seen[name] = i
            out.append(name)
        if len(out) > MAX_HOSTS:
            raise HostListError(f"more than {MAX_HOSTS} hosts in all", what, index)
    if not out:
        raise HostListError("needs at least one host (a hostlist like 'node[01-04]' or a "
                            "list of host names)", what)
    return out


def _parse_hosts(w: Where, value: Any) -> list[str]:
    if not isinstance(value, (str, list)):
        raise w.error("hosts", "hosts must be a hostlist string or a list of host names, "
                      f"got {describe(value)}", value=value)
    try:
        return expand_hosts(value)
    except HostListError as exc:
        if exc.index is None:
            key, item = "hosts", value
        else:
            key, item = f"hosts[{exc.index}]", value[exc.index]
        if exc.first is None:
            raise w.error(key, str(exc), value=item) from None
        raise w.error(key, f"{exc.problem} (also on line {w.line(f'hosts[{exc.first}]')})",
                      value=exc.name) from None


def _parse_workers(w: Where, value: Any) -> list[str]:
    if isinstance(value, str):
        value, keys = [value], ["workers"]
    elif isinstance(value, list):
        keys = [f"workers[{i}]" for i in range(len(value))]
    else:
        raise w.error("workers", f"workers must be a list of addresses, got "
                      f"{describe(value)}", value=value)
    out: list[str] = []
    first: dict[Address, str] = {}
    for item, key in zip(value, keys):
        if not isinstance(item, str):
            raise w.error(key, f"{key if key != 'workers' else 'workers[0]'} must be an "
                          f"address string, got {describe(item)}", value=item)
        address = item.strip()
        try:
            parsed = parse_worker_address(address)     # what attach_to_workers accepts
        except ValueError as exc:
            raise w.error(key, str(exc), value=item) from None
        if parsed in first:
            raise w.error(key, f"worker {address!r} is listed twice "
                          f"(also on line {w.line(first[parsed])})", value=item)
        first[parsed] = key
        out.append(address)
    if not out:
        raise w.error("workers", "scheduler static needs at least one address in 'workers'")
    return out


def _parse_network(w: Where, value: Any) -> str | None:
    if value is None:
        return None
    given = _mapping(w, value, "network", "network", NETWORK_KEYS)
    if "ifname" in given and "cidr" in given:
        raise w.error("network.cidr", "network: give either 'ifname' or 'cidr', not both")
    if not given:
        return None
    key, value = next(iter(given.items()))
    dotted = f"network.{key}"
    if value is None:
        return None
    if isinstance(value, str):
        pairs = [(t, dotted) for t in value.split(",")]
    elif isinstance(value, list):
        pairs = [(t, f"{dotted}[{i}]") for i, t in enumerate(value)]
    else:
        raise w.error(dotted, f"{dotted} must be a string or a list of strings, "
                      f"got {describe(value)}", value=value)
    tokens = []
    for tok, at in pairs:
        if not isinstance(tok, str) or not tok.strip() or re.search(r"\s", tok.strip()):
            raise w.error(at, f"{dotted}: bad entry {describe(tok)}", value=tok)
        tok = tok.strip()
        if key == "cidr":
            try:
                ipaddress.ip_network(tok, strict=False)
            except ValueError as exc:
                raise w.error(at, f"{dotted}: {tok!r} is not a network like "
                              f"10.0.0.0/8 ({exc})", value=tok) from None
        tokens.append(tok)
    if not tokens:
        raise w.error(dotted, f"{dotted} is empty")
    return ",".join(tokens)


def _parse_transport(w: Where, value: Any, base_dir: Path | None) -> tuple[bool, str | None]:
    if value is None:
        return False, None
    given = _mapping(w, value, "transport", "transport", TRANSPORT_KEYS)
    tls: bool | None = None
    ca: str | None = None
    if "tls" in given:
        value = given["tls"]
        if not isinstance(value, bool):
            raise w.error("transport.tls", f"transport.tls must be true or false, got "
                          f"{describe(value)}", value=value)
        tls = value
    if "ca" in given:
        value = given["ca"]
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                raise w.error("transport.ca", "transport.ca must be a file path or "
                              f"{TRUST_ALL!r}, got {describe(value)}", value=value)
            ca = value.strip()
            if ca != TRUST_ALL:
                ca = os.path.expanduser(ca)
                if base_dir is not None and not os.path.isabs(ca):
                    ca = str(base_dir / ca)
            if tls is False:
                raise w.error("transport.ca", "transport.ca is set but transport.tls is "
                              "false; remove ca or set tls: true", value=ca)
    if tls is None:
        tls = ca is not None
    return tls, ca


# --------------------------------------------------------------------------
# entry points


def parse_hosts_config(
    text: str, source: str = "<string>", *, path: str | os.PathLike | None = None
) -> HostsConfig:
    """Validate hosts-file ``text``; ``source`` is the name used in messages.

    ``path`` (the file, if any) anchors a relative ``transport.ca``.
    """
    data, lines, _raw = load_yaml(text, source, HostsFileError)
    return _build(Where(source, lines, kind=HostsFileError), data, path)


def _build(w: Where, root: Any, path: str | os.PathLike | None) -> HostsConfig:
    if root is None:
        raise HostsFileError("empty hosts configuration; it needs at least 'scheduler:'",
                             source=w.source, key="scheduler", allowed=SCHEDULERS)
    given = _mapping(w, root, "", "the top level")

    if "scheduler" not in given:
        raise w.error("", "missing key 'scheduler'", key="scheduler", allowed=SCHEDULERS)
    scheduler = given["scheduler"]
    if not isinstance(scheduler, str):
        raise w.error("scheduler", f"scheduler must be a name, got {describe(scheduler)}",
                      value=scheduler, allowed=SCHEDULERS)
    if scheduler not in SCHEDULERS:
        raise w.error("scheduler", f"unknown scheduler {scheduler!r}", value=scheduler,
                      allowed=SCHEDULERS)

    own = SCHEDULER_KEYS[scheduler]
    allowed = own + COMMON_KEYS
    for key in given:
        if key in allowed or key.startswith("x-"):
            continue
        owners = [s for s, keys in SCHEDULER_KEYS.items() if key in keys]
        if owners:
            raise w.error(key, f"key {key!r} belongs to scheduler {' / '.join(owners)}, "
                          f"not {scheduler}", value=key, allowed=allowed, suggest=False)
        raise w.error(key, f"unknown key {key!r} for scheduler {scheduler}", value=key,
                      allowed=allowed)

    file_path = str(path) if path is not None else None
    base_dir = Path(file_path).parent if file_path else None
    cfg = HostsConfig(scheduler=scheduler, path=file_path, source=w.source,
                      lines=dict(w.lines))

    if "network" in given:
        cfg.network_ifname = _parse_network(w, given["network"])
    if "transport" in given:
        cfg.tls, cfg.tls_ca = _parse_transport(w, given["transport"], base_dir)

    if scheduler == "local":
        value = given.get("processes_per_host")
        if value is not None:
            try:
                cfg.processes_per_host = count("processes_per_host", value)
            except Invalid as exc:
                raise w.error("processes_per_host", str(exc), value=value) from None
    elif scheduler == "slurm":
        job = given.get("job")
        if job is not None:
            if not isinstance(job, Mapping):
                raise w.error("job", "job must be a mapping (a Slurm job spec: nodes, "
                              f"gpus_per_node, time, ...), got {describe(job)}", value=job)
            cfg.job = dict(_mapping(w, job, "job", "job"))   # checked by slurm.spec on use
        if "srun_args" in given:
            cfg.srun_args = _string_list(w, given["srun_args"], "srun_args", split=True)
    elif scheduler == "ssh":
        if "hosts" not in given:
            raise w.error("", "scheduler ssh needs 'hosts' (a list or a hostlist like "
                          "node[01-04])", key="hosts")
        cfg.hosts = _parse_hosts(w, given["hosts"])
        if "ssh_args" in given:
            cfg.ssh_args = _string_list(w, given["ssh_args"], "ssh_args", split=True)
        python = given.get("python")
        if python is not None:
            if not isinstance(python, str) or not python.strip():
                raise w.error("python", "python must be the remote Python executable "
                              f"(a string), got {describe(python)}", value=python)
            cfg.python = python.strip()
    elif scheduler == "static":
        if "workers" not in given:
            raise w.error("", "scheduler static needs 'workers' (addresses like "
                          "tcp://10.0.0.5:26600)", key="workers")
        cfg.workers = _parse_workers(w, given["workers"])
    return cfg


def load_hosts_config(
    path_or_none: str | os.PathLike | None = None,
    var: str = "HPCMESH_HOSTS",
    env: Mapping[str, str] = os.environ,
) -> HostsConfig | None:
    """Read the hosts file at ``path_or_none``, else the one named by ``env[var]``.

    Returns None when no path is given and the variable is unset or empty:
    the caller then adopts the Slurm allocation or the local host.
    """
    if path_or_none is not None:
        raw = os.fspath(path_or_none)
        origin = raw
    else:
        raw = (env.get(var) or "").strip()
        if not raw:
            return None
        origin = f"{var}={raw}"
    path = os.path.expanduser(raw)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostsFileError(f"{origin}: no such file") from None
    except IsADirectoryError:
        raise HostsFileError(f"{origin}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise HostsFileError(f"{origin}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise HostsFileError(f"{origin}: cannot read ({exc.strerror or exc})") from None
    return parse_hosts_config(text, source=path, path=path)
