"""The process that runs the controller's telemetry SQL, so that a query can be stopped.

DataFusion's Python API cannot cancel a running query: a thread that stops waiting for one
leaves it running (a cross join kept 1.5 cores busy after its client had gone), and what a
query allocates grows the controller. So ``QueryEngine`` hands each query to this worker
process, which it can kill: at the time limit, or when the worker grows past the memory
limit by what DataFusion's memory pool does not track (a huge ``repeat()``).

The worker keeps a copy of the store's record batches: each query sends first the batches
the worker lacks (in frames of ``CHUNK_BYTES``), then the order of each changed table and
the statement. The worker runs it in a fresh session under DataFusion's read-only
``SQLOptions`` (no DDL, no DML, no other statements: DataFusion's planner refuses them),
with a memory pool and no spill files, and streams the answer back up to a row and byte
cap. A worker idle for ``IDLE_EXIT_S`` is stopped (its copy of the store with it); the
next query starts a new one.

Wire, both ways over one socket pair: a frame is a 4-byte length, a JSON header, then the
byte blobs (Arrow IPC streams) whose lengths the header lists.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from ..errors import HpcmeshError

#: A worker that got no query for this long is stopped (the next query starts another).
IDLE_EXIT_S = 60.0
#: DataFusion's partitions per query: one core of a shared login node per query, and a
#: memory use that does not depend on how the cores interleave.
TARGET_PARTITIONS = 1
#: The worker's memory may grow by this many times the pool's limit during a query
#: (answers streaming through, allocations the pool does not track) before it is killed.
RSS_FACTOR = 2
#: Beyond a query's time limit: what starting its worker and handing it the tables may take.
WORKER_START_S = 30.0

#: Bytes of record batches per frame of the worker's copy (at least one batch a frame).
CHUNK_BYTES = 16 << 20

_LEN = struct.Struct("!I")
_MAX_HEADER = 64 << 20
_POLL_S = 0.05
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from hpcmesh.telemetry.query_worker import main; main(int(sys.argv[2]))")


class WorkerError(HpcmeshError, RuntimeError):
    """A query the worker did not answer: ``kind`` (failed, panic, rows, bytes, timeout,
    memory, crashed, busy) and what DataFusion or the worker said."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def _frame(header: dict, blobs: Sequence[Any] = ()) -> list[memoryview]:
    views = [memoryview(b).cast("B") for b in blobs]
    raw = json.dumps(dict(header, blobs=[v.nbytes for v in views])).encode()
    return [memoryview(_LEN.pack(len(raw)) + raw), *views]


