"""Actor semantics over real processes: endpoints, ordering, call styles, passing meshes/ports."""

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ci_gate import import_or_skip

from hpcmesh.actor import (Actor, ActorError, ActorMesh, Channel, Future, SupervisionError,
                           ValueMesh, context, current_rank, current_size, endpoint, this_host)
from hpcmesh.runtime.node import current_node




class Worker(Actor):
    def __init__(self, tag="w"):
        self.tag = tag
        self.log = []
        self.active = 0
        self.max_active = 0
        self.value = None

    @endpoint
    def sync_echo(self, v):
        return (self.tag, v)

    @endpoint
    async def append_and_return_log(self, item):
        self.log.append(item)
        return self.log           # the same list object every time, changed by later calls

    @endpoint
    async def async_echo(self, v):
        await asyncio.sleep(0)
        return (self.tag, v)

    @endpoint
    async def slow_log(self, i, delay):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.log.append(("start", i))
        await asyncio.sleep(delay)      # sleep: the call suspends this long
        self.log.append(("end", i))
        self.active -= 1

    @endpoint(concurrent=True)
    async def overlap(self, delay):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(delay)      # sleep: the call suspends this long
        self.active -= 1
        return self.max_active

    @endpoint
    def sync_append(self, i):
        self.log.append(i)

    @endpoint
    async def async_append(self, i, sleep):
        if sleep:
            await asyncio.sleep(0.001)  # sleep: suspends once
        self.log.append(i)

    @endpoint
    def get_log(self):
        return list(self.log)

    @endpoint
    def reset(self):
        self.log.clear()
        self.active = self.max_active = 0

    @endpoint
    def get_max_active(self):
        return self.max_active

    @endpoint
    def set_value(self, v):
        self.value = v

    @endpoint
    def get_value(self):
        return self.value

    @endpoint
    def boom(self):
        raise ValueError("broadcast went wrong")

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def member(self):
        """Which member this is, whether members are processes or nodes of one process."""
        return os.getpid(), id(self)

    @endpoint
    def member_slow(self, delay):
        time.sleep(delay)       # sleep: answers this much later
        return os.getpid(), id(self)

    @endpoint
    def pid_slow(self, delay):
        time.sleep(delay)       # sleep: answers this much later
        return os.getpid()

    @endpoint
    def where(self):
        c = context()
        return {"actor": dict(c.actor_instance.rank.coords),
                "actor_rank": c.actor_instance.rank.rank,
                "actor_extent": dict(c.actor_instance.rank.extent),
                "message": dict(c.message_rank.coords),
                "message_rank": c.message_rank.rank,
                "current_rank": current_rank().rank,
                "current_size": current_size(),
                "gpus": c.actor_instance.rank["gpus"]}

    @endpoint
    async def delayed(self, i, delay):
        await asyncio.sleep(delay)      # sleep: answers this much later
        return i

    @endpoint
    async def rank_delayed(self, base):
        r = current_rank().rank
        await asyncio.sleep((3 - r) * base)     # sleep: the higher ranks answer first
        return r

    @endpoint
    def send_to_port(self, port, n):
        for i in range(n):
            port.send((context().actor_instance.rank.rank, i))
        return n

    @endpoint
    async def send_to_port_async(self, port, values):
        for v in values:
            port.send(v)

    @endpoint
    def sum_value_mesh(self, vm):
        assert isinstance(vm, ValueMesh)
        return sum(vm.values()), [dict(p.coords) for p, _ in vm], vm.slice(hosts=1).values()

    @endpoint
    async def same_task_and_context_across_awaits(self):
        # Endpoints start inline when the actor is idle and are handed to the mailbox
        # task when they suspend: neither their context nor their task may change.
        task, rank = asyncio.current_task(), context().message_rank
        await asyncio.sleep(0.001)      # sleep: suspends once
        same = asyncio.current_task() is task and context().message_rank == rank
        try:
            async with asyncio.timeout(0.02):     # cancels the task the endpoint runs in
                await asyncio.sleep(5)    # sleep: the timeout ends it
            timed_out = False
        except TimeoutError:
            timed_out = True
        try:
            async with asyncio.timeout(0):        # expires before the first suspension ends
                await asyncio.sleep(5)    # sleep: the timeout ends it
            expired = False
        except TimeoutError:
            expired = True
        return task is not None, same, timed_out, expired, asyncio.current_task() is task

    @endpoint
    async def with_timeout_and_taskgroup(self):
        async with asyncio.timeout(5):
            async with asyncio.TaskGroup() as tg:
                a = tg.create_task(asyncio.sleep(0.01, result=1))
                b = tg.create_task(asyncio.sleep(0.01, result=2))
        return a.result() + b.result(), asyncio.current_task() is not None

    @endpoint
    def make_generator(self):
        return (i for i in range(3))

    def helper(self):
        return "not an endpoint"


