"""Job events, not faults (SPEC §12, issue 31): what Slurm's view of a job says happened to
it, and the runtime's side: processes that end because their job moved are one event for
the job, never a MeshFailure each, while a process that dies in a job that goes on is
still a fault. The Slurm test cluster side is tests/test_slurm_job_events.py."""

from __future__ import annotations

import os
import signal
import time

import pytest
from ci_gate import import_or_skip
from proc_helpers import wait_gone, wait_until

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host
from hpcmesh.job.events import (CANCELLED, ENDED, PREEMPTED, REQUEUED, RUNNING_AGAIN,
                                TIME_LIMIT, JobEvent, JobEvents, classify, runs_again,
                                slurm_end_line)
from hpcmesh.runtime.client import client_runtime
from hpcmesh.runtime.errors import ENDED_BY_SLURM
from hpcmesh.runtime.observe import telemetry_recorder


@pytest.mark.parametrize("state, reason, restarts, known, expected", [
    # the run the client knew goes on
    ("RUNNING", "None", 0, 0, (None, True)),
    ("RUNNING", "", None, 0, (None, True)),
    ("CONFIGURING", "", 0, 0, (None, True)),
    # waiting to start the run it knows (state() counted the requeue already)
    ("PENDING", "BeginTime", 1, 1, (None, True)),
    # scontrol requeue: wound up, then queued again; the restart count says so at once
    ("COMPLETING", "", 1, 0, (REQUEUED, True)),
    ("PENDING", "BeginTime", 1, 0, (REQUEUED, True)),
    ("RUNNING", "", 2, 1, (REQUEUED, True)),
    # a preemption in requeue mode
    ("PENDING", "Preempted", 1, 0, (PREEMPTED, True)),
    # the time limit: Slurm says TimeLimit while still winding the job up
    ("COMPLETING", "TimeLimit", 0, 0, (TIME_LIMIT, True)),
    ("TIMEOUT", "TimeLimit", 0, 0, (TIME_LIMIT, True)),
    ("DEADLINE", "", 0, 0, (TIME_LIMIT, True)),
    ("PREEMPTED", "", 0, 0, (PREEMPTED, True)),
    ("CANCELLED", "", 0, 0, (CANCELLED, True)),
    # scancel: COMPLETING says nothing yet of why; the final word comes after
    ("COMPLETING", "", 0, 0, (ENDED, False)),
    ("COMPLETED", "", 0, 0, (ENDED, True)),
    ("NODE_FAIL", "", 0, 0, (ENDED, True)),
    ("", "", None, 0, (ENDED, True)),          # no longer known to Slurm
])
def test_classify_reads_slurms_view(state, reason, restarts, known, expected):
    assert classify(state, reason, restarts, known) == expected


# The job's stderr as Slurm 22.05 left it on the test cluster (tests/cluster/up.sh: an
# 'urgent' partition preempts debug's jobs in requeue mode), for one run each ended by:
# a preemption (an urgent job took the node), scontrol requeue, the time limit, scancel.
_ERR_PREEMPTED = """\
hpcmesh worker on node2 listening on tcp://10.77.0.12:42199
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node2: error: *** STEP 43.0 ON node2 CANCELLED AT 2026-12-06T16:42:23 DUE TO PREEMPTION ***
slurmstepd-node2: error: *** JOB 43 ON node2 CANCELLED AT 2026-12-06T16:42:23 DUE TO PREEMPTION ***
hpcmesh worker on node2 exiting: received SIGTERM"""
_ERR_REQUEUED = """\
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node2: error: *** JOB 47 ON node2 CANCELLED AT 2026-12-06T16:42:42 DUE TO JOB REQUEUE ***
slurmstepd-node2: error: *** STEP 47.0 ON node2 CANCELLED AT 2026-12-06T16:42:42 DUE TO JOB REQUEUE ***"""
_ERR_TIME_LIMIT = """\
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node2: error: *** STEP 48.0 ON node2 CANCELLED AT 2026-12-06T16:43:52 DUE TO TIME LIMIT ***
slurmstepd-node2: error: *** JOB 48 ON node2 CANCELLED AT 2026-12-06T16:43:52 DUE TO TIME LIMIT ***
srun: error: node2: task 0: Terminated"""
_ERR_SCANCEL = """\
slurmstepd-node2: error: *** STEP 51.0 ON node2 CANCELLED AT 2026-12-06T16:43:28 ***
slurmstepd-node2: error: *** JOB 51 ON node2 CANCELLED AT 2026-12-06T16:43:28 ***"""


