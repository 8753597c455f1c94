"""The zygote itself: the process that imported the runtime once and forks actor processes.

``python -P -m hpcmesh.runtime.process.forkserver`` is started by ``zygote.ZygoteClient`` on
the agent; this module is that process's main, kept apart from the agent-side client so that
the agent never imports the actor process entry point (``proc``) and ``proc`` never sees this
loop. Only that client starts it, from the same install: its module name is no contract.
The protocol (``encode``, ``MessageReader``) is in ``zygote.py``.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import sys
import threading

from .bootstrap import TERM_NOTICE_VAR
from .zygote import PRELOAD_VAR, ZYGOTE_FD_VAR, MessageReader, encode, preload_names


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


_inherited_fds: list[int] = []     # the zygote's own fds, closed in each child


def _child(env: dict, cwd: str, out_fd: int, err_fd: int) -> None:
    """In the forked child: become a process group of its own, with the given stdio and env.

    A process group, not a session: ``killpg`` reaches what the process starts, and a
    terminal's Ctrl-C (sent to the foreground group) reaches only the controller. A new
    session would also put the process in a new scheduler autogroup (Linux makes one per
    session when ``kernel.sched_autogroup_enabled`` is 1, the default on Debian): every
    wake-up then goes through one more level of group scheduling, and the controller's
    runtime thread, woken by replies, competes as one group against each actor. Measured
    here: a gather over 4 actors 5 % faster with the actors in the controller's session."""
    try:
        signal.set_wakeup_fd(-1)
        for fd in _inherited_fds:
            os.close(fd)
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)       # the agent's directory now, as an exec'd process would have
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # (ignored by the zygote: serve())
        sys.argv = [sys.argv[0]]
        from . import proc
        proc.main()            # ends with os._exit, or SystemExit(0) once stopped cleanly
    except SystemExit:
        raise       # up and out of this zygote's frames: the interpreter's exit (main())
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
    os._exit(70)


_preload_tried: set[str] = set()


def preload(env: dict) -> None:
    """Import, in this zygote, the modules a request's ``env`` names (``zygote.py`` says
    which and why), each once; one that fails is said once on stderr (the agent's log) and
    left to each process to import, one that starts a thread is said too."""
    for name in preload_names(env):
        if name in _preload_tried:
            continue
        _preload_tried.add(name)
        if name in sys.modules:
            continue
        threads = threading.active_count()
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - a user's module: any error, never fatal
            print(f"hpcmesh fork server: could not import {name!r} before forking "
                  f"({type(e).__name__}: {e}); each process imports it itself",
                  file=sys.stderr, flush=True)
            continue
        if threading.active_count() > threads:
            print(f"hpcmesh fork server: importing {name!r} started a thread, and the "
                  f"processes forked from now on copy it mid-flight (a lock it held stays "
                  f"held in them): take {name!r} out of {PRELOAD_VAR} if they hang",
                  file=sys.stderr, flush=True)


def serve(sock: socket.socket) -> None:
    """The zygote's loop: fork on request, report exits, stop when the agent goes away."""
    from . import proc  # noqa: F401 - the point: import once, fork many times
    wake_r, wake_w = os.pipe()
    _inherited_fds.extend((wake_r, wake_w))
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    if os.environ.get(TERM_NOTICE_VAR):
        # a notice to its agent (a Slurm step's SIGTERM): were it to end, the exits of the
        # processes it forked would go unreported; the agent ends it with SIGKILL
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reader = MessageReader()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                sock.sendall(encode(("exit", pid, _returncode(status))))
        if sock in ready:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 16)
            except OSError:
                data = b""
            if not data:
                return
            for msg in reader.feed(data, fds):
                _handle(sock, msg, reader)


def _handle(sock: socket.socket, msg: tuple, reader: MessageReader) -> None:
    kind, req_id, env, cwd = msg
    out_fd, err_fd = reader.fds[:2]
    del reader.fds[:2]
    preload(env)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except OSError as e:
        os.close(out_fd)
        os.close(err_fd)
        sock.sendall(encode(("failed", req_id, f"fork failed: {e}")))
        return
    if pid == 0:
        sock.close()
        _child(env, cwd, out_fd, err_fd)
    try:
        # The child does this too; doing it here as well means the group exists before the
        # agent hears of the pid, so a killpg right away (a stop during start) finds it.
        os.setpgid(pid, pid)
    except OSError:
        pass    # the child did it first and exec'd, or has exited already
    os.close(out_fd)
    os.close(err_fd)
    sock.sendall(encode(("spawned", req_id, pid)))


def main() -> None:
    fd = int(os.environ.pop(ZYGOTE_FD_VAR))
    sock = socket.socket(fileno=fd)
    zygote = os.getpid()
    try:
        serve(sock)
    finally:
        if os.getpid() == zygote:
            os._exit(0)
        # else a forked actor process stopped cleanly: its SystemExit goes on up, and
        # Python's exit runs its finalizers (nothing of the zygote's is left to run)


if __name__ == "__main__":
    main()
