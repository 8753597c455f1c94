"""HostMesh.with_python_executable (Monarch's name, issue 17): processes of the returned mesh
start with the interpreter at that path; the mesh it came from keeps the agent's own."""

import os
import stat
import sys

import pytest

from hpcmesh.actor import Actor, endpoint, this_host


class WhichPython(Actor):
    @endpoint
    def launcher(self):
        return os.environ.get("LAUNCHED_BY")


def _wrapper(tmp_path) -> str:
    """An 'interpreter' at a path of our own: it marks the environment, then runs Python.
    (A symlink would not do: the agent treats the same file as its own interpreter.)"""
    path = tmp_path / "venv" / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(f'#!/bin/sh\nLAUNCHED_BY="$0" exec {sys.executable} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_processes_start_with_the_given_interpreter_and_the_original_mesh_does_not(tmp_path):
    python = _wrapper(tmp_path)
    host = this_host()
    mesh = host.with_python_executable(python)
    assert mesh.slice(**{}).__dict__["_python"] == python        # views keep it
    procs = mesh.spawn_procs(per_host={"gpus": 2})
    plain = host.spawn_procs(per_host={"gpus": 1})
    try:
        seen = procs.spawn("which", WhichPython).launcher.call().get(timeout=60)
        assert sorted(v for _, v in seen.items()) == [python, python]
        other = plain.spawn("which", WhichPython).launcher.call_one().get(timeout=60)
        assert other is None
    finally:
        procs.stop().get(timeout=30)
        plain.stop().get(timeout=30)


def test_a_path_that_is_not_a_string_is_refused():
    with pytest.raises(TypeError, match="with_python_executable takes the interpreter's path"):
        this_host().with_python_executable(None)


def test_a_missing_interpreter_fails_the_spawn_naming_the_program(tmp_path):
    missing = str(tmp_path / "nowhere" / "python")
    procs = this_host().with_python_executable(missing).spawn_procs()
    try:
        with pytest.raises(Exception, match="nowhere/python"):
            procs.initialized.get(timeout=60)
    finally:
        procs.stop().get(timeout=30)


def test_a_job_mesh_stays_the_jobs_and_its_processes_take_the_given_interpreter(tmp_path):
    # a job's HostMesh (an AgentHostMesh: .job, its default per_host, the agent's python by
    # default) keeps all that through with_python_executable, and its slices keep the path
    from hpcmesh.job.agent_mesh import AgentHostMesh

    python = _wrapper(tmp_path)
    job = object()
    host = this_host()
    mesh = AgentHostMesh.from_hosts(host.refs, default_per_host={"gpus": 2}, job=job)
    chosen = mesh.with_python_executable(python)
    assert isinstance(chosen, AgentHostMesh) and chosen.job is job
    assert chosen.slice(**{}).job is job
    assert mesh.__dict__["_python"] is None
    procs = chosen.slice(**{}).spawn_procs()             # the job's default per_host
    try:
        seen = procs.spawn("which", WhichPython).launcher.call().get(timeout=60)
        assert sorted(v for _, v in seen.items()) == [python, python]
    finally:
        procs.stop().get(timeout=30)
