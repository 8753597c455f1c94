"""What a process can tell about itself for the admin view: its actors and its threads' stacks.

Three ways to get the stacks, because the cheap one needs the event loop:

* the ``admin_stacks`` service (``sys._current_frames()`` + ``traceback``), answered by the
  process's event loop: thread names and full Python frames;
* when the loop does not answer (an ``async def`` endpoint blocking it, or C code holding
  the GIL), the host agent runs ``py-spy dump`` on the process (:func:`pyspy_dump`; the
  optional ``stacks`` extra): it reads the stacks from outside through ptrace, so it
  needs nothing from the process, shows which thread holds the GIL and, with
  ``--native``, the C frames too;
* where py-spy is not installed or may not trace the process, the host agent sends
  :data:`STACK_SIGNAL` and reads what ``faulthandler`` wrote into the process's stack
  file (:func:`stack_file`). faulthandler writes from its C signal handler, so it answers
  whatever the Python code is doing. SIGUSR1/SIGUSR2 are not used: they are Slurm's
  time-limit warning (``agent_main.NOTICE_SIGNALS``); a real-time signal nobody sends is.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

from ...errors import HpcmeshError
from ...private_files import create_file, open_file, runtime_dir

#: The signal a process dumps its stacks on (None where the platform has no real-time
#: signals: then there is no fallback).
STACK_SIGNAL: int | None = (signal.SIGRTMIN + 4) if hasattr(signal, "SIGRTMIN") else None

#: The admin view's URL, exported to processes started after it is up (Monarch's name and
#: ours); ``host_mesh`` passes them on to the agents of other hosts too.
ADMIN_URL_VARS = ("MONARCH_ADMIN_URL", "HPCMESH_ADMIN_URL")

_stack_file_handle = None     # kept open for faulthandler, which writes to its fd

#: How long the host agent lets ``py-spy dump`` run (s); with ``--native`` it also reads
#: the symbols of every loaded library, which takes longer in a process with large ones.
PYSPY_TIMEOUT_S = 5.0
PYSPY_NATIVE_TIMEOUT_S = 10.0


def stack_file(pid: int) -> str:
    """Where process ``pid`` writes its signal-triggered stack dumps: the per-user runtime
    folder (this user's, mode 0700), not the log directory, since stacks may show data."""
    return os.path.join(runtime_dir(), f"stacks-{pid}.txt")


def install_stack_dump_handler() -> bool:
    """Make :data:`STACK_SIGNAL` dump every thread's stack into :func:`stack_file` (this
    process); False where it cannot (no such signal, or the file cannot be opened)."""
    global _stack_file_handle
    if STACK_SIGNAL is None:
        return False
    import faulthandler
    try:
        # a new file of ours (a stale one of an earlier process with this pid goes first):
        # never appended to through a link, or to a file somebody else made
        fd = create_file(stack_file(os.getpid()), what="the stack dump file", replace=True,
                         flags=os.O_WRONLY | os.O_APPEND)
        _stack_file_handle = os.fdopen(fd, "a")
        faulthandler.register(STACK_SIGNAL, file=_stack_file_handle, all_threads=True,
                              chain=False)
    except (OSError, RuntimeError, ValueError):
        return False
    return True


def remove_stack_file(pid: int) -> None:
    try:
        os.unlink(stack_file(pid))
    except OSError:
        pass


def thread_stacks() -> list[dict]:
    """Every thread's Python stack now, innermost frame last (as ``traceback`` prints it)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append({"thread": names.get(ident, f"thread {ident}"), "ident": ident,
                    "stack": "".join(traceback.format_stack(frame))})
    return out


def actor_report(node: Any) -> list[dict]:
    """The actors hosted on ``node``: mesh name, class, point, status and last error."""
    out = []
    for actor_id, host in list(node.actors.items()):
        inst = getattr(host, "instance", None)
        fault = getattr(host, "fault", None)
        status = "failed" if fault is not None else \
            "stopped" if getattr(host, "stopped", False) else "running"
        out.append({"actor_id": actor_id,
                    "mesh": getattr(inst, "mesh_name", ""),
                    "class": getattr(inst, "class_name", type(getattr(host, "obj", None)).__name__),
                    "point": _point(getattr(inst, "rank", None)),
                    "status": status,
                    "error": str(fault) if fault is not None else None})
    return out


def _point(point: Any) -> Any:
    """A mesh point as JSON: its coordinates by dimension name when it has them."""
    if point is None:
        return None
    try:
        return dict(point.items()) if hasattr(point, "items") else dict(point)
    except (TypeError, ValueError):
        return str(point)


def install_services(node: Any) -> None:
    """Offer ``admin_actors`` and ``admin_stacks`` on ``node`` (an actor process)."""
    node.services.update({"admin_actors": lambda: actor_report(node),
                          "admin_stacks": thread_stacks})


async def dump_stacks_by_signal(pid: int, timeout: float = 3.0) -> str:
    """Signal ``pid`` to dump its stacks (see :func:`install_stack_dump_handler`) and return
    what it wrote; raises when it cannot be asked or wrote nothing in ``timeout`` s."""
    if STACK_SIGNAL is None:
        raise RuntimeError("this platform has no real-time signals: no stack dump by signal")
    path = stack_file(pid)
    try:
        f = open_file(path, what="the stack dump file")     # ours, or refused
    except FileNotFoundError:
        raise RuntimeError(f"process {pid} has no stack file {path} (it did not install the "
                           f"stack-dump handler)") from None
    with f:
        start = size = os.fstat(f.fileno()).st_size
        os.kill(pid, STACK_SIGNAL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await asyncio.sleep(0.1)
            now = os.fstat(f.fileno()).st_size
            if now > start and now == size:     # it wrote, and has stopped writing
                break
            size = now
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    if not text:
        raise TimeoutError(f"process {pid} wrote no stacks within {timeout} s")
    return text


# -- py-spy ---------------------------------------------------------------------------------
class PySpyError(HpcmeshError, RuntimeError):
    """py-spy gave no stacks. ``reason``: ``not installed``, ``ptrace not permitted``,
    ``timed out``, ``cannot run`` or ``failed``; the text says the rest. It travels back
    to the admin server as the exception of an RPC (hence the plain ``args``)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason = reason

    def __str__(self) -> str:
        reason, detail = self.args
        return f"{reason}: {detail}" if detail else reason


def find_pyspy() -> str | None:
    """The ``py-spy`` executable: the one beside this interpreter first (a venv's ``bin``,
    where ``pip install 'hpcmesh[stacks]'`` puts it, whether or not it is on PATH), else
    the first on PATH; None where there is none."""
    if sys.executable:
        beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            return beside
    return shutil.which("py-spy")


def pyspy_dump(pid: int, native: bool = False, timeout: float | None = None,
               exe: str | None = None) -> str:
    """``py-spy dump --pid <pid>`` (``--native`` too if asked): its text, every thread's
    stack with its state (``idle``, ``active``, ``+gil``). Blocks up to ``timeout`` s
    (:data:`PYSPY_TIMEOUT_S`); raises :class:`PySpyError` saying why it gave none."""
    exe = exe or find_pyspy()
    if exe is None:
        raise PySpyError("not installed", f"no py-spy beside {sys.executable} nor on PATH "
                                          f"(pip install 'hpcmesh[stacks]')")
    if timeout is None:
        timeout = PYSPY_NATIVE_TIMEOUT_S if native else PYSPY_TIMEOUT_S
    cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else [])
    try:
        # no Rust backtrace of py-spy's own in its error message
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                           env=dict(os.environ, RUST_BACKTRACE="0"))
    except subprocess.TimeoutExpired:
        # killed (subprocess.run did): ptrace detaches the process as py-spy dies; a stop
        # signal that py-spy's attach left pending must not leave it stopped
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
        raise PySpyError("timed out", f"py-spy dump --pid {pid} ran past {timeout:g} s "
                                      f"(killed)") from None
    except OSError as e:
        raise PySpyError("cannot run", f"{exe}: {e}") from None
    text = r.stdout.decode("utf-8", "replace")
    if r.returncode == 0 and text.strip():
        return text
    raise PySpyError(*pyspy_failure(r.returncode, r.stderr.decode("utf-8", "replace"),
                                     _tracer_of(pid)))