class Counter(Actor):
    def __init__(self, start=0):
        self.n = start

    @endpoint
    async def incr(self, by=1):
        self.n += by
        return self.n

    @endpoint
    def value(self):
        return self.n

    @endpoint
    def node_id(self):
        return current_node().node_id


class Caller(Actor):
    """Calls another actor mesh directly from inside an endpoint."""

    def __init__(self, target=None):
        self.target = target

    @endpoint
    async def call_async(self, counters, n):
        one = counters.slice(**{d: 0 for d in counters.extent})
        futs = [one.incr.call_one() for _ in range(n)]
        vals = [await f for f in futs]
        return vals, current_node().peer_connected(await one.node_id.call_one())

    @endpoint
    def call_sync(self, counters):
        return counters.incr.call(10).get(timeout=10).values()

    @endpoint
    async def call_sync_in_async_one(self, counters):
        one = counters.slice(**{d: 0 for d in counters.extent})
        return one.value.call_one().get(timeout=5)

    @endpoint
    async def call_sync_in_async_all(self, counters):
        return counters.value.call().get(timeout=5)

    @endpoint
    async def use_ctor_target(self):
        vm = await self.target.value.call()
        return vm.values()


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    yield pm
    pm.stop().get(timeout=30)


@pytest.fixture(scope="module")
def memory_procs():
    """The same shape, its members nodes of this process on the memory backend."""
    from memory_procs import memory_proc_mesh
    pm = memory_proc_mesh({"hosts": 2, "gpus": 2})
    yield pm
    pm.stop().get(timeout=30)


@pytest.fixture(scope="module", params=["processes", "memory"])
def workers(request):
    """Workers in real processes, and the same calls again through the memory backend
    (dispatch, ordering and replies are the subject here, not the processes)."""
    w = request.getfixturevalue(request.param + "_procs" if request.param == "memory"
                                else "procs").spawn("workers", Worker)
    w.initialized.get(timeout=30)
    return w


def test_sync_and_async_endpoints(workers):
    assert workers.sync_echo.call(1).get(timeout=10).values() == [("w", 1)] * 4
    assert workers.async_echo.call(2).get(timeout=10).values() == [("w", 2)] * 4


def test_asyncio_timeout_and_taskgroup_work_in_endpoints(workers):
    one = workers.slice(hosts=0, gpus=0)
    assert one.with_timeout_and_taskgroup.call_one().get(timeout=10) == (3, True)


def test_endpoint_keeps_its_task_and_context_across_awaits(workers):
    one = workers.slice(hosts=0, gpus=1)
    for _ in range(3):
        assert one.same_task_and_context_across_awaits.call_one().get(timeout=10) == \
            (True, True, True, True, True)
    # and while other calls queue behind it (so it does not run inline)
    futs = [one.same_task_and_context_across_awaits.call_one() for _ in range(3)]
    assert [f.get(timeout=10) for f in futs] == [(True, True, True, True, True)] * 3


def test_non_concurrent_async_endpoint_does_not_interleave(workers):
    one = workers.slice(hosts=0, gpus=1)
    one.reset.call_one().get(timeout=10)
    futs = [one.slow_log.call_one(i, 0.02) for i in range(5)]
    for f in futs:
        f.get(timeout=10)
    log = one.get_log.call_one().get(timeout=10)
    assert log == [(ev, i) for i in range(5) for ev in ("start", "end")]
    assert one.get_max_active.call_one().get(timeout=10) == 1


