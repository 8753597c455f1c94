"""Getting a FileTree's contents onto every host: a content-addressed blob store per host,
filled down a chain so that N hosts cost the client about one upload.

The client asks each host which blobs it lacks; for each set of hosts that lack the same
blobs it sends them, in blocks of ``file_tree.BLOCK_SIZE``, to the first host of that set
only, with the rest of the set as the chain: each host writes a block and passes it on
without waiting for the next host, and the client keeps a few blocks in flight, so the
chain runs as a pipeline. ``flush`` along the chain then says every host has them all.

A blob is written under a temporary name and renamed once its bytes are all in and its
digest checks, so a store never holds a wrong or partial blob under a real name.
"""

from __future__ import annotations

import collections
import os
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..file_tree import BLOCK_SIZE, FileTree, file_digest, new_hasher
from ..private_files import UntrustedPathError, private_dir
from .endpoint import Actor, endpoint

#: blocks a client keeps in flight to a chain's first host (x BLOCK_SIZE bytes)
WINDOW = 4
#: seconds one message of a push may take before the push is given up
PUSH_TIMEOUT = 600.0
CACHE_VAR = "HPCMESH_BLOB_CACHE"


def default_store_root() -> str:
    """``$HPCMESH_BLOB_CACHE``, else a folder in the node's temporary directory, per user
    and host (so hosts that share a /tmp still keep what each really holds)."""
    return os.environ.get(CACHE_VAR) or os.path.join(
        tempfile.gettempdir(), f"hpcmesh-blobs-{os.getuid()}-{socket.gethostname()}")


