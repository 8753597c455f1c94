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

Errors raise :class:`ConfigError` (a ``ValueError``) worded as
``file:line: problem; allowed: a, b (did you mean 'b'?)``.
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

import yaml

from .slurm.parsing import MAX_HOSTS, SlurmParseError, expand_hostlist
from .transport.addresses import Address, is_host_name, parse_worker_address
from .transport.tls import TRUST_ALL
from .yaml_lines import (DuplicateKey, allowed_suffix, describe_yaml_error, index_lines,
                         nearest_line)
from .errors import HpcmeshError

__all__ = [
    "SCHEDULERS",
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


class ConfigError(HpcmeshError, ValueError):
    """A bad hosts configuration; the message names file, line, key and fix.

    Attributes keep the pieces for programmatic use: ``source``, ``line``
    (1-based or None), ``key`` (dotted path), ``value``, ``allowed``.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
        value: Any = None,
        allowed: Sequence[str] = (),
        suggest: bool = True,
    ) -> None:
        self.source = source
        self.line = line
        self.key = key
        self.value = value
        self.allowed = tuple(allowed)
        self.problem = message
        guess = value if suggest and isinstance(value, str) else None
        text = message + allowed_suffix(self.allowed, guess)
        if source is not None:
            loc = f"{source}:{line}" if line is not None else source
            text = f"{loc}: {text}"
        super().__init__(text)


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
              allowed: Sequence[str] = ()) -> ConfigError:
        """A ConfigError located at ``key`` (for validators outside this module)."""
        return ConfigError(message, source=self.source, line=self.line_of(key),
                           key=key, value=value, allowed=allowed)


# --------------------------------------------------------------------------
# YAML walking with line numbers


class _Doc:
    """A composed YAML document: nodes keep marks, values come from SafeLoader."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: dict[str, int] = {}
        try:
            self._loader = yaml.SafeLoader(text)     # refuses a NUL byte here already
            self.root = self._loader.get_single_node()
        except yaml.YAMLError as exc:
            message, line = describe_yaml_error(exc, text)
            raise ConfigError(message, source=source, line=line) from None
        if self.root is not None:
            try:
                index_lines(self._loader, self.root, self.lines)
            except DuplicateKey as e:
                raise ConfigError(str(e), source=source, line=e.line, key=e.path) from None

    def close(self) -> None:
        self._loader.dispose()

    def fail(self, node: yaml.Node | None, message: str, **kw: Any) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else None
        return ConfigError(message, source=self.source, line=line, **kw)

    def value(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self.fail(node, f"invalid YAML value: {exc.problem}") from None


def _describe(value: Any) -> str:
    """Short type+value text for 'got ...' in messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _mapping_items(doc: _Doc, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise doc.fail(node, f"{what} must be a mapping, got {_describe(doc.value(node))}", key=what)
    out = []
    for knode, vnode in node.value:
        key = doc.value(knode)
        if not isinstance(key, str):
            raise doc.fail(knode, f"keys of {what} must be strings, got {_describe(key)}",
                           key=what, value=key)
        out.append((key, knode, vnode))
    return out


def _check_keys(doc: _Doc, items, allowed: Sequence[str], where: str) -> None:
    for key, knode, _ in items:
        if key not in allowed:
            raise doc.fail(knode, f"unknown key {key!r} in {where}", key=f"{where}.{key}",
                           value=key, allowed=allowed)


# --------------------------------------------------------------------------
# field validators


def _string_list(doc: _Doc, node: yaml.Node, key: str, *, split: bool) -> list[str]:
    """A list of strings; with ``split`` a single string is shell-split."""
    value = doc.value(node)
    if value is None:
        return []
    if isinstance(value, str):
        if not split:
            return [value]
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise doc.fail(node, f"{key}: cannot split {value!r}: {exc}", key=key,
                           value=value) from None
    if not isinstance(value, list):
        raise doc.fail(node, f"{key} must be a list of strings, got {_describe(value)}",
                       key=key, value=value)
    out = []
    for i, (item, inode) in enumerate(zip(value, node.value)):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise doc.fail(inode, f"{key}[{i}] must be a string, got {_describe(item)}",
                           key=f"{key}[{i}]", value=item)
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
            raise HostListError(f"must be a host name or hostlist, got {_describe(item)}",
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


def _parse_hosts(doc: _Doc, node: yaml.Node) -> list[str]:
    value = doc.value(node)
    if not isinstance(value, (str, list)):
        raise doc.fail(node, "hosts must be a hostlist string or a list of host names, "
                       f"got {_describe(value)}", key="hosts", value=value)
    try:
        hosts = expand_hosts(value)
    except HostListError as exc:
        if exc.index is None:
            at, key, item = node, "hosts", value
        else:
            at, key, item = node.value[exc.index], f"hosts[{exc.index}]", value[exc.index]
        if exc.first is None:
            raise doc.fail(at, str(exc), key=key, value=item) from None
        line = node.value[exc.first].start_mark.line + 1
        raise doc.fail(at, f"{exc.problem} (also on line {line})", key=key,
                       value=exc.name) from None
    return hosts


def _parse_workers(doc: _Doc, node: yaml.Node) -> list[str]:
    value = doc.value(node)
    if isinstance(value, str):
        value, items = [value], [node]
    elif isinstance(value, list):
        items = node.value
    else:
        raise doc.fail(node, f"workers must be a list of addresses, got {_describe(value)}",
                       key="workers", value=value)
    out: list[str] = []
    first: dict[Address, int] = {}
    for i, (item, inode) in enumerate(zip(value, items)):
        key = f"workers[{i}]"
        if not isinstance(item, str):
            raise doc.fail(inode, f"{key} must be an address string, got {_describe(item)}",
                           key=key, value=item)
        address = item.strip()
        try:
            parsed = parse_worker_address(address)     # what attach_to_workers accepts
        except ValueError as exc:
            raise doc.fail(inode, str(exc), key=key, value=item) from None
        line = inode.start_mark.line + 1
        if parsed in first:
            raise doc.fail(inode, f"worker {address!r} is listed twice "
                           f"(also on line {first[parsed]})", key=key, value=item)
        first[parsed] = line
        out.append(address)
    if not out:
        raise doc.fail(node, "scheduler static needs at least one address in 'workers'",
                       key="workers")
    return out


def _parse_network(doc: _Doc, node: yaml.Node) -> str | None:
    if doc.value(node) is None:
        return None
    items = _mapping_items(doc, node, "network")
    _check_keys(doc, items, NETWORK_KEYS, "network")
    given = {k: (knode, vnode) for k, knode, vnode in items}
    if "ifname" in given and "cidr" in given:
        raise doc.fail(given["cidr"][0], "network: give either 'ifname' or 'cidr', not both",
                       key="network.cidr")
    if not given:
        return None
    key, (_, vnode) = next(iter(given.items()))
    dotted = f"network.{key}"
    value = doc.value(vnode)
    if value is None:
        return None
    if isinstance(value, str):
        pairs = [(t, vnode) for t in value.split(",")]
    elif isinstance(value, list):
        pairs = list(zip(value, vnode.value))
    else:
        raise doc.fail(vnode, f"{dotted} must be a string or a list of strings, "
                       f"got {_describe(value)}", key=dotted, value=value)
    tokens = []
    for tok, tnode in pairs:
        if not isinstance(tok, str) or not tok.strip() or re.search(r"\s", tok.strip()):
            raise doc.fail(tnode, f"{dotted}: bad entry {_describe(tok)}", key=dotted,
                           value=tok)
        tok = tok.strip()
        if key == "cidr":
            try:
                ipaddress.ip_network(tok, strict=False)
            except ValueError as exc:
                raise doc.fail(tnode, f"{dotted}: {tok!r} is not a network like "
                               f"10.0.0.0/8 ({exc})", key=dotted, value=tok) from None
        tokens.append(tok)
    if not tokens:
        raise doc.fail(vnode, f"{dotted} is empty", key=dotted)
    return ",".join(tokens)


def _parse_transport(doc: _Doc, node: yaml.Node, base_dir: Path | None) -> tuple[bool, str | None]:
    if doc.value(node) is None:
        return False, None
    items = _mapping_items(doc, node, "transport")
    _check_keys(doc, items, TRANSPORT_KEYS, "transport")
    given = {k: vnode for k, _, vnode in items}
    tls: bool | None = None
    ca: str | None = None
    if "tls" in given:
        value = doc.value(given["tls"])
        if not isinstance(value, bool):
            raise doc.fail(given["tls"], f"transport.tls must be true or false, got "
                           f"{_describe(value)}", key="transport.tls", value=value)
        tls = value
    if "ca" in given:
        value = doc.value(given["ca"])
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                raise doc.fail(given["ca"], "transport.ca must be a file path or "
                               f"{TRUST_ALL!r}, got {_describe(value)}", key="transport.ca",
                               value=value)
            ca = value.strip()
            if ca != TRUST_ALL:
                ca = os.path.expanduser(ca)
                if base_dir is not None and not os.path.isabs(ca):
                    ca = str(base_dir / ca)
            if tls is False:
                raise doc.fail(given["ca"], "transport.ca is set but transport.tls is false; "
                               "remove ca or set tls: true", key="transport.ca", value=ca)
    if tls is None:
        tls = ca is not None
    return tls, ca


def _positive_int(doc: _Doc, node: yaml.Node, key: str) -> int | None:
    value = doc.value(node)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise doc.fail(node, f"{key} must be a positive integer, got {_describe(value)}",
                       key=key, value=value)
    return value


# --------------------------------------------------------------------------
# entry points


def parse_hosts_config(
    text: str, source: str = "<string>", *, path: str | os.PathLike | None = None
) -> HostsConfig:
    """Validate hosts-file ``text``; ``source`` is the name used in messages.

    ``path`` (the file, if any) anchors a relative ``transport.ca``.
    """
    doc = _Doc(text, source)
    try:
        return _build(doc, path)
    finally:
        doc.close()


def _build(doc: _Doc, path: str | os.PathLike | None) -> HostsConfig:
    root = doc.root
    if root is None:
        raise ConfigError("empty hosts configuration; it needs at least 'scheduler:'",
                          source=doc.source, key="scheduler", allowed=SCHEDULERS)
    items = _mapping_items(doc, root, "the top level")
    given = {k: (knode, vnode) for k, knode, vnode in items}

    if "scheduler" not in given:
        raise doc.fail(root, "missing key 'scheduler'", key="scheduler", allowed=SCHEDULERS)
    snode = given["scheduler"][1]
    scheduler = doc.value(snode)
    if not isinstance(scheduler, str):
        raise doc.fail(snode, f"scheduler must be a name, got {_describe(scheduler)}",
                       key="scheduler", value=scheduler, allowed=SCHEDULERS)
    if scheduler not in SCHEDULERS:
        raise doc.fail(snode, f"unknown scheduler {scheduler!r}", key="scheduler",
                       value=scheduler, allowed=SCHEDULERS)

    own = SCHEDULER_KEYS[scheduler]
    allowed = own + COMMON_KEYS
    for key, knode, _ in items:
        if key in allowed or key.startswith("x-"):
            continue
        owners = [s for s, keys in SCHEDULER_KEYS.items() if key in keys]
        if owners:
            raise doc.fail(knode, f"key {key!r} belongs to scheduler {' / '.join(owners)}, "
                           f"not {scheduler}", key=key, value=key, allowed=allowed,
                           suggest=False)
        raise doc.fail(knode, f"unknown key {key!r} for scheduler {scheduler}", key=key,
                       value=key, allowed=allowed)

    file_path = str(path) if path is not None else None
    base_dir = Path(file_path).parent if file_path else None
    cfg = HostsConfig(scheduler=scheduler, path=file_path, source=doc.source,
                      lines=dict(doc.lines))

    if "network" in given:
        cfg.network_ifname = _parse_network(doc, given["network"][1])
    if "transport" in given:
        cfg.tls, cfg.tls_ca = _parse_transport(doc, given["transport"][1], base_dir)

    if scheduler == "local":
        if "processes_per_host" in given:
            cfg.processes_per_host = _positive_int(doc, given["processes_per_host"][1],
                                                   "processes_per_host")
    elif scheduler == "slurm":
        if "job" in given:
            jnode = given["job"][1]
            job = doc.value(jnode)
            if job is not None:
                if not isinstance(job, dict):
                    raise doc.fail(jnode, "job must be a mapping (a Slurm job spec: nodes, "
                                   f"gpus_per_node, time, ...), got {_describe(job)}",
                                   key="job", value=job)
                bad = next((k for k in job if not isinstance(k, str)), None)
                if bad is not None:
                    raise doc.fail(jnode, f"keys of job must be strings, got {_describe(bad)}",
                                   key="job", value=bad)
                cfg.job = job
        if "srun_args" in given:
            cfg.srun_args = _string_list(doc, given["srun_args"][1], "srun_args", split=True)
    elif scheduler == "ssh":
        if "hosts" not in given:
            raise doc.fail(root, "scheduler ssh needs 'hosts' (a list or a hostlist like "
                           "node[01-04])", key="hosts")
        cfg.hosts = _parse_hosts(doc, given["hosts"][1])
        if "ssh_args" in given:
            cfg.ssh_args = _string_list(doc, given["ssh_args"][1], "ssh_args", split=True)
        if "python" in given:
            pnode = given["python"][1]
            python = doc.value(pnode)
            if python is not None:
                if not isinstance(python, str) or not python.strip():
                    raise doc.fail(pnode, "python must be the remote Python executable "
                                   f"(a string), got {_describe(python)}", key="python",
                                   value=python)
                cfg.python = python.strip()
    elif scheduler == "static":
        if "workers" not in given:
            raise doc.fail(root, "scheduler static needs 'workers' (addresses like "
                           "tcp://10.0.0.5:26600)", key="workers")
        cfg.workers = _parse_workers(doc, given["workers"][1])
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
        raise ConfigError(f"{origin}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{origin}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{origin}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read ({exc.strerror or exc})") from None
    return parse_hosts_config(text, source=path, path=path)
