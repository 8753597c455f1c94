"""Run shell commands and Python scripts on every member of a mesh (``exec_command``).

``exec_command(hosts, "nvidia-smi -L")`` starts one process per host (or
``per_host`` processes), places a :class:`BashActor` on each, runs the command
there and returns a Future of the largest exit code; the processes it started
are stopped before the Future resolves.

Each run sees, besides the host's environment:

* ``HPCMESH_RANK_<dim>`` / ``HPCMESH_SIZE_<dim>`` for every dimension of the
  process mesh (``hosts`` plus any ``per_host`` dims), with coordinates in the
  *whole* mesh even when ``rank=``/``point=`` restrict the run to a part of it;
* ``HPCMESH_RANK`` / ``HPCMESH_NRANKS``: the flat rank and the member count;
* ``HPCMESH_SUBDIR``: ``<dim>_<i>_<dim>_<i>...`` (``hosts_0_gpus_1``), ``0`` for a
  mesh without dimensions. ``$SUBDIR`` / ``${SUBDIR}`` in ``output_dir`` become it;
* ``HPCMESH_PYTHON``: the interpreter of the actor process (what ``run_python`` uses);
* ``CUDA_VISIBLE_DEVICES`` / ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` / ``HPCMESH_LOCAL_SLOT``
  as ``spawn_procs``' ``gpu_binding`` gives them, for the member's slot among the *whole*
  ``per_host`` extent (``point={"gpus": 1}`` runs with LOCAL_RANK 1 in "host" binding).

With ``output_dir`` the output goes to files on the worker host: ``stdout`` and
``stderr`` inside ``output_dir`` when it contains ``$SUBDIR`` (one directory per
member), else ``<subdir>.stdout`` / ``<subdir>.stderr`` in ``output_dir``. The folder
must be ours and not writable by others (made 0700 when missing), the files are made anew
(0600) and no symlink there is followed: see ``BashActor._open_outputs``.
Without it, output reaches the controller: through the usual log forwarding
(lines prefixed ``[hosts=0]``), or line by line to ``on_output`` when given.

The hpcmesh bootstrap variables of the actor process (the job secret, the
controller's addresses) are removed from the command's environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from ..actor.channel import Port
from ..actor.endpoint import Actor, endpoint
from ..private_files import create_file
from ..private_files.modules import run_module_argv, run_script_argv
from ..runtime.client import client_runtime
from ..runtime.context import context
from ..runtime.future import Future
from ..runtime.process.gpu_binding import BINDING_VAR, choose_binding, gpu_env
from ..shapes import Extent, Point, point_label, subdir_for

__all__ = ["BashActor", "exec_command", "exec_python", "subdir_for", "point_label"]

#: Variables of an actor process that a user command must not inherit.
_PRIVATE_VARS = ("HPCMESH_SECRET", "HPCMESH_SECRET_FILE", "HPCMESH_BOOTSTRAP_MODE",
                 "HPCMESH_PROCESS_NAME", "HPCMESH_LOG_CHANNEL", "HPCMESH_CONTROLLER",
                 "HPCMESH_CONTROLLER_ID", "HPCMESH_JOB_TOKEN")

#: How many lines ``run_streaming`` batches into one message at most.
_BATCH_LINES = 256


def _exit_code(returncode: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class BashActor(Actor):
    """Runs commands on its process's host. Spawned by :func:`exec_command`.

    ``full_extent`` and ``offsets`` place this actor in the mesh the user asked
    about (a restricted run spawns only part of it); both default to the mesh
    the actor was spawned in. With ``gpu_binding``, ``per_host_dims`` (the dims of
    ``full_extent`` that are per host) give the slot whose GPU the commands get, from
    the GPUs this process sees (spawn it with "host" binding); without, the commands
    keep this process's GPU variables.
    """

    def __init__(self, full_extent: Mapping[str, int] | None = None,
                 offsets: Mapping[str, int] | None = None,
                 per_host_dims: Sequence[str] = (), gpu_binding: str | None = None):
        point = context().actor_instance.rank
        local = dict(point.items())
        if full_extent is None:
            full_extent = dict(point.extent.items())
        offsets = dict(offsets or {})
        self.extent = dict(full_extent)
        self.coords = {d: offsets.get(d, 0) + local.get(d, 0) for d in self.extent}
        self.rank = Point.from_coords(self.coords, Extent(self.extent)).rank if self.extent else 0
        self.subdir = subdir_for(self.coords)
        self.label = point_label(self.coords)
        self.gpu = None
        if gpu_binding is not None:
            per_host = {d: self.extent[d] for d in per_host_dims}
            slot = Point.from_coords({d: self.coords[d] for d in per_host_dims},
                                     Extent(per_host)).rank if per_host else 0
            n = Extent(per_host).nelem
            gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
            self.gpu = {**gpu_env(gpu_binding, slot, n, gpus), "LOCAL_WORLD_SIZE": str(n),
                        BINDING_VAR: gpu_binding}

    # -- helpers ------------------------------------------------------------------------
    def _env(self, env: Mapping[str, str | None] | None) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items() if k not in _PRIVATE_VARS}
        for d, size in self.extent.items():
            out[f"HPCMESH_RANK_{d}"] = str(self.coords[d])
            out[f"HPCMESH_SIZE_{d}"] = str(size)
        out["HPCMESH_RANK"] = str(self.rank)
        n = 1
        for size in self.extent.values():
            n *= size
        out["HPCMESH_NRANKS"] = str(n)
        out["HPCMESH_SUBDIR"] = self.subdir
        out["HPCMESH_PYTHON"] = sys.executable
        out.update(self.gpu or {})
        for k, v in (env or {}).items():
            if v is None:
                out.pop(k, None)
            else:
                out[str(k)] = str(v)
        return out

    def _argv(self, cmd: str | Sequence[str]) -> list[str]:
        if isinstance(cmd, str):
            return ["bash", "-c", cmd]
        argv = [str(a) for a in cmd]
        if not argv:
            raise ValueError("empty command")
        return argv

    def _output_files(self, output_dir: str | None, workdir: str | None) -> tuple[str, str] | None:
        if not output_dir:
            return None
        templated = "$SUBDIR" in output_dir or "${SUBDIR}" in output_dir
        path = output_dir.replace("${SUBDIR}", self.subdir).replace("$SUBDIR", self.subdir)
        path = os.path.expanduser(path)
        if workdir and not os.path.isabs(path):
            path = os.path.join(workdir, path)
        if templated:
            return os.path.join(path, "stdout"), os.path.join(path, "stderr")
        return (os.path.join(path, f"{self.subdir}.stdout"),
                os.path.join(path, f"{self.subdir}.stderr"))

    @staticmethod
    def _open_outputs(files: tuple[str, str] | None) -> list:
        """The output files, new (0600, replacing a file of an earlier run), in their folder
        (made 0700 when missing), which must be ours and not writable by others, and with
        no symlink followed: on a shared node another user could have put a link there, to
        a file of ours they want overwritten, or made the folder to read what we write
        (``private_files.create_file``; its error names the path, the owner and mode)."""
        if files is None:
            return [None, None]
        sinks: list = []
        try:
            for f in files:
                sinks.append(os.fdopen(create_file(f, what="hpcmesh exec's output file",
                                                   replace=True), "wb"))
        except BaseException:
            for sink in sinks:
                sink.close()
            raise
        return sinks

    def _check_workdir(self, workdir: str | None) -> str | None:
        if workdir is None:
            return None
        wd = os.path.expanduser(workdir)
        if not os.path.isdir(wd):
            raise FileNotFoundError(f"workdir {workdir!r} does not exist on host "
                                    f"{socket.gethostname()}")
        return wd

    def _spawn(self, argv: list[str], env: dict, workdir: str | None, stdout, stderr):
        try:
            return subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=stderr, start_new_session=True)
        except FileNotFoundError:
            return 127
        except PermissionError:
            return 126

    def _wait(self, proc: subprocess.Popen) -> int:
        try:
            return _exit_code(proc.wait())
        except BaseException:
            _kill_group(proc)
            raise

    # -- endpoints ----------------------------------------------------------------------
    @endpoint
    def run(self, cmd: str | Sequence[str], env: Mapping[str, str | None] | None = None,
            workdir: str | None = None, output_dir: str | None = None) -> int:
        """Run ``cmd`` (a string through ``bash -c``, or an argv list) and return its exit code."""
        wd = self._check_workdir(workdir)
        argv = self._argv(cmd)
        files = self._output_files(output_dir, wd)
        if files is None:
            sys.stdout.flush()
            sys.stderr.flush()
            proc = self._spawn(argv, self._env(env), wd, None, None)
            if isinstance(proc, int):
                print(f"hpcmesh exec: {argv[0]}: command not found or not executable",
                      file=sys.stderr, flush=True)
                return proc
            return self._wait(proc)
        out, err = self._open_outputs(files)
        with out, err:
            proc = self._spawn(argv, self._env(env), wd, out, err)
            if isinstance(proc, int):
                err.write(f"hpcmesh exec: {argv[0]}: command not found or not executable\n"
                          .encode())
                return proc
            return self._wait(proc)

    @endpoint
    def run_python(self, script_or_module: str, args: Sequence[str] = (),
                   env: Mapping[str, str | None] | None = None, workdir: str | None = None,
                   output_dir: str | None = None) -> int:
        """Run a Python script (a path ending in ``.py`` or an existing file) or module
        (as ``-m`` would, with the working directory's modules found last and checked:
        ``private_files.modules``) with this process's interpreter."""
        return self.run(python_argv(script_or_module, args), env, workdir, output_dir)

    @endpoint
    def run_streaming(self, cmd: str | Sequence[str], port: Port,
                      env: Mapping[str, str | None] | None = None, workdir: str | None = None,
                      output_dir: str | None = None) -> int:
        """Like ``run``, and sends ``(label, stream, [lines])`` batches through ``port`` as
        the command prints them (also written to ``output_dir`` when given). Every batch is
        sent before the exit code is returned."""
        wd = self._check_workdir(workdir)
        argv = self._argv(cmd)
        sinks = self._open_outputs(self._output_files(output_dir, wd))
        try:
            proc = self._spawn(argv, self._env(env), wd, subprocess.PIPE, subprocess.PIPE)
            if isinstance(proc, int):
                port.send((self.label, "stderr",
                           [f"hpcmesh exec: {argv[0]}: command not found or not executable"]))
                return proc
            pumps = [threading.Thread(target=_pump, args=(pipe, name, sink, port, self.label),
                                      daemon=True)
                     for pipe, name, sink in ((proc.stdout, "stdout", sinks[0]),
                                              (proc.stderr, "stderr", sinks[1]))]
            for t in pumps:
                t.start()
            code = self._wait(proc)
            for t in pumps:
                t.join()
            return code
        finally:
            for s in sinks:
                if s is not None:
                    s.close()

    @endpoint
    def where(self) -> dict:
        """Where this actor runs: host, pid, its point in the requested mesh."""
        return {"host": socket.gethostname(), "pid": os.getpid(), "coords": dict(self.coords),
                "rank": self.rank, "subdir": self.subdir}


