"""GPU binding: torchrun's convention by default, pinning as an option (issue 14).

The pure decision first, then real processes on this host: the local agent lives in this
process and reads the GPU list from its environment, so CUDA_VISIBLE_DEVICES="3,5" here is
a host with GPUs 3 and 5.
"""

import logging

import pytest

from hpcmesh.actor import Actor, default_bootstrap_cmd, endpoint, this_host
from hpcmesh.job.exec import exec_command
from hpcmesh.runtime.process.gpu_binding import choose_binding, gpu_env, gpu_indexes

VARS = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCMESH_LOCAL_SLOT",
        "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")


# ---------------------------------------------------------------------------------------
# the pure function
# ---------------------------------------------------------------------------------------
def test_host_binding_shows_every_gpu_and_local_rank_selects():
    for slot in range(2):
        env = gpu_env("host", slot, 2, ["3", "5"])
        assert env == {"CUDA_VISIBLE_DEVICES": "3,5", "LOCAL_RANK": str(slot),
                       "HPCMESH_LOCAL_SLOT": str(slot)}
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])] == ["3", "5"][slot]


def test_process_binding_pins_and_local_rank_is_zero():
    assert gpu_env("process", 1, 2, ["3", "5"]) == {
        "CUDA_VISIBLE_DEVICES": "5", "LOCAL_RANK": "0", "HPCMESH_LOCAL_SLOT": "1"}
    assert gpu_env("process", 0, 1, ["3", "5"])["CUDA_VISIBLE_DEVICES"] == "3"


def test_too_few_gpus_or_none_keep_the_list_and_the_slot():
    assert gpu_env("process", 2, 3, ["3", "5"]) == {
        "CUDA_VISIBLE_DEVICES": "3,5", "LOCAL_RANK": "2", "HPCMESH_LOCAL_SLOT": "2"}
    for binding in ("host", "process"):          # no GPU list: the process inherits
        assert gpu_env(binding, 1, 2, []) == {"LOCAL_RANK": "1", "HPCMESH_LOCAL_SLOT": "1"}


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=r"gpu_binding must be one of host, process, not 'gpu'"):
        choose_binding("gpu")
    with pytest.raises(ValueError, match=r"HPCMESH_GPU_BINDING must be one of host, process"):
        choose_binding(env={"HPCMESH_GPU_BINDING": "pinned"})
    assert choose_binding(env={}) == "host"
    assert choose_binding(env={"HPCMESH_GPU_BINDING": "Process"}) == "process"
    assert choose_binding("process", env={"HPCMESH_GPU_BINDING": "host"}) == "process"
    with pytest.raises(ValueError, match="slot 2 out of range for 2"):
        gpu_env("host", 2, 2, ["3", "5"])


# ---------------------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------------------
class Probe(Actor):
    @endpoint
    def env(self):
        import os
        return {k: os.environ.get(k) for k in VARS}


def _spawned_env(per_host, **kw):
    procs = this_host().spawn_procs(per_host, **kw)
    try:
        return procs.spawn("probe", Probe).env.call().get(timeout=30).values()
    finally:
        procs.stop().get(timeout=30)


@pytest.fixture
def gpus_3_5(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.delenv("HPCMESH_GPU_BINDING", raising=False)


def test_default_is_torchruns_convention(gpus_3_5):
    got = _spawned_env({"gpus": 2})
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"], e["HPCMESH_LOCAL_SLOT"]) for e in got] \
        == [("3,5", "0", "0"), ("3,5", "1", "1")]
    assert [e["CUDA_VISIBLE_DEVICES"].split(",")[int(e["LOCAL_RANK"])] for e in got] == ["3", "5"]
    assert [(e["GROUP_WORLD_SIZE"], e["ROLE_RANK"], e["ROLE_WORLD_SIZE"], e["ROLE_NAME"])
            for e in got] == [("1", "0", "2", "default"), ("1", "1", "2", "default")]


def test_process_binding_by_argument_or_variable(gpus_3_5, monkeypatch):
    want = [("3", "0", "0"), ("5", "0", "1")]
    got = _spawned_env({"gpus": 2}, gpu_binding="process")
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"], e["HPCMESH_LOCAL_SLOT"])
            for e in got] == want
    monkeypatch.setenv("HPCMESH_GPU_BINDING", "process")
    got = _spawned_env({"gpus": 2})
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"], e["HPCMESH_LOCAL_SLOT"])
            for e in got] == want


