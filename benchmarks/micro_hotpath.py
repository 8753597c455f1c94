"""Micro-benchmarks of the pieces of one hpcmesh call, to rank optimizations.

    .venv/bin/python benchmarks/micro_hotpath.py

Builds the same message tuples the runtime sends (MSG_CALL with its arguments
inline and a reply port id; MSG_DELIVER reply; batch frames) and times each step
in isolation, plus the raw costs of the OS/thread handoffs a round trip needs on
this machine. ``hotpath_cpu.py`` measures whole sides instead. Numbers are µs
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
from hpcmesh.runtime.node import MSG_CALL, MSG_DELIVER  # noqa: E402
from hpcmesh.shapes import Extent, Point  # noqa: E402
from hpcmesh.transport import serialization  # noqa: E402
from hpcmesh.transport.framing import FrameDecoder, encode_batch, encode_frame  # noqa: E402

results: list[tuple[str, float]] = []


def t(label: str, fn, number: int = 20000) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    results.append((label, best))
    print(f"{best:9.2f} µs  {label}", flush=True)
    return best


def main() -> None:
    ext_items = (("gpus", 1),)
    # The shapes the runtime sends today: a call with builtin-valued arguments inline and
    # a reply port id; a reply to that port (see hpcmesh/runtime/node.py, MSG_*).
    call = (MSG_CALL, "b" * 32, "echo", ((C.SMALL,), {}), 12345, 0, ext_items)
    reply = (MSG_DELIVER, 12345, C.SMALL)
    print("== serialization of one call (controller) and its reply (worker)")
    meta = pickle.dumps(call, 5)
    rmeta = pickle.dumps(reply, 5)
    print(f"   call meta = {len(meta)} B, reply meta = {len(rmeta)} B")
    t("is_plain(args)  [decides: inline arguments, C pickler only]",
      lambda: serialization.is_plain(call[3]))
    t("pickle.dumps(call msg, 5)", lambda: pickle.dumps(call, 5))
    t("pickle.loads(call msg)", lambda: pickle.loads(meta))
    t("serialization.dumps(call msg)  [general path: checks, _FastPickler fallback]",
      lambda: serialization.dumps(call))
    t("pickle.dumps(reply msg, 5)", lambda: pickle.dumps(reply, 5))
    t("pickle.loads(reply msg)", lambda: pickle.loads(rmeta))
    ext = Extent({"gpus": 1})
    t("Point(0, Extent) construction  [cached per (rank, extent) on the worker]",
      lambda: Point(0, ext))

    print("== framing")
    t("encode_frame(meta, [])  [a lone message]", lambda: encode_frame(meta, []))
    metas = [meta] * 100
    t("encode_batch(100 calls)  [a pipelining caller's batch]",
      lambda: encode_batch(metas), number=2000)
    results[-1] = (results[-1][0], results[-1][1] / 100)
    print(f"          = {results[-1][1]:.2f} µs per call")
    body = encode_batch(metas)[1]
    t("loads_batch(100 calls)", lambda: serialization.loads_batch(body, 100),
      number=2000)
    results[-1] = (results[-1][0], results[-1][1] / 100)
    print(f"          = {results[-1][1]:.2f} µs per call")
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
