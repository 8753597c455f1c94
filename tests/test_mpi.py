"""MPI launch (SPEC §9): every MPI rank is one process of a ProcMesh.

Real launchers, real processes: ``mpiexec`` from the venv's PyPI ``mpich`` wheel
(Hydra) on this host, and ``srun --mpi=pmi2`` on the Slurm test cluster.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ci_gate import requires, skip_or_fail
from proc_helpers import wait_gone

from hpcmesh.actor import Actor, SupervisionError, context, endpoint
from hpcmesh.mpi import (LayoutError, RankEntry, attach_to_mpi, compute_layout, mpi_proc_mesh,
                         world_ranks)

REPO = Path(__file__).resolve().parent.parent


def _find_mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


MPIEXEC = _find_mpiexec()
_NO_MPI = (None if MPIEXEC and importlib.util.find_spec("mpi4py") else
           f"needs mpiexec and mpi4py (pip install 'hpcmesh[mpi]'); mpiexec={MPIEXEC}, "
           f"mpi4py={'yes' if importlib.util.find_spec('mpi4py') else 'no'}")


def needs_mpi(fn):
    """Marked ``mpi``; skipped (with the reason) where no MPI launcher is installed."""
    return pytest.mark.mpi(requires(_NO_MPI)(fn))


GRACE = 2.0


class Probe(Actor):
    @endpoint
    def mpi(self) -> dict:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        shared = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
        out = {"world_rank": world.Get_rank(), "world_size": world.Get_size(),
               "local_rank": shared.Get_rank(), "point": dict(context().actor_instance.rank),
               "flat": context().actor_instance.rank.rank, "pid": os.getpid(),
               "host": os.uname().nodename}
        shared.Free()
        return out

    @endpoint
    def allreduce(self, x: int) -> int:
        from mpi4py import MPI
        return MPI.COMM_WORLD.allreduce(x)

    @endpoint
    async def double(self, x: int) -> int:
        return 2 * x

    @endpoint
    def sleep(self, t: float) -> float:
        time.sleep(t)       # sleep: the endpoint's work is to take this long
        return t

    @endpoint
    async def block_loop(self, t: float, blocked: str = "") -> float:
        """``<blocked>.<pid>`` says this rank's loop is blocked now."""
        if blocked:
            open(f"{blocked}.{os.getpid()}", "w").close()
        time.sleep(t)       # sleep: blocks the rank's event loop: only the watchdog sees a lease
        return t


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
class Launched:
    """A launcher (mpiexec/srun) in its own process group, output to files."""

    def __init__(self, argv: list[str], tmp: Path, env: dict | None = None):
        self.out = tmp / "launcher.out"
        self.err = tmp / "launcher.err"
        full_env = {**os.environ, "HPCMESH_LEASE_GRACE": str(GRACE), **(env or {})}
        self.started = time.monotonic()
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.p = subprocess.Popen(argv, cwd=REPO, env=full_env, stdin=subprocess.DEVNULL,
                                      stdout=o, stderr=e, start_new_session=True)

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launcher still running after {timeout} s\n{self.output()}")

    def output(self) -> str:
        return (f"--- stdout\n{self.out.read_text(errors='replace')}"
                f"--- stderr\n{self.err.read_text(errors='replace')}")

    def descendants(self) -> list[int]:
        return descendants(self.p.pid)

    def kill(self) -> None:
        """Teardown: TERM the launcher (it cleans up its ranks), then KILL what is left."""
        if self.p.poll() is not None:
            return
        left = self.descendants()
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(3)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)
        for pid in wait_gone(left, 2.0):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def launch(tmp_path):
    started: list[Launched] = []

    def go(argv: list[str], env: dict | None = None) -> Launched:
        lr = Launched(argv, tmp_path, env)
        started.append(lr)
        return lr
    yield go
    for lr in started:
        lr.kill()


