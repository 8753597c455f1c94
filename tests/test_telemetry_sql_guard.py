"""The telemetry SQL service is read-only and bounded, for whoever holds a URL of it.

Issue 28: ``POST /api/query`` ran any statement (``COPY ... TO`` wrote files as the job's
user, ``INSERT``, ``DROP TABLE``, ``SET``, ``CREATE EXTERNAL TABLE``), the dashboard's URL
carried the same token, a query ran on after its client gave up and grew the controller,
and a DataFusion panic or an odd JSON body dropped the connection. The attacks run as a
second local account (``other_user``) with the system Python, over loopback, as someone
shown one of the job's URLs would; the job's user is root (this test process).
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from other_user import SYSTEM_PYTHON
from proc_helpers import wait_gone

from hpcmesh.telemetry import TelemetryConfig
from hpcmesh.telemetry.engine import TelemetryQueryError
from hpcmesh.telemetry.schema import TABLES
from hpcmesh.telemetry.store import TelemetryStore

# (spelled out, not imported: the attack tests run against the code before the fix too)
TIMEOUT_VAR = "HPCMESH_TELEMETRY_QUERY_TIMEOUT"
MEMORY_VAR = "HPCMESH_TELEMETRY_QUERY_MEMORY_MB"
ROWS_VAR = "HPCMESH_TELEMETRY_QUERY_ROWS"

#: What the other user runs: each request of a JSON list on stdin, and what came back.
CLIENT = r"""
import json, sys, urllib.error, urllib.request
out = []
for r in json.load(sys.stdin):
    body = None if r["body"] is None else r["body"].encode("latin-1")
    req = urllib.request.Request(r["url"], data=body, method="GET" if body is None else "POST",
                                 headers={"Authorization": "Bearer " + r["token"],
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=r["timeout"]) as resp:
            out.append({"status": resp.status, "type": resp.headers.get("Content-Type"),
                        "body": resp.read().decode("latin-1")[:3000]})
    except urllib.error.HTTPError as e:
        out.append({"status": e.code, "type": e.headers.get("Content-Type"),
                    "body": e.read().decode("latin-1")[:3000]})
    except Exception as e:
        out.append({"status": None, "type": None, "body": type(e).__name__ + ": " + str(e)})
print(json.dumps(out))
"""

#: Minutes of work for two cores (4e10 pairs): only a time limit ends it.
CROSS_JOIN = ("SELECT count(*) FROM range(200000) a, range(200000) b "
              "WHERE (a.value * b.value) % 7 = 3")
#: A real panic of DataFusion 55 (a t-digest of 2^64 - 1 centroids: "capacity overflow").
PANIC = ("SELECT approx_percentile_cont(x, 0.5, 18446744073709551615) "
         "FROM (VALUES (1.0)) t(x)")


@pytest.fixture
def stop_telemetry_after():
    yield
    from hpcmesh.telemetry.server import stop_telemetry
    stop_telemetry()


def telemetry_state(**config):
    from hpcmesh.job import LocalJob
    job = LocalJob(hosts=("hosts",)).enable_telemetry(TelemetryConfig(**config))
    return job.state(cached_path=None)


def endpoint(url: str, path: str) -> tuple[str, str]:
    """(the URL of ``path`` on ``url``'s server without the token, the token)."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{path}", parse_qs(p.query)["token"][0]


def as_other_user(user, requests: list[tuple], timeout: float = 60) -> list[dict]:
    """Send ``requests`` ((url, token, body or None for GET[, timeout])) as ``user``."""
    doc = [{"url": r[0], "token": r[1], "body": r[2],
            "timeout": r[3] if len(r) > 3 else 30} for r in requests]
    res = user.run([SYSTEM_PYTHON, "-c", CLIENT], input=json.dumps(doc), timeout=timeout)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def sql(text: str) -> str:
    return json.dumps({"sql": text})


def error_of(answer: dict) -> str:
    assert answer["status"] == 400, answer
    return json.loads(answer["body"])["error"]


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(p for p, pp in parents.items() if pp == pid)
    return found


def controller_goes_quiet(window: float = 1.0, budget: float = 0.4,
                          within: float = 6.0) -> list[float]:
    """Wait until the controller (this process and every process under it) spends less
    than ``budget`` CPU seconds in a ``window``; the CPU seconds of each window seen (the
    last one quiet unless ``within`` ran out)."""
    seen = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pids = _tree(os.getpid())
        before = {p: _cpu_s(p) for p in pids}
        t0 = time.monotonic()
        while time.monotonic() - t0 < window:
            time.sleep(0.05)
        used = sum(max(0.0, _cpu_s(p) - before[p]) for p in pids)
        seen.append(round(used, 2))
        if used < budget:
            break
    return seen


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:    # resets VmHWM to the current RSS
        f.write("5")


def _peak_rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) >> 10
    raise AssertionError("no VmHWM in /proc/self/status")


# -- the dashboard's URL ------------------------------------------------------------------
def test_the_dashboard_url_shown_to_another_user_reads_the_dashboard_and_nothing_else(
        other_user, tmp_path, stop_telemetry_after):
    state = telemetry_state(include_dashboard=True, dashboard_port=0)
    page, token = endpoint(state.dashboard_url, "/api/dashboard")
    # the SQL service's port is no secret: any local user can list loopback listeners
    query, _ = endpoint(state.telemetry_url, "/api/query")
    dash_query, _ = endpoint(state.dashboard_url, "/api/query")
    target = tmp_path / "written-by-the-dashboard-token.csv"
    copy = sql(f"COPY (SELECT 'pwned' AS x) TO '{target}' STORED AS CSV")
    got = as_other_user(other_user, [(query, token, copy), (dash_query, token, copy),
                                     (query, token, sql("SELECT COUNT(*) FROM messages")),
                                     (page, token, None)])
    assert not target.exists(), "the dashboard's token wrote a file as the job's user"
    assert [g["status"] for g in got[:3]] == [401, 405, 401], got
    assert got[0]["body"] == "" and got[2]["body"] == ""   # no hint of what is served
    assert got[3]["status"] == 200 and "meshes" in json.loads(got[3]["body"]), got[3]


# -- a holder of the query URL ------------------------------------------------------------
def test_a_holder_of_the_query_url_reads_and_cannot_write_or_change_anything(
        other_user, tmp_path, stop_telemetry_after):
    state = telemetry_state()
    query, token = endpoint(state.telemetry_url, "/api/query")
    new = tmp_path / "new.csv"
    victim = tmp_path / "victim.csv"
    victim.write_text("original\n")
    attacks = [
        ("COPY ... TO", f"COPY (SELECT 'pwned' AS x) TO '{new}' STORED AS CSV"),
        ("COPY ... TO", f"COPY (SELECT 'pwned' AS x) TO '{victim}' STORED AS CSV"),
        ("COPY ... TO", f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{new}' STORED AS CSV"),
        ("INSERT INTO", "INSERT INTO meshes SELECT * FROM meshes"),
        ("DROP TABLE", "DROP TABLE messages"),
        ("SET", "SET datafusion.execution.target_partitions = 64"),
        ("CREATE EXTERNAL TABLE", "CREATE EXTERNAL TABLE leak STORED AS CSV "
                                  "LOCATION '/etc/shadow'"),
        ("CREATE TABLE", "CREATE TABLE copy AS SELECT * FROM messages"),
        ("more than one statement", "SELECT 1; DROP TABLE messages"),
    ]
    allowed = ["SELECT COUNT(*) AS n FROM messages", "WITH m AS (SELECT 1 AS x) SELECT x FROM m",
               "VALUES (1)", "EXPLAIN SELECT COUNT(*) FROM messages", "SHOW TABLES",
               "DESCRIBE messages", "SELECT * FROM information_schema.columns LIMIT 5"]
    got = as_other_user(other_user, [(query, token, sql(q)) for _, q in attacks]
                        + [(query, token, sql(q)) for q in allowed])
    assert not new.exists(), "COPY ... TO wrote a file as the job's user"
    assert victim.read_text() == "original\n", "COPY ... TO overwrote a file"
    for (what, text), answer in zip(attacks, got):
        err = error_of(answer)
        assert err.startswith(f"refused: {what}"), (text, err)
        assert "read-only" in err and "one SELECT statement" in err and "messages" in err, err
    for text, answer in zip(allowed, got[len(attacks):]):
        assert answer["status"] == 200, (text, answer)
        assert answer["type"] == "application/vnd.apache.arrow.stream", answer
    # the tables are all still there, unchanged
    n = state.query_engine.query("SELECT COUNT(*) AS n FROM information_schema.tables "
                                 "WHERE table_schema = 'public'").to_pylist()
    assert n == [{"n": len(TABLES)}]


def test_the_in_process_engine_is_read_only_too(tmp_path):
    from hpcmesh.telemetry.engine import QueryEngine
    engine = QueryEngine(TelemetryStore())
    try:
        target = tmp_path / "out.csv"
        try:
            with pytest.raises(TelemetryQueryError, match=r"refused: COPY \.\.\. TO is a "
                                                          r"statement that writes files"):
                engine.query(f"COPY (SELECT 1 AS x) TO '{target}' STORED AS CSV")
        finally:
            assert not target.exists(), "COPY ... TO wrote a file"
        with pytest.raises(TelemetryQueryError, match="refused: BEGIN TRANSACTION is not a "
                                                      "query"):
            engine.query("BEGIN TRANSACTION")
        assert engine.query("SELECT 1 AS one;").to_pylist() == [{"one": 1}]
    finally:
        engine.close()


# -- bounded in time, memory and rows -------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_query_past_its_time_limit_is_stopped_and_its_cpu_freed(other_user, monkeypatch,
                                                                  stop_telemetry_after):
    monkeypatch.setenv(TIMEOUT_VAR, "2")
    state = telemetry_state()
    query, token = endpoint(state.telemetry_url, "/api/query")
    t0 = time.monotonic()
    got = as_other_user(other_user, [(query, token, sql(CROSS_JOIN), 12)])
    took = time.monotonic() - t0
    quiet = controller_goes_quiet()
    assert quiet[-1] < 0.4, f"the controller still burns CPU after the query: {quiet} s/s"
    err = error_of(got[0])
    assert f"time limit of 2 s ({TIMEOUT_VAR})" in err and "stopped" in err, err
    assert took < 10, took      # not minutes: the answer comes at the limit
    # the service goes on, on a new worker
    assert state.query_engine.query("SELECT 7 AS n").to_pylist() == [{"n": 7}]


def test_a_query_past_its_memory_limit_is_refused_and_the_controller_does_not_grow(
        other_user, monkeypatch, stop_telemetry_after):
    monkeypatch.setenv(MEMORY_VAR, "32")
    state = telemetry_state()
    query, token = endpoint(state.telemetry_url, "/api/query")
    state.query_engine.query("SELECT 1")            # the worker is started
    _peak_rss_reset()
    before = _peak_rss_mb()
    # a hash join of 3 million rows: DataFusion's memory pool says no
    join = "SELECT count(*) FROM range(3000000) a JOIN range(3000000) b ON a.value = b.value"
    # 20 strings of 200 MB: memory the pool does not track
    strings = "SELECT length(repeat('x', 200000000)) AS n FROM range(20)"
    got = as_other_user(other_user, [(query, token, sql(join)), (query, token, sql(strings))])
    grew = _peak_rss_mb() - before
    assert grew < 100, f"the controller grew by {grew} MB"
    for answer in got:
        err = error_of(answer)
        assert f"more than its memory limit of 32 MB ({MEMORY_VAR}" in err, err
    assert "Resources exhausted" in error_of(got[0])
    assert "worker process grew by" in error_of(got[1])
    assert state.query_engine.query("SELECT 8 AS n").to_pylist() == [{"n": 8}]


def test_an_answer_past_the_row_cap_is_refused(other_user, monkeypatch, stop_telemetry_after):
    monkeypatch.setenv(ROWS_VAR, "1000")
    state = telemetry_state()
    query, token = endpoint(state.telemetry_url, "/api/query")
    got = as_other_user(other_user, [(query, token, sql("SELECT * FROM range(10000000)"))])
    err = error_of(got[0])
    assert f"more than 1000 rows, the cap ({ROWS_VAR})" in err and "LIMIT" in err, err
    assert state.query_engine_client.query("SELECT * FROM range(1000)").num_rows == 1000


def test_limits_come_from_the_environment_and_a_bad_one_is_named():
    from hpcmesh.telemetry import engine
    from hpcmesh.telemetry.engine import QueryLimits
    assert (engine.TIMEOUT_VAR, engine.MEMORY_VAR, engine.ROWS_VAR) == (
        TIMEOUT_VAR, MEMORY_VAR, ROWS_VAR)
    assert QueryLimits.from_env({}) == QueryLimits(30.0, 512, 100_000)
    assert QueryLimits.from_env({TIMEOUT_VAR: "5", MEMORY_VAR: "64", ROWS_VAR: "10"}) == \
        QueryLimits(5.0, 64, 10)
    for var, bad in ((TIMEOUT_VAR, "inf"), (MEMORY_VAR, "1.5"), (ROWS_VAR, "0"),
                     (TIMEOUT_VAR, "soon")):
        with pytest.raises(ValueError, match=f"{var} must be"):
            QueryLimits.from_env({var: bad})


# -- a panic, odd bodies --------------------------------------------------------------------
def test_a_datafusion_panic_and_odd_bodies_get_a_400_with_the_reason(other_user,
                                                                     stop_telemetry_after):
    state = telemetry_state()
    query, token = endpoint(state.telemetry_url, "/api/query")
    bodies = [sql(PANIC), '{"session": 1e400}', '{"sql": "SELECT 1", "session": 1e400}',
              '{"sql": NaN}', '{"sql": 1e400}', "[" * 100_000, '{"sql": "SELECT 1", "x": 1}',
              '["SELECT 1"]', "\xff\xfe", ""]
    got = as_other_user(other_user, [(query, token, b) for b in bodies]
                        + [(query, token, sql("SELECT 1 AS one"))])
    errors = [error_of(g) for g in got[:-1]]
    assert "DataFusion panicked on this query (capacity overflow)" in errors[0]
    assert "1e400 is too large" in errors[1] and "1e400 is too large" in errors[2]
    assert "NaN is not a JSON number" in errors[3]
    assert "nested too deeply" in errors[5]
    assert "\"sql\" is its only field, not 'x'" in errors[6]
    assert "this one is an array" in errors[7]
    for e in errors:
        assert 'the body must be JSON like {"sql": "SELECT ..."}' in e or e is errors[0], e
    assert got[-1]["status"] == 200        # the server is still serving


def test_the_query_body_is_one_sql_string():
    from hpcmesh.telemetry.server import query_body
    assert query_body(b'{"sql": "SELECT 1"}') == "SELECT 1"
    for body, why in ((b'{"sql": 1}', '"sql" is not a string: 1'),
                      (b"{}", '"sql" is missing'), (b'{"sql": -1e999}', "too large"),
                      (b'{"sql": Infinity}', "Infinity is not a JSON number")):
        with pytest.raises(ValueError, match=why):
            query_body(body)


# -- the worker's copy of the store ---------------------------------------------------------
def test_the_worker_s_copy_follows_the_store_through_appends_drops_and_restarts(monkeypatch):
    from hpcmesh.telemetry import query_worker
    from hpcmesh.telemetry.engine import QueryEngine, QueryLimits
    monkeypatch.setattr(query_worker, "CHUNK_BYTES", 1)     # a frame per batch sent
    store = TelemetryStore(retention_secs=60, max_rows=10)
    engine = QueryEngine(store, limits=QueryLimits(timeout_s=2))
    now = int(time.time() * 1e6)

    def lines() -> list[str]:
        return [r["message"] for r in engine.query(
            "SELECT message FROM events ORDER BY timestamp_us, message").to_pylist()]

    def add(k: int, n: int = 4) -> None:
        store.append("events", [(now + k * 10 + i, "stdout", "p", f"{k}.{i}", "p", "h", 1)
                                for i in range(n)])
    try:
        assert lines() == []
        add(0)
        assert lines() == [f"0.{i}" for i in range(4)]
        add(1)
        add(2)           # past the cap of 10 rows: batch 0 goes
        assert lines() == [f"{k}.{i}" for k in (1, 2) for i in range(4)]
        # what the worker holds is not sent again
        sent = engine.worker.batches_sent["events"]
        assert lines() == [f"{k}.{i}" for k in (1, 2) for i in range(4)]
        assert engine.worker.batches_sent["events"] == sent
        with pytest.raises(TelemetryQueryError, match="time limit of 2 s"):
            engine.query(CROSS_JOIN)
        assert engine.worker.pid is None                  # killed; the next one starts
        add(3)
        assert lines() == [f"{k}.{i}" for k in (2, 3) for i in range(4)]
        store.prune(now_us=now + 61 * 10**6)
        assert lines() == []
        # a worker unused for IDLE_EXIT_S is stopped, and what it held is let go
        monkeypatch.setattr(query_worker, "IDLE_EXIT_S", 1.0)
        engine.close()
        add(4)
        assert lines() == [f"4.{i}" for i in range(4)]
        pid = engine.worker.pid
        deadline = time.monotonic() + 10
        while (engine.worker.pid is not None or engine.worker.held_batches) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.worker.pid is None and engine.worker.held_batches == 0
        assert wait_gone([pid]) == []
        assert lines() == [f"4.{i}" for i in range(4)]     # a new one, sent everything
    finally:
        engine.close()
