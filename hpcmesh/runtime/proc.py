"""``python -m hpcmesh.runtime.proc``: the actor process entry point, under its public name.

The code is :mod:`hpcmesh.runtime.process.proc`. This name stays because it is a contract:
bootstrap commands users write end in ``-m hpcmesh.runtime.proc`` (README), hpcmesh's own
default command runs it (``bootstrap.PROC_MODULE``), and ``bootstrap.runs_entry_point``
recognises it to give such processes hpcmesh's GPU binding.
"""

from .process.proc import main

if __name__ == "__main__":
    main()
