"""Stragglers on the Slurm test cluster (issue 31 item 3's Must show, on two nodes): 8
actors of a SlurmJob, one on the second node blocked in its endpoint; the warning names its
point, host, pid and stack within the threshold + 5 s, through that node's agent."""

from __future__ import annotations

import time

from proc_helpers import wait_until
from test_slurm_e2e import PREFIX, cluster  # noqa: F401 - cluster is a fixture
from test_stragglers import HERE, Stepper, _release, watch  # noqa: F401 - watch: a fixture

from hpcmesh.job import SlurmJob


def test_a_blocked_actor_on_the_second_node_is_named_with_its_host(cluster, watch):  # noqa: F811
    w, reports = watch
    job = SlurmJob(meshes={"hosts": 2}, job_name=f"{PREFIX}-stragglers",
                   log_dir=str(cluster / "logs"), timeout=120, time_limit="10:00")
    state = job.state(cached_path=None)
    try:
        pm = state.hosts.spawn_procs(per_host={"gpus": 4}, name="slurmstrag")
        m = pm.spawn("stepper", Stepper)
        pids = m.pid.call().get(timeout=120).values()
        t0 = time.monotonic()
        second = state.hosts.hostnames[1]   # Slurm picks the nodes: whichever is hosts=1
        fut = m.step.call([6])          # hosts=1, gpus=2: on the second node
        text = wait_until(lambda: reports.texts and reports.texts[0], 1.0 + 5,
                          "the straggler warning")
        print(f"named after {time.monotonic() - t0:.2f} s:\n{text}")
        assert "1 of its 8 members have not answered" in text
        assert "hosts=1,gpus=2 (process " in text and f"pid {pids[6]}," in text
        assert f"host {second}" in text and f"wait at {HERE}:" in text
        assert "(in blocked_in_step)" in text
        _release(m)
        assert fut.get(timeout=60).values() == list(range(8))
    finally:
        job.kill()
