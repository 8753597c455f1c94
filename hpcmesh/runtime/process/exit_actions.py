"""What a process leaves in its host's namespace that must go when the process goes, and
its host agent undoes once the process is dead, however it died.

Killing a process's group ends what it started, but not a mount it made: a FUSE mount
whose server was SIGKILLed stays behind as a dead mount ("Transport endpoint is not
connected") unless somebody unmounts it. ``fusermount3``'s ``auto_unmount`` helper does,
but it lives in the job's cgroup and dies with it when Slurm ends a step. So a process
records such leftovers in a file its agent named (``HPCMESH_EXIT_ACTIONS``), one JSON line
an action, and the agent carries them out after the process exited or was killed (stop,
crash, lease expiry, the agent's own exit).

An action names exactly what it undoes: an unmount names the mount's source, so a mount
that somebody else made at the same path since then is left alone. The file sits in the
process's log folder; it is written without following a symlink and carried out only when
it is this user's, in folders of this user's (``private_files``): a file another user put
there would otherwise have the agent unmount what they name.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess

from ...private_files import UntrustedPathError, append_file, open_file, remove_file

VAR = "HPCMESH_EXIT_ACTIONS"
log = logging.getLogger("hpcmesh.runtime")


def mounts_at(path: str) -> list[tuple[str, str]]:
    """(filesystem type, source) of each mount at exactly ``path`` in this process's mount
    namespace, oldest first (the last one is the one seen there)."""
    path = os.path.abspath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and _unescape(fields[4]) == path:
                fstype, source, *_ = right.split() + ["", ""]
                found.append((fstype, _unescape(source)))
    return found


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def unmount(path: str) -> None:
    """Detach the mount at ``path`` at once (files still open there keep working)."""
    subprocess.run(["fusermount3", "-u", "-z", path], check=False, timeout=10,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def unmount_if_ours(path: str, source: str) -> None:
    """Unmount ``path`` if the mount there has ``source``: a mount that somebody else made
    at the same path since (a reconnected client) is not ours to take down."""
    if any(src == source for _, src in mounts_at(path)):
        unmount(path)


def register_unmount(path: str, source: str) -> bool:
    """Have this process's agent unmount ``path`` after this process is gone, if the mount
    there still has ``source``. False when no agent started this process."""
    actions = os.environ.get(VAR)
    if not actions:
        return False
    line = json.dumps({"unmount": os.path.abspath(path), "source": source}) + "\n"
    with append_file(actions, what="the exit-actions file") as f:
        f.write(line.encode())      # one write: a line is there whole or not at all
    return True


def run_exit_actions(actions: str) -> None:
    """Carry out the actions recorded in the file ``actions`` (the agent, once the process
    is dead), then remove the file. Never raises: each failure is logged. A file that is
    not this user's, or sits where others could have put it, is not carried out."""
    try:
        with open_file(actions, what="the exit-actions file") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return
    except UntrustedPathError as e:
        log.warning("not carrying out the exit actions: %s", e)
        return
    except OSError as e:
        log.warning("cannot read the exit actions %s: %s", actions, e)
        return
    for line in lines:
        try:
            action = json.loads(line)
            unmount_if_ours(action["unmount"], action["source"])
        except Exception as e:  # noqa: BLE001 - one bad action must not keep the rest
            log.warning("exit action %r of %s failed: %s", line.strip(), actions, e)
    try:
        remove_file(actions, what="the exit-actions file")
    except OSError:
        pass
