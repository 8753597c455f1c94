"""Every hand-written fast path against its general path.

The hot paths write a few general functions out inline (a Python call is a few per cent
of a pipelined call). Each such copy carries a ``twin of NAME()`` comment; this file has a
check per NAME that runs both paths on the same input (two nodes on the memory backend:
real frames, no socket) and holds their results equal, so a change to one that is not
made to the other fails here rather than in production.
"""

from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import re
import uuid

import pytest

from hpcmesh.actor import endpoint
from hpcmesh.runtime import messages
from hpcmesh.runtime.actor_services import ActorServices
from hpcmesh.runtime.future import gather
from hpcmesh.runtime.messages import PortRef, call_msg, decode_args
from hpcmesh.runtime.node import Node
from hpcmesh.shapes import Extent, Point
from hpcmesh.transport import serialization

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hpcmesh"
SECRET = os.urandom(32)
CHECKED = {"call_msg", "deliver_msg", "decode_args", "_note_sent"}


def test_every_twin_in_the_library_has_a_check_here():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if m := re.search(r"#\s*twin of (\w+)\(\)", line):
                found[m.group(1)] = f"{path.relative_to(PACKAGE.parent)}:{n}"
    assert set(found) == CHECKED, (
        f"twins in the library: {found}; checked here: {sorted(CHECKED)}. A new written-out "
        f"copy of a general path needs a check in tests/test_twins.py")


class Capture:
    """Stands in for an actor: records the call messages a node dispatches to it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def handle_call(self, msg, origin, buffers):
        self.calls.append((msg, origin))


@pytest.fixture
def pair():
    tag = uuid.uuid4().hex[:8]
    a = Node.start_in_thread(SECRET, role="test", name="a", listen=[f"memory://ta-{tag}"])
    b = Node.start_in_thread(SECRET, role="test", name="b", listen=[f"memory://tb-{tag}"])
    b.services["ping"] = lambda: "pong"
    assert a.rpc(b.ref, "ping").get(timeout=10) == "pong"      # connected both ways now
    try:
        yield a, b
    finally:
        a.shutdown_thread()
        b.shutdown_thread()


@pytest.mark.parametrize("payload", [((1, "x", (2.5, None)), {}),
                                     (([1, 2], {"k": b"v"}), {})],   # pickled whole: the else
                         ids=["frozen", "mutable"])
def test_call_actor_sends_what_call_msg_builds(pair, payload, monkeypatch):
    a, b = pair
    cap = b.actors["cap"] = Capture()
    sent_general = []
    general_send = a.send
    monkeypatch.setattr(a, "send", lambda *x, **k: sent_general.append(x) or general_send(*x, **k))
    a.call_actor(b.ref, "cap", "ep", payload, 3, (("gpus", 2),))
    assert not sent_general, "call_actor took its general path: the fast path is not checked"
    fut, pid = a.reply_future(b.ref)
    general_send(b.ref, call_msg("cap", "ep", payload, pid, 3, (("gpus", 2),)), buffers=[])
    _wait_for(b, lambda: len(cap.calls) == 2)
    (fast, o1), (general, o2) = cap.calls
    assert o1 == o2 == a.node_id
    assert fast[:4] + fast[5:] == general[:4] + general[5:]
    assert type(fast[4]) is type(general[4]) is int


@pytest.mark.parametrize("value", [7, "text", (1, (2.0, "b"), None), b"bytes", frozenset({1}),
                                   [1, 2], {"a": 1}], ids=repr)
def test_reply_to_delivers_what_send_value_delivers(pair, value):
    """reply_to's fast path (an immutable value queued whole) and its encode_result path,
    against send_value (the general path), for the same value."""
    a, b = pair
    fast, pid_fast = a.reply_future(b.ref)
    general, pid_general = a.reply_future(b.ref)
    b.call_soon(b.reply_to, a.node_id, pid_fast, value)
    b.call_soon(b.send_value, PortRef(a.ref, pid_general), value)
    got_fast, got_general = fast.get(timeout=10), general.get(timeout=10)
    assert got_fast == got_general == value
    assert type(got_fast) is type(got_general)


class Args:
    @endpoint
    async def seen(self, *args, **kwargs):
        await asyncio.sleep(0)
        return args, kwargs


def test_the_mailbox_decodes_what_decode_args_decodes(pair):
    """Pipelined calls to an async endpoint run from its mailbox, which decodes inline."""
    a, b = pair
    ActorServices.attach(b)
    a.rpc(b.ref, "spawn_actor", "args", "m", serialization.dumps_by_value(Args), (), {},
          Point(0, Extent({"gpus": 1})), None, None).get(timeout=10)
    inline = ((1, "two", (3,)), {})
    pickled, bufs = serialization.dumps(((bytearray(b"x" * 100_000), [4]), {"k": {5}}))
    futs = []
    for _ in range(50):             # pipelined: they queue in the mailbox behind each other
        futs.append(a.call_actor(b.ref, "args", "seen", inline, 0, ()))
        fut, pid = a.reply_future(b.ref)
        a.send(b.ref, call_msg("args", "seen", pickled, pid, 0, ()), buffers=list(bufs))
        futs.append(fut)
    got = gather(futs).get(timeout=30)
    assert got[0] == decode_args(inline, [])
    assert got[1] == decode_args(pickled, list(bufs))
    assert all(g == got[i % 2] for i, g in enumerate(got))


def test_the_mailbox_copy_reads_as_decode_args():
    """The copy is one expression: held to decode_args's own, names and all."""
    source = (PACKAGE / "runtime" / "actor_host.py").read_text()
    copy = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign)
                and ast.unparse(n.targets[0]) == "(args, kwargs)"
                and isinstance(n.value, ast.IfExp))
    fn = next(n for n in ast.parse((PACKAGE / "runtime" / "messages.py").read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == "decode_args")
    general = next(n.value for n in fn.body if isinstance(n, ast.Return))
    assert ast.dump(copy.value) == ast.dump(general)


def test_call_one_notes_its_call_as_note_sent_does():
    from hpcmesh.actor import Actor, this_proc
    from hpcmesh.runtime.observe import telemetry_recorder as tel

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    rec = tel.enable()
    try:
        mesh = this_proc().spawn(f"twins-{uuid.uuid4().hex[:6]}", Echo)
        mesh.echo.call_one(0).get(timeout=30)        # the first: makes the endpoint's row
        calls = rec.sent_log.calls
        mesh.echo.call_one(1).get(timeout=30)
        fast = calls[-1]
        # private: the general path itself, which call_one writes out (its twin)
        mesh.echo._note_sent("call_one", one=True)
        assert calls[-1] == fast
        assert rec.sent_log.keys[fast] == rec.sent_log.keys[calls[-1]]
    finally:
        tel.disable()


def _wait_for(node: Node, done, timeout: float = 10.0) -> None:
    """Wait until ``done()`` holds, checked on the node's loop (no fixed sleep)."""
    async def poll():
        while not done():
            await asyncio.sleep(0.001)
    node.run_sync(asyncio.wait_for(poll(), timeout))


def test_messages_module_still_builds_the_tuples_the_copies_write():
    """The general builders' layouts, as the copies write them (a field added to one
    builder must be added to its copy: the checks above then fail until it is)."""
    assert messages.call_msg("a", "e", (), 1, 2, ()) == (messages.MSG_CALL, "a", "e", (), 1, 2, ())
    assert messages.deliver_msg(5, "v") == (messages.MSG_DELIVER, 5, "v")
