"""The host agent: starts processes on its host, watches them, forwards their output.

Runs inside the controller for ``this_host()`` and as ``hpcmesh worker`` on
remote hosts. Exits are observed through pidfds on the event loop (no reaper
threads); output is read from pipes, written to per-process log files (every line) and
forwarded to whoever asked for the process: one batch of lines per read, or, for processes
whose ``ProcMesh.logging_option`` set ``aggregate_window_sec``, alike lines of this host's
processes folded into one per window (``log_fold``); processes it filtered out of the
console send nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field

from .exit_actions import VAR as EXIT_ACTIONS_VAR, run_exit_actions
from ..observe import telemetry_recorder
from .bootstrap import (BOOTSTRAP_MODE_VAR, LOG_CHANNEL_VAR, PROCESS_NAME_VAR, TERM_NOTICE_VAR,
                        BootstrapCommand, build_environment, runs_entry_point,
                        unwrap_agent_python)
from ...private_files import RUNTIME_VAR, append_file, private_dir, runtime_dir
from ...settings import env_flag
from . import placement
from ..errors import (COLLECTIVE_TIMEOUT, NCCL_WATCHDOG_TIMEOUT, OUT_OF_MEMORY, SupervisionError,
                      describe_exit)
from ...log_tail import log_tail
from .gpu_binding import BINDING_VAR, SLOT_VAR, can_pin, gpu_env, gpu_indexes
from ..observe.introspect import dump_stacks_by_pyspy, dump_stacks_by_signal, remove_stack_file
from ..observe.log_fold import TimedFolders
from ..messages import (EVENT_AGENT_EXIT, EVENT_AGENT_NOTICE, EVENT_EXIT, EVENT_LOG,
                        EVENT_LOG_FOLDED, deliver_msg)
from ..node import Node, NodeRef, PortRef
from ..cast_relay import CastRelay
from .oom import AGE_S as OOM_AGE_S, OomWatch
from .zygote import ZygoteClient, ZygoteProcess

log = logging.getLogger("hpcmesh.agent")


#: How many exit codes of ended processes an agent keeps for a later stop_procs.
EXITED_KEPT = 4096
#: Drains of this host's processes that answered after their collection gave up, kept for
#: the next one (``telemetry_drain_host``), at most this many per process running here.
LATE_DRAINS_PER_PROC = 2
#: How much of the end of a process's stderr is read for NCCL's watchdog message (the C++
#: stack trace of the abort follows it).
WATCHDOG_TAIL_BYTES = 65536


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    events: PortRef | None
    pidfd: int = -1
    logs: dict = field(default_factory=dict)      # stream -> open file
    partial: dict = field(default_factory=dict)   # stream -> bytes not yet ending in newline
    open_streams: int = 0
    returncode: int | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    exit_actions: str = ""      # the file of what to undo once it is gone (exit_actions)
    forward: bool = True        # its lines go to ``events`` (else only to its log files)
    fold: tuple | None = None   # (events, group, window): its lines are folded there
    same_secret: bool = True    # started under this agent's secret: the agent can dial it
    node_id: str | None = None  # its node, once this agent has called it (telemetry, relay)
    oom_start: tuple | None = None  # its memory cgroup's OOM kill count at start (oom.py)
    #: other owners' events ports (``watch_procs``): actors that spawned actors on it
    watchers: list = field(default_factory=list)
    stop_asked: bool = False    # stop_procs named it: its end is on purpose
    secret: bytes | None = None  # what it was started under, where not this agent's secret


def process_cap_message(label: str, host: str, why: str) -> str:
    """Why a process could not be started when fork says EAGAIN, and what to do."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return (f"cannot start process {label} on host {host}: this user's process limit is "
            f"reached ({why}; RLIMIT_NPROC, ulimit -u, is {cap}, and counts every thread "
            f"of the user's processes); start fewer processes per host (per_host=) or raise "
            f"the limit")


