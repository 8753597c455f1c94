"""``job.remote_mount``: a client directory as a read-only FUSE mount on every host.

The spec (``RemoteMountSpec``) is configuration, kept with the job; ``state()`` makes or
refreshes the live mounts (``RemoteMount``) in this client process. A mount pushes the
tree's blobs down a chain of hosts (``blob_transfer``), then each host's ``MountActor``
serves it. ``refresh()`` rescans the client's tree (reading only files whose inode, size
or mtime changed), ships what changed and swaps the tree in under the running processes.
Every ``state()`` then has each host ``verify`` its mount before the meshes are handed out
with the mounted python: the mount point must still lead to that host's mount (a folder
another user can redirect is refused, ``private_files.walk``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ..actor.blob_transfer import PushStats, push_tree
from ..actor.host_mesh import HostMesh
from ..file_tree import FileTree, scan_tree
from .mount_actor import MountActor

log = logging.getLogger("hpcmesh.mounts")

#: seconds for the mount processes to start and answer
START_TIMEOUT = 120.0


def mesh_names(meshes: Any, what: str) -> tuple[str, ...] | None:
    """A ``meshes=`` argument as a tuple of names (None: every mesh of the job)."""
    if isinstance(meshes, str):
        meshes = (meshes,)
    if meshes is None:
        return None
    if not isinstance(meshes, (list, tuple)) or not all(isinstance(m, str) for m in meshes):
        raise TypeError(f"{what}'s meshes must be mesh names, got {meshes!r}")
    return tuple(meshes)


def chosen_meshes(names: tuple[str, ...] | None, meshes: dict[str, Any], what: str) -> list[str]:
    """The names ``names`` picks among the job's ``meshes``; KeyError naming the unknown."""
    picked = list(meshes) if names is None else list(names)
    unknown = [n for n in picked if n not in meshes]
    if unknown:
        raise KeyError(f"{what} names meshes {unknown} that this job does not have; its "
                       f"meshes are {sorted(meshes)}")
    return picked


@dataclass(frozen=True)
class RemoteMountSpec:
    """What ``remote_mount()`` declared (Monarch's arguments)."""
    source: str
    mntpoint: str
    meshes: tuple[str, ...] | None
    python_exe: str | None

    @classmethod
    def make(cls, source: Any, mntpoint: Any = None, meshes: Any = None,
             python_exe: Any = ".venv/bin/python") -> "RemoteMountSpec":
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"remote_mount's source must be a directory path, got "
                            f"{type(source).__name__}")
        source = os.path.abspath(os.fspath(source))
        if not os.path.isdir(source):
            raise NotADirectoryError(f"remote_mount: {source} is not a directory on the client")
        mnt = source if mntpoint is None else os.fspath(mntpoint)
        if not isinstance(mnt, str) or not os.path.isabs(mnt):
            raise ValueError(f"remote_mount's mntpoint must be an absolute path on the hosts, "
                             f"got {mntpoint!r}")
        meshes = mesh_names(meshes, "remote_mount")
        if python_exe is not None:
            if not isinstance(python_exe, str) or not python_exe or os.path.isabs(python_exe):
                raise ValueError(f"remote_mount's python_exe is a path relative to the mount "
                                 f"point (like '.venv/bin/python') or None, got "
                                 f"{python_exe!r}")
        return cls(source, os.path.normpath(mnt), meshes, python_exe)

    def chosen(self, meshes: dict[str, Any]) -> list[str]:
        return chosen_meshes(self.meshes, meshes, f"remote_mount of {self.source}")

    def python_path(self) -> str | None:
        """The interpreter processes of the mounted meshes start with, on the hosts."""
        return None if self.python_exe is None else os.path.join(self.mntpoint,
                                                                 self.python_exe)


