"""A frame whose buffer cannot be allocated closes its connection once, with a reason
(a real socket; the address space capped with RLIMIT_AS in a child process).

Before, the MemoryError escaped the reader on every read: the connection stayed open, what
waited on it hung, and a traceback was logged each time the socket was readable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import asyncio, logging, resource, socket, threading, time
    from hpcmesh.transport import framing
    from hpcmesh.transport.connection import Connection

    records = []
    class Count(logging.Handler):
        def emit(self, record):
            records.append(record)
    logging.getLogger().addHandler(Count())
    logging.getLogger().setLevel(logging.WARNING)

    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    limit = vm + 256 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    async def main():
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        closed = loop.create_future()
        got = []
        conn = Connection(loop, ours, "peer", lambda c, frames: got.extend(frames),
                          lambda c, exc: closed.done() or closed.set_result(exc),
                          threading.get_ident())
        meta = b"x" * 16
        small = b"".join(bytes(p) for p in framing.encode_frame(meta))
        # a whole small frame, then one that announces a 1 GiB buffer, then some of it
        big = framing._HEAD.pack(len(meta), 1, 1) + framing._BUFLEN.pack(2**30) + meta
        theirs.sendall(small + big + b"\\0" * 65536)
        exc = await asyncio.wait_for(closed, 5)
        await asyncio.sleep(0.3)             # more reads would log more, if any happened
        print("CLOSED", conn.closed, "FRAMES", len(got), "LOG", len(records))
        print("REASON", exc)
        theirs.close()

    asyncio.run(main())
""")


def test_an_unallocatable_frame_closes_the_connection_once_with_a_reason():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CLOSED True FRAMES 1 LOG 1" in out.stdout, out.stdout + out.stderr[-2000:]
    assert ("out of memory reading from peer: a frame buffer of 1073741824 bytes could not "
            "be allocated") in out.stdout