# -- the controller's side ----------------------------------------------------------------
class QueryWorker:
    """The controller's handle on one worker process at a time: ``run`` one query under
    the limits (one at a time: a lock), killing and forgetting the worker when a query
    goes past them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._sent: dict[str, list[tuple[Any, int]]] = {}    # what the worker holds
        self._serial = 0
        self._rss_base = 0
        self._last_used = 0.0
        #: table -> record batches shipped to the workers so far (what queries had to send)
        self.batches_sent: dict[str, int] = {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None \
            else None

    @property
    def held_batches(self) -> int:
        """Record batches the worker holds (kept alive here until it is stopped)."""
        return sum(len(held) for held in self._sent.values())

    def run(self, sql: str, tables: dict[str, list], *, timeout_s: float,
            memory_bytes: int, max_rows: int) -> Any:
        """The answer as a ``pyarrow.Table``, or ``WorkerError``."""
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            raise WorkerError("busy", f"another query kept the query worker for the whole "
                                      f"time limit ({timeout_s:g} s)")
        try:
            return self._run(sql, tables, timeout_s, memory_bytes, max_rows)
        finally:
            self._last_used = time.monotonic()
            self._lock.release()

    def close(self) -> None:
        """Stop the worker; a query running on it ends with a WorkerError."""
        if self._lock.acquire(timeout=1):
            try:
                self._stop()
            finally:
                self._lock.release()
        else:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.kill()     # the query's own thread sees it go and cleans up

    # -- one query ---------------------------------------------------------------------
    def _run(self, sql: str, tables: dict[str, list], timeout_s: float, memory_bytes: int,
             max_rows: int) -> Any:
        """The limit is the query's own: it starts once the worker has the query and its
        libraries loaded (``started``). Starting a worker, importing DataFusion (seconds on
        a busy login node), and handing it the tables get ``WORKER_START_S`` more."""
        import pyarrow as pa
        deadline = time.monotonic() + timeout_s + WORKER_START_S
        if self._proc is not None and self._proc.poll() is not None:
            self._stop()        # it died since the last query
        if self._proc is None:
            self._start()
        try:
            order, new = self._changes(tables)
            for name, batches in new:
                self._send_batches(name, batches, deadline)
            header = {"sql": sql, "tables": order, "memory_bytes": memory_bytes,
                      "max_rows": max_rows, "max_bytes": memory_bytes}
            self._send(_frame(header), deadline)
            started, _ = self._recv(deadline, rss_cap=None, max_blob=0)
            deadline = time.monotonic() + timeout_s
            self._rss_base = started.get("rss", 0)
            rss_cap = self._rss_base + RSS_FACTOR * memory_bytes
            answer, got = self._recv(deadline, rss_cap=rss_cap,
                                     max_blob=memory_bytes + (1 << 20))
            if answer.get("error") == "start":
                raise ImportError(answer.get("message", ""))
            if "error" in answer:
                if answer["error"] == "panic":     # its state may be broken: a new one
                    self._stop()
                raise WorkerError(answer["error"], answer.get("message", ""))
            return pa.ipc.open_stream(pa.py_buffer(got[0])).read_all()
        except (WorkerError, ImportError):
            raise
        except BaseException:
            self._stop()       # where the exchange stopped is unknown: start afresh
            raise

    def _changes(self, tables: dict[str, list]) -> tuple[dict, list]:
        """What the worker lacks: the order of batch serials of each changed table, and
        (table, [(batch, serial)]) of the batches it has not been sent (it keeps the
        rest)."""
        order: dict[str, list[int]] = {}
        new_batches: list[tuple[str, list]] = []
        for name, batches in tables.items():
            old = self._sent.get(name, [])
            known = {id(b): s for b, s in old}       # ``old`` holds them: ids stay unique
            now, new = [], []
            for b in batches:
                s = known.get(id(b))
                if s is None:
                    self._serial += 1
                    s = self._serial
                    new.append((b, s))
                now.append((b, s))
            if [s for _, s in now] == [s for _, s in old]:
                continue
            order[name] = [s for _, s in now]
            if new:
                new_batches.append((name, new))
            self._sent[name] = now
        return order, new_batches

    def _send_batches(self, name: str, batches: list, deadline: float) -> None:
        """``batches`` of table ``name`` as frames of Arrow IPC of about ``CHUNK_BYTES``:
        the controller's memory holds one frame at a time, not a copy of the store."""
        import pyarrow as pa
        i = 0
        while i < len(batches):
            part, size = [], 0
            while i < len(batches) and (not part or size < CHUNK_BYTES):
                part.append(batches[i])
                size += batches[i][0].nbytes
                i += 1
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part[0][0].schema) as w:
                for b, _ in part:
                    w.write_batch(b)
            self._send(_frame({"table": name, "serials": [s for _, s in part]},
                              [sink.getvalue()]), deadline)
            self.batches_sent[name] = self.batches_sent.get(name, 0) + len(part)

    # -- the process ---------------------------------------------------------------------
    def _start(self) -> None:
        if not sys.executable:
            raise RuntimeError("telemetry queries run in a worker process started with "
                               "this Python (sys.executable), which is unknown here")
        mine, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.setblocking(False)     # waits are polls, so the limits are checked meanwhile
        self._sock = mine
        self._sent = {}
        self._last_used = time.monotonic()
        threading.Thread(target=self._stop_when_idle, args=(self._proc,), daemon=True,
                         name="hpcmesh-query-worker-idle").start()

    def _stop_when_idle(self, proc: subprocess.Popen) -> None:
        """Stop ``proc`` once no query used it for ``IDLE_EXIT_S``: its copy of the store,
        and the batches kept here to know what it holds, are freed."""
        while True:
            time.sleep(max(0.1, self._last_used + IDLE_EXIT_S - time.monotonic()))
            with self._lock:
                if self._proc is not proc:
                    return
                if time.monotonic() - self._last_used >= IDLE_EXIT_S:
                    self._stop()
                    return

    def _stop(self) -> None:
        """Kill the worker (SIGKILL: its query stops using CPU at once) and forget it."""
        proc, sock = self._proc, self._sock
        self._proc = self._sock = None
        self._sent = {}
        if sock is not None:
            sock.close()
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _fail(self, kind: str, message: str) -> WorkerError:
        self._stop()
        return WorkerError(kind, message)

    def _gone(self) -> WorkerError:
        """The worker closed its end: it died."""
        proc = self._proc
        self._stop()
        code = proc.returncode if proc is not None else None
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            if -code in (signal.SIGABRT, signal.SIGKILL):
                how += " (an allocation that failed, or the kernel's OOM killer)"
        else:
            how = f"exited with status {code}"
        return WorkerError("crashed", f"the query worker {how} during the query")

    def _check(self, deadline: float, rss_cap: int | None) -> None:
        if time.monotonic() >= deadline:
            raise self._fail("timeout", "")
        if rss_cap is not None and self._proc is not None:
            rss = _rss(self._proc.pid)
            if rss is not None and rss > rss_cap:
                raise self._fail("memory", f"its worker process grew by "
                                           f"{(rss - self._rss_base) >> 20} MB (more than "
                                           f"{RSS_FACTOR} times the limit) and was stopped")

    def _send(self, views: list[memoryview], deadline: float) -> None:
        sock = self._sock
        assert sock is not None
        for view in views:
            while view.nbytes:
                self._check(deadline, None)
                if not _ready(sock, select.POLLOUT, _POLL_S):
                    continue
                try:
                    n = sock.send(view[:1 << 20])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    raise self._gone() from None
                view = view[n:]

    def _recv_exact(self, n: int, deadline: float, rss_cap: int | None) -> bytearray:
        sock = self._sock
        assert sock is not None
        buf = bytearray(n)
        view = memoryview(buf)
        while view.nbytes:
            self._check(deadline, rss_cap)
            if not _ready(sock, select.POLLIN, _POLL_S):
                continue
            try:
                got = sock.recv_into(view, min(view.nbytes, 1 << 20))
            except BlockingIOError:
                continue
            except ConnectionResetError:
                got = 0
            if not got:
                raise self._gone()
            view = view[got:]
        return buf

    def _recv(self, deadline: float, rss_cap: int | None,
              max_blob: int) -> tuple[dict, list[bytearray]]:
        size = _LEN.unpack(self._recv_exact(_LEN.size, deadline, rss_cap))[0]
        if size > _MAX_HEADER:
            raise self._fail("crashed", f"the query worker sent a header of {size} bytes")
        header = json.loads(self._recv_exact(size, deadline, rss_cap))
        if sum(header.get("blobs", [])) > max_blob:
            raise self._fail("bytes", f"{sum(header['blobs'])} bytes")
        return header, [self._recv_exact(n, deadline, rss_cap) for n in header["blobs"]]


