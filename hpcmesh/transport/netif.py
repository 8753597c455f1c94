"""Choice of the network interface to bind and advertise (InfiniBand-aware).

On an HPC node the interface that the hostname resolves to is usually the
slow management Ethernet (or, on Debian, ``127.0.1.1`` from ``/etc/hosts``).
Workers must instead talk over IPoIB or the high-speed network, and NCCL/gloo
must be told the same interface. This module reads the kernel's view of the
interfaces (sysfs + procfs, never the resolver), ranks them, and produces the
exact address strings to advertise plus the ``*_SOCKET_IFNAME`` variables.

Order (automatic choice):

1. IPoIB interfaces (``/sys/class/net/<if>/type`` == 32, ARPHRD_INFINIBAND);
2. high-speed fabrics by name (``hsn*`` Slingshot, ``ipogif*`` Aries);
3. the interface that carries the IPv4 default route;
4. any other interface that is up and has a non-link-local IPv4 address.

Never chosen automatically: down interfaces, loopback (except as the last
resort on a machine with nothing else), container/virtual bridges
(``docker*``, ``virbr*``, ``br-*``, ``cni*``, ``flannel*``, ``cali*``,
``veth*``, ...) and link-local ``169.254.0.0/16`` addresses.

An explicit choice (``ifname=`` argument, typically from the hosts config, or
``HPCMESH_IFNAME``) replaces the automatic order. It may be an interface name,
a shell glob (``ib*``), an address, a CIDR (``10.77.0.0/24``), or a
comma-separated list of those; list order is preference order. An explicit
choice that matches nothing usable raises :class:`NoUsableInterfaceError`
instead of silently falling back to a slow or wrong network.

Only :func:`list_interfaces` with ``addresses=None`` touches the live system
(an ``ioctl``/``ip`` query for addresses); everything else is pure and is
driven by the sysfs/procfs roots and mappings passed in.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence
from ..errors import HpcmeshError

__all__ = [
    "ARPHRD_ETHER",
    "ARPHRD_INFINIBAND",
    "ARPHRD_LOOPBACK",
    "ENV_IFNAME",
    "Candidate",
    "InterfaceInfo",
    "NoUsableInterfaceError",
    "describe",
    "list_interfaces",
    "rank_candidates",
    "socket_ifname_env",
    "usable_candidates",
]

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772

ENV_IFNAME = "HPCMESH_IFNAME"

KIND_IPOIB = "ipoib"
KIND_HIGHSPEED = "highspeed"
KIND_DEFAULT_ROUTE = "default-route"
KIND_OTHER = "other"
KIND_LOOPBACK = "loopback"
KIND_BRIDGE = "bridge"
KIND_LINK_LOCAL = "link-local-only"

# Name prefixes of container / VM / CNI plumbing: reachable only from this
# host (or through an overlay that is not the cluster fabric).
_BRIDGE_PREFIXES = (
    "docker", "virbr", "br-", "cni", "flannel", "cali", "veth", "podman",
    "lxcbr", "lxdbr", "lxc", "cilium", "weave", "vxlan.calico", "tunl",
    "kube-", "nodelocaldns",
)
# Slingshot (hsn*) and Cray Aries IP-over-Gemini (ipogif*).
_HIGHSPEED_PREFIXES = ("hsn", "ipogif")

# operstate values under which an interface can carry traffic; "unknown" is
# what loopback, many virtual devices and some IPoIB drivers report.
_USABLE_OPERSTATES = ("up", "unknown")

_IFF_UP = 0x1
_RTF_UP = 0x1
_SIOCGIFADDR = 0x8915

_LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")

_TIER_REASON = {
    KIND_IPOIB: "IPoIB (ARPHRD 32)",
    KIND_HIGHSPEED: "high-speed network",
    KIND_DEFAULT_ROUTE: "default route",
    KIND_OTHER: "up, with an IPv4 address",
}
_TIER_ORDER = (KIND_IPOIB, KIND_HIGHSPEED, KIND_DEFAULT_ROUTE, KIND_OTHER)


class NoUsableInterfaceError(HpcmeshError, RuntimeError):
    """No interface fits the request; the message lists what exists."""


@dataclass(frozen=True)
class InterfaceInfo:
    """One network interface as the kernel reports it.

    ``addresses`` is a tuple (the dataclass is frozen and hashable): IPv4
    strings first, then global IPv6 strings.
    """

    name: str
    addresses: tuple[str, ...]
    arphrd_type: int
    operstate: str
    is_default_route: bool
    kind: str
    flags: int | None = None

    @property
    def is_up(self) -> bool:
        """Up per operstate and, when known, the IFF_UP flag."""
        if self.operstate not in _USABLE_OPERSTATES:
            return False
        return self.flags is None or bool(self.flags & _IFF_UP)


@dataclass(frozen=True)
class Candidate:
    """An address to bind/advertise; ``address`` is exactly what peers dial.

    ``rank`` is 0-based (0 = preferred). IPv6 addresses are bare; use
    :meth:`url` to get a bracketed ``tcp://[addr]:port``.
    """

    ifname: str
    address: str
    rank: int
    reason: str

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.address

    def url(self, port: int, scheme: str = "tcp") -> str:
        host = f"[{self.address}]" if self.is_ipv6 else self.address
        return f"{scheme}://{host}:{port}"


# --------------------------------------------------------------------------
# reading the system


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _natural_key(name: str) -> list:
    """Sort ib2 before ib10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _default_route_ifaces(proc_root: str | os.PathLike) -> set[str]:
    """Interfaces with an up IPv4 default route, from ``<proc>/net/route``.

    The file is hex, host byte order; a default route has destination 0 and
    mask 0. The RTF_UP flag filters stale entries.
    """
    text = _read_text(Path(proc_root) / "net" / "route")
    result: set[str] = set()
    if not text:
        return result
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest = int(fields[1], 16)
            flags = int(fields[3], 16)
            mask = int(fields[7], 16)
        except ValueError:
            continue
        if dest == 0 and mask == 0 and flags & _RTF_UP:
            result.add(fields[0])
    return result


