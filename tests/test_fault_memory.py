"""A message whose buffer cannot be allocated fails that one message; the connection goes
on (real sockets and processes; the address space capped with RLIMIT_AS).

Before: first the MemoryError escaped the reader on every read (the connection hung and a
traceback was logged per read); then the connection closed, failing every call on it. Now
the decoder reads past the frame (its lengths say where the next one starts) and hands out
its envelope alone, so the node fails the one call whose arguments or result it carried."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# How far past its current size a capped process may grow, and a size over it.
HEADROOM_MB = 256
TOO_BIG_MB = 512

CONNECTION_CHILD = textwrap.dedent(f"""
    import asyncio, resource, socket, threading
    from hpcmesh.transport import framing
    from hpcmesh.transport.connection import Connection

    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    limit = vm + {HEADROOM_MB} * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    async def main():
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        closed = []
        got = []
        enough = loop.create_future()
        def on_frames(c, frames):
            got.extend(frames)
            if len(got) >= 3 and not enough.done():
                enough.set_result(None)
        conn = Connection(loop, ours, "peer", on_frames, lambda c, exc: closed.append(exc),
                          threading.get_ident())
        def small(meta):
            return b"".join(bytes(p) for p in framing.encode_frame(meta))
        size = {TOO_BIG_MB} * 2**20
        big = framing._HEAD.pack(8, 2, 1) + framing._BUFLEN.pack(size) + \\
            framing._BUFLEN.pack(100) + b"big-meta"
        def send():     # a small frame, the unallocatable one whole, another small one
            theirs.sendall(small(b"first"))
            theirs.sendall(big)
            chunk = b"\\1" * 2**20
            for _ in range({TOO_BIG_MB}):
                theirs.sendall(chunk)
            theirs.sendall(b"\\2" * 100 + small(b"after"))
        t = threading.Thread(target=send)
        t.start()
        await asyncio.wait_for(enough, 60)
        t.join()
        print("CLOSED", conn.closed, closed)
        print("FRAMES", [(bytes(f.meta), f.dropped, len(f.buffers)) for f in got])
        theirs.close()

    asyncio.run(main())
""")


def test_an_unallocatable_frame_is_read_past_and_handed_out_marked_dropped():
    out = subprocess.run([sys.executable, "-c", CONNECTION_CHILD], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CLOSED False []" in out.stdout, out.stdout + out.stderr[-2000:]
    size = TOO_BIG_MB * 2**20
    assert (f"FRAMES [(b'first', 0, 0), (b'big-meta', {size}, 0), (b'after', 0, 0)]"
            in out.stdout), out.stdout + out.stderr[-2000:]


MESH_CHILD = textwrap.dedent(f"""
    import resource, time
    from hpcmesh.actor import Actor, endpoint, this_host
    from hpcmesh.runtime.messages import MessageNotReceived

    def cap_this_process():
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        limit = vm + {HEADROOM_MB} * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    class Hungry(Actor):
        @endpoint
        def cap(self):
            cap_this_process()
        @endpoint
        def take(self, data: bytes) -> int:
            return len(data)
        @endpoint
        def give(self, mb: int) -> bytes:
            return b"x" * (mb * 2**20)
        @endpoint
        def ping(self) -> str:
            return "pong"

    procs = this_host().spawn_procs(per_host={{"gpus": 1}})
    a = procs.spawn("hungry", Hungry)
    big = b"y" * ({TOO_BIG_MB} * 2**20)

    # the actor's process cannot allocate the argument: that call fails, the next works
    a.cap.call_one().get(timeout=30)
    t0 = time.perf_counter()
    try:
        a.take.call_one(big).get(timeout=60)
        print("ARG no error")
    except MessageNotReceived as e:
        print("ARG", round(time.perf_counter() - t0, 2), e)
    print("AFTER ARG", a.ping.call_one().get(timeout=30), a.take.call_one(b"ok").get(timeout=30))

    # this process cannot allocate the result: that call fails, the next works
    others = this_host().spawn_procs(per_host={{"gpus": 1}})
    fresh = others.spawn("fresh", Hungry)
    del big
    cap_this_process()
    try:
        fresh.give.call_one({TOO_BIG_MB}).get(timeout=60)
        print("RESULT no error")
    except MessageNotReceived as e:
        print("RESULT", e)
    print("AFTER RESULT", fresh.ping.call_one().get(timeout=30),
          len(fresh.give.call_one(1).get(timeout=30)))
    procs.stop()
    others.stop()
""")


def test_a_call_whose_arguments_or_result_cannot_be_allocated_fails_alone():
    out = subprocess.run([sys.executable, "-c", MESH_CHILD], capture_output=True, text=True,
                         timeout=240)
    text = out.stdout + out.stderr[-3000:]
    assert out.returncode == 0, text
    assert "ARG " in out.stdout and "ARG no error" not in out.stdout, text
    assert (f"the arguments of take did not arrive: a buffer of {TOO_BIG_MB * 2**20} bytes "
            f"could not be allocated on") in out.stdout, text
    assert "AFTER ARG pong 2" in out.stdout, text
    assert "RESULT a value from" in out.stdout and "did not arrive" in out.stdout, text
    assert "AFTER RESULT pong 1048576" in out.stdout, text
