"""hpcmesh.slurm.spec and hpcmesh.slurm.render: job specs, their errors, sbatch scripts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from ci_gate import requires

from hpcmesh.slurm.render import render_sbatch, sbatch_submit_command, sbatch_test_only_command
from hpcmesh.slurm.spec import (
    MESH_KEYS,
    JobSpec,
    MeshSpec,
    SpecError,
    load_job_spec,
    parse_job_spec,
    parse_yaml_with_lines,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "job_spec.example.yaml"
WORKER = ["{python}", "-m", "hpcmesh", "worker", "--mesh", "{mesh}", "--attach", "tcp://login1:7000"]
BASH = shutil.which("bash")
needs_bash = requires(None if BASH else "bash is not installed")


def spec_error(text: str, source: str = "spec.yaml") -> SpecError:
    with pytest.raises(SpecError) as err:
        parse_job_spec(textwrap.dedent(text), source)
    return err.value


TWO_MESHES = """\
job_name: rl
defaults:
  partition: gpu
  time: "01:00:00"
meshes:
  trainers:
    nodes: 2
    gpus_per_node: 8
  generators:
    nodes: 1
    gpus_per_node: 8
"""


# --------------------------------------------------------------------------
# loading


def test_example_spec_loads():
    spec = load_job_spec(EXAMPLE)
    assert spec.job_name == "rl-train" and spec.same_allocation
    assert list(spec.meshes) == ["trainers", "generators"]
    t, g = spec.meshes["trainers"], spec.meshes["generators"]
    assert (t.nodes, g.nodes, spec.total_nodes) == (4, 2, 6)
    assert t.gpus_per_node == 8 and t.partition == "gpu" and t.time == "04:00:00"
    assert t.signal == "USR1@120" and t.requeue and t.exclusive and t.mem == "0"
    assert t.env == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}  # merged with defaults
    assert g.setup == ["module load cuda/12.4", "export VLLM_WORKER_MULTIPROC_METHOD=spawn"]
    assert g.sbatch_extra == ["--mail-type=FAIL"]
    assert spec.node_ranges() == {"trainers": range(0, 4), "generators": range(4, 6)}
    assert spec.allocation_groups() == [["trainers", "generators"]]


def test_int_mesh_and_flat_form():
    spec = parse_job_spec("meshes:\n  workers: 3\n")
    assert spec.meshes["workers"].nodes == 3 and spec.meshes["workers"].python == "python3"
    flat = parse_job_spec("nodes: 2\ngpus_per_node: 4\njob_name: solo\n")
    assert list(flat.meshes) == ["hosts"] and flat.job_name == "solo"
    assert flat.meshes["hosts"].gpus_per_node == 4


def test_yaml_retyped_scalars_keep_their_text():
    spec = parse_job_spec(textwrap.dedent("""\
        nodes: 1
        time: 01:30:00
        account: 0123
        partition: 10
        env:
          OMP_NUM_THREADS: 8
          FLAG: yes
          GONE: null
        """))
    m = spec.meshes["hosts"]
    assert m.time == "01:30:00"  # not 5400 (YAML 1.1 sexagesimal)
    assert m.account == "0123"  # not octal 83
    assert m.partition == "10"
    assert m.env == {"OMP_NUM_THREADS": "8", "FLAG": "yes", "GONE": None}


def test_parse_yaml_with_lines_paths():
    data, lines, raw = parse_yaml_with_lines(TWO_MESHES, "x.yaml")
    assert data["meshes"]["trainers"]["nodes"] == 2
    assert lines["meshes.trainers.nodes"] == 7
    assert lines["defaults.time"] == 4
    assert raw["meshes.generators.nodes"] == "1"
    _, lines, _ = parse_yaml_with_lines("setup:\n  - a\n  - b\n")
    assert lines["setup[1]"] == 3


def test_defaults_merge_rules():
    spec = parse_job_spec(textwrap.dedent("""\
        defaults:
          setup: [one]
          sbatch_extra: [--mail-type=END]
          env: {A: "1", B: "2"}
          cpus_per_task: 4
        meshes:
          m:
            nodes: 1
            setup: [two]
            env: {B: "3"}
            cpus_per_task: 8
        """))
    m = spec.meshes["m"]
    assert m.setup == ["one", "two"] and m.env == {"A": "1", "B": "3"} and m.cpus_per_task == 8
    assert m.sbatch_extra == ["--mail-type=END"]


def test_sbatch_extra_grouping_and_lifting():
    spec = parse_job_spec(textwrap.dedent("""\
        nodes: 1
        sbatch_extra: ["--qos", high, "--reservation=maint", "-t", "30", "--signal=USR2@60",
                       "--exclusive", "--gpus-per-node=a100:4", "#SBATCH --mail-type=END"]
        """))
    m = spec.meshes["hosts"]
    assert m.qos == "high" and m.time == "30" and m.signal == "USR2@60" and m.exclusive
    assert m.gpus_per_node is None  # typed GPU request is kept verbatim instead
    assert m.sbatch_extra == ["--reservation=maint", "--gpus-per-node=a100:4", "--mail-type=END"]


def test_sbatch_extra_equal_to_key_is_dropped():
    m = parse_job_spec("nodes: 1\nqos: high\nsbatch_extra: [--qos=high]\n").meshes["hosts"]
    assert m.qos == "high" and m.sbatch_extra == []


def test_separate_allocations_may_differ():
    spec = parse_job_spec(textwrap.dedent("""\
        same_allocation: false
        meshes:
          a: {nodes: 1, partition: gpu}
          b: {nodes: 2, partition: cpu}
        """))
    assert spec.allocation_groups() == [["a"], ["b"]]
    assert spec.node_ranges() == {"a": range(0, 1), "b": range(0, 2)}


def test_from_dict_and_round_trip():
    spec = JobSpec.from_dict({"meshes": {"a": {"nodes": 2, "env": {"X": 1}}}, "job_name": "j"})
    assert spec.meshes["a"].env == {"X": "1"}
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_from_dict_with_outer_file_lines():
    """The `job:` section of a hosts file, with lines recorded by hpcmesh.hosts_file."""
    lines = {"job": 3, "job.nodes": 4, "job.time": 5}
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"nodes": "two", "time": "1:00:00"}, "hosts.yaml", lines=lines,
                          prefix="job")
    assert str(err.value) == "hosts.yaml:4: nodes must be a positive integer, got string 'two'"
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"nodes": 1, "gpu_per_node": 1}, "hosts.yaml", lines=lines,
                          prefix="job")
    assert str(err.value).startswith("hosts.yaml:3: unknown key 'gpu_per_node' in job; allowed:")
    assert "(did you mean 'gpus_per_node'?)" in str(err.value)


def test_from_dict_without_lines():
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"meshes": {"a": {"nodes": 0}}})
    assert str(err.value) == "<dict>: nodes must be a positive integer, got integer 0"
    assert err.value.key == "meshes.a.nodes"


# --------------------------------------------------------------------------
# error messages: file:line, key or value, allowed values


def test_unknown_mesh_key_message():
    err = spec_error("""\
        job_name: rl
        defaults:
          partition: gpu
        meshes:
          trainers:
            nodes: 2
            gpu_per_node: 8
        """)
    allowed = ", ".join(MESH_KEYS)
    assert str(err) == (f"spec.yaml:7: unknown key 'gpu_per_node' in mesh 'trainers'; "
                        f"allowed: {allowed} (did you mean 'gpus_per_node'?)")
    assert (err.source, err.line, err.key) == ("spec.yaml", 7, "meshes.trainers.gpu_per_node")
    assert err.allowed == MESH_KEYS and isinstance(err, ValueError)


def test_unknown_top_level_and_defaults_keys():
    err = spec_error("mesh:\n  a: 1\n")
    assert str(err).startswith("spec.yaml:1: unknown key 'mesh' in the job spec; allowed:")
    assert "(did you mean 'meshes'?)" in str(err)
    err = spec_error("meshes:\n  a: 1\njobname: x\n")
    assert "spec.yaml:3: unknown key 'jobname'" in str(err)
    assert "allowed: defaults, job_name, log_dir, meshes, same_allocation" in str(err)
    assert "(did you mean 'job_name'?)" in str(err)
    err = spec_error("defaults:\n  partitoin: gpu\nmeshes:\n  a: 1\n")
    assert "spec.yaml:2: unknown key 'partitoin' in defaults" in str(err)
    assert "(did you mean 'partition'?)" in str(err)


@pytest.mark.parametrize("body, line, message", [
    ("    nodes: two", 3, "nodes must be a positive integer, got string 'two'"),
    ("    nodes: 0", 3, "nodes must be a positive integer, got integer 0"),
    ("    nodes: 1.5", 3, "nodes must be a positive integer, got number 1.5"),
    ("    nodes: 1\n    gpus_per_node: -1", 4,
     "gpus_per_node must be a non-negative integer or null, got integer -1"),
    ("    nodes: 1\n    ntasks_per_node: true", 4,
     "ntasks_per_node must be a positive integer, got boolean true"),
    ("    nodes: 1\n    exclusive: 'yes'", 4, "exclusive must be true or false, got string 'yes'"),
    ("    nodes: 1\n    time: soon", 4, "time must be minutes or 'HH:MM:SS'"),
    ("    nodes: 1\n    mem: 64GB", 4, "mem must be a size like '64G'"),
    ("    nodes: 1\n    partition: gpu a", 4,
     "partition must be one word like 'gpu' (no spaces), got string 'gpu a'"),
    ("    nodes: 1\n    signal: USR1@soon", 4, "signal must look like 'USR1@90'"),
    ("    nodes: 1\n    signal: USER1@90", 4, "signal must look like 'USR1@90'"),
    ("    nodes: 1\n    python: [a]", 4, "python must be the Python executable"),
    ("    nodes: 1\n    env: {1BAD: x}", 4, "env: '1BAD' is not a valid environment variable name"),
    ("    nodes: 1\n    env: {A: [1]}", 4, "env value of A must be a string"),
    ("    nodes: 1\n    setup:\n      - ok\n      - {a: b}", 6, "setup[1] must be a string"),
    ("    nodes: 1\n    sbatch_extra:\n      - --x=1\n      - reservation=foo", 6,
     "sbatch_extra[1] must be an sbatch option starting with '-' (like '--reservation=foo'), "
     "got 'reservation=foo'"),
    ("    nodes: 1\n    sbatch_extra: [--nodes=3]", 4,
     "sbatch_extra '--nodes=3' is set by hpcmesh from nodes; remove it"),
    ("    nodes: 1\n    sbatch_extra: ['-J x']", 4,      # a short option: its long one's rule
     "sbatch_extra '-J x' is set by hpcmesh from job_name; remove it"),
    ("    nodes: 1\n    time: '2:00:00'\n    sbatch_extra: [--time=1:00:00]", 5,
     "sbatch_extra '--time=1:00:00' contradicts time: '2:00:00'; set only time"),
    ("    nodes: 1\n    mem: 4G\n    sbatch_extra: [--mem-per-cpu=2G]", 5,
     "sbatch_extra '--mem-per-cpu=2G' cannot be combined with mem ('4G')"),
    ("    gpus_per_node: 1", 2, "mesh 'a' needs 'nodes' (a positive integer)"),
])
def test_value_errors_name_line_and_value(body, line, message):
    err = spec_error("meshes:\n  a:\n" + body + "\n")
    assert str(err).startswith(f"spec.yaml:{line}: "), str(err)
    assert message in str(err)


@pytest.mark.parametrize("body, message", [
    ("    nodes: 1180591620717411303424",
     "nodes must be at most 100000 (the most one Slurm hostlist names), "
     "got integer 1180591620717411303424"),
    ("    nodes: 1\n    gpus_per_node: 99999999999",
     "gpus_per_node must be at most 65533 (Slurm's limit per node), got integer 99999999999"),
    ("    nodes: 1\n    ntasks_per_node: 100000000",
     "ntasks_per_node must be at most 65533 (Slurm's limit per node), got integer 100000000"),
    ("    nodes: 1\n    cpus_per_task: 65534",
     "cpus_per_task must be at most 65533 (Slurm's limit per node), got integer 65534"),
    ("    nodes: 1\n    mem: 1048577T",
     "units K, M, G, T, default M; at most 1048576T), got string '1048577T'"),
    ("    nodes: 1\n    mem: " + "9" * 30 + "G", "at most 1048576T), got string '" + "9" * 30 + "G'"),
    ("    nodes: 1\n    time: '1491309-00'",
     "at most 2147483647 minutes, or UNLIMITED, got string '1491309-00'"),
    ("    nodes: 1\n    time: 2147483648",
     "at most 2147483647 minutes, or UNLIMITED, got string '2147483648'"),
    ("    nodes: 1\n    signal: USR1@65536",
     "signal's warning time must be at most 65535 seconds (sbatch's limit), got string 'USR1@65536'"),
    ("    nodes: 1\n    signal: '65@90'", "a number from 1 to 64) or null, got string '65@90'"),
    ("    nodes: '\u00b2'", "nodes must be a positive integer, got string '\u00b2'"),
    ("    nodes: 1\n    time: '\u0663\u0660'", "time must be minutes or 'HH:MM:SS'"),
    ("    nodes: 1\n    mem: '\u0663G'", "mem must be a size like '64G'"),
])
def test_numbers_are_bounded_and_errors_name_key_value_and_range(body, message):
    err = spec_error("meshes:\n  a:\n" + body + "\n")
    assert str(err).startswith(f"spec.yaml:{3 + body.count(chr(10))}: "), str(err)
    assert message in str(err), str(err)


def test_numbers_at_their_bounds_are_accepted():
    mesh = parse_job_spec("nodes: 100000\ngpus_per_node: 65533\nntasks_per_node: 65533\n"
                          "cpus_per_task: 65533\nmem: 1048576T\ntime: '1491308-02:07'\n"
                          "signal: B:USR1@65535\n").meshes["hosts"]
    assert (mesh.nodes, mesh.gpus_per_node, mesh.mem, mesh.time, mesh.signal) == (
        100000, 65533, "1048576T", "1491308-02:07", "B:USR1@65535")
    assert JobSpec.from_dict({"nodes": 1, "time": 2147483647}).meshes["hosts"].time == \
        "2147483647"
    with pytest.raises(SpecError, match=r"^<dict>: mem must be .* got integer 1099511627777$"):
        JobSpec.from_dict({"nodes": 1, "mem": 2**40 + 1})


def test_the_meshes_of_one_allocation_are_bounded_together():
    err = spec_error("meshes:\n  a: 60000\n  b: 60000\n")
    assert str(err) == ("spec.yaml:1: the meshes share one allocation (same_allocation: true) "
                        "and ask for 120000 nodes in all; at most 100000 (the most one Slurm "
                        "hostlist names)")
    spec = parse_job_spec("same_allocation: false\nmeshes:\n  a: 60000\n  b: 60000\n")
    assert spec.total_nodes == 120000            # two jobs: each one is within the bound


def test_a_number_too_long_to_read_is_a_spec_error():
    err = spec_error("meshes:\n  a:\n    nodes: 1\n    mem: " + "9" * 5000 + "\n")
    assert str(err) == ("spec.yaml:4: meshes.a.mem: a number of more than 4300 digits; no "
                        "value here needs one")
    with pytest.raises(SpecError) as e:
        JobSpec.from_dict({"nodes": 10**5000})
    assert str(e.value) == ("<dict>: nodes must be at most 100000 (the most one Slurm hostlist "
                            "names), got an integer of about 5000 digits")
    with pytest.raises(SpecError) as e:
        JobSpec.from_dict({"nodes": "x" * 10_000})
    assert str(e.value) == (f"<dict>: nodes must be a positive integer, got string {'x' * 60!r}... "
                            "(10000 characters)")


def test_value_errors_from_defaults_point_at_defaults():
    err = spec_error("defaults:\n  time: soon\nmeshes:\n  a: 1\n")
    assert str(err).startswith("spec.yaml:2: time must be")


@pytest.mark.parametrize("text, line, message", [
    ("meshes:\n  my-mesh: 1\n", 2, "mesh name 'my-mesh' must be a Python identifier"),
    ("meshes:\n  _x: 1\n", 2, "mesh name '_x' must be a Python identifier"),
    ("meshes:\n  a: many\n", 2, "mesh 'a' must be a node count or a mapping of mesh keys, got string 'many'"),
    ("meshes: []\n", 1, "meshes must be a non-empty mapping"),
    ("meshes:\n  a: 1\njob_name: my job\n", 3, "job_name must be one word"),
    ("meshes:\n  a: 1\nlog_dir: my logs\n", 3, "log_dir must be a directory path without spaces"),
    ("meshes:\n  a: 1\nsame_allocation: maybe\n", 3, "same_allocation must be true or false"),
    ("defaults: {nodes: 1}\nnodes: 2\n", 1, "defaults applies to meshes"),
    ("- a\n- b\n", 1, "the job spec must be a mapping, got a list"),      # the document's line
    ("", None, "empty job spec"),
    ("meshes:\n  a:\n    nodes: 1\n    nodes: 2\n", 4,
     "duplicate key 'meshes.a.nodes' (first given on line 3)"),
    ("meshes:\n  a: {nodes: 1\n", 3, "invalid YAML"),
])
def test_structure_errors(text, line, message):
    err = spec_error(text)
    prefix = f"spec.yaml:{line}: " if line else "spec.yaml: "
    assert str(err).startswith(prefix), str(err)
    assert message in str(err)


def test_shared_allocation_mismatch_points_at_second_mesh():
    err = spec_error("""\
        meshes:
          trainers:
            nodes: 2
            partition: gpu
          generators:
            nodes: 1
            partition: cpu
        """)
    assert str(err) == (
        "spec.yaml:7: meshes 'trainers' and 'generators' share one allocation "
        "(same_allocation: true) but differ in partition ('gpu' vs 'cpu'); make them equal "
        "(e.g. under defaults) or set same_allocation: false")


def test_load_job_spec_file_errors(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.yaml: no such file"):
        load_job_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_job_spec(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("meshes:\n  a:\n    nodse: 1\n")
    with pytest.raises(SpecError) as err:
        load_job_spec(bad)
    assert str(err.value).startswith(f"{bad}:3: unknown key 'nodse' in mesh 'a'")
    assert "(did you mean 'nodes'?)" in str(err.value)


def test_direct_construction_is_validated():
    with pytest.raises(SpecError, match="mesh 'x': nodes must be a positive integer, got integer 0"):
        MeshSpec("x", nodes=0)
    with pytest.raises(SpecError, match="Python identifier"):
        MeshSpec("a-b")
    m = MeshSpec("x", nodes=2, time=90, mem=1024, sbatch_extra=["--partition=gpu"])
    assert (m.time, m.mem, m.partition, m.sbatch_extra) == ("90", "1024", "gpu", [])
    with pytest.raises(SpecError, match="at least one mesh"):
        JobSpec(meshes={})
    with pytest.raises(SpecError, match="key and the name must match"):
        JobSpec(meshes={"a": MeshSpec("b")})
    with pytest.raises(SpecError, match="differ in time"):
        JobSpec(meshes={"a": MeshSpec("a", time="10"), "b": MeshSpec("b", time="20")})
    assert JobSpec(meshes={"a": MeshSpec("a", time="10"), "b": MeshSpec("b", time="20")},
                   same_allocation=False).total_nodes == 2


# --------------------------------------------------------------------------
# Monarch's SlurmJob keywords


def test_monarch_kwargs_defaults():
    spec = JobSpec.from_monarch_kwargs(meshes={"trainers": 2})
    m = spec.meshes["trainers"]
    assert spec.job_name == "monarch_job" and m.python == "python" and m.exclusive
    assert m.nodes == 2 and m.ntasks_per_node == 1 and m.time is None


def test_monarch_kwargs_full():
    spec = JobSpec.from_monarch_kwargs(
        meshes={"trainers": 4, "gen": {"nodes": 1, "ntasks_per_node": 2}},
        python_exe="/opt/py/bin/python", slurm_args=["--qos", "high", "--reservation=r1"],
        job_name="mj", ntasks_per_node=1, time_limit="02:00:00", partition="gpu",
        log_dir="/scratch/logs", exclusive=False, gpus_per_node=8, cpus_per_task=16,
        mem="200G", account="acct", monarch_port=22222, job_start_timeout=60)
    t, g = spec.meshes["trainers"], spec.meshes["gen"]
    assert spec.log_dir == "/scratch/logs" and spec.job_name == "mj"
    assert (t.python, t.time, t.partition, t.gpus_per_node, t.cpus_per_task, t.mem) == \
        ("/opt/py/bin/python", "02:00:00", "gpu", 8, 16, "200G")
    assert t.qos == "high" and t.account == "acct" and not t.exclusive
    assert t.sbatch_extra == ["--reservation=r1"]
    assert g.ntasks_per_node == 2 and g.gpus_per_node == 8
    assert spec.node_ranges() == {"trainers": range(0, 4), "gen": range(4, 5)}


def test_monarch_kwargs_meshspec_value_and_errors():
    spec = JobSpec.from_monarch_kwargs(meshes={"a": MeshSpec("a", nodes=3)})
    assert spec.meshes["a"].nodes == 3 and spec.meshes["a"].python == "python3"
    with pytest.raises(TypeError, match=r"'gpu_per_node'.*did you mean 'gpus_per_node'"):
        JobSpec.from_monarch_kwargs(meshes={"a": 1}, gpu_per_node=2)
    with pytest.raises(SpecError, match=r"^SlurmJob\(\.\.\.\): nodes must be a positive integer"):
        JobSpec.from_monarch_kwargs(meshes={"a": 0})
    with pytest.raises(SpecError, match="time must be"):
        JobSpec.from_monarch_kwargs(meshes={"a": 1}, time_limit="an hour")


# --------------------------------------------------------------------------
# rendering


def _directives(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH ")]


def test_render_two_meshes_golden():
    spec = parse_job_spec(TWO_MESHES)
    script = render_sbatch(spec, WORKER, env={"HPCMESH_CONTROLLER": "tcp://login1:7000"})
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert _directives(script) == [
        "#SBATCH --job-name=rl",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=01:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --output=.hpcmesh/logs/rl-%j.out",
        "#SBATCH --error=.hpcmesh/logs/rl-%j.err",
        "#SBATCH --signal=B:USR1@90",
        "#SBATCH --no-requeue",
    ]
    assert lines[1:11] == _directives(script)  # directives come first, before any command
    srun_t = ("exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpu-bind=none --relative=0 "
              "--kill-on-bad-exit=1 python3 -m hpcmesh worker --mesh trainers "
              "--attach tcp://login1:7000")
    srun_g = ("exec srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpu-bind=none --relative=2 "
              "--kill-on-bad-exit=1 python3 -m hpcmesh worker --mesh generators "
              "--attach tcp://login1:7000")
    order = ["set -euo pipefail", "export HPCMESH_CONTROLLER=tcp://login1:7000",
             "trap '_hm_forward USR1' USR1", "export HPCMESH_MESH_NAME=trainers", srun_t,
             '_hm_pids+=("$!")', "export HPCMESH_MESH_NAME=generators", srun_g,
             'for _hm_pid in "${_hm_pids[@]}"; do', 'exit "$_hm_rc"']
    positions = [lines.index(x) for x in order]
    assert positions == sorted(positions)
    assert lines[-1] == 'exit "$_hm_rc"'
    assert "@@" not in script


def test_render_single_mesh_full_header():
    spec = parse_job_spec(textwrap.dedent("""\
        job_name: big
        log_dir: /scratch/logs/
        nodes: 4
        ntasks_per_node: 2
        cpus_per_task: 16
        gpus_per_node: 4
        mem: 128g
        time: 1-00:00:00
        partition: gpu
        account: proj
        qos: high
        constraint: a100&ib
        exclusive: true
        requeue: true
        signal: SIGUSR2@300
        sbatch_extra: [--reservation=maint, --mail-type=FAIL]
        setup:
          - module load cuda
          - source $HOME/env/bin/activate
        python: /opt/py/bin/python3
        env: {OMP_NUM_THREADS: "4", MSG: "hello world $HOME", DROP: null}
        """))
    script = render_sbatch(spec, "{python} -m hpcmesh worker --tag 'a b'")
    assert _directives(script) == [
        "#SBATCH --job-name=big", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=2",
        "#SBATCH --cpus-per-task=16", "#SBATCH --gpus-per-node=4", "#SBATCH --mem=128G",
        "#SBATCH --time=1-00:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
        "#SBATCH --qos=high", "#SBATCH --constraint=a100&ib", "#SBATCH --exclusive",
        "#SBATCH --output=/scratch/logs/big-%j.out", "#SBATCH --error=/scratch/logs/big-%j.err",
        "#SBATCH --signal=B:SIGUSR2@300", "#SBATCH --requeue", "#SBATCH --reservation=maint",
        "#SBATCH --mail-type=FAIL",
    ]
    lines = script.splitlines()
    block = lines[lines.index("(") + 1:lines.index(") &")]
    assert block == [
        "unset DROP",
        "export HPCMESH_MESH_NAME=hosts",
        "export MSG='hello world $HOME'",
        "export OMP_NUM_THREADS=4",
        "set +u  # setup scripts (module, conda, venv) often read unset variables",
        "module load cuda",
        "source $HOME/env/bin/activate",
        "set -u",
        "exec srun --nodes=4 --ntasks=8 --ntasks-per-node=2 --cpus-per-task=16 "
        "--kill-on-bad-exit=1 /opt/py/bin/python3 -m hpcmesh worker --tag 'a b'",
    ]
    assert "trap '_hm_forward USR2' USR2" in lines
    assert "--relative" not in script


def test_render_signal_variants():
    base = "nodes: 1\n"
    for off in ("null", "false", "''"):
        no_sig = render_sbatch(parse_job_spec(base + f"signal: {off}\n"), ["w"])
        assert "#SBATCH --signal" not in no_sig and "trap '_hm_forward" not in no_sig
    r_sig = render_sbatch(parse_job_spec(base + "signal: 'R:USR2@60'\n"), ["w"])
    assert "#SBATCH --signal=R:USR2@60" in r_sig and "trap '_hm_forward" not in r_sig
    b_sig = render_sbatch(parse_job_spec(base + "signal: 'B:12@60'\n"), ["w"])
    assert "#SBATCH --signal=B:12@60" in b_sig and "trap '_hm_forward 12' 12" in b_sig


def test_render_is_deterministic():
    spec = load_job_spec(EXAMPLE)
    a = render_sbatch(spec, WORKER, env={"B": "2", "A": "1"})
    b = render_sbatch(load_job_spec(EXAMPLE), list(WORKER), env={"A": "1", "B": "2"})
    assert a == b
    assert a.index("export A=1") < a.index("export B=2")


def test_render_separate_allocations():
    spec = parse_job_spec(textwrap.dedent("""\
        job_name: j
        same_allocation: false
        meshes:
          a: {nodes: 1, partition: gpu}
          b: {nodes: 2, partition: cpu}
        """))
    with pytest.raises(ValueError, match="pass meshes=\\[name\\] with one of a, b"):
        render_sbatch(spec, ["w"])
    sb = render_sbatch(spec, ["w"], meshes=["b"])
    assert "#SBATCH --job-name=j-b" in sb and "#SBATCH --nodes=2" in sb
    assert "#SBATCH --partition=cpu" in sb and "--relative" not in sb
    assert "#SBATCH --output=.hpcmesh/logs/j-b-%j.out" in sb
    with pytest.raises(ValueError, match="unknown mesh 'c'"):
        render_sbatch(spec, ["w"], meshes=["c"])
    with pytest.raises(ValueError, match="not one allocation"):
        render_sbatch(spec, ["w"], meshes=["a", "b"])


def test_render_client_command_and_errors():
    spec = parse_job_spec("nodes: 1\n")
    script = render_sbatch(spec, ["w"], client_command=["python", "train.py", "--lr", "0.1"])
    assert "export HPCMESH_BATCH_JOB=1" in script
    assert "exec python train.py --lr 0.1" in script
    assert "_hm_forward TERM" in script
    with pytest.raises(ValueError, match="worker command is empty"):
        render_sbatch(spec, [])
    with pytest.raises(ValueError, match="cannot split worker command"):
        render_sbatch(spec, "python -c 'unterminated")
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        render_sbatch(spec, ["w"], env={"BAD-NAME": "x"})


def test_sbatch_commands():
    assert sbatch_test_only_command("/tmp/job.sh") == ["sbatch", "--test-only", "/tmp/job.sh"]
    assert sbatch_submit_command("job.sh") == ["sbatch", "--parsable", "job.sh"]


# --------------------------------------------------------------------------
# the rendered script as bash sees it


@needs_bash
@pytest.mark.parametrize("client", [None, ["sh", "-c", "exit 3"]])
def test_rendered_script_parses_with_bash_n(tmp_path, client):
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(load_job_spec(EXAMPLE), WORKER, env={"X": "it's"},
                                    client_command=client))
    proc = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


FAKE_SRUN = """\
#!/bin/bash
# Stands in for srun: records its arguments and mesh, exits on USR1 like a
# host agent that checkpointed, or with $FAKE_RC_<mesh> when it ends normally.
trap 'echo "USR1 $HPCMESH_MESH_NAME" >> "$FAKE_LOG"; exit 42' USR1
echo "srun $* | mesh=$HPCMESH_MESH_NAME shared=${SHARED:-} own=${OWN:-}" >> "$FAKE_LOG"
rc_var="FAKE_RC_$HPCMESH_MESH_NAME"
for _ in $(seq 100); do
    [ -e "$FAKE_STOP" ] && exit "${!rc_var:-0}"
    sleep 0.05