def _pump(pipe, stream: str, sink, port: Port, label: str) -> None:
    """Read a pipe to its end, sending lines in batches (a batch per read burst)."""
    partial = b""
    fd = pipe.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            if sink is not None:
                sink.write(data)
            *lines, partial = (partial + data).split(b"\n")
            for i in range(0, len(lines), _BATCH_LINES):
                chunk = lines[i:i + _BATCH_LINES]
                port.send((label, stream, [ln.decode("utf-8", "replace") for ln in chunk]))
        if partial:
            port.send((label, stream, [partial.decode("utf-8", "replace")]))
    finally:
        pipe.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def _check_python_target(script_or_module: Any, args: Any) -> None:
    if not isinstance(script_or_module, str) or not script_or_module:
        raise ValueError(f"exec_python needs a script path or module name, "
                         f"got {script_or_module!r}")
    if isinstance(args, str):
        raise TypeError("exec_python args must be a list of strings, not one string")


def _dash_script(script_or_module: str) -> str | None:
    """A name starting with '-' as the script it must be, ``./-c.py``; None for others.

    No module name starts with '-', so it can only be a file; given bare, Python would read
    it as its own option (``-c.py`` runs the code ``.py``, ``-mfoo`` the module foo). A
    leading ``./`` names the same file in the working directory and is never an option."""
    return "./" + script_or_module if script_or_module.startswith("-") else None


