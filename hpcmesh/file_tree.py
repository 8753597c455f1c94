"""A directory as data: what ``remote_mount`` and ``sync_workspace`` ship to the hosts.

A :class:`FileTree` maps each path under a root to an :class:`Entry` (directory, file or
symlink, with its mode, size and mtime); a file is named by the digest of its content, so
the hosts keep content-addressed blobs and a second push of an unchanged tree moves no
data, a changed file only itself. Scanning reuses the digests of a previous scan for files
whose (inode, size, mtime) did not change, so a rescan of a venv reads only what changed.

No sockets, no processes: only the filesystem under the root is read. Every layer may
import it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

#: Files are shipped in blocks of this many bytes (a message each, pipelined down a chain).
BLOCK_SIZE = 4 << 20

DIR, FILE, LINK = "d", "f", "l"


@dataclass(frozen=True)
class Entry:
    """One path of a tree. ``digest`` names a file's content; ``target`` is a symlink's."""
    kind: str
    mode: int               # permission bits only (the kind is ``kind``)
    size: int = 0
    mtime_ns: int = 0
    digest: str = ""
    target: str = ""


@dataclass
class FileTree:
    """Relative path ('' for the root, '/'-separated) -> Entry; ``skipped`` names what
    could not be shipped (sockets, fifos, unreadable files) and why."""
    entries: dict[str, Entry] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: path -> (inode, size, mtime_ns) behind each file digest, for the next scan's reuse
    stat_keys: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)

    def blobs(self) -> dict[str, int]:
        """digest -> size of every file's content (each digest once)."""
        return {e.digest: e.size for e in self.entries.values() if e.kind == FILE}

    def paths_of(self) -> dict[str, str]:
        """digest -> one path that holds it (where the client reads it from)."""
        out: dict[str, str] = {}
        for path, e in self.entries.items():
            if e.kind == FILE:
                out.setdefault(e.digest, path)
        return out

    def version(self) -> str:
        """A digest of the whole tree: equal trees, equal versions."""
        h = hashlib.blake2b(digest_size=16)
        for path in sorted(self.entries):
            e = self.entries[path]
            h.update(f"{path}\0{e.kind}\0{e.mode}\0{e.size}\0{e.mtime_ns}\0{e.digest}\0"
                     f"{e.target}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def total_bytes(self) -> int:
        return sum(self.blobs().values())

    def children(self) -> dict[str, list[str]]:
        """directory path -> the names in it (what ``readdir`` lists)."""
        out: dict[str, list[str]] = {p: [] for p, e in self.entries.items() if e.kind == DIR}
        for path in self.entries:
            if path:
                parent, _, name = path.rpartition("/")
                out.setdefault(parent, []).append(name)
        return out

    def __getstate__(self):     # what travels to the hosts: not the client's stat keys
        return {"entries": self.entries, "skipped": self.skipped, "stat_keys": {}}


def new_hasher():
    """The hash blobs are named by: SHA-256, which CPUs with SHA extensions run ~3x faster
    than BLAKE2b (1.4 GB/s against 0.5 GB/s on the CI machine)."""
    return hashlib.sha256()


def file_digest(path: str) -> str:
    """The content digest a file's blob is named by."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, new_hasher).hexdigest()


def scan_tree(root: str, previous: FileTree | None = None) -> FileTree:
    """The tree under ``root`` (which must be a directory). Symlinks are kept as links,
    never followed; a digest of ``previous`` is reused for a file whose inode, size and
    mtime are unchanged."""
    root = os.path.abspath(root)
    try:
        st = os.stat(root)
    except OSError as e:
        raise FileNotFoundError(f"cannot read the directory to ship, {root}: "
                                f"{e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{root} is not a directory: remote_mount and "
                                 f"sync_workspace ship a directory")
    old = previous.stat_keys if previous is not None else {}
    old_entries = previous.entries if previous is not None else {}
    tree = FileTree()
    tree.entries[""] = Entry(DIR, stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns)
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        keep_dirs = []
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                st = os.lstat(full)
            except OSError as e:
                tree.skipped[rel] = e.strerror or str(e)
                continue
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                tree.entries[rel] = Entry(LINK, 0o777, len(os.readlink(full)),
                                          st.st_mtime_ns, target=os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                tree.entries[rel] = Entry(DIR, mode, mtime_ns=st.st_mtime_ns)
                keep_dirs.append(name)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                digest = old_entries[rel].digest if old.get(rel) == key else ""
                if not digest:
                    try:
                        digest = file_digest(full)
                    except OSError as e:
                        tree.skipped[rel] = e.strerror or str(e)
                        continue
                tree.entries[rel] = Entry(FILE, mode, st.st_size, st.st_mtime_ns, digest)
                tree.stat_keys[rel] = key
            else:
                tree.skipped[rel] = "not a regular file, directory or symlink"
        dirnames[:] = [d for d in dirnames if d in keep_dirs]   # symlinks to dirs: not walked
    return tree
