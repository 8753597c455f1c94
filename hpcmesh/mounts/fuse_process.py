"""What every hpcmesh FUSE process shares: its mount options, and its life tied to a pipe.

A filesystem runs as a process of its own (libfuse's loop takes its main thread and its
signal handlers). Its owner holds the write end of its stdin: lines on it are commands,
and its end (the owner asked, or died) unmounts the filesystem, which ends the process.
``auto_unmount`` covers the rest: ``fusermount3`` unmounts as soon as the process is gone,
even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Callable, Iterator

from ..errors import HpcmeshError
from ..private_files import TRUST, Opened, explain, walk
from ..private_files.modules import python_module
from ..runtime.process.exit_actions import mounts_at, register_unmount, unmount, unmount_if_ours

#: seconds the kernel may cache that a path does not exist (and, where a filesystem cannot
#: invalidate what changed, any lookup): how long a new file may take to show
ATTR_TIMEOUT = 1.0
#: seconds the kernel may cache lookups and attributes of a filesystem that invalidates
#: what changed itself (``fuse_tree`` on libfuse 3): an hour, so a warm ``import torch``
#: does not ask the filesystem again for each of its thousands of files
CACHED_TIMEOUT = 3600.0


def _serve_commands(mountpoint: str, fsname: str,
                    on_command: Callable[[str, str], str] | None) -> None:
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if on_command is None:
            continue
        try:
            answer = on_command(cmd, arg)
        except Exception as e:  # noqa: BLE001 - answered to the owner, which raises it
            answer = f"error {type(e).__name__}: {e}"
        print(answer, flush=True)
    unmount_if_ours(mountpoint, fsname)


def libfuse():
    """mfusepy's ctypes handle on libfuse: it exposes none in public, and the cache
    invalidation below is only there (the one place hpcmesh reads it)."""
    import mfusepy
    return mfusepy._libfuse


def invalidator():
    """A function that drops the kernel's cached lookup, attributes and pages of a path of
    the filesystem this process serves (libfuse 3's ``fuse_invalidate_path``), or None
    where libfuse lacks it. Call ``invalidator()`` from inside a filesystem callback (it
    needs the filesystem's handle, which only a callback's context has)."""
    import ctypes
    lib = libfuse()
    if not hasattr(lib, "fuse_invalidate_path"):
        return None
    fuse = lib.fuse_get_context().contents.fuse
    lib.fuse_invalidate_path.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    lib.fuse_invalidate_path.restype = ctypes.c_int

    def invalidate(path: str) -> None:
        lib.fuse_invalidate_path(fuse, path.encode("utf-8", "surrogateescape"))
    return invalidate


def run(operations, mountpoint: str, subtype: str, fsname: str,
        on_command: Callable[[str, str], str] | None = None,
        cache_timeout: float = ATTR_TIMEOUT) -> None:
    """Mount ``operations`` read-only at ``mountpoint`` and serve until stdin ends. The
    operations print ``mounted`` from their ``init`` (the kernel has the mount then).
    ``cache_timeout``: how long the kernel keeps lookups and attributes (longer only for a
    filesystem that invalidates what changes)."""
    import mfusepy
    threading.Thread(target=_serve_commands, args=(mountpoint, fsname, on_command), daemon=True,
                     name="hpcmesh-fuse-owner").start()
    options = dict(foreground=True, ro=True, default_permissions=True, auto_unmount=True,
                   fsname=fsname, subtype=subtype, auto_cache=True,
                   attr_timeout=cache_timeout, entry_timeout=cache_timeout,
                   negative_timeout=ATTR_TIMEOUT)
    # No allow_other: the job's processes run as the user who mounts, and with it another
    # user of the node could read the job's code and data through the mount (issue 28).
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
    """The filesystem type mounted at ``path`` in this mount namespace, or None."""
    found = mounts_at(path)
    return found[-1][0] if found else None


def ready_mount_point(path: str, subtype: str, where: str, what: str,
                      busy_hint: str = "") -> None:
    """Make ``path`` a usable mount point or raise MountError saying why not. It must be a
    folder of this user's own that no other user can redirect (``open_mount_point``: the
    way to it is root's or ours, it is never a symlink; missing, it is made 0700): a mount
    there would otherwise land where they chose, and the interpreter a mesh starts with
    under it be theirs. A mount of ours left by a client that is gone is detached; a
    folder that holds files is refused (mounting would hide them; ``busy_hint`` is added to
    that error). ``where``/``what`` name the host and the API in errors."""
    if mount_fstype(path) == f"fuse.{subtype}":
        unmount(path)
    named = _mount_point(path, where, what)
    try:
        with open_mount_point(path, named, create=True) as d:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=d.fd)
            try:
                held = sorted(os.listdir(fd))
            finally:
                os.close(fd)
    except OSError as e:
        raise MountError(explain(e, named)) from None
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise MountError(f"{what}: the mount point {path} on {where} already holds files "
                         f"({shown}); mounting would hide them. Give an empty or new "
                         f"directory{busy_hint}")


def open_mount_point(path: str, what: str, create: bool = False) -> Opened:
    """The folder ``path``, reached through folders no other user can change
    (``private_files.walk``: ``PASS`` on the way), itself this user's own, writable by nobody
    else and never a symlink (``TRUST``); ``create``: made 0700 with the folders missing on
    the way. ``what`` starts each error."""
    return walk(path, what=what, last=TRUST, create=create)


def _mount_point(path: str, where: str, what: str) -> str:
    return f"{what}: the mount point {path} on {where}"


def _dev(dev: int) -> str:
    return f"{os.major(dev)}:{os.minor(dev)}"


class FuseProcess:
    """A filesystem process this side owns: started, waited for, told, stopped. Its mount's
    source (``fsname``) is unique, so an unmount can tell this mount from a later one at
    the same path; where an agent started this process, the agent is asked to unmount it
    after this process is gone, however it went (``runtime.process.exit_actions``). The mount's
    root (device, inode) is noted once it is up: ``opened_root`` checks that the mount
    point still leads there, whatever became of the path since."""

    def __init__(self, module: str, args: list[str], mountpoint: str, where: str, what: str,
                 pass_fds=()):
        self.mountpoint = mountpoint
        self.where = where
        self.what = what
        self.fsname = f"hpcmesh-{uuid.uuid4().hex[:16]}"
        # stderr to a file, not a pipe: a long-lived filesystem that logs would otherwise
        # block once the pipe is full, and the mount with it
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*python_module(module), *args, "--fsname", self.fsname,
                                      mountpoint], pass_fds=pass_fds,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.expect("mounted", "come up")
        register_unmount(mountpoint, self.fsname)
        self.root = self._root_identity()

    def _root_identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the mount's root, reached as ``opened_root`` reaches it, once
        /proc/self/mountinfo shows our mount (our unique source) there."""
        try:
            with open_mount_point(self.mountpoint, self._named()) as d:
                found = mounts_at(d.path)           # d.path: with symlinks on the way resolved
                if found and found[-1][1] == self.fsname:
                    return d.st.st_dev, d.st.st_ino
                problem = (f"shows {found[-1][0]} from {found[-1][1]} after mounting" if found
                           else f"shows no mount at {d.path} after mounting")
        except OSError as e:
            problem = f"cannot be reached after mounting ({explain(e, self._named())})"
        self.stop()
        raise MountError(f"{self._named()} {problem}, not this mount ({self.fsname})")

    def _named(self) -> str:
        return _mount_point(self.mountpoint, self.where, self.what)

    @contextlib.contextmanager
    def opened_root(self) -> Iterator[Opened]:
        """The mount's root, opened through folders no other user can change; MountError
        when the mount point no longer leads to the mount this process made (the folder
        moved, a symlink or another folder took its name, the mount is gone)."""
        with contextlib.ExitStack() as stack:
            try:
                d = stack.enter_context(open_mount_point(self.mountpoint, self._named()))
            except OSError as e:
                raise MountError(explain(e, self._named())) from None
            if (d.st.st_dev, d.st.st_ino) != self.root:
                raise MountError(
                    f"{self._named()} is not the mount hpcmesh made there: it leads to a "
                    f"folder on device {_dev(d.st.st_dev)}, inode {d.st.st_ino}; the mount is "
                    f"device {_dev(self.root[0])}, inode {self.root[1]}. The folder was moved "
                    f"or replaced since; no process starts from it. Unmount it (job.kill()) "
                    f"and give a new mount point")
            yield d

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
        proc.wait()
        self.stderr.seek(0)
        err = self.stderr.read().decode(errors="replace").strip()
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
            unmount_if_ours(self.mountpoint, self.fsname)
        self.stderr.close()
