"""hpcmesh's own errors share one root, and a stopped mesh fails with one type (pure, plus one
call into this process's runtime)."""

import importlib
import inspect
import pickle

import pytest

import hpcmesh
from hpcmesh.errors import HpcmeshError
from test_layers import MODULES


def _public_exceptions():
    for name in sorted(MODULES):
        if name in ("hpcmesh.__main__",):
            continue
        mod = importlib.import_module(name)
        for attr, value in vars(mod).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and \
                    value.__module__ == name and not attr.startswith("_"):
                yield value


def test_every_public_error_of_hpcmesh_is_an_hpcmesh_error_and_its_builtin_kind():
    found = list(_public_exceptions())
    assert len(found) >= 20            # the walk did find them (23 when this was written)
    outside = [f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, HpcmeshError)]
    assert not outside, f"errors that do not derive from HpcmeshError: {outside}"
    from hpcmesh.job.slurm import SlurmStartTimeout
    from hpcmesh.slurm.spec import SpecError
    from hpcmesh.transport.connection import ConnectionClosed
    assert issubclass(SpecError, ValueError) and issubclass(SlurmStartTimeout, TimeoutError)
    assert issubclass(ConnectionClosed, ConnectionError)
    assert hpcmesh.HpcmeshError is HpcmeshError


def test_a_stopped_mesh_fails_with_mesh_stopped_error_that_travels():
    from hpcmesh.actor import Actor, endpoint, this_proc
    from hpcmesh.runtime.errors import MeshStoppedError, SupervisionError

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    procs = this_proc()
    mesh = procs.spawn("echo_for_stop", Echo)
    assert mesh.echo.call_one(3).get(timeout=30) == 3
    mesh.stop().get(timeout=30)
    with pytest.raises(MeshStoppedError, match="was stopped") as ei:
        mesh.echo.call_one(4).get(timeout=30)
    assert isinstance(ei.value, SupervisionError) and isinstance(ei.value, RuntimeError)
    back = pickle.loads(pickle.dumps(ei.value))       # errors cross processes
    assert type(back) is MeshStoppedError and str(back) == str(ei.value)
    assert back.mesh == ei.value.mesh == "echo_for_stop"


def test_supervision_error_is_a_runtime_error_and_an_hpcmesh_error():
    """Monarch's SupervisionError is a RuntimeError: Monarch programs catch it with
    ``except RuntimeError`` / ``pytest.raises(RuntimeError)`` (issue 32 item 2)."""
    from hpcmesh.runtime.errors import SupervisionError
    err = SupervisionError("The actor A a{} and all its descendants have failed: x", "a",
                           None, "node1", 42, "killed by SIGKILL", "signal")
    assert isinstance(err, RuntimeError) and isinstance(err, HpcmeshError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SupervisionError and isinstance(back, RuntimeError)
    assert (back.message, back.host, back.pid, back.reason) == (err.message, "node1", 42,
                                                               "signal")


def test_failure_texts_lead_with_monarchs_words():
    """Programs match on Monarch's words (issue 32 item 3); hpcmesh's facts come after."""
    from hpcmesh.runtime.errors import (ActorError, MeshStoppedError, class_path,
                                        describe_actor, process_exit_words, stopped_call)
    from hpcmesh.shapes import Extent, Point
    err = ActorError("ValueError", "boom", "", Point(1, Extent({"gpus": 2})), "Worker", "step",
                     mesh="workers")
    assert str(err) == "Actor call workers.step failed: ValueError: boom in Worker.step at " \
                       "{'gpus': 1/2}"
    back = pickle.loads(pickle.dumps(err))
    assert back.mesh == "workers" and str(back) == str(err)
    assert class_path(HpcmeshError) == "hpcmesh.errors.HpcmeshError"
    assert describe_actor("train.Worker", "workers", Point(1, Extent({"gpus": 2}))) == \
        "<train.Worker workers{'gpus': 1/2}>"
    assert [process_exit_words(c) for c in (-9, 3, 0, None)] == [
        "the process this actor was running on failed: Killed(sig=9)",
        "the process this actor was running on exited with non-zero code 3",
        "the process this actor was running on exited with code 0",
        "the process this actor was running on failed: unknown exit status"]
    stopped = stopped_call("step", "<train.Worker workers{'gpus': 0/2}>",
                           MeshStoppedError("actor mesh 'workers' was stopped: by the client",
                                            "workers"))
    assert isinstance(stopped, MeshStoppedError) and stopped.mesh == "workers"
    assert str(stopped) == ("Endpoint call workers.step() failed, Supervision event: actor "
                            "<train.Worker workers{'gpus': 0/2}> has status: stopped: actor "
                            "mesh 'workers' was stopped: by the client")