def test_process_binding_with_too_few_gpus_warns_once(gpus_3_5, caplog):
    with caplog.at_level(logging.WARNING, logger="hpcmesh.agent"):
        got = _spawned_env({"gpus": 3}, gpu_binding="process")
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"]) for e in got] == [
        ("3,5", "0"), ("3,5", "1"), ("3,5", "2")]
    warnings = [r.getMessage() for r in caplog.records if "GPU binding" in r.getMessage()]
    assert len(warnings) == 1 and "2 GPU(s) (3,5) for 3 processes" in warnings[0], warnings


def test_what_the_command_sets_stays_its_own(gpus_3_5):
    own = default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": "7"})
    got = _spawned_env({"gpus": 2}, bootstrap_command=own, gpu_binding="process")
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"], e["HPCMESH_LOCAL_SLOT"])
            for e in got] == [("7", "0", "0"), ("7", "1", "1")]
    own = default_bootstrap_cmd().with_env({"LOCAL_RANK": "9"})     # only LOCAL_RANK its own
    got = _spawned_env({"gpus": 2}, bootstrap_command=own, gpu_binding="process")
    assert [(e["CUDA_VISIBLE_DEVICES"], e["LOCAL_RANK"], e["HPCMESH_LOCAL_SLOT"])
            for e in got] == [("3", "9", "0"), ("5", "9", "1")]


def test_gpu_index_lists_are_checked_before_processes_get_them():
    assert gpu_indexes("SLURM_STEP_GPUS", " 0, 7,65533 ") == ["0", "7", "65533"]
    for bad in ("0,1;rm -rf x", "", "0,", "GPU-1234", "+1", "\u0661", "1" * 6, "0," * 70000):
        with pytest.raises(ValueError) as e:
            gpu_indexes("SLURM_STEP_GPUS", bad)
        assert str(e.value).startswith("SLURM_STEP_GPUS=") and str(e.value).endswith(
            ": expected GPU indexes from 0 to 65533, comma-separated, like '0,1,2,3'")
        assert len(str(e.value)) < 200


@pytest.fixture
def slurm_gpus(monkeypatch):
    """A step whose GPUs are said by SLURM_STEP_GPUS only (no CUDA_VISIBLE_DEVICES)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HPCMESH_GPU_BINDING", raising=False)
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    return monkeypatch


def test_slurm_step_gpus_reach_the_processes_checked(slurm_gpus):
    slurm_gpus.setenv("SLURM_STEP_GPUS", "2,4")
    got = _spawned_env({"gpus": 2}, gpu_binding="process")
    assert [e["CUDA_VISIBLE_DEVICES"] for e in got] == ["2", "4"]
    slurm_gpus.setenv("SLURM_STEP_GPUS", "2,4;x")
    with pytest.raises(Exception) as e:
        _spawned_env({"gpus": 2})
    assert "SLURM_STEP_GPUS='2,4;x': expected GPU indexes from 0 to 65533" in str(e.value), \
        e.value


def test_bad_binding_fails_before_any_process_starts(gpus_3_5, monkeypatch):
    with pytest.raises(ValueError, match="gpu_binding must be one of host, process, not 'gpu'"):
        this_host().spawn_procs({"gpus": 2}, gpu_binding="gpu")
    monkeypatch.setenv("HPCMESH_GPU_BINDING", "pinned")
    with pytest.raises(ValueError, match="HPCMESH_GPU_BINDING must be one of host, process, "
                                         "not 'pinned'"):
        this_host().spawn_procs({"gpus": 2})
    with pytest.raises(ValueError, match="HPCMESH_GPU_BINDING must be one of"):
        exec_command(this_host(), "true", per_host={"gpus": 2})


def _exec_env(**kw) -> list[str]:
    lines = []
    code = exec_command(this_host(), 'echo "$CUDA_VISIBLE_DEVICES $LOCAL_RANK $LOCAL_WORLD_SIZE '
                        '$HPCMESH_LOCAL_SLOT $HPCMESH_GPU_BINDING"', per_host={"gpus": 2},
                        on_output=lambda label, stream, line: lines.append(f"{label} {line}"),
                        **kw).get(timeout=60)
    assert code == 0, lines
    return sorted(lines)


def test_exec_slot_is_the_coordinate_asked_for(gpus_3_5):
    assert _exec_env(point={"gpus": 1}) == ["gpus=1 3,5 1 2 1 host"]
    assert _exec_env(rank=1, gpu_binding="process") == ["gpus=1 5 0 2 1 process"]
    assert _exec_env() == ["gpus=0 3,5 0 2 0 host", "gpus=1 3,5 1 2 1 host"]