class HostAgent:
    """Spawns and supervises processes for one host."""

    def __init__(self, node: Node, log_dir: str | None = None, advertise_host: str | None = None):
        self.node = node
        self.hostname = socket.gethostname()
        self.advertise_host = advertise_host or "127.0.0.1"
        self.log_dir = log_dir or os.path.join(os.environ.get("HPCMESH_LOG_DIR", ".hpcmesh/logs"))
        self.procs: dict[str, _Proc] = {}
        # exit codes of processes that ended before anyone asked to stop them: stop_procs
        # reports them too (bounded: the oldest are forgotten first)
        self.exited: dict[str, int | None] = {}
        self._by_pid: dict[int, _Proc] = {}      # zygote-forked processes, by pid
        self._oom = OomWatch()                   # which SIGKILLs were the OOM killer's
        node.call_soon(self._age_oom)
        self._zygote: ZygoteClient | None = None
        self._zygote_env: dict[str, str] = {}
        if env_flag("HPCMESH_ZYGOTE", True):
            node.call_soon(self._start_zygote)
        self._net_env: dict[str, str] | None = None
        node.services.update({
            "spawn_procs": self.spawn_procs,
            "reserve_master_port": self.reserve_port,
            "stop_procs": self.stop_procs,
            "watch_procs": self.watch_procs,
            "host_info": self.host_info,
            "dump_stacks": self.dump_stacks,
            "log_options": self.log_options,
            "telemetry_drain_host": self.telemetry_drain_host,
        })
        self._late_drains: list[dict] = []
        # calls fanned out to this host's processes, their answers folded (SPEC §11)
        self.relay = CastRelay(node, self._member_secret)
        # (events port, group, window) -> the open window of alike lines
        self._folds = TimedFolders(node.loop, self._send_folds)
        # the telemetry's process and GPU samples of this host (hpcmesh.telemetry)
        telemetry_recorder.install_service(node, sample_gpus=True)

    def host_info(self) -> dict:
        return {"hostname": self.hostname, "advertise_host": self.advertise_host,
                "pid": os.getpid(), "procs": len(self.procs)}

    def network_env(self) -> dict[str, str]:
        """NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (and NCCL_IB_HCA) for the interface this
        host advertises, unless this agent's environment sets them (SPEC §7)."""
        if self._net_env is None:
            env: dict[str, str] = {}
            try:
                from ...transport import netif
                cands = netif.rank_candidates(netif.list_interfaces(), None, os.environ)
                cand = next((c for c in cands if c.address == self.advertise_host),
                            cands[0] if cands else None)
                if cand is not None:
                    env = netif.socket_ifname_env(cand, os.environ)
            except Exception as e:  # noqa: BLE001 - NCCL/gloo then pick on their own
                log.warning("cannot choose the interface for NCCL/gloo: %s", e)
            self._net_env = env
        return self._net_env

    # -- spawning -------------------------------------------------------------------
    # -- the fork server ----------------------------------------------------------
    @property
    def zygote(self) -> "ZygoteClient | None":
        """The client of this host's fork server (None until it started, or where it
        could not start)."""
        return self._zygote

    def _start_zygote(self) -> None:
        try:
            self._zygote_env = dict(os.environ)
            self._zygote = ZygoteClient(self.node.loop, self._on_zygote_exit)
        except Exception as e:  # noqa: BLE001 - plain exec still works
            log.warning("fork server unavailable (%s); starting processes with exec", e)
            self._zygote = None

    def _use_zygote(self, cmd: BootstrapCommand, env: dict[str, str]) -> bool:
        """Only the default entry point, and only when nothing that is read at interpreter
        or loader start-up (PYTHON*, LD_*, MALLOC_*) differs from the zygote's."""
        z = self._zygote
        cmd = unwrap_agent_python(cmd, env)     # agent_bootstrap's shell: our own python
        if z is None or not z.alive or not runs_entry_point(cmd):
            return False
        try:
            # the same file is not enough: a venv's python is a symlink to its base
            # interpreter, and which venv it is comes from the path (pyvenv.cfg beside it)
            if not (os.path.samefile(cmd.program, sys.executable) and os.path.samefile(
                    os.path.dirname(cmd.program) or ".", os.path.dirname(sys.executable))):
                return False
        except OSError:
            return False
        startup = ("PYTHON", "LD_", "MALLOC_")
        keys = {k for k in (*env, *self._zygote_env) if k.startswith(startup)}
        return all(env.get(k) == self._zygote_env.get(k) for k in keys)

    def _on_zygote_exit(self, pid: int, returncode: int) -> None:
        p = self._by_pid.pop(pid, None)
        if p is None:
            return
        p.popen.returncode = returncode
        self._exited(p)

    def reserve_port(self) -> tuple[str, int]:
        """(address, free TCP port) on this host: MASTER_ADDR/MASTER_PORT for a mesh's
        torch.distributed users. The port is free now; whoever binds it first gets it."""
        host = self.advertise_host
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]

    async def spawn_procs(self, requests: list, controller: NodeRef, events: PortRef | None,
                    secret_hex: str, lease_grace: float, log_subdir: str) -> list:
        """Start processes. Each request is (name, BootstrapCommand, label[, mesh_env[,
        forward]]) where mesh_env are defaults under the user's env (RANK, WORLD_SIZE, ...)
        and ``forward`` False keeps its output in its log files only; returns
        [(name, pid, log_paths)]. A bad program fails the whole call with a clear error."""
        out = []
        started: list[_Proc] = []
        unpinned: list[str] = []
        # the logs and exit actions go where only this user can have put anything
        log_dir = private_dir(os.path.join(self.log_dir, log_subdir), top=self.log_dir,
                              private=False, what="the log folder")
        rt = runtime_dir()      # theirs too, even without our environment: their stack files
        try:
            for name, cmd, label, *rest in requests:
                mesh_env = rest[0] if rest else {}
                forward = bool(rest[1]) if len(rest) > 1 else True
                if not isinstance(cmd, BootstrapCommand):
                    raise TypeError(f"bootstrap command for {label} must be a BootstrapCommand, "
                                    f"got {type(cmd).__name__}")
                bootstrap_vars = {
                    BOOTSTRAP_MODE_VAR: "proc",
                    PROCESS_NAME_VAR: name,
                    LOG_CHANNEL_VAR: "stdio",
                    "HPCMESH_CONTROLLER": ",".join(controller.addresses),
                    "HPCMESH_CONTROLLER_ID": controller.node_id,
                    "HPCMESH_SECRET": secret_hex,
                    "HPCMESH_ADVERTISE_HOST": self.advertise_host,
                    "HPCMESH_LEASE_GRACE": str(lease_grace),
                    EXIT_ACTIONS_VAR: os.path.join(log_dir, f"{name}.exit-actions"),
                    RUNTIME_VAR: rt,
                }
                env = build_environment(cmd, os.environ, bootstrap_vars,
                                        {**self.network_env(), **mesh_env})
                if not self._assign_gpu(cmd, env, mesh_env):
                    unpinned.append(label)
                popen = None
                if self._use_zygote(cmd, env):
                    try:
                        popen = await self._zygote.spawn(env)
                    except OSError as e:
                        log.warning("fork server failed (%s); starting %s with exec", e, label)
                if popen is None:
                    popen = self._exec(cmd, env, label)
                same = secret_hex == self.node.secret.hex()
                p = _Proc(name, popen, events, exit_actions=bootstrap_vars[EXIT_ACTIONS_VAR],
                          forward=forward, same_secret=same,
                          secret=None if same else bytes.fromhex(secret_hex),
                          oom_start=self._oom.started(popen.pid))
                started.append(p)      # first: a failure while watching it still kills it
                self._watch(p, log_dir)
                out.append((name, popen.pid, {s: f.name for s, f in p.logs.items()}))
        except BaseException:
            for p in started:
                self._kill(p, signal.SIGKILL)
                for stream, pipe in (("stdout", p.popen.stdout), ("stderr", p.popen.stderr)):
                    if stream not in p.logs and pipe is not None:
                        pipe.close()     # nobody reads it: its log could not be opened
            raise
        if unpinned:
            gpus = self.gpus()
            log.warning("GPU binding 'process': host %s has %d GPU(s) (%s) for %d processes "
                        "(%s); they keep the host's list and LOCAL_RANK = their slot",
                        self.hostname, len(gpus), ",".join(gpus), len(unpinned),
                        " ".join(unpinned))
        return out

    def gpus(self) -> list[str]:
        """This host's GPUs as CUDA_VISIBLE_DEVICES entries: the agent's own
        CUDA_VISIBLE_DEVICES (what Slurm gave the step), else SLURM_STEP_GPUS /
        SLURM_JOB_GPUS (index lists, checked: a malformed one is a ValueError naming it),
        else the /dev/nvidiaN devices."""
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
        if value is not None:
            return [g for g in value.split(",") if g]
        for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
            value = os.environ.get(var)
            if value is not None and value.strip():
                return gpu_indexes(var, value)
        try:
            return sorted((n[6:] for n in os.listdir("/dev") if n.startswith("nvidia")
                           and n[6:].isdigit()), key=int)
        except OSError:
            return []

    def _assign_gpu(self, cmd: BootstrapCommand, env: dict[str, str], mesh_env: dict) -> bool:
        """Apply the mesh's GPU binding (``gpu_binding.gpu_env``) to this host's GPUs; False
        when "process" binding found fewer GPUs than processes (the caller warns once).

        Only for hpcmesh's own entry point and only if the user's command does not set
        CUDA_VISIBLE_DEVICES: a custom program or wrapper chooses for itself. A LOCAL_RANK
        or HPCMESH_LOCAL_SLOT the command sets (or removes) stays its own."""
        if "CUDA_VISIBLE_DEVICES" in cmd.env or not runs_entry_point(cmd):
            return True
        try:
            binding = mesh_env[BINDING_VAR]
            slot, per_host = int(mesh_env[SLOT_VAR]), int(mesh_env["LOCAL_WORLD_SIZE"])
        except (KeyError, ValueError):
            return True     # not spawned by HostMesh.spawn_procs: nothing to bind by
        gpus = self.gpus()
        env.update((k, v) for k, v in gpu_env(binding, slot, per_host, gpus).items()
                   if k not in cmd.env)
        return binding != "process" or not gpus or can_pin(per_host, gpus)

    def _exec(self, cmd: BootstrapCommand, env: dict[str, str], label: str) -> subprocess.Popen:
        try:
            with placement.spawning():
                return subprocess.Popen(cmd.argv(), env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        process_group=0, close_fds=True)   # as zygote._child
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"bootstrap program {cmd.program!r} for {label} does not exist on host "
                f"{self.hostname} ({e.strerror})") from None
        except PermissionError as e:
            raise PermissionError(
                f"bootstrap program {cmd.program!r} for {label} is not executable on host "
                f"{self.hostname} ({e.strerror})") from None
        except BlockingIOError as e:        # fork's EAGAIN: this user's process cap
            raise BlockingIOError(e.errno, process_cap_message(label, self.hostname,
                                                               e.strerror)) from None

    def _watch(self, p: _Proc, log_dir: str) -> None:
        loop = self.node.loop
        self.procs[p.name] = p
        # The exit first: if a log file cannot be opened below (out of file descriptors),
        # the process is killed, and its exit must still be seen and reported.
        if isinstance(p.popen, ZygoteProcess):
            self._by_pid[p.popen.pid] = p      # the zygote, its parent, reports the exit
        else:
            try:
                p.pidfd = os.pidfd_open(p.popen.pid)
                loop.add_reader(p.pidfd, self._on_exit, p)
            except (AttributeError, OSError):
                loop.create_task(self._poll_exit(p))
        for stream, pipe in (("stdout", p.popen.stdout), ("stderr", p.popen.stderr)):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            p.logs[stream] = append_file(os.path.join(log_dir, f"{p.name}.{stream[3:]}"),
                                         top=self.log_dir, what="the log file", mode=0o644)
            p.open_streams += 1
            loop.add_reader(fd, self._on_output, p, stream, pipe)

    def _on_output(self, p: _Proc, stream: str, pipe) -> None:
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.node.loop.remove_reader(pipe.fileno())
            pipe.close()
            rest = p.partial.pop(stream, b"")
            if rest:
                self._forward(p, stream, [rest])
            p.logs[stream].close()
            p.open_streams -= 1
            if p.open_streams == 0 and p.returncode is not None:
                self._report_exit(p)
            return
        p.logs[stream].write(data)
        buf = p.partial.get(stream, b"") + data
        *lines, tail = buf.split(b"\n")
        p.partial[stream] = tail
        if lines:
            self._forward(p, stream, lines)

    def _forward(self, p: _Proc, stream: str, lines: list[bytes]) -> None:
        if p.events is None or not p.forward:
            return
        text = [ln.decode("utf-8", "replace") for ln in lines]
        if p.fold is not None:
            for t in text:
                self._folds.add(p.fold, p.fold[2], stream, t, (p.name,))
            return
        try:
            self.node.send(p.events.node, deliver_msg(p.events.port_id,
                                                      (EVENT_LOG, p.name, stream, text)))
        except Exception:  # noqa: BLE001 - the controller is gone; the file still has it
            pass

    def _member_secret(self, name: str, node_id: str) -> bytes | None:
        """The relay dials process ``name`` (node ``node_id``) with this; the node is kept,
        so that what this agent awaits from it fails as soon as it exits."""
        p = self.procs.get(name)
        if p is None:
            return None
        p.node_id = node_id
        return p.secret

    # -- telemetry: one answer per host ---------------------------------------------
    async def telemetry_drain_host(self, procs: list, timeout: float) -> dict:
        """This host's telemetry in one answer, so that the controller's collector makes one
        call per host, not one per process: ``drains``, this agent's own drain and those of
        ``procs`` ([(name, NodeRef)], processes of this agent), each asked over its Unix
        socket and waited for at most ``timeout`` s (one that answers later goes with the
        next answer); ``missed``, the names this agent cannot ask (not its processes, or
        started under another secret than its own): the controller asks those itself."""
        node = self.node
        missed, asks = [], []
        for name, ref in procs:
            p = self.procs.get(name)
            if p is not None and p.returncode is not None:
                continue        # ended: what it had is gone with it
            if p is None or not p.same_secret or not isinstance(ref, NodeRef):
                missed.append(name)
            else:
                p.node_id = ref.node_id
                asks.append(node.rpc(ref, "telemetry_drain", True))
        drains, self._late_drains = self._late_drains, []
        drains.append(node.services["telemetry_drain"]())
        waits = [f.as_asyncio() for f in asks]
        if waits:
            await asyncio.wait(waits, timeout=max(0.0, float(timeout)))
        for f, w in zip(asks, waits):
            if not w.done():
                w.cancel()
                f.add_done_callback(self._keep_late_drain)
            elif w.exception() is None:     # (failed: gone or stopping; nothing to send)
                drains.append(w.result())
        return {"drains": drains, "missed": missed}

    def _keep_late_drain(self, f) -> None:
        if f.exception() is None:
            late = self._late_drains
            late.append(f.value())
            del late[:max(0, len(late) - LATE_DRAINS_PER_PROC * max(1, len(self.procs)))]

    # -- folding alike lines (logging_option's aggregate_window_sec) -----------------
    def log_options(self, procs: list, window: float | None, group: str) -> int:
        """Set how these processes' output reaches their controller: ``procs`` is
        [(name, shown)], ``shown`` False keeps a process's lines in its files only (the
        console's rank filter); ``window`` seconds folds the alike lines of ``group`` (its
        mesh) on this host, None sends each batch as it is read. What was folded under the
        old settings goes out first. Returns how many of them run here."""
        if window is not None and (isinstance(window, bool) or not isinstance(
                window, (int, float)) or not 0 <= window < float("inf")):
            raise ValueError(f"log_options: window {window!r} must be seconds >= 0, or None")
        n = 0
        for name, shown in procs:
            p = self.procs.get(name)
            if p is None:
                continue
            if p.fold is not None:
                self._folds.flush(p.fold)
            p.forward = bool(shown)
            p.fold = None if window is None or p.events is None else (
                p.events, str(group), float(window))
            n += 1
        return n

    @property
    def folding(self) -> bool:
        """Whether a window of folded lines is open (lines not sent yet)."""
        return bool(self._folds)

    def flush_logs(self) -> None:
        """Send every open window now (this agent, or the client it lives in, ends)."""
        self._folds.flush_all()

    def _send_folds(self, key: tuple, folds: list) -> None:
        """What a window of ``key`` folded, to the controller (at its end, or a process of
        it ended, or its settings change, or this agent ends)."""
        events, _group, window = key
        try:
            self.node.send(events.node, deliver_msg(events.port_id, (
                EVENT_LOG_FOLDED, window,
                [(f.stream, f.text, f.count, list(f.ranks)) for f in folds])))
        except Exception:  # noqa: BLE001 - the controller is gone; the files still have it
            pass

    def _on_exit(self, p: _Proc) -> None:
        self.node.loop.remove_reader(p.pidfd)
        os.close(p.pidfd)
        p.pidfd = -1
        p.popen.wait()
        self._exited(p)

    def _exited(self, p: _Proc) -> None:
        p.returncode = p.popen.returncode
        self._forget_node(p)
        self._kill_leftovers(p)
        if p.open_streams == 0:
            self._report_exit(p)
        else:
            # Give the pipes a moment to drain so the last lines come before the exit report.
            self.node.loop.call_later(0.2, self._report_exit, p)

    async def _poll_exit(self, p: _Proc) -> None:
        while p.popen.poll() is None:
            await asyncio.sleep(0.05)
        p.returncode = p.popen.returncode
        self._forget_node(p)
        self._kill_leftovers(p)
        self._report_exit(p)

    def _forget_node(self, p: _Proc) -> None:
        """What this agent awaits from a process that ended fails now, with the reason (a
        drain of it would otherwise wait out the grace a lost connection gets for an exit
        report, and hold the answer of its whole host)."""
        if p.node_id is not None:
            self.node.fail_peer(p.node_id, SupervisionError(
                f"process {p.name} on host {self.hostname} ended: "
                f"{describe_exit(p.returncode)}"))

    @staticmethod
    def _kill_leftovers(p: _Proc) -> None:
        """The process is gone (stopped, crashed, SIGKILLed): so is whatever it started and
        left in its process group (a subprocess of an actor, its children). The group
        outlives its leader only through such members, so its id cannot have been reused.
        A program that must outlive the mesh has to leave the group itself (setsid). What
        it left in the host's namespace (a mount) is undone by its exit actions."""
        try:
            os.killpg(p.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.exit_actions:
            run_exit_actions(p.exit_actions)

    def _report_exit(self, p: _Proc) -> None:
        if p.exited.is_set():
            return
        p.exited.set()
        self.relay.flush_all()      # what it answered before it ended goes first
        cause = self._exit_cause(p)
        log.info("process %s (pid %d) ended: %s%s", p.name, p.popen.pid,
                 describe_exit(p.returncode), f"; {cause[1]}" if cause else "")
        if p.fold is not None:
            self._folds.flush(p.fold)    # its last lines come before its exit
        for port in ([p.events] if p.events is not None else []) + p.watchers:
            try:
                self.node.send(port.node, deliver_msg(port.port_id, (
                    EVENT_EXIT, p.name, p.popen.pid, p.returncode, self.hostname, cause,
                    p.stop_asked)))
            except Exception:  # noqa: BLE001 - that owner is gone
                pass
        self.procs.pop(p.name, None)
        remove_stack_file(p.popen.pid)
        self.exited[p.name] = p.returncode
        while len(self.exited) > EXITED_KEPT:
            self.exited.pop(next(iter(self.exited)))

    def _age_oom(self) -> None:
        """The OOM kills counted are fresh for ``oom.AGE_S`` only (see oom.py)."""
        self._oom.age()
        self.node.loop.call_later(OOM_AGE_S, self._age_oom)

    def _exit_cause(self, p: _Proc) -> tuple[str, str] | None:
        """(failure class, why) of a death by a signal that this host can explain: the
        kernel's OOM killer (``oom.py``), or NCCL's watchdog, which aborts a process whose
        collective timed out and says so on its stderr; None for any other end."""
        oom = self._oom.ended(p.oom_start, p.returncode)
        if oom:
            return OUT_OF_MEMORY, oom
        if p.returncode is not None and p.returncode < 0 and "stderr" in p.logs and \
                NCCL_WATCHDOG_TIMEOUT in log_tail(p.logs["stderr"].name, 1000,
                                                  max_bytes=WATCHDOG_TAIL_BYTES):
            return COLLECTIVE_TIMEOUT, "NCCL's watchdog took it down: a collective timed out " \
                "(its stderr says so)"
        return None

    async def dump_stacks(self, name: str, tool: str = "faulthandler", native: bool = False) -> str:
        """The admin view's fallbacks when a process's loop does not answer: its stacks as
        ``py-spy dump`` reads them from outside (``tool="py-spy"``, ``native``: its
        ``--native``), or as faulthandler writes them on a signal (see ``introspect``)."""
        p = self.procs.get(name)
        if p is None:
            raise LookupError(f"host {self.hostname} runs no process {name!r} (now)")
        if tool == "py-spy":
            return await dump_stacks_by_pyspy(p.popen.pid, native=native)
        if tool != "faulthandler":
            raise ValueError(f"no stack tool {tool!r}: py-spy or faulthandler")
        return await dump_stacks_by_signal(p.popen.pid)

    def watch_procs(self, names: list[str], port: PortRef) -> dict:
        """``port`` (the events port of an actor's process that spawned actors on these
        processes, which it does not own) hears of their exits too, as their owner does:
        that actor supervises its actors (SPEC §3). The processes of ``names`` that have
        ended already: {name: exit code}, for the caller to report at once."""
        ended = {}
        for n in names:
            p = self.procs.get(n)
            if p is None or p.exited.is_set():
                if n in self.exited:
                    ended[n] = self.exited[n]
            elif port not in p.watchers:
                p.watchers.append(port)
        return ended

    # -- stopping -------------------------------------------------------------------
    async def stop_procs(self, names: list[str], grace: float = 5.0) -> dict:
        """Stop processes: wait up to ``grace`` for them to exit (the controller has asked
        them to), then SIGTERM (SIGHUP where SIGTERM is a notice: ``TERM_NOTICE_VAR``), then
        SIGKILL; returns their exit codes."""
        procs = [self.procs[n] for n in names if n in self.procs]
        for p in procs:
            p.stop_asked = True
        gone = {n: self.exited[n] for n in names if n not in self.procs and n in self.exited}
        await self._wait_exited(procs, grace)
        stop = signal.SIGHUP if os.environ.get(TERM_NOTICE_VAR) else signal.SIGTERM
        for sig, wait in ((stop, min(max(grace, 0.5), 2.0)), (signal.SIGKILL, 5.0)):
            left = [p for p in procs if p.returncode is None]
            if not left:
                break
            log.info("sending %s to %d process(es) that did not stop", sig.name, len(left))
            for p in left:
                self._kill(p, sig)
            await self._wait_exited(left, wait)
        for p in procs:
            if p.returncode is None:
                log.error("process %s (pid %d) did not die after SIGKILL", p.name, p.popen.pid)
        return {**gone, **{p.name: p.returncode for p in procs}}

    @staticmethod
    async def _wait_exited(procs: list[_Proc], timeout: float) -> None:
        waits = [asyncio.ensure_future(p.exited.wait()) for p in procs if not p.exited.is_set()]
        if not waits:
            return
        if timeout > 0:
            await asyncio.wait(waits, timeout=timeout)
        for w in waits:
            w.cancel()

    def _kill(self, p: _Proc, sig: int) -> None:
        try:
            os.killpg(p.popen.pid, sig)   # the process and anything it started in its group
        except ProcessLookupError:
            pass    # the group exists from before the pid is known (see zygote.py): all gone
        except PermissionError:
            try:
                p.popen.send_signal(sig)
            except OSError:
                pass

    def announce_exit(self, reason: str) -> None:
        """Tell each controller with processes here that this agent is ending (a stop
        signal, its lease, its HostMesh's shutdown) and takes them along. An agent that
        just vanishes says nothing: its controllers count its host as lost."""
        self.flush_logs()                # the folded lines come before the news
        self._tell_controllers(EVENT_AGENT_EXIT, reason)

    def announce_notice(self, what: str) -> None:
        """Tell each controller with processes here of a notice this agent got (``what``;
        SIGTERM in a Slurm step), now: it asks its job whether it moved (a scancel, a time
        limit) or only will (a preemption's GraceTime). The agent and its processes go on."""
        self._tell_controllers(EVENT_AGENT_NOTICE, what)

    def _tell_controllers(self, kind: str, why: str) -> None:
        """(kind, this agent's node id, host, why) to each controller with processes here."""
        ports = {p.events for p in self.procs.values() if p.events is not None}
        for port in ports:
            try:
                self.node.send(port.node, deliver_msg(port.port_id, (
                    kind, self.node.node_id, self.hostname, why)))
            except Exception:  # noqa: BLE001 - that controller is gone already
                pass

    def kill_all(self, reason: str | None = None) -> None:
        """Synchronously SIGKILL every child and the fork server (used at exit). With a
        ``reason``, whoever asked for those processes is told first that this agent ends
        on purpose, and why: their end is then no lost host (see ``announce_exit``)."""
        if reason is not None:
            self.announce_exit(reason)
        for p in list(self.procs.values()):
            if p.popen.poll() is None:
                self._kill(p, signal.SIGKILL)
            remove_stack_file(p.popen.pid)    # no exit report comes for these
            if p.exit_actions:                # nor an exit: undo its leftovers now
                run_exit_actions(p.exit_actions)
        if self._zygote is not None:
            self._zygote.close()
