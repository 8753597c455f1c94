"""CPU cost of one pipelined call on each side, measured without the other side.

    .venv/bin/python benchmarks/hotpath_cpu.py [--batch 1000] [--rounds 50]

Why: on a 2-core VM a pipelined end-to-end figure mixes the controller's cost, the
worker's cost and how well the scheduler overlaps them (and anything else running).
This runs the real code of one side in this process and feeds it pre-made frames,
so the CPU microseconds per call of each side can be compared between commits:

- worker: batch frames of MSG_CALL into ``Node._on_frames``; an ``ActorHost`` runs
  an async echo endpoint; replies go out through a real ``Connection`` to a socket
  drained by ``cat``.
- controller: ``Endpoint.call_one`` on a live one-actor mesh (its connection also
  drained by ``cat``), then batch frames of the replies into ``Node._on_frames`` on
  the runtime thread, then ``Future.get()`` on each.

To reach the issue's 300k calls/s, each side must stay under ~3.3 µs per call.

``--telemetry``: each side measured with this process's telemetry recorder off and on
(``messages`` rows on the worker, ``sent_messages`` on the controller), alternating,
best of ``--repeat`` each: what recording adds to a call's CPU, without the noise of two
processes sharing two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcmesh.actor import Actor, endpoint  # noqa: E402
try:    # since actor/mesh.py was split; the A/B against older trees still runs
    from hpcmesh.actor.actor_mesh import rebuild_actor_mesh  # noqa: E402
except ImportError:
    from hpcmesh.actor.mesh import _rebuild_actor_mesh as rebuild_actor_mesh  # noqa: E402
from hpcmesh.runtime.actor_host import ActorHost  # noqa: E402
from hpcmesh.runtime.context import ActorInstance  # noqa: E402
try:    # its home since runtime/observe/ (issue 29); older trees (A/B runs) had it in runtime/
    from hpcmesh.runtime.observe import telemetry_recorder  # noqa: E402
except ImportError:
    from hpcmesh.runtime import telemetry_recorder  # noqa: E402
from hpcmesh.runtime.node import MSG_CALL, MSG_DELIVER, Node, NodeRef, set_current_node  # noqa: E402
try:    # their homes since the messages/loop/peers split; older trees (A/B runs) had them here
    from hpcmesh.runtime.loop import new_event_loop  # noqa: E402
    from hpcmesh.runtime.peers import Peer  # noqa: E402
except ImportError:
    from hpcmesh.runtime.loop import new_event_loop  # noqa: E402
    from hpcmesh.runtime.node import _Peer as Peer  # noqa: E402
from hpcmesh.shapes import Extent, Point, Shape  # noqa: E402
from hpcmesh.transport.connection import Connection  # noqa: E402
from hpcmesh.transport.framing import Frame, encode_batch  # noqa: E402

SMALL = b"x" * 32
SECRET = b"s" * 32


class Echo(Actor):
    @endpoint
    async def echo(self, x):
        return x


def _drained_connection(loop, node: Node, peer_id: str) -> tuple[Connection, subprocess.Popen]:
    """A real Connection whose far end is read and discarded by ``cat``."""
    a, b = socket.socketpair()
    drain = subprocess.Popen(["cat"], stdin=b, stdout=subprocess.DEVNULL)
    b.close()
    a.setblocking(False)
    conn = Connection(loop, a, peer_id, node._on_frames, lambda c, e: None, node.loop_tid)
    conn.info["peer_id"] = peer_id
    node._peers[peer_id] = Peer(NodeRef(peer_id, ()), conn=conn)
    return conn, drain


def _batch_frame(msgs: list[tuple]) -> Frame:
    """A batch frame as a pipelining sender makes it (message tuples pickled together)."""
    body = encode_batch(list(msgs))[1]
    return Frame(body, [], len(msgs))


def worker_side(batch: int, rounds: int) -> float:
    loop = new_event_loop()
    asyncio.set_event_loop(loop)

    async def build() -> Node:
        return Node(SECRET, loop, role="proc", name="bench")
    node = loop.run_until_complete(build())
    conn, drain = _drained_connection(loop, node, "client")
    obj = Echo.__new__(Echo)
    point = Point(0, Extent({"gpus": 1}))
    host = ActorHost(node, ActorInstance(rank=point, actor_id="A", mesh_name="m",
                                         class_name="Echo"), obj, None)
    node.actors["A"] = host
    ext = (("gpus", 1),)
    frame = _batch_frame([(MSG_CALL, "A", "echo", ((SMALL,), {}), i + 1, 0, ext)
                          for i in range(batch)])

    async def run(n: int) -> None:
        for _ in range(n):
            # From a plain loop callback, as the socket reader calls it (not inside a task:
            # an idle actor runs endpoints inline there).
            loop.call_soon(node._on_frames, conn, [frame])
            await asyncio.sleep(0)
            while host._busy or host._queue:
                await asyncio.sleep(0)
        await asyncio.sleep(0)
    loop.run_until_complete(run(2))     # warm-up
    t0 = time.process_time()
    loop.run_until_complete(run(rounds))
    cpu = time.process_time() - t0
    loop.run_until_complete(host.stop())
    conn.close()
    drain.wait()
    loop.close()
    return cpu / (batch * rounds) * 1e6


def controller_side(batch: int, rounds: int) -> tuple[float, float, float]:
    node = Node.start_in_thread(SECRET, role="client", name="bench")
    set_current_node(node)
    box = {}

    def on_loop() -> None:
        box["conn"], box["drain"] = _drained_connection(node.loop, node, "W")
        box["tid"] = threading.get_native_id()
    done = threading.Event()
    node.loop.call_soon_threadsafe(lambda: (on_loop(), done.set()))
    done.wait()
    conn = box["conn"]
    mesh = rebuild_actor_mesh("A", "m", "Echo", ["echo"], ["p0"], [NodeRef("W", ())],
                               Shape.from_extent(Extent({"gpus": 1})))
    ep = mesh.echo
    issue = replies = gets = 0.0
    for r in range(rounds + 2):
        t0 = time.thread_time()
        futs = [ep.call_one(SMALL) for _ in range(batch)]
        t1 = time.thread_time()
        first = next(iter(node._replies))
        frame = _batch_frame([(MSG_DELIVER, pid, SMALL) for pid in range(first, first + batch)])
        cpu = {}
        fed = threading.Event()

        def feed() -> None:
            c0 = time.thread_time()
            node._on_frames(conn, [frame])
            cpu["t"] = time.thread_time() - c0
            fed.set()
        node.loop.call_soon_threadsafe(feed)
        fed.wait()
        t2 = time.thread_time()
        for f in futs:
            f.get()
        t3 = time.thread_time()
        if r >= 2:
            issue += t1 - t0
            replies += cpu["t"]
            gets += t3 - t2
    n = batch * rounds
    flush = _thread_cpu(box["tid"])
    node.shutdown_thread()
    box["drain"].wait()
    return issue / n * 1e6, replies / n * 1e6, gets / n * 1e6, flush


def _thread_cpu(tid: int) -> float:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


@contextmanager
def recording(on: bool):
    """This process's telemetry recorder on (rows kept: the buffer holds every call of a
    measurement) or off, for one measurement; its rows are dropped after."""
    if on:
        os.environ.setdefault("HPCMESH_TELEMETRY_BUFFER", "20000000")
        telemetry_recorder.enable()
    try:
        yield
    finally:
        telemetry_recorder.disable()


def compare_telemetry(args) -> None:
    """Each side with telemetry off and on, alternating; best of ``--repeat`` each."""
    w = {False: [], True: []}
    c = {False: [], True: []}
    for _ in range(args.repeat):
        for on in (False, True) if _ % 2 == 0 else (True, False):
            with recording(on):
                w[on].append(worker_side(args.batch, args.rounds))
            with recording(on):
                c[on].append(sum(controller_side(args.batch, args.rounds)[:3]))
    print("| side | off (µs CPU a call) | on | on - off | on/off |\n|---|---|---|---|---|")
    for name, d in (("worker", w), ("controller (issue + replies + get)", c)):
        off, on = min(d[False]), min(d[True])
        print(f"| {name} | {off:.2f} | {on:.2f} | {on - off:+.2f} | {on / off:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--telemetry", action="store_true",
                    help="each side with telemetry off and on (alternating)")
    args = ap.parse_args()
    if args.telemetry:
        compare_telemetry(args)
        return
    w = min(worker_side(args.batch, args.rounds) for _ in range(args.repeat))
    print(f"worker:     {w:6.2f} µs CPU per call (receive batch, run echo, reply)")
    best = min((controller_side(args.batch, args.rounds) for _ in range(args.repeat)),
               key=lambda r: r[0] + r[1] + r[2])
    issue, replies, gets, _ = best
    print(f"controller: {issue:6.2f} µs call_one (caller thread)")
    print(f"            {replies:6.2f} µs reply handling (runtime thread)")
    print(f"            {gets:6.2f} µs Future.get() of a done future")
    print(f"            {issue + replies + gets:6.2f} µs total, plus the runtime thread's "
          f"batched flush (not timed)")


if __name__ == "__main__":
    main()
