"""An actor class whose base class lives in a module the workers cannot import (a file
next to the user's script, not installed): the base travels by value with the class, as
the class's own module does. Before, the worker failed with ModuleNotFoundError."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BASE = textwrap.dedent("""
    from hpcmesh.actor import Actor, endpoint

    class Counter(Actor):
        def __init__(self):
            self.n = 0

        @endpoint
        def incr(self) -> int:
            self.n += 1
            return self.n
""")

SCRIPT = textwrap.dedent("""
    import os, sys
    from hpcmesh.actor import endpoint, this_host
    from mybase import Counter      # next to this script: the workers cannot import it

    class Named(Counter):
        @endpoint
        def where(self) -> str:
            return f"{type(self).__mro__[1].__module__} in pid {os.getpid()}"

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    a = procs.spawn("named", Named)
    print("INCR", a.incr.call_one().get(timeout=30), a.incr.call_one().get(timeout=30))
    print("WHERE", a.where.call_one().get(timeout=30), "client", os.getpid())
    procs.stop().get(timeout=30)
""")


def test_a_base_class_from_a_module_the_workers_cannot_import_travels_too(tmp_path):
    (tmp_path / "mybase.py").write_text(BASE)
    (tmp_path / "main.py").write_text(SCRIPT)
    # the script's folder is on the client's path (python puts it there), not the workers'
    # (they start in the client's working directory, which is elsewhere)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, str(tmp_path / "main.py")], cwd=elsewhere,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "INCR 1 2" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "WHERE mybase in pid" in out.stdout
