"""The machine's floor for the mission's shape: one round trip to H hosts x G processes in
plain asyncio, no hpcmesh.

Why: ``bench_scale.py`` times ``call()`` over 32 x 8 processes, and the issue's target
(8 ms) is a number for a cluster, where every host has its own cores. On this VM every
process shares the same few cores, so a round that wakes 256 processes has a cost no
runtime can go under. This measures that cost with the least code that does the same
work, so hpcmesh's figure can be read as a ratio to it:

- ``relay``: the controller writes one frame to each of H agent processes (TCP over
  loopback, TCP_NODELAY); each agent writes it to its G member processes (Unix sockets),
  reads their G echoes and sends one folded frame back; the controller waits for the H
  folded frames. The shape of hpcmesh's fan-out through the host agents.
- ``direct``: the controller writes one frame to each of the H x G members itself (TCP)
  and waits for every echo. The shape of hpcmesh's direct path (``HPCMESH_RELAY=0``).

Every process is an asyncio event loop with stream readers, as hpcmesh's are; frames are
a 4-byte length and 32 bytes. Besides the median wall time of a round, it sums the CPU
time every process of the run spent per round (``/proc/<pid>/stat``): divided by the
cores, it is the wall time the round cannot go under here.

    .venv/bin/python benchmarks/bench_scale_floor.py --hosts 32 --per-host 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time

_LEN = struct.Struct("!I")
_PAYLOAD = b"x" * 32


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = _LEN.unpack(await reader.readexactly(4))
    return await reader.readexactly(n)


def _write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(_LEN.pack(len(data)) + data)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Countdown:
    """Readers that count frames in and resolve a future when the last of a round came."""

    def __init__(self) -> None:
        self.left = 0
        self.done: asyncio.Future | None = None
        self.frames: list[bytes] = []

    def start(self, expected: int) -> asyncio.Future:
        self.left, self.frames = expected, []
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    async def pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self.frames.append(await _read_frame(reader))
                self.left -= 1
                if self.left == 0 and self.done is not None and not self.done.done():
                    self.done.set_result(None)
        except (asyncio.IncompleteReadError, ConnectionError):
            return


class _Downstream:
    """The connections one process fans out to: each says hello (its pids), then its
    frames are counted by one ``_Countdown``; ``all_in`` once ``expected`` have said it."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.writers: list[asyncio.StreamWriter] = []
        self.hellos: list[bytes] = []
        self.replies = _Countdown()
        self.pumps: list[asyncio.Task] = []
        self.all_in = asyncio.get_running_loop().create_future()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        self.hellos.append(await _read_frame(reader))
        self.writers.append(writer)
        self.pumps.append(asyncio.create_task(self.replies.pump(reader)))
        if len(self.writers) == self.expected:
            self.all_in.set_result(None)

    def pids(self) -> list[bytes]:
        return [p for hello in self.hellos for p in hello.split(b",")]