def _kill_client_and_wait(client: subprocess.Popen, lr: Launched, timeout: float):
    """Once ``client`` printed "pids ...": SIGKILL it and time the launcher's end.
    (pids the client saw, the launcher's process tree before, its exit code, seconds)."""
    try:
        line = client.stdout.readline()
        assert line.startswith("pids"), line + lr.output()
        pids = [int(x) for x in line.split()[1:]]
        tree = lr.descendants()
        client.kill()
        client.wait(5)
        t0 = time.monotonic()
        rc = lr.wait(timeout)
        return pids, tree, rc, time.monotonic() - t0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(5)


def mpiexec(n: int, *args: str) -> list[str]:
    return [MPIEXEC, "-n", str(n), sys.executable, "-m", "hpcmesh.mpi", *args]


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Hydra puts its proxy and ranks in new sessions,
    so a process group would not find them)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# ---------------------------------------------------------------------------------------
# layout (pure)
# ---------------------------------------------------------------------------------------
def _entries(hosts: list[str]) -> list[RankEntry]:
    """World rank i runs on hosts[i]; local rank/leader as Split_type would give them."""
    out, seen = [], {}
    for r, h in enumerate(hosts):
        group = seen.setdefault(h, [])
        out.append(RankEntry(r, h, f"n{r}", (f"unix:///x{r}",), 100 + r, len(group),
                             hosts.count(h), group[0] if group else r))
        group.append(r)
    return out


def test_layout_block_and_cyclic():
    one = compute_layout(_entries(["a"] * 4))
    assert one.extent == {"hosts": 1, "gpus": 4} and one.order == (0, 1, 2, 3)
    block = compute_layout(_entries(["a", "a", "b", "b"]))
    assert block.extent == {"hosts": 2, "gpus": 2} and block.order == (0, 1, 2, 3)
    assert block.hosts == ("a", "b")
    assert block.point_of(2).coords == {"hosts": 1, "gpus": 0}
    cyclic = compute_layout(_entries(["a", "b", "a", "b"]))
    assert cyclic.extent == {"hosts": 2, "gpus": 2}
    assert cyclic.order == (0, 2, 1, 3)        # hosts-major: a's ranks, then b's
    assert cyclic.point_of(1).coords == {"hosts": 1, "gpus": 0}
    # hosts are ordered by their lowest world rank, not by name
    assert compute_layout(_entries(["z", "a"])).hosts == ("z", "a")


def test_layout_ragged_is_refused_or_flattened():
    ragged = _entries(["a", "a", "a", "b"])
    with pytest.raises(LayoutError, match=r"ranks per node differ \(a: 3, b: 1\).*"
                       r"--ntasks-per-node"):
        compute_layout(ragged)
    flat = compute_layout(ragged, ragged="flat")
    assert flat.extent == {"ranks": 4} and flat.order == (0, 1, 2, 3)


def test_mpi_proc_mesh_outside_the_launcher_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="--script"):
        mpi_proc_mesh()
    with pytest.raises(TimeoutError, match="no MPI address file"):
        attach_to_mpi(tmp_path / "missing.json", timeout=0.2)


