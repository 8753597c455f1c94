"""What TLS costs a bulk transfer: 64 MiB round trips between two processes over TCP
loopback, plain and with TLS (``trust_all_connections``), alternating, in one run.

    .venv/bin/python benchmarks/bench_tls.py [--size-mib 64] [--reps 5] [--pairs 2]

Two runtime nodes (no actors: the transport alone). The child echoes each message back
through a port; the parent times send-to-echo for ``reps`` transfers and takes the
median. Plain and TLS runs alternate (``pairs`` of each) so a slow phase of the machine
hits both. Prints a table and the ratio TLS/plain.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _echo_node(secret: bytes, use_tls: bool, ports, stop) -> None:
    from hpcmesh.runtime.node import MSG_DELIVER, Node
    from hpcmesh.transport import tls
    node = Node.start_in_thread(secret, role="bench", name="echo", listen=["tcp://127.0.0.1:0"])
    if use_tls:
        node.use_tls(tls.TLSSettings(tls.TRUST_ALL))

    def echo(value) -> None:
        reply_to, payload = value
        node.send(reply_to.node, (MSG_DELIVER, reply_to.port_id, payload))
    ports.put(node.open_port(echo))
    stop.wait()
    node.shutdown_thread()


def one_run(use_tls: bool, size: int, reps: int) -> float:
    """Median seconds of a ``size``-byte round trip."""
    from hpcmesh.runtime.node import MSG_DELIVER, Node
    from hpcmesh.transport import tls
    secret = os.urandom(32)
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_echo_node, args=(secret, use_tls, ports, stop))
    child.start()
    node = None
    try:
        target = ports.get(timeout=60)
        node = Node.start_in_thread(secret, role="bench", name="caller",
                                    listen=["tcp://127.0.0.1:0"])
        if use_tls:
            node.use_tls(tls.TLSSettings(tls.TRUST_ALL))
        arrived, got = threading.Event(), []
        mine = node.open_port(lambda v: (got.append(v), arrived.set()))

        def round_trip(payload) -> float:
            t0 = time.perf_counter()
            node.send(target.node, (MSG_DELIVER, target.port_id, (mine, payload)))
            if not arrived.wait(120):
                raise TimeoutError("no echo within 120 s")
            arrived.clear()
            return time.perf_counter() - t0
        round_trip(b"warm-up")
        payload = os.urandom(size)
        times = [round_trip(payload) for _ in range(reps)]
        if got[-1] != payload:
            raise AssertionError("the echo differs from what was sent")
        return statistics.median(times)
    finally:
        if node is not None:
            node.shutdown_thread()
        stop.set()
        child.join(10)
        if child.is_alive():
            child.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    size = args.size_mib << 20
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.pairs):
        for use_tls in (False, True):
            runs[use_tls].append(one_run(use_tls, size, args.reps))
    print(f"| {args.size_mib} MiB round trip, TCP loopback | median (ms) | GB/s |")
    print("|---|---|---|")
    for use_tls, label in ((False, "plain"), (True, "TLS (trust_all_connections)")):
        best = min(runs[use_tls])
        print(f"| {label} | {' / '.join(f'{t * 1e3:.0f}' for t in runs[use_tls])} | "
              f"{2 * size / best / 1e9:.2f} |")
    print(f"\nTLS / plain: {min(runs[True]) / min(runs[False]):.2f}× the time (best runs)")


if __name__ == "__main__":
    main()
