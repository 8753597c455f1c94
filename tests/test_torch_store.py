"""``runtime/torch_store.tcp_store``, the one place a torch TCPStore is made: in-process, on
localhost, fast."""

import time
from datetime import timedelta

import pytest

pytest.importorskip("torch.distributed")

from hpcmesh.runtime.torch_store import tcp_store  # noqa: E402


def test_master_on_any_port_and_a_member_meet():
    master = tcp_store("127.0.0.1", 0, master=True, world_size=2)
    member = tcp_store("127.0.0.1", master.port, master=False, world_size=2)
    member.set("k", "v")
    assert master.get("k") == b"v"


def test_the_wait_is_the_collective_timeout(monkeypatch):
    monkeypatch.setenv("HPCMESH_COLLECTIVE_TIMEOUT", "7")
    master = tcp_store("127.0.0.1", 0, master=True)
    assert master.timeout == timedelta(seconds=7)
    assert tcp_store("127.0.0.1", master.port, master=False).timeout == timedelta(seconds=7)
    own = tcp_store("127.0.0.1", master.port, master=False, timeout=timedelta(seconds=0.3))
    start = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|wait"):
        own.get("never set")                # a member left waiting gives up at its timeout
    assert time.monotonic() - start < 5


def test_a_mistyped_timeout_names_the_setting(monkeypatch):
    monkeypatch.setenv("HPCMESH_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HPCMESH_COLLECTIVE_TIMEOUT"):
        tcp_store("127.0.0.1", 0, master=True)
