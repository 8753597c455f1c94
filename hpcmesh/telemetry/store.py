"""The controller's telemetry store: Arrow record batches per table, bounded by age and rows.

Drained rows become one record batch per table per collection (off every call's path: in
the collector's thread), so a query concatenates batches without copying. Retention
(``retention_secs``) drops whole batches once their newest row is older; the row cap
(``HPCMESH_TELEMETRY_MAX_ROWS`` per table) drops the oldest batches and counts them in
``telemetry_drops``, so the store's memory is bounded however long a job runs. ``save``
and ``load`` keep it in the job's folder, so a client that reconnects finds it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Iterable

from ..runtime.observe.telemetry_recorder import KEYED_TABLES, KeyedRows, SentRows
from ..settings import env_number
from .schema import SOURCE_COLUMNS, TABLES, Table

log = logging.getLogger("hpcmesh.telemetry")

MAX_ROWS_VAR = "HPCMESH_TELEMETRY_MAX_ROWS"
DEFAULT_MAX_ROWS = 2_000_000


def _pa():
    try:
        import pyarrow
    except ImportError:
        raise ImportError("hpcmesh telemetry needs pyarrow and datafusion: pip install "
                          "'hpcmesh[telemetry]'") from None
    return pyarrow


def arrow_schema(table: Table):
    """The table's Arrow schema. The string columns of the tables written per call (their
    key fields, the source's process and host) are dictionary-encoded: a row keeps a 4-byte
    index, not its strings (117 bytes a row before), and a batch is built without copying
    a string per row. SQL sees them as strings."""
    pa = _pa()
    types = {"string": pa.string(), "int64": pa.int64(), "double": pa.float64()}
    coded = set(KEYED_TABLES[table.name][1]) | {"process", "host"} \
        if table.name in KEYED_TABLES else set()
    return pa.schema([(n, pa.dictionary(pa.int32(), pa.string())
                       if t == "string" and n in coded else types[t])
                      for n, t, _ in table.all_columns])


class TelemetryStore:
    def __init__(self, retention_secs: float = 3600.0, max_rows: int | None = None):
        self.retention_us = int(retention_secs * 1e6)
        self.max_rows = max_rows or int(env_number(MAX_ROWS_VAR, DEFAULT_MAX_ROWS, unit="rows",
                                                   minimum=1, integer=True))
        self.schemas = {name: arrow_schema(t) for name, t in TABLES.items()}
        self._batches: dict[str, list] = {name: [] for name in TABLES}
        self._rows: dict[str, int] = dict.fromkeys(TABLES, 0)
        self._lock = threading.Lock()
        self._making = threading.Lock()     # rows pending as numbers made into batches

    # -- writing ---------------------------------------------------------------------
    def append(self, table: str, rows: Iterable[tuple]) -> None:
        """Rows as tuples in the table's column order (source columns included)."""
        rows = list(rows)
        if not rows:
            return
        pa = _pa()
        schema = self.schemas[table]
        columns = list(zip(*rows))
        if len(columns) != len(schema):
            raise ValueError(f"telemetry table {table}: rows have {len(columns)} fields, the "
                             f"table has {len(schema)} columns ({', '.join(schema.names)})")
        arrays = [pa.array(col, type=field.type) for col, field in zip(columns, schema)]
        self.append_batch(table, pa.RecordBatch.from_arrays(arrays, schema=schema))

    def append_keyed(self, table: str, rows: KeyedRows | SentRows, source: tuple = ()) -> None:
        """Rows a process kept as numbers (``KeyedRows``, ``SentRows``), kept so until
        they are read (``batches``): the collector runs in the controller, beside the
        calls it records, and ~0.5 µs a row of making columns at every collection cost
        its pipelined calls 5-10 % of their speed. They are made when a query, the
        dashboard or a ``save`` (every ``snapshot_interval_secs`` of a job with a folder)
        reads them: then in one go, not never. ``source``: the values of the table's
        source columns."""
        self.append_keyed_parts(table, [(rows, source)])

    def append_keyed_parts(self, table: str, parts: list[tuple]) -> None:
        """``append_keyed`` of several processes' rows (``[(rows, source)]``), which become
        one record batch: a collection's, not one per process (a query over a table of
        many tiny batches slows down with their number, then runs out of memory)."""
        parts = [(rows, source) for rows, source in parts if len(rows)]
        if parts:
            self._add(table, _Pending(table, parts))

    def _keyed_batch(self, p: "_Pending"):
        """``p``'s rows as one record batch of its table."""
        batches = [self._part_batch(p.table, rows, source) for rows, source in p.parts]
        return batches[0] if len(batches) == 1 else _pa().concat_batches(batches)

    def _part_batch(self, table: str, rows: KeyedRows | SentRows, source: tuple):
        """One process's rows as a record batch of ``table``, made without a Python step
        per row."""
        n = len(rows)
        if isinstance(rows, SentRows):
            rows = rows.keyed()
        pa = _pa()
        import pyarrow.compute as pc
        schema = self.schemas[table]
        number_columns, key_columns = KEYED_TABLES[table]
        # a column of the rows' int64s: a strided copy by memoryview (pyarrow's
        # list_element on a fixed-size list took ~10 times as long)
        nums = memoryview(rows.data).cast("q")
        w = rows.width

        def column(j: int):
            return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(
                nums[j::w].tobytes())])
        index = column(w - 1)
        cols = {}
        for j, (name, divisor, since) in enumerate(number_columns):
            col = column(j)
            if since is not None:
                col = pc.subtract(col, column(since))
            cols[name] = pc.divide(col, divisor) if divisor != 1 else col
        # the keys these rows use, in order, and each row's position among them: a
        # dictionary as long as the keys used (the log's key indices reach KEYS_LIMIT)
        used = sorted(rows.keys)
        position = pc.index_in(index, value_set=pa.array(used, type=pa.int64()))
        for j, name in enumerate(key_columns):
            values = [rows.keys[k][j] for k in used]
            cols[name] = _column(pa, pc, schema.field(name).type, values, position)
        if source:
            zeros = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(bytes(4 * n))])
            for (name, _, _), value in zip(SOURCE_COLUMNS, source):
                cols[name] = _column(pa, pc, schema.field(name).type, [value], zeros)
        return pa.RecordBatch.from_arrays([cols[name] for name in schema.names],
                                          schema=schema)

    def append_batch(self, table: str, batch) -> None:
        """One record batch of ``table``'s schema; the oldest go past the row cap."""
        self._add(table, batch)

    def _add(self, table: str, batch) -> None:
        """A record batch, or rows pending as numbers; the oldest go past the row cap."""
        over = 0
        with self._lock:
            self._batches[table].append(batch)
            self._rows[table] += batch.num_rows
            while self._rows[table] > self.max_rows and len(self._batches[table]) > 1:
                old = self._batches[table].pop(0)
                self._rows[table] -= old.num_rows
                over += old.num_rows
        if over and table != "telemetry_drops":
            self.append("telemetry_drops", [(int(time.time() * 1e6), table, over,
                                             "client", socket.gethostname(), os.getpid())])

    def prune(self, now_us: int | None = None) -> None:
        """Drop batches older than the retention."""
        cutoff = (now_us if now_us is not None else int(time.time() * 1e6)) - self.retention_us
        with self._lock:
            for table, batches in self._batches.items():
                keep = []
                for b in batches:
                    if b.num_rows and (b.received_us if type(b) is _Pending
                                       else _max_ts(b)) < cutoff:
                        self._rows[table] -= b.num_rows
                    else:
                        keep.append(b)
                self._batches[table] = keep

    # -- reading ---------------------------------------------------------------------
    def batches(self, table: str) -> list:
        """The table's record batches (at least one, maybe empty: an engine needs the
        schema); rows pending as numbers are made into batches now, once."""
        with self._lock:
            batches = list(self._batches[table])
        if any(type(b) is _Pending for b in batches):
            with self._making:      # one reader makes them; the others then find them
                with self._lock:
                    batches = list(self._batches[table])
                made = {id(b): self._keyed_batch(b) for b in batches if type(b) is _Pending}
                with self._lock:    # (the cap or the retention may have dropped some)
                    self._batches[table] = [made.get(id(b), b) for b in self._batches[table]]
                batches = [made.get(id(b), b) for b in batches]
        return batches or [_pa().RecordBatch.from_pylist([], schema=self.schemas[table])]

    def table(self, table: str):
        """The table as a pyarrow Table, its strings plain (see ``plain_schema``)."""
        t = _pa().Table.from_batches(self.batches(table), schema=self.schemas[table])
        return t.cast(plain_schema(t.schema))

    def row_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rows)

    def nbytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for bs in self._batches.values() for b in bs)

    # -- keeping it across a client restart ------------------------------------------
    def save(self, folder: str) -> None:
        """Write every table to ``folder/<table>.arrow`` (Arrow IPC), each file replaced
        whole (written beside it, then renamed)."""
        pa = _pa()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for name in TABLES:
            path = os.path.join(folder, f"{name}.arrow")
            tmp = f"{path}.tmp"
            # an IPC file holds one dictionary per column, and every batch has its own:
            # the file keeps plain strings (``load`` encodes them again)
            plain = plain_schema(self.schemas[name])
            with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, plain) as w:
                for b in self.batches(name):
                    if b.num_rows:
                        w.write_batch(b.cast(plain))
            os.replace(tmp, path)

    def load(self, folder: str) -> int:
        """Read what ``save`` wrote (tables with another schema are skipped, named in the
        log); the number of rows loaded."""
        pa = _pa()
        n = 0
        for name in TABLES:
            path = os.path.join(folder, f"{name}.arrow")
            if not os.path.exists(path):
                continue
            try:
                with pa.memory_map(path) as src:
                    table = pa.ipc.open_file(src).read_all()
            except (OSError, pa.ArrowInvalid) as e:
                log.warning("telemetry: could not read %s: %s", path, e)
                continue
            if not table.schema.equals(self.schemas[name]):
                try:        # the same columns stored otherwise (before dictionary-encoding)
                    table = table.cast(self.schemas[name])
                except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    log.warning("telemetry: %s has other columns than this hpcmesh's %s "
                                "table; not loaded", path, name)
                    continue
            batches = table.combine_chunks().to_batches()
            with self._lock:
                self._batches[name] = batches + self._batches[name]
                self._rows[name] += table.num_rows
            n += table.num_rows
        self.prune()
        return n