def test_the_controller_installs_its_client_runtime_with_the_jobs_secret():
    # the controller of an MPI launch joins a job started elsewhere: its runtime speaks
    # with that job's secret (a fresh process, so that no runtime exists yet)
    code = textwrap.dedent("""
        from hpcmesh.runtime.client import (client_runtime, existing_client_runtime,
                                            install_client_runtime)
        from hpcmesh.transport.addresses import new_secret
        secret = new_secret()
        assert existing_client_runtime() is None
        rt = install_client_runtime(secret)
        assert rt.secret == rt.node.secret == secret and client_runtime() is rt
        assert install_client_runtime(new_secret()) is rt     # one exists: it is kept
        rt.shutdown()
        print("installed")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "installed", done.stderr


# ---------------------------------------------------------------------------------------
# mode B: an outside client attaches (mpiexec on this host)
# ---------------------------------------------------------------------------------------
@needs_mpi
def test_mode_b_attach_spawn_call_stop(launch, tmp_path):
    addr = tmp_path / "job.addr"
    lr = launch(mpiexec(4, "--address-file", str(addr)))
    t0 = time.monotonic()
    procs = attach_to_mpi(addr, timeout=30)
    boot = time.monotonic() - t0
    assert stat.S_IMODE(addr.stat().st_mode) == 0o600
    assert dict(procs.extent) == {"hosts": 1, "gpus": 4}
    assert world_ranks(procs) == [0, 1, 2, 3]

    probes = procs.spawn("probe", Probe)
    infos = probes.mpi.call().get(timeout=30).values()
    for flat, info in enumerate(infos):
        assert info["world_size"] == 4
        assert info["world_rank"] == flat == info["flat"]
        assert info["point"] == {"hosts": 0, "gpus": info["local_rank"]}
    pids = [i["pid"] for i in infos]
    assert pids == procs.pids and len(set(pids)) == 4
    # MPI collectives inside endpoints, mesh calls, slices
    assert probes.allreduce.call(5).get(timeout=30).values() == [20] * 4
    assert probes.double.call(21).get(timeout=30).values() == [42] * 4
    assert probes.slice(gpus=2).double.call_one(4).get(timeout=30) == 8
    assert world_ranks(procs.slice(gpus=slice(2, 4))) == [2, 3]

    tree = lr.descendants()             # hydra_pmi_proxy + the 4 ranks
    assert set(pids) <= set(tree), (pids, tree)
    t1 = time.monotonic()
    codes = procs.stop().get(timeout=30)
    assert sorted(codes.values()) == [0, 0, 0, 0], codes
    rc = lr.wait(10)
    took = time.monotonic() - t1
    assert rc == 0, lr.output()
    assert took < 5, f"mpiexec took {took:.1f} s to exit after stop()"
    assert wait_gone(tree) == [], "no process of the MPI job may remain"
    assert not addr.exists(), "rank 0 removes the address file (it holds the secret)"
    print(f"\nmode B: attach {boot:.2f} s after mpiexec start, exit {took:.2f} s after stop()")


@needs_mpi
def test_mode_b_rank_death_is_a_supervision_error(launch, tmp_path):
    addr = tmp_path / "job.addr"
    lr = launch(mpiexec(2, "--address-file", str(addr)))
    procs = attach_to_mpi(addr, timeout=30)
    probes = procs.spawn("probe", Probe)
    pids = procs.pids
    pending = probes.slice(gpus=1).sleep.call_one(30)
    assert probes.slice(gpus=0).double.call_one(1).get(timeout=30) == 2
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(SupervisionError, match=r"MPI rank 1 .*gpus=1.*lost its connection") as ei:
        pending.get(timeout=10)
    assert time.monotonic() - t0 < 5
    assert ei.value.pid == pids[1]
    assert lr.wait(15) != 0            # the launcher ends the job when a rank dies
    assert wait_gone(pids) == []
    for rec in procs.records:   # SIGKILLed ranks cannot remove their sockets
        for a in rec.node.addresses:
            if a.startswith("unix://"):
                Path(a[len("unix://"):]).unlink(missing_ok=True)


@needs_mpi
def test_lease_ranks_exit_when_the_outside_client_dies(launch, tmp_path):
    addr = tmp_path / "job.addr"
    lr = launch(mpiexec(3, "--address-file", str(addr)))
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from hpcmesh.mpi import attach_to_mpi
            procs = attach_to_mpi({str(addr)!r}, timeout=30)
            print("pids", *procs.pids, flush=True)
            time.sleep(600)     # sleep: lives on until the test kills it
            """)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    pids, tree, rc, took = _kill_client_and_wait(client, lr, GRACE + 10)
    assert rc != 0
    assert GRACE * 0.8 <= took <= GRACE + 6, f"ranks exited {took:.1f} s after the client died"
    assert "controller gone" in lr.output()
    assert set(pids) <= set(tree) and wait_gone(tree) == []
    print(f"\nlease: ranks gone {took:.2f} s after the client was killed (grace {GRACE} s)")