@pytest.mark.parametrize("err, job_id, state, reason, restarts, expected", [
    # a preemption in requeue mode looks like scontrol requeue to squeue and scontrol
    # (wound up, then PENDING for BeginTime, one more restart): only slurmstepd's line
    # in the job's stderr tells them apart
    (_ERR_PREEMPTED, "43", "COMPLETING", "", 1, (PREEMPTED, True)),
    (_ERR_PREEMPTED, "43", "PENDING", "BeginTime", 1, (PREEMPTED, True)),
    (_ERR_REQUEUED, "47", "PENDING", "BeginTime", 1, (REQUEUED, True)),
    ("", "43", "PENDING", "BeginTime", 1, (REQUEUED, True)),
    # another job's line (a log shared by mistake) says nothing of this one
    (_ERR_PREEMPTED, "4", "PENDING", "BeginTime", 1, (REQUEUED, True)),
    # the time limit, while Slurm still winds the job up and says no reason yet
    (_ERR_TIME_LIMIT, "48", "COMPLETING", "", 0, (TIME_LIMIT, True)),
    # scancel: the line says no more than "cancelled"; the final state comes after
    (_ERR_SCANCEL, "51", "COMPLETING", "", 0, (ENDED, False)),
])
def test_classify_reads_slurmstepds_line(err, job_id, state, reason, restarts, expected):
    ended = slurm_end_line(err, job_id)
    assert classify(state, reason, restarts, 0, ended) == expected
    if ended:
        assert ended.startswith(f"*** JOB {job_id} ON node2 CANCELLED AT ") and \
            ended.endswith(" ***"), ended


def test_a_line_of_an_earlier_run_says_nothing_of_this_one():
    # with --open-mode=append the job's stderr keeps the lines of the runs before
    line = slurm_end_line(_ERR_PREEMPTED, "43")
    preempted_at = time.mktime(time.strptime("2026-12-06T16:42:23", "%Y-%m-%dT%H:%M:%S"))
    assert slurm_end_line(_ERR_PREEMPTED, "43", since=preempted_at - 60) == line
    assert slurm_end_line(_ERR_PREEMPTED, "43", since=preempted_at + 130) == ""
    assert slurm_end_line("*** JOB 43 ON node2 CANCELLED AT garbage ***", "43", since=1) == ""


# ``scontrol -o show job`` (Slurm 22.05, the test cluster) of a job chosen for preemption
# while it runs on for its partition's GraceTime, and of one that was not
_SHOW_PREEMPTING = ("JobId=82 JobName=g31exp JobState=RUNNING Reason=None Requeue=1 "
                    "Restarts=0 PreemptEligibleTime=2026-12-06T16:52:41 "
                    "PreemptTime=2026-12-06T16:53:09 SuspendTime=None")
_SHOW_RUNNING = _SHOW_PREEMPTING.replace("PreemptTime=2026-12-06T16:53:09", "PreemptTime=None")


def test_a_preemption_with_a_grace_time_is_told_as_one_from_scontrols_preempt_time():
    from hpcmesh.slurm.parsing import parse_scontrol_preempt_time, parse_scontrol_restarts
    at = parse_scontrol_preempt_time(_SHOW_PREEMPTING)
    assert at == "2026-12-06T16:53:09" and parse_scontrol_restarts(_SHOW_PREEMPTING) == 0
    assert parse_scontrol_preempt_time(_SHOW_RUNNING) is None
    assert parse_scontrol_preempt_time("JobId=1 JobState=RUNNING") is None
    # running on in its grace: the run goes on (its tasks got SIGTERM: a notice)
    assert classify("RUNNING", "None", 0, 0, preempted_at=at) == (None, True)
    # then requeued: without slurmstepd's line yet, the PreemptTime seen says what it was
    assert classify("COMPLETING", "", 1, 0, preempted_at=at) == (PREEMPTED, True)
    assert classify("PENDING", "BeginTime", 1, 0, preempted_at=at) == (PREEMPTED, True)
    assert classify("PENDING", "BeginTime", 1, 0) == (REQUEUED, True)
    # not requeueable: Slurm ends it; what it was is known before the final state
    assert classify("COMPLETING", "", 0, 0, preempted_at=at) == (PREEMPTED, True)