class RemoteMount:
    """A live mount of one spec on a set of hosts, owned by this client process."""

    def __init__(self, spec: RemoteMountSpec, hosts: HostMesh):
        self.spec = spec
        self.hosts = hosts
        self.tree: FileTree | None = None
        self.last_push: PushStats | None = None
        self._procs: Any = None
        self._actors: Any = None
        self._lock = threading.Lock()

    @property
    def hostnames(self) -> list[str]:
        return self.hosts.hostnames

    @property
    def pids(self) -> list[int | None]:
        """The mount process on each host (none once closed)."""
        procs = self._procs
        return procs.pids if procs is not None else []

    def start(self) -> "RemoteMount":
        tree = scan_tree(self.spec.source)
        self._procs = self.hosts.spawn_procs(name="remote-mount")
        try:
            self._actors = self._procs.spawn("mount", MountActor)
            self._actors.prepare.call(self.spec.mntpoint).get(timeout=START_TIMEOUT)
            self.last_push = push_tree(self._actors, tree, self.spec.source)
            self._actors.mount.call(tree, self.spec.mntpoint).get(timeout=START_TIMEOUT)
        except BaseException:
            self.close()
            raise
        self.tree = tree
        return self

    def refresh(self) -> PushStats:
        """Rescan the client's directory; ship what changed and serve the new tree on
        every host. Returns the push's figures (nothing moves when nothing changed)."""
        with self._lock:
            if self._actors is None:
                raise RuntimeError(f"the remote mount of {self.spec.source} is closed")
            tree = scan_tree(self.spec.source, self.tree)
            if self.tree is not None and tree.version() == self.tree.version():
                self.last_push = PushStats(hosts=len(self.hostnames))
                return self.last_push
            self.last_push = push_tree(self._actors, tree, self.spec.source)
            self._actors.refresh.call(tree).get(timeout=START_TIMEOUT)
            self.tree = tree
            return self.last_push

    def verify(self) -> None:
        """Check on every host that the mount point leads to the mount made there and that
        ``python_exe`` is the mount's interpreter (``MountActor.verify``); raises naming
        the host and what it found."""
        if self._actors is None:
            raise RuntimeError(f"the remote mount of {self.spec.source} is closed")
        self._actors.verify.call(self.spec.python_exe).get(timeout=START_TIMEOUT)

    def close(self) -> None:
        """Unmount on every host and stop the mount's processes."""
        actors, procs, self._actors, self._procs = self._actors, self._procs, None, None
        if procs is None:
            return
        try:
            if actors is not None:
                actors.unmount.call().get(timeout=30)
        except Exception as e:  # noqa: BLE001 - a dead mount process unmounted with it
            log.info("remote mount of %s: unmount: %s (stopping its processes)",
                     self.spec.source, e)
        finally:
            procs.stop().get(timeout=60)

    def __repr__(self) -> str:
        return (f"RemoteMount({self.spec.source} -> {self.spec.mntpoint} on "
                f"{', '.join(self.hostnames)})")


def union_of_hosts(meshes: list[HostMesh]) -> HostMesh:
    """One HostMesh over every distinct host agent of ``meshes`` (a LocalJob's meshes are
    all this host: it gets one mount, not one per mesh)."""
    return hosts_of([ref for mesh in meshes for ref in mesh.refs])


def hosts_of(refs: list[Any]) -> HostMesh:
    """A flat HostMesh over the distinct agents of ``refs`` (HostRefs), first seen first."""
    seen: dict[str, Any] = {}
    for ref in refs:
        seen.setdefault(ref.agent.node_id, ref)
    return HostMesh.from_hosts(seen.values(), "mount-hosts")


#: live mounts of this client: (job's apply_id, spec) -> RemoteMount
_LIVE: dict[tuple[str | None, RemoteMountSpec], RemoteMount] = {}
_LIVE_LOCK = threading.Lock()


def apply_mounts(job_id: str | None, specs: list[RemoteMountSpec],
                 meshes: dict[str, Any]) -> tuple[dict[str, Any], list[RemoteMount]]:
    """Make or refresh the mounts of ``specs`` over ``meshes``; the meshes with their python
    switched to the mounted one (where ``python_exe`` says so) and the live mounts."""
    out = dict(meshes)
    live: list[RemoteMount] = []
    for spec in specs:
        names = spec.chosen(meshes)
        key = (job_id, spec)
        with _LIVE_LOCK:
            mount = _LIVE.get(key)
        if mount is not None:
            mount.refresh()
        else:
            mount = RemoteMount(spec, union_of_hosts([meshes[n] for n in names])).start()
            with _LIVE_LOCK:
                _LIVE[key] = mount
        mount.verify()              # before any process starts from it, every state()
        live.append(mount)
        python = spec.python_path()
        if python is not None:
            for n in names:
                out[n] = out[n].with_python_executable(python)
    return out, live


def close_mounts(job_id: str | None, ask_hosts: bool = True) -> None:
    """End every live mount this client made for the job ``job_id``: unmounted on the hosts
    (``ask_hosts``), or only forgotten (the job's end takes the mount processes, and their
    agents unmount). Failures are logged: ending a job must go on."""
    with _LIVE_LOCK:
        mounts = [_LIVE.pop(k) for k in [k for k in _LIVE if k[0] == job_id]]
    for m in mounts:
        if not ask_hosts:
            continue
        try:
            m.close()
        except Exception as e:  # noqa: BLE001 - close the rest
            log.warning("unmounting %s failed: %s", m, e)
