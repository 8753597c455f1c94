"""The host's side of ``remote_mount``: receive the blobs, then keep the FUSE mount.

One ``MountActor`` per host, in a process of its own that lives as long as the mount. The
filesystem runs in a child process (``fuse_tree``) in this process's group, so stopping
the mount's process (stop, kill -9, lease expiry after the client died) takes it along,
and ``auto_unmount`` removes the mount when it is gone.

Before the mesh's processes start from the mount (each ``state()``), ``verify`` checks on
the host that the mount point still leads to this mount, by its root's device and inode,
and that the interpreter is the mount's own file: a path string alone could lead anywhere
another user of the node redirected it (issue 28).
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import time

from ..actor.blob_transfer import BlobReceiver
from ..actor.endpoint import endpoint
from ..file_tree import FileTree
from ..private_files import explain, walk
from .fuse_process import ATTR_TIMEOUT, FuseProcess, MountError, fuse_problem, \
    ready_mount_point
from .fuse_tree import SUBTYPE


class MountActor(BlobReceiver):
    """Blobs in, a read-only mount of the client's tree out."""

    def __init__(self, store_root: str | None = None):
        super().__init__(store_root)
        self.host = socket.gethostname()
        self.fs: FuseProcess | None = None

    @endpoint
    def prepare(self, mountpoint: str) -> str:
        """Check that this host can mount at ``mountpoint``; returns the host's name."""
        problem = fuse_problem()
        if problem is not None:
            raise MountError(
                f"remote_mount cannot mount on host {self.host}: {problem}. Without FUSE, "
                f"copy the directory instead: host_mesh.sync_workspace({{source: "
                f"{mountpoint!r}}}) ships only what changed")
        ready_mount_point(mountpoint, SUBTYPE, f"host {self.host}", "remote_mount",
                          busy_hint=" (if the hosts see the client's own directory on a "
                                    "shared filesystem, they have it there already)")
        return self.host

    def _write_tree(self, tree: FileTree) -> str:
        path = os.path.join(self.store.root, "trees", f"{tree.version()}.pkl")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(tree, f)
        os.replace(tmp, path)
        return path

    @endpoint
    def mount(self, tree: FileTree, mountpoint: str) -> None:
        if self.fs is not None:
            raise MountError(f"host {self.host} already mounts {self.fs.mountpoint}")
        self.fs = FuseProcess("hpcmesh.mounts.fuse_tree", ["--store", self.store.root,
                              "--tree", self._write_tree(tree)], mountpoint,
                              f"host {self.host}", "remote_mount")

    @endpoint
    def verify(self, python_exe: str | None) -> str | None:
        """Check that the mount point still leads to this host's mount and, with
        ``python_exe`` (relative to it), that the interpreter is an executable file of the
        mount, or where a link in it leads out (a venv's python to its base interpreter),
        one reached only through folders and links of root or this user. Returns the
        interpreter's real path; MountError naming what was found otherwise."""
        if self.fs is None:
            raise MountError(f"host {self.host} has no mount to check")
        with self.fs.opened_root() as root:
            if python_exe is None:
                return None
            what = (f"remote_mount: the interpreter {python_exe} under the mount point "
                    f"{self.fs.mountpoint} on host {self.host}")
            try:
                with walk(python_exe, what=what, start=root, way=None) as exe:
                    mode = exe.st.st_mode
                    if not stat.S_ISREG(mode) or not mode & 0o111:
                        raise MountError(f"{what} leads to {exe.path}, which is not an "
                                         f"executable file (mode {mode:o})")
                    return exe.path
            except OSError as e:
                if isinstance(e, MountError):
                    raise
                raise MountError(explain(e, what)) from None

    @endpoint
    def refresh(self, tree: FileTree) -> None:
        """Serve ``tree`` from now on, and return once cached lookups have expired."""
        if self.fs is None:
            raise MountError(f"host {self.host} has no mount to refresh")
        self.fs.command(f"reload {self._write_tree(tree)}", "answer a reload")
        time.sleep(ATTR_TIMEOUT)

    @endpoint
    def unmount(self) -> None:
        self.__cleanup__()

    def __cleanup__(self) -> None:
        fs, self.fs = self.fs, None
        if fs is not None:
            fs.stop()
