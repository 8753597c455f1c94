"""Frame encoding and decoding as a pure state machine (sans-I/O).

A frame carries one pickled message plus the out-of-band buffers that pickle
protocol 5 pulled out of it, or a batch of small messages (a pickled list of
their pickle streams, no buffers): a pipelining sender pays one header and one
parse for a hundred messages instead of one each. Big buffers never get joined into one large
bytes object: the encoder returns a list of buffers for ``sendmsg`` and the
decoder asks the I/O layer to read each big buffer straight into its final
home (``next_buffer`` / ``advance``), so a 64 MiB tensor is copied once by
the kernel and never again in Python.

Wire layout of one frame (network byte order)::

    u32 meta_len | u16 nbufs | u16 count | u64 buf_len * nbufs | meta bytes | buf 0 | buf 1 ...

``count`` is the number of messages in the frame: 1 for a single message (``meta``
is its pickle stream); a batch (count > 1, no buffers) has as ``meta`` a pickled list
whose items are the messages' pickle streams or the message tuples themselves.

The top bit of ``buf_len`` (``READONLY_FLAG``) marks a read-only buffer (a ``bytes``
payload, a read-only array). The decoder gives such a buffer back as a ``bytes``
object, read straight into the bytes object's own storage for big buffers, so a
``bytes`` payload is rebuilt by pickle without the extra 64 MiB copy that
``bytes(bytearray)`` costs; writable buffers come back as ``bytearray`` as before.
"""

from __future__ import annotations

import ctypes
import pickle
import struct
import sys
from dataclasses import dataclass
from ..errors import HpcmeshError

_HEAD = struct.Struct("!IHH")
_BUFLEN = struct.Struct("!Q")

#: Frames larger than this (meta plus buffers) close the connection.
DEFAULT_MAX_FRAME = 8 * 1024**3
#: Metadata (the pickle stream without its out-of-band buffers) limit.
DEFAULT_MAX_META = 256 * 1024**2
#: Buffers at least this large are read directly into their own bytearray.
DIRECT_READ_THRESHOLD = 64 * 1024
#: Out-of-band buffers one frame can carry (the header counts them in 16 bits).
MAX_BUFFERS = 65535
#: The most messages one batch frame may hold.
MAX_BATCH_COUNT = 65535
#: Set in a ``buf_len`` for a read-only buffer: it is rebuilt as ``bytes``.
READONLY_FLAG = 1 << 63


# -- uninitialized allocations (documented CPython C API through ctypes) -------------------
# ``bytearray(n)`` zero-fills (a 64 MiB memset) memory that recv_into overwrites at once,
# and a ``bytes`` object cannot be written from Python at all. The C API can make both
# without initializing them: PyByteArray_FromStringAndSize(NULL, n) and
# PyBytes_FromStringAndSize(NULL, n) ("the contents are uninitialized": the documented way
# for C code to fill a new bytes object before anyone else sees it), and
# PyMemoryView_FromMemory(PyBytes_AsString(obj), n, PyBUF_WRITE) gives a writable view of
# the new bytes object's storage. The decoder fills the object completely before handing
# it out, and only ever for sizes >= DIRECT_READ_THRESHOLD (never the shared empty or
# one-byte singletons). The view does not own the object: the decoder keeps the object
# alive while the view is in use. Elsewhere than CPython, plain bytearray/bytes are used.
def _c_api():
    if sys.implementation.name != "cpython":
        return None
    try:
        api = ctypes.pythonapi
        ba_new = api.PyByteArray_FromStringAndSize
        ba_new.restype, ba_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t]
        b_new = api.PyBytes_FromStringAndSize
        b_new.restype, b_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t]
        b_ptr = api.PyBytes_AsString
        b_ptr.restype, b_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object]
        mv_mem = api.PyMemoryView_FromMemory
        mv_mem.restype, mv_mem.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t,
                                                             ctypes.c_int]
    except (AttributeError, OSError):
        return None
    return ba_new, b_new, b_ptr, mv_mem


_PyBUF_WRITE = 0x200
_API = _c_api()


def alloc_writable(size: int, readonly: bool):
    """A new, uninitialized buffer of ``size`` bytes and a writable byte view of it:
    ``bytes`` when the sender's buffer was read-only (filled through the view, then never
    written again), ``bytearray`` otherwise. Without the C API a read-only buffer comes
    back as a bytearray, which pickle's rebuild copies into bytes as before."""
    if _API is None:
        obj = bytearray(size)
        return obj, memoryview(obj)
    ba_new, b_new, b_ptr, mv_mem = _API
    if readonly and size > 1:
        obj = b_new(None, size)
        return obj, mv_mem(b_ptr(obj), size, _PyBUF_WRITE)
    obj = ba_new(None, size)
    return obj, memoryview(obj)


class FrameError(HpcmeshError):
    """The peer sent something that is not a valid frame; the connection must close."""


@dataclass(slots=True)
class Frame:
    meta: memoryview | bytes
    buffers: list
    count: int = 1      # pickle streams in meta (a batch when > 1)
    #: Set when a buffer of this frame could not be allocated here (its size): the frame's
    #: buffers were read and thrown away, ``buffers`` is empty and only ``meta`` arrived.
    dropped: int = 0