def test_concurrent_endpoint_overlaps(workers):
    one = workers.slice(hosts=1, gpus=0)
    one.reset.call_one().get(timeout=10)
    t0 = time.monotonic()
    futs = [one.overlap.call_one(0.3) for _ in range(5)]
    results = [f.get(timeout=10) for f in futs]
    assert time.monotonic() - t0 < 1.2            # 5 x 0.3 s run at once, not one after another
    assert max(results) == 5


def test_per_sender_order_with_mixed_sync_and_async(workers):
    one = workers.slice(hosts=1, gpus=1)
    one.reset.call_one().get(timeout=10)
    futs = []
    for i in range(300):
        if i % 3 == 0:
            futs.append(one.sync_append.call_one(i))
        else:
            futs.append(one.async_append.call_one(i, i % 7 == 1))
    for f in futs:
        f.get(timeout=30)
    assert one.get_log.call_one().get(timeout=10) == list(range(300))


def test_pipelined_order_with_batched_small_and_out_of_band_big_arguments(workers):
    # Small calls from a pipelining caller travel in batch frames and big ones as their
    # own frames with out-of-band buffers; the actor must still see them in call order.
    one = workers.slice(hosts=1, gpus=1)
    one.reset.call_one().get(timeout=10)
    big = b"b" * (200 * 1024)
    futs = [one.async_append.call_one(i, False) if i % 50 else
            one.sync_append.call_one((i, big)) for i in range(1000)]
    for f in futs:
        f.get(timeout=30)
    log = one.get_log.call_one().get(timeout=10)
    assert [x if isinstance(x, int) else x[0] for x in log] == list(range(1000))
    assert all(x[1] == big for x in log if not isinstance(x, int))


def test_pipelined_values_are_sent_as_they_were_when_sent(workers):
    # Replies and arguments of immutable values wait in a batch and are pickled with it;
    # anything mutable must be pickled at once: a later change must not leak into it.
    one = workers.slice(hosts=0, gpus=1)
    one.reset.call_one().get(timeout=10)
    arg = [0]
    futs = []
    for i in range(300):
        arg[0] = i                                   # the caller changes its argument ...
        futs.append(one.append_and_return_log.call_one((i, list(arg), arg)))
    arg[0] = "changed"
    logs = [f.get(timeout=30) for f in futs]
    for i, log in enumerate(logs):
        assert len(log) == i + 1                     # ... and the actor its returned list
        assert log[i] == (i, [i], [i])


def test_order_kept_across_the_spawn_becoming_ready(procs):
    # Calls made while the actors start are queued; calls made once they are up go
    # straight out. A tight loop spans that switch and must still be answered in order.
    c = procs.spawn("order_ready", Counter, 0).slice(hosts=1, gpus=0)
    up = c.initialized      # settles after the calls queued meanwhile went out
    futs = []
    t0 = time.monotonic()
    while len(futs) < 20_000 and (len(futs) < 500 or time.monotonic() - t0 < 0.5):
        futs.append(c.incr.call_one())
        if up.done() and len(futs) > 500:
            break
    futs += [c.incr.call_one() for _ in range(200)]
    assert [f.get(timeout=60) for f in futs] == list(range(1, len(futs) + 1))


def test_broadcast_is_fire_and_forget_and_ordered(workers):
    assert workers.set_value.broadcast("hello") is None
    # a later call from the same sender sees the broadcast's effect
    assert workers.get_value.call().get(timeout=10).values() == ["hello"] * 4
    workers.slice(hosts=0).set_value.broadcast("row0")
    assert workers.get_value.call().get(timeout=10).values() == ["row0", "row0", "hello", "hello"]