# ------------------------------------------------------------------------------ members
def _member(connect) -> None:
    async def main() -> None:
        reader, writer = await connect()
        _nodelay(writer)
        _write_frame(writer, str(os.getpid()).encode())
        try:
            while True:
                _write_frame(writer, await _read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
    asyncio.run(main())


def _fork(child) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    return pid


# ------------------------------------------------------------------------------- agents
def _agent(controller_port: int, per_host: int, workdir: str) -> None:
    path = os.path.join(workdir, f"agent-{os.getpid()}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(per_host)
    for _ in range(per_host):
        _fork(lambda: _member(lambda: asyncio.open_unix_connection(path)))

    async def main() -> None:
        members = _Downstream(per_host)
        server = await asyncio.start_unix_server(members.accept, sock=listener)
        await members.all_in
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", controller_port)
        _nodelay(up_writer)
        _write_frame(up_writer, b",".join([str(os.getpid()).encode(), *members.pids()]))
        try:
            while True:
                frame = await _read_frame(up_reader)
                done = members.replies.start(per_host)
                for w in members.writers:
                    _write_frame(w, frame)
                await done
                _write_frame(up_writer, b"".join(members.replies.frames))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        await _hang_up(members.writers, members.pumps)
        server.close()
    asyncio.run(main())


async def _hang_up(writers: list[asyncio.StreamWriter], pumps: list[asyncio.Task]) -> None:
    """Close our ends and wait for the peers to close theirs, so no reader is cut off."""
    for w in writers:
        w.close()
    _, stuck = await asyncio.wait(pumps, timeout=10) if pumps else ((), ())
    for task in stuck:
        task.cancel()


# --------------------------------------------------------------------------- controller
def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


async def _controller(listener: socket.socket, conns: int, rounds: int) -> dict:
    down = _Downstream(conns)
    server = await asyncio.start_server(down.accept, sock=listener)
    await down.all_in
    writers, replies = down.writers, down.replies
    pids = [os.getpid(), *(int(p) for p in down.pids())]
    for _ in range(max(20, rounds // 10)):      # warm up
        done = replies.start(conns)
        for w in writers:
            _write_frame(w, _PAYLOAD)
        await done
    walls = []
    ticks0, own0 = _cpu_ticks(pids), time.process_time()
    for _ in range(rounds):
        t0 = time.perf_counter()
        done = replies.start(conns)
        for w in writers:
            _write_frame(w, _PAYLOAD)
        await done
        walls.append(time.perf_counter() - t0)
    ticks = _cpu_ticks(pids) - ticks0
    own = time.process_time() - own0
    await _hang_up(writers, down.pumps)
    server.close()
    hz = os.sysconf("SC_CLK_TCK")
    walls.sort()
    return {"median_ms": statistics.median(walls) * 1e3,
            "p10_ms": walls[len(walls) // 10] * 1e3, "p90_ms": walls[len(walls) * 9 // 10] * 1e3,
            "cpu_all_ms": ticks / hz / rounds * 1e3, "cpu_controller_ms": own / rounds * 1e3,
            "processes": len(pids)}


def run(shape: str, hosts: int, per_host: int, rounds: int) -> dict:
    """One run of ``shape`` (relay | direct) in forked processes; everything is reaped."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]
    children: list[int] = []
    with tempfile.TemporaryDirectory(prefix="hpcm-floor-") as workdir:
        if shape == "relay":
            for _ in range(hosts):
                children.append(_fork(lambda: _agent(port, per_host, workdir)))
            conns = hosts
        else:
            for _ in range(hosts * per_host):
                children.append(_fork(lambda: _member(
                    lambda: asyncio.open_connection("127.0.0.1", port))))
            conns = hosts * per_host
        try:
            result = asyncio.run(asyncio.wait_for(_controller(listener, conns, rounds), 300))
        finally:
            listener.close()
            deadline = time.monotonic() + 10
            for pid in children:        # they end when the controller hangs up
                while os.waitpid(pid, os.WNOHANG) == (0, 0):
                    if time.monotonic() > deadline:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        break
                    time.sleep(0.01)    # sleep: polling a child's exit, bounded by the deadline
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--shape", action="append", choices=("relay", "direct"),
                    help="repeatable; default both")
    args = ap.parse_args(argv)
    if args.hosts < 1 or args.per_host < 1 or args.rounds < 1:
        ap.error("--hosts, --per-host and --rounds take whole numbers of at least 1")
    cores = len(os.sched_getaffinity(0))
    print(f"| shape | members | processes | round median ms (p10-p90) | CPU of all processes "
          f"per round ms | / {cores} cores ms | controller CPU per round ms |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shape or ("relay", "direct"):
        r = run(shape, args.hosts, args.per_host, args.rounds)
        print(f"| {shape} | {args.hosts} x {args.per_host} | {r['processes']} | "
              f"{r['median_ms']:.1f} ({r['p10_ms']:.1f}-{r['p90_ms']:.1f}) | {r['cpu_all_ms']:.1f} | "
              f"{r['cpu_all_ms'] / cores:.1f} | {r['cpu_controller_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
