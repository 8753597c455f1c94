"""Helpers for tests that need the local multi-node Slurm test cluster.

The cluster is built by ``tests/cluster/up.sh`` (see tests/cluster/README.md):
slurmctld runs in the root network namespace (the "login node", 10.77.0.1 on
bridge ``hpcm-br0``) and each compute node ``nodeK`` is a network namespace
``hpcm-nodeK`` at 10.77.0.(10+K) running its own slurmd.

This module registers no fixtures; import it from a conftest, e.g.::

    import pytest
    from tests.slurm_cluster import require_cluster

    @pytest.fixture
    def slurm_cluster():
        require_cluster()
        ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from ci_gate import skip_or_fail

__all__ = [
    "SLURM_RELEASE",
    "CLUSTER_NAME",
    "CLUSTER_NODES",
    "LOGIN_ADDR",
    "PARTITIONS",
    "GPUS_PER_NODE",
    "UP_COMMAND",
    "DOWN_COMMAND",
    "ClusterNode",
    "cluster_is_up",
    "cluster_problem",
    "require_cluster",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = REPO_ROOT / "tests" / "cluster"
UP_COMMAND = f"sudo {CLUSTER_DIR / 'up.sh'}"
DOWN_COMMAND = f"sudo {CLUSTER_DIR / 'down.sh'}"
MANIFEST = Path("/var/lib/hpcmesh-testcluster/manifest")

CLUSTER_NAME = "hpcmtest"
LOGIN_ADDR = "10.77.0.1"
BRIDGE = "hpcm-br0"
PARTITIONS = ("debug", "batch")  # "debug" is the default partition
GPUS_PER_NODE = 2  # fake GPUs: CUDA_VISIBLE_DEVICES=0,1 with --gpus-per-node=2
CPUS_PER_NODE = 4
REAL_MEMORY_MB = 32000

# Slurm node states (sinfo %t, lower-cased) that count as usable.
_OK_STATES = {"idle", "alloc", "mix", "comp", "plnd"}  # plnd: planned by backfill


class ClusterNode(NamedTuple):
    name: str  # Slurm NodeName == hostname inside the node (e.g. "node1")
    addr: str  # e.g. "10.77.0.11" (24.11: 127.0.0.1)
    netns: str | None  # network namespace, e.g. "hpcm-node1" (24.11: none)


def _node_count() -> int:
    env = os.environ.get("HPCMESH_TEST_NODES", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        for line in MANIFEST.read_text().splitlines():
            if line.startswith("nodes=") and line[6:].strip().isdigit():
                return int(line[6:].strip())
    except OSError:
        pass
    return 3


#: Which Slurm release the tests talk to: "22.05" (Debian 12's, the namespace cluster of
#: tests/cluster/up.sh) or "24.11" (Debian 13's, tests/cluster/slurm24/: the tests then run
#: inside its root, and every node is 127.0.0.1 with a hostname of its own).
SLURM_RELEASE = os.environ.get("HPCMESH_TEST_SLURM", "22.05")
if SLURM_RELEASE == "24.11":
    CLUSTER_NAME = "hpcm2411"
    UP_COMMAND = f"sudo {CLUSTER_DIR / 'slurm24' / 'up.sh'}"
    DOWN_COMMAND = f"sudo {CLUSTER_DIR / 'slurm24' / 'down.sh'}"
    CLUSTER_NODES: tuple[ClusterNode, ...] = tuple(
        ClusterNode(f"node{k}", "127.0.0.1", None) for k in range(1, 4))
else:
    CLUSTER_NODES = tuple(
        ClusterNode(f"node{k}", f"10.77.0.{10 + k}", f"hpcm-node{k}")
        for k in range(1, _node_count() + 1)
    )
NODE_NAMES: tuple[str, ...] = tuple(n.name for n in CLUSTER_NODES)


def cluster_problem(timeout: float = 5.0) -> str | None:
    """Return None if the test cluster looks usable, else a short reason."""
    if shutil.which("sinfo") is None:
        return "Slurm client (sinfo) is not installed"
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"sinfo timed out after {timeout}s (slurmctld down?)"
    except OSError as exc:
        return f"cannot run sinfo: {exc}"
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        return f"sinfo failed: {err[-1] if err else proc.returncode}"
    states: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].lower()
    missing = [n for n in NODE_NAMES if n not in states]
    if missing:
        return f"sinfo does not report test node(s) {', '.join(missing)}"
    bad = [f"{n}={states[n]}" for n in NODE_NAMES if states[n] not in _OK_STATES]
    if bad:
        return f"test node(s) not usable: {', '.join(bad)}"
    return None


def cluster_is_up() -> bool:
    """Fast check: sinfo works and reports every test node in a usable state."""
    return cluster_problem() is None


def require_cluster() -> None:
    """Skip (locally) or fail (when $CI is set) unless the test cluster is up."""
    problem = cluster_problem()
    if problem is None:
        return
    msg = (
        f"Slurm test cluster '{CLUSTER_NAME}' is not up: {problem}. "
        f"Start it with `{UP_COMMAND}` (check: tests/cluster/status.sh, "
        f"stop: {DOWN_COMMAND}; see tests/cluster/README.md)."
    )
    skip_or_fail(msg)
