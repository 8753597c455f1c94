"""``python -m hpcmesh``: the ``hpcmesh`` command.

``python -m`` puts the current folder first on ``sys.path``, where a module another user
planted in a shared folder (/tmp, a group's project) would shadow the standard library for
every import after this one. It is taken off again here, before anything else is imported:
the ``hpcmesh`` command finds the user's own modules in the current folder after all others,
checked (``private_files.modules``). What Python imported before this point (hpcmesh's own
package) came from there already: on a shared folder use ``hpcmesh`` or ``python -P -m``.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402 - after the current folder left sys.path

if __name__ == "__main__":
    sys.exit(main())
