"""The in-memory transport backend (``memory://``): real frames, real handshake, real
``Connection``, no socket. Two nodes in this process, so dispatch, ordering and replies
are tested in milliseconds."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from hpcmesh.actor import endpoint
from hpcmesh.runtime.actor_services import ActorServices
from hpcmesh.runtime.errors import SupervisionError
from hpcmesh.runtime.future import gather
from hpcmesh.runtime.node import MSG_DELIVER, Node
from hpcmesh.shapes import Extent, Point
from hpcmesh.transport import memory, serialization
from hpcmesh.transport.addresses import parse_address
from hpcmesh.transport.handshake import HandshakeError

SECRET = os.urandom(32)


class Echo:
    def __init__(self):
        self.seen = []

    @endpoint
    def echo(self, i):
        self.seen.append(i)
        return i

    @endpoint
    def order(self):
        return list(self.seen)

    @endpoint
    def size(self, blob):
        return len(blob)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def pair():
    """Two nodes on memory:// addresses, each on its own loop thread (as a controller and an
    actor process would be), with an Echo actor on the second."""
    tag = uuid.uuid4().hex[:8]
    a = Node.start_in_thread(SECRET, role="test", name="a", listen=[f"memory://a-{tag}"])
    b = Node.start_in_thread(SECRET, role="test", name="b", listen=[f"memory://b-{tag}"])
    ActorServices.attach(b)
    actor_id = uuid.uuid4().hex
    a.rpc(b.ref, "spawn_actor", actor_id, "echo", serialization.dumps_by_value(Echo), (), {},
          Point(0, Extent({"gpus": 1})), None, None).get(timeout=10)
    try:
        yield a, b, actor_id
    finally:
        a.shutdown_thread()
        b.shutdown_thread()


def test_memory_addresses_parse_and_print():
    assert str(parse_address("memory://x-1")) == "memory://x-1"
    with pytest.raises(ValueError, match="memory://name"):
        parse_address("memory:///path")


def test_a_thousand_calls_with_no_socket_in_well_under_a_second(pair):
    a, b, actor_id = pair
    a.call_actor(b.ref, actor_id, "echo", ((-1,), {}), 0, ()).get(timeout=10)   # warm
    fds = _open_fds()
    t0 = time.perf_counter()
    futs = [a.call_actor(b.ref, actor_id, "echo", ((i,), {}), 0, ()) for i in range(1000)]
    values = gather(futs).get(timeout=10)
    elapsed = time.perf_counter() - t0
    assert values == list(range(1000))
    # delivered in send order (one sender, one actor), whatever batching the frames took
    assert a.call_actor(b.ref, actor_id, "order", ((), {}), 0, ()).get(timeout=10) == \
        [-1, *range(1000)]
    assert elapsed < 1.0, f"1,000 calls took {elapsed:.2f} s"
    assert _open_fds() <= fds, "the memory backend opened a file descriptor"
    assert a.peers.get(b.node_id).conn.sock.__class__ is memory.MemoryStream


def test_a_message_bigger_than_the_inbox_goes_through_back_pressure(pair):
    """A 3-inbox payload: partial sends, the writer waiting for room, the reader draining."""
    a, b, actor_id = pair
    blob = os.urandom(3 * memory.INBOX_BYTES + 12345)
    assert a.call_actor(b.ref, actor_id, "size", ((bytearray(blob),), {}), 0, ()).get(
        timeout=20) == len(blob)


def test_a_wrong_secret_is_refused_by_the_handshake():
    tag = uuid.uuid4().hex[:8]
    a = Node.start_in_thread(SECRET, role="test", name="a", listen=[f"memory://a-{tag}"])
    c = Node.start_in_thread(os.urandom(32), role="test", name="c")
    try:
        with pytest.raises(HandshakeError, match="does not hold this job's secret"):
            c.run_sync(c.connect(f"memory://a-{tag}"), timeout=10)
        with pytest.raises(ConnectionRefusedError, match="nothing listens"):
            c.run_sync(c.connect(f"memory://nobody-{tag}"), timeout=10)
    finally:
        a.shutdown_thread()
        c.shutdown_thread()


def test_a_second_listener_on_the_same_name_is_refused():
    tag = uuid.uuid4().hex[:8]
    a = Node.start_in_thread(SECRET, role="test", name="a", listen=[f"memory://a-{tag}"])
    try:
        with pytest.raises(OSError, match="already listened on"):
            Node.start_in_thread(SECRET, role="test", name="a2", listen=[f"memory://a-{tag}"])
    finally:
        a.shutdown_thread()
    # closed: the name is free again
    again = Node.start_in_thread(SECRET, role="test", name="a3", listen=[f"memory://a-{tag}"])
    again.shutdown_thread()


def test_losing_the_peer_fails_its_pending_reply(pair):
    a, b, actor_id = pair
    fut, port_id = a.reply_future(b.ref)     # a reply b will never send
    a.send(b.ref, (MSG_DELIVER, b.open_port(lambda v: None).port_id, "hello"))
    b.shutdown_thread()                      # closes its end: a sees the stream end
    with pytest.raises(SupervisionError, match="lost"):
        fut.get(timeout=10)
    assert not a.peer_connected(b.node_id)
