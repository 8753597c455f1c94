"""Errors that cross process boundaries: they must stay picklable and self-describing."""

from __future__ import annotations

from ..errors import HpcmeshError


class ActorError(HpcmeshError):
    """An endpoint raised. Carries the remote type, message, traceback text and point."""

    def __init__(self, remote_type: str, message: str, traceback_text: str = "",
                 point=None, actor: str = "", endpoint: str = ""):
        self.remote_type = remote_type
        self.message = message
        self.traceback_text = traceback_text
        self.point = point
        self.actor = actor
        self.endpoint = endpoint
        super().__init__(remote_type, message, traceback_text, point, actor, endpoint)

    def __str__(self) -> str:
        where = f" in {self.actor}.{self.endpoint}" if self.actor else ""
        at = f" at {self.point!r}" if self.point is not None else ""
        text = f"{self.remote_type}: {self.message}{where}{at}"
        if self.traceback_text:
            text += "\n\nRemote traceback:\n" + self.traceback_text.rstrip()
        return text


class SupervisionError(HpcmeshError):
    """A process (or the connection to it) died; pending work addressed to it fails with this."""

    def __init__(self, message: str, mesh: str = "", point=None, host: str = "",
                 pid: int | None = None, exit_status: str = ""):
        self.mesh = mesh
        self.point = point
        self.host = host
        self.pid = pid
        self.exit_status = exit_status
        self.message = message
        super().__init__(message, mesh, point, host, pid, exit_status)

    def __str__(self) -> str:
        return self.message


class MeshStoppedError(SupervisionError, RuntimeError):
    """A mesh (or the actor a call was for) was stopped: it takes no new messages. The one
    "stopped" error: a call to a stopped actor mesh, to an actor stopped on its process,
    a spawn on a stopped ProcMesh. A SupervisionError (work addressed to it fails) and a
    RuntimeError (what it was before it had a type of its own)."""


def describe_exit(returncode: int | None) -> str:
    """'exit code 3' / 'killed by SIGKILL' from a Popen-style return code."""
    import signal
    if returncode is None:
        return "unknown exit status"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"
