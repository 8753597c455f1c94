"""Fault figures on one host: real processes and sockets, no Slurm (one run, ~2.2 min).

    .venv/bin/python benchmarks/bench_faults.py [--repeat 5] [--grace 1] [--flood 1000]
                                                [--hold 5] [--json benchmarks/out/faults.json]

The fault tests (tests/test_fault_*.py) say pass or fail against generous bounds; this
script gives the figures behind them, each repeated ``--repeat`` times (median, min-max):

1. A bad reply reaching the caller: the endpoint returns (a) an exception whose
   ``__init__`` takes two arguments (pickles on the actor, cannot be unpickled on the
   caller), (b) a list of 70,000 small numpy arrays (more out-of-band buffers than a frame
   carries, 65,535), (c) raises an exception whose ``__str__`` raises. Timed from the call to
   ``Future.get`` raising; then a plain call on the same actor must answer ("usable after").
   A plain call is timed beside them for scale.
2. Every process gone, what the actor started included (a ``sleep 600`` child, and a shell
   with a ``sleep 600`` of its own: tests/test_fault_orphans.py's actor), polled every 10 ms
   (``/proc/<pid>/stat``, a zombie counts as gone), after (a) ``procs.stop()``, (b) SIGKILL
   of the actor's process, (c) SIGKILL of the controller (a ``python -c`` client that owns
   the mesh and prints the pids, killed at a random moment), with the actor idle, awaiting
   in an async endpoint, or blocked in ``time.sleep`` in an async endpoint. (c) runs with
   ``HPCMESH_LEASE_GRACE=--grace`` (tests/test_fault_lease.py uses 1 s; the default is
   10 s), twice: the mesh on ``this_host()``, whose host agent lives in the controller's
   process (its death is the agent's; every descendant the client had is waited for, its
   fork server too), and on a separate ``hpcmesh worker`` agent that outlives the
   controller, as on a cluster, where the lease has to end them.
3. An ``hpcmesh worker`` agent under ``--flood`` unauthenticated TCP connections held
   ``--hold`` seconds, idle or each sending 256 random bytes: the agent's CPU seconds
   (utime+stime of /proc/<pid>/stat) and the bytes it wrote to stderr/stdout (its log, at
   the default WARNING level) from the first connection to the release; a fresh agent each
   time (started as tests/test_fault_listener.py does). One second into the hold a
   legitimate client attaches with the secret, spawns a process and calls it: how long that
   took, and whether it was done before the flood was released. Beside it, the same with no
   flood (the agent's CPU, log, and the attach's time).

Everything runs in a child of this script (``--inner``) whose environment carries a marker
(and tests/ in PYTHONPATH: the actors here are the fault tests' actors, subclassed);
when it has ended, this script lists every process that still carries the marker
(tests/proc_helpers.py ``processes_with_env``: actors, agents, fork servers, ``sleep``
grandchildren), prints them and kills them. The whole run is bounded by ``--budget``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TESTS = os.path.join(REPO, "tests")
sys.path[:0] = [REPO, TESTS]

from proc_helpers import alive, processes_with_env  # noqa: E402
# the tests' actors: their endpoints return what cannot travel, start children, give pids
from test_fault_listener import Pid, _cpu_seconds, _start_agent  # noqa: E402
from test_fault_orphans import Starter as OrphanStarter  # noqa: E402
from test_fault_replies import Awkward  # noqa: E402

from hpcmesh.actor import endpoint  # noqa: E402

MARK_VAR = "HPCMESH_BENCH_FAULTS_MARK"
N_ARRAYS = 70_000        # > 65,535 out-of-band buffers, the most a frame carries
POLL_S = 0.01


class Faulty(Awkward):
    """Part 1: tests/test_fault_replies.py's actor, with 70,000 arrays (it returns
    MAX_BUFFERS + 10)."""

    @endpoint
    def seventy_thousand_arrays(self):
        import numpy as np
        return [np.zeros(8, dtype=np.uint8) for _ in range(N_ARRAYS)]


class Starter(OrphanStarter):
    """Part 2: tests/test_fault_orphans.py's actor (``start``: a ``sleep 600`` child, and a
    shell whose own ``sleep 600`` child is a grandchild of the actor; returns the actor's pid
    and theirs), which then awaits or blocks its loop."""

    @endpoint
    async def busy(self) -> None:
        await asyncio.sleep(600)

    @endpoint
    async def blocked(self) -> None:
        time.sleep(600)                        # never yields to the loop


# ---------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------
def summary(values: list[float], fmt: str = "{:.3f}") -> tuple[str, str]:
    """(median, min-max) as text; ``-`` where nothing was measured."""
    if not values:
        return "-", "-"
    return fmt.format(statistics.median(values)), \
        f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def seconds_until_gone(pids: list[int], t0: float, timeout: float) -> tuple[float, list[int]]:
    """Poll every 10 ms until none of ``pids`` is alive: (seconds since ``t0``, pids still
    alive when ``timeout`` ran out)."""
    deadline = t0 + timeout
    left = list(pids)
    while True:
        left = [p for p in left if alive(p)]
        now = time.monotonic()
        if not left or now > deadline:
            return now - t0, left
        time.sleep(POLL_S)


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by parent pid, read from /proc)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return [p for p in out if alive(p)]


def kill_all(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Results:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, figure: str, case: str, values: list[float], notes: str,
            unit: str = "s", fmt: str = "{:.3f}") -> None:
        med, rng = summary(values, fmt)
        self.rows.append(dict(figure=figure, case=case, unit=unit, median=med, range=rng,
                              n=len(values), notes=notes, values=values))
        print(f"  {figure} / {case}: median {med} {unit} ({rng}), n={len(values)}; {notes}",
              file=sys.stderr, flush=True)

    def table(self) -> str:
        out = ["| figure | case | median | min–max | n | notes |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            out.append(f"| {r['figure']} | {r['case']} | {r['median']} {r['unit']} | "
                       f"{r['range']} {r['unit']} | {r['n']} | {r['notes']} |")
        return "\n".join(out)


# ---------------------------------------------------------------------------------------
# 1. bad replies
# ---------------------------------------------------------------------------------------
def bad_replies(res: Results, repeat: int) -> None:
    from hpcmesh.actor import this_host
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        actor = procs.spawn("faulty", Faulty)
        actor.count.call_one().get(timeout=60)                 # started and warm
        plain = []
        for _ in range(repeat):
            t0 = time.monotonic()
            actor.count.call_one().get(timeout=30)
            plain.append((time.monotonic() - t0) * 1e3)
        res.add("bad reply → caller error", "plain call (for scale)", plain, "", "ms",
                "{:.2f}")
        cases = [("(a) exception, 2-arg __init__ (returned)", actor.unreadable),
                 (f"(b) {N_ARRAYS:,} numpy arrays", actor.seventy_thousand_arrays),
                 ("(c) exception whose __str__ raises (raised)", actor.raises_bad_str)]
        for case, ep in cases:
            took, errors, usable, odd = [], set(), [], []
            for _ in range(repeat):
                t0 = time.monotonic()
                try:
                    value = ep.call_one().get(timeout=60)
                    odd.append(f"no error: returned {type(value).__name__}")
                except TimeoutError:
                    odd.append("HUNG (no answer in 60 s)")
                except Exception as e:  # noqa: BLE001 - which error is what we report
                    took.append((time.monotonic() - t0) * 1e3)
                    errors.add(type(e).__name__)
                try:
                    actor.count.call_one().get(timeout=30)
                    usable.append(True)
                except Exception as e:  # noqa: BLE001
                    usable.append(False)
                    odd.append(f"next call: {type(e).__name__}: {str(e)[:80]}")
            verdict = "yes" if all(usable) else f"NO ({usable.count(False)}/{len(usable)} failed)"
            notes = f"error: {', '.join(sorted(errors)) or '-'}; actor usable after: {verdict}"
            if odd:
                notes += "; " + "; ".join(sorted(set(odd)))
            res.add("bad reply → caller error", case, took, notes, "ms", "{:.1f}")
    finally:
        procs.stop().get(timeout=30)


# ---------------------------------------------------------------------------------------
# 2. everything gone
# ---------------------------------------------------------------------------------------
def gone_after_stop_or_kill(res: Results, repeat: int) -> None:
    from hpcmesh.actor import SupervisionError, this_host
    for case in ("(a) procs.stop()", "(b) kill -9 of the actor's process"):
        took, stop_took, notes = [], [], set()
        for _ in range(repeat):
            procs = this_host().spawn_procs(per_host={"gpus": 1})
            pids: list[int] = []
            try:
                pids = procs.spawn("starter", Starter).start.call_one().get(timeout=60)
                t0 = time.monotonic()
                if case.startswith("(a)"):
                    procs.stop().get(timeout=30)
                    stop_took.append(time.monotonic() - t0)
                else:
                    os.kill(pids[0], signal.SIGKILL)
                t, left = seconds_until_gone(pids, t0, 20)
                if left:
                    notes.add(f"still alive after 20 s: {left}")
                else:
                    took.append(t)
            finally:
                try:
                    procs.stop().get(timeout=30)
                except SupervisionError:
                    pass
                kill_all(p for p in pids if alive(p))
        note = "actor, its child, shell and grandchild" + ("" if case.startswith("(a)") else
                                              "; the supervision failure dropped by the hook")
        if stop_took:
            note += f"; stop().get() itself: median {statistics.median(stop_took):.3f} s"
        res.add("all processes gone", case, took, "; ".join([note, *sorted(notes)]))


def controller(mode: str, agent: str = "") -> None:
    """The client of part 2 (c), run as ``python -c``: spawn on this host (its agent lives
    in this process) or on the worker agent at ``agent``, start the child, put the actor in
    ``mode`` (idle, busy, blocked), print the pids, wait to be killed."""
    from hpcmesh.actor import attach_to_workers, this_host
    if agent:
        hosts = attach_to_workers([agent], secret=bytes.fromhex(os.environ["HPCMESH_SECRET"]),
                                  timeout=30)
        procs = hosts.spawn_procs({"gpus": 1})
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("starter", Starter)
    pids = mesh.start.call_one().get(timeout=60)
    if mode != "idle":
        getattr(mesh, mode).broadcast()
        time.sleep(0.3)                      # the endpoint is running
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(600)


MODES = (("idle", "idle"), ("busy", "busy in `await asyncio.sleep`"),
         ("blocked", "blocked in `time.sleep` (async endpoint)"))


def gone_after_controller_death(res: Results, repeat: int, grace: float, tmp: str) -> None:
    """Part 2 (c), twice: the mesh on ``this_host()`` (the host agent is the controller's
    own process, so its death is also the agent's), then on a separate ``hpcmesh worker``
    agent that outlives the controller, as on a cluster, where only the lease ends them."""
    for where in ("this_host()", "worker agent"):
        agent, addr, secret = None, "", os.urandom(32)
        if where == "worker agent":
            run_dir = Path(tempfile.mkdtemp(dir=tmp))
            with open(run_dir / "agent.log", "w") as err:
                agent, addr = _start_agent(run_dir, secret, stderr=err)
        try:
            for mode, label in MODES:
                took, notes, watched = _kill_controllers(repeat, grace, tmp, mode, addr,
                                                         secret)
                note = f"lease grace {grace:g} s; watched {min(watched, default=0)}–" \
                       f"{max(watched, default=0)} pids: the actor, its child, shell and " \
                       "grandchild" + \
                       (", the client's fork server" if not addr else
                        "; not the agent (its own grace: 60 s)")
                res.add(f"all gone after controller SIGKILL, mesh on {where}", label, took,
                        "; ".join([note, *sorted(notes)]))
        finally:
            if agent is not None:
                agent.kill()
                agent.wait()


def _kill_controllers(repeat: int, grace: float, tmp: str, mode: str, addr: str,
                      secret: bytes) -> tuple[list[float], set[str], list[int]]:
    """``repeat`` controllers in ``mode``, each SIGKILLed: (seconds until the actor, its
    child and what else the controller had started were gone; notes; pids watched)."""
    script = f"import sys; sys.path.insert(0, {HERE!r}); import bench_faults; " \
             f"bench_faults.controller(*sys.argv[1:])"
    env = dict(os.environ, HPCMESH_LEASE_GRACE=f"{grace:g}", HPCMESH_SECRET=secret.hex())
    took, notes, watched = [], set(), []
    for i in range(repeat):
        err_path = os.path.join(tmp, f"controller-{mode}-{i}-{bool(addr)}.err")
        with open(err_path, "w") as err:
            ctl = subprocess.Popen([sys.executable, "-c", script, mode, addr], env=env,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
        pids: list[int] = []
        try:
            line = _readline(ctl, 60)
            pids = [int(p) for p in line.split()]
            if len(pids) != 4:
                notes.add(f"controller printed {line!r}: {open(err_path).read()[-300:]!r}")
                continue
            pids = sorted(set(pids) | set(descendants(ctl.pid)))
            watched.append(len(pids))
            # at a random moment: the actor's watchdog polls every 0.5 s, and a kill at a
            # fixed delay after the print would always land at the same phase of it
            time.sleep(random.uniform(0, 0.5))
            t0 = time.monotonic()
            os.kill(ctl.pid, signal.SIGKILL)
            ctl.wait(timeout=10)
            t, left = seconds_until_gone(pids, t0, grace + 15)
            if left:
                notes.add(f"still alive {grace + 15:g} s after: "
                          + ", ".join(_describe(p) for p in left))
            else:
                took.append(t)
        finally:
            if ctl.poll() is None:
                ctl.kill()
                ctl.wait(timeout=10)
            ctl.stdout.close()
            kill_all(p for p in pids if alive(p))
    return took, notes, watched


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout, or '' if none came within ``timeout``."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else ""


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd[:60]})"


# ---------------------------------------------------------------------------------------
# 3. unauthenticated flood
# ---------------------------------------------------------------------------------------
def attach_spawn_call(addr: str, secret: bytes) -> tuple[float, object]:
    """Attach to the agent, start one process, call it: (seconds, the ProcMesh)."""
    from hpcmesh.actor import attach_to_workers
    t0 = time.monotonic()
    procs = attach_to_workers([addr], secret=secret, timeout=30).spawn_procs({"p": 1})
    procs.spawn("pid", Pid).pid.call_one().get(timeout=30)
    return time.monotonic() - t0, procs


def flood(res: Results, repeat: int, n: int, hold: float, tmp: str) -> None:
    runs = [_one_flood(None, n, hold, tmp) for _ in range(repeat)]
    case = "no flood: one attach+spawn+call"
    res.add("agent CPU", case, [r["cpu"] for r in runs], "baseline for the rows below (CPU "
            f"is counted in ticks of {1 / os.sysconf('SC_CLK_TCK'):g} s)")
    res.add("agent log", case, [r["log"] for r in runs], "", "B", "{:.0f}")
    res.add("attach+spawn+call", case, [r["attach"] for r in runs], "", "s")
    for payload, what in ((b"", "idle connections"),
                          (b"random", "connections sending 256 garbage bytes")):
        case = f"{n} {what}, {hold:g} s"
        runs = [_one_flood(payload, n, hold, tmp) for _ in range(repeat)]
        closed = summary([r["closed"] for r in runs], "{:.0f}")[0]
        lines = summary([r["lines"] for r in runs], "{:.0f}")[0]
        sample = next((r["sample"] for r in runs if r["sample"]), "")
        notes = sorted({x for r in runs for x in r["notes"]})
        res.add("agent CPU under flood", case, [r["cpu"] for r in runs],
                "from the first connect to the release; includes the attach attempts; "
                f"closed by the agent before release: {closed} of {n}")
        res.add("agent log under flood", case, [r["log"] for r in runs],
                f"stderr+stdout, WARNING level; lines: median {lines}"
                + (f"; e.g. `{sample[:110]}`" if sample else ""), "B", "{:.0f}")
        res.add("attach+spawn+call during flood", case,
                [r["attach"] for r in runs if r["attach"] is not None],
                "started 1 s into the flood; done before release: "
                f"{sum(r['during'] for r in runs)}/{repeat}"
                + ("; " + "; ".join(notes) if notes else ""))


def _one_flood(payload: bytes | None, n: int, hold: float, tmp: str) -> dict:
    """A fresh agent; ``n`` connections sending ``payload`` (``b"random"``: 256 random bytes
    each) held ``hold`` s while a client attaches 1 s in; ``None``: no flood, the attach
    alone, 1 s after the agent got ready as under a flood. The agent's CPU seconds and log
    bytes (and lines) over that time, how many connections it had closed, the attach's
    seconds and whether it beat the release."""
    secret = os.urandom(32)
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    out = dict(attach=None, during=False, closed=0, lines=0, sample="", notes=[])
    socks: list[socket.socket] = []
    attached: dict = {}
    with open(run_dir / "agent.log", "w") as err:
        agent, addr = _start_agent(run_dir, secret, stderr=err)
    host, port = addr[len("tcp://"):].rsplit(":", 1)
    try:
        cpu0, log0 = _cpu_seconds(agent.pid), log_size(err.name)
        t_open = time.monotonic()
        for _ in range(0 if payload is None else n):
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                socks.append(s)
                if payload:
                    s.sendall(os.urandom(256))
            except OSError:
                out["notes"].append("some connects/sends failed")

        def attach():
            try:
                attached["s"], attached["procs"] = attach_spawn_call(addr, secret)
                attached["at"] = time.monotonic()
            except Exception as e:  # noqa: BLE001 - reported
                attached["error"] = f"{type(e).__name__}: {str(e)[:100]}"
        th = threading.Thread(target=attach, daemon=True)
        time.sleep(max(0.0, t_open + 1.0 - time.monotonic()))   # the same 1 s without a flood
        if payload is None:
            th.run()                                   # here, now
        else:
            th.start()
            time.sleep(max(0.0, t_open + hold - time.monotonic()))
        out["cpu"] = _cpu_seconds(agent.pid) - cpu0
        out["log"] = log_size(err.name) - log0
        with open(err.name, "rb") as f:
            f.seek(log0)
            new = f.read().decode(errors="replace").splitlines()
        out["lines"] = len(new)
        out["sample"] = next((x for x in new if x.startswith("WARNING")), "")
        out["closed"] = _closed_by_peer(socks)
        released = time.monotonic()
        for s in socks:
            s.close()
        if payload is not None:
            th.join(40)
        if "s" in attached:
            out["attach"], out["during"] = attached["s"], attached["at"] < released
        else:
            out["notes"].append(f"attach failed: {attached.get('error', 'waiting at 40 s')}")
        if agent.poll() is not None:
            out["notes"].append(f"agent exited with {agent.returncode}")
        return out
    finally:
        for s in socks:
            s.close()
        if "procs" in attached:
            attached["procs"].stop().get(timeout=30)
        agent.kill()
        agent.wait()


def _closed_by_peer(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the other side has closed or reset (whatever it wrote before,
    a notice that it is busy, say, is read and dropped; nothing blocks)."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            while s.recv(65536):
                pass
            n += 1                       # b'': closed
        except BlockingIOError:
            pass                         # open, nothing (more) to read
        except OSError:
            n += 1                       # reset
    return n


# ---------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------
def inner(args) -> int:
    import hpcmesh.actor
    failures: list[str] = []
    hpcmesh.actor.unhandled_fault_hook = lambda failure: failures.append(str(failure)[:200])
    res = Results()
    tmp = tempfile.mkdtemp(prefix="bench_faults-")
    parts = {"replies": lambda: bad_replies(res, args.repeat),
             "gone": lambda: (gone_after_stop_or_kill(res, args.repeat),
                              gone_after_controller_death(res, args.repeat, args.grace, tmp)),
             "flood": lambda: flood(res, args.repeat, args.flood, args.hold, tmp)}
    for name in args.parts.split(","):
        t0 = time.monotonic()
        print(f"part {name} ...", file=sys.stderr, flush=True)
        try:
            parts[name]()
        except Exception as e:  # noqa: BLE001 - the other parts still run
            res.rows.append(dict(figure=name, case="FAILED", unit="", median="-", range="-",
                                 n=0, notes=f"{type(e).__name__}: {str(e)[:200]}", values=[]))
            import traceback
            traceback.print_exc()
        print(f"part {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(res.table(), flush=True)
    if failures:
        print(f"\nunhandled supervision failures (dropped by the hook): {len(failures)}; "
              f"first: {failures[0]}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": res.rows, "failures": failures}, f, indent=2)
    return 0


def outer(args, argv: list[str]) -> int:
    mark = uuid.uuid4().hex
    # the actors subclass the tests' ones: hpcmesh ships an actor class's own module by
    # value, not its bases' modules, so every process must be able to import tests/
    path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, **{MARK_VAR: mark, "PYTHONPATH": path})
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--inner", *argv],
                             env=env, start_new_session=True)
    try:
        rc = child.wait(timeout=args.budget)
    except subprocess.TimeoutExpired:
        print(f"\nthe run passed its budget of {args.budget:g} s: killed", flush=True)
        os.killpg(child.pid, signal.SIGKILL)
        rc = child.wait()
    took = time.monotonic() - t0
    time.sleep(0.5)                       # exits already under way
    left = processes_with_env(f"{MARK_VAR}={mark}")
    print(f"\ncommand: {shlex.join([sys.executable, *sys.argv])}")
    print(f"wall time {took:.1f} s, exit status {rc}; {os.cpu_count()} CPUs")
    if left:
        print("left running after the run: " + ", ".join(_describe(p) for p in left))
        kill_all(left)
        time.sleep(0.2)
        print(f"killed; still alive: {[p for p in left if alive(p)]}")
    else:
        print("left running after the run: none")
    return rc or (3 if left else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each figure (default 5)")
    ap.add_argument("--grace", type=float, default=1.0,
                    help="HPCMESH_LEASE_GRACE for the controller-death runs (default 1 s)")
    ap.add_argument("--flood", type=int, default=1000, help="connections (default 1000)")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds to hold them (default 5)")
    ap.add_argument("--parts", default="replies,gone,flood",
                    help="comma-separated subset of replies,gone,flood")
    ap.add_argument("--budget", type=float, default=175.0,
                    help="seconds the whole run may take before it is killed (default 175)")
    ap.add_argument("--json", help="also write every sample to this file")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args, argv = ap.parse_args(), sys.argv[1:]
    sys.exit(inner(args) if args.inner else outer(args, argv))


if __name__ == "__main__":
    main()
