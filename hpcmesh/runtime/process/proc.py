"""Entry point of an actor process (``python -P -m hpcmesh.runtime.proc``, its public name:
``runtime/proc.py`` runs :func:`main`; the fork server calls it in a forked child).

Started by a host agent with the bootstrap variables; it listens (Unix socket
plus TCP on the host's chosen address), dials the controller, hosts actors,
and exits when told to stop or when the controller has been gone longer than
the lease grace period.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys

from ...private_files.modules import current_folder_last
from ...settings import env_number, log_level
from ...transport.addresses import secret_from_env
from ...transport.connection import retry_pauses
from ..actor_services import ActorServices
from .bootstrap import PROCESS_NAME_VAR, TERM_NOTICE_VAR
from ..future import register_loop_thread
from ..observe.introspect import install_services, install_stack_dump_handler
from .lease_watchdog import LeaseWatchdog
from ..observe import debugger, telemetry_recorder
from .tuning import tune_malloc
from .oom import offer_to_oom_killer
from ..loop import new_event_loop
from ..links import CannotConnect
from ..node import Node, NodeRef, set_current_node

log = logging.getLogger("hpcmesh.proc")

#: Seconds a process tries to reach its controller, which waits for it, before it gives up.
#: One that is gone refuses at once; a busy one (hundreds of processes dialing back at once
#: on a loaded machine) turns dialers away for a while (BUSY, retried) or answers slowly: a
#: spawn of 64 x 8 processes on this 2-core VM with two CPU hogs took 24 s.
CONNECT_TIMEOUT = 60.0


class ProcRuntime:
    """Services a worker process offers to the controller."""

    def __init__(self, node: Node, controller: NodeRef, grace: float):
        self.node = node
        self.controller = controller
        self.grace = grace
        self.done = asyncio.Event()
        self.exit_code = 0
        self._lease_timer: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Task | None = None
        self.actor_services = ActorServices.attach(node)
        node.services.update({
            "stop": self.stop,
            "ping": lambda: os.getpid(),
            "set_log_level": lambda level: logging.getLogger().setLevel(level),
        })
        install_services(node)        # the admin view: actors and stacks (introspect.py)
        telemetry_recorder.install_service(node)   # hpcmesh.telemetry drains it
        debugger.install(node)        # breakpoint() in an endpoint: `hpcmesh debug`
        node.on_peer_closed.append(self._on_peer_closed)
        node.on_peer_hello.append(self._on_peer_hello)
        self._controller_seen = False
        # the lease again, on a thread: it holds while an endpoint blocks the loop
        self.watchdog = LeaseWatchdog(grace, self.controller_fd, what=f"hpcmesh proc {node.name}",
                                      parent=os.getppid()).start()

    def controller_fd(self) -> int | None:
        """The socket fd of the connection to the controller now (the watchdog's thread
        reads it): None before the first hello, -1 while there is none."""
        p = self.node.peers.get(self.controller.node_id)
        conn = p.conn if p is not None else None
        if conn is None:
            return -1 if self._controller_seen else None
        try:
            return conn.sock.fileno()
        except (OSError, AttributeError):
            return -1

    # -- lease --------------------------------------------------------------------
    def _on_peer_closed(self, node, peer_id, exc) -> None:
        if node.closed or self.done.is_set():
            return
        if peer_id == self.controller.node_id and self._lease_timer is None:
            log.warning("lost the controller; exiting in %.1f s unless it returns", self.grace)
            self._lease_timer = node.loop.call_later(self.grace, self._lease_expired)

    def _on_peer_hello(self, node, ref, info, conn) -> None:
        if ref.node_id == self.controller.node_id:
            self._controller_seen = True
        if ref.node_id == self.controller.node_id and self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _lease_expired(self) -> None:
        self._lease_timer = None
        if not self.node.peer_connected(self.controller.node_id):
            self.exit_code = 3
            self.done.set()     # first: stderr may be a pipe to the dead controller (EPIPE)
            try:
                print(f"hpcmesh: controller gone for {self.grace} s, exiting", file=sys.stderr,
                      flush=True)
            except (OSError, ValueError):
                pass

    # -- services -------------------------------------------------------------------
    async def stop(self, quietly: bool = False) -> int:
        await self.actor_services.stop_actors(list(self.node.actors), quietly)
        for hook in list(self.node.on_stop):
            hook()             # e.g. the ClientRuntime: processes our actors started go with us
        self.node.loop.call_later(0.02, self.done.set)
        return os.getpid()

    def on_sigterm(self, signum: int = signal.SIGTERM) -> None:
        """SIGTERM (the agent's force-stop, Slurm's end of job; SIGHUP where SIGTERM is a
        notice, ``TERM_NOTICE_VAR``): stop cleanly, then exit. The calls in flight get no
        answer from here: why they end is the controller's to say (the job was requeued,
        the mesh was stopped, ...; SPEC §12), from this exit."""
        if self._stopping is None and not self.done.is_set():
            self.exit_code = 128 + signum
            self._stopping = self.node.loop.create_task(self.stop(quietly=True))

    @staticmethod
    def on_term_notice() -> None:
        """SIGTERM in a Slurm step: the job is being preempted or ended, SIGKILL follows
        after the grace; keep running (the agent told the controller) so the program can
        checkpoint."""
        print(f"hpcmesh process {os.environ.get(PROCESS_NAME_VAR, os.getpid())}: received "
              f"SIGTERM in a Slurm step (a preemption, or the job's end): going on until "
              f"stopped", file=sys.stderr, flush=True)


async def reach_controller(node: Node, addresses: list[str], expect: str | None,
                           timeout: float) -> None:
    """Connect to the controller, which waits for this process: while its listeners turn
    this process away (``CannotConnect.turned_away``: hundreds of processes dialing back at
    once on a busy machine meet the flood defence's cap, which closes connections for
    room, some after their side of the handshake is done), try again after a pause
    (``retry_pauses``), until ``timeout``; then, or at any other failure, raise
    ConnectionError naming why."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pauses, tries = retry_pauses(), 0
    while True:
        tries += 1
        try:
            await node.connect_first(addresses, expect=expect,
                                     timeout=max(0.1, deadline - loop.time()))
            return
        except CannotConnect as e:
            if not e.turned_away:       # refused (the controller is gone), unreachable, ...
                raise
            wait = next(pauses)
            if loop.time() + wait >= deadline:
                raise ConnectionError(
                    f"{e}; turned away {tries} times in {timeout:g} s (the controller's "
                    f"listeners at their cap of connections in their handshake, or this "
                    f"process started with another secret than the controller's)") from None
            log.debug("the controller turned this process away (try %d): %s; trying again "
                      "in %.2f s", tries, e, wait)
            await asyncio.sleep(wait)


