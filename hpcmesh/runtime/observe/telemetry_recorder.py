"""What one process records for the job's telemetry, kept until the controller drains it.

Every process (actor processes, host agents, the controller) has at most one
:class:`Recorder`, the module's :data:`RECORDER`; it is None until telemetry is enabled
(``HPCMESH_TELEMETRY=1`` at start, or the controller's first ``telemetry_drain``), so with
telemetry off a hot path pays one global load and a None check. Recording is an append
to a bounded buffer: no lock, no I/O, no formatting on the call's path. A full buffer
drops the row and counts it (a slow collector never blocks a call); the controller's
collector (``hpcmesh.telemetry``) drains each process about once a second.

The two tables written per call are kept as numbers, their string fields an index into
the log's keys (a tuple of every field per row cost the controller's pipelined calls a
quarter of their speed): ``messages`` as a :class:`KeyedLog` (a row is a few int64s
packed into one bytearray; an actor's queued calls reach it through its
:class:`MailboxRows`, a clock read and a list append a call), ``sent_messages`` as a
:class:`SentLog` (a call appends its key's index; the transport's writes date them).
They travel as int64 bytes plus the keys they use, and the collector makes Arrow columns
of them without a Python step per row.
The other tables' rows are tuples in the columns' order (``hpcmesh/telemetry/schema.py``
names and documents them), less those the collector adds per process (process, host, pid).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from time import time_ns as _time_ns
from typing import Any, Callable

from ...settings import env_flag, env_number
from ...transport import connection
from ...transport.serialization import out_of_band
from . import nvidia_smi

#: Set to 1 in the environment of processes started while telemetry is on.
TELEMETRY_VAR = "HPCMESH_TELEMETRY"
#: Distinct keys a KeyedLog holds before a drain replaces it with an empty one (each key is
#: one (actor, endpoint, caller, ok) or one sent view: a job that makes meshes all along
#: would grow them for ever).
KEYS_LIMIT = 50_000
#: Rows per table a process keeps between two drains (then it drops and counts them).
BUFFER_VAR = "HPCMESH_TELEMETRY_BUFFER"
DEFAULT_BUFFER_ROWS = 100_000

#: The tables a process records into as tuples (the collector adds the rest).
TABLES = ("meshes", "actors", "actor_status_events", "process_status_events", "events",
          "spans", "stragglers", "job_events")
#: Those it records as numbers (``KeyedLog``; ``drain`` hands them out as ``KeyedRows``):
#: per table, the columns a row's numbers become, each with what to divide it by (the
#: clock's nanoseconds become the table's microseconds) and the number, if any, it is
#: counted from (``messages`` keeps a call's start and end: its duration is end - start,
#: so a mailbox need not subtract per call), then the key index; and the columns its
#: key's fields become.
KEYED_TABLES: dict[str, tuple[tuple[tuple[str, int, int | None], ...], tuple[str, ...]]] = {
    "messages": ((("timestamp_us", 1000, None), ("duration_us", 1000, 0), ("bytes", 1, None)),
                 ("to_actor_id", "endpoint", "caller", "status")),
    "sent_messages": ((("timestamp_us", 1000, None),),
                      ("sender", "actor_mesh_id", "endpoint", "method", "view_json", "n_dest")),
}

_PACK_Q = struct.Struct("=q").pack

RECORDER: "Recorder | None" = None
#: Where the controller's collector takes a drain it did not ask for itself: the last one
#: of a process about to be stopped (``ProcMesh.stop``), whose buffer would go with it.
SINK: "Callable[[dict], None] | None" = None


def now_us() -> int:
    """Wall-clock microseconds: comparable across the hosts of a job (as far as their
    clocks agree), which is what a query joining them needs."""
    return time.time_ns() // 1000


class _Keys:
    """The interned string fields of a log's rows: a row holds the index of its key (a
    tuple of those fields) in ``keys``."""
    __slots__ = ("index", "keys", "dropped", "cap", "_lock")

    def __init__(self):
        self.index: dict[tuple, int] = {}   # key -> its position in keys
        self.keys: list[tuple] = []
        self.dropped = 0
        self._lock = threading.Lock()

    def key(self, fields: tuple) -> int:
        """The index of ``fields`` (made on first use; the hot paths look in ``index``
        first and come here for a new key only)."""
        k = self.index.get(fields)
        if k is None:
            with self._lock:
                k = self.index.get(fields)
                if k is None:
                    self.keys.append(fields)
                    k = self.index[fields] = len(self.keys) - 1
        return k


#: Up to this many keys a drain ships them all instead of finding those its rows use (a set
#: of every row's index: ~7 ms a 100k rows, on the worker's event loop).
SHIP_ALL_KEYS = 256


def _keyed_rows(data: bytes, width: int, keys: list, used=None) -> "KeyedRows":
    """``data``'s rows with the keys they use (``used``: their indices, found from the rows
    when not given and the log has more than SHIP_ALL_KEYS; ``keys`` read after the rows
    were taken, so every key they use is in it). An index no key has would be a writer's
    bug: its rows lose their labels, the drain goes on."""
    n = len(keys)
    if n <= SHIP_ALL_KEYS:
        return KeyedRows(data, width, dict(enumerate(keys[:n])))
    if used is None:
        used = set(memoryview(data).cast("q")[width - 1::width])
    return KeyedRows(data, width, {k: keys[k] for k in used if 0 <= k < n})


class KeyedLog(_Keys):
    """A bounded log of rows of ``width`` int64s, the last of each the index of its key (a
    tuple of the row's other fields) in ``keys``. A row is packed into ``data``, one
    bytearray, with one ``extend`` (whole: rows of two threads never mix); no object per
    row outlives its append. Kept rows of Python objects cost the pipeline several times
    what making them costs (a tuple of every field: 0.75 of the speed of pipelined calls; a
    tuple of ints still ~0.5 us a call of the worker's CPU; an ``array``'s append parses
    each int)."""
    __slots__ = ("data", "width", "pack")

    def __init__(self, width: int, max_rows: int):
        super().__init__()
        self.data = bytearray()
        self.width = width
        self.cap = 8 * width * max_rows     # in bytes: compared with len(data)
        self.pack = struct.Struct(f"={width}q").pack

    def successor(self, max_rows: int) -> "KeyedLog":
        """An empty log to replace this one (``retire`` this one once it is published)."""
        return KeyedLog(self.width, max_rows)

    def retire(self) -> None:
        """Replaced: keep no row from now on (it is taken once more, for rows that raced
        in). Called after the successor is published, so a writer that finds this log
        full also finds the one to write to instead."""
        self.cap = 0

    def take(self) -> "KeyedRows":
        """The rows so far (removed), with the keys they use."""
        rows = bytes(self.data)     # one C call: whole rows (a writer's extend is one too)
        del self.data[:len(rows)]   # rows appended meanwhile stay, whole
        return _keyed_rows(rows, self.width, self.keys)

    def add(self, rows, cap: int | None = None) -> None:
        """Packed rows (a bytes-like of whole rows), as many as the bound (``cap``: as the
        caller read it, else now) leaves room for; the rest dropped and counted."""
        data = self.data
        room = (self.cap if cap is None else cap) - len(data)
        if room >= len(rows):
            data.extend(rows)
            return
        size = 8 * self.width
        keep = max(room, 0) // size
        if keep:
            data.extend(memoryview(rows)[:keep * size])
        self.dropped += len(rows) // size - keep


#: A mailbox hands its calls' rows to the log once it holds this many (and whenever the
#: process is drained): a mailbox with a backlog looks every _YIELD_EVERY calls.
MAILBOX_FLUSH_ROWS = 1024


class MailboxRows:
    """The ``messages`` rows of one actor's queued calls, kept as columns until ``flush``
    packs them into the recorder's log in a few C calls.

    Why: a mailbox runs its queued calls back to back on the event loop (a pipelined
    caller's batch frames), and packing each call's row as it ends (two clock reads, a
    ``struct.pack`` and an ``extend``) was most of what telemetry cost the worker's CPU, a
    tenth of a pipelined call's. Here a call costs one clock read and one list append
    (``ends``): it started when the call before it ended (the mailbox starts the next at
    once), or when its *run* started. A run is calls that share their key and bytes (the
    calls of one batch frame to one endpoint from one caller: the mailbox compares three
    objects by identity) and starts whenever those change, after a turn given to the loop,
    and after a call that ran elsewhere; it notes its first call's start (``run``).

    One writer, the mailbox on its loop's thread; ``flush`` from any thread (a drain).
    Runs and failures are noted under the lock, each before the end of the call it is
    about is appended (so a flush between the two cannot take that call without it);
    ``ends`` are appended without the lock."""
    __slots__ = ("recorder", "ends", "runs", "failed", "base", "_lock")

    def __init__(self, recorder: "Recorder"):
        self.recorder = recorder
        self.ends: list[int] = []       # each call's end (time_ns), in call order
        #: (index in ends of its first call, that call's start, bytes a call, key less ok)
        self.runs: list[tuple[int, int, int, tuple]] = []
        self.failed: list[int] = []     # numbers (base + index) of calls that raised
        self.base = 0                   # calls flushed so far: ends[0] is call number base
        self._lock = threading.Lock()

    def run(self, start_ns: int, nbytes: int, key: tuple) -> None:
        """The next call starts a run (``key``: actor id, endpoint, caller)."""
        with self._lock:
            self.runs.append((len(self.ends), start_ns, nbytes, key))

    def fail_next(self) -> None:
        """The call whose end is appended next raised (its row says ``error``)."""
        with self._lock:
            self.failed.append(self.base + len(self.ends))

    def flush(self) -> None:
        """The calls ended so far, as rows of the recorder's ``messages_log``."""
        with self._lock:       # (all worked out before anything is changed)
            ends = self.ends
            n = len(ends)
            if not n:
                return
            e = array("q", ends[:n])
            runs = self.runs
            split = bisect_left([r[0] for r in runs], n)
            done, later = runs[:split], runs[split:]
            if not later or later[0][0] != n:
                # the next call goes on with the last run: it starts when this one ended
                _, _, nbytes, key = done[-1]    # (runs[0] is at 0 while ends has calls)
                later.insert(0, (n, e[n - 1], nbytes, key))
            base = self.base
            failed = [f - base for f in self.failed if base <= f < base + n]
            del ends[:n]                # (a call ending meanwhile on the loop stays)
            self.runs = [(first - n, start, nbytes, key) for first, start, nbytes, key in later]
            self.base = base + n
            self.failed = [f for f in self.failed if f >= base + n]
        self.recorder.add_mailbox_rows(_mailbox_rows(e, done), done, failed)


def _mailbox_rows(ends: array, runs: list) -> bytearray:
    """(start, end, bytes, key index) rows of calls that ended at ``ends``, their key
    indices left 0 (``Recorder.add_mailbox_rows`` fills them in)."""
    n = len(ends)
    buf = bytearray(32 * n)
    rows = memoryview(buf).cast("q")
    rows[1::4] = ends
    if n > 1:
        rows[4::4] = memoryview(ends)[:-1]      # a call starts as the one before it ends
    for i, (first, start, nbytes, _) in enumerate(runs):
        rows[4 * first] = start     # ... unless it starts a run (later runs win a tie)
        end = runs[i + 1][0] if i + 1 < len(runs) else n
        if end > first and nbytes:
            rows[4 * first + 2:4 * end:4] = array("q", (nbytes,)) * (end - first)
    return buf


class SentLog(_Keys):
    """``sent_messages``: rows of (time_ns, key index), made so that the caller's thread
    pays one ``list.append`` a call (``calls``; and a ``len`` for the bound: past ``cap``
    calls between two drains the newest are dropped and counted).

    The caller's thread is the pipeline's critical path: packing a timestamped row there
    (the KeyedLog way) cost pipelined calls 13-15 % of their speed, more than its CPU
    (~0.3 us of ~6). So a call only appends its key, and the time comes from the transport:
    each write to a socket (``stamp``, from ``transport.connection.WRITE_HOOK``) notes how
    many calls had been made by then. A call's timestamp is that of the first write after
    it: when the frame carrying it (or an earlier one) went out, between the call and its
    own send (a call that never leads to a write is dated by the drain that takes it)."""
    __slots__ = ("calls", "mark_times", "mark_counts", "base", "last", "width")

    def __init__(self, max_rows: int):
        super().__init__()
        self.calls: list[int] = []          # key indices, in call order
        self.mark_times = array("q")        # a write's time_ns...
        self.mark_counts = array("q")       # ... and how many calls were made by then
        self.base = 0       # calls taken so far: calls[0] is call number base
        self.last = 0       # the count in the last mark
        self.cap = max_rows
        self.width = 2

    def append(self, key: int) -> None:
        """One call (``Endpoint.call_one`` writes this out)."""
        calls = self.calls
        if len(calls) < self.cap:
            calls.append(key)
        else:
            self.overflow()

    def overflow(self) -> None:
        """A call past the bound: counted, not kept."""
        with self._lock:
            self.dropped += 1

    def stamp(self) -> None:
        """A write is going out: the calls made so far were sent by now (any thread)."""
        if self.base + len(self.calls) == self.last:    # nothing new. An unlocked look: a
            return      # take between its two reads can hide new calls from it, which the
        #                 next write (or the take) then dates, a little later than their own
        with self._lock:
            n = self.base + len(self.calls)
            if n != self.last:
                self.last = n
                self.mark_times.append(_time_ns())
                self.mark_counts.append(n)

    def successor(self, max_rows: int) -> "SentLog":
        """An empty log to replace this one (calls that reach this one meanwhile are taken
        once more, dated by that take)."""
        return SentLog(max_rows)

    def retire(self) -> None:
        """Replaced (or its recorder switched off): keep no call from now on (the rule is
        ``SentSite``'s: a cap of 0 sends a site's next call to the recorder's log)."""
        self.cap = 0

    def take(self) -> "SentRows":
        """The calls so far (removed), with the marks that date them: each call takes the
        time of the first mark that counts it, or now if no write has stamped it yet."""
        with self._lock:
            calls = self.calls
            n = len(calls)
            taken = calls[:n]               # calls appended meanwhile stay
            del calls[:n]
            first = self.base
            self.base = first + n
            times, counts = self.mark_times, self.mark_counts
            self.mark_times, self.mark_counts = array("q"), array("q")
            now = _time_ns()
        return SentRows(taken, times, counts, first, now, self.keys)


#: A log that keeps nothing: a ``SentSite``'s until its first call that records.
CLOSED_LOG = SentLog(0)
CLOSED_ROW = (CLOSED_LOG, CLOSED_LOG.calls, 0)


class SentSite:
    """One call site's rows of ``sent_messages`` (an endpoint's, for one way of calling
    it): the handle the caller's thread notes its calls through, and the one owner of the
    rule that keeps it on the recorder's current log.

    ``row`` is ``(log, log.calls, key)``: the hot path (``Endpoint.call_one``) reads it once
    and appends ``key`` to ``calls`` while ``len(calls) < log.cap``, else calls ``note()``.
    The rule: a log the recorder no longer writes to (replaced past ``KEYS_LIMIT`` keys by
    a drain, or let go when telemetry is switched off) has ``cap`` 0 (``SentLog.retire``),
    and so has ``CLOSED_LOG``, the site's log before its first call; so the bound check
    fails on it and ``note()`` binds the site to the recorder's log of now, making the
    key there. A call racing a drain may land in the log just retired: the drain takes
    that log once more (``Recorder.drain``)."""
    __slots__ = ("row",)

    def __init__(self):
        self.row: tuple = CLOSED_ROW

    def note(self, make_fields: Callable[..., tuple], *args: Any) -> None:
        """One call, the general way (what every call but call_one's inline check does).
        ``make_fields(*args)``: the rows' key fields, called when a log first needs them
        (the site holds no reference to its owner: no cycle)."""
        rec = RECORDER
        if rec is None:
            return
        log = rec.sent_log      # one read: the key and the call go to the same log
        row = self.row
        if row[0] is not log:
            row = self.row = (log, log.calls, log.key(make_fields(*args)))
        log.append(row[2])


class SentRows:
    """What ``SentLog.take`` hands out: the calls' key indices in order, and the marks that
    date them, as taken. Made into rows only when read (``keyed``) or pickled: the
    controller's own drain goes to its store as is, so a collection costs its pipelined
    caller no work per call; the store makes columns of them when they are read."""
    __slots__ = ("calls", "times", "counts", "first", "now", "keys")

    def __init__(self, calls: list, times: array, counts: array, first: int, now: int,
                 keys: list):
        self.calls, self.times, self.counts = calls, times, counts
        self.first, self.now = first, now
        self.keys = keys        # the log's (it only grows: every index used is in it)

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def nbytes(self) -> int:
        """About the memory it holds: a list slot a call (the key objects are shared), two
        int64s a mark."""
        return 8 * len(self.calls) + 8 * (len(self.times) + len(self.counts))

    def keyed(self) -> "KeyedRows":
        """As (time_ns, key index) rows."""
        n = len(self.calls)
        end = self.first + n
        # the times column as runs of equal times (a mark per write, not per call: the
        # work here is per mark, the copies per row are C's)
        runs = []
        done = self.first
        for t, count in zip(self.times, self.counts):   # in order of count, and of time
            if count > done:
                if count > end:
                    count = end
                runs.append(_PACK_Q(t) * (count - done))
                done = count
        runs.append(_PACK_Q(self.now) * (end - done))
        data = bytearray(16 * n)
        rows = memoryview(data).cast("q")
        rows[0::2] = memoryview(b"".join(runs)).cast("q")
        rows[1::2] = array("q", self.calls)
        return _keyed_rows(bytes(data), 2, self.keys,
                           set(self.calls) if len(self.keys) > SHIP_ALL_KEYS else None)

    def __reduce_ex__(self, protocol):
        return self.keyed().__reduce_ex__(protocol)

    def merged(self, other) -> "KeyedRows":
        return self.keyed().merged(other.keyed() if isinstance(other, SentRows) else other)

    def rows(self) -> list[tuple]:
        return self.keyed().rows()


class KeyedRows:
    """What ``KeyedLog.take`` hands out: the rows' int64s as bytes (native order: the
    collector is on another host of the same job, the same architecture), the row width,
    and ``{key index: fields}`` for the keys in them."""
    __slots__ = ("data", "width", "keys")

    def __init__(self, data: bytes, width: int, keys: dict[int, tuple]):
        self.data, self.width, self.keys = data, width, keys

    def __len__(self) -> int:
        return len(self.data) // (8 * self.width)

    def __reduce_ex__(self, protocol):
        # protocol 5 (a drain's reply): the rows leave the stream as an out-of-band buffer
        data = out_of_band(self.data) if protocol >= 5 else self.data
        return KeyedRows, (data, self.width, self.keys)

    def merged(self, other: "KeyedRows") -> "KeyedRows":
        """These rows, then ``other``'s (another log's: its key indices are moved past
        these). For the few rows that reach a retired log; not a hot path."""
        if not len(other):
            return self
        offset = max(self.keys) + 1 if self.keys else 0
        nums = memoryview(bytearray(other.data)).cast("q")
        for i in range(other.width - 1, len(nums), other.width):
            nums[i] += offset
        keys = dict(self.keys)
        keys.update((k + offset, fields) for k, fields in other.keys.items())
        return KeyedRows(self.data + nums.tobytes(), self.width, keys)

    def rows(self) -> list[tuple]:
        """As tuples of numbers and key fields, in order (tests, small tables)."""
        nums = memoryview(self.data).cast("q")
        w = self.width
        return [tuple(nums[i:i + w - 1].tolist()) + self.keys[nums[i + w - 1]]
                for i in range(0, len(nums), w)]


class Recorder:
    """Bounded per-table buffers; ``drain()`` hands them over."""

    def __init__(self, max_rows: int = DEFAULT_BUFFER_ROWS, *, sample_gpus: bool = False):
        self.max_rows = max_rows
        self.rows: dict[str, deque] = {t: deque() for t in TABLES}
        self.dropped: dict[str, int] = dict.fromkeys(TABLES, 0)
        self.sample_gpus = sample_gpus
        self._last_cpu = (time.monotonic(), _cpu_seconds())
        #: ``messages``: (start_ns, end_ns, bytes, key) rows (``KEYED_TABLES``)
        self.messages_log = KeyedLog(len(KEYED_TABLES["messages"][0]) + 1, max_rows)
        #: ``sent_messages``: (time_ns, key) rows
        self.sent_log = SentLog(max_rows)
        #: logs replaced for holding KEYS_LIMIT keys: taken once more (rows that raced in)
        self._retired: list[tuple[str, KeyedLog | SentLog]] = []
        #: the actors' mailboxes' rows not yet packed into messages_log (``mailbox``)
        self._mailboxes: set[MailboxRows] = set()
        self._mailboxes_lock = threading.Lock()

    # -- recording (any thread) ------------------------------------------------------
    def add(self, table: str, row: tuple) -> None:
        rows = self.rows[table]
        if len(rows) < self.max_rows:
            rows.append(row)
        else:
            self.dropped[table] += 1

    def received(self, start_ns: int, actor_id: str, endpoint: str, caller: str | None,
                 end_ns: int, ok: bool, nbytes: int) -> None:
        """One call handled by an actor of this process (``messages``; ``endpoint`` as
        the call named it: ``drain`` shows it without an ``as_endpoint`` prefix; ``caller``
        a node id, ``drain`` names it)."""
        log = self.messages_log
        data = log.data
        if len(data) < log.cap:
            key = (actor_id, endpoint, caller, ok)
            k = log.index.get(key)
            data.extend(log.pack(start_ns, end_ns, nbytes,
                                 k if k is not None else log.key(key)))
        else:
            log.dropped += 1

    def mailbox(self) -> MailboxRows:
        """Where an actor's mailbox keeps its calls' rows until they are packed (``drain``
        packs them; ``forget`` when the actor stops)."""
        rows = MailboxRows(self)
        with self._mailboxes_lock:
            self._mailboxes.add(rows)
        return rows

    def forget(self, rows: MailboxRows) -> None:
        """An actor stopped: its rows so far into the log, and no more."""
        rows.flush()
        with self._mailboxes_lock:
            self._mailboxes.discard(rows)

    def add_mailbox_rows(self, buf: bytearray, runs: list, failed: list) -> None:
        """``MailboxRows.flush``'s rows, their key indices filled in from the log they go
        to (looked up once a run; a call that raised has its own key)."""
        rows = memoryview(buf).cast("q")
        n = len(rows) // 4
        firsts = [r[0] for r in runs]
        while True:
            log = self.messages_log
            cap = log.cap   # read first: retired after this, the log is still taken once more
            index = log.index
            for i, (first, _, _, key) in enumerate(runs):
                end = runs[i + 1][0] if i + 1 < len(runs) else n
                if end > first:
                    k = index.get(key + (True,))
                    if k is None:
                        k = log.key(key + (True,))
                    rows[4 * first + 3:4 * end:4] = array("q", (k,)) * (end - first)
            for j in failed:    # (its run: the last to start at or before it)
                key = runs[bisect_right(firsts, j) - 1][3]
                rows[4 * j + 3] = log.key(key + (False,))
            if cap or log is self.messages_log:
                break       # (retired before by a drain on another thread: to its successor)
        log.add(buf, cap)

    def sent(self, key: int, log: SentLog | None = None) -> None:
        """One call made from this process to an actor mesh or a view of one
        (``sent_messages``: one row per call, however many actors it went to); ``key``:
        ``log.key((sender, actor_mesh_id, endpoint, method, view_json, n_dest))``, of the
        ``sent_log`` it was read from (a drain may replace it meanwhile).
        ``Endpoint.call_one`` writes this out."""
        (log or self.sent_log).append(key)


    def mesh(self, mesh_id: str, kind: str, class_name: str, given_name: str,
             shape_json: str, parent_mesh_id: str | None = None) -> None:
        self.add("meshes", (now_us(), mesh_id, kind, class_name, given_name, shape_json,
                            parent_mesh_id))

    def actor(self, actor_id: str, mesh_id: str, rank: int, full_name: str, process: str,
              host: str, pid: int | None) -> None:
        self.add("actors", (now_us(), actor_id, mesh_id, rank, full_name, process, host, pid))

    def status(self, actor_id: str, new_status: str, reason: str | None = None,
               failure_class: str | None = None) -> None:
        self.add("actor_status_events", (now_us(), actor_id, new_status, reason,
                                         failure_class or None))

    def process_status(self, process: str, mesh_name: str, label: str, host: str,
                       pid: int | None, new_status: str, reason: str | None = None,
                       failure_class: str | None = None) -> None:
        self.add("process_status_events", (now_us(), process, mesh_name, label, host, pid,
                                           new_status, reason, failure_class or None))

    def event(self, level: str, source: str, message: str) -> None:
        """A log line or another notable fact (``events``)."""
        self.add("events", (now_us(), level, source, message))

    def job_event(self, kind: str, job_id: str, restart: int, reason: str,
                  timestamp_us: int | None = None) -> None:
        """The job itself moved: requeued, preempted, ... (``job_events``; SPEC §12)."""
        self.add("job_events", (now_us() if timestamp_us is None else timestamp_us, kind,
                                job_id, restart, reason))

    def span(self, start_us: int, span_id: str, parent_span_id: str | None, name: str,
             duration_us: int, status: str, error: str | None, actor_id: str | None,
             endpoint: str | None, attributes_json: str) -> None:
        """A span that ended (``spans``; ``runtime/observe/spans.py`` writes it)."""
        self.add("spans", (start_us, span_id, parent_span_id, name, duration_us, status,
                           error, actor_id, endpoint, attributes_json))

    # -- draining (the ``telemetry_drain`` service) ----------------------------------
    def drain(self, caller_name: Callable[[str | None], str | None] | None = None,
              who: dict | None = None) -> dict[str, Any]:
        """Everything recorded since the last drain, the drop counts, and a sample of this
        process's CPU and memory (and its host's GPUs, for a host agent). ``caller_name``
        turns the callers' node ids in ``messages`` into process names (done here, not
        per call); ``who``: this process (name, host, pid), for the collector."""
        tables: dict[str, Any] = {}
        dropped = {k: v for k, v in self.dropped.items() if v}
        for k in dropped:
            self.dropped[k] = 0
        retired, self._retired = self._retired, []
        with self._mailboxes_lock:
            mailboxes = list(self._mailboxes)
        for rows in mailboxes:
            rows.flush()
        for name, attr in (("messages", "messages_log"), ("sent_messages", "sent_log")):
            log = getattr(self, attr)
            rows = log.take()
            if len(log.keys) > KEYS_LIMIT:      # a fresh log; this one is taken once more
                setattr(self, attr, log.successor(self.max_rows))
                log.retire()
                self._retired.append((name, log))
            for old_name, old in retired:
                if old_name == name:
                    rows = rows.merged(old.take())
                    log.dropped += old.dropped
            with log._lock:     # (a SentLog counts under it)
                n, log.dropped = log.dropped, 0
            if n:
                dropped[name] = dropped.get(name, 0) + n
            tables[name] = rows
        for name, rows in self.rows.items():
            n = len(rows)       # popleft, not a swap: appends from other threads go on
            tables[name] = [rows.popleft() for _ in range(n)]
        who_called = caller_name or (lambda node_id: node_id)
        tables["messages"].keys = {
            k: (actor_id, endpoint.rpartition(":")[2], who_called(caller),
                "ok" if ok else "error")
            for k, (actor_id, endpoint, caller, ok) in tables["messages"].keys.items()}
        out = {"tables": tables, "dropped": dropped, "process": self.sample_process(),
               "who": who}
        if self.sample_gpus:
            out["gpus"] = sample_gpus()
        return out

    def sample_process(self) -> dict[str, Any]:
        """CPU use since the previous sample (percent of one core), RSS, threads."""
        t, cpu = time.monotonic(), _cpu_seconds()
        t0, cpu0 = self._last_cpu
        self._last_cpu = (t, cpu)
        return {"timestamp_us": now_us(), "cpu_percent": 100.0 * (cpu - cpu0) / max(t - t0, 1e-6),
                "rss_bytes": _rss_bytes(), "threads": _thread_count()}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


# -- GPUs -------------------------------------------------------------------------------
def sample_gpus(timeout: float = 2.0) -> list[dict[str, Any]]:
    """This host's GPUs now, [] where there is no nvidia-smi or it fails (a sample is
    skipped, not an error)."""
    try:
        return nvidia_smi.query_gpus(timeout) or []
    except nvidia_smi.NvidiaSmiError:
        return []


# -- switching on -------------------------------------------------------------------------
def buffer_rows(env=None) -> int:
    return int(env_number(BUFFER_VAR, DEFAULT_BUFFER_ROWS, unit="rows", minimum=1,
                          integer=True, env=env))


def enable(*, sample_gpus: bool = False) -> Recorder:
    """This process's recorder, made on first use (idempotent)."""
    global RECORDER
    if RECORDER is None:
        RECORDER = Recorder(buffer_rows(), sample_gpus=sample_gpus)
        connection.WRITE_HOOK = _stamp_sent
    elif sample_gpus:
        RECORDER.sample_gpus = True
    return RECORDER


def disable() -> None:
    global RECORDER
    if RECORDER is not None:
        RECORDER.sent_log.retire()      # (call_one's cached rows find it closed)
    RECORDER = None
    connection.WRITE_HOOK = None


def resume(recorder: Recorder) -> Recorder:
    """``recorder`` (switched off by ``disable``, rows and all) records again: for a
    benchmark that compares a job with and without telemetry."""
    global RECORDER
    recorder.sent_log.cap = recorder.max_rows
    RECORDER = recorder
    connection.WRITE_HOOK = _stamp_sent
    return recorder


def _stamp_sent() -> None:
    """The transport's ``WRITE_HOOK`` while this process records: a write is going out,
    which dates the calls made so far (``SentLog.stamp``)."""
    rec = RECORDER
    if rec is not None:
        rec.sent_log.stamp()


def enable_from_env(*, sample_gpus: bool = False) -> None:
    """At process start: record from the first call if the controller asked for it."""
    if env_flag(TELEMETRY_VAR, False):
        enable(sample_gpus=sample_gpus)


def install_service(node: Any, *, sample_gpus: bool = False) -> None:
    """Offer ``telemetry_drain`` on ``node``: the first drain switches recording on (a
    process started before telemetry was enabled records from then on). ``relayed``: the
    caller is this host's agent, which passes the rows on to the controller as they came
    (``Pickled``'s ``relays``)."""
    enable_from_env(sample_gpus=sample_gpus)
    who = {"name": node.name, "host": socket.gethostname(), "pid": os.getpid(),
           "role": node.role}

    def drain(relayed: bool = False) -> dict[str, Any]:
        out = enable(sample_gpus=sample_gpus).drain(lambda node_id: peer_name(node, node_id),
                                                    who)
        out["tables"] = Pickled(out["tables"], relays=1 if relayed else 0)
        return out
    node.services["telemetry_drain"] = drain


class Pickled:
    """A value pickled now, by the C pickler; unpickled it is the value again. The drained
    rows travel so: the runtime's reply pickler would walk each of their fields (~2.1 µs
    of the process's CPU a call, against ~0.6 µs so). Their int64 rows are kept out of
    the stream (``KeyedRows``' protocol-5 reduce) and travel as the reply frame's
    out-of-band buffers: neither side copies them (a 100k-row drain is 3.2 MB).

    ``relays``: how many hops it stays packed for (a host agent passing its processes'
    drains on to the controller neither unpickles nor pickles their rows again)."""
    __slots__ = ("data", "buffers", "relays")

    def __init__(self, value: Any, relays: int = 0):
        buffers: list[pickle.PickleBuffer] = []
        self.data = pickle.dumps(value, 5, buffer_callback=buffers.append)
        self.buffers = [b.raw() for b in buffers]
        self.relays = relays

    def __reduce_ex__(self, protocol):
        wrap = bytes if protocol < 5 else out_of_band   # (a copy, an older protocol: inline)
        if self.relays:
            return _relayed, (self.relays - 1, self.data, *map(wrap, self.buffers))
        return _unpickle, (self.data, *map(wrap, self.buffers))


def _unpickle(data: bytes, *buffers) -> Any:
    return pickle.loads(data, buffers=buffers)


def _relayed(relays: int, data: bytes, *buffers) -> Pickled:
    """A ``Pickled`` that arrived at a relay: still packed, for ``relays`` more hops."""
    p = Pickled.__new__(Pickled)
    p.data, p.buffers, p.relays = data, list(buffers), relays
    return p


def peer_name(node: Any, node_id: str | None) -> str | None:
    """The name a peer gave in its hello (a process name, or "client"), else its id."""
    if node_id is None or node_id == node.node_id:
        return node.name
    p = node.peers.by_id.get(node_id)
    conn = getattr(p, "conn", None)
    info = conn.info.get("peer_info") if conn is not None else None
    return (info or {}).get("name") or node_id
