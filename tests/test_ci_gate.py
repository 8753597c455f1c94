"""tests/ci_gate.py: a missing prerequisite skips outside CI and fails where CI is set."""

import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("ci, outcome", [("", "4 skipped"), ("1", "4 failed")])
def test_missing_prerequisites_skip_locally_and_fail_in_ci(tmp_path, ci, outcome):
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        from ci_gate import import_or_skip, requires, skip_or_fail

        @requires("the frobnicator is not installed")
        def test_decorated():
            pass

        def test_called():
            skip_or_fail("the cluster is down")

        def test_import():
            import_or_skip("hpcmesh_no_such_module")

        def test_slurm_cluster_down(monkeypatch):
            import slurm_cluster
            monkeypatch.setattr(slurm_cluster, "cluster_problem", lambda: "sinfo says no")
            slurm_cluster.require_cluster()
        """))
    env = {**os.environ, "CI": ci, "PYTHONPATH": TESTS}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-rsf", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    text = out.stdout + out.stderr
    assert outcome in text, text
    if ci:
        assert "the frobnicator is not installed (required when CI is set)" in text
        assert "needs hpcmesh_no_such_module" in text
    else:
        assert "the frobnicator is not installed" in text and "the cluster is down" in text
    assert "sinfo says no" in text and "tests/cluster/up.sh" in text      # the cluster gate
