"""Shared fixtures. Slurm tests import tests/slurm_cluster.py through this folder."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

os.environ.setdefault("HPCMESH_LEASE_GRACE", "3")


@pytest.fixture
def slurm_cluster():
    from slurm_cluster import require_cluster
    require_cluster()
