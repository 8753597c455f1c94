"""hpcmesh.job.shell: an interactive shell on one host, from a pipe and from a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from hpcmesh.actor import Extent, HostMesh, this_host
from hpcmesh.shapes import Shape
from hpcmesh.job import shell

CLIENT = ("import sys\n"
          "from hpcmesh.job import shell\n"
          "from hpcmesh.actor import this_host\n"
          "sys.exit(shell(this_host(), env={'FOO': 'bar'}, workdir=sys.argv[1]))\n")


def test_from_a_pipe_env_workdir_and_exit_status(tmp_path):
    r = subprocess.run([sys.executable, "-c", CLIENT, str(tmp_path)],
                       input="echo $((6*7)) $FOO $HPCMESH_SIZE_hosts; pwd\nexit 3\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "42 bar" in r.stdout and str(tmp_path) in r.stdout, r.stdout


def test_end_of_input_ends_the_shell(tmp_path):
    r = subprocess.run([sys.executable, "-c", CLIENT, str(tmp_path)], input="true\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_end_of_input_stops_the_foreground_process(tmp_path):
    """Monarch's end of input: what still runs (a sleep, which no ^D reaches) is hung up,
    and the shell's status says so (128 + SIGHUP)."""
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CLIENT, str(tmp_path)], input="sleep 60\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 129, r.stdout + r.stderr
    assert time.monotonic() - start < 30, "the sleep ran on after the end of input"


BUFFERED_CLIENT = (
    "import io, sys\n"
    "from hpcmesh.job import shell\n"
    "from hpcmesh.actor import this_host\n"
    "sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', closefd=False),\n"
    "                                                buffer_size=1 << 20))\n"
    "try:\n"
    "    shell(this_host())\n"
    "except ConnectionError as e:\n"
    "    print('failed with', type(e).__name__, file=sys.stderr)\n"
    "    sys.exit(3)\n")


def test_a_reader_gone_leaves_nothing_buffered_in_stdout():
    """A broken pipe fails shell() (a ConnectionError, as Monarch's) and nothing of the
    remote output is left in sys.stdout's buffer to fail again when Python exits."""
    run = subprocess.Popen([sys.executable, "-c", BUFFERED_CLIENT], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        run.stdin.write(b"for i in $(seq 1 5000); do echo line $i; sleep 0.002; done\n")
        run.stdin.flush()
        assert run.stdout.read(200)
        run.stdout.close()
        err = run.stderr.read().decode()
        assert run.wait(timeout=120) == 3, err
    finally:
        run.stdin.close()
        if run.poll() is None:
            run.kill()
    assert "failed with BrokenPipeError" in err and "Exception ignored" not in err, err


def _read_until(fd: int, needle: bytes | tuple[bytes, ...], timeout: float = 60) -> bytes:
    needles = needle if isinstance(needle, tuple) else (needle,)
    seen = b""
    deadline = time.monotonic() + timeout
    while not any(n in seen for n in needles):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{needle!r} never came; got {seen[-500:]!r}")
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_from_a_terminal_raw_keys_window_size_and_status(tmp_path):
    pid, master = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", CLIENT, str(tmp_path)])
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 101, 0, 0))
        # type once the remote prompt is there (raw mode drops what was typed before it,
        # for a person as for this test)
        _read_until(master, (b"# ", b"$ "))
        os.write(master, b"stty size; echo mark$((1+1))\r")
        out = _read_until(master, b"mark2")
        assert b"31 101" in out, out
        os.write(master, b"exit 5\r")
        _read_until(master, b"exit")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 5


def test_bad_input():
    two = HostMesh(this_host().refs * 2, Shape.from_extent(Extent({"hosts": 2})))
    with pytest.raises(ValueError, match=r"singleton HostMesh \(one host\), got "
                                         r"\{'hosts': 2\}.*slice"):
        shell(two)
    r = subprocess.run([sys.executable, "-c", CLIENT, "/no/such/dir"], input="exit 0\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "workdir '/no/such/dir' does not exist" in r.stderr, r.stderr


def test_a_shell_whose_process_dies_ends_instead_of_waiting_for_ever(tmp_path):
    """kill -9 of the process the remote terminal runs in: shell() fails, naming it; the
    client neither waits for output that can never come nor outlives its input."""
    run = subprocess.Popen([sys.executable, "-c", CLIENT, str(tmp_path)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        run.stdin.write(b'echo SHELL""PID=$PPID END\n')     # (the echo of the line differs)
        run.stdin.flush()
        seen = _read_until(run.stdout.fileno(), b" END", timeout=60)
        while b"SHELLPID=" not in seen:
            seen += _read_until(run.stdout.fileno(), b" END", timeout=60)
        pid = int(seen.split(b"SHELLPID=")[1].split()[0])
        os.kill(pid, 9)
        run.wait(timeout=30)        # stdin is still open: only the death can end it
        assert run.returncode != 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
