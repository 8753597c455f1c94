"""What a Monarch program cannot show about hpcmesh's ``monarch.actor`` names: generics at
run time, typed signatures, errors, and behaviour a recorded output would not pin down."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import pathlib
import signal
import subprocess
import sys
import typing

import pytest
from proc_helpers import wait_gone

import hpcmesh.actor as ha
from hpcmesh.actor import (Accumulator, Actor, ActorMesh, Channel, Endpoint, Future, Port,
                           PortReceiver, ValueMesh, concurrent_endpoint, endpoint, send,
                           this_host, this_proc)
from hpcmesh.actor.endpoint import EndpointMethod
from hpcmesh.runtime.actor_host import ENDPOINT_ATTR
from hpcmesh.shapes import Extent, Point, Shape

MONARCH_NAMES = pathlib.Path(__file__).parent / "fixtures" / "monarch_0.7.0_actor_names.txt"


class Counter(Actor):
    def __init__(self) -> None:
        self.value = 0

    @endpoint
    def incr(self, by: int) -> int:
        self.value += by
        return self.value

    @endpoint
    async def aincr(self, by: int) -> int:
        self.value += by
        return self.value

    def plain(self) -> int:
        return self.value


# -- 1. generics ------------------------------------------------------------------------
def test_generics_subscript_at_run_time():
    for alias, origin in ((Port[int], Port), (PortReceiver[int], PortReceiver),
                          (Future[int], Future), (ValueMesh[int], ValueMesh),
                          (ActorMesh[Counter], ActorMesh), (Endpoint[[int], int], Endpoint),
                          (Accumulator[[int], int, int], Accumulator), (Channel[int], Channel)):
        assert typing.get_origin(alias) is origin
    assert typing.get_args(Endpoint[[int], str]) == ((int,), str)


def test_type_hints_of_user_code_and_of_the_api_resolve():
    def uses(p: Port[int], r: PortReceiver[int], f: Future[int], v: ValueMesh[int],
             m: ActorMesh[Counter], e: Endpoint[[int], int]) -> Future[ValueMesh[int]]:
        raise AssertionError("only annotated")
    hints = typing.get_type_hints(uses, localns={"Counter": Counter})
    assert hints["e"] == Endpoint[[int], int] and hints["return"] == Future[ValueMesh[int]]
    for fn in (Endpoint.call_one, Endpoint.call, Endpoint.stream, Accumulator.__init__,
               Accumulator.accumulate, Future.get, Future.then, Future.as_asyncio,
               ValueMesh.from_indexed, Channel.open, PortReceiver.recv, ha.ProcMesh.spawn,
               ha.ProcMesh.logging_option, send, ha.returns_future,
               ha.get_or_spawn_controller, EndpointMethod.__get__):
        typing.get_type_hints(fn)        # raises NameError if a name does not resolve


def test_endpoint_is_typed_with_a_paramspec_and_stays_a_plain_function():
    overloads = typing.get_overloads(endpoint)
    assert overloads, "@endpoint needs typed overloads for checkers"
    returns = {typing.get_type_hints(o)["return"] for o in overloads}
    assert any(typing.get_origin(r) is EndpointMethod for r in returns)
    # at run time the runtime finds a plain function, marked (ENDPOINT_ATTR)
    fn = Counter.__dict__["incr"]
    assert inspect.isfunction(fn) and getattr(fn, ENDPOINT_ATTR).name == "incr"
    assert Counter.incr is fn
    # a checker sees spawn() return the actor class (so mesh.incr is Endpoint[[int], int])
    tactor = typing.get_type_hints(ha.ProcMesh.spawn)["return"]
    assert isinstance(tactor, typing.TypeVar)
    assert typing.get_type_hints(ha.ProcMesh.spawn)["actor_class"] == type[tactor]


def test_actor_is_no_mesh_at_run_time():
    assert not hasattr(Counter(), "slice") and not hasattr(Counter(), "extent")


# -- 2. names ---------------------------------------------------------------------------
def test_monarch_public_names_are_here():
    """Every public name of Monarch 0.7.0's monarch.actor, except those left out on
    purpose (see tests/monarch_programs/README.md)."""
    left_out = {"ChannelTransport", "ProcId", "Uid", "debug_controller",
                "enable_transport", "get_meter", "span", "traced", "start_worker_loop_forever",
                "attach"}
    # recorded from torchmonarch 0.7.0 (``dir(monarch.actor)``), so CI needs no Monarch
    monarch_names = set(MONARCH_NAMES.read_text().split())
    assert len(monarch_names) > 30
    missing = sorted(monarch_names - left_out - set(dir(ha)))
    assert missing == []


def test_concurrent_module_and_decorator():
    from hpcmesh.actor.concurrent import concurrent_endpoint as again
    assert again is concurrent_endpoint

    class C(Actor):
        @concurrent_endpoint
        async def a(self) -> int:
            return 1

        @concurrent_endpoint(explicit_response_port=True)
        async def b(self, port) -> None:
            port.send(2)
    assert getattr(C.a, ENDPOINT_ATTR).concurrent and getattr(C.b, ENDPOINT_ATTR).concurrent
    with pytest.raises(ValueError, match="^concurrent_endpoint can only wrap async endpoints "
                                         "\\(.*lambda.* is a plain def"):
        concurrent_endpoint(lambda self: 1)


def test_concurrent_endpoint_over_endpoint_is_refused_with_monarchs_words():
    """Monarch's ValueError: options go to @concurrent_endpoint itself (issue 32 item 7)."""
    for options in ({}, {"explicit_response_port": True}):
        with pytest.raises(ValueError, match="^concurrent_endpoint does not wrap @endpoint; "
                                             "pass endpoint options to @concurrent_endpoint "
                                             "\\(.*work is an @endpoint already"):
            class Twice(Actor):
                @concurrent_endpoint(**options)
                @endpoint
                async def work(self) -> int:
                    return 1


