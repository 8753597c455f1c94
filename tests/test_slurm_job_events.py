"""The job's own lifecycle is not a crash (SPEC §12, issue 31), on the Slurm test cluster.

Each test runs ``examples/slurm_requeue.py`` as a user would: its own client process, with
the default ``unhandled_fault_hook`` (not this session's recording one, tests/conftest.py),
and acts on its job from outside as Slurm or its admin would: the preemption warning
(``scancel --batch --signal=USR1``), ``scontrol requeue``, ``scancel``, the time limit.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import pytest

from hpcmesh.job.slurm import squeue_jobs
from test_slurm_e2e import PREFIX, PY, REPO, _listed, cluster  # noqa: F401 - cluster: a fixture
from test_slurm_queue import _wait_state

# each waits in a queue other jobs of the cluster share, then for Slurm's own clock
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

EXAMPLE = os.path.join(REPO, "examples", "slurm_requeue.py")


class Client:
    """The example running in a process of its own; its output lines as they come."""

    def __init__(self, tmp_path, name: str, *args: str):
        env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        self.lines: list[str] = []
        self.eof = False
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [PY, EXAMPLE, "--ckpt", str(tmp_path / "ckpt"), "--log-dir",
             str(tmp_path / "logs"), "--job-name", f"{PREFIX}-{name}", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> re.Match:
        """The first output line from line ``after`` on that matches ``pattern``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[after:]:
                    if (m := rx.search(line)):
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    break
                self._cond.wait(min(left, 1.0))
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n"
                             f"{self.output}")

    def line_count(self) -> int:
        with self._cond:
            return len(self.lines)

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the client did not exit within {timeout} s; output:\n"
                                 f"{self.output}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _run(*argv: str) -> None:
    subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True)


def _clean(output: str) -> None:
    """Nothing reached the default unhandled_fault_hook, nothing was interrupted."""
    for bad in ("Unhandled hpcmesh error", "KeyboardInterrupt", "Traceback"):
        assert bad not in output, f"{bad!r} in the client's output:\n{output}"


def _warn_and_checkpoint(client: Client, jid: str) -> int:
    """Slurm's warning (the batch shell forwards it to the agents); the client checkpoints
    on the notice. Returns the step of the last checkpoint written."""
    client.wait_for(r"^step \d+", 120)
    mark = client.line_count()
    _run("scancel", "--batch", "--signal=USR1", jid)
    m = client.wait_for(r"^checkpoint written at step (\d+)", 60, after=mark)
    return int(m.group(1))


def _last_checkpoint_before(output: str, marker: str) -> int:
    head = output.split(marker, 1)[0]
    return int(re.findall(r"checkpoint written at step (\d+)", head)[-1])


def test_requeue_with_the_default_hook_checkpoints_and_resumes(cluster):
    client = Client(cluster, "evrequeue", "--steps", "80", "--step-time", "0.25")
    jid = None
    try:
        jid = client.wait_for(r"^job (\d+) running", 300).group(1)
        _warn_and_checkpoint(client, jid)
        mark = client.line_count()
        t_requeue = time.monotonic()
        _run("scontrol", "requeue", jid)
        client.wait_for(rf"^job event: Slurm job {jid} was requeued", 60, after=mark)
        # the requeued job waits for its begin time (Slurm's 2 minutes); as an admin would,
        # let it start now
        assert _wait_state(jid, {"PENDING"}, 60), squeue_jobs([jid])
        _run("scontrol", "update", f"jobid={jid}", "StartTime=now")
        resumed = int(client.wait_for(r"^resumed from step (\d+) .*\(restart 1\)", 240,
                                      after=mark).group(1))
        took = time.monotonic() - t_requeue
        assert client.finish(240) == 0, client.output
        out = client.output
        print(f"\nscontrol requeue -> training resumed on the new run: {took:.1f} s")
        # resumed from exactly the checkpoint written on the notice, and trained on to the end
        assert resumed == _last_checkpoint_before(out, "job event:") > 0, out
        assert "done: 80 steps" in out, out
        # the calls in flight said what happened, the waiting for the queue was shown
        assert f"job {jid} PENDING" in out, out
        _clean(out)
    finally:
        client.stop()
    assert not _listed(jid)


