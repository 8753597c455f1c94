"""The floor: plain asyncio streams echo over loopback, client and server in separate processes.

Frames are a 4-byte big-endian length prefix plus the payload (32 bytes, the
same ``SMALL`` payload the actor benchmarks send). The server runs in a child
process started with ``subprocess`` (not fork of this interpreter's state).

Also ``gather4_paired``: one round trip against a gather over 4 servers (4 processes,
``asyncio.gather`` of 4 round trips), in alternating blocks: what the gather ratio is
for plain asyncio on this machine.

Variants (the first is *the* floor the table's ratios use):
  tcp/asyncio  - stock asyncio event loop on both sides, TCP over 127.0.0.1, TCP_NODELAY
  tcp/uvloop   - same with uvloop on both sides (only if uvloop is importable)
  unix/asyncio - stock asyncio over a Unix socket (hpcmesh talks over Unix sockets on one host)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

_LEN = struct.Struct("!I")


# ------------------------------------------------------------------------ server side
async def _serve(kind: str, where: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readexactly(4)
                (n,) = _LEN.unpack(head)
                body = await reader.readexactly(n)
                writer.write(head + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    if kind == "unix":
        server = await asyncio.start_unix_server(handle, path=where)
        print("READY", flush=True)
    else:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        # Exit when the parent closes our stdin.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


def server_main(kind: str, use_uvloop: bool, where: str) -> None:
    if use_uvloop:
        import uvloop
        uvloop.install()
    asyncio.run(_serve(kind, where))


# ------------------------------------------------------------------------ client side
async def open_echo(kind: str, where):
    """A connection to an echo server (``where``: a TCP port or a Unix socket path);
    returns (round_trip, close)."""
    if kind == "unix":
        reader, writer = await asyncio.open_unix_connection(where)
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", where)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = _LEN.pack(len(C.SMALL)) + C.SMALL

    async def round_trip() -> bytes:
        writer.write(frame)
        head = await reader.readexactly(4)
        return await reader.readexactly(_LEN.unpack(head)[0])
    return round_trip, writer.close


async def _client(kind: str, where, iters: int, warmup: int) -> dict:
    round_trip, close = await open_echo(kind, where)
    samples = []
    for i in range(warmup + iters):
        t0 = C.now()
        body = await round_trip()
        t1 = C.now()
        if i >= warmup:
            samples.append(t1 - t0)
    assert body == C.SMALL
    close()
    return C.lat_stats(samples)


async def _client_gather(ports: list[int], rounds: int) -> dict:
    """call_one vs a gather over 4 servers, in alternating blocks (as the actor runs)."""
    conns = [await open_echo("tcp", port) for port in ports]
    out = await C.paired(conns[0][0], lambda: asyncio.gather(*(rt() for rt, _ in conns)),
                         rounds)
    for _, close in conns:
        close()
    return out


def start_server(kind: str, use_uvloop: bool, path: str) -> tuple[subprocess.Popen, object]:
    srv = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--server", kind,
                            "1" if use_uvloop else "0", path],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = srv.stdout.readline().split()
    if not line or line[0] != "READY":
        srv.kill()
        raise RuntimeError(f"echo server did not start ({line!r})")
    return srv, (path if kind == "unix" else int(line[1]))


def stop_server(srv: subprocess.Popen) -> None:
    srv.stdin.close()
    try:
        srv.wait(5)
    except subprocess.TimeoutExpired:
        srv.kill()


def run_gather(rounds: int) -> dict:
    servers = []
    try:
        for _ in range(4):
            servers.append(start_server("tcp", False, ""))
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(_client_gather([w for _, w in servers], rounds))
        finally:
            loop.close()
    finally:
        for srv, _ in servers:
            stop_server(srv)


def run_variant(kind: str, use_uvloop: bool, iters: int, warmup: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="hpcmesh-bench-")
    path = os.path.join(tmp, "echo.sock")
    srv, where = start_server(kind, use_uvloop, path)
    try:
        if use_uvloop:
            import uvloop
            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(_client(kind, where, iters, warmup))
        finally:
            loop.close()
    finally:
        stop_server(srv)
        shutil.rmtree(tmp, ignore_errors=True)   # the socket may be gone already


def main() -> None:
    args = C.parse_args()
    cfg = C.config(args.quick)
    rep = C.Report("floor")
    rep.note(f"asyncio streams echo, 4-byte length prefix + {len(C.SMALL)}-byte payload, "
             f"server in a separate process; {cfg['lat_iters']} timed round trips after "
             f"{cfg['warmup']} warm-up")
    try:
        import uvloop
        have_uv = True
        rep.version("uvloop", uvloop)
    except ImportError:
        have_uv = False
    variants = [("tcp", False, "rt_await")]
    if have_uv:
        variants.append(("tcp", True, "rt_tcp_uvloop"))
    variants.append(("unix", False, "rt_unix_asyncio"))
    for kind, uv, key in variants:
        rep.run(key, lambda kind=kind, uv=uv, key=key:
                rep.put(key, run_variant(kind, uv, cfg["lat_iters"], cfg["warmup"])))
    rep.run("gather4_paired", lambda: rep.put("gather4_paired", run_gather(cfg["paired_rounds"])))
    rep.emit()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        server_main(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
    else:
        main()