def test_runs_again_after_a_requeue_only():
    assert runs_again("COMPLETING", 1, 0) and runs_again("PENDING", None, 0)
    assert not runs_again("CANCELLED", 0, 0) and not runs_again("COMPLETING", 0, 0)


def test_events_are_told_once_per_run_to_every_watcher_and_to_telemetry(monkeypatch):
    recorder = telemetry_recorder.Recorder()
    monkeypatch.setattr(telemetry_recorder, "RECORDER", recorder)
    events = JobEvents()
    seen_a, seen_b = [], []
    events.watch(seen_a.append)
    undo = events.watch(seen_b.append)
    events.watch(lambda e: 1 / 0)       # a watcher that raises: the others still hear
    requeued = JobEvent(REQUEUED, "7", "Slurm says COMPLETING, restart count 1", 100.0, 0,
                        True)
    assert events.tell(requeued)
    # the same end of run 0 seen again (by the poll, say): told once
    assert not events.tell(JobEvent(REQUEUED, "7", "Slurm says PENDING", 101.0, 0, True))
    undo()
    again = JobEvent(RUNNING_AGAIN, "7", "run 1 on node1", 102.0, 1)
    assert events.tell(again)
    assert seen_a == [requeued, again] and seen_b == [requeued]
    assert events.was_told("7", 0) and not events.was_told("7", 1)
    assert str(requeued) == "Slurm job 7 was requeued (Slurm says COMPLETING, restart count 1)"
    rows = list(recorder.rows["job_events"])
    assert rows == [(100_000_000, REQUEUED, "7", 0, requeued.reason),
                    (102_000_000, RUNNING_AGAIN, "7", 1, again.reason)]
    with pytest.raises(TypeError, match="callable"):
        events.watch("not a function")


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float, marker: str) -> str:
        open(f"{marker}-{os.getpid()}", "w").close()
        time.sleep(seconds)      # sleep: the endpoint's work is to be busy this long
        return "woke"


def _ended(message: str):
    return SupervisionError(message, exit_status="ended by Slurm (requeued)",
                            reason=ENDED_BY_SLURM)


def _faults_of(unhandled_faults, mesh: str) -> list:
    client_runtime().wait_for_fault_hook(10)
    return [f for f in unhandled_faults if f.mesh_name == mesh]


def test_processes_that_end_with_their_job_are_no_fault(tmp_path, unhandled_faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="jobmoved")
    rt = client_runtime()
    asked = []

    def explain(what: str):
        asked.append(what)
        return _ended("Slurm job 7 was requeued: call job.state()")
    unwatch = None
    try:
        w = pm.spawn("w", Worker)
        pids = w.pid.call().get(timeout=30).values()
        unwatch = rt.watch_job_ends({rt.node.node_id}, explain)     # this host's agent
        pending = w.slice(gpus=0).sleep.call_one(60, str(tmp_path / "in"))
        wait_until((tmp_path / f"in-{pids[0]}").exists, 30, "the worker is in its call")
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGTERM)         # as Slurm's end of the job does
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=20)
        assert time.monotonic() - t0 < 5
        e = ei.value
        assert e.reason == ENDED_BY_SLURM and "requeued: call job.state()" in str(e), str(e)
        assert len(asked) == 1 and str(pids[0]) in asked[0], asked
        # every process of the job's agents went with it: calls fail at once, saying so
        t1 = time.monotonic()
        with pytest.raises(SupervisionError, match="requeued") as ei:
            w.slice(gpus=1).pid.call_one().get(timeout=10)
        assert ei.value.reason == ENDED_BY_SLURM and time.monotonic() - t1 < 2
        # newer words (Slurm's final state) reword what the calls raise
        rt.end_with_job({rt.node.node_id}, _ended("Slurm job 7 was preempted"))
        wait_until(lambda: _raises(w, "preempted"), 10, "the calls say preempted")
        assert wait_gone([pids[0]], 10) == []
        assert _faults_of(unhandled_faults, "jobmoved") == []
    finally:
        if unwatch is not None:
            unwatch()
        pm.stop().get(timeout=30)
    assert _faults_of(unhandled_faults, "jobmoved") == []


