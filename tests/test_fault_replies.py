"""Results that cannot travel fail their own call, nothing else (real processes).

An endpoint's result that does not unpickle on the caller, does not pickle at all, has
more out-of-band buffers than a frame carries, or an exception whose ``__str__`` raises:
each fails that one call with an error that says what could not be sent, and the actor,
its process and the connection go on serving.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from hpcmesh.actor import Actor, ActorError, SupervisionError, endpoint, this_host
from hpcmesh.transport.framing import MAX_BUFFERS
from hpcmesh.transport.serialization import SerializationError


class TwoArgError(Exception):
    """Pickles (as TwoArgError(message)) but cannot unpickle: __init__ needs two."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


class Awkward(Actor):
    def __init__(self):
        self.n = 0

    @endpoint
    async def count(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    async def slow(self, seconds: float) -> str:
        import asyncio
        await asyncio.sleep(seconds)    # sleep: the endpoint's work is to take this long
        return "slow done"

    @endpoint
    async def unreadable(self):
        return TwoArgError("a", "b")          # a value, not raised

    @endpoint
    def unreadable_sync(self):
        return [TwoArgError("a", "b")]

    @endpoint
    async def unpicklable(self):
        return threading.Lock()

    @endpoint
    def too_many_buffers(self):
        return [np.zeros(64, dtype=np.uint8) for _ in range(MAX_BUFFERS + 10)]

    @endpoint
    async def raises_bad_str(self):
        raise BadStr()

    @endpoint
    def raises_bad_str_sync(self):
        raise BadStr()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module", params=["processes", "memory"])
def awkward(request):
    """In a real process, and again on a node of this process over the memory backend
    (what travels is the subject: the frames are the same)."""
    if request.param == "memory":
        from memory_procs import memory_proc_mesh
        procs = memory_proc_mesh({"gpus": 1})
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    actor = procs.spawn("awkward", Awkward)
    yield actor
    procs.stop().get(timeout=30)


def test_a_result_the_caller_cannot_unpickle_fails_that_call_only(awkward):
    pid = awkward.pid.call_one().get(timeout=30)
    pending = awkward.slow.call_one(1.0)             # in flight on the same connection
    t0 = time.monotonic()
    with pytest.raises(SerializationError) as ei:
        awkward.unreadable.call_one().get(timeout=30)
    took = time.monotonic() - t0
    msg = str(ei.value)
    assert "cannot be unpickled here" in msg and "TwoArgError" in msg
    assert "missing 1 required positional argument" in msg
    assert took < 5, took
    # the other call on that connection, the actor and its process are unharmed
    assert pending.get(timeout=30) == "slow done"
    assert awkward.count.call_one().get(timeout=30) == 1
    with pytest.raises(TypeError, match="cannot be unpickled here"):
        awkward.unreadable_sync.call_one().get(timeout=30)
    assert awkward.pid.call_one().get(timeout=30) == pid


def test_a_result_that_does_not_pickle_names_the_endpoint(awkward):
    # not an ActorError: the endpoint did not raise; its result cannot travel
    with pytest.raises(SerializationError) as ei:
        awkward.unpicklable.call_one().get(timeout=30)
    msg = str(ei.value)
    assert msg.startswith("Awkward.unpicklable of awkward[0]: the result (lock) could not be "
                          "sent: SerializationError: cannot serialize result"), msg
    assert awkward.count.call_one().get(timeout=30) >= 1


def test_too_many_buffers_for_a_frame_fails_the_call_and_names_the_limit(awkward):
    with pytest.raises(SerializationError) as ei:
        awkward.too_many_buffers.call_one().get(timeout=60)
    msg = str(ei.value)
    assert "Awkward.too_many_buffers" in msg and f"> {MAX_BUFFERS}" in msg and "np.stack" in msg
    # the sync actor is not left busy: its next call runs
    assert awkward.pid.call_one().get(timeout=30) > 0


@pytest.mark.parametrize("name", ["raises_bad_str", "raises_bad_str_sync"])
def test_an_exception_whose_str_raises_still_reaches_the_caller(awkward, name):
    with pytest.raises(ActorError) as ei:
        getattr(awkward, name).call_one().get(timeout=30)
    assert "BadStr" in str(ei.value) and "str() of this BadStr raised RuntimeError" in str(
        ei.value)
    assert awkward.count.call_one().get(timeout=30) >= 1


class Answers(Actor):
    def __init__(self):
        self.lock = threading.Lock()

    @endpoint
    async def the_lock(self):
        return self.lock

    @endpoint
    async def lock_id(self) -> int:
        return id(self.lock)

    @endpoint(explicit_response_port=True)
    async def answer_unreadable(self, port):
        port.send(TwoArgError("x", "y"))

    @endpoint(explicit_response_port=True)
    async def answer(self, port, v):
        port.send(v)

    @endpoint
    async def to_channel(self, port) -> None:
        for v in (1, TwoArgError("x", "y"), 3):     # the middle one cannot be unpickled
            port.send(v)

    @endpoint(explicit_response_port=True)
    async def answer_lock(self, port):
        port.send(self.lock)        # raises here, in the sender: the actor fails


def test_in_process_replies_still_travel_by_reference():
    from hpcmesh.actor import this_proc
    local = this_proc().spawn("answers_local", Answers)
    try:
        lock = local.the_lock.call_one().get(timeout=10)     # unpicklable: never pickled
        assert isinstance(lock, type(threading.Lock()))
        assert id(lock) == local.lock_id.call_one().get(timeout=10)    # the same object
    finally:
        local.stop().get(timeout=10)


def test_a_port_message_the_receiver_cannot_unpickle_fails_that_message_only():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        answers = procs.spawn("answers", Answers)
        with pytest.raises(SerializationError, match="cannot be unpickled here.*TwoArgError"):
            answers.answer_unreadable.call_one().get(timeout=30)
        assert answers.answer.call_one(7).get(timeout=30) == 7
        # on a channel: recv() raises for that message (it handed out a Failure object as
        # if it were the value), and the next message comes as usual
        from hpcmesh.actor import Channel
        port, receiver = Channel.open()
        answers.to_channel.call_one(port).get(timeout=30)
        assert receiver.recv().get(timeout=30) == 1
        with pytest.raises(SerializationError, match="cannot be unpickled here.*TwoArgError"):
            receiver.recv().get(timeout=30)
        assert receiver.recv().get(timeout=30) == 3
        # one the sender cannot pickle raises in the endpoint: escaping an endpoint that
        # answers through its port, that fails the actor (as in Monarch), named
        sender = procs.spawn("sender", Answers)
        with pytest.raises(SupervisionError, match="port message.*cannot pickle '_thread.lock'"):
            sender.answer_lock.call_one().get(timeout=30)
        assert answers.answer.call_one(8).get(timeout=30) == 8
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.parametrize("ca, words", [
    ("/nonexistent/ca.pem", "no such file"),
    ("NOTPEM", "cannot load the CA bundle"),
])
def test_a_bad_tls_setting_reaches_the_caller_instead_of_hanging(tmp_path, ca, words):
    # the runtime thread raised before it was ready, and the caller waited for ever
    import subprocess
    import sys
    if ca == "NOTPEM":
        ca = str(tmp_path / "not.pem")
        open(ca, "w").write("not a certificate\n")
    script = ("from hpcmesh.actor import this_host\n"
              "this_host().spawn_procs(per_host={'gpus': 1})\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, HPCMESH_TLS_CA=ca))
    assert time.monotonic() - t0 < 30
    assert r.returncode == 1 and "TLSConfigError" in r.stderr and words in r.stderr, r.stderr


def test_future_get_timeout_forms():
    # -1 used to wait for ever (Lock.acquire's "no limit") and inf raised OverflowError
    import math
    from hpcmesh.runtime.future import Future
    f = Future()
    threading.Timer(0.1, lambda: f.set_result(5)).start()
    assert f.get(timeout=math.inf) == 5
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no result within 0.05 s"):
        Future().get(timeout=0.05)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match=r"Future.get\(timeout=-1\): timeout takes seconds >= 0"):
        Future().get(timeout=-1)
    with pytest.raises(TypeError, match=r"Future.get\(timeout='5'\)"):
        Future().get(timeout="5")


def test_a_string_too_big_for_a_frame_fails_its_call_not_the_connection():
    # a plain str rode the batched path unchecked: the caller's decoder refused the frame
    # (metadata over 256 MiB) and closed the connection, failing every call on it
    from hpcmesh.actor import Actor, endpoint, this_host
    from hpcmesh.runtime.messages import ReplyNotSent

    class Big(Actor):
        @endpoint
        def big(self, n: int) -> str:
            return "x" * n

        @endpoint
        def length(self, s: str) -> int:
            return len(s)

        @endpoint
        def ping(self) -> str:
            return "pong"

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("big", Big)
        with pytest.raises(ReplyNotSent, match=r"over the limit of 268435456 bytes"):
            mesh.big.call_one(257 * 2**20).get(timeout=120)
        assert mesh.ping.call_one().get(timeout=30) == "pong"      # same connection, alive
        with pytest.raises(Exception, match=r"arguments of length could not be sent: .*over "
                                            r"the limit of 268435456 bytes"):
            mesh.length.call_one("y" * (257 * 2**20)).get(timeout=120)
        assert mesh.length.call_one("y" * 2**21).get(timeout=60) == 2**21
    finally:
        procs.stop().get(timeout=30)
