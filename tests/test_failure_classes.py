"""Every failure says its class (SPEC §12; issue 31 item 4), each produced for real: user
code that raises, a process killed by a signal, one the kernel's OOM killer ended (a real
memory cgroup limit, told apart from a plain kill -9 in the same cgroup), a collective that
timed out (gloo, one member never joins), a lost host (a ProcessJob agent killed);
``MeshFailure.report()`` ends with ``failure class: <class>``, the calls that fail carry it
as ``reason``, the telemetry tables as ``failure_class``. Two are not produced for real
here: NCCL's watchdog (no GPU: a process says its words and aborts as it does) and ended by
Slurm (set by the job events of issue 31 item 1: only its report is checked).

Before, only a lost host and an agent that exited had a class: the rest had ``reason`` "".
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from ci_gate import import_or_skip, skip_or_fail
from proc_helpers import wait_gone, wait_until

from hpcmesh.actor import (Actor, ActorError, MeshFailure, SupervisionError, context,
                           default_bootstrap_cmd, endpoint, this_host)
from hpcmesh.job import ProcessJob
from hpcmesh.runtime.errors import (COLLECTIVE_TIMEOUT, ENDED_BY_SLURM, HOST_LOST,
                                    OUT_OF_MEMORY, SIGNAL, USER_EXCEPTION, failure_class_of)
from hpcmesh.runtime.process.oom import OOM_SCORE_BIAS, memory_cgroup_mounts, offer_to_oom_killer

#: SPEC §3: a dead process fails what is pending on it within 5 s; the margin is for a
#: loaded test machine.
BOUND_S = 8.0


def _failures_of(faults: list, before: int, mesh: str, n: int = 1) -> list[MeshFailure]:
    """The first ``n`` failures of ``mesh`` that reached the hook after ``before``."""
    def got() -> list[MeshFailure] | None:
        mine = [f for f in faults[before:] if f.mesh_name == mesh]
        return mine if len(mine) >= n else None
    return wait_until(got, BOUND_S + 20,
                      f"{n} failure(s) of mesh {mesh!r} reach unhandled_fault_hook")


def _says(failure: MeshFailure, cls: str) -> None:
    """The failure has the class, and its report says it on its last line."""
    report = failure.report()
    assert failure.reason == cls, (failure.reason, report)
    assert report.splitlines()[-1] == f"failure class: {cls}", report
    assert f"failure class: {cls}" in str(failure)


# -- user exception --------------------------------------------------------------------------
class Faulty(Actor):
    def __init__(self, refuse: bool = False):
        if refuse:
            raise ValueError("this constructor refuses")

    @endpoint
    def boom(self) -> None:
        raise KeyError("a bug in the user's endpoint")

    @endpoint
    def exit_base(self) -> None:
        raise SystemExit(3)

    @endpoint
    def give_up(self) -> None:
        context().actor_instance.abort("the user gave up")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def exit_process(self) -> None:
        os._exit(7)


def test_user_code_that_raises_or_aborts_is_a_user_exception(unhandled_faults):
    procs = this_host().spawn_procs({"gpus": 1}, name="userexc_procs")
    try:
        before = len(unhandled_faults)
        procs.spawn("userexc_init", Faulty, True)
        _says(_failures_of(unhandled_faults, before, "userexc_init")[0], USER_EXCEPTION)

        for how, mesh_name in (("boom", "userexc_bcast"), ("exit_base", "userexc_base"),
                               ("give_up", "userexc_abort")):
            mesh = procs.spawn(mesh_name, Faulty)
            mesh.initialized.get(timeout=60)
            if how == "boom":
                # called with call(), the endpoint's error is the caller's, with its class
                with pytest.raises(ActorError) as ei:
                    mesh.boom.call_one().get(timeout=60)
                assert ei.value.reason == USER_EXCEPTION
                mesh.boom.broadcast()       # nobody could be told: the actor fails
            else:
                getattr(mesh, how).broadcast()
            failure = _failures_of(unhandled_faults, before, mesh_name)[0]
            _says(failure, USER_EXCEPTION)
            with pytest.raises(SupervisionError) as ei:
                mesh.pid.call_one().get(timeout=60)
            assert ei.value.reason == USER_EXCEPTION

        # a process that ends itself (an exit status) is its own code's doing too
        mesh = procs.spawn("userexc_exit", Faulty)
        mesh.exit_process.broadcast()
        failure = _failures_of(unhandled_faults, before, "userexc_procs")[0]
        _says(failure, USER_EXCEPTION)
        assert "exit code 7" in failure.report()
    finally:
        procs.stop().get(timeout=30)


# -- killed by a signal -----------------------------------------------------------------------
def test_a_process_killed_with_kill_9_is_a_signal(unhandled_faults):
    procs = this_host().spawn_procs({"gpus": 2}, name="signal_procs")
    try:
        mesh = procs.spawn("signal_mesh", Faulty)
        pids = mesh.pid.call().get(timeout=60).values()
        before = len(unhandled_faults)
        os.kill(pids[1], signal.SIGKILL)
        failure = _failures_of(unhandled_faults, before, "signal_procs")[0]
        _says(failure, SIGNAL)
        assert "killed by SIGKILL" in failure.report() and "OOM" not in failure.report()
        with pytest.raises(SupervisionError) as ei:
            mesh.slice(gpus=1).pid.call_one().get(timeout=60)
        assert ei.value.reason == SIGNAL
    finally:
        procs.stop().get(timeout=30)


class Parent(Actor):
    """Owns a mesh of its own; ``supervise``: its ``__supervise__`` raises ("raise") or
    handles ("handle") a failure there, instead of having none."""

    def __init__(self, supervise: str = ""):
        self.handled: list = []
        if supervise:
            self.__supervise__ = getattr(self, f"_{supervise}")

    @staticmethod
    def _raise(failure) -> bool:
        raise RuntimeError("a bug in __supervise__")

    def _handle(self, failure) -> bool:
        self.handled.append(failure.reason)
        return True

    @endpoint
    def seen(self) -> list:
        return self.handled

    @endpoint
    async def call_kid(self) -> int:
        return await self.kids.pid.call_one()

    @endpoint
    async def start(self) -> int:
        self.kids = this_host().spawn_procs({"gpus": 1}, name="kid_procs").spawn("kids", Faulty)
        return (await self.kids.pid.call_one())


def test_an_owner_that_does_not_handle_a_failure_below_it_fails_with_that_class(
        unhandled_faults):
    """The owner's failure is the cluster's when what failed below it was (here a signal);
    its own code's when its ``__supervise__`` raised."""
    procs = this_host().spawn_procs({"gpus": 1}, name="parent_procs")
    try:
        for supervise, mesh_name, cls in (("", "parents", SIGNAL),
                                          ("raise", "raising_parents", USER_EXCEPTION)):
            parent = procs.spawn(mesh_name, Parent, supervise)
            kid = parent.start.call_one().get(timeout=60)
            before = len(unhandled_faults)
            os.kill(kid, signal.SIGKILL)
            failure = _failures_of(unhandled_faults, before, mesh_name)[0]
            _says(failure, cls)
            report = failure.report()
            assert "killed by SIGKILL" in report and report.count("failure class:") == 1, report
        # one that handled it, then calls the dead kid and lets the error out: its caller's
        # ActorError has the kid's class
        parent = procs.spawn("handling_parents", Parent, "handle")
        os.kill(parent.start.call_one().get(timeout=60), signal.SIGKILL)
        assert wait_until(lambda: parent.seen.call_one().get(timeout=60), BOUND_S,
                          "the parent handles its kid's death") == [SIGNAL]
        with pytest.raises(ActorError) as ei:
            parent.call_kid.call_one().get(timeout=60)
        assert ei.value.reason == SIGNAL and "SupervisionError" in str(ei.value), str(ei.value)
    finally:
        procs.stop().get(timeout=30)


