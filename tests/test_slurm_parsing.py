"""hpcmesh.slurm.parsing on recorded/derived fixtures (tests/fixtures/slurm/README.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hpcmesh.slurm import parsing
from hpcmesh.slurm.parsing import (
    SACCT_FORMAT,
    SLURM_STATES,
    SLURM_STATES_ACTIVE,
    SLURM_STATES_LIVE,
    SLURM_STATES_TERMINAL,
    SQUEUE_FORMAT,
    Allocation,
    SlurmParseError,
    clean_env_for_nested_srun,
    command_for_sacct,
    command_for_squeue,
    command_for_squeue_start,
    compress_hostlist,
    expand_hostlist,
    normalize_state,
    parse_exit_code,
    parse_gpu_count,
    parse_sacct,
    parse_sbatch_parsable,
    parse_slurm_duration,
    parse_squeue,
    parse_squeue_start,
    parse_tasks_per_node,
    sacct_unavailable,
    squeue_job_unknown,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def env_fixture(name: str) -> dict[str, str]:
    env = {}
    for line in fixture(name).splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


# --------------------------------------------------------------------------
# hostlists, counts, durations


@pytest.mark.parametrize("text, expected", [
    ("node[01-04,07],gpu-a[1-2]",
     ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
    ("hnode1", ["hnode1"]),
    ("tnode[1-2]", ["tnode1", "tnode2"]),
    ("n[1-2]x[1-2]", ["n1x1", "n1x2", "n2x1", "n2x2"]),
    ("b,a", ["b", "a"]),  # Slurm's order is kept: ranks follow it
    ("node[009-011]", ["node009", "node010", "node011"]),
    ("  node1  ", ["node1"]),
    ("", []),
])
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected


def test_expand_hostlist_unique_refuses_a_repeat():
    assert expand_hostlist("a,b,a") == ["a", "b"]          # a nodelist: counts once
    for text in ("a,b,a", "n[1,1]", "n[1-3],n2"):
        with pytest.raises(SlurmParseError, match=r"names 'n?[a12]' twice"):
            expand_hostlist(text, unique=True)


@pytest.mark.parametrize("text", ["node[1-", "node[3-1]", "x[a-b]", "node1 node2", "n]1["])
def test_expand_hostlist_malformed_names_input_and_form(text):
    with pytest.raises(SlurmParseError) as err:
        expand_hostlist(text)
    assert repr(text) in str(err.value)
    assert "node[01-04,07],gpu-a[1-2]" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_compress_hostlist_roundtrip():
    names = ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]
    text = compress_hostlist(names)
    assert text == "gpu-a[1-2],node[01-03,07]"
    assert sorted(expand_hostlist(text)) == sorted(names)
    assert compress_hostlist([]) == ""


@pytest.mark.parametrize("bad", ["node 1", "a,b", "", "x[1]"])
def test_compress_hostlist_rejects_non_names(bad):
    with pytest.raises(SlurmParseError, match="plain host names"):
        compress_hostlist([bad])


@pytest.mark.parametrize("text, expected", [
    ("2(x3),1", [2, 2, 2, 1]),
    ("4", [4]),
    ("1,2(x2)", [1, 2, 2]),
    ("1(x2)", [1, 1]),
    ("8(x2),4,16(x1)", [8, 8, 4, 16]),
    (" 3 ", [3]),
])
def test_parse_tasks_per_node(text, expected):
    assert parse_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x0)", "1,,2", "2x3", "2(3)", "-1"])
def test_parse_tasks_per_node_errors(text):
    with pytest.raises(SlurmParseError) as err:
        parse_tasks_per_node(text)
    assert repr(text) in str(err.value)
    assert "2(x3),1" in str(err.value) or "repeat count" in str(err.value)


@pytest.mark.parametrize("text, expected", [
    ("2", 2), ("gpu:2", 2), ("a100:4", 4), ("gpu:a100:4", 4), ("a100:2,v100:1", 3),
    ("gpu:a100:4(S:0-1)", 4), ("0", 0),
])
def test_parse_gpu_count(text, expected):
    assert parse_gpu_count(text) == expected


@pytest.mark.parametrize("text", ["", "gpu", "a100:x", "2:a100"])
def test_parse_gpu_count_errors(text):
    with pytest.raises(SlurmParseError, match="a100:4"):
        parse_gpu_count(text)


@pytest.mark.parametrize("text, seconds", [
    ("0:00", 0), ("1:23", 83), ("1:02:03", 3723), ("1-02:03:04", 93784),
    ("2-00:00:00", 172800), ("30", 1800), ("1-12", 129600), ("1-00:30", 88200),
    ("00:10:05", 605), ("UNLIMITED", None), ("INVALID", None), ("Partition_Limit", None),
    ("NOT_SET", None), ("", None), (None, None),
])
def test_parse_slurm_duration(text, seconds):
    assert parse_slurm_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "1:2:3:4", "1-", "-5", "1.5"])
def test_parse_slurm_duration_errors(text):
    with pytest.raises(SlurmParseError, match="D-HH:MM:SS"):
        parse_slurm_duration(text)


@pytest.mark.parametrize("text, expected", [
    ("0:0", (0, 0)), ("0:15", (0, 15)), ("1:0", (1, 0)), ("137", (137, None)),
    ("", (None, None)), (None, (None, None)),
])
def test_parse_exit_code(text, expected):
    assert parse_exit_code(text) == expected


def test_parse_exit_code_error():
    with pytest.raises(SlurmParseError, match="status:signal"):
        parse_exit_code("ok")


@pytest.mark.parametrize("text, state", [
    ("CANCELLED by 0", "CANCELLED"), ("cancelled+", "CANCELLED"), ("PD", "PENDING"),
    ("R", "RUNNING"), ("running", "RUNNING"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
    ("CG", "COMPLETING"), ("TO", "TIMEOUT"),
])
def test_normalize_state(text, state):
    assert normalize_state(text) == state


def test_normalize_state_empty():
    with pytest.raises(SlurmParseError, match="RUNNING"):
        normalize_state("  ")


# JOB STATE CODES of squeue(1), the same 24 in Slurm 22.05 and 24.11
DOCUMENTED_STATES = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE", "FAILED",
    "NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD",
    "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED", "RESIZING", "REVOKED", "SIGNALING",
    "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
}


def test_state_sets():
    assert SLURM_STATES == DOCUMENTED_STATES
    # every documented state is either over or not, never both
    assert SLURM_STATES_TERMINAL | SLURM_STATES_ACTIVE == SLURM_STATES
    assert not SLURM_STATES_TERMINAL & SLURM_STATES_ACTIVE
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED"} == SLURM_STATES_TERMINAL
    # live: pending counts (a waiter keeps waiting), and so does every requeued state
    assert SLURM_STATES_LIVE < SLURM_STATES_ACTIVE
    assert {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "SIGNALING",
            "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"} == SLURM_STATES_LIVE
    # winding up, stopped or held for a person: still there, but nothing to wait for
    assert SLURM_STATES_ACTIVE - SLURM_STATES_LIVE == {
        "COMPLETING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


@pytest.mark.parametrize("code,active,live", [
    ("PD", True, True), ("RH", True, True), ("RF", True, True), ("CG", True, False),
    ("ST", True, False), ("SE", True, False), ("CD", False, False), ("XX", False, False),
])
def test_job_record_alive(code, active, live):
    [rec] = parse_squeue(f"7|{code}|None||j|1|0:01|1:00|debug\n")
    assert (rec.is_active, rec.is_live, rec.is_terminal) == (active, live, code == "CD")


def test_parse_sbatch_parsable():
    assert parse_sbatch_parsable("1234\n") == ("1234", None)
    assert parse_sbatch_parsable("1234;trixie\n") == ("1234", "trixie")
    with pytest.raises(SlurmParseError, match="jobid"):
        parse_sbatch_parsable("Submitted batch job\n")


# --------------------------------------------------------------------------
# SLURM_* -> Allocation


def test_allocation_from_sbatch_env():
    a = Allocation.from_env(env_fixture("env-sbatch.env"))
    assert a is not None
    assert a.job_id == "4242"
    assert a.nodes == ["gpu-a01", "gpu-a02"] and a.num_nodes == 2
    assert a.tasks_per_node == [1, 1]
    assert a.gpus_per_node == 4
    assert a.cpus_per_task == 8 and a.cpus_on_node == 8 and a.cpus_per_node == [8, 8]
    assert a.mem_per_node == 65536 and a.mem_per_cpu is None
    assert (a.partition, a.job_name, a.account, a.cluster) == ("gpu", "train", "myproject", "hpc")
    assert (a.submit_host, a.submit_dir, a.node_name) == ("login1", "/home/alice/proj", "gpu-a01")
    assert a.step_id is None and not a.in_step


def test_allocation_from_salloc_env():
    a = Allocation.from_env(env_fixture("env-salloc.env"))
    assert a.nodes == ["node01", "node02", "node07"]
    assert a.tasks_per_node == [2, 2, 1]
    assert a.cpus_per_node == [4, 4, 2]
    assert a.gpus_per_node == 2  # SLURM_GPUS_PER_NODE=a100:2
    assert a.mem_per_cpu == 2000 and a.mem_per_node is None
    assert a.cpus_on_node is None and a.cpus_per_task is None
    assert not a.in_step


def test_allocation_from_srun_step_env():
    a = Allocation.from_env(env_fixture("env-srun-step.env"))
    assert a.nodes == ["gpu-a01", "gpu-a02"]  # the job's nodes, not the step's
    assert a.step_id == "3" and a.in_step
    assert a.step_nodes == ["gpu-a02"]
    assert a.tasks_per_node == [1]  # the step's layout
    assert a.node_name == "gpu-a02"


@pytest.mark.parametrize("env", [{}, {"PATH": "/usr/bin", "HOME": "/root"}, {"SLURM_JOB_ID": ""}])
def test_allocation_none_outside_slurm(env):
    assert Allocation.from_env(env) is None


def test_allocation_legacy_names_and_nodelist_fallback():
    a = Allocation.from_env({"SLURM_JOBID": "9", "SLURM_NODELIST": "n[1-3]", "SLURM_NNODES": "3"})
    assert a.job_id == "9" and a.nodes == ["n1", "n2", "n3"]
    assert a.tasks_per_node == [] and a.gpus_per_node is None


def test_allocation_is_frozen():
    a = Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.job_id = "10"


def test_allocation_node_count_mismatch_names_both():
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_JOB_NUM_NODES": "3"}
    with pytest.raises(SlurmParseError) as err:
        Allocation.from_env(env)
    msg = str(err.value)
    assert "SLURM_JOB_NUM_NODES=3" in msg and "SLURM_JOB_NODELIST='node[01-02]'" in msg
    assert "2 node(s)" in msg


def test_allocation_nnodes_mismatch_names_both():
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NNODES": "4"}
    with pytest.raises(SlurmParseError, match=r"SLURM_NNODES=4 .*SLURM_JOB_NODELIST"):
        Allocation.from_env(env)


def test_allocation_step_counts_checked_against_step_list():
    env = env_fixture("env-srun-step.env")
    env["SLURM_NNODES"] = "2"  # but SLURM_NODELIST (the step's) names one node
    with pytest.raises(SlurmParseError, match=r"SLURM_NNODES=2 .*SLURM_NODELIST='gpu-a02'"):
        Allocation.from_env(env)


def test_allocation_errors_name_the_variable():
    with pytest.raises(SlurmParseError, match="SLURM_JOB_NODELIST"):
        Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[1-"})
    with pytest.raises(SlurmParseError, match="neither SLURM_JOB_NODELIST nor SLURM_NODELIST"):
        Allocation.from_env({"SLURM_JOB_ID": "9"})
    with pytest.raises(SlurmParseError, match="SLURM_CPUS_PER_TASK='eight'"):
        Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1",
                             "SLURM_CPUS_PER_TASK": "eight"})
    with pytest.raises(SlurmParseError, match="SLURM_TASKS_PER_NODE"):
        Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1",
                             "SLURM_TASKS_PER_NODE": "1(x"})
    with pytest.raises(SlurmParseError, match="SLURM_GPUS_PER_NODE"):
        Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1",
                             "SLURM_GPUS_PER_NODE": "lots"})


@pytest.mark.parametrize("extra, gpus", [
    ({"SLURM_GPUS_PER_NODE": "gpu:2"}, 2),
    ({"SLURM_GPUS_PER_NODE": "a100:4"}, 4),
    ({"SLURM_GPUS_ON_NODE": "8", "SLURM_GPUS_PER_NODE": "a100:4"}, 8),
    ({"SLURM_JOB_GPUS": "0,1,2"}, 3),
    ({}, None),
])
def test_allocation_gpu_forms(extra, gpus):
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1", **extra}
    assert Allocation.from_env(env).gpus_per_node == gpus


@pytest.mark.parametrize("raw, step", [("4294967291", "batch"), ("4294967292", "extern"),
                                       ("4294967290", "interactive"), ("0", "0")])
def test_allocation_special_step_ids(raw, step):
    a = Allocation.from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_ID": raw})
    assert a.step_id == step
    assert a.in_step == (step == "0")


# --------------------------------------------------------------------------
# environment hygiene for nested srun --overlap


def test_clean_env_for_nested_srun_from_step():
    env = env_fixture("env-srun-step.env")
    before = dict(env)
    out, args = clean_env_for_nested_srun(env, None)
    assert env == before  # input untouched
    assert args == ["--cpus-per-task=8"]
    for gone in ("SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST", "SLURM_CPU_BIND_TYPE",
                 "SLURM_CPU_BIND_VERBOSE", "SLURM_STEP_ID", "SLURM_STEPID",
                 "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
                 "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_LAUNCHER_PORT", "SLURM_STEP_GPUS",
                 "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID",
                 "SLURM_GTIDS", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_DISTRIBUTION",
                 "SLURM_TRES_PER_TASK", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT",
                 "SLURM_LAUNCH_NODE_IPADDR", "SLURM_TASKS_PER_NODE", "SLURM_MEM_PER_CPU"):
        assert gone not in out, gone
    for kept in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_MEM_PER_NODE",
                 "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES", "PATH",
                 "HOME", "SLURM_UMASK", "PMIX_MCA_gds", "SLURM_SUBMIT_HOST"):
        assert out[kept] == env[kept], kept
    # the step's node list/count are replaced by the allocation's
    assert out["SLURM_NODELIST"] == "gpu-a[01-02]" and out["SLURM_NNODES"] == "2"
    a = Allocation.from_env(out)
    assert a.nodes == ["gpu-a01", "gpu-a02"] and not a.in_step


def test_clean_env_for_nested_srun_from_batch():
    env = env_fixture("env-sbatch.env")
    out, args = clean_env_for_nested_srun(env, 4)
    assert args == ["--cpus-per-task=4"]  # explicit value wins over SLURM_CPUS_PER_TASK
    assert "SLURM_NTASKS" not in out and "SLURM_NTASKS_PER_NODE" not in out
    assert out["SLURM_MEM_PER_NODE"] == "65536"


@pytest.mark.parametrize("mem, kept", [
    ({"SLURM_MEM_PER_NODE": "1", "SLURM_MEM_PER_CPU": "2", "SLURM_MEM_PER_GPU": "3"},
     "SLURM_MEM_PER_NODE"),
    ({"SLURM_MEM_PER_CPU": "2", "SLURM_MEM_PER_GPU": "3"}, "SLURM_MEM_PER_CPU"),
    ({"SLURM_MEM_PER_GPU": "3"}, "SLURM_MEM_PER_GPU"),
])
def test_clean_env_keeps_at_most_one_mem_var(mem, kept):
    out, _ = clean_env_for_nested_srun({"SLURM_JOB_ID": "1", **mem}, None)
    assert [k for k in out if k.startswith("SLURM_MEM_PER_")] == [kept]


def test_clean_env_cpu_count_sources():
    assert clean_env_for_nested_srun({"SLURM_TRES_PER_TASK": "cpu:6,gres/gpu:1"}, None)[1] == \
        ["--cpus-per-task=6"]
    # no CPU count anywhere: do not let srun pin the agent (and all it forks) to one CPU
    assert clean_env_for_nested_srun({"SLURM_JOB_ID": "1"}, None)[1] == ["--cpu-bind=none"]
    with pytest.raises(ValueError, match="positive integer"):
        clean_env_for_nested_srun({}, 0)
    with pytest.raises(SlurmParseError, match="SLURM_CPUS_PER_TASK"):
        clean_env_for_nested_srun({"SLURM_CPUS_PER_TASK": "x"}, None)


def test_clean_env_drops_mpi_rank_identity_but_keeps_pmix_settings():
    env = {"PMI_RANK": "0", "PMI_SIZE": "4", "PMI_FD": "5", "PMIX_RANK": "0",
           "PMIX_NAMESPACE": "slurm.pmix.1.0", "PMIX_SERVER_URI41": "x", "PMIX_MCA_gds": "hash",
           "SLURM_MEM_BIND": "local", "SLURM_GPUS_PER_TASK": "1", "SLURM_EXACT": "1"}
    out, _ = clean_env_for_nested_srun(env, 1)
    assert out == {"PMIX_MCA_gds": "hash"}


# --------------------------------------------------------------------------
# SLURM_* values: each checked where it is parsed, bounded, and an error that names the
# variable, its value and what is allowed (issue 28)

_ALLOC = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]"}


def _alloc_error(**values: str) -> str:
    with pytest.raises(SlurmParseError) as err:
        Allocation.from_env({**_ALLOC, **values})
    return str(err.value)


def test_a_nodelist_of_many_bracket_ranges_is_an_error_not_a_recursion_error():
    msg = _alloc_error(SLURM_JOB_NODELIST="n" + "[1]" * 2000)
    assert msg == ("SLURM_JOB_NODELIST: cannot expand hostlist "
                   f"{('n' + '[1]' * 20)[:60]!r}... (6001 characters) (more than 8 bracket ranges "
                   "in one name); expected a Slurm hostlist like 'node[01-04,07],gpu-a[1-2]'")
    assert expand_hostlist("n[1-2]x[1-2]y[1]") == ["n1x1y1", "n1x2y1", "n2x1y1", "n2x2y1"]


@pytest.mark.parametrize("text, why", [
    ("n[1-100001]", "it names more than 100000 hosts"),
    ("n[" + ",".join(["1-100000"] * 50) + "]", "it names more than 100000 hosts"),
    ("a[1-60000],b[1-60000]", "it names more than 100000 hosts"),
    ("n[1-99999999999999999]", "it names more than 100000 hosts"),
    ("n[1-" + "9" * 40 + "]", "has numbers of more than 18 digits"),
    ("x" * 200_000, "longer than 131072 characters"),
])
def test_hostlists_are_bounded_before_anything_is_expanded(text, why):
    with pytest.raises(SlurmParseError) as err:
        expand_hostlist(text)
    assert why in str(err.value) and len(str(err.value)) < 300
    names = expand_hostlist("n[1-100000]")           # the bound itself is fine
    assert len(names) == parsing.MAX_HOSTS == 100000 and names[-1] == "n100000"


@pytest.mark.parametrize("var, value, allowed", [
    ("SLURM_JOB_ID", "abc", "expected a job id from 1 to 4294967295"),
    ("SLURM_JOB_ID", "../../tmp/x", "expected a job id from 1 to 4294967295"),
    ("SLURM_JOB_ID", "4294967296", "expected a job id from 1 to 4294967295"),
    ("SLURM_JOB_NUM_NODES", "+2", "expected a node count from 1 to 100000"),
    ("SLURM_NNODES", "\u0662", "expected a node count from 1 to 100000"),  # Arabic-Indic 2
    ("SLURM_CPUS_PER_TASK", "0", "expected a whole number of CPUs from 1 to 65533"),
    ("SLURM_CPUS_PER_TASK", "99999999999999", "expected a whole number of CPUs from 1 to 65533"),
    ("SLURM_CPUS_ON_NODE", "-3", "expected a whole number of CPUs from 1 to 65533"),
    ("SLURM_GPUS_ON_NODE", "-1", "expected a GPU count from 0 to 65533"),
    ("SLURM_GPUS_ON_NODE", "1_000", "expected a GPU count from 0 to 65533"),
    ("SLURM_GPUS_PER_NODE", "gpu:99999999999", "99999999999 GPUs per node, more than 65533"),
    ("SLURM_JOB_GPUS", "x,y", "expected GPU indexes from 0 to 65533"),
    ("SLURM_STEP_GPUS", "-1", "expected GPU indexes from 0 to 65533"),
    ("SLURM_STEP_ID", "abc", "expected a step id from 0 to 4294967295"),
    ("SLURM_MEM_PER_NODE", "-1", "expected a whole number of MB from 0 to 1099511627776"),
    ("SLURM_MEM_PER_CPU", "+7", "expected a whole number of MB from 0 to 1099511627776"),
    ("SLURM_MEM_PER_GPU", "9" * 30, "expected a whole number of MB from 0 to 1099511627776"),
    ("SLURM_TASKS_PER_NODE", "1(x5)", "its counts describe more than 2 node(s)"),
    ("SLURM_TASKS_PER_NODE", "99999999", "count 99999999 in '99999999' is outside 0 to 65533"),
    ("SLURM_JOB_CPUS_PER_NODE", "0,0", "count 0 in '0' is outside 1 to 65533"),
    ("SLURM_JOB_NODELIST", "-oProxyCommand=x", "expected host names of letters, digits"),
    ("SLURM_JOB_NODELIST", "n1;reboot", "expected host names of letters, digits"),
    ("SLURM_JOB_NODELIST", "../etc", "expected host names of letters, digits"),
    ("SLURM_STEP_NODELIST", "n[1-3]", "it names more than 2 hosts"),  # a step of a 2-node job
    ("SLURMD_NODENAME", "-oX", "expected a host name of letters, digits"),
    ("SLURM_SUBMIT_HOST", "a\nb", "expected a host name of letters, digits"),
    ("SLURM_JOB_PARTITION", "gpu\nx", "expected one line of printable text"),
    ("SLURM_JOB_ACCOUNT", "a\nb", "expected one line of printable text"),
    ("SLURM_CLUSTER_NAME", "c\rd", "expected one line of printable text"),
    ("SLURM_SUBMIT_DIR", "/tmp\nx", "expected one line of printable text"),
])
def test_malformed_slurm_values_are_refused_naming_variable_value_and_range(var, value, allowed):
    msg = _alloc_error(**{var: value})
    assert msg.startswith(var) and repr(value) in msg and allowed in msg, msg


@pytest.mark.parametrize("var", ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"])
@pytest.mark.parametrize("value", ["0,1;x", "0,,1", "-1", "0,65534", "1e3", "0," * 70000])
def test_gpu_index_lists_are_checked_even_when_a_gpu_count_is_set(var, value):
    """The processes are given these lists (CUDA_VISIBLE_DEVICES): checked whenever set,
    not only when no count (SLURM_GPUS_ON_NODE) makes them unneeded for counting."""
    msg = _alloc_error(**{var: value, "SLURM_GPUS_ON_NODE": "2"})
    assert msg.startswith(f"{var}=") and "expected GPU indexes from 0 to 65533, " \
        "comma-separated, like '0,1,2,3'" in msg and len(msg) < 300, msg
    a = Allocation.from_env({**_ALLOC, var: " 0, 3 ", "SLURM_GPUS_ON_NODE": "2"})
    assert a.gpus_per_node == 2


def test_tasks_per_node_repeats_are_bounded_not_expanded():
    msg = _alloc_error(SLURM_TASKS_PER_NODE="2(x1000000000)")
    assert msg == ("SLURM_TASKS_PER_NODE: cannot parse tasks-per-node value '2(x1000000000)': "
                   "its counts describe more than 2 node(s)")
    with pytest.raises(SlurmParseError, match=r"more than 100000 node\(s\)"):
        parse_tasks_per_node("2(x1000000000)")
    a = Allocation.from_env({**_ALLOC, "SLURM_TASKS_PER_NODE": "65533(x2)",
                             "SLURM_JOB_CPUS_PER_NODE": "65533,1"})
    assert a.tasks_per_node == [65533, 65533] and a.cpus_per_node == [65533, 1]


def test_a_bad_cpu_count_names_its_variable_everywhere_it_is_read():
    assert _alloc_error(SLURM_CPUS_PER_TASK="-5") == (
        "SLURM_CPUS_PER_TASK='-5': expected a whole number of CPUs from 1 to 65533")
    for env, var in (({"SLURM_CPUS_PER_TASK": "-5"}, "SLURM_CPUS_PER_TASK='-5'"),
                     ({"SLURM_CPUS_PER_TASK": "0"}, "SLURM_CPUS_PER_TASK='0'"),
                     ({"SLURM_CPUS_PER_TASK": "+5"}, "SLURM_CPUS_PER_TASK='+5'"),
                     ({"SLURM_TRES_PER_TASK": "cpu:0"}, "SLURM_TRES_PER_TASK='cpu:0'"),
                     ({"SLURM_TRES_PER_TASK": "cpu:x"}, "SLURM_TRES_PER_TASK='cpu:x'"),
                     ({"SLURM_TRES_PER_TASK": "cpu:\u00b2"}, "SLURM_TRES_PER_TASK='cpu:\u00b2'")):
        with pytest.raises(SlurmParseError) as err:
            clean_env_for_nested_srun(env, None)
        assert str(err.value).startswith(var) and "from 1 to 65533" in str(err.value)
    assert clean_env_for_nested_srun({"SLURM_CPUS_PER_TASK": "65533"}, None)[1] == \
        ["--cpus-per-task=65533"]
    with pytest.raises(ValueError, match=r"positive integer \(at most 65533\), got 65534"):
        clean_env_for_nested_srun({}, 65534)


def test_an_error_about_a_long_value_shows_a_bounded_excerpt():
    value = "gpu\n" + "x" * 100_000
    msg = _alloc_error(SLURM_JOB_PARTITION=value)
    assert msg == (f"SLURM_JOB_PARTITION={value[:60]!r}... (100004 characters): expected one "
                   "line of printable text of at most 4096 characters")


def test_values_at_their_bounds_are_read():
    a = Allocation.from_env({
        "SLURM_JOB_ID": "4294967295", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2",
        "SLURM_CPUS_PER_TASK": "65533", "SLURM_MEM_PER_NODE": str(2**40),
        "SLURM_STEP_ID": "4294967290", "SLURM_JOB_GPUS": "0,65533",
        "SLURM_JOB_NAME": "my job \u00fc",
        "SLURMD_NODENAME": "node-01.cluster_a", "SLURM_SUBMIT_DIR": "/home/a b"})
    assert (a.job_id, a.cpus_per_task, a.mem_per_node, a.step_id, a.gpus_per_node) == (
        "4294967295", 65533, 2**40, "interactive", 2)
    assert (a.job_name, a.node_name, a.submit_dir) == ("my job \u00fc", "node-01.cluster_a",
                                                       "/home/a b")
    assert _alloc_error(SLURM_MEM_PER_NODE=str(2**40 + 1)).startswith("SLURM_MEM_PER_NODE=")


def test_job_id_restart_count_and_task_rank_are_numbers_or_errors():
    """They name files (the agents' ready files, the allocation's folder): only numbers."""
    assert parsing.slurm_job_id({"SLURM_JOBID": " 42 "}) == "42"
    assert parsing.slurm_job_id({"SLURM_JOB_ID": ""}) is None
    assert parsing.slurm_restart_count({}) == 0
    assert parsing.slurm_restart_count({"SLURM_RESTART_COUNT": "3"}) == 3
    assert parsing.slurm_task_rank({"SLURM_NODEID": "2"}) == 2
    assert parsing.slurm_task_rank({"SLURM_PROCID": "5", "SLURM_NODEID": "2"}) == 5
    for read, var, bad, allowed in (
            (parsing.slurm_job_id, "SLURM_JOB_ID", "../x", "a job id from 1 to 4294967295"),
            (parsing.slurm_restart_count, "SLURM_RESTART_COUNT", "\u00b2",
             "a restart count from 0 to 65533"),
            (parsing.slurm_task_rank, "SLURM_PROCID", "../../x", "a task rank from 0 to")):
        with pytest.raises(SlurmParseError) as err:
            read({var: bad})
        assert str(err.value).startswith(f"{var}={bad!r}: expected {allowed}")


# --------------------------------------------------------------------------
# squeue


def test_squeue_command():
    assert command_for_squeue(["12", 13]) == [
        "squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all", "--jobs=12,13"]
    assert command_for_squeue(7)[-1] == "--jobs=7"
    for bad in ([], ["1,2"], [""], ["1 2"]):
        with pytest.raises(ValueError):
            command_for_squeue(bad)


def test_parse_squeue_22_05():
    recs = parse_squeue(fixture("squeue-22.05-from-json.txt"))
    assert [(r.job_id, r.state, r.reason, r.nodes, r.name, r.num_nodes) for r in recs] == [
        ("1", "RUNNING", "None", ["hnode1"], "long", 1),
        ("2", "PENDING", "PartitionNodeLimit", [], "pend", 2),
    ]
    assert recs[0].time_limit == "UNLIMITED" and recs[0].time_limit_seconds is None
    assert recs[0].partition == "debug" and recs[0].is_active and not recs[0].is_terminal


def test_parse_squeue_24_11():
    recs = parse_squeue(fixture("squeue-24.11-from-json.txt"))
    assert [(r.job_id, r.state, r.nodes) for r in recs] == [
        ("4", "RUNNING", ["tnode1"]), ("5", "RUNNING", ["tnode1", "tnode2"]), ("6", "PENDING", [])]
    assert recs[2].reason == "Resources" and recs[2].num_nodes == 2


def test_parse_squeue_23_11_handwritten_forms():
    recs = {r.job_id: r for r in parse_squeue(fixture("squeue-23.11-handwritten.txt"))}
    assert len(recs) == 10
    r = recs["201"]
    assert r.nodes == ["node01", "node02", "node03", "node04", "node07"] and r.num_nodes == 5
    assert r.time_used_seconds == 93784 and r.time_limit_seconds == 172800
    assert recs["204_3"].name == "array job" and recs["204_3"].nodes == ["gpu-a1", "gpu-a2"]
    assert recs["204_[4-9]"].reason == "JobArrayTaskLimit"
    assert recs["205"].state == "COMPLETING" and recs["205"].is_active
    assert recs["207"].is_terminal and recs["208"].state == "TIMEOUT"
    assert recs["209"].name == "a|b" and recs["209"].partition == "gpu"  # '|' inside a name
    assert recs["203"].time_limit_seconds == 1800


def test_parse_squeue_tolerates_header_and_blank_lines():
    text = "JOBID|STATE|REASON|NODELIST|NAME|NODES|TIME|TIME_LIMIT|PARTITION\n\n" \
           + fixture("squeue-24.11-from-json.txt") + "\n"
    assert len(parse_squeue(text)) == 3
    assert parse_squeue("") == []


@pytest.mark.parametrize("line, match", [
    ("1|RUNNING|None", r"line 1 .*expected 9 '\|'-separated fields"),
    ("1|RUNNING|None|n[1-|x|1|0:00|1:00|debug", "line 1 .*hostlist"),
    ("1|RUNNING|None|n1|x|one|0:00|1:00|debug", "node count 'one'"),
    ("1||None|n1|x|1|0:00|1:00|debug", "empty job state"),
])
def test_parse_squeue_errors(line, match):
    with pytest.raises(SlurmParseError, match=match):
        parse_squeue(line)


def test_squeue_job_unknown():
    assert squeue_job_unknown("slurm_load_jobs error: Invalid job id specified\n")
    assert not squeue_job_unknown("squeue: error: Unable to contact slurm controller")


# --------------------------------------------------------------------------
# sacct


def test_sacct_commands():
    assert command_for_sacct([5]) == ["sacct", "--parsable2", "--noheader",
                                      f"--format={SACCT_FORMAT}", "--jobs=5"]
    assert command_for_sacct("5", jobcomp=True)[:2] == ["sacct", "-c"]
    assert "-X" in command_for_sacct("5", steps=False)


def test_parse_sacct_from_json_fixtures():
    recs = parse_sacct(fixture("sacct-22.05-from-json.txt"))
    assert [(r.job_id, r.job, r.step, r.state, r.nodes) for r in recs] == [
        ("1", "1", None, "RUNNING", ["hnode1"]),
        ("1.batch", "1", "batch", "RUNNING", ["hnode1"]),
        ("2", "2", None, "PENDING", []),  # "None assigned"
    ]
    recs = parse_sacct(fixture("sacct-24.11-from-json.txt"), include_steps=False)
    assert [(r.job_id, r.state, r.nodes) for r in recs] == [
        ("4", "RUNNING", ["tnode1"]), ("5", "RUNNING", ["tnode1", "tnode2"]), ("6", "PENDING", [])]


def test_parse_sacct_handwritten_forms():
    recs = {r.job_id: r for r in parse_sacct(fixture("sacct-23.11-handwritten.txt"))}
    r = recs["102"]
    assert (r.state, r.state_detail, r.exit_code, r.signal) == ("CANCELLED", "by 1000", 0, 0)
    assert r.is_terminal and not r.is_step
    b = recs["102.batch"]
    assert (b.job, b.step, b.exit_code, b.signal) == ("102", "batch", 0, 15)
    assert recs["101.0"].step == "0" and recs["101.0"].name == "python3"
    assert recs["101.extern"].nodes == ["node01", "node02"]
    assert recs["103"].exit_code == 1 and recs["103"].state == "FAILED"
    assert recs["105"].state == "OUT_OF_MEMORY" and recs["105"].signal == 125
    assert recs["106_3.batch"].job == "106_3"
    assert recs["107"].elapsed_seconds == 87600 and recs["107"].state == "NODE_FAIL"
    assert recs["108+1"].job == "108+1" and recs["108+1"].step is None
    assert recs["109"].name == "a|b" and recs["109"].nodes == []
    assert recs["110"].state == "RUNNING" and not recs["110"].is_terminal
    jobs = parse_sacct(fixture("sacct-23.11-handwritten.txt"), include_steps=False)
    assert all(not r.is_step for r in jobs) and len(jobs) == 11


def test_parse_sacct_jobcomp_empty_exit_codes():
    recs = parse_sacct(fixture("sacct-jobcomp-handwritten.txt"))
    assert [(r.job_id, r.state, r.exit_code, r.signal) for r in recs] == [
        ("301", "COMPLETED", None, None), ("302", "FAILED", None, None),
        ("303", "CANCELLED", None, None)]


def test_parse_sacct_tolerates_parsable_trailing_delimiter_and_header():
    text = "JobID|State|ExitCode|NodeList|JobName|Elapsed|\n7|COMPLETED|0:0|n1|x|00:00:01|\n"
    (r,) = parse_sacct(text)
    assert (r.job_id, r.elapsed, r.name) == ("7", "00:00:01", "x")


@pytest.mark.parametrize("line, match", [
    ("7|COMPLETED|0:0", "expected 6"),
    ("7|COMPLETED|zero|n1|x|00:00:01", "exit code 'zero'"),
    ("|COMPLETED|0:0|n1|x|00:00:01", "empty JobID"),
])
def test_parse_sacct_errors(line, match):
    with pytest.raises(SlurmParseError, match=match):
        parse_sacct(line)


def test_sacct_unavailable():
    assert sacct_unavailable("sacct: error: Slurm accounting storage is disabled\n")
    assert sacct_unavailable("sacct: error: Problem talking to the database: Connection refused")
    assert not sacct_unavailable("sacct: error: Invalid field requested: \"Foo\"")


# --------------------------------------------------------------------------
# Why text: the recorded JSON of two releases differs in shape


def _shared_json(name: str) -> dict:
    """Real ``squeue --json`` output of Slurm 22.05 and 24.11 (copied from the project's
    shared fixtures into tests/fixtures/slurm, so these run wherever the repo does)."""
    return json.loads((FIXTURES / name).read_text())


def _number(v):
    """22.05 prints plain numbers; 24.11 wraps them as {set, infinite, number}."""
    return v["number"] if isinstance(v, dict) else v


def test_json_schemas_differ_between_releases():
    """We parse squeue/sacct text because one release's JSON schema breaks on the other."""
    old = _shared_json("squeue-json-22.05.json")
    new = _shared_json("squeue-json-24.11.json")
    assert "Slurm" in old["meta"] and "slurm" not in old["meta"]
    assert "slurm" in new["meta"] and "Slurm" not in new["meta"]
    assert old["meta"]["Slurm"]["release"].startswith("22.05")
    assert new["meta"]["slurm"]["release"].startswith("24.11")
    assert isinstance(old["jobs"][0]["job_state"], str)
    assert isinstance(new["jobs"][0]["job_state"], list)
    assert isinstance(old["jobs"][0]["node_count"], int)
    assert set(new["jobs"][0]["node_count"]) == {"set", "infinite", "number"}
    assert isinstance(old["meta"]["Slurm"]["version"]["major"], int)
    assert isinstance(new["meta"]["slurm"]["version"]["major"], str)