def _ready(sock: socket.socket, event: int, timeout_s: float) -> bool:
    """Whether ``sock`` is ready for ``event`` (or closed) within ``timeout_s`` (poll, not
    select: a controller may hold more than 1024 descriptors)."""
    p = select.poll()
    p.register(sock, event)
    return bool(p.poll(timeout_s * 1000))


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# -- the worker's side --------------------------------------------------------------------
def main(fd: int) -> None:
    """The worker process: serve queries on socket ``fd`` until the controller closes it
    or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the controller decides when it ends
    parent = os.getppid()

    def orphaned() -> None:   # its controller killed mid-query: stop now, not at the end
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)
    threading.Thread(target=orphaned, daemon=True).start()
    sock = socket.socket(fileno=fd)
    rfile, wfile = sock.makefile("rb"), sock.makefile("wb")
    state: dict[str, list[tuple[int, Any]]] = {}      # per table: (serial, batch)
    sent: dict[str, dict[int, Any]] = {}                # batches sent for the next query
    while True:
        frame = _read_frame(rfile)
        if frame is None:
            return
        header, blobs = frame
        if "table" in header:        # batches the next query's tables will name
            import pyarrow as pa
            reader = pa.ipc.open_stream(pa.py_buffer(blobs[0]))
            sent.setdefault(header["table"], {}).update(zip(header["serials"], reader))
            continue
        for name, order in header["tables"].items():
            have = dict(state.get(name, []))
            have.update(sent.pop(name, {}))
            state[name] = [(s, have[s]) for s in order]
        sent.clear()
        if _serve_query(header, state, wfile):
            return


def _read_frame(rfile) -> tuple[dict, list[bytes]] | None:
    head = rfile.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    header = json.loads(rfile.read(_LEN.unpack(head)[0]))
    blobs = [rfile.read(n) for n in header.get("blobs", [])]
    return header, blobs


def _write_frame(wfile, header: dict, blobs: Sequence[Any] = ()) -> None:
    for view in _frame(header, blobs):
        wfile.write(view)
    wfile.flush()


def _serve_query(header: dict, state: dict, wfile) -> bool:
    """Answer one query on ``wfile``; True if DataFusion panicked (the worker then ends)."""
    try:
        import datafusion as df
        import pyarrow as pa
        from .store import plain_schema
    except ImportError as e:
        _write_frame(wfile, {"rss": 0})
        _write_frame(wfile, {"error": "start", "message": f"telemetry queries need "
                             f"datafusion and pyarrow (pip install 'hpcmesh[telemetry]'); "
                             f"the query worker cannot import {e.name}: {e}"})
        return False
    _write_frame(wfile, {"rss": _rss(os.getpid()) or 0})
    try:
        ctx = df.SessionContext(
            df.SessionConfig().with_information_schema(True)
                              .with_target_partitions(TARGET_PARTITIONS),
            df.RuntimeEnvBuilder().with_disk_manager_disabled()
                                  .with_greedy_memory_pool(header["memory_bytes"]))
        for name, batches in state.items():
            ctx.register_record_batches(name, [[b for _, b in batches]])
        read_only = df.SQLOptions().with_allow_ddl(False).with_allow_dml(False) \
                                   .with_allow_statements(False)
        frame = ctx.sql_with_options(header["sql"], read_only)
        schema = plain_schema(frame.schema())
        out, rows, nbytes = [], 0, 0
        for got in frame.execute_stream():
            batch = got.to_pyarrow()
            rows += batch.num_rows
            if rows > header["max_rows"]:
                return _error(wfile, "rows", "")
            batch = batch.cast(schema)
            nbytes += batch.nbytes
            if nbytes > header["max_bytes"]:
                return _error(wfile, "bytes", f"more than {nbytes} bytes")
            out.append(batch)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            for batch in out:
                w.write_batch(batch)
        del out
        _write_frame(wfile, {"rows": rows}, [sink.getvalue()])
        return False
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
        panic = type(e).__name__ == "PanicException"
        _error(wfile, "panic" if panic else "failed", str(e))
        return panic


def _error(wfile, kind: str, message: str) -> bool:
    """Answer with an error (``WorkerError``'s kinds); False: the worker goes on."""
    _write_frame(wfile, {"error": kind, "message": message})
    return False