done
exit 99
"""


def _run_with_fake_srun(tmp_path, script_text, *, send_usr1=False, stop=True, extra_env=None,
                        started_lines=2):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(script_text)
    log, stop_file = tmp_path / "log", tmp_path / "stop"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_LOG=str(log),
               FAKE_STOP=str(stop_file), **(extra_env or {}))
    proc = subprocess.Popen([BASH, str(script)], env=env, cwd=tmp_path)
    deadline = time.time() + 10
    while started_lines and time.time() < deadline and (
            not log.exists() or len(log.read_text().splitlines()) < started_lines):
        time.sleep(0.05)
    if send_usr1:
        proc.send_signal(signal.SIGUSR1)
    elif stop:
        stop_file.touch()
    rc = proc.wait(timeout=20)
    return rc, log.read_text().splitlines()


TWO_WITH_ENV = TWO_MESHES.replace("    gpus_per_node: 8\n  generators",
                                  "    gpus_per_node: 8\n    env: {OWN: t}\n  generators")


@needs_bash
def test_rendered_script_runs_each_mesh_and_returns_first_failure(tmp_path):
    script = render_sbatch(parse_job_spec(TWO_WITH_ENV), ["{python}", "-c", "pass"],
                           env={"SHARED": "s v"})
    rc, log = _run_with_fake_srun(tmp_path, script, extra_env={"FAKE_RC_generators": "5"})
    assert rc == 5
    assert sorted(log) == sorted([
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpu-bind=none --relative=0 "
        "--kill-on-bad-exit=1 python3 -c pass | mesh=trainers shared=s v own=t",
        "srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpu-bind=none --relative=2 "
        "--kill-on-bad-exit=1 python3 -c pass | mesh=generators shared=s v own=",
    ])


@needs_bash
def test_rendered_script_forwards_the_preemption_signal(tmp_path):
    script = render_sbatch(parse_job_spec(TWO_MESHES), ["w"])
    rc, log = _run_with_fake_srun(tmp_path, script, send_usr1=True)
    assert sorted(x for x in log if x.startswith("USR1")) == ["USR1 generators", "USR1 trainers"]
    assert rc == 42  # the steps' status after the signal, not bash's 128+n from `wait`


@needs_bash
def test_rendered_script_with_client_ends_with_client_status(tmp_path):
    script = render_sbatch(parse_job_spec("nodes: 1\n"), ["w"],
                           client_command=["sh", "-c", 'echo "client $HPCMESH_BATCH_JOB" >> "$FAKE_LOG"; exit 3'])
    rc, log = _run_with_fake_srun(tmp_path, script, stop=False, started_lines=0)
    assert rc == 3
    assert "client 1" in log