def test_preemption_warning_then_the_job_ends_exits_cleanly(cluster):
    client = Client(cluster, "evpreempt", "--steps", "100000", "--step-time", "0.05")
    jid = None
    try:
        jid = client.wait_for(r"^job (\d+) running", 300).group(1)
        saved = _warn_and_checkpoint(client, jid)
        mark = client.line_count()
        t0 = time.monotonic()
        _run("scancel", jid)          # the preemptor takes the nodes: the job ends
        # the agents take scancel's SIGTERM as a notice (they live until Slurm's SIGKILL,
        # KillWait later): the client asks Slurm on it, and the call in flight fails now
        client.wait_for(r"^training call failed \(ended by Slurm", 60, after=mark)
        took = time.monotonic() - t0
        client.wait_for(rf"^job event: Slurm job {jid} was cancelled", 60, after=mark)
        print(f"\nscancel -> the call in flight failed: {took:.2f} s")
        assert client.finish(60) == 0, client.output
        out = client.output
        assert re.search(rf"Slurm job {jid} will not run again \(cancelled\); the checkpoint "
                         rf"in \S+ holds what was saved", out), out
        assert _last_checkpoint_before(out, "job event:") >= saved
        _clean(out)
    finally:
        client.stop()
    assert not _listed(jid)


def test_time_limit_tells_the_program_which_exits_cleanly(cluster):
    # a one-minute limit with the warning 50 s before it: Slurm sends it at its next check
    client = Client(cluster, "evtimelimit", "--steps", "100000", "--step-time", "0.05",
                    "--time", "1", "--signal", "USR1@50", "--nodes", "1")
    jid = None
    try:
        jid = client.wait_for(r"^job (\d+) running", 300).group(1)
        client.wait_for(r"^checkpoint written at step \d+", 120)
        event = client.wait_for(rf"^job event: Slurm job {jid} reached its time limit", 180)
        assert client.finish(60) == 0, client.output
        out = client.output
        assert f"Slurm job {jid} will not run again (time_limit)" in out, out
        assert "TimeLimit" in event.string or "TIMEOUT" in event.string, event.string
        _clean(out)
    finally:
        client.stop()
    # Slurm winds the job up (COMPLETING) and ends it TIMEOUT: nothing of it runs on
    assert _wait_state(jid, {"TIMEOUT"}, 60) == "TIMEOUT", squeue_jobs([jid])


def test_a_job_with_no_processes_still_tells_its_end(cluster):
    # nothing runs on the agents, so no process's end asks Slurm: watch_events' own look does
    import queue
    from test_slurm_e2e import _job
    job = _job("evidle", cluster, grace=30)
    job.state(cached_path=None)
    events: queue.Queue = queue.Queue()
    stop = job.watch_events(events.put, interval=0.5)
    jid = job.job_id
    try:
        t0 = time.monotonic()
        _run("scancel", jid)
        event = events.get(timeout=30)
        assert (event.kind, event.job_id, event.comes_back) == ("cancelled", jid, False), event
        assert "CANCELLED" in event.reason and time.monotonic() - t0 < 30
        with pytest.raises(ValueError, match="interval"):
            job.watch_events(events.put, interval=0)
    finally:
        stop.set()
        job.kill()
    assert not _listed(jid)


