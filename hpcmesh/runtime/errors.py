"""Errors that cross process boundaries: they must stay picklable and self-describing."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import HpcmeshError


class _FieldsError(HpcmeshError):
    """An error declared as a dataclass (``eq=False, repr=False``: compared and shown as
    exceptions are) whose ``args`` are its fields, in order: what pickling calls the class
    with to rebuild it on the other side, and what its repr shows."""

    def __post_init__(self) -> None:
        super().__init__(*(getattr(self, f.name) for f in dataclasses.fields(self)))


@dataclasses.dataclass(eq=False, repr=False)
class ActorError(_FieldsError):
    """An endpoint raised. Carries the remote type, message, traceback text and point."""

    remote_type: str
    message: str
    traceback_text: str = ""
    point: Any = None
    actor: str = ""
    endpoint: str = ""
    #: the failure class (SPEC §12) of what it raised: ``USER_EXCEPTION``, or
    #: ``COLLECTIVE_TIMEOUT`` for a collective that gave up waiting (``failure_class_of``)
    reason: str = ""
    mesh: str = ""

    def __str__(self) -> str:
        # Monarch's words first ("Actor call <mesh>.<endpoint> failed"), then what raised
        call = (f"Actor call {self.mesh}.{self.endpoint} failed: "
                if self.mesh and self.endpoint else "")
        where = f" in {self.actor}.{self.endpoint}" if self.actor else ""
        at = f" at {self.point!r}" if self.point is not None else ""
        text = f"{call}{self.remote_type}: {self.message}{where}{at}"
        if self.traceback_text:
            text += "\n\nRemote traceback:\n" + self.traceback_text.rstrip()
        return text


#: ``SupervisionError.reason``, ``MeshFailure.reason``: why, as a word a classifier of
#: failures reads (SPEC §12: every failure carries a class); "" where nobody said.
HOST_LOST = "host lost"           # its host agent is gone (killed, its node down or cut off)
#: The exit status a process lost with its host is reported with: nobody saw it end.
LOST_STATUS = "exit status unknown (its host was lost)"
AGENT_EXITED = "agent exited"     # its host agent ended on purpose and took its processes
ENDED_BY_SLURM = "ended by Slurm"  # the job ended, was requeued, preempted, timed out, cancelled
USER_EXCEPTION = "user exception"  # the user's code raised
OUT_OF_MEMORY = "out of memory"   # the kernel's or Slurm's OOM killer ended it
SIGNAL = "signal"                 # killed by a signal nobody above explains
COLLECTIVE_TIMEOUT = "collective timeout"  # a collective (NCCL/gloo) gave up waiting

#: An exception may say its own failure class with this attribute (hpcmesh.collectives'
#: CollectiveTimeoutError says COLLECTIVE_TIMEOUT): ``failure_class_of`` reads it.
FAILURE_CLASS_ATTR = "failure_class"
#: How torch.distributed's own collectives say they timed out, for code that calls them
#: directly (hpcmesh.collectives raises CollectiveTimeoutError): gloo's transport
#: ("[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv
#: operation to complete"; "[.../gloo/transport/tcp/pair.h:311] Connect timeout", a peer
#: that never connected to the group), ``Work.wait(timeout)`` ("Operation timed out!"),
#: NCCL's watchdog ("Watchdog caught collective operation timeout: WorkNCCL(...)").
NCCL_WATCHDOG_TIMEOUT = "Watchdog caught collective operation timeout"
_TORCH_TIMEOUT_TEXTS = (("gloo", "Timed out waiting"), ("gloo", "Connect timeout"),
                        ("", "Operation timed out!"), ("", NCCL_WATCHDOG_TIMEOUT))


#: The classes of failures (SPEC §12): AGENT_EXITED is a stop, not one of them.
FAILURE_CLASSES = (USER_EXCEPTION, OUT_OF_MEMORY, HOST_LOST, ENDED_BY_SLURM, SIGNAL,
                   COLLECTIVE_TIMEOUT)


def failure_class_of(exc: BaseException) -> str:
    """The class of a failure ``exc`` raised by user code caused: the class it (or an
    exception it was raised from) says it is (a ``failure_class`` attribute; an ActorError's
    or SupervisionError's ``reason``: a failed call to another actor, not caught), a torch
    collective's timeout by its text, else ``USER_EXCEPTION``. Reads no module: torch stays
    unimported."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        said = getattr(e, FAILURE_CLASS_ATTR, None)
        if isinstance(said, str) and said:
            return said
        said = getattr(e, "reason", None) if isinstance(e, (ActorError, SupervisionError)) \
            else None
        if said in FAILURE_CLASSES:
            return said
        if isinstance(e, RuntimeError):
            text = str(e)
            if any(where in text and what in text for where, what in _TORCH_TIMEOUT_TEXTS):
                return COLLECTIVE_TIMEOUT
        e = e.__cause__ or e.__context__
    return USER_EXCEPTION


@dataclasses.dataclass(eq=False, repr=False)
class SupervisionError(_FieldsError, RuntimeError):
    """A process (or the connection to it) died; pending work addressed to it fails with this.
    ``reason``: one of the words above, for whoever sorts failures by cause. A RuntimeError
    too, as Monarch's is: Monarch programs catch it with ``except RuntimeError``."""

    message: str
    mesh: str = ""
    point: Any = None
    host: str = ""
    pid: int | None = None
    exit_status: str = ""
    reason: str = ""

    def __str__(self) -> str:
        return self.message


class MeshStoppedError(SupervisionError):
    """A mesh (or the actor a call was for) was stopped: it takes no new messages. The one
    "stopped" error: a call to a stopped actor mesh, to an actor stopped on its process,
    a spawn on a stopped ProcMesh. A SupervisionError (work addressed to it fails), hence a
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


def exit_class(returncode: int | None) -> str:
    """The failure class of a process that ended on its own with ``returncode``, where its
    host agent saw no cause (the OOM killer, NCCL's watchdog): a signal's, or its own code's
    (an exit status: it exited, or could not start); "" where nobody saw it end."""
    if returncode is None:
        return ""
    return SIGNAL if returncode < 0 else USER_EXCEPTION


class MeshFailure:
    """What ``__supervise__`` and ``unhandled_fault_hook`` get (Monarch's ``MeshFailure``):
    one member of a mesh someone owns failed. An actor member: its constructor raised, or
    an endpoint called without a reply port (``broadcast``), or answering through its
    response port, raised, or one raised a BaseException, or it did not handle a failure
    below it. A process member: it died. Not an exception, as in Monarch.

    ``mesh_name`` and ``report()`` are Monarch's; ``point`` is the failed member, ``error``
    the SupervisionError calls to it raise (``host``, ``pid`` and ``exit_status`` are its,
    for a process that died). ``mesh`` is the mesh's name, as ``SupervisionError.mesh``
    (Monarch 0.7 gives an empty tuple there)."""

    def __init__(self, mesh_name: str, error: SupervisionError, point=None):
        self.mesh_name = mesh_name
        self.error = error
        self.point = point

    @property
    def mesh(self) -> str:
        return self.mesh_name

    @property
    def host(self) -> str:
        return self.error.host

    @property
    def pid(self) -> int | None:
        return self.error.pid

    @property
    def exit_status(self) -> str:
        return self.error.exit_status

    @property
    def reason(self) -> str:
        """Why, as a classifier reads it (``HOST_LOST``, ...; "" where not known)."""
        return self.error.reason

    def report(self) -> str:
        """What failed and why, for a person to read: the message (Monarch's words first),
        then a last line ``failure class: <class>`` (SPEC §12; ``reason``), which a program
        may also read, where the class is known."""
        cls = self.error.reason
        return f"{self.error.message}\nfailure class: {cls}" if cls else self.error.message

    def __str__(self) -> str:
        rank = f", rank={self.point.rank}" if self.point is not None else ""
        return f"MeshFailure(mesh_name={self.mesh_name}{rank}): {self.report()}"

    __repr__ = __str__


def class_path(cls: type) -> str:
    """``train.Counter``: a class as Monarch's messages name it (module and name)."""
    return f"{cls.__module__}.{cls.__name__}"


def describe_actor(class_path: str, mesh_name: str, point) -> str:
    """``<train.Counter counters{'gpus': 1/2}>``: an actor as failure messages name it, in
    Monarch's words (without Monarch's ``<root>.`` path of the actors that own it)."""
    return f"<{class_path} {mesh_name}{point!r}>" if point is not None else \
        f"<{class_path} {mesh_name}>"


def process_exit_words(returncode: int | None) -> str:
    """How Monarch says that an actor's process ended: ``the process this actor was
    running on failed: Killed(sig=9)`` / ``... exited with non-zero code 3``."""
    if returncode is None:
        return "the process this actor was running on failed: unknown exit status"
    if returncode < 0:
        return f"the process this actor was running on failed: Killed(sig={-returncode})"
    if returncode > 0:
        return f"the process this actor was running on exited with non-zero code {returncode}"
    return "the process this actor was running on exited with code 0"


def actor_failed(who: str, reason: str, mesh_name: str, point=None,
                 failure_class: str = USER_EXCEPTION) -> SupervisionError:
    """The error of an actor that failed: what its calls raise and its MeshFailure reports.
    ``failure_class``: why, as a class (its own code raised or aborted, by default)."""
    return SupervisionError(f"The actor {who} and all its descendants have failed: {reason}",
                            mesh_name, point, reason=failure_class)


def call_failed(endpoint_name: str, fault: SupervisionError) -> SupervisionError:
    """A call to an actor that has failed: Monarch's wording, naming the call first."""
    return SupervisionError(f"Endpoint call {fault.mesh}.{endpoint_name}() failed, "
                            f"{fault.message}", fault.mesh, fault.point, fault.host, fault.pid,
                            fault.exit_status, fault.reason)


def stopped_call(endpoint_name: str, actor: str, stopped: SupervisionError) -> "MeshStoppedError":
    """A call to a stopped actor mesh: Monarch's wording (``... has status: ... stopped``),
    naming the call and an actor it was for, then why it was stopped."""
    return MeshStoppedError(f"Endpoint call {stopped.mesh}.{endpoint_name}() failed, "
                            f"Supervision event: actor {actor} has status: stopped: "
                            f"{stopped.message}", stopped.mesh, stopped.point, stopped.host,
                            stopped.pid, stopped.exit_status, stopped.reason)

