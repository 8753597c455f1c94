"""What every hpcmesh FUSE process shares: its mount options, and its life tied to a pipe.

A filesystem runs as a process of its own (libfuse's loop takes its main thread and its
signal handlers). Its owner holds the write end of its stdin: lines on it are commands,
and its end (the owner asked, or died) unmounts the filesystem, which ends the process.
``auto_unmount`` covers the rest: ``fusermount3`` unmounts as soon as the process is gone,
even by SIGKILL.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
from typing import Callable

from ..errors import HpcmeshError

#: seconds the kernel may cache a lookup or attributes: how long a change may take to show
ATTR_TIMEOUT = 1.0


def unmount(mountpoint: str) -> None:
    """Detach the mount at once (lazily: files still open keep working until closed)."""
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _serve_commands(mountpoint: str, on_command: Callable[[str, str], str] | None) -> None:
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if on_command is None:
            continue
        try:
            answer = on_command(cmd, arg)
        except Exception as e:  # noqa: BLE001 - answered to the owner, which raises it
            answer = f"error {type(e).__name__}: {e}"
        print(answer, flush=True)
    unmount(mountpoint)


def run(operations, mountpoint: str, subtype: str,
        on_command: Callable[[str, str], str] | None = None) -> None:
    """Mount ``operations`` read-only at ``mountpoint`` and serve until stdin ends. The
    operations print ``mounted`` from their ``init`` (the kernel has the mount then)."""
    import mfusepy
    threading.Thread(target=_serve_commands, args=(mountpoint, on_command), daemon=True,
                     name="hpcmesh-fuse-owner").start()
    options = dict(foreground=True, ro=True, default_permissions=True, auto_unmount=True,
                   fsname="hpcmesh-mount", subtype=subtype, auto_cache=True,
                   attr_timeout=ATTR_TIMEOUT, entry_timeout=ATTR_TIMEOUT,
                   negative_timeout=ATTR_TIMEOUT)
    if os.getuid() == 0:
        options["allow_other"] = True     # other users' processes on the node may read it
    mfusepy.FUSE(operations, mountpoint, **options)


# -- the owner's side ---------------------------------------------------------------------
#: seconds a filesystem process may take to report its mount, or to answer a command
ANSWER_TIMEOUT = 30.0


class MountError(HpcmeshError, OSError):
    """A mount could not be made or kept; the message names the host and the fix."""


def fuse_problem() -> str | None:
    """Why FUSE cannot be used on this host, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist on this host (no FUSE in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"/dev/fuse cannot be opened here ({e.strerror})"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian/Ubuntu: apt install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a missing libfuse raises OSError, not ImportError
        return (f"the mfusepy package cannot be loaded ({e}); install it with "
                f"pip install 'hpcmesh[mount]'")
    return None


def mount_fstype(path: str) -> str | None:
    """The filesystem type mounted exactly at ``path`` in this mount namespace, or None."""
    path = os.path.abspath(path)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:                    # the last mount at a path is the one seen there
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and _unescape(fields[4]) == path:
                found = right.split()[0]
    return found


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def ready_mount_point(path: str, subtype: str, where: str, what: str) -> None:
    """Make ``path`` a usable mount point or raise MountError saying why not: a mount of
    ours left by a client that is gone is detached; a directory that holds files is refused
    (mounting would hide them). ``where``/``what`` name the host and the API in errors."""
    if mount_fstype(path) == f"fuse.{subtype}":
        unmount(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise MountError(f"{what}: the mount point {path} on {where} is a file, not a "
                         f"directory")
    os.makedirs(path, exist_ok=True)
    held = sorted(os.listdir(path))
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise MountError(f"{what}: the mount point {path} on {where} already holds files "
                         f"({shown}); mounting would hide them. Give an empty or new "
                         f"directory")


class FuseProcess:
    """A filesystem process this side owns: started, waited for, told, stopped."""

    def __init__(self, argv: list[str], mountpoint: str, where: str, pass_fds=()):
        self.mountpoint = mountpoint
        self.where = where
        self.proc = subprocess.Popen([sys.executable, *argv, mountpoint], pass_fds=pass_fds,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.expect("mounted", "come up")

    def answer(self, what: str) -> str:
        """Its next line, within ANSWER_TIMEOUT; MountError with its stderr if none."""
        proc = self.proc
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], ANSWER_TIMEOUT)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line:
            return line
        if proc.poll() is None:
            proc.kill()
        err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        proc.wait()
        raise MountError(f"the FUSE filesystem at {self.mountpoint} on {self.where} did not "
                         f"{what} within {ANSWER_TIMEOUT:g} s (exit status {proc.returncode})"
                         f": {err[-2000:] or 'no output'}")

    def expect(self, want: str, what: str) -> None:
        line = self.answer(what)
        if line != want:
            raise MountError(f"the FUSE filesystem at {self.mountpoint} on {self.where}: "
                             f"{line}")

    def command(self, line: str, what: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()
        self.expect("ok", what)

    def stop(self) -> None:
        """Close its stdin: it unmounts and exits (killed if it has not within 10 s)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            unmount(self.mountpoint)