@needs_mpi
def test_lease_holds_while_the_ranks_event_loops_are_blocked(launch, tmp_path):
    """The client dies while every rank's loop is blocked in an async endpoint: the loop's
    own lease timer cannot run, the watchdog thread ends the ranks (issue 13)."""
    addr = tmp_path / "job.addr"
    lr = launch(mpiexec(2, "--address-file", str(addr)))
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys, time
            sys.path.insert(0, {str(REPO / "tests")!r})
            from hpcmesh.mpi import attach_to_mpi
            from proc_helpers import wait_until
            from test_mpi import Probe
            blocked = {str(tmp_path / "blocked")!r}
            procs = attach_to_mpi({str(addr)!r}, timeout=30)
            p = procs.spawn("probe", Probe)
            p.double.call(1).get(timeout=30)
            p.block_loop.broadcast(600, blocked)
            wait_until(lambda: all(os.path.exists(blocked + "." + str(pid))
                                   for pid in procs.pids), 60, "every rank's loop is blocked")
            print("pids", *procs.pids, flush=True)
            time.sleep(600)     # sleep: lives on until the test kills it
            """)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    _, tree, rc, took = _kill_client_and_wait(client, lr, GRACE + 15)
    assert rc != 0
    assert took <= GRACE + 6, f"ranks exited {took:.1f} s after the client died"
    assert "while the event loop was blocked" in lr.output(), lr.output()
    assert wait_gone(tree) == []
    print(f"\nblocked loops: ranks gone {took:.2f} s after the client was killed "
          f"(grace {GRACE} s)")


@needs_mpi
def test_no_controller_ever_attaches(launch, tmp_path):
    lr = launch(mpiexec(2, "--address-file", str(tmp_path / "a"), "--attach-timeout", "1"))
    assert lr.wait(10) != 0, lr.output()     # every rank exits 3 (lease expired)
    assert "no controller connected within 1 s" in lr.output()


# ---------------------------------------------------------------------------------------
# mode A: rank 0 runs the user's script as the controller
# ---------------------------------------------------------------------------------------
SCRIPT = '''
import sys
from hpcmesh.actor import Actor, endpoint, context
from hpcmesh.mpi import mpi_proc_mesh

class Where(Actor):
    @endpoint
    def where(self, tag):
        from mpi4py import MPI
        p = context().actor_instance.rank
        return (tag, MPI.COMM_WORLD.Get_rank(), p.rank, p["gpus"])

procs = mpi_proc_mesh()
print("EXTENT", dict(procs.extent), "ARGS", sys.argv[1:], flush=True)
w = procs.spawn("w", Where)
print("RESULT", w.where.call("hi").get(timeout=30).values(), flush=True)
print("SUM", w.where.call("x").get(timeout=30).values()[3][1], flush=True)
'''


@needs_mpi
def test_mode_a_rank0_runs_the_script(launch, tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    lr = launch(mpiexec(4, "--script", str(script), "--flag", "v"))
    assert lr.wait(30) == 0, lr.output()
    out = lr.out.read_text()
    assert "EXTENT {'hosts': 1, 'gpus': 4} ARGS ['--flag', 'v']" in out
    assert ("RESULT [('hi', 0, 0, 0), ('hi', 1, 1, 1), ('hi', 2, 2, 2), ('hi', 3, 3, 3)]"
            in out), lr.output()
    print(f"\nmode A: script run end to end in {time.monotonic() - lr.started:.2f} s")


@needs_mpi
def test_mode_a_script_failure_sets_the_exit_status(launch, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("from hpcmesh.mpi import mpi_proc_mesh\nmpi_proc_mesh()\n"
                      "raise ValueError('script went wrong')\n")
    lr = launch(mpiexec(2, "--script", str(script)))
    assert lr.wait(30) == 1, lr.output()
    assert "ValueError: script went wrong" in lr.output()


@needs_mpi
def test_example_mpi_launch(launch):
    lr = launch(mpiexec(4, "--script", "examples/mpi_launch.py"))
    assert lr.wait(30) == 0, lr.output()
    out = lr.out.read_text()
    assert "extent: {'hosts': 1, 'gpus': 4}" in out
    assert "MPI allreduce of 10*1 over all ranks: [40, 40, 40, 40]" in out
    assert "stopped: [0, 0, 0, 0]" in out


# ---------------------------------------------------------------------------------------
# Slurm: srun --mpi=pmi2 across two nodes of the test cluster
# ---------------------------------------------------------------------------------------
def srun(*args: str) -> list[str]:
    # --immediate: a cluster busy with other jobs skips instead of hanging the suite
    # MPICH over libfabric's tcp provider, not UCX: the test cluster's "nodes" are
    # namespaces of one kernel, and UCX takes ranks on different "nodes" for one host
    # (shared memory through /proc/<pid>/fd or SysV segments that fail to attach, and
    # worker addresses it cannot unpack), failing depending on timing and heap layout.
    # Real nodes don't need this.
    return ["srun", "--mpi=pmi2", "-N2", "--ntasks-per-node=2", "--immediate=20", "-t", "2",
            "--export=ALL,MPIR_CVAR_CH4_NETMOD=ofi,FI_PROVIDER=tcp",
            "-J", "hpcmesh-mpi-test", "--kill-on-bad-exit=1", sys.executable, "-m",
            "hpcmesh.mpi", *args]


def _skip_if_no_allocation(lr: Launched) -> None:
    err = lr.err.read_text(errors="replace")
    if "Unable to allocate resources" in err or "Immediate execution impossible" in err:
        why = f"the Slurm test cluster is busy: {err.strip().splitlines()[-1]}"
        skip_or_fail(why)         # in CI the cluster is ours alone: busy means broken


@needs_mpi
@pytest.mark.slurm
def test_srun_pmi2_two_nodes_mode_b(slurm_cluster, launch, tmp_path):
    addr = tmp_path / "job.addr"
    lr = launch(srun("--address-file", str(addr)))
    try:
        procs = attach_to_mpi(addr, timeout=40)
    except TimeoutError:
        lr.wait(30)
        _skip_if_no_allocation(lr)
        raise AssertionError(lr.output())
    assert dict(procs.extent) == {"hosts": 2, "gpus": 2}
    probes = procs.spawn("probe", Probe)
    infos = probes.mpi.call().get(timeout=30).values()
    assert [i["world_rank"] for i in infos] == [0, 1, 2, 3] == [i["flat"] for i in infos]
    assert [i["local_rank"] for i in infos] == [0, 1, 0, 1]
    hosts = [i["host"] for i in infos]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert all(h.startswith("node") for h in hosts)
    assert probes.allreduce.call(1).get(timeout=30).values() == [4] * 4
    assert sorted(procs.stop().get(timeout=30).values()) == [0] * 4
    assert lr.wait(15) == 0, lr.output()


@needs_mpi
@pytest.mark.slurm
def test_srun_pmi2_two_nodes_mode_a(slurm_cluster, launch):
    lr = launch(srun("--script", "examples/mpi_launch.py"))
    rc = lr.wait(60)
    _skip_if_no_allocation(lr)
    assert rc == 0, lr.output()
    out = lr.out.read_text()
    assert "extent: {'hosts': 2, 'gpus': 2}" in out
    assert "MPI allreduce of 10*1 over all ranks: [40, 40, 40, 40]" in out
