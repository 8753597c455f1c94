"""What one process records for the job's telemetry, kept until the controller drains it.

Every process (actor processes, host agents, the controller) has at most one
:class:`Recorder`, the module's :data:`RECORDER`; it is None until telemetry is enabled
(``HPCMESH_TELEMETRY=1`` at start, or the controller's first ``telemetry_drain``), so with
telemetry off a hot path pays one global load and a None check. Recording is an append
of a tuple to a bounded deque: no lock, no I/O, no formatting on the call's path. A full
buffer drops the row and counts it (a slow collector never blocks a call); the
controller's collector (``hpcmesh.telemetry``) drains each process about once a second.

The rows' fields are the telemetry tables' columns (``hpcmesh/telemetry/schema.py``
names and documents them), less those the collector adds per process (process, host,
pid): a drained row travels as a plain tuple.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import time
from collections import deque
from time import time_ns as _time_ns
from typing import Any, Callable

from ..settings import env_flag, env_number

#: Set to 1 in the environment of processes started while telemetry is on.
TELEMETRY_VAR = "HPCMESH_TELEMETRY"
#: Rows per table a process keeps between two drains (then it drops and counts them).
BUFFER_VAR = "HPCMESH_TELEMETRY_BUFFER"
DEFAULT_BUFFER_ROWS = 100_000

#: The tables a process records into (the collector adds the rest).
TABLES = ("meshes", "actors", "actor_status_events", "process_status_events", "messages",
          "sent_messages", "events")

RECORDER: "Recorder | None" = None
#: Where the controller's collector takes a drain it did not ask for itself: the last one
#: of a process about to be stopped (``ProcMesh.stop``), whose buffer would go with it.
SINK: "Callable[[dict], None] | None" = None


def now_us() -> int:
    """Wall-clock microseconds: comparable across the hosts of a job (as far as their
    clocks agree), which is what a query joining them needs."""
    return time.time_ns() // 1000


class Recorder:
    """Bounded per-table buffers of row tuples; ``drain()`` hands them over."""

    def __init__(self, max_rows: int = DEFAULT_BUFFER_ROWS, *, sample_gpus: bool = False):
        self.max_rows = max_rows
        self.rows: dict[str, deque] = {t: deque() for t in TABLES}
        self.dropped: dict[str, int] = dict.fromkeys(TABLES, 0)
        self.sample_gpus = sample_gpus
        self._last_cpu = (time.monotonic(), _cpu_seconds())
        # hot-path shortcuts: the messages table is the one written per call
        self._messages = self.rows["messages"]
        self._sent = self.rows["sent_messages"]

    # -- recording (any thread) ------------------------------------------------------
    def add(self, table: str, row: tuple) -> None:
        rows = self.rows[table]
        if len(rows) < self.max_rows:
            rows.append(row)
        else:
            self.dropped[table] += 1

    def received(self, start_us: int, actor_id: str, endpoint: str, caller: str | None,
                 duration_us: int, status: str, nbytes: int) -> None:
        """One call handled by an actor of this process (``messages``; ``endpoint`` as
        the call named it: ``drain`` shows it without an ``as_endpoint`` prefix)."""
        if len(self._messages) < self.max_rows:
            self._messages.append((start_us, actor_id, endpoint, caller, duration_us, status,
                                   nbytes))
        else:
            self.dropped["messages"] += 1

    def sent(self, actor_mesh_id: str, endpoint: str, method: str, view: str,
             n_dest: int, sender: str | None) -> None:
        """One call made from this process to an actor mesh or a view of one
        (``sent_messages``: one row per call, however many actors it went to)."""
        if len(self._sent) < self.max_rows:
            self._sent.append((_time_ns() // 1000, sender, actor_mesh_id, endpoint, method,
                               view, n_dest))
        else:
            self.dropped["sent_messages"] += 1

    def mesh(self, mesh_id: str, kind: str, class_name: str, given_name: str,
             shape_json: str, parent_mesh_id: str | None = None) -> None:
        self.add("meshes", (now_us(), mesh_id, kind, class_name, given_name, shape_json,
                            parent_mesh_id))

    def actor(self, actor_id: str, mesh_id: str, rank: int, full_name: str, process: str,
              host: str, pid: int | None) -> None:
        self.add("actors", (now_us(), actor_id, mesh_id, rank, full_name, process, host, pid))

    def status(self, actor_id: str, new_status: str, reason: str | None = None) -> None:
        self.add("actor_status_events", (now_us(), actor_id, new_status, reason))

    def process_status(self, process: str, mesh_name: str, label: str, host: str,
                       pid: int | None, new_status: str, reason: str | None = None) -> None:
        self.add("process_status_events", (now_us(), process, mesh_name, label, host, pid,
                                           new_status, reason))

    def event(self, level: str, source: str, message: str) -> None:
        """A log line or another notable fact (``events``)."""
        self.add("events", (now_us(), level, source, message))

    # -- draining (the ``telemetry_drain`` service) ----------------------------------
    def drain(self, caller_name: Callable[[str | None], str | None] | None = None,
              who: dict | None = None) -> dict[str, Any]:
        """Everything recorded since the last drain, the drop counts, and a sample of this
        process's CPU and memory (and its host's GPUs, for a host agent). ``caller_name``
        turns the callers' node ids in ``messages`` into process names (done here, not
        per call); ``who``: this process (name, host, pid), for the collector."""
        tables = {}
        for name, rows in self.rows.items():
            n = len(rows)       # popleft, not a swap: appends from other threads go on
            tables[name] = [rows.popleft() for _ in range(n)]
        if tables["messages"]:
            names: dict = {}
            shown: dict = {}
            who_called = caller_name or (lambda node_id: node_id)
            tables["messages"] = [
                (r[0], r[1], shown[r[2]] if r[2] in shown else
                 shown.setdefault(r[2], r[2].rpartition(":")[2]),
                 names[r[3]] if r[3] in names else names.setdefault(r[3], who_called(r[3])),
                 *r[4:])
                for r in tables["messages"]]
        dropped = {k: v for k, v in self.dropped.items() if v}
        for k in dropped:
            self.dropped[k] = 0
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
NVIDIA_SMI_QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total"


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits``;
    a field nvidia-smi could not read ("[N/A]", "[Not Supported]") becomes None."""
    def num(s: str) -> float | None:
        try:
            return float(s)
        except ValueError:
            return None
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        used, total = num(parts[4]), num(parts[5])
        out.append({"gpu": int(parts[0]), "uuid": parts[1], "name": parts[2],
                    "utilization_percent": num(parts[3]),
                    "memory_used_bytes": None if used is None else int(used * 2**20),
                    "memory_total_bytes": None if total is None else int(total * 2**20)})
    return out