def test_failing_broadcast_fails_that_actor_not_lost(procs, unhandled_faults):
    # As in Monarch: nobody could be given the error, so the actor fails (supervision)
    w = procs.spawn("broadcast_victims", Worker)
    w.slice(hosts=1, gpus=0).boom.broadcast()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not any(
            f.mesh_name == "broadcast_victims" for f in unhandled_faults):
        time.sleep(0.05)
    failure = next(f for f in unhandled_faults if f.mesh_name == "broadcast_victims")
    report = failure.report()
    assert "ValueError: broadcast went wrong" in report and "broadcast()" in report, report
    assert "{'hosts': 1/2, 'gpus': 0/2}" in report and failure.point.rank == 2, report
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        w.slice(hosts=1, gpus=0).get_value.call_one().get(timeout=10)
    assert w.slice(hosts=0).get_value.call().get(timeout=10).values() == [None, None]


def test_choose_spreads_over_members(workers):
    all_members = set(workers.member.call().get(timeout=10).values())
    seen = {workers.member.choose().get(timeout=10) for _ in range(12)}
    assert len(seen) >= 3 and seen <= all_members
    # in flight at once: each pick goes to a member with the least work
    futs = [workers.member_slow.choose(0.3) for _ in range(4)]
    assert {f.get(timeout=10) for f in futs} == all_members
    # choose on a slice stays in the slice
    row = workers.slice(hosts=1)
    row_members = set(row.member.call().get(timeout=10).values())
    assert {row.member.choose().get(timeout=10) for _ in range(6)} <= row_members


def test_stream_sync_iteration_gives_settled_futures(workers):
    # as in Monarch: `for f in ep.stream()` gives Futures, each already settled
    futs = list(workers.delayed.stream(7, 0.01))
    assert all(isinstance(f, Future) and f.done() for f in futs)
    assert [f.get() for f in futs] == [7, 7, 7, 7]

    async def awaited():
        return [await f for f in futs]
    assert asyncio.run(awaited()) == [7, 7, 7, 7]


def test_stream_yields_in_arrival_order(workers):
    # member r answers after (3 - r) * 0.15 s: the stream gives the fastest first
    assert [f.get() for f in workers.rank_delayed.stream(0.15)] == [3, 2, 1, 0]

    async def collect():
        return [v async for v in workers.rank_delayed.stream(0.15)]
    assert asyncio.run(collect()) == [3, 2, 1, 0]


def test_stream_async_iteration_and_errors(workers):
    async def collect(s):
        return [v async for v in s]
    assert asyncio.run(collect(workers.async_echo.stream(3))) == [("w", 3)] * 4
    with pytest.raises(ActorError, match="broadcast went wrong"):
        asyncio.run(collect(workers.boom.stream()))
    # iterating synchronously, the failure is in the Future it gives
    failures = [f.exception() for f in workers.boom.stream()]
    assert len(failures) == 4 and all(isinstance(e, ActorError) for e in failures)


def test_channel_port_passed_to_actor(workers):
    port, recv = Channel.open()
    n = workers.slice(hosts=0, gpus=1).send_to_port.call_one(port, 5).get(timeout=10)
    assert n == 5
    got = [recv.recv().get(timeout=10) for _ in range(5)]
    assert got == [(1, i) for i in range(5)]
    # every member sends to the same port; an async endpoint works too
    port2, recv2 = Channel.open()
    workers.send_to_port_async.call(port2, ["a", "b"]).get(timeout=10)
    got2 = sorted(recv2.recv().get(timeout=10) for _ in range(8))
    assert got2 == ["a"] * 4 + ["b"] * 4

    async def arecv():
        port3, r3 = Channel.open()
        workers.slice(hosts=1, gpus=1).send_to_port.call_one(port3, 2)
        return [await r3.recv(), await r3.recv()]
    assert asyncio.run(arecv()) == [(3, 0), (3, 1)]


def test_actor_calls_another_actor_mesh_directly(procs):
    counters = procs.spawn("counters_direct", Counter, 100)
    callers = procs.spawn("callers", Caller)
    callers.initialized.get(timeout=30)
    counters.initialized.get(timeout=30)
    c = callers.slice(hosts=1, gpus=1)
    vals, direct = c.call_async.call_one(counters, 50).get(timeout=30)
    assert vals == list(range(101, 151))          # in order, from the calling actor
    assert direct                                 # it dialed the target itself
    assert c.call_sync.call_one(counters).get(timeout=30) == [160, 110, 110, 110]