# -- out of memory ----------------------------------------------------------------------------
class Hog(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def oom_scores(self) -> tuple[int, int]:
        """This process's ``oom_score_adj`` and its parent's (the fork server or agent)."""
        def score(pid) -> int:
            with open(f"/proc/{pid}/oom_score_adj") as f:
                return int(f.read())
        return score("self"), score(os.getppid())

    @endpoint
    def eat(self, mib: int) -> int:
        """Touch ``mib`` MiB, a page at a time: far past its cgroup's limit."""
        chunks = []
        for _ in range(mib // 16):
            chunk = bytearray(16 << 20)
            for i in range(0, len(chunk), 4096):
                chunk[i] = 1
            chunks.append(chunk)
        return len(chunks)


def _memory_cgroup(limit: int) -> tuple[str, str]:
    """A new memory cgroup with ``limit`` bytes (as root; v1 beside the test's own memory
    cgroup, v2 under the root): (its folder, the file its processes are written to)."""
    mounts: dict[str, tuple[str, str]] = {}
    for kind, root, point in memory_cgroup_mounts():
        mounts.setdefault(kind, (root, point))
    name = f"hpcmesh-oom-test-{os.getpid()}"
    if "v1" in mounts:
        with open("/proc/self/cgroup") as f:
            mine = next(ln.split(":", 2)[2] for ln in f.read().splitlines()
                        if "memory" in ln.split(":")[1].split(","))
        root, point = mounts["v1"]
        folder = os.path.join(point, mine[len(root.rstrip("/")):].lstrip("/"), name)
        os.mkdir(folder)
        with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        return folder, os.path.join(folder, "cgroup.procs")
    if "v2" in mounts:
        point = mounts["v2"][1]
        with open(os.path.join(point, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        folder = os.path.join(point, name)
        os.mkdir(folder)
        with open(os.path.join(folder, "memory.max"), "w") as f:
            f.write(str(limit))
        return folder, os.path.join(folder, "cgroup.procs")
    raise OSError("no memory cgroup hierarchy is mounted")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def test_a_process_past_its_memory_limit_is_out_of_memory_and_a_kill_9_is_not(
        unhandled_faults):
    """A host agent (and its fork server) in a memory cgroup of 600 MiB, as a Slurm step
    with ConstrainRAMSpace is: one of its processes touches 4 GiB and the kernel's OOM
    killer ends it; then the other is killed with kill -9 in the same cgroup."""
    if os.geteuid() != 0:
        skip_or_fail("the out-of-memory test makes a memory cgroup: it needs root")
    job = ProcessJob({"hosts": 1})
    state = job.state(cached_path=None)
    agent = job.pids["hosts"][0]
    try:
        folder, procs_file = _memory_cgroup(600 << 20)
    except OSError as e:
        job.kill()
        skip_or_fail(f"cannot make a memory cgroup with a limit here: {e}")
    procs = None
    try:
        for _ in range(2):      # (a fork server forked meanwhile is moved the second time)
            for pid in _tree(agent):
                with open(procs_file, "w") as f:
                    f.write(str(pid))
        procs = state.hosts.spawn_procs({"gpus": 2}, name="oom_procs")
        mesh = procs.spawn("hogs", Hog)
        pids = mesh.pid.call().get(timeout=60).values()
        with open(procs_file) as f:
            inside = {int(p) for p in f.read().split()}
        assert set(pids) <= inside, (pids, inside)

        before = len(unhandled_faults)
        with pytest.raises(SupervisionError) as ei:
            mesh.slice(gpus=0).eat.call_one(4096).get(timeout=120)
        assert ei.value.reason == OUT_OF_MEMORY, str(ei.value)
        failure = _failures_of(unhandled_faults, before, "oom_procs")[0]
        _says(failure, OUT_OF_MEMORY)
        report = failure.report()
        print("\n" + report)
        assert "killed by SIGKILL" in report and "OOM killer" in report, report

        # the same cgroup, a plain kill -9: a signal, not the OOM killer
        os.kill(pids[1], signal.SIGKILL)
        second = _failures_of(unhandled_faults, before, "oom_procs", 2)[1]
        _says(second, SIGNAL)
        assert "OOM" not in second.report()
    finally:
        try:
            if procs is not None:
                procs.stop(grace=0.5).get(timeout=30)
        finally:
            job.kill()
            wait_gone([agent], 10)
            parent = os.path.join(os.path.dirname(folder), "cgroup.procs")
            deadline = time.monotonic() + 10
            while True:
                with open(procs_file) as f:
                    left = f.read().split()
                for pid in left:            # (none should be: they all ended)
                    try:
                        with open(parent, "w") as f:
                            f.write(pid)
                    except OSError:
                        pass
                try:
                    os.rmdir(folder)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise


# -- collective timeout -----------------------------------------------------------------------
class Member(Actor):
    @endpoint
    def join(self) -> bool:
        """Every member forms the groups (torch's world and the pairs along gpus) and
        reduces once along gpus through torch itself (so gloo's pairs are connected)."""
        import torch
        import torch.distributed as dist
        from hpcmesh import collectives
        t = torch.ones(1)
        dist.all_reduce(t, group=collectives.process_group("gpus"))
        return t.item() == 2

    @endpoint
    def lonely_all_reduce(self) -> None:
        """hpcmesh.collectives' all_reduce that the other member of the pair never joins."""
        import torch
        from hpcmesh import collectives
        collectives.all_reduce(torch.ones(2), dims="gpus", timeout=2)

    @endpoint
    def lonely_torch_all_reduce(self) -> None:
        """torch.distributed's own all_reduce, called directly, on the pair's gloo group."""
        import torch
        import torch.distributed as dist
        from hpcmesh import collectives
        dist.all_reduce(torch.ones(2), group=collectives.process_group("gpus"))

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_a_collective_that_times_out_is_a_collective_timeout(unhandled_faults):
    import_or_skip("torch")
    # torch's own gloo group times out after the mesh's collective timeout (3 s)
    cmd = default_bootstrap_cmd().with_env({"GLOO_SOCKET_IFNAME": "lo",
                                            "HPCMESH_COLLECTIVE_TIMEOUT": "3"})
    procs = this_host().spawn_procs({"pairs": 3, "gpus": 2}, bootstrap_command=cmd,
                                    name="collective_procs")
    try:
        mesh = procs.spawn("members", Member)
        assert mesh.join.call().get(timeout=120).values() == [True] * 6
        with pytest.raises(ActorError) as ei:
            mesh.slice(pairs=0, gpus=0).lonely_all_reduce.call_one().get(timeout=60)
        assert ei.value.reason == COLLECTIVE_TIMEOUT, str(ei.value)
        assert ei.value.remote_type == "CollectiveTimeoutError", str(ei.value)
        with pytest.raises(ActorError) as ei:
            mesh.slice(pairs=1, gpus=0).lonely_torch_all_reduce.call_one().get(timeout=60)
        assert ei.value.reason == COLLECTIVE_TIMEOUT, str(ei.value)
        assert "gloo" in str(ei.value), str(ei.value)        # torch's own error
        # broadcast: nobody can be told, the actor fails, with the class
        before = len(unhandled_faults)
        mesh.slice(pairs=2, gpus=0).lonely_all_reduce.broadcast()
        failure = _failures_of(unhandled_faults, before, "members")[0]
        _says(failure, COLLECTIVE_TIMEOUT)
        assert failure.point is not None and failure.point.rank == 4
        # an endpoint that raises anything else stays the user's own
        assert mesh.slice(pairs=2, gpus=1).ping.call_one().get(timeout=60) == "pong"
    finally:
        procs.stop().get(timeout=30)


class Aborter(Actor):
    @endpoint
    def abort(self, say_nccl: bool) -> None:
        """Abort the process; ``say_nccl``: first say on stderr what NCCL's watchdog says
        when a collective timed out and it takes the process down (torch 2.x's words)."""
        import sys
        if say_nccl:
            print("[rank0]:[E1206 12:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] "
                  "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                  "OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=2000) ran for 2003 "
                  "milliseconds before timing out.", file=sys.stderr)
            print("[rank0]:[E1206 12:00:00.000000001 ProcessGroupNCCL.cpp:1664] To avoid "
                  "data inconsistency, we are taking the entire process down.",
                  file=sys.stderr)
            for i in range(200):        # the abort's C++ stack trace follows
                print(f"frame #{i}: 0x7f00000{i:04x} in /usr/lib/libc10.so", file=sys.stderr)
        sys.stderr.flush()
        os.abort()


def test_a_process_that_nccls_watchdog_took_down_is_a_collective_timeout(unhandled_faults):
    """NCCL's watchdog does not raise: it aborts the process (SIGABRT) after saying why on
    its stderr. No GPU here: the process says NCCL's words and aborts as NCCL does; one that
    aborts without them is a signal."""
    procs = this_host().spawn_procs({"gpus": 2}, name="watchdog_procs")
    try:
        mesh = procs.spawn("aborters", Aborter)
        mesh.initialized.get(timeout=60)
        before = len(unhandled_faults)
        mesh.slice(gpus=0).abort.broadcast(True)
        failure = _failures_of(unhandled_faults, before, "watchdog_procs")[0]
        _says(failure, COLLECTIVE_TIMEOUT)
        assert "killed by SIGABRT" in failure.report() and "NCCL's watchdog" in failure.report()
        mesh.slice(gpus=1).abort.broadcast(False)
        second = _failures_of(unhandled_faults, before, "watchdog_procs", 2)[1]
        _says(second, SIGNAL)
    finally:
        procs.stop().get(timeout=30)


def test_torch_collective_timeout_texts_are_recognized_and_other_errors_are_not():
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                        "Timed out waiting 3000ms for recv operation to complete")
    connect = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:311] "
                           "Connect timeout [none]")
    assert failure_class_of(connect) == COLLECTIVE_TIMEOUT
    nccl = RuntimeError("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600035 milliseconds")
    assert failure_class_of(gloo) == failure_class_of(nccl) == COLLECTIVE_TIMEOUT
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise ValueError("my training step failed") from e
    except ValueError as wrapped:
        assert failure_class_of(wrapped) == COLLECTIVE_TIMEOUT
    assert failure_class_of(RuntimeError("Timed out waiting for my own queue")) == USER_EXCEPTION
    assert failure_class_of(TimeoutError("my own timeout")) == USER_EXCEPTION