def _raises(w, words: str) -> bool:
    try:
        w.slice(gpus=0).pid.call_one().get(timeout=10)
    except SupervisionError as e:
        return words in str(e)
    return False


def test_a_process_dying_in_a_job_that_goes_on_is_still_a_fault(tmp_path, unhandled_faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="jobgoeson")
    rt = client_runtime()
    asked = []
    unwatch = None
    try:
        w = pm.spawn("w", Worker)
        pids = w.pid.call().get(timeout=30).values()
        unwatch = rt.watch_job_ends({rt.node.node_id}, lambda what: asked.append(what))
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="SIGKILL") as ei:
            wait_until(lambda: _dead(w), 10, "calls to the dead process fail")
            w.slice(gpus=1).pid.call_one().get(timeout=10)
        assert ei.value.reason != ENDED_BY_SLURM
        assert len(asked) == 1
        wait_until(lambda: _faults_of(unhandled_faults, "jobgoeson"), 10,
                   "the fault reaches unhandled_fault_hook")
        [fault] = _faults_of(unhandled_faults, "jobgoeson")
        assert fault.pid == pids[1] and "SIGKILL" in fault.exit_status
        assert w.slice(gpus=0).pid.call_one().get(timeout=10) == pids[0]
    finally:
        if unwatch is not None:
            unwatch()
        pm.stop().get(timeout=30)


def _dead(w) -> bool:
    try:
        w.slice(gpus=1).pid.call_one().get(timeout=10)
    except SupervisionError:
        return True
    return False


def test_job_events_reach_the_telemetry_tables(monkeypatch):
    import_or_skip("pyarrow")
    import_or_skip("datafusion")
    from hpcmesh.telemetry.engine import QueryEngine
    from hpcmesh.telemetry.store import TelemetryStore
    recorder = telemetry_recorder.Recorder()
    monkeypatch.setattr(telemetry_recorder, "RECORDER", recorder)
    JobEvents().tell(JobEvent(TIME_LIMIT, "42", "Slurm says COMPLETING, reason TimeLimit",
                              1_700_000_000.5, 0))
    rows = recorder.drain()["tables"]["job_events"]      # what the collector takes
    store = TelemetryStore(retention_secs=1e12)
    store.append("job_events", rows)
    got = QueryEngine(store).query(
        "SELECT timestamp_us, kind, job_id, restart, reason FROM job_events").to_pylist()
    assert got == [{"timestamp_us": 1_700_000_000_500_000, "kind": "time_limit",
                    "job_id": "42", "restart": 0,
                    "reason": "Slurm says COMPLETING, reason TimeLimit"}]


def test_the_error_of_a_moved_job_takes_slurms_own_class_where_it_says_more():
    # ended by Slurm, unless Slurm's state names the cause: OUT_OF_MEMORY is out of memory,
    # NODE_FAIL a lost host (SPEC §12: every failure carries its class)
    from hpcmesh.job import SlurmJob
    from hpcmesh.runtime.errors import HOST_LOST, OUT_OF_MEMORY

    job = SlurmJob(meshes={"w": 1})
    for said, cls in (("Slurm says CANCELLED", ENDED_BY_SLURM),
                      ("Slurm says OUT_OF_MEMORY", OUT_OF_MEMORY),
                      ("Slurm says NODE_FAIL", HOST_LOST)):
        err = job._moved_error(JobEvent(ENDED, "9", said, 1.0, 0))  # private: the error's maker
        assert err.reason == cls and "Slurm job 9" in str(err), (said, err.reason)