def python_argv(script_or_module: str, args: Sequence[str]) -> list[str]:
    """The command ``exec_python`` runs for ``script_or_module`` on this side."""
    _check_python_target(script_or_module, args)
    dashed = _dash_script(script_or_module)
    if dashed is not None:
        return run_script_argv(dashed, args)
    if is_module_name(script_or_module):
        return run_module_argv(script_or_module, args)
    return run_script_argv(script_or_module, args)


def is_module_name(name: str) -> bool:
    """Whether ``exec_python`` runs ``name`` as a module: a dotted name of identifiers not
    ending in ``.py``. Anything else is a script path (``train.py``, ``./train``). Decided
    by the name alone, never by what files exist: a file another user put in a shared
    working folder under a module's name (``mypkg.train``) would otherwise run, unchecked,
    as a script."""
    return not name.endswith(".py") and all(part.isidentifier() for part in name.split("."))


# ---------------------------------------------------------------------------------------
# the controller side
# ---------------------------------------------------------------------------------------
def _restrict(host_mesh, per_host: Mapping[str, int], rank: int | None,
              point: Mapping[str, int] | None):
    """(host mesh view, per_host to spawn, full extent, offsets) for a possibly
    restricted run. ``point`` may name a subset of the dims (the rest stay whole)."""
    host_extent = dict(host_mesh.extent.items())
    full = {**host_extent, **per_host}
    if rank is not None and point is not None:
        raise ValueError("pass rank= or point=, not both")
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {rank!r}")
        point = dict(Point(rank, Extent(full)).items()) if full else {}
        if not full and rank != 0:
            raise IndexError(f"rank {rank} out of range for a mesh of 1 member")
    point = dict(point or {})
    for d, c in point.items():
        if d not in full:
            raise KeyError(f"point names dimension {d!r}, but the mesh has "
                           f"{list(full) or 'no dimensions'}")
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < full[d]:
            raise IndexError(f"index {c!r} out of range for dimension {d!r} of size {full[d]}")
    host_sel = {d: slice(c, c + 1) for d, c in point.items() if d in host_extent}
    hosts = host_mesh.slice(**host_sel) if host_sel else host_mesh
    spawn_per_host = {d: (1 if d in point else n) for d, n in per_host.items()}
    return hosts, spawn_per_host, full, point


