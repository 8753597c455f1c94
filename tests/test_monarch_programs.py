"""Monarch programs run on hpcmesh with only their imports changed.

Each program in tests/monarch_programs/ is a working Monarch program (it imports
``monarch.actor``); ``record.py`` ran it under torchmonarch 0.7.0 and kept what it printed
in ``expected/``. Here the ``monarch`` imports become ``hpcmesh`` imports, nothing else,
and the program must print the same, exit 0, and leave no process behind.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import uuid

import pytest
from ci_gate import import_or_skip
from proc_helpers import processes_with_env, wait_gone

PROGRAMS = pathlib.Path(__file__).resolve().parent / "monarch_programs"
_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)monarch(?=[.\s])", re.MULTILINE)


def to_hpcmesh(source: str) -> str:
    """The one edit a Monarch user makes: ``monarch`` becomes ``hpcmesh`` in imports."""
    return _IMPORT.sub(r"\1hpcmesh", source)


def _programs() -> list[pathlib.Path]:
    return sorted(p for p in PROGRAMS.glob("*.py") if p.name != "record.py")


def test_the_import_edit_touches_imports_only():
    src = ("from monarch.actor import Actor\nimport monarch.actor as ma\n"
           "x = 'monarch'\nmonarch_like = 1\n")
    assert to_hpcmesh(src) == ("from hpcmesh.actor import Actor\nimport hpcmesh.actor as ma\n"
                               "x = 'monarch'\nmonarch_like = 1\n")


@pytest.mark.parametrize("program", _programs(), ids=lambda p: p.stem)
def test_monarch_program_runs_unchanged(program: pathlib.Path, tmp_path: pathlib.Path):
    source = program.read_text()
    assert "from monarch.actor import" in source, "every program here is a Monarch program"
    if re.search(r"^import torch", source, re.MULTILINE):
        import_or_skip("torch")
    ported = tmp_path / program.name
    ported.write_text(to_hpcmesh(source))
    assert not re.search(r"^\s*(from|import)\s+monarch\b", ported.read_text(), re.MULTILINE)

    mark = f"HPCMESH_TEST_MARK_{uuid.uuid4().hex}"
    env = dict(os.environ, **{mark: "1"})
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(ported)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = (PROGRAMS / "expected" / f"{program.stem}.txt").read_text()
    assert run.stdout == expected, f"stderr:\n{run.stderr[-2000:]}"
    assert wait_gone(processes_with_env(mark), timeout=10) == []
