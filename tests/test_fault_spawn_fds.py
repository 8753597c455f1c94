"""A spawn that fails after its process started (a log file that cannot be opened: out of
file descriptors) kills that process and sees its exit (real processes).

Before, the process was left running, unwatched: its exit was never seen, and ``stop()``
reported it as "did not die after SIGKILL"."""

from __future__ import annotations

import asyncio
import errno
import time

import pytest
from proc_helpers import processes_with_env, wait_gone

import hpcmesh.runtime.process.host_agent as host_agent
from hpcmesh.actor import this_host


def _procs_named(prefix: str) -> list[int]:
    """Live processes of mesh ``prefix`` (by the process name the agent gave them)."""
    return processes_with_env(f"HPCMESH_PROCESS_NAME={prefix}-")


def test_a_spawn_whose_log_file_cannot_be_opened_leaves_no_process(monkeypatch, tmp_path):
    real_open = host_agent.append_file     # how the agent opens its processes' logs

    def no_fds_for_logs(path, *args, **kwargs):
        if str(path).endswith((".out", ".err")) and "fdtest" in str(path):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(host_agent, "append_file", no_fds_for_logs)
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="fdtest")
    with pytest.raises(Exception, match="Too many open files"):
        procs.initialized.get(timeout=30)
    deadline = time.monotonic() + 10
    while _procs_named("fdtest") and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _procs_named("fdtest")
    assert left == [], f"processes of the failed spawn still running: {left}"
    monkeypatch.undo()
    codes = procs.stop(grace=0.5).get(timeout=30)
    assert None not in codes.values(), codes      # none "did not die after SIGKILL"
    assert wait_gone(left, 1) == []


def test_processes_killed_to_clean_up_a_failed_spawn_are_no_failure(monkeypatch,
                                                                      unhandled_faults):
    """The agent kills what a failed spawn had started; those are no failures to report.
    Before, each that had connected already became a "killed by SIGKILL" MeshFailure, a
    call of unhandled_fault_hook (whose default ends the client): ~195 of them for a spawn
    of 200 that ran out of fds."""
    from hpcmesh.runtime.process.bootstrap import PROCESS_NAME_VAR
    from hpcmesh.runtime.client import client_runtime
    from hpcmesh.runtime.process.zygote import ZygoteClient

    rt = client_runtime()
    real_open, real_spawn = host_agent.append_file, ZygoteClient.spawn     # the logs' opener

    def no_fds_for_the_last(path, *args, **kwargs):
        if str(path).endswith((".out", ".err")) and "fdlast" in str(path) and \
                str(path).rsplit(".", 1)[0].endswith("-2"):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real_open(path, *args, **kwargs)

    async def spawn_once_the_others_connected(self, env):
        # the first two have said hello to the controller when the third one fails
        if env[PROCESS_NAME_VAR].endswith("-2"):
            others = [r for n, r in rt.procs.items() if "fdlast" in n and
                      not n.endswith("-2")]
            for _ in range(600):
                if len(others) == 2 and all(r.node is not None for r in others):
                    break
                await asyncio.sleep(0.05)
        return await real_spawn(self, env)

    monkeypatch.setattr(host_agent, "append_file", no_fds_for_the_last)
    monkeypatch.setattr(ZygoteClient, "spawn", spawn_once_the_others_connected)
    before = len(unhandled_faults)
    procs = this_host().spawn_procs(per_host={"gpus": 3}, name="fdlast")
    with pytest.raises(Exception, match="Too many open files"):
        procs.initialized.get(timeout=60)
    connected = [r for r in procs.records if r.node is not None]
    assert len(connected) == 2, "the test needs processes that connected before the failure"
    deadline = time.monotonic() + 10
    while _procs_named("fdlast") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _procs_named("fdlast") == []
    # the controller has had each one's exit report, and offered whatever it made of it
    # to the hook (a thread of its own)
    node = rt.node

    def exit_reported(r) -> bool:
        lost = getattr(node.peers.get(r.node.node_id), "lost", None)
        return lost is not None and bool(getattr(lost, "exit_status", ""))
    deadline = time.monotonic() + 10
    while not all(exit_reported(r) for r in connected) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(exit_reported(r) for r in connected)
    node.run_sync(asyncio.sleep(0))             # past the loop turn that handled them
    rt.wait_for_fault_hook(timeout=10)
    monkeypatch.undo()
    reports = [f for f in unhandled_faults[before:] if f.mesh_name == "fdlast"]
    assert reports == [], reports
    procs.stop(grace=0.5).get(timeout=30)
