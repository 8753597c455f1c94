"""Interface choice against a fake sysfs/procfs tree (plus one live smoke test)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
from netns_helpers import make_fake_sysfs

from hpcmesh.transport import netif
from hpcmesh.transport.netif import (
    Candidate,
    NoUsableInterfaceError,
    describe,
    list_interfaces,
    rank_candidates,
    socket_ifname_env,
    usable_candidates,
)


def _hex_le(ip: str) -> str:
    """/proc/net/route writes addresses as host-order (little-endian) hex."""
    return "%08X" % struct.unpack("<I", socket.inet_aton(ip))[0]


def make_tree(root: Path, ifaces: dict, routes: list[tuple[str, str, str, str]],
              hcas: dict[str, list[str]] | None = None) -> tuple[Path, Path]:
    """Build <root>/sys and <root>/proc; ifaces: name -> (type, operstate[, flags])."""
    sys_root, proc_root = root / "sys", root / "proc"
    make_fake_sysfs(sys_root, ifaces, hcas)
    (proc_root / "net").mkdir(parents=True)
    lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    for iface, dest, gw, mask in routes:
        lines.append("\t".join([iface, _hex_le(dest), _hex_le(gw), "0003", "0", "0", "0",
                                _hex_le(mask), "0", "0", "0"]))
    (proc_root / "net" / "route").write_text("\n".join(lines) + "\n")
    return sys_root, proc_root


IFACES = {
    "lo": (772, "unknown"),
    "eth0": (1, "up"),
    "ib0": (32, "up"),
    "docker0": (1, "up"),
    "hsn0": (1, "up"),
    "eth1": (1, "down"),
    "eth2": (1, "up"),       # only a 169.254 address
    "eth3": (1, "up"),       # another plain interface
    "virbr0": (1, "up"),
    "veth1a2b": (1, "up"),
}
ADDRS = {
    "lo": ["127.0.0.1", "::1"],
    "eth0": ["192.168.1.10", "fd00::10"],
    "ib0": ["10.77.0.5", "fe80::1"],
    "docker0": ["172.17.0.1"],
    "hsn0": ["10.100.0.5"],
    "eth1": ["192.168.2.10"],
    "eth2": ["169.254.3.4"],
    "eth3": ["172.20.0.9"],
    "virbr0": ["192.168.122.1"],
    "veth1a2b": [],
}
ROUTES = [
    ("eth0", "0.0.0.0", "192.168.1.1", "0.0.0.0"),
    ("eth0", "192.168.1.0", "0.0.0.0", "255.255.255.0"),
    ("ib0", "10.77.0.0", "0.0.0.0", "255.255.0.0"),
]


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path, IFACES, ROUTES, hcas={"mlx5_0": ["4: ACTIVE"]})


@pytest.fixture
def ifs(tree):
    sys_root, proc_root = tree
    return list_interfaces(sys_root, proc_root, addresses=ADDRS)


def by_name(ifs):
    return {i.name: i for i in ifs}


def test_list_interfaces_reads_types_states_routes_and_kinds(ifs):
    info = by_name(ifs)
    assert set(info) == set(IFACES)
    assert info["ib0"].arphrd_type == 32 and info["ib0"].kind == "ipoib"
    assert info["lo"].arphrd_type == 772 and info["lo"].kind == "loopback"
    assert info["eth0"].is_default_route and info["eth0"].kind == "default-route"
    assert not info["ib0"].is_default_route
    assert info["hsn0"].kind == "highspeed"
    assert info["docker0"].kind == "bridge"
    assert info["virbr0"].kind == "bridge"
    assert info["veth1a2b"].kind == "bridge"
    assert info["eth2"].kind == "link-local-only"
    assert info["eth3"].kind == "other"
    assert info["eth1"].operstate == "down" and not info["eth1"].is_up
    # IPv4 first, IPv6 kept
    assert info["eth0"].addresses == ("192.168.1.10", "fd00::10")


def test_natural_name_order(tmp_path):
    sys_root, proc_root = make_tree(tmp_path, {"ib10": (32, "up"), "ib2": (32, "up")}, [])
    ifs = list_interfaces(sys_root, proc_root, addresses={"ib10": ["10.0.0.10"],
                                                           "ib2": ["10.0.0.2"]})
    assert [i.name for i in ifs] == ["ib2", "ib10"]
    assert [c.ifname for c in rank_candidates(ifs, env={})] == ["ib2", "ib10"]


def test_ranking_order(ifs):
    cands = rank_candidates(ifs, env={})
    assert [(c.ifname, c.address) for c in cands] == [
        ("ib0", "10.77.0.5"),
        ("hsn0", "10.100.0.5"),
        ("eth0", "192.168.1.10"),
        ("eth3", "172.20.0.9"),
    ]
    assert [c.rank for c in cands] == [0, 1, 2, 3]
    assert cands[0].reason == "IPoIB (ARPHRD 32)"
    assert "high-speed" in cands[1].reason
    assert cands[2].reason == "default route"


def test_never_loopback_bridges_down_or_link_local(ifs):
    addrs = [c.address for c in usable_candidates(ifs, env={})]
    assert addrs == ["10.77.0.5", "10.100.0.5", "192.168.1.10", "172.20.0.9"]
    for bad in ("127.0.0.1", "172.17.0.1", "192.168.122.1", "192.168.2.10", "169.254.3.4"):
        assert bad not in addrs
    assert not any(":" in a for a in addrs)  # no IPv6 in the automatic choice


def test_usable_candidates_first_is_the_choice(ifs):
    c = usable_candidates(ifs, env={})[0]
    assert (c.ifname, c.address, c.rank) == ("ib0", "10.77.0.5", 0)
    assert c.url(26600) == "tcp://10.77.0.5:26600"


def test_default_route_ipoib_keeps_ipoib_reason(tmp_path):
    sys_root, proc_root = make_tree(
        tmp_path, {"ib0": (32, "up"), "eth0": (1, "up")},
        [("ib0", "0.0.0.0", "10.0.0.1", "0.0.0.0")])
    ifs = list_interfaces(sys_root, proc_root,
                          addresses={"ib0": ["10.0.0.5"], "eth0": ["192.168.0.5"]})
    cands = rank_candidates(ifs, env={})
    assert cands[0].ifname == "ib0"
    assert cands[0].reason == "IPoIB (ARPHRD 32), default route"
    assert cands[1].ifname == "eth0" and cands[1].reason == "up, with an IPv4 address"


def test_admin_down_flag_is_down(tmp_path):
    sys_root, proc_root = make_tree(
        tmp_path, {"ib0": (32, "unknown", "0x1002"), "eth0": (1, "unknown", "0x1003")}, [])
    ifs = list_interfaces(sys_root, proc_root,
                          addresses={"ib0": ["10.0.0.5"], "eth0": ["192.168.0.5"]})
    assert [c.ifname for c in rank_candidates(ifs, env={})] == ["eth0"]


# ----------------------------------------------------------------- explicit


def test_env_ifname_by_name(ifs):
    cands = rank_candidates(ifs, env={"HPCMESH_IFNAME": "eth0"})
    assert [(c.ifname, c.address, c.rank) for c in cands] == [("eth0", "192.168.1.10", 0)]
    assert cands[0].reason == "HPCMESH_IFNAME=eth0"


def test_env_ifname_list_keeps_user_order(ifs):
    cands = rank_candidates(ifs, env={"HPCMESH_IFNAME": "eth3, hsn0"})
    assert [c.ifname for c in cands] == ["eth3", "hsn0"]
    assert [c.rank for c in cands] == [0, 1]


def test_env_ifname_glob(ifs):
    cands = rank_candidates(ifs, env={"HPCMESH_IFNAME": "eth*"})
    # eth1 is down and eth2 is link-local only: skipped, the rest kept
    assert [c.ifname for c in cands] == ["eth0", "eth3"]


def test_env_ifname_cidr(ifs):
    cands = rank_candidates(ifs, env={"HPCMESH_IFNAME": "10.77.0.0/24"})
    assert [(c.ifname, c.address) for c in cands] == [("ib0", "10.77.0.5")]
    assert cands[0].reason == "HPCMESH_IFNAME=10.77.0.0/24"


def test_argument_wins_over_env_and_names_config(ifs):
    cands = rank_candidates(ifs, "10.0.0.0/8", env={"HPCMESH_IFNAME": "eth0"})
    assert [c.address for c in cands] == ["10.77.0.5", "10.100.0.5"]
    assert cands[0].reason == "CIDR 10.0.0.0/8 from config"
    c = usable_candidates(ifs, "hsn0", env={})[0]
    assert c.reason == "ifname=hsn0 from config"


def test_explicit_loopback_is_honoured(ifs):
    c = usable_candidates(ifs, env={"HPCMESH_IFNAME": "lo"})[0]
    assert (c.ifname, c.address) == ("lo", "127.0.0.1")


def test_explicit_ipv6_only_interface(tmp_path):
    sys_root, proc_root = make_tree(tmp_path, {"eth0": (1, "up")}, [])
    ifs = list_interfaces(sys_root, proc_root, addresses={"eth0": ["fe80::1", "fd00::7"]})
    c = usable_candidates(ifs, "eth0", env={})[0]
    assert c.address == "fd00::7" and c.is_ipv6
    assert c.url(5) == "tcp://[fd00::7]:5"


@pytest.mark.parametrize("value, fragment", [
    ("ib9", "no interface named 'ib9'"),
    ("eth1", "eth1 is down"),
    ("eth2", "eth2 has only link-local addresses"),
    ("10.99.0.0/16", "no address inside 10.99.0.0/16"),
    ("192.168.2.0/24", "eth1 has 192.168.2.10 but is down"),
])
def test_explicit_no_match_errors(ifs, value, fragment):
    with pytest.raises(NoUsableInterfaceError) as exc:
        rank_candidates(ifs, env={"HPCMESH_IFNAME": value})
    msg = str(exc.value)
    assert f"HPCMESH_IFNAME={value} matches no usable interface" in msg
    assert fragment in msg
    # lists what exists, with addresses
    assert "available:" in msg and "ib0 (10.77.0.5" in msg and "eth0 (192.168.1.10" in msg
    assert isinstance(exc.value, RuntimeError)


def test_config_no_match_error_names_config(ifs):
    with pytest.raises(NoUsableInterfaceError, match=r"ifname=ib7 from config matches no"):
        usable_candidates(ifs, "ib7", env={})


def test_empty_env_value_means_automatic(ifs):
    assert usable_candidates(ifs, env={"HPCMESH_IFNAME": "  "})[0].ifname == "ib0"


# ----------------------------------------------------------------- loopback


def test_loopback_last_resort(tmp_path):
    sys_root, proc_root = make_tree(
        tmp_path, {"lo": (772, "unknown"), "docker0": (1, "up"), "wlan0": (1, "down")}, [])
    ifs = list_interfaces(sys_root, proc_root,
                          addresses={"lo": ["127.0.0.1"], "docker0": ["172.17.0.1"],
                                     "wlan0": ["192.168.0.3"]})
    cands = rank_candidates(ifs, env={})
    assert [(c.ifname, c.address, c.reason) for c in cands] == [
        ("lo", "127.0.0.1", "loopback (no other interface)")]
    assert rank_candidates(ifs, env={}, allow_loopback=False) == []
    with pytest.raises(NoUsableInterfaceError, match="no usable network interface"):
        usable_candidates(ifs, env={}, allow_loopback=False)


def test_loopback_fallback_without_any_interface():
    c = usable_candidates([], env={})[0]
    assert (c.ifname, c.address) == ("lo", "127.0.0.1")
    assert "lo" in describe([c], [])


def test_loopback_not_used_when_anything_else_exists(ifs):
    assert all(c.ifname != "lo" for c in rank_candidates(ifs, env={}))


# ----------------------------------------------------------------- env export


def test_socket_ifname_env_sets_and_adds_hca(tree, ifs):
    sys_root, _ = tree
    c = usable_candidates(ifs, env={})[0]
    out = socket_ifname_env(c, {}, sysfs_root=sys_root)
    assert out == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0",
                   "NCCL_IB_HCA": "mlx5_0"}


def test_socket_ifname_env_keeps_user_values(tree):
    sys_root, _ = tree
    user = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_1"}
    out = socket_ifname_env("ib0", user, sysfs_root=sys_root)
    assert out == {"GLOO_SOCKET_IFNAME": "ib0"}
    # even an empty user value is the user's choice
    out = socket_ifname_env("ib0", {"GLOO_SOCKET_IFNAME": ""}, sysfs_root=sys_root)
    assert "GLOO_SOCKET_IFNAME" not in out and out["NCCL_SOCKET_IFNAME"] == "ib0"


def test_socket_ifname_env_without_infiniband(tmp_path):
    sys_root, _ = make_tree(tmp_path, {"eth0": (1, "up")}, [])
    out = socket_ifname_env("eth0", {}, sysfs_root=sys_root)
    assert out == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


def test_socket_ifname_env_hca_without_port_info_and_down_ports(tmp_path):
    sys_root, _ = make_tree(tmp_path, {"ib0": (32, "up")}, [],
                            hcas={"mlx5_1": ["1: DOWN"], "mlx5_0": ["4: ACTIVE", "1: DOWN"]})
    (sys_root / "class" / "infiniband" / "mlx5_2").mkdir()  # no ports dir
    out = socket_ifname_env("ib0", {}, sysfs_root=sys_root)
    assert out["NCCL_IB_HCA"] == "mlx5_0,mlx5_2"


def test_socket_ifname_env_accepts_interface_info(ifs, tree):
    info = by_name(ifs)["hsn0"]
    assert socket_ifname_env(info, {}, sysfs_root=tree[0])["NCCL_SOCKET_IFNAME"] == "hsn0"


# ----------------------------------------------------------------- describe


def test_describe_table(ifs):
    cands = rank_candidates(ifs, env={})
    text = describe(cands, ifs)
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:]}
    assert text.splitlines()[0].split() == ["INTERFACE", "TYPE", "STATE", "KIND",
                                            "ADDRESSES", "CHOICE"]
    assert "chosen #0: IPoIB (ARPHRD 32)" in lines["ib0"]
    assert "advertised #1" in lines["hsn0"]
    assert "advertised #2: default route" in lines["eth0"]
    assert "skipped: loopback" in lines["lo"]
    assert "skipped: container/virtual bridge" in lines["docker0"]
    assert "skipped: operstate down" in lines["eth1"]
    assert "skipped: link-local address only" in lines["eth2"]
    assert "192.168.1.10, fd00::10" in lines["eth0"]


def test_describe_explicit_choice_marks_others(ifs):
    cands = rank_candidates(ifs, env={"HPCMESH_IFNAME": "eth0"})
    text = describe(cands, ifs)
    ib_line = next(ln for ln in text.splitlines() if ln.startswith("ib0"))
    assert "skipped: not selected (explicit choice)" in ib_line


# ----------------------------------------------------------------- parsing details


def test_default_route_parsing_ignores_non_default_and_down(tmp_path):
    sys_root, proc_root = make_tree(tmp_path, {"eth0": (1, "up"), "eth1": (1, "up")}, [
        ("eth1", "10.0.0.0", "0.0.0.0", "255.0.0.0"),
    ])
    route = proc_root / "net" / "route"
    # a default route whose RTF_UP flag is clear does not count
    route.write_text(route.read_text() + "eth0\t00000000\t0100A8C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n")
    ifs = list_interfaces(sys_root, proc_root, addresses={})
    assert not any(i.is_default_route for i in ifs)


def test_missing_sysfs_gives_no_interfaces(tmp_path):
    assert list_interfaces(tmp_path / "nosys", tmp_path / "noproc", addresses={}) == []


def test_never_uses_hostname_resolution(monkeypatch, ifs):
    def boom(*a, **k):
        raise AssertionError("hostname resolution must not be used")
    monkeypatch.setattr(socket, "gethostbyname", boom)
    monkeypatch.setattr(socket, "getaddrinfo", boom)
    monkeypatch.setattr(socket, "gethostname", boom)
    assert usable_candidates(ifs, env={})[0].address == "10.77.0.5"


# ----------------------------------------------------------------- live system


def test_smoke_real_system():
    ifs = list_interfaces()
    cands = rank_candidates(ifs, env={})
    assert cands, describe(cands, ifs)
    assert all(isinstance(c, Candidate) for c in cands)
    assert "127.0.1.1" not in [c.address for c in cands]
    text = describe(cands, ifs)
    assert cands[0].ifname in text
    c = usable_candidates(env={})[0]
    assert c.address == cands[0].address
    assert netif.socket_ifname_env(c, {"NCCL_SOCKET_IFNAME": "x"}).get(
        "NCCL_SOCKET_IFNAME") is None