class BlobStore:
    """Content-addressed files in a folder of this host: ``blobs/ab/abcdef...``."""

    def __init__(self, root: str):
        self.root = root
        #: digest -> (bytes received so far, the hash of them while they came in order)
        self._partial: dict[str, tuple[int, Any]] = {}
        self._lock = threading.Lock()
        self._writer = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"   # partial files: this one's
        try:
            # a store somebody else controls could hand this user's processes their files
            private_dir(root, what="the blob store")
        except UntrustedPathError as e:
            raise UntrustedPathError(f"{e}. Set {CACHE_VAR} to a folder of your own") from None
        os.makedirs(os.path.join(root, "blobs"), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(root, "partial"), mode=0o700, exist_ok=True)

    def path(self, digest: str) -> str:
        return os.path.join(self.root, "blobs", digest[:2], digest)

    def has(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    def missing(self, digests: list[str]) -> list[str]:
        return [d for d in digests if not self.has(d)]

    def write_block(self, digest: str, offset: int, total: int, data: bytes) -> bool:
        """Write one block of a blob; True once the blob is complete and in place. Blocks
        that come in order (a chain keeps the sender's order) are hashed as they come; out
        of order, the whole file is hashed once it is complete."""
        if self.has(digest):
            return True
        # a partial file of this writer's own: two pushes of one blob (two clients sharing
        # a store) never write into each other's; a push starts again at offset 0
        part = os.path.join(self.root, "partial", f"{digest}.{self._writer}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if offset == 0 else 0)
        fd = os.open(part, flags, 0o600)
        try:
            if data:
                os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        with self._lock:
            if offset == 0:
                self._partial.pop(digest, None)
            got, hasher = self._partial.get(digest, (0, new_hasher()))
            if hasher is not None and offset == got:
                hasher.update(data)
            else:
                hasher = None
            got += len(data)
            if got < total:
                self._partial[digest] = (got, hasher)
                return False
            self._partial.pop(digest, None)
        actual = hasher.hexdigest() if hasher is not None else file_digest(part)
        if actual != digest:
            os.unlink(part)
            raise ValueError(f"blob {digest} arrived with other content (the file changed on "
                             f"the client while it was being shipped?): run the push again")
        final = self.path(digest)
        os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
        os.replace(part, final)
        return True


class BlobReceiver(Actor):
    """One per host: fills the host's BlobStore and passes blocks down the chain."""

    def __init__(self, store_root: str | None = None):
        """``store_root``: the store's folder on each host ("{host}" in it becomes the
        host's name); default ``default_store_root()``."""
        root = (store_root or default_store_root()).replace("{host}", socket.gethostname())
        self.store = BlobStore(root)
        self._forwards: list[Any] = []

    @endpoint
    def hostname(self) -> str:
        return socket.gethostname()

    @endpoint
    def missing(self, digests: list[str]) -> list[str]:
        return self.store.missing(digests)

    @endpoint
    def put(self, items: list[tuple[str, int, int, bytes]], downstream: list[Any]) -> None:
        """Write ``(digest, offset, total, data)`` blocks, then hand them to the next host
        of the chain (not waiting for it: ``flush`` does)."""
        for digest, offset, total, data in items:
            self.store.write_block(digest, offset, total, data)
        if downstream:
            self._forwards.append(downstream[0].put.call_one(items, downstream[1:]))

    @endpoint
    def flush(self) -> int:
        """Wait until the next host of the chain has everything this one passed on; the
        first error of theirs is raised here. Returns how many messages were passed on."""
        forwards, self._forwards = self._forwards, []
        for f in forwards:
            f.get(timeout=PUSH_TIMEOUT)
        return len(forwards)


@dataclass
class PushStats:
    """What one push did: the client's bytes on the wire (payload) against the bytes the
    hosts received in all, so ``uploaded_bytes / stored_bytes`` shows the chain at work."""
    hosts: int
    blobs_sent: int = 0
    uploaded_bytes: int = 0
    stored_bytes: int = 0
    messages: int = 0
    seconds: float = 0.0


def blocks_to_send(tree: FileTree, root: str, digests: list[str]):
    """The blocks of ``digests`` read from the client's files, as messages of at most
    ``BLOCK_SIZE`` payload bytes (small files share one; big ones take one per block)."""
    where = tree.paths_of()
    sizes = tree.blobs()
    batch: list[tuple[str, int, int, bytes]] = []
    batch_bytes = 0
    for digest in digests:
        size = sizes[digest]
        path = os.path.join(root, where[digest])
        with open(path, "rb") as f:
            if size < BLOCK_SIZE:
                data = f.read()
                if len(data) != size:
                    raise ValueError(f"{path} changed while it was being shipped (it had "
                                     f"{size} bytes, now {len(data)}): push again")
                if batch_bytes + size > BLOCK_SIZE and batch:
                    yield batch
                    batch, batch_bytes = [], 0
                batch.append((digest, 0, size, data))
                batch_bytes += size
                continue
            for offset in range(0, size, BLOCK_SIZE):
                data = f.read(BLOCK_SIZE)
                if len(data) != min(BLOCK_SIZE, size - offset):
                    raise ValueError(f"{path} changed while it was being shipped (it had "
                                     f"{size} bytes, now fewer): push again")
                yield [(digest, offset, size, data)]
    if batch:
        yield batch


def push_tree(receivers: Any, tree: FileTree, root: str) -> PushStats:
    """Make every member of ``receivers`` (an ActorMesh of BlobReceivers, one per host)
    hold every blob of ``tree``, read from the client's ``root``."""
    started = time.monotonic()
    flat = receivers.flatten("rank")
    members = [flat.slice(rank=r) for r in range(len(flat))]
    sizes = tree.blobs()
    wanted = sorted(sizes)
    lacking = flat.missing.call(wanted).get(timeout=PUSH_TIMEOUT)
    chains: dict[tuple[int, ...], list[str]] = {}
    by_digest: dict[str, list[int]] = {}
    for point, digests in lacking.items():
        for d in digests:
            by_digest.setdefault(d, []).append(point.rank)
    for d, ranks in by_digest.items():
        chains.setdefault(tuple(sorted(ranks)), []).append(d)
    stats = PushStats(hosts=len(members))
    for ranks, digests in chains.items():
        head, rest = members[ranks[0]], [members[r] for r in ranks[1:]]
        in_flight: collections.deque = collections.deque()
        for items in blocks_to_send(tree, root, digests):
            in_flight.append(head.put.call_one(items, rest))
            payload = sum(len(i[3]) for i in items)
            stats.uploaded_bytes += payload
            stats.stored_bytes += payload * len(ranks)
            stats.messages += 1
            if len(in_flight) >= WINDOW:
                in_flight.popleft().get(timeout=PUSH_TIMEOUT)
        for f in in_flight:
            f.get(timeout=PUSH_TIMEOUT)
        for m in [head, *rest]:
            m.flush.call_one().get(timeout=PUSH_TIMEOUT)
        stats.blobs_sent += len(digests)
    stats.seconds = time.monotonic() - started
    return stats