def test_mixing_sync_and_async_endpoints_warns_once_per_class():
    """Monarch refuses such a class at spawn; hpcmesh runs it (its sync endpoints on the
    actor's thread) and says so once per class, in a category one can silence."""
    import warnings
    from hpcmesh.actor import MonarchDifferenceWarning

    class Mixed(Actor):
        @endpoint
        def plain(self) -> str:
            return "def"

        @endpoint
        async def coro(self) -> str:
            return "async def"

    class AllAsync(Actor):
        @endpoint
        async def coro(self) -> str:
            return "async def"

    procs = this_proc()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = procs.spawn("mixed_once", Mixed)
        second = procs.spawn("mixed_twice", Mixed)
        alone = procs.spawn("all_async", AllAsync)
    try:
        mixed = [w for w in caught if issubclass(w.category, MonarchDifferenceWarning)]
        assert len(mixed) == 1, [str(w.message) for w in caught]
        text = str(mixed[0].message)
        assert text.startswith(f"{Mixed} mixes both async and sync endpoints (sync: ['plain'] "
                               f"async: ['coro'])") and "Monarch refuses" in text
        assert mixed[0].filename == __file__          # points at the spawn() call
        assert (first.plain.call_one().get(timeout=30), second.coro.call_one().get(timeout=30),
                alone.coro.call_one().get(timeout=30)) == ("def", "async def", "async def")
    finally:
        for m in (first, second, alone):
            m.stop().get(timeout=30)


