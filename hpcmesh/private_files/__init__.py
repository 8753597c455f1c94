"""Paths another local user cannot redirect (SPEC §7 "A login node is shared"): one home.

- :mod:`.walk`: the one component-wise ``O_NOFOLLOW`` walk, its two rules (``PASS``, a
  folder we may pass through: root's or ours, a sticky one before the last name;
  ``TRUST``, a folder we trust: ours, writable by nobody else) and its error,
  ``UntrustedPathError``. The mounts use it directly: a mount point, the mounted
  interpreter, a gathered folder.
- :mod:`.files`: what hpcmesh keeps for itself, under ``TRUST`` from a top folder down:
  0700 folders, ``O_EXCL|O_NOFOLLOW`` files, atomic writes, logs, secrets, and the
  per-user runtime folder.
- :mod:`.modules`: the modules of the current folder, found after every other (``hpcmesh
  apply mod.attr``, actor processes), and only when nobody else could have planted or
  changed them; the ``-P`` command line of every Python hpcmesh starts.

Base layer: imports nothing of hpcmesh but its errors, so every layer may use it.
"""

from .files import (RUNTIME_VAR, append_file, create_file, make_dirs, open_file, private_dir,
                    read_file, remove_file, runtime_dir, write_file, write_link)
from .walk import (PASS, TRUST, Opened, UntrustedPathError, describe, explain, user_name,
                   walk)

__all__ = ["PASS", "RUNTIME_VAR", "TRUST", "Opened", "UntrustedPathError", "append_file",
           "create_file", "describe", "explain", "make_dirs", "open_file", "private_dir",
           "read_file", "remove_file", "runtime_dir", "user_name", "walk", "write_file",
           "write_link"]