async def _amain() -> int:
    env = os.environ
    secret = secret_from_env(env)
    if secret is None:
        print("hpcmesh proc: no HPCMESH_SECRET/HPCMESH_SECRET_FILE in the environment; "
              "this entry point is started by a host agent", file=sys.stderr)
        return 2
    name = env.get(PROCESS_NAME_VAR, f"proc-{os.getpid()}")
    controller_addrs = [a for a in env.get("HPCMESH_CONTROLLER", "").split(",") if a]
    controller = NodeRef(env.get("HPCMESH_CONTROLLER_ID", ""), tuple(controller_addrs))
    host = env.get("HPCMESH_ADVERTISE_HOST", "127.0.0.1")
    grace = env_number("HPCMESH_LEASE_GRACE", 10, env=env, finite=True)
    loop = asyncio.get_running_loop()
    register_loop_thread(loop)
    node = Node(secret, loop, role="proc", name=name,
                info={"proc_name": name, "advertise_host": host})
    node.listen([node.unix_address(), f"tcp://{host}:0"])
    set_current_node(node)
    rt = ProcRuntime(node, controller, grace)
    if env.get(TERM_NOTICE_VAR):
        loop.add_signal_handler(signal.SIGTERM, rt.on_term_notice)
        loop.add_signal_handler(signal.SIGHUP, rt.on_sigterm, signal.SIGHUP)
    else:
        loop.add_signal_handler(signal.SIGTERM, rt.on_sigterm)
    install_stack_dump_handler()    # stacks even while an endpoint blocks the loop
    # A SIGTERM while still connecting (a mesh stopped as it starts) ends the process now:
    # there are no actors to clean up yet.
    connecting = asyncio.ensure_future(
        reach_controller(node, controller_addrs, controller.node_id or None, CONNECT_TIMEOUT))
    stopped = asyncio.ensure_future(rt.done.wait())
    await asyncio.wait((connecting, stopped), return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
    elif connecting.exception() is not None:
        stopped.cancel()
        e = connecting.exception()
        if not isinstance(e, ConnectionError):
            raise e
        print(f"hpcmesh proc {name}: cannot reach the controller: {e}", file=sys.stderr)
        return 4
    await stopped
    node.close()
    return rt.exit_code


#: Seconds a process stopped cleanly gets for Python's own exit (its finalizers, threads it
#: started that are not daemons) before it ends regardless, its stacks on stderr.
FINALIZE_S = 5.0


def _end_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What is left on the loop is cancelled and the loop closed, as ``asyncio.run`` ends
    (no "Task was destroyed but it is pending!" at the interpreter's exit)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def main() -> None:
    # What is here before any actor (hpcmesh, the standard library: imported once by the
    # zygote) is left out of every garbage collection, the one of Python's exit included:
    # that exit, where finalizers run (a clean stop), took ~22 ms of CPU for a process that
    # imported hpcmesh, ~5 ms so (this VM); the user's objects are collected as ever.
    gc.freeze()
    code = 1
    loop = None
    try:
        # started with -P (forked by the zygote: it was): the user's modules of the current
        # folder, which actors defined there import, are found last and checked instead
        current_folder_last()
        if os.environ.get("HPCMESH_LOG_CHANNEL"):
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
        logging.basicConfig(level=log_level(),
                            format="%(levelname)s %(name)s: %(message)s")
        tune_malloc()
        offer_to_oom_killer()
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(_amain())
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - report, then still exit below
        try:
            import traceback
            traceback.print_exc()
        except Exception:  # noqa: BLE001
            pass
    finally:
        # Never hang on exit: a sync endpoint may still be running in an actor thread
        # (interpreter shutdown would join it), and stdout may be a pipe to a dead reader.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        if code == 0 and loop is not None:
            # Stopped cleanly: Python's own exit, so its finalizers run (the __del__ of a
            # module global, as in Monarch), bounded by FINALIZE_S (faulthandler's timer is
            # a C thread: it fires even while the exit waits for a thread or a finalizer).
            faulthandler.dump_traceback_later(FINALIZE_S, exit=True)
            try:
                _end_loop(loop)
            except BaseException:  # noqa: BLE001 - the exit goes on
                pass
            sys.exit(0)
        os._exit(code)


if __name__ == "__main__":
    main()
