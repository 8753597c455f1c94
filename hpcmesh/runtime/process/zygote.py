"""A fork server for actor processes: start them in milliseconds instead of ~100 ms.

Starting ``python -m hpcmesh.runtime.proc`` costs an interpreter start plus the
runtime's imports (asyncio, cloudpickle, ...), and N of them at once contend
for the host's cores. The host agent instead keeps one *zygote*: a
single-threaded process that imported the runtime once and forks a child per
request. The child takes the environment the agent built (the four steps of
the bootstrap rules still apply: the agent computes the whole environment) and
the pipes it passed, then runs the process entry point exactly as a fresh
interpreter would. Only the default bootstrap command goes through the zygote;
any other program is started with a plain exec.

Protocol over a Unix stream socket, each message a 4-byte length + pickle of
plain values; file descriptors ride along with SCM_RIGHTS:

    agent -> zygote : ("spawn", req_id, env, cwd) + fds [stdout_w, stderr_w]
                      (first the zygote imports what env's ZYGOTE_IMPORTS_VAR and
                      PRELOAD_VAR name, once: see below)
    zygote -> agent : ("spawned", req_id, pid) | ("failed", req_id, text)
    zygote -> agent : ("exit", pid, returncode)   (Popen-style: -N for signal N)
"""

from __future__ import annotations

import os
import pickle
import socket
import struct

_LEN = struct.Struct("!I")
ZYGOTE_FD_VAR = "HPCMESH_ZYGOTE_FD"
#: Modules the zygote imports before it forks a request's process (comma-separated, in the
#: request's environment), so that every process of the host has them without paying the
#: import: ``ZYGOTE_IMPORTS_VAR`` names what the spawning layer knows each process will need
#: (the actor API every actor process unpickles its actor with: ~19 ms of CPU a process,
#: 256 of them on a host's cores at once), ``PRELOAD_VAR`` what the user adds (installed
#: packages: ``torch``, ``numpy``; not modules of the job's folder, which the zygote does not
#: have on its path). A module that fails to import is left to each process and said once
#: on the agent's log; one that starts a thread is said there too (the forks copy it).
ZYGOTE_IMPORTS_VAR = "HPCMESH_ZYGOTE_IMPORTS"
PRELOAD_VAR = "HPCMESH_PRELOAD"


def preload_names(env: dict) -> list[str]:
    """The modules ``env`` asks the zygote to import, in order, each once."""
    names: list[str] = []
    for var in (ZYGOTE_IMPORTS_VAR, PRELOAD_VAR):
        for name in env.get(var, "").split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def encode(msg: tuple) -> bytes:
    data = pickle.dumps(msg, 5)
    return _LEN.pack(len(data)) + data


class MessageReader:
    """Splits a byte stream into messages (pure; the caller does the reading)."""

    def __init__(self):
        self._buf = b""
        self.fds: list[int] = []

    def feed(self, data: bytes, fds: list[int] = ()) -> list[tuple]:
        self._buf += data
        self.fds.extend(fds)
        out = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if len(self._buf) < _LEN.size + n:
                break
            out.append(pickle.loads(self._buf[_LEN.size:_LEN.size + n]))
            self._buf = self._buf[_LEN.size + n:]
        return out


class ZygoteProcess:
    """The agent's handle on a process the zygote forked (the subset of Popen it uses)."""

    def __init__(self, pid: int, stdout, stderr):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class ZygoteClient:
    """Agent side: starts the zygote, asks it to fork, and hears about exits.

    Lives on the agent's event loop. If the zygote dies, ``alive`` turns False and
    the agent goes back to plain exec."""

    def __init__(self, loop, on_exit):
        import asyncio
        import itertools
        import subprocess

        from ...private_files.modules import python_module
        from . import placement
        self._asyncio = asyncio
        self.loop = loop
        self.on_exit = on_exit
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, **{ZYGOTE_FD_VAR: str(theirs.fileno())})
        with placement.spawning():
            self.popen = subprocess.Popen(python_module("hpcmesh.runtime.process.forkserver"),
                                          pass_fds=[theirs.fileno()], env=env,
                                          stdin=subprocess.DEVNULL, process_group=0)
        theirs.close()
        self.sock = ours
        self._reader = MessageReader()
        self._pending: dict[int, object] = {}
        self._ids = itertools.count(1)
        self.alive = True
        loop.add_reader(ours.fileno(), self.on_readable)

    async def spawn(self, env: dict) -> ZygoteProcess:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req = next(self._ids)
        fut = self.loop.create_future()
        self._pending[req] = fut
        try:
            socket.send_fds(self.sock, [encode(("spawn", req, env, os.getcwd()))],
                            [out_w, err_w])
        except OSError:
            self._pending.pop(req, None)
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            pid = await fut
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        return ZygoteProcess(pid, open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0))

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._died()
            return
        for msg in self._reader.feed(data):
            if msg[0] == "spawned":
                fut = self._pending.pop(msg[1], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg[2])
            elif msg[0] == "failed":
                fut = self._pending.pop(msg[1], None)
                if fut is not None and not fut.done():
                    fut.set_exception(OSError(msg[2]))
            elif msg[0] == "exit":
                # a loop turn later: a process that died at once has its fork's report and
                # its exit's read together, and its spawner, woken by the first, notes its
                # pid in that turn (else the exit found no process, nothing reported it,
                # and its spawn waited for it for ever: issue 30)
                self.loop.call_soon(self.on_exit, msg[1], msg[2])

    def _died(self) -> None:
        self.alive = False
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (ValueError, OSError):
            pass
        self.sock.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(OSError("the zygote (fork server) exited"))
        self._pending.clear()

    def close(self) -> None:
        """Stop the zygote (its children are not touched) and reap it."""
        import subprocess
        if self.alive:
            self._died()
        try:
            self.popen.kill()
            self.popen.wait(timeout=2.0)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