def test_hooks_of_the_other_kind_are_named_as_monarch_names_them():
    """Monarch also refuses a hook that is not of its endpoints' kind."""
    from hpcmesh.actor.endpoint import monarch_refusal

    def coro():         # a fresh function each time: @endpoint marks the one it gets
        async def f(self, *args) -> None: ...
        return f

    def plain():
        def f(self, *args) -> None: ...
        return f

    def probe(endpoint_fn, **hooks) -> type:
        return type("Probe", (Actor,), {"a": endpoint(endpoint_fn()),
                                        **{h: fn() for h, fn in hooks.items()}})
    for cls, words in [
            (probe(plain, __cleanup__=coro), "has sync endpoints, but an async __cleanup__ "
                                             "(sync: ['a'])"),
            (probe(coro, __cleanup__=plain), "has async endpoints, but a synchronous "
                                             "__cleanup__ (async: ['a'])"),
            (probe(plain, __supervise__=coro), "has sync endpoints, but an async "
                                               "__supervise__ (sync: ['a'])")]:
        assert monarch_refusal(cls) == f"{cls} {words}"
    assert monarch_refusal(probe(plain, __cleanup__=plain, __supervise__=plain)) is None
    assert monarch_refusal(probe(coro, __cleanup__=coro)) is None
    assert monarch_refusal(Actor) is None


def test_send_checks_its_arguments():
    with pytest.raises(TypeError, match="endpoint of an actor mesh"):
        send(print, (), {})
    mesh = this_proc().spawn("send_args", Counter)
    try:
        with pytest.raises(ValueError, match="'all' or 'choose'"):
            send(mesh.incr, (1,), {}, selection="some")
        with pytest.raises(TypeError, match="takes a Port"):
            send(mesh.incr, (1,), {}, port=object())
        port, receiver = Channel.open()
        send(mesh.incr, (1,), {}, port=port)
        assert receiver.recv().get(timeout=30) == 1
    finally:
        mesh.stop().get(timeout=30)


def test_actor_logger():
    c = Counter()
    assert c.logger is c.logger and c.logger.name == "Counter"
    assert c.logger.level == logging.DEBUG


def test_value_mesh_from_indexed():
    ext = Extent({"a": 2, "b": 2})
    v = ValueMesh.from_indexed(Shape.from_extent(ext), [(3, "d"), (0, "a"), (2, "c"), (1, "b"),
                                                         (0, "A")])
    assert v.values() == ["A", "b", "c", "d"] and v.item(a=1, b=0) == "c"
    assert ValueMesh.from_indexed(ext, enumerate("wxyz")).values() == list("wxyz")
    with pytest.raises(ValueError, match=r"no value for \[1, 2, 3\]"):
        ValueMesh.from_indexed(ext, [(0, "a")])
    with pytest.raises(ValueError, match="rank 4 is not a rank"):
        ValueMesh.from_indexed(ext, [(4, "x")])


def test_future_as_asyncio():
    f: Future[int] = Future()

    async def main():
        af = f.as_asyncio()
        assert isinstance(af, asyncio.Future) and not af.done()
        f.set_result(5)
        return await asyncio.wait_for(af, 5)
    assert asyncio.run(main()) == 5
    with pytest.raises(RuntimeError):
        Future().as_asyncio()


def test_returns_future_runs_once_where_observed():
    runs = []

    @ha.returns_future
    async def body(x: int) -> int:
        runs.append(x)
        await asyncio.sleep(0)
        return x * 2

    f = body(1)
    assert runs == []                          # calling starts nothing
    assert f.get(timeout=10) == 2 and f.get() == 2 and runs == [1]

    async def main():
        return await body(3), body(4).get(timeout=10)   # get() inside a loop: a helper
    assert asyncio.run(main()) == (6, 8)
    assert body(5).then(lambda v: v + 1).get(timeout=10) == 11
    with pytest.raises(TypeError, match="needs an async def"):
        ha.returns_future(lambda: 1)


def test_point_prints_as_monarch():
    assert str(Point(5, {"hosts": 2, "gpus": 4})) == "{'hosts': 1/2, 'gpus': 1/4}"


def test_logging_option_checks_and_sets_the_level():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with pytest.raises(ValueError, match="needs stream_to_client=True"):
            asyncio.run(procs.logging_option(aggregate_window_sec=3))
        with pytest.raises(ValueError, match="a logging level"):
            asyncio.run(procs.logging_option(level=-1))

        class Level(Actor):
            @endpoint
            def level(self) -> int:
                return logging.getLogger().level
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=1,
                                         level=logging.ERROR))
        assert procs.spawn("level", Level).level.call_one().get(timeout=30) == logging.ERROR
        assert all(r.forward_logs for r in procs.records)
        asyncio.run(procs.logging_option())
        assert not any(r.forward_logs for r in procs.records)
    finally:
        procs.stop().get(timeout=30)