# -- host lost, ended by Slurm: the class shows -----------------------------------------------
class Sleeper(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_killed_host_agent_is_a_lost_host_and_says_so(unhandled_faults):
    job = ProcessJob({"hosts": 1})
    state = job.state(cached_path=None)
    agent = job.pids["hosts"][0]
    try:
        procs = state.hosts.spawn_procs({"gpus": 1}, name="lost_procs")
        pids = procs.spawn("lost_mesh", Sleeper).pid.call().get(timeout=60).values()
        before = len(unhandled_faults)
        os.kill(agent, signal.SIGKILL)
        _says(_failures_of(unhandled_faults, before, "lost_procs")[0], HOST_LOST)
        assert wait_gone(pids, 10) == []
    finally:
        job.kill()


def test_every_class_shows_in_the_report_after_the_monarch_words():
    """ENDED_BY_SLURM is set by whoever tells job events from faults: its report shows it as
    every other class, after the message, whose Monarch words stay first."""
    text = "The actor Sleeper s{'gpus': 0/1} and all its descendants have failed: its job ended"
    for cls in (USER_EXCEPTION, OUT_OF_MEMORY, HOST_LOST, ENDED_BY_SLURM, SIGNAL,
                COLLECTIVE_TIMEOUT):
        failure = MeshFailure("s", SupervisionError(text, "s", reason=cls))
        assert failure.report() == f"{text}\nfailure class: {cls}"
    assert MeshFailure("s", SupervisionError(text, "s")).report() == text


# -- the telemetry tables and the dashboard's document ----------------------------------------
@pytest.fixture
def stop_telemetry_after():
    yield
    from hpcmesh.telemetry.server import stop_telemetry
    stop_telemetry()
    from hpcmesh.admin.server import stop_admin
    stop_admin()


def test_the_telemetry_tables_and_the_dashboard_say_each_failures_class(stop_telemetry_after):
    import json
    import urllib.request

    from hpcmesh.admin.server import admin_endpoint
    from hpcmesh.job import LocalJob
    from hpcmesh.telemetry.dashboard import dashboard_document

    state = LocalJob(hosts=("hosts",)).enable_telemetry().enable_admin().state(
        cached_path=None)

    def rows(sql: str) -> list[dict]:
        return state.query_engine.query(sql).to_pylist()

    procs = state.hosts.spawn_procs({"gpus": 2}, name="telcls_procs")
    try:
        procs.spawn("telcls_init", Faulty, True)
        mesh = procs.spawn("telcls", Faulty)
        victim = mesh.pid.call().get(timeout=60).values()[1]

        def classes(want: set[str]) -> tuple | None:
            actors = {r["full_name"]: r["failure_class"] for r in rows(
                "SELECT a.full_name, s.failure_class FROM actor_status_events s JOIN actors a "
                "ON s.actor_id = a.id WHERE s.new_status = 'failed'")}
            processes = {r["pid"]: r["failure_class"] for r in rows(
                "SELECT pid, failure_class FROM process_status_events "
                "WHERE new_status = 'failed'")}
            return (actors, processes) if want <= set(actors) else None

        # (the victim's own rows are collected before it is killed: they die with it)
        wait_until(lambda: classes({"telcls_init[0]", "telcls_init[1]"}), 20,
                   "the constructors' failures reach the telemetry tables")
        os.kill(victim, signal.SIGKILL)
        actors, processes = wait_until(
            lambda: classes({"telcls_init[0]", "telcls_init[1]", "telcls[1]"}), 20,
            "the killed process reaches the telemetry tables")
        assert actors["telcls_init[0]"] == actors["telcls_init[1]"] == USER_EXCEPTION, actors
        assert actors["telcls[1]"] == SIGNAL and processes[victim] == SIGNAL, (actors, processes)
        assert "telcls[0]" not in actors
        doc = dashboard_document(rows)
        shown = {(f["what"], f["failure_class"]) for f in doc["failures"]}
        assert ("telcls_init[1]", USER_EXCEPTION) in shown and ("telcls[1]", SIGNAL) in shown
        cell = next(c for m in doc["proc_meshes"] if m["name"] == "telcls_procs"
                    for c in m["cells"] if c["pid"] == victim)
        assert cell["failure_class"] == SIGNAL
        # and the admin view's tree
        with urllib.request.urlopen(admin_endpoint(state.admin_url, "/api/tree"),
                                    timeout=10) as r:
            tree = json.loads(r.read())
        (proc,) = [p for h in tree["hosts"] for p in h["processes"] if p["pid"] == victim]
        assert proc["status"] == "failed" and proc["failure_class"] == SIGNAL, proc
    finally:
        procs.stop().get(timeout=30)


def test_each_oom_kill_counted_explains_one_sigkill_only(tmp_path):
    """Pure: the cgroup mounts are read from mountinfo (v2, and v1 only with its memory
    controller); a count that went up since a process started explains one SIGKILL, not a
    second one, and never an exit status or another signal."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        "35 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory\n"
        "36 25 0:32 / /sys/fs/cgroup/cpu rw,relatime shared:15 - cgroup cgroup rw,cpu\n"
        "40 25 0:40 / /proc rw,relatime - proc proc rw\n")
    assert memory_cgroup_mounts(str(mountinfo)) == [
        ("v2", "/", "/sys/fs/cgroup/unified"), ("v1", "/", "/sys/fs/cgroup/memory")]

    from hpcmesh.runtime.process.oom import OomWatch
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    watch = OomWatch()
    start = (str(events), 1)
    assert watch.ended(start, -signal.SIGKILL) == ""             # nothing new: a kill -9
    events.write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    assert watch.ended(start, 1) == "" and watch.ended(start, -signal.SIGTERM) == ""
    assert "OOM killer" in watch.ended(start, -signal.SIGKILL)
    assert watch.ended(start, -signal.SIGKILL) == ""             # claimed already
    events.write_text("oom_kill 3\n")
    assert "OOM killer" in watch.ended(start, 128 + signal.SIGKILL)   # through a shell

    # a kill nobody here claimed (another program in the cgroup) goes stale: it explains
    # no kill -9 a while later
    watch.track(str(events), 3)
    events.write_text("oom_kill 4\n")
    watch.age()                     # (every AGE_S)
    assert "OOM killer" in watch.ended(start, -signal.SIGKILL)     # fresh: explains one
    events.write_text("oom_kill 5\n")
    watch.age()
    watch.age()
    assert watch.ended(start, -signal.SIGKILL) == ""               # counted two ages ago


def test_an_actor_process_is_the_oom_killers_choice_before_its_agent():
    """The agent must outlive an OOM in its cgroup to say which process died of it (a dead
    agent reads as a lost host): each actor process raises its own oom_score_adj."""
    procs = this_host().spawn_procs({"gpus": 2}, name="oom_score_procs")
    try:
        scores = procs.spawn("oom_score_mesh", Hog).oom_scores.call().get(timeout=60)
        for own, parent in scores.values():
            assert own == min(1000, parent + OOM_SCORE_BIAS) and own > parent or own == 1000, \
                (own, parent)
    finally:
        procs.stop().get(timeout=60)


def test_offer_to_oom_killer_raises_the_score_and_caps_it(tmp_path):
    path = tmp_path / "oom_score_adj"
    path.write_text("-100\n")
    assert offer_to_oom_killer(300, str(path)) == 200 and path.read_text() == "200"
    path.write_text("900")
    assert offer_to_oom_killer(300, str(path)) == 1000 and path.read_text() == "1000"
    assert offer_to_oom_killer(300, str(tmp_path / "missing")) is None
