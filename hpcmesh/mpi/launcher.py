"""The launcher every MPI rank runs (``python -m hpcmesh.mpi``, see the package's docstring):
boot a proc node, exchange addresses with MPI collectives, serve, and on rank 0 write the
address file and/or run the controller's script; then ``MPI_Finalize`` and exit."""

from __future__ import annotations

import argparse
import json
import logging
import os
import runpy
import socket
import sys
import time
import traceback

from ..private_files import write_file
from ..runtime.client import ClientRuntime, install_client_runtime
from ..runtime.node import Node, NodeRef, set_current_node
from ..settings import env_number, log_level
from ..shapes import Extent, Point
from ..transport.addresses import new_secret
from .attach import Launch, begin_launch, build_mesh, connect_all
from .layout import ADDRESS_FILE_FORMAT, LayoutError, MPILayout, RankEntry, compute_layout
from .rank import MPIProcRuntime, RankZeroAgent

log = logging.getLogger("hpcmesh.mpi")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    script_args: list[str] = []
    if "--script" in argv:
        i = argv.index("--script")
        argv, script_args = argv[:i + 2], argv[i + 2:]
    p = argparse.ArgumentParser(
        prog="python -m hpcmesh.mpi",
        description="Run under mpiexec/srun: every MPI rank becomes a process of a ProcMesh.",
        epilog="Everything after `--script PATH` is passed to the script.")
    p.add_argument("--script", help="mode A: rank 0 runs this script as the controller; "
                   "hpcmesh.mpi.mpi_proc_mesh() there returns the mesh of all ranks")
    p.add_argument("--address-file", help="mode B: rank 0 writes the job's secret and "
                   "addresses here (mode 0600) for hpcmesh.mpi.attach_to_mpi()")
    p.add_argument("--attach-timeout", type=float,
                   default=env_number("HPCMESH_MPI_ATTACH_TIMEOUT", 120),
                   help="exit if no controller connects within this many seconds (default "
                   "%(default)s, env HPCMESH_MPI_ATTACH_TIMEOUT)")
    p.add_argument("--grace", type=float, default=None,
                   help="lease grace period in seconds (default HPCMESH_LEASE_GRACE or 10)")
    p.add_argument("--ragged", choices=("error", "flat"), default="error",
                   help="when nodes have different numbers of ranks: refuse (default) or "
                   "make a 1-D {'ranks': N} mesh")
    args = p.parse_args(argv)
    args.script_args = script_args
    if not args.script and not args.address_file:
        p.error("give --script (rank 0 is the controller) and/or --address-file (an outside "
                "client attaches)")
    return args


def _choose_host() -> tuple[str, dict]:
    from ..transport import netif
    ifname = os.environ.get(netif.ENV_IFNAME) or None
    cand = netif.usable_candidates(ifname=ifname,
                                   source=netif.ENV_IFNAME if ifname else "config")[0]
    return cand.address, netif.socket_ifname_env(cand, os.environ)