def check_frame_limits(meta_len: int, buffers: list = ()) -> None:
    """Raise FrameError, naming the limit, for a frame a peer's decoder would refuse (it
    closes the connection on one): checked where a frame is built, so that the sender's
    one message fails instead."""
    if len(buffers) > MAX_BUFFERS:
        raise FrameError(f"too many out-of-band buffers for one frame: {len(buffers)} > "
                         f"{MAX_BUFFERS} (a list of that many arrays, bytes or tensors; send "
                         f"fewer, bigger ones: np.stack / torch.stack them)")
    if meta_len > DEFAULT_MAX_META:
        raise FrameError(f"the pickled message is {meta_len} bytes, over the limit of "
                         f"{DEFAULT_MAX_META} bytes for the part that is not out-of-band "
                         f"(big data travels best as bytes, numpy arrays or tensors)")
    total = meta_len + sum(memoryview(b).nbytes for b in buffers)
    if total > DEFAULT_MAX_FRAME:
        raise FrameError(f"the message is {total} bytes, over the frame limit of "
                         f"{DEFAULT_MAX_FRAME} bytes: send it in pieces")


def encode_frame(meta: bytes, buffers: list = ()) -> list:
    """Return the pieces to write for one frame (header, meta, buffers as-is)."""
    if len(buffers) > MAX_BUFFERS:
        check_frame_limits(len(meta), buffers)
    views = [b if isinstance(b, memoryview) else memoryview(b) for b in buffers]
    head = _HEAD.pack(len(meta), len(views), 1)
    if views:
        head += b"".join(_BUFLEN.pack(v.nbytes | READONLY_FLAG if v.readonly else v.nbytes)
                         for v in views)
        return [head, meta, *(v.cast("B") if v.ndim != 1 or v.format != "B" else v for v in views)]
    return [head, meta]


def _stream(item) -> bytes:
    """A message's pickle stream: ``item`` if it is one already, else pickled now."""
    return item if type(item) is bytes else pickle.dumps(item, 5)


def encode_lone(item) -> bytes:
    """One small buffer-less message as a whole frame in one ``bytes`` (header and body
    joined: one ``send()`` of it costs less than ``sendmsg`` of two pieces). ``item`` as in
    ``encode_batch``."""
    m = _stream(item)
    return _HEAD.pack(len(m), 0, 1) + m


def encode_batch(items: list) -> list:
    """Return the pieces to write for one frame holding several buffer-less messages.

    Each item is a message's pickle stream (``bytes``) or a message tuple not pickled yet
    (only ever one of immutable builtin values, so pickling it late sends what it was).
    The batch's meta is the list itself, pickled once: the receiver gets the tuples back
    and the streams split with one C call (streams written back to back could not be
    read one by one without their lengths: each starts its pickle memo at zero)."""
    n = len(items)
    if n == 1:
        m = _stream(items[0])
        return [_HEAD.pack(len(m), 0, 1), m]
    if n > MAX_BATCH_COUNT:
        raise FrameError(f"too many messages in one batch: {n} > {MAX_BATCH_COUNT}")
    body = pickle.dumps(items, 5)
    return [_HEAD.pack(len(body), 0, n), body]