def test_uninitialized_mesh_passed_as_argument(procs):
    counters = procs.spawn("counters_fresh", Counter, 1)   # not awaited: still starting
    callers = procs.spawn("callers_fresh", Caller, counters)
    assert callers.slice(hosts=0, gpus=0).use_ctor_target.call_one().get(timeout=30) == [1] * 4
    fresh = procs.spawn("counters_fresh2", Counter, 5)
    vals, _ = callers.slice(hosts=0, gpus=1).call_async.call_one(fresh, 2).get(timeout=30)
    assert vals == [6, 7]


def test_sync_get_inside_async_endpoint_is_a_clear_error(procs):
    counters = procs.spawn("counters_get", Counter, 0)
    callers = procs.spawn("callers_get", Caller)
    counters.initialized.get(timeout=30)
    c = callers.slice(hosts=0, gpus=0)
    for ep in (c.call_sync_in_async_one, c.call_sync_in_async_all):
        t0 = time.monotonic()
        with pytest.raises(ActorError, match="would deadlock") as ei:
            ep.call_one(counters).get(timeout=20)
        assert ei.value.remote_type == "RuntimeError"
        assert time.monotonic() - t0 < 5


def test_value_mesh_as_argument(workers):
    vm = workers.where.call().get(timeout=10)
    ranks = ValueMesh.from_indexed(vm.extent, enumerate(v["actor_rank"] for v in vm.values()))
    total, points, row = workers.slice(hosts=0, gpus=0).sum_value_mesh.call_one(ranks).get(
        timeout=10)
    assert total == 0 + 1 + 2 + 3
    assert points == [{"hosts": h, "gpus": g} for h in (0, 1) for g in (0, 1)]
    assert row == [2, 3]
    for point, v in vm:                       # indexing by point
        assert vm[point] == v


def test_unpicklable_argument_or_result_is_a_serialization_error(workers):
    import threading
    from hpcmesh.transport.serialization import SerializationError
    one = workers.slice(hosts=0, gpus=0)
    with pytest.raises(SerializationError, match="arguments of Worker.sync_echo.*lock"):
        one.sync_echo.call_one(threading.Lock())
    with pytest.raises(SerializationError, match="cannot serialize result.*generator"):
        one.make_generator.call_one().get(timeout=10)
    assert one.sync_echo.call_one(1).get(timeout=10) == ("w", 1)


def test_large_array_argument_and_result_cross_the_wire(workers):
    np = import_or_skip("numpy")
    arr = np.arange(3_000_000, dtype=np.float32).reshape(1000, 3000)
    back = workers.slice(hosts=0, gpus=1).sync_echo.call_one(arr).get(timeout=30)
    assert back[0] == "w"
    np.testing.assert_array_equal(back[1], arr)


def test_actor_rank_versus_message_rank_through_views(workers):
    vm = workers.slice(gpus=1).where.call().get(timeout=10)
    for (point, v), h in zip(vm, (0, 1)):
        assert v["actor"] == {"hosts": h, "gpus": 1}
        assert v["actor_rank"] == 2 * h + 1
        assert v["actor_extent"] == {"hosts": 2, "gpus": 2}
        assert v["message"] == {"hosts": h} and v["message_rank"] == h
        # current_rank()/current_size() follow the message, as in Monarch
        assert v["current_rank"] == h
        assert v["current_size"] == {"hosts": 2}
        assert v["gpus"] == 1
        assert point.rank == h
    flat = workers.flatten("rank").slice(rank=slice(1, 4, 2)).where.call().get(timeout=10)
    assert [v["message"] for v in flat.values()] == [{"rank": 0}, {"rank": 1}]
    assert [v["actor"] for v in flat.values()] == [{"hosts": 0, "gpus": 1}, {"hosts": 1, "gpus": 1}]


