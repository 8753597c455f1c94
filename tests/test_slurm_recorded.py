"""Parsers against output recorded on the real Slurm 22.05 test cluster."""

from pathlib import Path

from hpcmesh.slurm.parsing import Allocation, parse_sacct, parse_squeue

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
