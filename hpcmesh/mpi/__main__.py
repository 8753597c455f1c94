"""``python -m hpcmesh.mpi``: every rank runs the launcher (``launcher.main``).

The launcher's state for the script rank 0 runs lives in ``hpcmesh.mpi.attach``, a module
imported once, so the script's ``hpcmesh.mpi.mpi_proc_mesh()`` sees it (this file runs as
``__main__``, a second copy of whatever it defined)."""

from .launcher import main

if __name__ == "__main__":     # importing it (a walk over every module) runs nothing
    main()