class _Pending:
    """Rows of a per-call table as processes kept them (``parts``: [(rows, source)]), in
    the store until read. Its ``nbytes`` is theirs (16-32 bytes a row, less than as
    columns); ``received_us`` bounds their timestamps (retention drops it once that is
    past)."""
    __slots__ = ("table", "parts", "num_rows", "received_us", "nbytes")

    def __init__(self, table: str, parts: list[tuple]):
        self.table, self.parts = table, parts
        self.num_rows = sum(len(rows) for rows, _ in parts)
        self.received_us = int(time.time() * 1e6)
        self.nbytes = sum(len(rows.data) if isinstance(rows, KeyedRows) else rows.nbytes
                          for rows, _ in parts)


def plain_schema(schema):
    """``schema`` with its dictionary-encoded columns as their plain value type."""
    pa = _pa()
    return pa.schema([(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                      for f in schema])


def _column(pa, pc, type_, values: list, indices):
    """``values[indices]`` as an array of ``type_``: a dictionary array over ``values``
    (nothing copied per row), else taken."""
    if pa.types.is_dictionary(type_):
        return pa.DictionaryArray.from_arrays(indices, pa.array(values, type=type_.value_type))
    return pc.take(pa.array(values, type=type_), indices)


def _max_ts(batch: Any) -> int:
    import pyarrow.compute as pc
    return pc.max(batch.column("timestamp_us")).as_py() or 0
