"""A spawn that fails after its process started (a log file that cannot be opened: out of
file descriptors) kills that process and sees its exit (real processes).

Before, the process was left running, unwatched: its exit was never seen, and ``stop()``
reported it as "did not die after SIGKILL"."""

from __future__ import annotations

import errno
import time

import pytest
from proc_helpers import processes_with_env, wait_gone

import hpcmesh.runtime.host_agent as host_agent
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
