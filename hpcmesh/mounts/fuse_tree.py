"""A read-only FUSE filesystem that serves a FileTree from a host's blob store.

It runs as a process of its own (``python -m hpcmesh.mounts.fuse_tree``), started and
owned by the host's ``MountActor`` through its stdin (``fuse_process``): it prints
``mounted`` once the kernel has the mount; ``reload PATH`` swaps in the tree pickled at
PATH (no remount: open files keep their blob; what the kernel cached of changed or removed
paths is dropped at once, new paths show within ``ATTR_TIMEOUT``) and is answered ``ok``;
the end of stdin unmounts.

Library: mfusepy (the maintained fork of fusepy: ctypes over libfuse 3 or 2, no compiler,
a wheel of pure Python) with Debian's ``fuse3`` for ``fusermount3``.
"""

from __future__ import annotations

import argparse
import errno
import os
import pickle
import stat
import sys

from ..file_tree import DIR, FILE, LINK, FileTree
from .fuse_process import ATTR_TIMEOUT, CACHED_TIMEOUT, invalidator, libfuse, run

SUBTYPE = "hpcmesh"          # /proc/mounts shows "fuse.hpcmesh": how a stale one is known


def blob_path(store_root: str, digest: str) -> str:
    return os.path.join(store_root, "blobs", digest[:2], digest)


def load_tree(path: str) -> FileTree:
    with open(path, "rb") as f:
        tree = pickle.load(f)
    if not isinstance(tree, FileTree):
        raise TypeError(f"{path} holds a {type(tree).__name__}, not a FileTree")
    return tree


def has_invalidate() -> bool:
    return hasattr(libfuse(), "fuse_invalidate_path")


def make_operations(store_root: str, tree: FileTree):
    """The mfusepy Operations over ``tree`` (imported here: the package is optional)."""
    import mfusepy

    class TreeOperations(mfusepy.Operations):
        use_ns = True

        def __init__(self):
            self.uid, self.gid = os.getuid(), os.getgid()
            self.invalidate = None
            self.view = ({}, {})
            self.reload(tree)

        def reload(self, new: FileTree) -> None:
            """Serve ``new``; drop what the kernel cached of every path that changed or
            went (a path that is new had no cached entry, only a short negative one)."""
            old = self.view[0]
            # one assignment: a callback on another thread sees the old view or the new one
            self.view = (new.entries, {k: sorted(v) for k, v in new.children().items()})
            if self.invalidate is not None:
                for path, entry in old.items():
                    if new.entries.get(path) != entry:
                        self.invalidate("/" + path)
                for path in new.entries.keys() - old.keys():    # its folder's listing
                    self.invalidate("/" + path.rpartition("/")[0])

        def _entry(self, path: str):
            entry = self.view[0].get(path.strip("/"))
            if entry is None:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return entry

        def init(self, path):
            self.invalidate = invalidator()
            print("mounted", flush=True)

        def getattr(self, path, fh=None):
            e = self._entry(path)
            kind = {DIR: stat.S_IFDIR, FILE: stat.S_IFREG, LINK: stat.S_IFLNK}[e.kind]
            mode = kind | (e.mode & 0o555 if e.kind != LINK else 0o777)
            return {"st_mode": mode, "st_nlink": 2 if e.kind == DIR else 1,
                    "st_size": e.size, "st_uid": self.uid, "st_gid": self.gid,
                    "st_mtime": e.mtime_ns, "st_ctime": e.mtime_ns, "st_atime": e.mtime_ns,
                    "st_blocks": (e.size + 511) // 512}

        def readdir(self, path, fh):
            names = self.view[1].get(path.strip("/"))
            if names is None:
                raise mfusepy.FuseOSError(errno.ENOTDIR)
            return [".", "..", *names]

        def readlink(self, path):
            e = self._entry(path)
            if e.kind != LINK:
                raise mfusepy.FuseOSError(errno.EINVAL)
            return e.target

        # A file opened keeps the blob it had when it was opened, whatever a refresh does
        # to its path meanwhile: a running process that mapped a .so must not see its
        # pages change under it. (Answering opens in libfuse instead, and reading by
        # path, was faster on a warm import, but wrong in exactly that case.)
        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                raise mfusepy.FuseOSError(errno.EROFS)
            e = self._entry(path)
            if e.kind != FILE:
                raise mfusepy.FuseOSError(errno.EISDIR)
            return os.open(blob_path(store_root, e.digest), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def statfs(self, path):
            entries = self.view[0]
            used = sum(e.size for e in entries.values() if e.kind == FILE)
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": (used + 4095) // 4096,
                    "f_bfree": 0, "f_bavail": 0, "f_files": len(entries), "f_ffree": 0,
                    "f_namemax": 255}

    return TreeOperations()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcmesh.mounts.fuse_tree")
    parser.add_argument("--store", required=True, help="the host's blob store folder")
    parser.add_argument("--tree", required=True, help="the pickled FileTree to serve")
    parser.add_argument("--fsname", required=True, help="the mount's source: unique per mount")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    ops = make_operations(args.store, load_tree(args.tree))

    def on_command(cmd: str, arg: str) -> str:
        if cmd != "reload":
            return f"error unknown command {cmd!r}"
        ops.reload(load_tree(arg))
        return "ok"
    # this filesystem invalidates what a reload changes, so the kernel may cache the rest
    run(ops, args.mountpoint, SUBTYPE, args.fsname, on_command,
        cache_timeout=CACHED_TIMEOUT if has_invalidate() else ATTR_TIMEOUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