def test_host_mesh_stop_and_initialized():
    host = this_host()
    assert host.initialized.get(timeout=5) is True
    procs = host.spawn_procs(per_host={"gpus": 2})
    pids = procs.spawn("c", Counter).incr.call(1).get(timeout=30)
    assert list(pids.values()) == [1, 1]
    host.stop().get(timeout=30)
    assert all(r.stopping for r in procs.records)


class AsksForAController(Actor):
    @endpoint
    async def ask(self, name: str) -> int:
        registry = await ha.get_or_spawn_controller(name, Counter)
        return await registry.incr.call_one(1)


def test_a_controller_asked_for_by_an_actor_outlives_it():
    # the singleton is the controller's: the actor that asked first does not own it, so
    # stopping that actor (which stops what it owns) leaves it to the others
    asker = ha.this_proc().spawn("asker", AsksForAController)
    assert asker.ask.call_one("shared_registry").get(timeout=30) == 1
    asker.stop().get(timeout=30)
    registry = ha.get_or_spawn_controller("shared_registry", Counter).get(timeout=30)
    assert registry.incr.call_one(1).get(timeout=30) == 2


def test_host_mesh_stop_stops_what_was_spawned_through_it():
    # every this_host() is the one host mesh of this client; a pickled copy owns nothing
    import pickle
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        procs.spawn("c", Counter).incr.call(1).get(timeout=30)
        copy = pickle.loads(pickle.dumps(this_host()))
        copy.stop().get(timeout=30)
        assert not any(r.stopping for r in procs.records)
        with pytest.raises(RuntimeError, match="only the HostMesh .* may shut them down"):
            copy.shutdown()
        this_host().stop().get(timeout=30)
        assert all(r.stopping for r in procs.records)
    finally:
        procs.stop().get(timeout=30)


