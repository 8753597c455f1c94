"""What importing hpcmesh pulls in: torch only where collectives are used."""

import subprocess
import sys


def _modules_after(stmt: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{stmt}\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_actor_api_does_not_import_torch_or_slurm_glue():
    mods = _modules_after("import hpcmesh.actor")
    assert "torch" not in mods
    assert "submitit" not in mods and "mpi4py" not in mods


def test_worker_process_entry_does_not_import_torch():
    assert "torch" not in _modules_after("import hpcmesh.runtime.proc")


def test_jobs_and_cli_do_not_import_torch():
    mods = _modules_after("import hpcmesh.job, hpcmesh.cli, hpcmesh.hosts")
    assert "torch" not in mods
