"""The host's side of ``remote_mount``: receive the blobs, then keep the FUSE mount.

One ``MountActor`` per host, in a process of its own that lives as long as the mount. The
filesystem runs in a child process (``fuse_tree``) in this process's group, so stopping
the mount's process (stop, kill -9, lease expiry after the client died) takes it along,
and ``auto_unmount`` removes the mount when it is gone.
"""

from __future__ import annotations

import os
import pickle
import socket
import time

from ..actor.blob_transfer import BlobReceiver
from ..actor.endpoint import endpoint
from ..file_tree import FileTree
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
        try:
            ready_mount_point(mountpoint, SUBTYPE, f"host {self.host}", "remote_mount")
        except MountError as e:
            raise MountError(f"{e} (if the hosts see the client's own directory on a shared "
                             f"filesystem, they have it there already)") from None
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
        self.fs = FuseProcess(["-m", "hpcmesh.mounts.fuse_tree", "--store", self.store.root,
                               "--tree", self._write_tree(tree)], mountpoint,
                              f"host {self.host}")

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
