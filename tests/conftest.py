"""Shared fixtures. Slurm tests import tests/slurm_cluster.py through this folder."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

os.environ.setdefault("HPCMESH_LEASE_GRACE", "3")


@pytest.fixture(scope="session", autouse=True)
def unhandled_faults():
    """What reached ``unhandled_fault_hook`` in this pytest process. Tests make actors and
    processes fail on purpose: the default hook would end the whole session (it exits the
    client, as in Monarch), so here it only records them."""
    import hpcmesh.actor
    seen: list = []
    hpcmesh.actor.unhandled_fault_hook = seen.append
    yield seen


@pytest.fixture
def other_user():
    """A second local account (created as root, removed afterwards with its processes):
    what another user of a shared login node can do (tests/other_user.py)."""
    from other_user import create_other_user, remove_other_user
    user = create_other_user()
    try:
        yield user
    finally:
        remove_other_user(user)


@pytest.fixture
def slurm_cluster():
    from slurm_cluster import require_cluster
    require_cluster()


# --- hpcmesh runtime tests: no worker process may outlive the test session -----------------
def _hpcmesh_children():
    """Live ``hpcmesh.runtime.proc`` children of this pytest process (pid, cmdline)."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != me or fields[0] in ("Z", "X"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        # the entry point by its public name or its module (not a prefix: the agent's fork
        # server, hpcmesh.runtime.process.forkserver, lives as long as the session's agent)
        if re.search(r"-m hpcmesh\.runtime\.(process\.)?proc(\s|$)", cmd):
            found.append((int(entry), cmd))
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_hpcmesh_processes():
    yield
    if not os.path.isdir("/proc"):
        return
    import signal
    import time
    deadline = time.monotonic() + 5
    left = _hpcmesh_children()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _hpcmesh_children()
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"tests left hpcmesh worker processes running (now killed): {left}")