def _ioctl_ipv4(name: str) -> list[str]:
    """Primary IPv4 address of one interface via SIOCGIFADDR."""
    import fcntl  # POSIX only; imported here so the module imports anywhere

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", name.encode()[:15])
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
    except OSError:
        return []
    return [socket.inet_ntoa(res[20:24])]


def _ip_command_ipv4() -> dict[str, list[str]] | None:
    """All IPv4 addresses (secondary ones too) from ``ip -j -4 addr``."""
    ip = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None
    )
    if ip is None:
        return None
    try:
        out = subprocess.run(
            [ip, "-j", "-4", "addr", "show"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout
        data = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    result: dict[str, list[str]] = {}
    for entry in data if isinstance(data, list) else []:
        name = entry.get("ifname")
        if not name:
            continue
        for ai in entry.get("addr_info", []):
            if ai.get("family") == "inet" and ai.get("local"):
                result.setdefault(name, []).append(ai["local"])
    return result


def _proc_ipv6(proc_root: str | os.PathLike) -> dict[str, list[str]]:
    """Global-scope, non-tentative IPv6 addresses from ``<proc>/net/if_inet6``."""
    text = _read_text(Path(proc_root) / "net" / "if_inet6")
    result: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        try:
            addr = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            scope, flags = int(fields[3], 16), int(fields[4], 16)
        except ValueError:
            continue
        # scope 0 = global; flags 0x40 tentative, 0x08 DAD failed
        if scope != 0 or flags & 0x48:
            continue
        result.setdefault(fields[5], []).append(str(addr))
    return result


def _system_addresses(names: Iterable[str], proc_root) -> dict[str, list[str]]:
    names = list(names)
    v4 = _ip_command_ipv4()
    if v4 is None:
        v4 = {n: _ioctl_ipv4(n) for n in names}
    v6 = _proc_ipv6(proc_root)
    return {n: list(v4.get(n, [])) + list(v6.get(n, [])) for n in names}


def _parse_ip(text: str):
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _is_routable(addr: str) -> bool:
    """Not link-local, not unspecified, not loopback (on a non-lo interface)."""
    ip = _parse_ip(addr)
    if ip is None:
        return False
    return not (ip.is_link_local or ip.is_unspecified or ip.is_loopback or ip.is_multicast)


def _classify(name: str, arphrd: int, addresses: Sequence[str], default: bool) -> str:
    if arphrd == ARPHRD_LOOPBACK or name == "lo":
        return KIND_LOOPBACK
    if name.startswith(_BRIDGE_PREFIXES):
        return KIND_BRIDGE
    if addresses and not any(_is_routable(a) for a in addresses):
        if any((ip := _parse_ip(a)) is not None and ip.is_link_local for a in addresses):
            return KIND_LINK_LOCAL
    if arphrd == ARPHRD_INFINIBAND:
        return KIND_IPOIB
    if name.startswith(_HIGHSPEED_PREFIXES):
        return KIND_HIGHSPEED
    if default:
        return KIND_DEFAULT_ROUTE
    return KIND_OTHER


def list_interfaces(
    sysfs_root: str | os.PathLike = "/sys",
    proc_root: str | os.PathLike = "/proc",
    addresses: Mapping[str, Sequence[str]] | None = None,
) -> list[InterfaceInfo]:
    """Every interface under ``<sysfs>/class/net``, in natural name order.

    ``addresses`` maps interface name -> address strings; when None the live
    system is asked (``ip -j -4 addr``, falling back to ``ioctl(SIOCGIFADDR)``,
    plus global IPv6 from ``<proc>/net/if_inet6``). Tests inject it.
    """
    net = Path(sysfs_root) / "class" / "net"
    try:
        names = sorted((p.name for p in net.iterdir()), key=_natural_key)
    except OSError:
        names = []
    defaults = _default_route_ifaces(proc_root)
    if addresses is None:
        addresses = _system_addresses(names, proc_root)

    result = []
    for name in names:
        d = net / name
        try:
            arphrd = int(_read_text(d / "type") or "-1")
        except ValueError:
            arphrd = -1
        operstate = (_read_text(d / "operstate") or "unknown").lower()
        try:
            flags = int(_read_text(d / "flags") or "", 16)
        except ValueError:
            flags = None
        addrs = list(addresses.get(name, ()))
        # IPv4 first so that callers picking "the first" get IPv4
        addrs.sort(key=lambda a: ":" in a)
        default = name in defaults
        result.append(
            InterfaceInfo(
                name=name,
                addresses=tuple(addrs),
                arphrd_type=arphrd,
                operstate=operstate,
                is_default_route=default,
                kind=_classify(name, arphrd, addrs, default),
                flags=flags,
            )
        )
    return result


# --------------------------------------------------------------------------
# ranking


def _usable_auto_addresses(info: InterfaceInfo) -> list[str]:
    """Non-link-local IPv4 addresses: what the automatic choice may use."""
    return [
        a for a in info.addresses
        if ":" not in a and _is_routable(a)
    ]


def _skip_reason(info: InterfaceInfo) -> str | None:
    """Why the automatic choice ignores this interface (None = usable)."""
    if info.kind == KIND_LOOPBACK:
        return "loopback"
    if info.kind == KIND_BRIDGE:
        return "container/virtual bridge"
    if not info.is_up:
        if info.operstate not in _USABLE_OPERSTATES:
            return f"operstate {info.operstate}"
        return "administratively down"
    if info.kind == KIND_LINK_LOCAL:
        return "link-local address only (169.254/16)"
    if not _usable_auto_addresses(info):
        return "no usable IPv4 address"
    return None


def _explicit_addresses(info: InterfaceInfo) -> list[str]:
    """Addresses for an interface named explicitly: IPv4, else global IPv6."""
    v4 = [a for a in info.addresses if ":" not in a and (_parse_ip(a) is not None)]
    routable_v4 = [a for a in v4 if _is_routable(a) or info.kind == KIND_LOOPBACK]
    if routable_v4:
        return routable_v4
    return [a for a in info.addresses if ":" in a and _is_routable(a)]


def _summary(interfaces: Sequence[InterfaceInfo]) -> str:
    if not interfaces:
        return "no interfaces found"
    parts = []
    for i in interfaces:
        addrs = ", ".join(i.addresses) or "no address"
        state = "" if i.is_up else f", {i.operstate}"
        parts.append(f"{i.name} ({addrs}; {i.kind}{state})")
    return "; ".join(parts)


def _parse_network(token: str):
    """A CIDR or bare address as a network, or None if it is a name."""
    try:
        return ipaddress.ip_network(token, strict=False)
    except ValueError:
        return None


def _preference(info: InterfaceInfo) -> tuple:
    """Sort key: automatic tier order, then natural name order."""
    tier = _TIER_ORDER.index(info.kind) if info.kind in _TIER_ORDER else len(_TIER_ORDER)
    return (tier, _natural_key(info.name))


def _explicit_candidates(
    interfaces: Sequence[InterfaceInfo], spec: str, source: str
) -> list[Candidate]:
    """Candidates for an explicit choice, in the order the user listed."""
    from_env = source == ENV_IFNAME
    label = f"{ENV_IFNAME}={spec}" if from_env else f"ifname={spec} from {source}"
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    problems: list[str] = []

    def add(info: InterfaceInfo, addrs: Sequence[str], reason: str) -> None:
        for a in addrs:
            if a not in seen:
                seen.add(a)
                out.append((info.name, a, reason))

    # one token may match several interfaces (glob, CIDR): keep the automatic
    # preference among them
    interfaces = sorted(interfaces, key=_preference)
    for tok in tokens:
        net = _parse_network(tok)
        if net is not None:
            what = "CIDR" if "/" in tok else "address"
            reason = (f"{ENV_IFNAME}={tok}" if from_env
                      else f"{what} {net} from {source}")
            found = False
            for info in interfaces:
                inside = [a for a in info.addresses
                          if (ip := _parse_ip(a)) is not None and ip in net]
                if not inside:
                    continue
                found = True
                if not info.is_up:
                    problems.append(f"{info.name} has {inside[0]} but is {info.operstate}")
                    continue
                add(info, inside, reason)
            if not found:
                problems.append(f"no address inside {net}")
            continue
        reason = f"{ENV_IFNAME}={tok}" if from_env else f"ifname={tok} from {source}"
        matched = [i for i in interfaces if fnmatch.fnmatchcase(i.name, tok)]
        if not matched:
            problems.append(f"no interface named {tok!r}")
        for info in matched:
            if not info.is_up:
                problems.append(f"{info.name} is {info.operstate}")
                continue
            addrs = _explicit_addresses(info)
            if not addrs:
                problems.append(
                    f"{info.name} has "
                    + ("only link-local addresses" if info.kind == KIND_LINK_LOCAL
                       else "no address")
                )
                continue
            add(info, addrs, reason)
    if not out:
        why = "; ".join(dict.fromkeys(problems)) or "empty selection"
        raise NoUsableInterfaceError(
            f"{label} matches no usable interface ({why}); "
            f"available: {_summary(interfaces)}"
        )
    return [Candidate(n, a, r, why) for r, (n, a, why) in enumerate(out)]


def rank_candidates(
    interfaces: Sequence[InterfaceInfo],
    ifname: str | None = None,
    env: Mapping[str, str] = os.environ,
    *,
    allow_loopback: bool = True,
    source: str = "config",
) -> list[Candidate]:
    """Usable addresses in preference order (``rank`` 0 first).

    ``ifname`` (the config's choice; ``source`` names it in reasons and
    errors) wins over ``HPCMESH_IFNAME`` in ``env``;
    either replaces the automatic order and raises
    :class:`NoUsableInterfaceError` when it matches nothing usable. The
    automatic order returns ``[]`` only when there is no usable interface and
    ``allow_loopback`` is False; otherwise loopback is the last resort.
    """
    if ifname is not None and str(ifname).strip():
        return _explicit_candidates(interfaces, str(ifname).strip(), source)
    env_value = (env.get(ENV_IFNAME) or "").strip()
    if env_value:
        return _explicit_candidates(interfaces, env_value, ENV_IFNAME)

    tiers: dict[str, list[tuple[str, str, str]]] = {k: [] for k in _TIER_ORDER}
    seen: set[str] = set()
    for info in sorted(interfaces, key=_preference):
        if _skip_reason(info) is not None:
            continue
        reason = _TIER_REASON[info.kind]
        if info.kind == KIND_HIGHSPEED:
            reason = f"high-speed network ({info.name})"
        if info.is_default_route and info.kind != KIND_DEFAULT_ROUTE:
            reason += ", default route"
        for a in _usable_auto_addresses(info):
            if a not in seen:
                seen.add(a)
                tiers[info.kind].append((info.name, a, reason))
    ordered = [item for k in _TIER_ORDER for item in tiers[k]]
    if not ordered and allow_loopback:
        loops = [i for i in interfaces if i.kind == KIND_LOOPBACK]
        for info in loops:
            for a in info.addresses:
                if ":" not in a and a not in seen:
                    seen.add(a)
                    ordered.append((info.name, a, "loopback (no other interface)"))
        if not ordered:
            name = loops[0].name if loops else "lo"
            ordered.append((name, "127.0.0.1", "loopback (no other interface)"))
    return [Candidate(n, a, r, why) for r, (n, a, why) in enumerate(ordered)]


def usable_candidates(
    interfaces: Sequence[InterfaceInfo] | None = None,
    ifname: str | None = None,
    env: Mapping[str, str] = os.environ,
    *,
    allow_loopback: bool = True,
    source: str = "config",
    sysfs_root: str | os.PathLike = "/sys",
    proc_root: str | os.PathLike = "/proc",
) -> list[Candidate]:
    """:func:`rank_candidates` for use: ``interfaces=None`` reads the live system, and
    nothing usable raises :class:`NoUsableInterfaceError`. The first is what to bind and
    pass to NCCL/gloo; all their addresses, in rank order (IB first), are what the
    controller advertises."""
    if interfaces is None:
        interfaces = list_interfaces(sysfs_root=sysfs_root, proc_root=proc_root)
    else:
        interfaces = list(interfaces)
    cands = rank_candidates(
        interfaces, ifname, env, allow_loopback=allow_loopback, source=source
    )
    if not cands:
        raise NoUsableInterfaceError(
            f"no usable network interface; available: {_summary(interfaces)}"
        )
    return cands


# --------------------------------------------------------------------------
# exporting to processes


def _active_hcas(sysfs_root: str | os.PathLike) -> list[str]:
    """HCAs under ``<sysfs>/class/infiniband`` with an ACTIVE port.

    An HCA whose port states cannot be read is kept (assume usable); one whose
    ports are all known and none ACTIVE is dropped.
    """
    root = Path(sysfs_root) / "class" / "infiniband"
    try:
        hcas = sorted((p.name for p in root.iterdir()), key=_natural_key)
    except OSError:
        return []
    result = []
    for hca in hcas:
        states = []
        try:
            for port in (root / hca / "ports").iterdir():
                s = _read_text(port / "state")
                if s is not None:
                    states.append(s.upper())
        except OSError:
            pass
        if not states or any("ACTIVE" in s for s in states):
            result.append(hca)
    return result


def socket_ifname_env(
    candidate_or_name: Candidate | InterfaceInfo | str,
    environ: Mapping[str, str],
    sysfs_root: str | os.PathLike = "/sys",
) -> dict[str, str]:
    """Variables to add to a process environment; never overrides ``environ``.

    ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` get the chosen interface
    (NCCL bootstraps and gloo connects over it); ``NCCL_IB_HCA`` lists the
    active HCAs when the node has any.
    """
    if isinstance(candidate_or_name, Candidate):
        name = candidate_or_name.ifname
    elif isinstance(candidate_or_name, InterfaceInfo):
        name = candidate_or_name.name
    else:
        name = str(candidate_or_name)
    out: dict[str, str] = {}
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var not in environ and name:
            out[var] = name
    if "NCCL_IB_HCA" not in environ:
        hcas = _active_hcas(sysfs_root)
        if hcas:
            out["NCCL_IB_HCA"] = ",".join(hcas)
    return out


# --------------------------------------------------------------------------
# reporting


def describe(
    candidates: Sequence[Candidate], interfaces: Sequence[InterfaceInfo]
) -> str:
    """A text table for ``hpcmesh info``: every interface and why it was
    chosen, advertised or skipped."""
    by_if: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_if.setdefault(c.ifname, []).append(c)
    rows = [("INTERFACE", "TYPE", "STATE", "KIND", "ADDRESSES", "CHOICE")]
    # chosen/advertised first, in rank order; skipped ones after, as given
    first_rank = {n: min(c.rank for c in cs) for n, cs in by_if.items()}
    ordered = sorted(interfaces, key=lambda i: first_rank.get(i.name, len(candidates)))
    for info in ordered:
        mine = by_if.get(info.name, [])
        if mine:
            ranks = ",".join(f"#{c.rank}" for c in mine)
            verb = "chosen" if any(c.rank == 0 for c in mine) else "advertised"
            choice = f"{verb} {ranks}: {mine[0].reason}"
        else:
            why = _skip_reason(info)
            if why is None:
                why = "not selected (explicit choice)"
            choice = f"skipped: {why}"
        rows.append((
            info.name,
            str(info.arphrd_type),
            info.operstate,
            info.kind,
            ", ".join(info.addresses) or "-",
            choice,
        ))
    known = {i.name for i in interfaces}
    for c in candidates:  # e.g. the synthesized 127.0.0.1 fallback
        if c.ifname not in known:
            known.add(c.ifname)
            verb = "chosen" if c.rank == 0 else "advertised"
            rows.append((c.ifname, "-", "-", "-", c.address, f"{verb} #{c.rank}: {c.reason}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        cells = [r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