_smi: str | None | bool = False     # False: not looked for yet


def sample_gpus(timeout: float = 2.0) -> list[dict[str, Any]]:
    """This host's GPUs now (``nvidia-smi``), [] where there is none or it fails."""
    global _smi
    if _smi is False:
        _smi = shutil.which("nvidia-smi")
    if not _smi:
        return []
    try:
        res = subprocess.run([_smi, f"--query-gpu={NVIDIA_SMI_QUERY}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(res.stdout) if res.returncode == 0 else []


# -- switching on -------------------------------------------------------------------------
def buffer_rows(env=None) -> int:
    return int(env_number(BUFFER_VAR, DEFAULT_BUFFER_ROWS, unit="rows", minimum=1,
                          integer=True, env=env))


def enable(*, sample_gpus: bool = False) -> Recorder:
    """This process's recorder, made on first use (idempotent)."""
    global RECORDER
    if RECORDER is None:
        RECORDER = Recorder(buffer_rows(), sample_gpus=sample_gpus)
    elif sample_gpus:
        RECORDER.sample_gpus = True
    return RECORDER


def disable() -> None:
    global RECORDER
    RECORDER = None


def enable_from_env(*, sample_gpus: bool = False) -> None:
    """At process start: record from the first call if the controller asked for it."""
    if env_flag(TELEMETRY_VAR, False):
        enable(sample_gpus=sample_gpus)


def install_service(node: Any, *, sample_gpus: bool = False) -> None:
    """Offer ``telemetry_drain`` on ``node``: the first drain switches recording on (a
    process started before telemetry was enabled records from then on)."""
    enable_from_env(sample_gpus=sample_gpus)
    who = {"name": node.name, "host": socket.gethostname(), "pid": os.getpid(),
           "role": node.role}

    def drain() -> dict[str, Any]:
        out = enable(sample_gpus=sample_gpus).drain(lambda node_id: peer_name(node, node_id),
                                                    who)
        out["tables"] = Pickled(out["tables"])
        return out
    node.services["telemetry_drain"] = drain


class Pickled:
    """A value pickled now, by the C pickler, into one bytes object; unpickled it is the
    value again. The drained rows travel so: the runtime's reply pickler would walk each
    of their fields (~2.1 µs of the process's CPU a call, against ~0.6 µs so)."""
    __slots__ = ("data",)

    def __init__(self, value: Any):
        self.data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def __reduce__(self):
        return pickle.loads, (self.data,)


def peer_name(node: Any, node_id: str | None) -> str | None:
    """The name a peer gave in its hello (a process name, or "client"), else its id."""
    if node_id is None or node_id == node.node_id:
        return node.name
    p = node.peers.by_id.get(node_id)
    conn = getattr(p, "conn", None)
    info = conn.info.get("peer_info") if conn is not None else None
    return (info or {}).get("name") or node_id