class FrameDecoder:
    """Incremental frame parser.

    The I/O layer calls ``next_buffer()`` to get a writable view to read into,
    then ``advance(n)`` with the number of bytes it put there; ``advance``
    returns the frames completed by those bytes.
    """

    __slots__ = ("_buf", "_start", "_end", "_max_frame", "_max_meta",
                 "_state", "_meta_len", "_lens", "_meta", "_bufs", "_target", "_filled",
                 "_chunk", "_count", "_ro", "_view", "_skip", "_dropped")

    _S_HEAD, _S_LENS, _S_META, _S_BUFS, _S_SKIP = range(5)

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, max_meta: int = DEFAULT_MAX_META,
                 chunk: int = 256 * 1024):
        self._chunk = chunk
        self._buf = bytearray(chunk)
        self._start = 0
        self._end = 0
        self._max_frame = max_frame
        self._max_meta = max_meta
        self._state = self._S_HEAD
        self._meta_len = 0
        self._count = 1
        self._lens: list[int] = []
        self._meta = b""
        self._bufs: list = []
        self._ro: list[bool] = []                 # per buffer: rebuild as bytes
        self._skip = 0                  # bytes of a dropped frame still to throw away
        self._dropped = 0               # the size of the buffer that could not be had
        self._target: bytearray | bytes | None = None   # direct-read destination
        self._view: memoryview | None = None     # writable view of _target
        self._filled = 0

    def next_buffer(self) -> memoryview:
        if self._target is not None:
            return self._view[self._filled:]
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buf) > 4 * self._chunk:     # a big message is done: give memory back
                self._buf = bytearray(self._chunk)
        elif len(self._buf) - self._end < 4096:
            # Move the unread tail to the front; if it does not leave room, move it into a
            # new, larger buffer. The old buffer is never resized in place: the caller may
            # still hold a view of it (resizing an exported bytearray raises BufferError).
            tail = self._end - self._start
            if len(self._buf) - tail < 4096:
                new = bytearray(max(2 * len(self._buf), tail + self._chunk))
                new[:tail] = self._buf[self._start:self._end]
                self._buf = new
            else:
                self._buf[:tail] = self._buf[self._start:self._end]
            self._start, self._end = 0, tail
        return memoryview(self._buf)[self._end:]

    def advance(self, n: int) -> list[Frame]:
        if self._target is not None:
            self._filled += n
            if self._filled < len(self._target):
                return []
            self._bufs.append(self._target)
            self._target = self._view = None
            frames: list[Frame] = []
            if len(self._bufs) == len(self._lens):
                frames.append(self._finish())
            frames.extend(self._parse())
            return frames
        self._end += n
        return self._parse()

    def _avail(self) -> int:
        return self._end - self._start

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[self._start:self._start + n])
        self._start += n
        return data

    def _finish(self) -> Frame:
        frame = Frame(self._meta, self._bufs, self._count)
        self._state = self._S_HEAD
        self._meta = b""
        self._bufs = []
        self._lens = []
        self._ro = []
        return frame

    def _parse(self) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            st = self._state
            if st == self._S_HEAD:
                if self._avail() < _HEAD.size:
                    return frames
                self._meta_len, nbufs, self._count = _HEAD.unpack_from(self._buf, self._start)
                self._start += _HEAD.size
                if self._count == 0 or (self._count > 1 and nbufs):
                    raise FrameError(f"invalid frame header: {self._count} messages with "
                                     f"{nbufs} buffers (a batch carries no buffers)")
                if self._meta_len > self._max_meta:
                    raise FrameError(f"frame metadata of {self._meta_len} bytes exceeds the "
                                     f"limit of {self._max_meta} bytes")
                if not nbufs and self._meta_len > self._max_frame:
                    raise FrameError(f"frame of {self._meta_len} bytes exceeds the limit of "
                                     f"{self._max_frame} bytes")
                if not nbufs:
                    end = self._start + self._meta_len
                    if end <= self._end:     # the common small frame, already all here
                        frames.append(Frame(bytes(self._buf[self._start:end]), [], self._count))
                        self._start = end
                        continue
                    self._lens = []
                    self._state = self._S_META
                else:
                    self._lens = [0] * nbufs
                    self._state = self._S_LENS
            elif st == self._S_LENS:
                need = _BUFLEN.size * len(self._lens)
                if self._avail() < need:
                    return frames
                raw = [v for (v,) in _BUFLEN.iter_unpack(self._buf[self._start:self._start + need])]
                self._lens = [v & ~READONLY_FLAG for v in raw]
                self._ro = [v >= READONLY_FLAG for v in raw]
                self._start += need
                total = self._meta_len + sum(self._lens)
                if total > self._max_frame:
                    raise FrameError(f"frame of {total} bytes exceeds the limit of "
                                     f"{self._max_frame} bytes")
                self._state = self._S_META
            elif st == self._S_SKIP:
                n = min(self._avail(), self._skip)
                self._start += n
                self._skip -= n
                if self._skip:
                    return frames
                frame = self._finish()
                frame.buffers, frame.dropped, self._dropped = [], self._dropped, 0
                frames.append(frame)
            elif st == self._S_META:
                if self._avail() < self._meta_len:
                    return frames
                self._meta = self._take(self._meta_len)
                if not self._lens:
                    frames.append(self._finish())
                    continue
                self._state = self._S_BUFS
            else:  # _S_BUFS
                i = len(self._bufs)
                size = self._lens[i]
                avail = self._avail()
                if size >= DIRECT_READ_THRESHOLD and avail < size:
                    try:
                        target, view = alloc_writable(size, self._ro[i])
                    except MemoryError:
                        # Not here: read the rest of this frame into the small buffer and
                        # throw it away; the frame comes out with its meta and ``dropped``
                        # set, so the layer above can fail the one message it carried
                        # (the stream stays in step: the lengths say where the next starts).
                        self._dropped = size
                        self._skip = sum(self._lens[i:])
                        self._bufs = []
                        self._state = self._S_SKIP
                        continue
                    if avail:
                        view[:avail] = memoryview(self._buf)[self._start:self._end]
                    self._start = self._end
                    self._target, self._view, self._filled = target, view, avail
                    return frames
                if avail < size:
                    return frames
                if self._ro[i]:
                    self._bufs.append(bytes(memoryview(self._buf)[self._start:self._start + size]))
                else:
                    self._bufs.append(self._buf[self._start:self._start + size])   # a new bytearray
                self._start += size
                if len(self._bufs) == len(self._lens):
                    frames.append(self._finish())

    def feed(self, data: bytes) -> list[Frame]:
        """Convenience for tests and the handshake leftover: push bytes in."""
        frames: list[Frame] = []
        view = memoryview(data)
        while view.nbytes:
            dst = self.next_buffer()
            n = min(dst.nbytes, view.nbytes)
            dst[:n] = view[:n]
            view = view[n:]
            frames.extend(self.advance(n))
        return frames
