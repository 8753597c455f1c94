"""``HostMesh.sync_workspace`` (Monarch's name): copy a client directory onto every host.

The copy-based way to get code to the nodes, for sites where FUSE is not usable (no
``/dev/fuse``, no ``fusermount3``): walk the tree, ask each host what it lacks, ship only
that (``blob_transfer``), then lay the files out at the destination. Files this sync wrote
before and the client no longer has are removed; files it never wrote are left alone. A
manifest in the destination (``.hpcmesh-workspace.json``) remembers which are which.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from typing import Any

from ..file_tree import DIR, LINK, FileTree, scan_tree
from ..runtime.future import Future
from .blob_transfer import BlobReceiver, PushStats, push_tree
from .endpoint import endpoint

MANIFEST = ".hpcmesh-workspace.json"


def materialize(store_path, tree: FileTree, dest: str) -> dict[str, int]:
    """Lay ``tree`` out under ``dest`` from blobs (``store_path(digest)`` is a blob's file).
    Returns how many paths were written, kept as they were, and removed."""
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise NotADirectoryError(f"sync_workspace destination {dest} is a file, not a "
                                 f"directory")
    os.makedirs(dest, exist_ok=True)
    manifest_path = os.path.join(dest, MANIFEST)
    try:
        with open(manifest_path) as f:
            before: dict[str, list] = json.load(f)
    except (FileNotFoundError, ValueError):
        before = {}
    counts = {"written": 0, "unchanged": 0, "removed": 0}
    real_dest = os.path.realpath(dest)

    def inside(path: str) -> bool:
        """Is ``path``'s folder really under dest (no symlink on the way out of it)?"""
        parent = os.path.dirname(path)
        want = os.path.join(real_dest, parent) if parent else real_dest
        return os.path.realpath(os.path.join(dest, parent)) == want

    # what went first, deepest first, and never through a symlink out of dest
    gone = sorted((p for p in before if p not in tree.entries), reverse=True)
    for path in gone:
        full = os.path.join(dest, path)
        try:
            if not inside(path):
                continue
            if before[path][0] == DIR and not os.path.islink(full):
                os.rmdir(full)                          # only if empty: never user files
            else:
                os.unlink(full)
            counts["removed"] += 1
        except OSError:
            pass
    now: dict[str, list] = {}
    for path in sorted(tree.entries):
        e = tree.entries[path]
        full = os.path.join(dest, path) if path else dest
        record = [e.kind, e.digest, e.target, e.mode]
        now[path] = record
        if path and not inside(path):
            raise RuntimeError(f"sync_workspace: {os.path.dirname(full)} on this host leads "
                               f"out of {dest} through a symlink; remove it and sync again")
        if e.kind == DIR:
            if os.path.islink(full):
                os.unlink(full)                         # a link became a folder
            os.makedirs(full, exist_ok=True)
            continue
        if before.get(path) == record and os.path.lexists(full) and (
                e.kind == LINK or os.path.getsize(full) == e.size):
            counts["unchanged"] += 1
            continue
        if os.path.isdir(full) and not os.path.islink(full):
            try:
                os.rmdir(full)                          # a folder became a file or link
            except OSError:
                raise RuntimeError(f"sync_workspace: {full} on this host is a folder that "
                                   f"holds files the sync did not write, and the client "
                                   f"has a file there now; move them away") from None
        tmp = os.path.join(os.path.dirname(full), f".{os.path.basename(full)}.hpcmesh-tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if e.kind == LINK:
            os.symlink(e.target, tmp)
        else:
            shutil.copyfile(store_path(e.digest), tmp)
            os.chmod(tmp, e.mode)
            os.utime(tmp, ns=(e.mtime_ns, e.mtime_ns))   # as on the client: pyc checks agree
        os.replace(tmp, full)
        counts["written"] += 1
    for path in sorted((p for p, e in tree.entries.items() if e.kind == DIR), reverse=True):
        os.chmod(os.path.join(dest, path) if path else dest, tree.entries[path].mode | 0o200)
    tmp = f"{manifest_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(now, f)
    os.replace(tmp, manifest_path)
    return counts


class WorkspaceReceiver(BlobReceiver):
    """BlobReceiver that also lays a tree out in a directory of its host."""

    @endpoint
    def materialize(self, tree: FileTree, dest: str) -> dict[str, int]:
        return materialize(self.store.path, tree, dest)


@dataclass
class SyncResult:
    """What ``sync_workspace`` did: per directory, the push and the per-host file counts."""
    pushes: dict[str, PushStats]
    files: dict[str, dict[str, dict[str, int]]]    # source -> host -> counts


def workspace_dirs(workspace: Any, conda: bool) -> dict[str, str]:
    """source -> destination on the hosts, from what ``sync_workspace`` was given: a path,
    a list of paths, a {source: destination} mapping, or an object with ``dirs`` (Monarch's
    ``Workspace``) holding one of those. ``conda`` adds the running environment
    (``sys.prefix``: a venv or conda env) at its own path."""
    import sys
    dirs = getattr(workspace, "dirs", workspace)
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    if isinstance(dirs, dict):
        pairs = {os.path.abspath(os.fspath(k)): os.fspath(v) for k, v in dirs.items()}
    elif isinstance(dirs, (list, tuple)):
        pairs = {os.path.abspath(os.fspath(d)): os.path.abspath(os.fspath(d)) for d in dirs}
    else:
        raise TypeError(f"sync_workspace takes a directory, a list of directories, a "
                        f"{{source: destination}} dict or a Workspace with .dirs; got "
                        f"{type(workspace).__name__}")
    if conda:
        pairs.setdefault(sys.prefix, sys.prefix)
    for src, dst in pairs.items():
        if not os.path.isdir(src):
            raise NotADirectoryError(f"sync_workspace: {src} is not a directory on the client")
        if not os.path.isabs(dst):
            raise ValueError(f"sync_workspace: the destination of {src} must be an absolute "
                             f"path on the hosts, got {dst!r}")
    if not pairs:
        raise ValueError("sync_workspace got no directories to sync")
    return pairs


def sync_workspace(host_mesh: Any, workspace: Any, conda: bool = False) -> SyncResult:
    """Blocking body of ``HostMesh.sync_workspace``: one process per host receives and lays
    out the trees, then stops."""
    pairs = workspace_dirs(workspace, conda)
    procs = host_mesh.spawn_procs(name="workspace-sync")
    try:
        receivers = procs.spawn("workspace", WorkspaceReceiver)
        hostnames = [h for _, h in receivers.hostname.call().get(timeout=120).items()]
        result = SyncResult({}, {})
        for src, dst in pairs.items():
            tree = scan_tree(src)
            result.pushes[src] = push_tree(receivers, tree, src)
            counts = receivers.materialize.call(tree, dst).get(timeout=600)
            result.files[src] = {hostnames[p.rank]: c for p, c in counts.items()}
        return result
    finally:
        procs.stop().get(timeout=60)


def in_thread(fn, *args) -> Future:
    """A Future of ``fn(*args)`` run on a thread of its own (so ``await`` does not block the
    caller's event loop while a push runs)."""
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
            fut.set_exception(e)
    threading.Thread(target=run, name="hpcmesh-sync-workspace", daemon=True).start()
    return fut