@pytest.mark.parametrize("json_name, text_name", [
    ("squeue-json-22.05.json", "squeue-22.05-from-json.txt"),
    ("squeue-json-24.11.json", "squeue-24.11-from-json.txt"),
])
def test_text_fixtures_match_the_recorded_json(json_name, text_name):
    data = _shared_json(json_name)
    recs = {r.job_id: r for r in parse_squeue(fixture(text_name))}
    assert len(recs) == len(data["jobs"])
    for job in data["jobs"]:
        state = job["job_state"]
        state = state[0] if isinstance(state, list) else state
        r = recs[str(job["job_id"])]
        assert r.state == state
        assert r.reason == job["state_reason"]
        assert r.nodes == expand_hostlist(job["nodes"])
        assert r.name == job["name"]
        assert r.num_nodes == _number(job["node_count"])
        assert r.partition == job["partition"]


def test_parse_squeue_start_recorded_22_05():
    # before the backfill scheduler planned it, a job pending on Resources has no estimate
    before = parse_squeue_start(fixture("squeue-start-22.05-recorded-before-backfill.txt"))
    assert before == {"21": "2026-12-02T06:00:00"}
    after = parse_squeue_start(fixture("squeue-start-22.05-recorded-after-backfill.txt"))
    assert after == {"20": "2026-12-01T20:01:35", "21": "2026-12-02T06:00:00"}


def test_parse_squeue_start_forms_and_errors():
    assert parse_squeue_start("JOBID|START_TIME\n\n7|Unknown\n8|N/A\n9|(null)\n") == {}
    assert command_for_squeue_start(["7", "8"]) == [
        "squeue", "--start", "--noheader", "--format=%i|%S", "--jobs=7,8"]
    with pytest.raises(SlurmParseError, match="expected '<jobid>|<start>'"):
        parse_squeue_start("7 2026-12-01T20:01:35\n")


def test_a_job_name_with_control_characters_is_shown_not_refused():
    # Slurm queues a job whose name holds a tab; the allocation must still be read, and
    # an escape sequence in the name must not reach a terminal as one
    from hpcmesh.slurm.parsing import Allocation
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2",
           "SLURM_JOB_NAME": "my\tjob\x1b[2J"}
    alloc = Allocation.from_env(env)
    assert alloc.job_name == "my?job?[2J", alloc.job_name
