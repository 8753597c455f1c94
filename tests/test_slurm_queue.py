"""Jobs that wait in a real queue (the Slurm test cluster, tests/cluster/README.md).

A job pending behind another that holds every node is not cancelled for waiting, however
short its bring-up ``timeout``; it attaches within seconds once the nodes free up. Ctrl-C
while pending cancels it and says so; a SIGKILLed pending client leaves a job whose agents
exit on their lease as soon as it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hpcmesh.actor import Actor, endpoint
from hpcmesh.job import SlurmStartTimeout
from hpcmesh.job.slurm import squeue_jobs
from slurm_cluster import CLUSTER_NODES
from test_slurm_e2e import PREFIX, PY, SCANCEL, _job, _listed, cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.slurm


def _hold_every_node(name: str) -> str:
    """Submit a job that holds every node of the cluster; returns its id once RUNNING."""
    out = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={len(CLUSTER_NODES)}", "--exclusive", "--time=10",
         f"--job-name={PREFIX}-{name}", "--output=/dev/null", "--wrap", "sleep 600"],
        capture_output=True, text=True, timeout=30, check=True)
    jid = out.stdout.strip().split(";")[0]
    # nodes an earlier test's job still winds up (COMPLETING: Slurm's KillWait after a time
    # limit, an epilog) free up within Slurm's own timeouts
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rec = squeue_jobs([jid]).get(jid)
        if rec is not None and rec.state == "RUNNING":
            return jid
        time.sleep(0.2)
    subprocess.run(["scancel", jid], timeout=30)
    raise AssertionError(f"blocker job {jid} did not start: {squeue_jobs([jid])}; "
                         f"the nodes: {subprocess.run(['sinfo', '-N', '-h'], capture_output=True, text=True).stdout}")


def _release(jid: str) -> float:
    """scancel the blocker; returns when that was asked, after squeue has let it go (it
    may sit in COMPLETING a few seconds, longer on 24.11, and the teardown checks)."""
    subprocess.run([SCANCEL, jid], timeout=30, check=True)
    asked = time.monotonic()
    deadline = asked + 60
    while _listed(jid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return asked


def _wait_state(jid: str, states: set[str], timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = squeue_jobs([jid]).get(jid)
        if rec is not None and rec.state in states:
            return rec.state
        time.sleep(0.2)
    return None


def test_queued_job_outlives_its_bring_up_timeout_then_attaches(cluster, capsys):
    blocker = _hold_every_node("blocker")
    job = _job("queued", cluster, timeout=5)
    seen: dict = {}

    def release_after_20s():
        time.sleep(20)      # sleep: the job stays queued well past its 5 s bring-up timeout
        seen["records"] = squeue_jobs(job.job_ids)
        seen["released"] = _release(blocker)

    releaser = threading.Thread(target=release_after_20s, daemon=True)
    t0 = time.monotonic()
    releaser.start()
    try:
        state = job.state(cached_path=None)
        attached = time.monotonic()
        releaser.join(30)
        rec = seen["records"][job.job_id]
        # 20 s in the queue with a 5 s bring-up timeout: pending, not cancelled
        assert rec.state == "PENDING" and rec.reason in ("Resources", "Priority"), rec
        wait = attached - seen["released"]
        with capsys.disabled():
            print(f"\nqueued {seen['released'] - t0:.1f} s behind a job holding every node; "
                  f"attached {wait:.2f} s after the nodes were freed")
        assert wait < 15
        assert len(state.hosts.hostnames) == 1
        procs = state.hosts.spawn_procs(per_host={"gpus": 1})
        procs.initialized.get(timeout=60)
        assert job.timings["submit_to_running_s"] >= 19
        err = capsys.readouterr().err
        assert f"job {job.job_id} PENDING (" in err, err
        assert f"job {job.job_id} RUNNING" in err, err
    finally:
        if _listed(blocker):
            _release(blocker)
        job.kill()
    assert not _listed(job.job_id)


def _apply_times_out(job) -> tuple[float, str, str]:
    """apply() must raise SlurmStartTimeout: (seconds it took, message, job id)."""
    t0 = time.monotonic()
    with pytest.raises(SlurmStartTimeout) as ei:
        job.apply()
    return time.monotonic() - t0, str(ei.value), job.job_ids[0]


def test_job_start_timeout_bounds_the_queue_wait_when_set(cluster, capsys):
    # a begin time in the future keeps the job pending; Slurm knows when it would start
    job = _job("jst", cluster, slurm_args=["--begin=now+1hour"], timeout=1,
               job_start_timeout=4)
    took, msg, jid = _apply_times_out(job)
    assert 4 <= took < 30
    assert f"Slurm job {jid}" in msg and "PENDING (BeginTime)" in msg
    assert "within 4 s of submission (job_start_timeout=4" in msg
    assert "it was cancelled" in msg and f"{PREFIX}-jst-{jid}.out" in msg
    assert not _listed(jid)
    err = capsys.readouterr().err
    assert f"job {jid} PENDING (BeginTime) expected start 20" in err, err


def test_bring_up_timeout_counts_from_running(cluster):
    # the job runs at once, but its setup keeps the agents from starting for 60 s
    job = _job("slowsetup", cluster, setup=["sleep 60"], timeout=3)
    took, msg, jid = _apply_times_out(job)
    assert 3 <= took < 30, took
    assert "within 3 s of the job starting to run (timeout=3" in msg, msg
    assert f"{jid} RUNNING" in msg and "it was cancelled" in msg
    assert not _listed(jid)


def _client_script(cluster, name: str, grace: float, extra: str = "") -> str:
    script = cluster / f"{name}.py"
    script.write_text(textwrap.dedent(f"""
        from hpcmesh.job import SlurmJob
        job = SlurmJob(meshes={{"hosts": 1}}, job_name="{PREFIX}-{name}", grace={grace},
                       log_dir="{cluster / 'logs'}", progress=True, timeout=5{extra})
        job.apply()
        print("ATTACHED", flush=True)
    """))
    return str(script)


def _wait_pending_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Read the client's stderr until its progress shows the job pending; returns the id."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("hpcmesh: job ") and " PENDING (" in line:
            return line.split()[2]
    raise AssertionError("the client never showed a pending job:\n" + "".join(lines))


def test_ctrl_c_while_pending_cancels_the_job_and_says_so(cluster):
    script = _client_script(cluster, "ctrlc", grace=30, extra=', slurm_args=["--begin=now+1hour"]')
    proc = subprocess.Popen([PY, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        jid = _wait_pending_line(proc)
        assert _listed(jid)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert f"hpcmesh: interrupted; cancelled Slurm job {jid}" in err, err
        assert "KeyboardInterrupt" in err and proc.returncode != 0
        assert not _listed(jid)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkilled_pending_client_leaves_no_job_holding_nodes(cluster):
    blocker = _hold_every_node("blocker2")
    script = _client_script(cluster, "pendkill", grace=3)
    proc = subprocess.Popen([PY, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        jid = _wait_pending_line(proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # the job stays queued (nobody could cancel it); once it runs, its agents find no
        # client and exit after their initial wait (the lease grace), and the job completes
        assert _listed(jid)
        _release(blocker)
        assert _wait_state(jid, {"RUNNING", "COMPLETING", "COMPLETED"}, 30), squeue_jobs([jid])
        t_run = time.monotonic()
        while _listed(jid) and time.monotonic() - t_run < 40:
            time.sleep(0.2)
        held = time.monotonic() - t_run
        print(f"\njob {jid} of a SIGKILLed pending client held its node {held:.1f} s after it "
              f"started (lease grace 3 s)")
        assert not _listed(jid)
        assert held < 3 + 15
        assert squeue_jobs([jid])[jid].state == "COMPLETED"
    finally:
        if proc.poll() is None:
            proc.kill()
        if _listed(blocker):
            _release(blocker)


class Trainer(Actor):
    """Counts steps; on a preemption notice it checkpoints to the shared filesystem."""

    def __init__(self, ckpt: str):
        import json
        import os
        self.ckpt = ckpt
        self.step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0

    @endpoint
    def train(self, steps: int) -> int:
        self.step += steps
        return self.step

    @endpoint
    def checkpoint(self) -> dict:
        import json
        import os
        from hpcmesh.job import slurm_notice
        with open(self.ckpt + ".tmp", "w") as f:
            json.dump({"step": self.step}, f)
        os.replace(self.ckpt + ".tmp", self.ckpt)
        return {"step": self.step, "notices": len(slurm_notice() or [])}

    @endpoint
    def where(self) -> tuple:
        import os
        return os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_RESTART_COUNT", "0")


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, check=True)


def test_requeue_brings_the_mesh_back_after_a_checkpoint(cluster):
    job = _job("requeue", cluster, requeue=True, grace=30)
    ckpt = str(cluster / "trainer.ckpt")
    state = job.state(cached_path=None)
    try:
        jid = job.job_id
        trainer = state.hosts.spawn_procs().spawn("trainer", Trainer, ckpt)
        assert trainer.train.call_one(5).get(timeout=60) == 5
        assert trainer.where.call_one().get(timeout=30) == (jid, "0")

        # preemption warning: the batch shell forwards the signal to the agents, which record
        # it; the controller sees the notice and has the trainer checkpoint first
        got = threading.Event()
        notices = []
        stop = job.watch_notices(lambda n: (notices.append(n), got.set()), interval=0.2)
        subprocess.run(["scancel", "--batch", "--signal=USR1", jid], timeout=30, check=True)
        assert got.wait(30), "no preemption notice reached the controller"
        stop.set()
        assert notices[0]["signal"] == "SIGUSR1" and notices[0]["slurm_job_id"] == jid
        saved = trainer.checkpoint.call_one().get(timeout=30)
        assert saved == {"step": 5, "notices": 1}

        # the requeue: Slurm ends the run and queues the job again, held for 120 s by a begin
        # time; the test cluster lets it start at once (the admin's `StartTime=now`)
        t_requeue = time.monotonic()
        _scontrol("requeue", jid)
        assert _wait_state(jid, {"PENDING"}, 30), squeue_jobs([jid])
        _scontrol("update", f"jobid={jid}", "StartTime=now")
        state = job.state(cached_path=None)          # reconnects to the new run's agents
        trainer = state.hosts.spawn_procs().spawn("trainer", Trainer, ckpt)
        assert trainer.train.call_one(1).get(timeout=60) == 6     # resumed from step 5
        took = time.monotonic() - t_requeue
        print(f"\nscontrol requeue -> a working call on the new allocation: {took:.1f} s")
        assert job.restart_count == 1 and job.job_id == jid
        assert trainer.where.call_one().get(timeout=30) == (jid, "1")
        assert job.notices() is None                 # the warning belonged to the first run
        assert took < 60
    finally:
        job.kill()
    assert not _listed(jid)
