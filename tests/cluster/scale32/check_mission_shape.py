"""The mission's shape, {"hosts": 32, "gpus": 8}, on a 32-node test cluster (issue 30).

Not collected with the rest of tests/ (it needs the 32-node cluster): ``test.sh`` beside it
brings that cluster up, runs this file, and puts the 3-node one back. One job, one test,
a few minutes at most (``HPCMESH_SCALE_HOSTS=3``: the same on the 3-node cluster): 256
processes spawned through SlurmJob, a call() over all of them,
the order of one sender's messages to one actor across call_one and call(), a member
killed in the middle of a call() failing only its own slot, alike log lines folded into
one, and nothing of the job left afterwards.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import pytest  # noqa: E402
from output_recorder import Recorder  # noqa: E402
from proc_helpers import wait_until  # noqa: E402

from hpcmesh.actor import Actor, SupervisionError, current_rank, endpoint  # noqa: E402
from hpcmesh.job import SlurmJob  # noqa: E402
from hpcmesh.runtime import relay  # noqa: E402

#: 32 (test.sh); HPCMESH_SCALE_HOSTS=3 runs the same program on the 3-node cluster
HOSTS, PER_HOST = int(os.environ.get("HPCMESH_SCALE_HOSTS", "32")), 8
N = HOSTS * PER_HOST
ONE_HOST = HOSTS * 17 // 32                 # the actor the order is checked at
OTHER_HOST = HOSTS * 3 // 32 if HOSTS * 3 // 32 != ONE_HOST else (ONE_HOST + 1) % HOSTS
VICTIM_HOST = HOSTS * 9 // 32               # where a member is killed mid-call()
ROW_HOST = (VICTIM_HOST + HOSTS - 1) % HOSTS  # a host that goes on
NAME = f"hpcm-scale{os.getpid()}"


class Member(Actor):
    def __init__(self):
        self.seen: list[int] = []

    @endpoint
    async def note(self, i: int) -> int:
        self.seen.append(i)
        return i

    @endpoint
    async def log(self) -> list[int]:
        return self.seen

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def hold(self, seconds: float) -> int:
        await asyncio.sleep(seconds)        # sleep: the call a member is killed in the middle of
        return current_rank().rank

    @endpoint
    def say(self, step: int) -> None:
        print(f"step {step} loss {0.3 + current_rank().rank / 1000:.3f}", flush=True)


def _our_jobs() -> str:
    return subprocess.run(["squeue", "--noheader", "--name", NAME, "--format=%i %T"],
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _procs_of(pids) -> list[int]:
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("route", ["flat", "tree"])
def test_the_mission_shape(tmp_path, monkeypatch, route):
    """``flat``: one cast per host agent (32 hosts is the tree's width); ``tree``: the
    casts go through a tree of agents 4 wide (``HPCMESH_RELAY_FANOUT``), answers folding
    up it, each agent in its own node's network namespace."""
    heads = HOSTS
    if route == "tree":
        heads = 4 if HOSTS > 4 else 2
        monkeypatch.setenv(relay.FANOUT_VAR, str(heads))
    job = SlurmJob(meshes={"w": HOSTS}, job_name=NAME, log_dir=str(tmp_path / "logs"),
                   timeout=300, grace=10)
    pids = []
    try:
        state = job.state(cached_path=None)
        assert dict(state.w.extent) == {"hosts": HOSTS}
        t0 = time.monotonic()
        procs = state.w.spawn_procs(per_host={"gpus": PER_HOST})
        members = procs.spawn("m", Member)
        got = members.pid.call().get(timeout=300)           # a call() over all of them
        print(f"{N} processes spawned and answering in {time.monotonic() - t0:.1f} s")
        pids = list(got.values())
        assert len(set(pids)) == N
        assert dict(got.extent) == {"hosts": HOSTS, "gpus": PER_HOST}
        before = relay.STATS["casts_sent"]
        assert members.pid.call().get(timeout=60).values() == pids
        assert relay.STATS["casts_sent"] - before == heads     # one per host, or per head

        # one sender, one actor: its messages in send order, whichever way they went
        one = members.slice(hosts=ONE_HOST, gpus=5)
        futs, sent_to_one = [], []
        for i in range(300):
            if i % 3 == 0:
                futs.append(members.note.call(i))
            else:
                futs.append(one.note.call_one(i))
            sent_to_one.append(i)
        for f in futs:
            f.get(timeout=120)
        assert one.log.call_one().get(timeout=60) == sent_to_one
        others = members.slice(hosts=OTHER_HOST).log.call().get(timeout=60).values()
        assert all(seen == list(range(0, 300, 3)) for seen in others)

        # alike lines of every process: one line at the client, each file keeps its own
        out = Recorder.install(monkeypatch, "stdout")
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=1))
        members.say.call(10).get(timeout=60)
        folded = re.compile(rf"^\[{N} similar log lines, hosts=0\.\.{HOSTS - 1},gpus=0\.\.7\] "
                            r"step 10 loss 0\.\d+$", re.M)
        wait_until(lambda: folded.search(out.text()), 60, f"the {N} lines folded into one")
        assert out.text().count("step 10 loss") == 1, out.text()[-2000:]

        # a member killed in the middle of a call() fails its own slot, named; the rest go on
        victim = members.slice(hosts=VICTIM_HOST, gpus=6)
        victim_pid = victim.pid.call_one().get(timeout=60)
        pending = members.hold.call(30)
        os.kill(victim_pid, signal.SIGKILL)
        t_kill = time.monotonic()
        with pytest.raises(SupervisionError, match=rf"hosts={VICTIM_HOST},gpus=6"):
            pending.get(timeout=60)
        assert time.monotonic() - t_kill < 15        # not the 30 s the call takes
        row = members.slice(hosts=ROW_HOST).pid.call().get(timeout=60).values()
        assert len(row) == PER_HOST
        procs.stop().get(timeout=120)
    finally:
        job.kill()
    wait_until(lambda: not _our_jobs(), 60, "the job gone from squeue")
    wait_until(lambda: not _procs_of(pids), 60, "every process of the job gone")
