"""``shell(host_mesh)``: an interactive shell on one host of a mesh (Monarch's ``job.shell``).

The remote side is an actor that runs the user's shell on a pseudo-terminal and streams what
it writes back through a Port; the local side puts the terminal in raw mode (when stdin is
one), sends keystrokes and window sizes, and copies the output to stdout. The terminal is
restored and the remote shell ended whatever way this side stops (exit, Ctrl-C on the
controller, an error). Without a terminal (a pipe), lines go through as typed, so scripts
and tests can drive it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator

from ..actor.channel import Channel, Port
from ..actor.endpoint import Actor, endpoint
from ..runtime.context import context

CHUNK = 16 * 1024
#: Seconds the remote shell gets after SIGHUP before SIGKILL, when this side goes away.
STOP_GRACE_S = 1.0
#: Seconds a shell may go on reading the input it was sent after the client's input
#: ended (its foreground jobs are hung up meanwhile), before it is hung up itself.
IDLE_SHELL_GRACE_S = 10.0


def _exit_status(status: int) -> int:
    """A shell's status the way shells report it: 128 + signal for a signal."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def rank_env() -> dict[str, str]:
    """``HPCMESH_RANK_<dim>`` / ``HPCMESH_SIZE_<dim>`` of the host the shell runs on."""
    point = context().actor_instance.rank
    env = {f"HPCMESH_RANK_{k}": str(v) for k, v in point.items()}
    env.update({f"HPCMESH_SIZE_{k}": str(v) for k, v in point.extent.items()})
    return env