def test_endpoint_name_collisions_are_refused_at_class_definition():
    for name in ("slice", "size", "extent", "rename", "flatten", "stop", "initialized"):
        with pytest.raises(TypeError, match=f"collides with the ActorMesh attribute '{name}'"):
            type("Bad", (Actor,), {name: endpoint(lambda self: 1)})

    class NotAnActorSubclass:          # no __init_subclass__ check: refused at spawn
        @endpoint
        def size(self):
            return 1
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="never")
    try:
        with pytest.raises(TypeError, match="collides"):
            pm.spawn("x", NotAnActorSubclass)
    finally:
        pm.stop().get(timeout=30)


def test_endpoints_may_take_the_names_of_hpcmesh_only_mesh_attributes(procs):
    # Monarch has no ActorMesh.name/points/to_table, and Monarch programs use such names
    class Named(Actor):
        @endpoint
        def name(self):
            return "endpoint name"

        @endpoint
        def points(self):
            return context().actor_instance.rank.rank

        @endpoint
        def to_table(self):
            return "endpoint table"

        @endpoint
        def class_name(self):
            return "endpoint class_name"

    named = procs.spawn("named", Named)
    assert set(named.name.call().get(timeout=10).values()) == {"endpoint name"}
    assert sorted(named.points.call().get(timeout=10).values()) == [0, 1, 2, 3]
    assert named.slice(hosts=0, gpus=1).to_table.call_one().get(timeout=10) == "endpoint table"
    assert set(named.class_name.call().get(timeout=10).values()) == {"endpoint class_name"}
    assert "named" in repr(named) and "Named" in repr(named)
    # on a mesh without such endpoints the attributes are the mesh's own
    plain = procs.spawn("plain", _Plain)
    assert plain.name == "plain"
    assert len(plain.points()) == 4 and "hosts" in plain.to_table()


class _Plain(Actor):
    @endpoint
    def ping(self):
        return "pong"


def test_non_endpoint_method_is_a_clear_error(workers):
    with pytest.raises(RuntimeError, match="helper is not an endpoint.*as_endpoint"):
        workers.helper()        # as in Monarch: read through the mesh, a plain method is
    with pytest.raises(AttributeError, match="no endpoint 'nope'.*sync_echo"):
        workers.nope            # callable only with as_endpoint(); an unknown name is not
    with pytest.raises(TypeError, match="call_one\\(\\), call\\(\\)"):
        workers.sync_echo(1)


def test_init_that_raises_fails_that_actor_naming_init(procs):
    class Broken(Actor):
        def __init__(self):
            raise RuntimeError("cannot start")

        @endpoint
        def ping(self):
            return 1
    b = procs.spawn("broken", Broken)
    # as in Monarch, the actor failed (supervision); unlike Monarch, its processes go on
    with pytest.raises(SupervisionError) as ei:
        b.ping.call().get(timeout=30)
    assert "RuntimeError: cannot start raised in Broken.__init__" in str(ei.value)
    assert "Endpoint call broken.ping() failed" in str(ei.value)
    with pytest.raises(SupervisionError, match="Broken broken{'hosts': 0/2, 'gpus': 0/2}"):
        b.slice(hosts=0, gpus=0).ping.call_one().get(timeout=10)
    assert procs.spawn("after_broken", Worker).sync_echo.call(1).get(timeout=30).values() == \
        [("w", 1)] * 4


def test_await_and_get_from_threads_concurrently(procs):
    counters = procs.spawn("counters_mt", Counter, 0)
    one = counters.slice(hosts=0, gpus=0)
    errors = []

    def thread_work():
        try:
            return [one.incr.call_one().get(timeout=30) for _ in range(40)]
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            return []

    async def loop_work():
        out = []
        for _ in range(40):
            out.append(await one.incr.call_one())
        rest = await asyncio.gather(*(one.incr.call_one() for _ in range(40)))
        return out + list(rest)

    with ThreadPoolExecutor(4) as ex:
        thread_futs = [ex.submit(thread_work) for _ in range(4)]
        from_loop = asyncio.run(loop_work())
        from_threads = [f.result(timeout=60) for f in thread_futs]
    assert not errors
    seen = from_loop + [v for r in from_threads for v in r]
    assert sorted(seen) == list(range(1, 4 * 40 + 80 + 1))
    for r in from_threads + [from_loop[:40]]:
        assert r == sorted(r)          # each sender sees its own calls in order
    assert one.value.call_one().get(timeout=10) == 4 * 40 + 80


