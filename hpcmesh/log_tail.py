"""The last lines of a log, for an error about a process or job that ended: the one home
(the client's "exited before it connected back", Slurm jobs and steps, ``SSHJob``), so the
user need not go and find the log.

Only the end of the file is read (a log can be gigabytes), undecodable bytes are replaced,
blank lines are skipped (they would take the place of a line that says something), and a
log that cannot be read gives "": the error is raised either way. Base layer: imports
nothing of hpcmesh.
"""

from __future__ import annotations

import os

#: At most this many bytes are read from the end of a log.
TAIL_BYTES = 4096


def log_tail(path: str | None, lines: int, sep: str = "\n", max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` non-blank lines of the log at ``path`` (of its last ``max_bytes``),
    joined by ``sep``; "" where there is no path, no such file, or nothing in it."""
    if not path:
        return ""
    try:
        # O_NONBLOCK: a FIFO put in a log's place must not hang the error it is for
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            size = os.fstat(fd).st_size
            cut = size > max_bytes
            if cut:
                f.seek(size - max_bytes)
            text = f.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    read = text.splitlines()
    if cut and len(read) > 1:
        del read[0]                             # the end of a line cut at the window's start
    kept = [ln.rstrip() for ln in read if ln.strip()]
    return sep.join(kept[-lines:]) if lines > 0 else ""