def _urgent(node: str) -> str:
    """A job of the cluster's ``urgent`` partition (PriorityTier 10, PreemptMode=REQUEUE on
    the others) pinned to ``node``: Slurm preempts what holds the node, as a site's
    high-priority queue does. Small (one CPU): the example's job is ``--exclusive``, so it
    is the only job it can preempt there."""
    out = subprocess.run(
        ["sbatch", "--parsable", "--partition=urgent", f"--nodelist={node}", "--ntasks=1",
         "--mem=1000", f"--job-name={PREFIX}-urgent", "--output=/dev/null",
         "--wrap=sleep 600"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip().split(";")[0]


def _grace_time(partition: str = "debug") -> int:
    """The partition's preemption GraceTime (tests/cluster/up.sh sets 10 s)."""
    out = subprocess.run(["scontrol", "show", "partition", partition], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return int(re.search(r"GraceTime=(\d+)", out).group(1))


def test_real_preemption_with_a_grace_time_checkpoints_on_the_notice_and_resumes(cluster):
    # The site gives preempted jobs a grace (GraceTime): Slurm SIGTERMs the job's tasks at
    # once and SIGKILLs them GraceTime later. With the default hook and no periodic
    # checkpoint, the program hears the SIGTERM as a notice, checkpoints in the grace, the
    # job is requeued ('preempted') and the program resumes from that checkpoint.
    grace = _grace_time()
    if grace <= 0:
        pytest.fail("the debug partition has no GraceTime (tests/cluster/up.sh sets 10); on "
                    "a running cluster: scontrol update PartitionName=debug GraceTime=10")
    # (enough steps to outlast the grace and the scheduler's pass after it)
    client = Client(cluster, "evpreemptreal", "--steps", "400", "--step-time", "0.1",
                    "--nodes", "1")
    jid = urgent = None
    ok = False
    try:
        m = client.wait_for(r"^job (\d+) running on \['([^']+)'\]", 300)
        jid, node = m.group(1), m.group(2)
        client.wait_for(r"^step [1-9]\d*", 120)
        mark = client.line_count()
        t_submit = time.monotonic()
        urgent = _urgent(node)
        # SIGTERM to the agent: a notice, the program checkpoints on it in the grace
        saved = client.wait_for(rf"^checkpoint written at step (\d+) \(Slurm's notice: "
                                rf"SIGTERM on {node}\)", grace, after=mark)
        t_saved = time.monotonic() - t_submit
        # training goes on in the grace; then the call in flight fails, saying what
        # happened and what to do
        failed = client.wait_for(r"^training call failed \((.*?)\): (.*)", grace + 30,
                                 after=mark)
        took = time.monotonic() - t_submit
        assert failed.group(1) == "ended by Slurm (preempted)", failed.string
        assert f"Slurm job {jid} was preempted" in failed.group(2), failed.string
        assert "call job.state()" in failed.group(2), failed.string
        event = client.wait_for(rf"^job event: Slurm job {jid} (was \w+) \((.*)\)", 60,
                                after=mark)
        assert event.group(1) == "was preempted", event.string
        assert "PreemptTime" in event.group(2) or "DUE TO PREEMPTION" in event.group(2), \
            event.string
        # state() waits in the queue while the urgent job holds the node
        client.wait_for(rf"job {jid} PENDING", 60, after=mark)
        assert squeue_jobs([urgent])[urgent].state == "RUNNING"
        assert not re.search(r"^resumed from", client.output, re.M), client.output
        _run("scancel", urgent)
        # the requeued job waits for its begin time (Slurm's 2 minutes): let it start now
        _run("scontrol", "update", f"jobid={jid}", "StartTime=now")
        resumed = int(client.wait_for(r"^resumed from step (\d+) .*\(restart 1\)", 240,
                                      after=mark).group(1))
        assert client.finish(240) == 0, client.output
        out = client.output
        print(f"\nurgent job {urgent} submitted (GraceTime {grace} s) -> checkpoint on the "
              f"SIGTERM notice written: {t_saved:.1f} s; the call in flight failed: "
              f"{took:.1f} s\n{event.string}")
        # from the checkpoint written on the notice (or on the SIGTERM of the grace's end,
        # where it was written before the end came), the only kind this run wrote
        head = out.split("training call failed", 1)[0]
        assert resumed == _last_checkpoint_before(out, "training call failed") >= int(
            saved.group(1)) > 0, out
        assert all("(Slurm's notice: SIGTERM" in ln for ln in head.splitlines()
                   if ln.startswith("checkpoint written")), out
        assert "done: 400 steps" in out, out
        _clean(out)
        ok = True
    finally:
        if urgent:      # the preemptor goes whatever happened: other tests need the node
            subprocess.run(["scancel", urgent], capture_output=True, timeout=30)
        client.stop()
        if jid and not ok:      # the client that failed left its requeued job behind
            subprocess.run(["scancel", jid], capture_output=True, timeout=30)
    deadline = time.monotonic() + 60
    while (urgent and _listed(urgent)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (urgent and _listed(urgent)), squeue_jobs([urgent])
    assert not _listed(jid)
