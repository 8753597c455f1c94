"""Micro-benchmarks of the pieces of one hpcmesh call, to rank optimizations.

    .venv/bin/python benchmarks/micro_hotpath.py

Builds the same message tuples the runtime sends (MSG_CALL with a PortRef and a
Point; MSG_DELIVER reply) and times each step in isolation, plus the raw costs
of the OS/thread handoffs a round trip needs on this machine. Numbers are µs
per operation (best of 5 timeit repeats, so noise from other load is reduced).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
import threading
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

from hpcmesh.runtime.future import Future  # noqa: E402
from hpcmesh.runtime.node import MSG_CALL, MSG_DELIVER, NodeRef, PortRef  # noqa: E402
from hpcmesh.shapes import Extent, Point  # noqa: E402
from hpcmesh.transport import serialization  # noqa: E402
from hpcmesh.transport.framing import FrameDecoder, encode_frame  # noqa: E402

results: list[tuple[str, float]] = []


def t(label: str, fn, number: int = 20000) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    results.append((label, best))
    print(f"{best:9.2f} µs  {label}", flush=True)
    return best


def main() -> None:
    node = NodeRef("a" * 32, ("unix:///tmp/hpcmesh-0/aaaaaaaaaaaaaaaa.sock",
                              "tcp://10.0.0.1:40000", "tcp://[fe80::1]:40001"))
    port = PortRef(node, 12345)
    ext = Extent({"gpus": 1})
    point = Point(0, ext)
    call = (MSG_CALL, "b" * 32, "echo", (C.SMALL,), {}, port, point)
    reply = (MSG_DELIVER, 12345, C.SMALL)
    print("== serialization of one call (controller) and its reply (worker)")
    meta, bufs = serialization.dumps(call)
    rmeta, _ = serialization.dumps(reply)
    print(f"   call meta = {len(meta)} B, reply meta = {len(rmeta)} B")
    t("serialization.dumps(call msg)  [_FastPickler + reducer_override + _wrap_big]",
      lambda: serialization.dumps(call))
    t("pickle.dumps(call msg, 5)  [no reducer_override]", lambda: pickle.dumps(call, 5))
    flat = (MSG_CALL, "b" * 32, "echo", (C.SMALL,), {}, (node.node_id, 12345), 0)
    t("pickle.dumps(call with port as (node_id, int), point as rank)",
      lambda: pickle.dumps(flat, 5))
    t("serialization.loads(call meta)  [dataclass setstate x2 + Point/Extent rebuild]",
      lambda: serialization.loads(meta))
    fmeta = pickle.dumps(flat, 5)
    t("pickle.loads(flat call)", lambda: pickle.loads(fmeta))
    t("serialization.dumps(reply msg)", lambda: serialization.dumps(reply))
    t("pickle.dumps(reply msg, 5)", lambda: pickle.dumps(reply, 5))
    t("serialization.loads(reply meta)", lambda: serialization.loads(rmeta))
    t("_wrap_big((args,))", lambda: serialization._wrap_big(call))
    t("pickle.dumps(PortRef)", lambda: pickle.dumps(port, 5))
    t("pickle.dumps(Point(0, {gpus:1}))", lambda: pickle.dumps(point, 5))
    pb = pickle.dumps(point, 5)
    t("pickle.loads(Point)", lambda: pickle.loads(pb))
    t("Point(0, Extent) construction", lambda: Point(0, ext))
    t("PortRef(NodeRef(id, addrs), pid) construction",
      lambda: PortRef(NodeRef(node.node_id, node.addresses), 1))

    print("== framing")
    t("encode_frame(meta, [])", lambda: encode_frame(meta, []))
    dec = FrameDecoder()
    frame = b"".join(bytes(p) for p in encode_frame(meta, []))

    def feed():
        v = dec.next_buffer()
        n = len(frame)
        v[:n] = frame
        return dec.advance(n)
    t("FrameDecoder next_buffer+advance (one small frame)", feed)

    print("== futures")
    def fut_roundtrip():
        f = Future()
        f.add_done_callback(lambda _f: None)
        f.set_result(1)
        return f.get()
    t("Future() + add_done_callback + set_result + get (same thread)", fut_roundtrip)

    print("== OS / thread handoffs (the floor under any design)")
    a, b = socket.socketpair()
    msg = b"x" * 100

    def echo_srv(sock):
        while True:
            d = sock.recv(65536)
            if not d:
                return
            sock.sendall(d)
    th = threading.Thread(target=echo_srv, args=(b,), daemon=True)
    th.start()

    def pingpong():
        a.sendall(msg)
        a.recv(65536)
    t("unix socketpair ping-pong to another thread (blocking recv)", pingpong, 5000)
    a.close()

    # Process-to-process ping-pong over a unix socket (no Python event loop).
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        echo_srv(b)
        os._exit(0)
    b.close()
    t("unix socket ping-pong to another process (blocking recv)", pingpong, 5000)
    a.close()
    os.waitpid(pid, 0)

    # Lock handoff between threads (what Future.get does).
    req, rsp = threading.Lock(), threading.Lock()
    req.acquire()
    rsp.acquire()
    stop = [False]

    def responder():
        while True:
            req.acquire()
            if stop[0]:
                return
            rsp.release()
    th = threading.Thread(target=responder, daemon=True)
    th.start()

    def lock_pingpong():
        req.release()
        rsp.acquire()
    t("thread lock ping-pong (2 wakes)", lock_pingpong, 5000)
    stop[0] = True
    req.release()

    # call_soon_threadsafe wake of an idle event loop on another thread.
    for name, mk in (("asyncio", asyncio.new_event_loop), ("uvloop", _uvloop)):
        if mk is None:
            continue
        loop = mk()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()
        time.sleep(0.05)
        done = threading.Lock()
        done.acquire()

        def wake():
            loop.call_soon_threadsafe(done.release)
            done.acquire()
        t(f"call_soon_threadsafe to idle {name} loop + lock back (2 wakes)", wake, 5000)
        loop.call_soon_threadsafe(loop.stop)
        th.join()
        loop.close()


def _uvloop():
    import uvloop
    return uvloop.new_event_loop()


if __name__ == "__main__":
    try:
        import uvloop  # noqa: F401
    except ImportError:
        _uvloop = None  # noqa: F811
    main()
