"""Parsers against output recorded on the real Slurm 22.05 test cluster."""

from pathlib import Path

from hpcmesh.slurm.parsing import (Allocation, parse_sacct, parse_scontrol_restarts, parse_squeue,
                                  parse_squeue_start, sacct_unavailable)

FIX = Path(__file__).parent / "fixtures" / "slurm"


def test_recorded_squeue():
    jobs = {j.job_id: j for j in parse_squeue((FIX / "squeue-22.05-recorded.txt").read_text())}
    assert jobs["12"].state == "FAILED" and jobs["12"].reason == "NonZeroExitCode"
    assert jobs["10"].state == "RUNNING" and jobs["10"].nodes == ["node1", "node2", "node3"]
    assert jobs["11"].num_nodes == 3 and jobs["11"].partition == "debug"


def test_recorded_sacct_jobcomp():
    recs = parse_sacct((FIX / "sacct-jobcomp-22.05-recorded.txt").read_text())
    by_name = {r.name: r for r in recs}
    assert by_name["fx-fail"].state == "FAILED"
    assert by_name["fx-running"].state == "CANCELLED"


def test_recorded_salloc_env():
    env = {}
    for line in (FIX / "env-salloc-22.05-recorded.env").read_text().splitlines():
        k, _, v = line.partition("=")
        env[k] = v
    alloc = Allocation.from_env(env)
    assert alloc is not None
    assert alloc.nodes == ["node1", "node2"] and alloc.num_nodes == 2


# --- Slurm 24.11.5 (Debian 13), recorded on tests/cluster/slurm24 -------------------------

def test_recorded_squeue_24_11():
    text = (FIX / "squeue-24.11-recorded.txt").read_text()
    first, later = text.splitlines()[:4], text.splitlines()[4:]
    jobs = {j.job_id: j for j in parse_squeue("\n".join(first))}
    assert jobs["47"].state == "RUNNING" and jobs["47"].nodes == ["node1", "node2", "node3"]
    assert jobs["47"].time_limit_seconds == 300 and jobs["47"].time_used_seconds == 3
    assert jobs["48"].state == "PENDING" and jobs["48"].reason == "Resources"
    assert jobs["48"].nodes == []
    assert jobs["49"].reason == "BeginTime"
    assert jobs["50"].reason.startswith("Nodes required for job are DOWN")
    assert jobs["50"].partition == "batch"
    ended = {j.job_id: j for j in parse_squeue("\n".join(later))}
    assert {j: r.state for j, r in ended.items()} == {
        "50": "FAILED", "49": "CANCELLED", "47": "CANCELLED", "48": "COMPLETED"}
    assert all(r.is_terminal for r in ended.values())


def test_recorded_squeue_start_24_11():
    got = parse_squeue_start((FIX / "squeue-start-24.11-recorded.txt").read_text())
    assert got == {"49": "2026-12-02T06:00:00"}        # 48 (Resources): N/A, no estimate


def test_recorded_sacct_24_11():
    # no accounting storage: sacct refuses, and that is not an error for hpcmesh
    assert sacct_unavailable((FIX / "sacct-24.11-no-accounting-recorded.txt").read_text())
    recs = parse_sacct((FIX / "sacct-jobcomp-24.11-recorded.txt").read_text())
    by_id: dict[str, list] = {}
    for r in recs:
        by_id.setdefault(r.job_id, []).append(r)
    # a requeued job (43) appears once per run in the job-completion log
    assert [r.state for r in by_id["43"]] == ["PENDING", "COMPLETED"]
    assert by_id["50"][0].state == "FAILED" and by_id["50"][0].exit_code == 3
    assert by_id["49"][0].nodes == [] and by_id["47"][0].nodes == ["node1", "node2", "node3"]


def test_recorded_scontrol_restarts_24_11():
    text = (FIX / "scontrol-show-job-24.11-recorded.txt").read_text()
    assert "JobState=RUNNING" in text and parse_scontrol_restarts(text) == 0
    assert parse_scontrol_restarts(text.replace("Restarts=0", "Restarts=2")) == 2
    assert parse_scontrol_restarts("JobId=1 JobState=PENDING") is None