def _tracer_of(pid: int) -> int:
    """The pid tracing ``pid`` now (``TracerPid`` of its status), 0 for none or unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pyspy_failure(returncode: int, stderr: str, tracer: int = 0) -> tuple[str, str]:
    """(reason, detail) of a py-spy run that printed no stacks, from what it wrote."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith("Stack backtrace:"):     # py-spy's own, with RUST_BACKTRACE set
            break
        if line.strip():
            lines.append(line.strip())
    said = " ".join(lines)[:600] or "nothing on stderr"
    detail = f"{said} (exit {returncode})"
    low = said.lower()
    if tracer:      # EPERM too, but not a matter of permission: one tracer at a time
        return "failed", f"{detail}; the process is being traced already (by pid {tracer})"
    if "permission denied" in low or "operation not permitted" in low:
        try:
            with open("/proc/sys/kernel/yama/ptrace_scope") as f:
                scope = f.read().strip()
        except OSError:
            scope = None
        if scope not in (None, "0"):
            detail += (f"; kernel.yama.ptrace_scope is {scope}: " + (
                "no process may trace another (3)" if scope == "3" else
                "only a process's ancestors (1) or holders of CAP_SYS_PTRACE (2) may "
                "trace it"))
        else:
            detail += "; in a container, ptrace may need CAP_SYS_PTRACE (or a seccomp profile)"
        return "ptrace not permitted", detail
    return "failed", detail


_pyspy_locks: dict[int, asyncio.Lock] = {}


async def dump_stacks_by_pyspy(pid: int, native: bool = False,
                               timeout: float | None = None) -> str:
    """:func:`pyspy_dump` on the default executor (the caller's event loop runs on), one
    at a time per process: a second py-spy attaching while one is attached fails (two
    admin views asking at once: review)."""
    # (kept per pid: dropping an unlocked one could race a waiter it has just woken; one
    # small lock per process ever asked about, by a person)
    async with _pyspy_locks.setdefault(pid, asyncio.Lock()):
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(pyspy_dump, pid, native, timeout))
