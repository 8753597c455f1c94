"""The client's side of ``gather_mount``: a read-only FUSE filesystem whose top folders are
the hosts (``hosts_0``, ``hosts_1``, ...), each showing that host's directory.

It runs as a process of its own (``python -m hpcmesh.mounts.fuse_gather``), owned by the
client through its stdin (``fuse_process``). It holds no connection to the hosts: every
lookup, listing and read is a request on a socket the client passed it, which the client
answers by calling the host's ``GatherActor``; that keeps the job's secret and transport in
the client. The kernel caches what it learns for ``ATTR_TIMEOUT`` seconds.

Requests and answers are pickles behind a 4-byte length: ``(op, key, path, args)`` ->
``("ok", value)`` or ``("err", errno)``.

A symlink shows as a symlink, but its target is given (by the host, and checked again
here) only when it leads to a name under that host's folder however it is followed
(:func:`link_stays_inside`); reading any other link is refused with EACCES, and following
it fails so. The kernel follows a target on the client, with the reader's rights: an
absolute one (``/root/secret``) or one that climbs out of the host's folder would open the
client's own files, which are not the host's and which the client (often a privileged
service user) may read where the folder's owner may not. A refusal says so, where a
target rewritten to dangle would hide it.
"""

from __future__ import annotations

import argparse
import errno
import os
import pickle
import socket
import stat
import struct
import sys
import threading

from .fuse_process import run

SUBTYPE = "hpcmesh-gather"
_LEN = struct.Struct(">I")


def send_frame(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_frame(sock: socket.socket):
    """The next pickled frame, or None at the end of the stream."""
    head = _recv_exactly(sock, _LEN.size)
    if head is None:
        return None
    body = _recv_exactly(sock, _LEN.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def link_stays_inside(target: str, path: str) -> bool:
    """Whether the symlink at ``path`` (under a gathered folder, '/'-separated) with
    ``target`` leads to a name under that folder wherever it is followed: a relative
    target whose '..' all come first, no more of them than there are folders above the
    link. (A '..' after a name climbs from wherever that name leads, which a link there
    may make the folder's top: ``x -> ..`` then ``x/../..`` climbs out.)"""
    if not target or target.startswith("/"):
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    above = len([p for p in path.split("/") if p]) - 1
    return ups <= above and ".." not in parts[ups:]


def make_operations(keys: list[str], sock: socket.socket):
    import mfusepy
    lock = threading.Lock()
    uid, gid = os.getuid(), os.getgid()

    def ask(op: str, key: str, path: str, *args):
        with lock:                   # one request at a time on the one socket
            send_frame(sock, (op, key, path, args))
            answer = recv_frame(sock)
        if answer is None:
            raise mfusepy.FuseOSError(errno.ENOTCONN)
        status, value = answer
        if status != "ok":
            raise mfusepy.FuseOSError(value)
        return value

    def split(path: str) -> tuple[str, str]:
        key, _, rest = path.strip("/").partition("/")
        if key not in keys:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return key, rest

    class GatherOperations(mfusepy.Operations):
        use_ns = True

        def init(self, path):
            print("mounted", flush=True)

        def getattr(self, path, fh=None):
            if path.strip("/") == "":
                return {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2 + len(keys),
                        "st_uid": uid, "st_gid": gid}
            st = dict(ask("lstat", *split(path)))
            st["st_mode"] &= ~0o222          # read-only, whatever it is on the host
            st.update(st_uid=uid, st_gid=gid)
            return st

        def readdir(self, path, fh):
            if path.strip("/") == "":
                return [".", "..", *keys]
            return [".", "..", *ask("listdir", *split(path))]

        def readlink(self, path):
            key, rest = split(path)
            target = ask("readlink", key, rest)
            if not link_stays_inside(target, rest):    # (the host refuses these already)
                raise mfusepy.FuseOSError(errno.EACCES)
            return target

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                raise mfusepy.FuseOSError(errno.EROFS)
            return 0

        def read(self, path, size, offset, fh):
            return ask("read", *split(path), offset, size)

    return GatherOperations()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcmesh.mounts.fuse_gather")
    parser.add_argument("--fd", type=int, required=True, help="the client's request socket")
    parser.add_argument("--keys", required=True, help="the hosts' folder names, comma-separated")
    parser.add_argument("--fsname", required=True, help="the mount's source: unique per mount")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    run(make_operations(args.keys.split(","), sock), args.mountpoint, SUBTYPE, args.fsname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