def test_is_actor_mesh(workers):
    assert isinstance(workers, ActorMesh)
    assert len(workers) == 4 and workers.size("gpus") == 2


class _Stoppable(Actor):
    def __init__(self, marker_dir):
        self.marker_dir = marker_dir

    @endpoint
    def rank(self):
        return context().actor_instance.rank.rank

    def __cleanup__(self, exc=None):
        rank = context().actor_instance.rank.rank
        with open(os.path.join(self.marker_dir, f"cleanup-{rank}"), "w") as f:
            f.write("done")


def test_actor_mesh_stop_stops_its_actors_and_leaves_the_processes(procs, tmp_path):
    stoppable = procs.spawn("stoppable", _Stoppable, str(tmp_path))
    ranks = stoppable.rank.call().get(timeout=10)
    np = import_or_skip("numpy")
    assert ranks.get(3) == 3 and ranks.get(np.int64(2)) == 2
    assert stoppable.sizes == {"hosts": 2, "gpus": 2}
    assert stoppable.slice(hosts=1).stop("done with it").get(timeout=30) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"cleanup-{r}" for r in range(4)]
    with pytest.raises(SupervisionError, match="'stoppable' was stopped: done with it"):
        stoppable.rank.call().get(timeout=10)
    # the processes serve other actor meshes still
    again = procs.spawn("again", _Stoppable, str(tmp_path))
    assert again.rank.call().get(timeout=10).values() == [0, 1, 2, 3]


class _Answerer(Actor):
    """Endpoints that answer through the response port they are given."""

    def __init__(self):
        self.held = []

    @endpoint(explicit_response_port=True)
    def rank_twice(self, port, base):
        port.send(base + context().actor_instance.rank.rank)
        port.send("a second answer is dropped")

    @endpoint(explicit_response_port=True)
    async def later(self, port, tag):
        self.held.append((port, tag))

    @endpoint
    def release(self):
        for port, tag in self.held:
            port.send(f"{tag} released")
        n, self.held = len(self.held), []
        return n

    @endpoint(explicit_response_port=True)
    def refuse(self, port, how):
        if how == "port":
            port.exception(ValueError("refused through the port"))
        else:
            raise KeyError("raised before answering")

    @endpoint(explicit_response_port=True)
    async def hand_over(self, port, other):
        await other.answer_for.call_one(port)

    @endpoint
    def answer_for(self, port):
        port.send("answered by another actor")


def test_explicit_response_port_endpoints(procs):
    answerers = procs.spawn("answerers", _Answerer)
    assert answerers.rank_twice.call(10).get(timeout=10).values() == [10, 11, 12, 13]
    one = answerers.slice(hosts=0, gpus=1)
    pending = one.later.call_one("x")
    assert one.release.call_one().get(timeout=10) == 1
    assert pending.get(timeout=10) == "x released"
    with pytest.raises(ValueError, match="refused through the port"):
        one.refuse.call_one("port").get(timeout=10)
    answerers.rank_twice.broadcast(0)          # nobody waits: the answers go nowhere
    other = answerers.slice(hosts=1, gpus=0)
    assert one.hand_over.call_one(other).get(timeout=10) == "answered by another actor"
    assert one.rank_twice.call_one(5).get(timeout=10) == 6   # still serving
    # an error escaping such an endpoint fails the actor, as in Monarch
    with pytest.raises(SupervisionError, match="KeyError.*raised before answering"):
        one.refuse.call_one("raise").get(timeout=10)
    with pytest.raises(SupervisionError, match="Endpoint call answerers.rank_twice"):
        one.rank_twice.call_one(5).get(timeout=10)
    assert other.rank_twice.call_one(5).get(timeout=10) == 7