class ShellActor(Actor):
    """Runs one shell on a pseudo-terminal; output goes to ``out`` as ("data", bytes) and
    finally ("exit", status)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.master: int | None = None
        self.ended = threading.Event()      # the shell has exited (its status was sent)

    @endpoint
    def start(self, out: Port, env: dict | None, workdir: str | None, client_cwd: str,
              size: tuple[int, int], editing: bool = True) -> None:
        import fcntl
        import pty
        import struct
        import termios

        if workdir is not None and not os.path.isdir(workdir):
            raise FileNotFoundError(f"shell: workdir {workdir!r} does not exist on this host")
        shell = os.environ.get("SHELL") or "/bin/bash"
        child_env = {**os.environ, **rank_env(), **(env or {})}
        pid, master = pty.fork()
        if pid == 0:                               # the child: the pty is its terminal
            try:
                if workdir is not None:
                    os.chdir(workdir)
                elif os.path.isdir(client_cwd):
                    os.chdir(client_cwd)
                # typed from a pipe: no line editor, so that the ^D sent at the end of
                # input is the end of input (readline, in raw mode, would drop it)
                argv = [shell] + ([] if editing or not shell.endswith("bash")
                                  else ["--noediting"]) + ["-i"]
                os.execve(shell, argv, child_env)
            finally:
                os._exit(127)
        self.pid, self.master = pid, master
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        threading.Thread(target=self._pump, args=(out,), daemon=True,
                         name="hpcmesh-shell-out").start()

    def _pump(self, out: Port) -> None:
        """Copy the terminal's output to the client until the shell ends, then its status."""
        while True:
            try:
                data = os.read(self.master, CHUNK)
            except OSError:                       # EIO: the shell and its children closed it
                data = b""
            if not data:
                break
            out.send(("data", data))
        _, status = os.waitpid(self.pid, 0)
        self.ended.set()
        os.close(self.master)
        out.send(("exit", _exit_status(status)))

    @endpoint
    def write(self, data: bytes) -> None:
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.write(self.master, data)

    @endpoint
    def resize(self, rows: int, columns: int) -> None:
        import fcntl
        import struct
        import termios
        if self.master is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.master, termios.TIOCSWINSZ,
                            struct.pack("HHHH", rows, columns, 0, 0))

    @endpoint
    def end_input(self) -> None:
        """The client's input ended (a pipe's end): stop what runs, as Monarch does, but
        let the shell finish reading what it was sent. It gets ^D, which ends it once it
        waits for a command; a job in the terminal's foreground (a ``sleep 30``, which no
        ^D reaches) is hung up (SIGHUP, SIGKILL after STOP_GRACE_S), now or when it comes
        to the foreground; a shell still busy after IDLE_SHELL_GRACE_S is hung up too."""
        import time
        if self.pid is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.master, b"\x04")
        deadline = time.monotonic() + IDLE_SHELL_GRACE_S
        hung: dict[int, float] = {}       # foreground group -> when it was hung up
        while not self.ended.wait(0.05):
            try:
                fg = os.tcgetpgrp(self.master)
            except OSError:               # the terminal is gone: the shell is ending
                continue
            if fg > 1 and fg not in (self.pid, os.getpgrp()):
                if fg not in hung:
                    hung[fg] = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(fg, signal.SIGHUP)
                elif time.monotonic() - hung[fg] > STOP_GRACE_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(fg, signal.SIGKILL)
            elif time.monotonic() > deadline:
                self._hang_up()
                return

    @endpoint
    def hang_up(self) -> None:
        """The client went away: SIGHUP the shell's process group, SIGKILL after a grace."""
        self._hang_up()

    def _hang_up(self) -> None:
        """SIGHUP the shell's process group and the terminal's foreground one (a job the
        shell started in a group of its own), then SIGKILL what is left after a grace."""
        import time
        if self.pid is None or self.ended.is_set():
            return
        groups = {self.pid}
        with contextlib.suppress(OSError):
            groups.add(os.tcgetpgrp(self.master))
        groups.discard(os.getpgrp())            # never this process's own group
        for sig in (signal.SIGHUP, signal.SIGKILL):
            for g in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(g, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline:
                if not _any_alive(groups):
                    return
                time.sleep(0.05)


def _any_alive(groups: set[int]) -> bool:
    for g in groups:
        try:
            os.killpg(g, 0)
            return True
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
    return False


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a BrokenPipeError when its reader has gone), waiting for
    room when ``fd`` was left non-blocking by whoever started this process."""
    import select
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])


def _window_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    """Keystrokes as they come (no local echo or line editing: the remote shell does it)."""
    import termios
    import tty
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def shell(host_mesh_singleton: Any, *, env: dict[str, str] | None = None,
          workdir: str | None = None) -> int:
    """Run an interactive shell on a one-host HostMesh; returns the shell's exit status.
    ``workdir``: where it starts (default: this client's directory, if the host has it)."""
    if host_mesh_singleton.extent.nelem != 1:
        raise ValueError(f"shell requires a singleton HostMesh (one host), got "
                         f"{dict(host_mesh_singleton.extent)}; slice the mesh to one host "
                         f"first, e.g. hosts.slice(hosts=0)")
    # The remote terminal's output goes to stdout's file itself, unbuffered: a reader that
    # goes away (a broken pipe) fails the write here, with nothing left in sys.stdout's
    # buffer to fail again at exit. What was printed before goes first.
    sys.stdout.flush()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    interactive = os.isatty(stdin)
    procs = host_mesh_singleton.spawn_procs()
    try:
        remote = procs.spawn("shell", ShellActor)
        out_port, received = Channel.open()
        remote.start.call_one(out_port, env, workdir, os.getcwd(), _window_size(stdin),
                              interactive).get()
        stop = threading.Event()

        def forward_input() -> None:
            while not stop.is_set():
                try:
                    data = os.read(stdin, CHUNK)
                except OSError:
                    return
                if not data:                      # a pipe ended: end of input
                    remote.end_input.broadcast()
                    return
                remote.write.broadcast(data)

        resized = None
        if interactive:
            resized = signal.signal(signal.SIGWINCH, lambda *_: remote.resize.broadcast(
                *_window_size(stdin)))
        with _raw_terminal(stdin) if interactive else contextlib.nullcontext():
            threading.Thread(target=forward_input, daemon=True, name="hpcmesh-shell-in").start()
            try:
                while True:
                    kind, value = received.recv().get()
                    if kind == "exit":
                        return value
                    _write_all(stdout, value)
            finally:
                stop.set()
                if resized is not None:
                    signal.signal(signal.SIGWINCH, resized)
                remote.hang_up.call_one().get(timeout=10)
    finally:
        procs.stop().get()
