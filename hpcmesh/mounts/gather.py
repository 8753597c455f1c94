"""``job.gather_mount``: every host's directory, read-only, on the client.

Each host of the chosen meshes gets a folder under the local mount point named by its mesh
coordinates (``hosts_0``; ``<mesh>_hosts_0`` when several meshes are chosen), and a
``$SUBDIR`` in the remote path becomes that same name on the host, so per-host output
directories land side by side. A ``GatherActor`` on each host answers lookups and reads; the
client's FUSE process (``fuse_gather``) asks through a socket that this module serves by
calling those actors.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from ..actor.endpoint import Actor, endpoint
from ..actor.host_mesh import HostMesh
from ..private_files import Opened, UntrustedPathError, walk
from ..shapes import Point, subdir_for
from .fuse_gather import SUBTYPE, recv_frame, send_frame
from .fuse_process import FuseProcess, MountError, fuse_problem, ready_mount_point
from .remote_mount import START_TIMEOUT, chosen_meshes, hosts_of, mesh_names

log = logging.getLogger("hpcmesh.mounts")

#: seconds one request to a host may take before the read fails with EIO
REQUEST_TIMEOUT = 30.0
#: the most bytes one read asks a host for
MAX_READ = 1 << 20


@dataclass(frozen=True)
class GatherMountSpec:
    """What ``gather_mount()`` declared (Monarch's arguments)."""
    remote_mount_point: str
    local_mount_point: str
    meshes: tuple[str, ...] | None

    @classmethod
    def make(cls, remote: Any, local: Any, meshes: Any = None) -> "GatherMountSpec":
        for name, value in (("remote_mount_point", remote), ("local_mount_point", local)):
            if not isinstance(value, (str, os.PathLike)) or not os.path.isabs(
                    os.fspath(value)):
                raise ValueError(f"gather_mount's {name} must be an absolute path, got "
                                 f"{value!r}")
        return cls(os.fspath(remote), os.path.abspath(os.fspath(local)),
                   mesh_names(meshes, "gather_mount"))

    def root_for(self, key: str) -> str:
        return self.remote_mount_point.replace("${SUBDIR}", key).replace("$SUBDIR", key)


class GatherActor(Actor):
    """Answers the client's lookups and reads under each of its host's roots. A root is
    reached through folders no other user can change (``private_files.walk``), and each name
    under it without following any symlink (:func:`beneath`): another user who may
    write a folder in there can swap it for a symlink at any moment, and following it here
    would show the client what this user, not they, may read. A symlink is answered as a
    symlink; the client's kernel follows it on the client, with the reader's rights."""

    def __init__(self, roots: dict[str, str]):
        self.roots = roots
        self._refused: set[str] = set()     # roots whose refusal was logged

    @endpoint
    def fs(self, op: str, key: str, path: str, args: tuple) -> tuple[str, Any]:
        """One filesystem request: ("ok", value) or ("err", errno)."""
        if key not in self.roots or op not in _OPS:
            return "err", errno.ENOENT if op in _OPS else errno.ENOSYS
        root = self.roots[key]
        what = f"gather_mount's folder {root}"
        try:
            with walk(root, what=what, last=None) as top:
                with beneath(top, path, what) as (dir_fd, name):
                    return "ok", _OPS[op](dir_fd, name, args)
        except UntrustedPathError as e:
            if key not in self._refused:
                self._refused.add(key)
                log.warning("%s", e)
            return "err", errno.EACCES
        except FileNotFoundError:
            if path or op not in _NOT_MADE_YET:
                return "err", errno.ENOENT
            return "ok", _NOT_MADE_YET[op]
        except OSError as e:
            return "err", e.errno or errno.EIO


@contextlib.contextmanager
def beneath(root: Opened, relpath: str, what: str) -> Iterator[tuple[int, str]]:
    """(folder fd, name) of ``relpath`` under the opened ``root``, every folder on the way
    opened without following it and not checked (whoever owns it: ``walk(way=None,
    follow=False)``): a symlink there fails with ENOTDIR, ``.``/``..`` with EACCES, so
    nothing outside the root is reached. The caller acts on the last name with ``dir_fd``
    and without following it; the root itself is ``"."`` in a copy of ``root.fd``."""
    parts = [p for p in relpath.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise PermissionError(errno.EACCES, f"{relpath!r} climbs out of the folder")
    with walk("/".join(parts[:-1]), what=what, start=root, way=None, follow=False) as d:
        yield d.fd, (parts[-1] if parts else ".")


def _lstat(dir_fd: int, name: str, args: tuple) -> dict:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size,
            "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns,
            "st_atime": st.st_atime_ns, "st_blocks": st.st_blocks}


def _listdir(dir_fd: int, name: str, args: tuple) -> list[str]:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _readlink(dir_fd: int, name: str, args: tuple) -> str:
    return os.readlink(name, dir_fd=dir_fd)


def _read(dir_fd: int, name: str, args: tuple) -> bytes:
    """Read a regular file only: the name is looked at first without opening it (opening a
    FIFO or a device another user put there could block or act), then re-opened through
    /proc from that very look, so the file checked is the file read."""
    offset, size = args
    seen = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        mode = os.fstat(seen).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, name)
        fd = os.open(f"/proc/self/fd/{seen}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(seen)
    try:
        return os.pread(fd, min(size, MAX_READ), offset)
    finally:
        os.close(fd)


#: the requests a host answers, by the name ``fuse_gather`` asks with
_OPS = {"lstat": _lstat, "listdir": _listdir, "readlink": _readlink, "read": _read}
#: what a host whose folder is not made yet answers: an empty folder
_NOT_MADE_YET = {"lstat": {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}, "listdir": []}


def host_keys(spec: GatherMountSpec, meshes: dict[str, HostMesh]) -> dict[str, Any]:
    """folder name -> host (HostRef) for every host of the chosen meshes."""
    names = chosen_meshes(spec.meshes, meshes, f"gather_mount of {spec.remote_mount_point}")
    out: dict[str, Any] = {}
    for name in names:
        mesh = meshes[name]
        for i, ref in enumerate(mesh.refs):
            key = subdir_for(dict(Point(i, mesh.extent)))
            out[key if len(names) == 1 else f"{name}_{key}"] = ref
    return out


class GatherMount:
    """A live gather mount on this client."""

    def __init__(self, spec: GatherMountSpec, meshes: dict[str, HostMesh]):
        self.spec = spec
        self.hosts_by_key = host_keys(spec, meshes)
        self.fs: FuseProcess | None = None
        self._procs: Any = None
        self._sock: socket.socket | None = None

    def start(self) -> "GatherMount":
        problem = fuse_problem()
        if problem is not None:
            raise MountError(f"gather_mount cannot mount on this client: {problem}")
        local = self.spec.local_mount_point
        ready_mount_point(local, SUBTYPE, "this client", "gather_mount")
        hosts = hosts_of(list(self.hosts_by_key.values()))
        rank_of = {ref.agent.node_id: r for r, ref in enumerate(hosts.refs)}
        roots = {key: self.spec.root_for(key) for key in self.hosts_by_key}
        self._procs = hosts.spawn_procs(name="gather-mount")
        try:
            actors = self._procs.spawn("gather", GatherActor, roots).flatten("rank")
            members = {key: actors.slice(rank=rank_of[ref.agent.node_id])
                       for key, ref in self.hosts_by_key.items()}
            actors.fs.call("lstat", next(iter(roots)), "", ()).get(timeout=START_TIMEOUT)
            mine, theirs = socket.socketpair()
            self._sock = mine
            threading.Thread(target=self._serve, args=(mine, members), daemon=True,
                             name="hpcmesh-gather-mount").start()
            try:
                self.fs = FuseProcess("hpcmesh.mounts.fuse_gather", ["--fd",
                                      str(theirs.fileno()), "--keys",
                                      ",".join(self.hosts_by_key)], local, "this client",
                                      "gather_mount", pass_fds=(theirs.fileno(),))
            finally:
                theirs.close()
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _serve(sock: socket.socket, members: dict[str, Any]) -> None:
        """Answer the FUSE process's requests until it closes its end."""
        while True:
            try:
                request = recv_frame(sock)
            except OSError:
                return
            if request is None:
                return
            op, key, path, args = request
            try:
                answer = members[key].fs.call_one(op, key, path, args).get(
                    timeout=REQUEST_TIMEOUT)
            except Exception:  # noqa: BLE001 - the host is gone or slow: an I/O error there
                answer = ("err", errno.EIO)
            try:
                send_frame(sock, answer)
            except OSError:
                return

    def close(self, ask_hosts: bool = True) -> None:
        """Unmount on this client; stop the hosts' processes too with ``ask_hosts``."""
        fs, procs, sock = self.fs, self._procs, self._sock
        self.fs = self._procs = self._sock = None
        try:
            if fs is not None:
                fs.stop()
        finally:
            if sock is not None:
                sock.close()
            if procs is not None and ask_hosts:
                procs.stop().get(timeout=60)

    def __repr__(self) -> str:
        return (f"GatherMount({self.spec.remote_mount_point} -> "
                f"{self.spec.local_mount_point}: {', '.join(self.hosts_by_key)})")


_LIVE: dict[tuple[str | None, GatherMountSpec], GatherMount] = {}
_LIVE_LOCK = threading.Lock()


def apply_gathers(job_id: str | None, specs: list[GatherMountSpec],
                  meshes: dict[str, Any]) -> list[GatherMount]:
    """Make the gather mounts of ``specs`` (a live one of this client is kept as it is:
    it always shows the hosts' current files)."""
    out = []
    for spec in specs:
        key = (job_id, spec)
        with _LIVE_LOCK:
            live = _LIVE.get(key)
        if live is None:
            live = GatherMount(spec, meshes).start()
            with _LIVE_LOCK:
                _LIVE[key] = live
        out.append(live)
    return out


def close_gathers(job_id: str | None, ask_hosts: bool = True) -> None:
    """Unmount every gather mount of the job on this client (failures logged, the rest go
    on); ``ask_hosts``: stop the hosts' GatherActors too."""
    with _LIVE_LOCK:
        mounts = [_LIVE.pop(k) for k in [k for k in _LIVE if k[0] == job_id]]
    for m in mounts:
        try:
            m.close(ask_hosts)
        except Exception as e:  # noqa: BLE001 - close the rest
            log.warning("unmounting %s failed: %s", m, e)