def test_shutdown_context_in_a_fresh_process(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(
        "from hpcmesh.actor import shutdown_context, this_host, Actor, endpoint\n"
        "import hpcmesh.runtime.client as c\n"
        "print(shutdown_context().get())\n"          # no client yet: nothing to do
        "class A(Actor):\n"
        "    @endpoint\n"
        "    def one(self): return 1\n"
        "procs = this_host().spawn_procs(per_host={'gpus': 1})\n"
        "print(procs.spawn('a', A).one.call_one().get(timeout=30))\n"
        "print(shutdown_context(host_timeout=5).get(), c.existing_client_runtime())\n"
        "print(shutdown_context().get())\n")
    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    run = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n") == ["None", "1", "None None", "None", ""]
    with pytest.raises(ValueError, match="host_timeout"):
        ha.shutdown_context(host_timeout=-1)


def test_run_worker_loop_until_shutdown_takes_forevers_arguments():
    a = inspect.signature(ha.run_worker_loop_forever).parameters
    b = inspect.signature(ha.run_worker_loop_until_shutdown).parameters
    assert list(a) == list(b)


# -- 3. behaviour -----------------------------------------------------------------------
def test_stream_in_async_code_gives_pending_futures_in_arrival_order():
    mesh = this_proc().spawn("stream_async", Counter)
    try:
        async def main():
            futs = list(mesh.aincr.stream(2))
            return [await f for f in futs]
        assert asyncio.run(main()) == [2]
    finally:
        mesh.stop().get(timeout=30)


def test_a_starting_proc_mesh_cannot_be_pickled_on_the_loop_thread():
    from hpcmesh.runtime.client import client_runtime
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        import pickle

        async def on_loop():
            return pickle.dumps(procs)
        if not procs.initialized.done():
            with pytest.raises(RuntimeError, match="await procs.initialized"):
                client_runtime().node.run_sync(on_loop(), 10)
        procs.initialized.get(timeout=30)
        copy = pickle.loads(pickle.dumps(procs))
        assert copy.extent == procs.extent and copy.initialized.done()
    finally:
        procs.stop().get(timeout=30)


class Plainly(Actor):
    def __init__(self, abort_in_init: bool = False) -> None:
        self.value = 0
        if abort_in_init:
            ha.context().actor_instance.abort("from __init__")

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def aplain(self, by: int) -> int:
        await asyncio.sleep(0)
        self.value += by
        return self.value

    async def answer(self, port: Port[int], x: int) -> None:
        port.send(x + 1)

    async def quit_then_wait(self, reason: str) -> str:
        ha.context().actor_instance.abort(reason)
        await asyncio.sleep(0.2)    # sleep: suspends with the abort pending
        return "answered"

    @endpoint(concurrent=True)
    async def concurrent_quit(self) -> str:
        ha.context().actor_instance.abort("concurrently")
        return "answered"


def test_as_endpoint_runs_a_plain_async_method_and_survives_pickling():
    import pickle
    mesh = this_proc().spawn("as_endpoint_async", Plainly)
    try:
        assert ha.as_endpoint(mesh.aplain).call_one(2).get(timeout=30) == 2
        assert ha.as_endpoint(mesh.aplain) is ha.as_endpoint(mesh.aplain)   # kept per view
        port_ep = ha.as_endpoint(mesh.answer, explicit_response_port=True)
        assert port_ep.call_one(41).get(timeout=30) == 42
        copy = pickle.loads(pickle.dumps(mesh))       # as an actor receives it
        assert ha.as_endpoint(copy.aplain).call_one(3).get(timeout=30) == 5
        with pytest.raises(RuntimeError, match=r"not an endpoint.*as_endpoint\(mesh.aplain\)"):
            mesh.aplain(1)
        with pytest.raises(AttributeError, match="not an endpoint"):
            mesh.aplain.call_one
        with pytest.raises(ValueError, match="an endpoint already"):
            ha.as_endpoint(mesh.ping)
        with pytest.raises(AttributeError, match="no endpoint 'nothing'"):
            mesh.nothing
        # a name the actor's host refuses: not a function of the class (a cached_property)
        with pytest.raises(ha.ActorError, match="no method 'logger'"):
            ha.as_endpoint(mesh.logger).call_one().get(timeout=30)
        assert mesh.ping.call_one().get(timeout=30) == "pong"
    finally:
        mesh.stop().get(timeout=30)


def test_the_host_takes_a_plain_method_only_through_as_endpoint():
    from hpcmesh.actor.actor_mesh import Endpoint as RawEndpoint
    mesh = this_proc().spawn("plain_by_name", Plainly)
    try:
        with pytest.raises(ha.ActorError, match="not an endpoint of Plainly"):
            RawEndpoint(mesh, "aplain").call_one(1).get(timeout=30)
    finally:
        mesh.stop().get(timeout=30)


def _supervision_reason(fut) -> str:
    with pytest.raises(ha.SupervisionError) as e:
        fut.get(timeout=30)
    assert "and all its descendants have failed" in str(e.value)
    return str(e.value).split("failed: ", 1)[1]


def test_abort_fails_an_async_call_that_awaits_and_the_calls_behind_it():
    mesh = this_proc().spawn("abort_waits", Plainly)
    try:
        # the first call of a fresh actor: it suspends before the mailbox task has run
        quitting = ha.as_endpoint(mesh.quit_then_wait).call_one("bye")
        queued = mesh.ping.call_one()
        assert _supervision_reason(quitting) == "actor explicitly aborted due to: bye"
        assert _supervision_reason(queued) == "actor explicitly aborted due to: bye"
    finally:
        mesh.stop().get(timeout=30)


def test_abort_in_a_concurrent_endpoint_and_in_init():
    mesh = this_proc().spawn("abort_concurrent", Plainly)
    born_aborted = this_proc().spawn("abort_init", Plainly, True)
    try:
        assert mesh.concurrent_quit.call_one().get(timeout=30) == "answered"
        assert _supervision_reason(mesh.ping.call_one()).endswith("concurrently")
        assert _supervision_reason(born_aborted.ping.call_one()).endswith("from __init__")
    finally:
        mesh.stop().get(timeout=30)
        born_aborted.stop().get(timeout=30)


def test_abort_on_the_client_is_refused():
    with pytest.raises(RuntimeError, match="the client is not an actor"):
        ha.context().actor_instance.abort("client")


# -- issue 32 item 12: HostMesh's other names -----------------------------------------------
def test_proc_bind_is_checked_and_wraps_the_command_as_monarch():
    from hpcmesh.actor.host_mesh import bound_command, checked_proc_bind
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host "
                                         r"\(2\)"):
        checked_proc_bind([{"cpus": "0"}], 2)
    with pytest.raises(ValueError, match="has key 'cpu'; the keys are cpus, cpunodebind"):
        checked_proc_bind([{"cpu": "0"}], 1)
    with pytest.raises(ValueError, match="non-empty string"):
        checked_proc_bind([{"cpus": 0}], 1)
    with pytest.raises(TypeError, match="list of dicts"):
        checked_proc_bind({"cpus": "0"}, 1)
    cmd = ha.BootstrapCommand("/py", ["-m", "hpcmesh.runtime.proc"], {"A": "1"})
    assert bound_command(cmd, {}) is cmd
    both = bound_command(cmd, {"membind": "1", "cpus": "2-3", "cpunodebind": "0"})
    assert both.argv() == ["numactl", "--cpunodebind=0", "--membind=1", "taskset", "-c",
                           "2-3", "/py", "-m", "hpcmesh.runtime.proc"]
    assert both.env == {"A": "1"}