def _write_address_file(path: str, secret: bytes, layout: MPILayout, agent: NodeRef) -> None:
    procs = []
    for i, e in enumerate(layout.by_flat_rank()):
        procs.append({"rank": i, "point": Point(i, Extent(layout.extent)).coords,
                      "world_rank": e.world_rank, "host": e.host, "pid": e.pid,
                      "node_id": e.node_id, "addresses": list(e.addresses),
                      "local_rank": e.local_rank, "local_size": e.local_size,
                      "leader": e.leader})
    data = {"format": ADDRESS_FILE_FORMAT, "secret": secret.hex(), "extent": layout.extent,
            "world_size": len(layout.entries), "hosts": list(layout.hosts),
            "agent": {"node_id": agent.node_id, "addresses": list(agent.addresses)},
            "procs": procs, "created": time.time(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_step_id": os.environ.get("SLURM_STEP_ID")}
    write_file(os.path.abspath(path), json.dumps(data, indent=1).encode(),
               what="the MPI address file")


def _remove_address_file(path: str, secret: bytes) -> None:
    try:
        with open(path) as f:
            if json.load(f).get("secret") != secret.hex():
                return      # someone else's file by now
        os.unlink(path)
    except (OSError, ValueError):
        pass


class _Rank:
    """One MPI rank from boot to MPI_Finalize."""

    def __init__(self, args: argparse.Namespace, MPI):
        self.args = args
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.node: Node | None = None
        self.rt: MPIProcRuntime | None = None
        self.agent_ref: NodeRef | None = None
        self.launch: Launch | None = None

    def _all_ok(self, error: str | None, what: str) -> bool:
        """Collective: every rank learns whether any rank failed ``what``."""
        errors = self.comm.allgather(error)
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad and self.rank == 0:
            for r, e in bad:
                print(f"hpcmesh.mpi: rank {r} failed {what}: {e}", file=sys.stderr, flush=True)
        return not bad

    def run(self) -> int:
        args = self.args
        t0 = time.monotonic()
        # 1. the secret (and rank 0's argument checks), broadcast from rank 0
        problem = None
        if self.rank == 0 and args.script and not os.path.isfile(args.script):
            problem = f"script {args.script!r} does not exist"
        secret, problem = self.comm.bcast((new_secret(), problem) if self.rank == 0 else None, 0)
        if problem:
            if self.rank == 0:
                print(f"hpcmesh.mpi: {problem}", file=sys.stderr, flush=True)
            return self._finish(2)
        grace = args.grace if args.grace is not None else \
            env_number("HPCMESH_LEASE_GRACE", 10, finite=True)
        # 2. a proc node on every rank
        error = None
        try:
            host, ifenv = _choose_host()
            os.environ.update(ifenv)
            name = f"mpi-rank{self.rank}"
            self.node = Node.start_in_thread(secret, role="proc", name=name, info={
                "proc_name": name, "mpi_rank": self.rank, "advertise_host": host})
            url = f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0"
            node = self.node

            async def setup() -> MPIProcRuntime:
                node.listen([node.unix_address(), url])
                return MPIProcRuntime(node, self.rank, grace,
                                      args.attach_timeout if args.attach_timeout > 0 else None)
            self.rt = node.run_sync(setup(), 30)
        except Exception as e:  # noqa: BLE001 - reported collectively below
            error = f"{type(e).__name__}: {e}"
        if not self._all_ok(error, "to start its node"):
            return self._finish(2)
        # 3. the layout and everyone's addresses
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        leader = local.allreduce(self.rank, op=self.MPI.MIN)
        me = RankEntry(self.rank, socket.gethostname(), self.node.node_id, self.node.addresses,
                       os.getpid(), local.Get_rank(), local.Get_size(), leader)
        local.Free()
        entries = self.comm.allgather(me)
        # mpi4py's pickle-based reductions (allreduce, reduce, scan, exscan) duplicate the
        # communicator on first use -- a collective MPI_Comm_dup made *with the GIL held*.
        # Done first inside an actor it would block this process's event loop (and, on
        # rank 0 in --script mode, the controller) until every rank got there. Do it now,
        # while every rank is here anyway.
        self.comm.allreduce(0)
        try:
            layout = compute_layout(entries, args.ragged)
        except LayoutError as e:
            if self.rank == 0:
                print(f"hpcmesh.mpi: {e}", file=sys.stderr, flush=True)
            return self._finish(2)
        agent = entries[0].ref
        point = layout.point_of(self.rank)
        self.rt.info = {"world_rank": self.rank, "world_size": self.size,
                        "local_rank": me.local_rank, "local_size": me.local_size,
                        "host": me.host, "pid": me.pid, "point": point.coords,
                        "extent": dict(layout.extent)}
        set_current_node(self.node)
        # 4. rank 0 is the job's agent; the others connect to it so it sees them go
        error = None
        try:
            if self.rank == 0:
                async def make_agent() -> None:
                    self.rt.agent = RankZeroAgent(self.rt, layout)
                self.node.run_sync(make_agent(), 10)
            else:
                self.node.run_sync(connect_all(self.node, [entries[0]], None, 30), 40)
                self.agent_ref = agent
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
        if not self._all_ok(error, "to connect to rank 0"):
            return self._finish(2)
        if args.address_file:
            error = None
            if self.rank == 0:
                try:
                    _write_address_file(args.address_file, secret, layout, agent)
                except OSError as e:
                    error = f"cannot write {args.address_file}: {e}"
            if not self._all_ok(error, "to write the address file"):
                return self._finish(2)
        if self.rank == 0:
            log.info("MPI mesh %s of %d ranks booted in %.2f s", layout.extent, self.size,
                     time.monotonic() - t0)
        # 5. serve (and on rank 0 in mode A, run the controller)
        code = 0
        if self.rank == 0 and args.script:
            code = self._run_controller(layout, agent, secret)
        self.node.run_sync(self.rt.done.wait())
        if self.rank == 0 and args.address_file:
            _remove_address_file(args.address_file, secret)
        return self._finish(code or self.rt.exit_code)

    def _run_controller(self, layout: MPILayout, agent: NodeRef, secret: bytes) -> int:
        script = os.path.abspath(self.args.script)
        self.launch = begin_launch(layout, agent, secret)
        rt = install_client_runtime(secret)   # a fresh process: it has no client runtime yet
        code = 0
        try:
            rt.node.run_sync(connect_all(rt.node, layout.entries, None, 30), 40)
            sys.argv = [script, *self.args.script_args]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            print("hpcmesh.mpi: interrupted; stopping the ranks", file=sys.stderr)
            code = 130
        except BaseException:  # noqa: BLE001 - the script failed; still stop the ranks
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                self._stop_all(rt)
            except BaseException as e:  # noqa: BLE001
                print(f"hpcmesh.mpi: stopping the ranks failed: {e}", file=sys.stderr)
                self.rt.abort_requested = True
                self.node.call_soon(self.rt.done.set)
            rt.shutdown()
        return code

    def _stop_all(self, rt: ClientRuntime) -> None:
        """After the script: stop every rank unless the script already stopped the mesh."""
        launch = self.launch
        mesh = launch.mesh
        if mesh is not None and mesh.stopped:
            return
        if mesh is None:
            mesh = launch.mesh = build_mesh(rt, launch.layout, launch.agent, "mpi")
        mesh.stop().get(timeout=30)

    def _finish(self, code: int) -> int:
        """Say goodbye to rank 0, close the node, finalize MPI (collective)."""
        if self.node is not None:
            if self.agent_ref is not None and self.rank != 0:
                try:
                    self.node.rpc(self.agent_ref, "mpi_rank_exit", self.rank, code).get(1.0)
                except Exception:  # noqa: BLE001 - rank 0 may be gone already
                    pass
            self.node.shutdown_thread(5.0)
        sys.stdout.flush()
        sys.stderr.flush()
        if self.rt is not None and self.rt.abort_requested:
            print(f"hpcmesh.mpi: rank {self.rank} aborting the MPI job", file=sys.stderr,
                  flush=True)
            self.comm.Abort(code or 1)
        self.MPI.Finalize()
        return code


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=log_level(),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        import faulthandler
        import signal
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # stacks on demand
    except (ImportError, AttributeError, ValueError):
        pass
    try:
        from mpi4py import MPI
    except ImportError as e:
        print(f"hpcmesh.mpi needs mpi4py and an MPI library (pip install 'hpcmesh[mpi]'): {e}",
              file=sys.stderr)
        os._exit(2)
    try:
        code = _Rank(args, MPI).run()
    except KeyboardInterrupt:
        code = 130
    _exit_after_finalize(code)


def _exit_after_finalize(code: int) -> None:
    """Leave without Python's interpreter teardown (daemon threads, a hung actor thread)
    but *with* the C library's exit handlers: MPICH's Hydra kills the whole job when a
    rank leaves through ``_exit(2)`` right after MPI_Finalize (seen with the PyPI mpich
    5.0 wheel: about one run in three ends with every other rank SIGKILLed, exit 9).
    ``PyDLL`` keeps the GIL, so no other Python thread runs during those handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import ctypes
        ctypes.PyDLL(None).exit(int(code) & 0xFF)
    except Exception:  # noqa: BLE001 - no libc exit reachable: plain _exit
        pass
    os._exit(code)