def exec_command(host_mesh, cmd: str | Sequence[str], env: Mapping[str, str | None] | None = None,
                 workdir: str | None = None, output_dir: str | None = None,
                 rank: int | None = None, point: Mapping[str, int] | None = None,
                 per_host: Mapping[str, int] | None = None, *,
                 on_output: Callable[[str, str, str], None] | None = None,
                 python: bool = False, args: Sequence[str] = (),
                 gpu_binding: str | None = None) -> Future:
    """Run ``cmd`` on every member of ``host_mesh`` (one process per host, or
    ``per_host`` processes per host); a Future of the largest exit code.

    ``cmd`` is a string (run with ``bash -c``) or an argv list (exec'd).
    ``rank`` (flat rank in the process mesh) or ``point`` (``{"hosts": 1}``; dims
    left out stay whole) restrict the run. ``on_output(label, stream, line)`` gets
    every output line on the controller (instead of the prefixed log forwarding).
    ``python=True`` treats ``cmd`` as a script or module run with the workers' Python
    and ``args`` (what :func:`exec_python` does). ``gpu_binding`` is ``spawn_procs``' (default
    ``$HPCMESH_GPU_BINDING``, else "host"), applied for each member's slot in the whole
    ``per_host`` extent even when the run is restricted. The processes started for the
    run are stopped before the Future resolves (also when it fails).
    """
    binding = choose_binding(gpu_binding)
    if python:
        _check_python_target(cmd, args)      # here, before any process starts
    per_host = dict(per_host or {})
    hosts, spawn_per_host, full, offsets = _restrict(host_mesh, per_host, rank, point)
    rt = client_runtime()
    port_ref = None
    if on_output is not None:
        def deliver(batch) -> None:
            label, stream, lines = batch
            for ln in lines:
                on_output(label, stream, ln)
        port_ref = rt.node.open_port(deliver)
    # "host": each actor sees all its host's GPUs and binds its command itself (its slot in
    # the whole per_host extent is not its slot among the processes a restricted run spawns)
    procs = hosts.spawn_procs(spawn_per_host, name="exec", forward_logs=on_output is None,
                              gpu_binding="host")
    actors = procs.spawn("bash", BashActor, full, offsets, list(per_host), binding)
    if python:
        if on_output is not None:
            call = actors.run_streaming.call(python_argv_remote(cmd, args), Port(port_ref), env,
                                             workdir, output_dir)
        else:
            call = actors.run_python.call(cmd, list(args), env, workdir, output_dir)
    elif on_output is not None:
        call = actors.run_streaming.call(cmd, Port(port_ref), env, workdir, output_dir)
    else:
        call = actors.run.call(cmd, env, workdir, output_dir)

    result = Future()

    def finished(f: Future) -> None:
        exc = f.exception()
        value = None if exc is not None else max(f.value().values(), default=0)

        def stopped(_s: Future) -> None:
            if port_ref is not None:
                rt.node.close_port(port_ref)
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result(value)
        procs.stop().add_done_callback(stopped)
    call.add_done_callback(finished)
    return result


