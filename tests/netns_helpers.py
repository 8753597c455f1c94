"""Private network namespaces for tests (root only; iproute2).

``Lab`` builds throw-away namespaces named ``hpcmt-<pid>-<n>-<tag>`` and veth
pairs created directly inside them, so nothing is ever added to the root
namespace and nothing touches the Slurm test cluster (``hpcm-br0``,
``hpcm-node*``). Every address a test assigns must lie in 10.88.0.0/16 or
10.89.0.0/16, ranges that exist only on these veths: traffic of these tests
stays on loopback or inside namespaces they created.

``Lab.close()`` kills whatever still runs inside its namespaces (by pid, from
``ip netns pids``), then deletes the namespaces (their veths go with them). It
is safe to call more than once, and ``cleanup_stale()`` removes namespaces left
by a test run that was killed before it could clean up.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "hpcmt-"
ALLOWED_NETS = (ipaddress.ip_network("10.88.0.0/16"), ipaddress.ip_network("10.89.0.0/16"))
PY = sys.executable
_counter = itertools.count(1)
_STALE_RE = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


class NetnsError(RuntimeError):
    pass


def _ip_binary() -> str:
    ip = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None)
    if ip is None:
        raise NetnsError("iproute2 `ip` not found")
    return ip


def ip(*args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
    r = subprocess.run([_ip_binary(), *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def check_private(cidr_or_addr: str) -> None:
    """Refuse any address outside the ranges reserved for these tests."""
    addr = ipaddress.ip_interface(cidr_or_addr).ip
    if not any(addr in n for n in ALLOWED_NETS):
        raise ValueError(f"{cidr_or_addr} is outside the test ranges {ALLOWED_NETS}")


def _ns_pids(ns: str) -> list[int]:
    r = ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def _delete_ns(ns: str) -> None:
    """Kill what runs inside (those are processes this module started), then delete."""
    for pid in _ns_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 3
    while _ns_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.02)
    ip("netns", "del", ns, check=False)


def list_test_namespaces() -> list[str]:
    r = ip("netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX)]


def cleanup_stale() -> list[str]:
    """Delete ``hpcmt-<pid>-…`` namespaces whose creating process is gone."""
    removed = []
    for ns in list_test_namespaces():
        m = _STALE_RE.match(ns)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue           # its test run is still alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _delete_ns(ns)
        removed.append(ns)
    return removed


class Lab:
    """A set of namespaces, veths and processes that ``close()`` removes again."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        # short base directory: unix socket paths must stay under 108 bytes
        self.tmp = Path(tempfile.mkdtemp(prefix="hpcmt-", dir="/tmp"))
        self.closed = False

    # -- building -------------------------------------------------------------------
    def netns(self, short: str) -> str:
        name = f"{self.tag}-{short}"
        if len(name) > 64:
            raise ValueError(f"namespace name too long: {name}")
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def veth(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        """A veth pair created inside ``ns_a`` with its peer inside ``ns_b``; both up."""
        ip("-n", ns_a, "link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", ns_b)
        ip("-n", ns_a, "link", "set", if_a, "up")
        ip("-n", ns_b, "link", "set", if_b, "up")

    def addr(self, ns: str, ifname: str, cidr: str) -> None:
        check_private(cidr)
        ip("-n", ns, "addr", "add", cidr, "dev", ifname)

    def route(self, ns: str, dest: str, via: str | None = None, dev: str | None = None) -> None:
        if dest != "default":
            check_private(dest)
        args = ["-n", ns, "route", "add", dest]
        if via:
            check_private(via)
            args += ["via", via]
        if dev:
            args += ["dev", dev]
        ip(*args)

    def blackhole_via(self, ns: str, dest: str, dev: str, gateway: str) -> None:
        """Route ``dest`` in ``ns`` through ``gateway``, a neighbour pinned to a MAC
        address nobody has: SYNs leave the interface and are dropped silently by the
        receiver (wrong destination MAC), so a connect() waits for its timeout, exactly
        like a firewalled or unreachable-but-routed network."""
        check_private(dest)
        check_private(gateway)
        ip("-n", ns, "neigh", "replace", gateway, "lladdr", "02:00:00:00:00:63", "dev", dev,
           "nud", "permanent")
        ip("-n", ns, "route", "add", dest, "via", gateway, "dev", dev)

    def wait_up(self, ns: str, *ifnames: str, timeout: float = 5.0) -> None:
        """veth operstate turns "up" asynchronously (linkwatch); netif ignores down links."""
        deadline = time.monotonic() + timeout
        pending = set(ifnames)
        while True:
            r = ip("-n", ns, "-j", "link", "show", check=False)
            try:
                data = json.loads(r.stdout or "[]")
            except ValueError:
                data = []
            for entry in data:
                if entry.get("ifname") in pending and entry.get("operstate") == "UP":
                    pending.discard(entry["ifname"])
            if not pending:
                return
            if time.monotonic() > deadline:
                raise NetnsError(f"{ns}: interfaces {sorted(pending)} not up within {timeout} s")
            time.sleep(0.02)

    # -- running --------------------------------------------------------------------
    def argv(self, ns: str, argv: list[str], hide: list[str | os.PathLike] = ()) -> list[str]:
        """``ip netns exec ns argv``; ``hide`` paths get an empty tmpfs mounted over them in
        that process's own mount namespace (``ip netns exec`` makes one, slave to the
        host's, so nothing leaks out): a "remote host" must not see the other side's unix
        sockets through the shared /tmp."""
        if hide:
            script = ('for p in "$@"; do [ "$p" = -- ] && break; '
                      'mount -t tmpfs -o size=1m,mode=0700 hpcmt-hide "$p" || exit 97; done; '
                      'while [ "$1" != -- ]; do shift; done; shift; exec "$@"')
            argv = ["sh", "-c", script, "sh", *map(str, hide), "--", *argv]
        return [_ip_binary(), "netns", "exec", ns, *argv]

    def run(self, ns: str, argv: list[str], *, env: dict | None = None, timeout: float = 15,
            hide=(), cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(ns, argv, hide), env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=cwd or self.tmp)

    def popen(self, ns: str, argv: list[str], *, env: dict | None = None, hide=(),
              stdout=None, stderr=None, cwd=None) -> subprocess.Popen:
        p = subprocess.Popen(self.argv(ns, argv, hide), env=env, stdin=subprocess.DEVNULL,
                             stdout=stdout, stderr=stderr, cwd=cwd or self.tmp,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def python(self, ns: str, code: str, *, env: dict | None = None, timeout: float = 15,
               hide=()) -> subprocess.CompletedProcess:
        return self.run(ns, [PY, "-c", code], env=env, timeout=timeout, hide=hide)

    # -- teardown -------------------------------------------------------------------
    def stop(self, p: subprocess.Popen, grace: float = 3.0) -> int | None:
        """SIGTERM (a worker then kills what it started), then SIGKILL."""
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        return p.returncode

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        errors = []
        for p in self.procs:
            try:
                self.stop(p)
            except Exception as e:  # noqa: BLE001 - keep cleaning
                errors.append(f"pid {p.pid}: {e}")
        for ns in reversed(self.namespaces):
            try:
                _delete_ns(ns)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{ns}: {e}")
        left = [n for n in list_test_namespaces() if n.startswith(self.tag + "-")]
        shutil.rmtree(self.tmp, ignore_errors=True)
        if left or errors:
            raise NetnsError(f"cleanup incomplete: namespaces left {left}; errors {errors}")


# --------------------------------------------------------------------------------------
# fake sysfs


def make_fake_sysfs(root: Path, ifaces: dict[str, tuple], hcas: dict[str, list[str]] | None
                    = None) -> Path:
    """``<root>/class/net/<if>/{type,operstate,flags}`` and
    ``<root>/class/infiniband/<hca>/ports/<n>/state``; ifaces: name -> (type, operstate[,
    flags hex])."""
    for name, spec in ifaces.items():
        d = root / "class" / "net" / name
        d.mkdir(parents=True)
        (d / "type").write_text(f"{spec[0]}\n")
        (d / "operstate").write_text(f"{spec[1]}\n")
        if len(spec) > 2:
            (d / "flags").write_text(f"{spec[2]}\n")
    for hca, states in (hcas or {}).items():
        for i, state in enumerate(states, 1):
            p = root / "class" / "infiniband" / hca / "ports" / str(i)
            p.mkdir(parents=True)
            (p / "state").write_text(state + "\n")
    return root


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment minus anything that would steer hpcmesh (Slurm
    variables, an inherited interface choice or secret), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HPCMESH_", "NCCL_", "GLOO_"))}
    env["HPCMESH_LEASE_GRACE"] = os.environ.get("HPCMESH_LEASE_GRACE", "3")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