def test_a_failing_bootstrap_fails_the_mesh_and_what_is_spawned_on_it():
    def broken() -> None:
        raise OSError("no scratch space")
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=broken)
    try:
        with pytest.raises(Exception, match="no scratch space"):
            procs.spawn("c", Counter).incr.call_one(1).get(timeout=60)
    finally:
        procs.stop().get(timeout=30)
    with pytest.raises(TypeError, match="takes a callable"):
        this_host().spawn_procs(bootstrap="setup.sh")


def test_proc_mesh_of_the_client_is_this_proc():
    pm = ha.context().actor_instance.proc_mesh
    assert isinstance(pm, ha.ProcMesh) and dict(pm.extent) == {}


def test_a_shut_down_host_mesh_refuses_further_use():
    from hpcmesh.job import ProcessJob
    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts

        async def go():
            async with hosts as entered:
                assert entered is hosts and hosts.initialized.get(timeout=5) is True
                async with hosts:
                    pass                # shut down here; the outer exit does not again
        asyncio.run(go())
        for use in (lambda: hosts.spawn_procs(), lambda: hosts.initialized):
            with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
                use()
        assert hosts.stream_logs is True and hosts.is_fake_in_process is False
    finally:
        job.kill()


# -- issue 32 item 4: a pending ActorMesh travels ------------------------------------------
class _Slow(Actor):
    def __init__(self) -> None:
        import time
        time.sleep(1.0)             # sleep: a constructor that takes a while, so the mesh is still starting while it travels

    @endpoint
    def hello(self) -> str:
        return "up"


class _Hop(Actor):
    @endpoint
    async def make_and_pass(self, procs, hop, last) -> list:
        mesh = procs.spawn("slow", _Slow)
        assert not mesh.initialized.done()
        return await hop.pass_on.call_one(mesh, last)

    @endpoint
    async def pass_on(self, mesh, last) -> list:
        if last is not None:            # still pending here: it travels on from this actor
            return await last.pass_on.call_one(mesh, None)
        return sorted((await mesh.hello.call()).values())