def python_argv_remote(script_or_module: str, args: Sequence[str]) -> list[str]:
    """The command an actor process runs for ``exec_python(on_output=...)``."""
    # run_streaming execs an argv as given; a bare "python3" could be another interpreter,
    # so a tiny bash execs the actor process's own (exported as HPCMESH_PYTHON).
    def quoted(argv: list[str]) -> str:
        return " ".join(_shell_quote(a) for a in argv[1:])
    dashed = _dash_script(script_or_module)
    if dashed is not None:
        return ["bash", "-c", f'exec "$HPCMESH_PYTHON" {quoted(run_script_argv(dashed, args))}']
    run = run_module_argv if is_module_name(script_or_module) else run_script_argv
    return ["bash", "-c", f'exec "$HPCMESH_PYTHON" {quoted(run(script_or_module, args))}']


def _shell_quote(s: str) -> str:
    import shlex
    return shlex.quote(str(s))


def exec_python(host_mesh, script_or_module: str, args: Sequence[str] = (),
                **kwargs: Any) -> Future:
    """``exec_command`` for a Python script or module, run with the workers' interpreter.

    The name alone decides which: a dotted name of identifiers (``mypkg.train``) is a
    module; anything else (``train.py``, ``./train``) a script path, whatever files exist
    (an extensionless script is given as ``./name``). A name starting with '-' is always a script, run as ``./name``: no module name starts
    with '-', and bare, Python would take it for one of its options (``-c...``). A module
    runs as ``python -m`` runs it, except that the working directory's own modules are found
    after the installed ones, and only when nobody else could have planted or changed them
    (``private_files.modules``): a shared folder's ``sysconfig.py`` shadows nothing. A
    script's own folder is treated the same way (``python script`` would put it first)."""
    return exec_command(host_mesh, script_or_module, python=True, args=args, **kwargs)