def test_a_pending_actor_mesh_travels_on_through_several_actors():
    """A pending mesh re-sent by an actor that got it pending: the last receiver asks the
    one before it, which answers once it has heard from the spawner."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    elsewhere = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        a, b, c = (this_proc().spawn(n, _Hop) for n in ("a", "b", "c"))     # one process
        assert a.make_and_pass.call_one(procs, b, c).get(timeout=60) == ["up", "up"]
        hops = elsewhere.spawn("hops", _Hop)                                # three
        a, b, c = (hops.slice(gpus=i) for i in range(3))
        assert a.make_and_pass.call_one(procs, b, c).get(timeout=60) == ["up", "up"]
    finally:
        procs.stop().get(timeout=30)
        elsewhere.stop().get(timeout=30)


# -- issue 32 item 12 follow-up: proc_mesh costs O(1) per spawned actor -----------------------
def _spawn_payload_sizes(monkeypatch, n: int, listed: bool = False) -> list[int]:
    """The encoded size of each ``spawn_actor`` request a spawn on a mesh of ``n``
    processes sends (to processes that do not exist: the requests are caught here);
    ``listed``: on a view whose shape lists its members (half of them, flattened: not
    evenly spaced)."""
    from hpcmesh.actor.proc_mesh import rebuild_proc_mesh
    from hpcmesh.runtime.client import current_or_client_node
    from hpcmesh.runtime.future import completed
    from hpcmesh.runtime.messages import NodeRef
    from hpcmesh.transport import serialization
    node = current_or_client_node()
    extent = Extent({"hosts": n // 4, "gpus": 4})
    places = []
    for i in range(n):
        proc = NodeRef(f"{i:032x}", (f"tcp://10.0.{i // 250}.{i % 250}:4{i:04d}",))
        agent = NodeRef(f"a{i // 4:031x}", (f"tcp://10.0.{i // 250}.{i % 250}:3000",))
        places.append((f"procs-{i}", "procs", Point(i, extent), agent, str(i), proc,
                       1000 + i, f"node{i // 4}"))
    procs = rebuild_proc_mesh("procs", places, None, Shape.from_extent(extent))
    if listed:
        procs = procs.slice(gpus=slice(0, 2)).flatten("procs")
        n //= 2
    sizes: list[int] = []

    def rpc(target, service, *args):
        if service == "spawn_actor":
            meta, bufs = serialization.dumps(args)         # (a large blob: out of band)
            sizes.append(len(meta) + sum(memoryview(b).nbytes for b in bufs))
            return completed(1234)
        if service == "reserve_rendezvous_port":
            return completed(29500)
        raise AssertionError(f"unexpected service {service}")
    monkeypatch.setattr(node, "rpc", rpc)
    procs.spawn("c", Counter).initialized.get(timeout=10)
    monkeypatch.undo()
    assert len(sizes) == n
    return sizes


def test_the_spawn_request_does_not_grow_with_the_mesh(monkeypatch):
    """Each process's spawn request carries where to ask for the proc mesh, not the mesh:
    with the mesh inside it, one spawn moved n x (235 x n) bytes (16 GB at 1024 x 8)."""
    for listed in (False, True):
        small = max(_spawn_payload_sizes(monkeypatch, 8, listed))
        large = max(_spawn_payload_sizes(monkeypatch, 128, listed))
        assert large <= small + 8, (listed, small, large)   # + 8: larger ranks are longer


class _WhereAmI(Actor):
    """Reads its proc_mesh from a sync endpoint, an async one, and spawns a child that
    reads its own (the spawner then is this actor's process, not the client)."""

    @endpoint
    def sync_pids(self) -> list:
        return ha.context().actor_instance.proc_mesh.pids

    @endpoint
    async def async_pids(self) -> list:
        pm = ha.context().actor_instance.proc_mesh        # at once, on the event loop
        return (await pm.initialized).pids

    @endpoint
    async def first_read_waits(self) -> tuple:
        """On the loop, the first read gives a mesh still waiting for the spawner, whose
        processes are not known yet."""
        pm = ha.context().actor_instance.proc_mesh
        try:
            pm.pids
        except RuntimeError as e:
            return not pm.initialized.done(), str(e)
        return not pm.initialized.done(), "pids known"

    @endpoint
    async def async_spawn_beside(self) -> list:
        """spawn() on a mesh still being asked of the spawner waits for the answer."""
        pm = ha.context().actor_instance.proc_mesh
        beside = pm.spawn("beside", _WhereAmI)
        return sorted((await beside.sync_pids.call()).values())

    @endpoint
    def spawn_child(self, procs) -> list:
        self.child = procs.spawn("child", _WhereAmI)
        return [self.child.sync_pids.call().get(timeout=60),
                self.child.async_pids.call().get(timeout=60)]

    @endpoint
    def keep_child(self, procs) -> ActorMesh:
        self.child = procs.spawn("child", _WhereAmI)
        self.child.initialized.get(timeout=60)
        return self.child


def test_proc_mesh_from_sync_and_async_endpoints_and_from_an_actor_spawned_by_one():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    others = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        pids = procs.initialized.get(timeout=60).pids
        others.initialized.get(timeout=60)
        # each read first (a read keeps what it found)
        where, a, b, c = (procs.spawn(n, _WhereAmI) for n in ("where", "a", "b", "c"))
        assert list(where.sync_pids.call().get(timeout=60).values()) == [pids, pids]
        assert list(a.async_pids.call().get(timeout=60).values()) == [pids, pids]
        assert list(b.async_spawn_beside.call().get(timeout=60).values()) == \
            [sorted([pids, pids])] * 2
        assert list(c.first_read_waits.call().get(timeout=60).values()) == [
            (True, f"proc mesh {procs.name!r} is still being asked of the process that "
                   f"spawned this actor; `await proc_mesh.initialized` first")] * 2
        assert list(c.async_pids.call().get(timeout=60).values()) == [pids, pids]
        # a view: the actors' proc_mesh is the view they were spawned on
        one = procs.slice(gpus=1).spawn("one", _WhereAmI)
        assert one.sync_pids.call_one().get(timeout=60) == [pids[1]]
        # spawned by an actor: asked of that actor's process
        child = where.slice(gpus=0).spawn_child.call_one(others).get(timeout=60)
        assert [list(v.values()) for v in child] == [[others.pids]] * 2
    finally:
        procs.stop().get(timeout=30)
        others.stop().get(timeout=30)


def test_proc_mesh_whose_spawner_is_gone_names_it():
    spawners = this_host().spawn_procs(per_host={"gpus": 1})
    others = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        child = spawners.spawn("parent", _WhereAmI).keep_child.call_one(others).get(timeout=60)
        # the spawner's process dies (a stopped spawner would stop its child with it)
        os.kill(spawners.pids[0], signal.SIGKILL)
        assert not wait_gone(spawners.pids)
        with pytest.raises(Exception, match=r"proc mesh '[^']+' is asked of the process that "
                                            r"spawned this actor, actor parent\[0\] in process"):
            child.sync_pids.call_one().get(timeout=60)
        with pytest.raises(Exception, match=r"actor parent\[0\] in process .* did not answer"):
            child.async_pids.call_one().get(timeout=60)
    finally:
        others.stop().get(timeout=30)


def test_the_spawner_answers_for_each_view_once_until_the_mesh_stops():
    """One entry per view spawned on, whichever copy of the mesh was used; none once the
    mesh is stopped (its actors are gone: nobody asks any more)."""
    from hpcmesh.actor.proc_mesh import views_answered_for
    from hpcmesh.transport import serialization
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        copy = serialization.loads(*serialization.dumps(procs.initialized.get(timeout=60)))
        assert copy is not procs and copy.pids == procs.pids
        for m in (procs, copy, procs.slice(gpus=1), copy.slice(gpus=1)):
            m.spawn("c", Counter).initialized.get(timeout=60)
        assert sorted(v.ranks() for v in views_answered_for(copy)) == [[0, 1], [1]]
    finally:
        procs.stop().get(timeout=30)
    assert views_answered_for(procs) == []
