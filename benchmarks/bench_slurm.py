"""Slurm launch timing on the test cluster: SlurmJob / SubmititJob / a trivial submitit job.

    .venv/bin/python benchmarks/bench_slurm.py                 # 5 reps, 3 nodes, partition debug
    .venv/bin/python benchmarks/bench_slurm.py --reps 3 --nodes 2 --json out.json

Rows (wall clock on the login node; medians over the repetitions):

* ``SlurmJob``: ``SlurmJob(meshes={"trainers": N}, partition=debug, exclusive=False)``
  then ``state(cached_path=None)`` until it returns (every agent attached and connected);
  split with the job's own ``timings``: ``submit_to_running_s`` (sbatch → the batch script's
  first line runs: Slurm's own time), ``running_to_attached_s`` (batch script → the last agent
  said hello: hpcmesh's overhead, target ≤ 0.5 s for 3 nodes) and ``submit_to_attached_s``;
  plus the wall time of the whole ``state()`` call.
* ``SubmititJob``: ``SubmititJob(meshes={"trainers": N}, cluster="slurm",
  slurm_partition=debug)`` then ``state(cached_path=None)``: wall time, and its own
  ``attach_seconds`` (submit → every agent attached).
* ``submitit f() -> 1``: ``submitit.AutoExecutor(cluster="slurm")`` with partition debug, one
  node, one task, ``executor.submit(f)`` until ``job.result()`` has returned 1. Caveat (as in
  ``slurm_launch.py``): ``job.result()`` alone would sit in submitit's watcher, which asks
  ``sacct`` for the state and backs off when the cluster has no accounting database (this one
  has none: only ``sacct -c``), so the figure would measure submitit's poll back-off rather than
  the launch. Like ``slurm_launch.py``, the benchmark polls for the result pickle every 10 ms
  and calls ``job.result()`` only once the file exists.

Repetitions rotate the order of the three rows (rep r starts with row r mod 3). Every job is
killed/cancelled after its measurement (not timed in the figures; the kill time of the hpcmesh
jobs is reported); job ids are also scancel'ed at exit whatever happens (Ctrl-C included).
Before each measurement the benchmark waits (``--wait-idle``, default 120 s) until squeue shows
no other jobs, and lists any it had to measure alongside. If the cluster is not up, prints why and exits 0 with "SKIPPED" (``--strict``: exit 2).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_SUBMITTED: list[str] = []          # every Slurm job id we created, for the final scancel


def _track(*ids) -> None:
    for j in ids:
        if j and str(j) not in _SUBMITTED:
            _SUBMITTED.append(str(j))


def _cleanup() -> None:
    """scancel every job we submitted that squeue still knows (idempotent)."""
    if not _SUBMITTED or not shutil.which("scancel"):
        return
    try:
        left = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(_SUBMITTED)],
                              capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        left = list(_SUBMITTED)
    left = [j for j in left if j in _SUBMITTED]
    if left:
        subprocess.run(["scancel", *left], capture_output=True, timeout=60)
    # wait until squeue forgets them (COMPLETING included), so the next measurement starts on
    # idle nodes
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(left)],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            break
        left = [j for j in out if j in left]
    if left:
        print(f"[bench_slurm] job(s) {' '.join(left)} still in squeue 30 s after scancel",
              file=sys.stderr, flush=True)


def _on_signal(signum, _frame):
    _cleanup()
    raise SystemExit(128 + signum)


def cluster_status() -> tuple[bool, str]:
    """(up, why) — the test cluster's own check when present, else sinfo."""
    if not shutil.which("sbatch"):
        return False, "sbatch not found (not a Slurm login node)"
    status = os.path.join(ROOT, "tests", "cluster", "status.sh")
    if os.path.exists(status):
        p = subprocess.run(["bash", status], capture_output=True, text=True, timeout=60)
        text = (p.stdout + p.stderr).strip().splitlines()
        return p.returncode == 0, (text[-1] if text else f"status.sh exit {p.returncode}")
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    states = p.stdout.split()
    ok = p.returncode == 0 and any(s in ("idle", "mixed", "allocated") for s in states)
    return ok, f"sinfo: {' '.join(states) or p.stderr.strip()}"


def other_jobs() -> list[str]:
    p = subprocess.run(["squeue", "-h", "-o", "%i %j %T %D"], capture_output=True, text=True,
                       timeout=30)
    return [ln for ln in p.stdout.splitlines() if ln.split()[0] not in _SUBMITTED]


def _shared_dir() -> str:
    d = os.environ.get("HPCMESH_BENCH_DIR") or os.path.join(ROOT, ".hpcmesh", "bench")
    os.makedirs(d, exist_ok=True)
    return d


# ------------------------------------------------------------------------------ the rows
def time_slurmjob(nodes: int, partition: str) -> dict:
    from hpcmesh.job import SlurmJob
    log_dir = tempfile.mkdtemp(prefix="slurmjob-", dir=_shared_dir())
    job = SlurmJob(meshes={"trainers": nodes}, partition=partition, log_dir=log_dir,
                   job_name="bench-slurm", exclusive=False, grace=30, progress=False,
                   timeout=120)
    try:
        t0 = time.perf_counter()
        st = job.state(cached_path=None)
        wall = time.perf_counter() - t0
        _track(*job.job_ids)
        hosts = st.trainers
        n = len(hosts.hostnames) if hasattr(hosts, "hostnames") else None
        out = {"wall_s": wall, "hosts": n, "job_ids": list(job.job_ids),
               **{k: job.timings[k] for k in ("submit_to_running_s", "running_to_attached_s",
                                              "submit_to_attached_s")},
               "running_source": job.timings.get("running_source")}
    finally:
        _track(*job.job_ids)
        t1 = time.perf_counter()
        try:
            job.kill()
        finally:
            _cleanup()
    out["kill_s"] = time.perf_counter() - t1
    return out


def time_submititjob(nodes: int, partition: str) -> dict:
    from hpcmesh.job import SubmititJob
    folder = tempfile.mkdtemp(prefix="submititjob-", dir=_shared_dir())
    job = SubmititJob(meshes={"trainers": nodes}, folder=folder, cluster="slurm", grace=30,
                      progress=False, attach_timeout=120, timeout_min=10,
                      slurm_partition=partition)
    try:
        t0 = time.perf_counter()
        st = job.state(cached_path=None)
        wall = time.perf_counter() - t0
        hosts = st.trainers
        n = len(hosts.hostnames) if hasattr(hosts, "hostnames") else None
        out = {"wall_s": wall, "attach_s": getattr(job, "attach_seconds", None), "hosts": n,
               "job_ids": job.slurm_job_ids()}
    finally:
        _track(*job.slurm_job_ids())
        t1 = time.perf_counter()
        try:
            job.kill()
        finally:
            _cleanup()
    out["kill_s"] = time.perf_counter() - t1
    return out


def _one() -> int:
    return 1


def time_submitit_trivial(partition: str) -> dict:
    import submitit
    folder = tempfile.mkdtemp(prefix="submitit-", dir=_shared_dir())
    ex = submitit.AutoExecutor(folder=os.path.join(folder, "%j"), cluster="slurm")
    ex.update_parameters(nodes=1, tasks_per_node=1, timeout_min=10, slurm_partition=partition)
    job = None
    try:
        t0 = time.perf_counter()
        job = ex.submit(_one)
        t_submitted = time.perf_counter() - t0
        _track(job.job_id)
        # poll the result file ourselves: job.result() would wait in submitit's sacct-based
        # watcher, which backs off on a cluster without accounting (see the module doc)
        deadline = time.monotonic() + 120
        while not job.paths.result_pickle.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"submitit job {job.job_id}: no result after 120 s "
                                   f"(logs in {folder})")
            time.sleep(0.01)
        value = job.result()
        dt = time.perf_counter() - t0
        assert value == 1, value
        return {"wall_s": dt, "sbatch_s": t_submitted, "job_ids": [str(job.job_id)]}
    finally:
        if job is not None:
            _track(job.job_id)
        _cleanup()


ROWS = ("SlurmJob", "SubmititJob", "submitit f() -> 1")


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt(x, nd=3):
    return "—" if x is None else f"{x:.{nd}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Slurm launch timing (test cluster)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--json", default=None)
    ap.add_argument("--wait-idle", type=float, default=120.0,
                    help="before each measurement, wait up to this many seconds for other "
                         "users' jobs to leave squeue (measure anyway after that, and say so)")
    ap.add_argument("--strict", action="store_true", help="exit 2 instead of 0 when skipped")
    args = ap.parse_args(argv)

    up, why = cluster_status()
    if not up:
        print(f"SKIPPED: the Slurm test cluster is not up ({why}); start it with "
              f"`bash tests/cluster/up.sh`", file=sys.stderr)
        return 2 if args.strict else 0
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    os.chdir(ROOT)
    from hpcmesh.runtime.client import client_runtime
    client_runtime()            # created before the first timed row, so rep 1 is like the others
    print(f"bench_slurm: {why}; {args.reps} reps, {args.nodes} nodes, partition "
          f"{args.partition}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"other jobs in squeue: {other_jobs() or 'none'}", file=sys.stderr, flush=True)

    fns = {"SlurmJob": lambda: time_slurmjob(args.nodes, args.partition),
           "SubmititJob": lambda: time_submititjob(args.nodes, args.partition),
           "submitit f() -> 1": lambda: time_submitit_trivial(args.partition)}
    samples: dict[str, list[dict]] = {r: [] for r in ROWS}
    errors: dict[str, list[str]] = {r: [] for r in ROWS}
    loads, busy = [], []
    t_run = time.time()
    for rep in range(args.reps):
        order = ROWS[rep % 3:] + ROWS[:rep % 3]
        for row in order:
            others = other_jobs()
            t_wait = time.monotonic()
            while others and time.monotonic() - t_wait < args.wait_idle:
                time.sleep(0.5)             # someone else's jobs would skew submit -> RUNNING
                others = other_jobs()
            if others:
                busy.append(f"rep {rep + 1} {row}: {others}")
            try:
                res = fns[row]()
                samples[row].append(res)
                print(f"  rep {rep + 1} {row:<18} " + " ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in res.items()), file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - report, keep going
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                errors[row].append(f"rep {rep + 1}: {msg}")
                print(f"  rep {rep + 1} {row:<18} ERROR {msg}", file=sys.stderr, flush=True)
        loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))

    sj, sub, triv = samples["SlurmJob"], samples["SubmititJob"], samples["submitit f() -> 1"]
    col = lambda rows, k: [r.get(k) for r in rows]  # noqa: E731
    lines = [
        f"| row ({args.nodes} nodes unless noted) | n | submit → RUNNING s | RUNNING → attached s "
        f"| submit → attached / result s | wall of the call s | min–max wall s | kill s |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def mm(rows, k="wall_s"):
        xs = [x for x in col(rows, k) if x is not None]
        return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "—"
    if sj:
        lines.append(f"| SlurmJob.state() | {len(sj)} | {_fmt(_med(col(sj, 'submit_to_running_s')))} | "
                     f"{_fmt(_med(col(sj, 'running_to_attached_s')))} | "
                     f"{_fmt(_med(col(sj, 'submit_to_attached_s')))} | {_fmt(_med(col(sj, 'wall_s')))} | "
                     f"{mm(sj)} | {_fmt(_med(col(sj, 'kill_s')), 2)} |")
    if sub:
        lines.append(f"| SubmititJob.state() | {len(sub)} | — | — | {_fmt(_med(col(sub, 'attach_s')))} | "
                     f"{_fmt(_med(col(sub, 'wall_s')))} | {mm(sub)} | {_fmt(_med(col(sub, 'kill_s')), 2)} |")
    if triv:
        lines.append(f"| submitit f() -> 1 (1 node) | {len(triv)} | — | — | "
                     f"{_fmt(_med(col(triv, 'wall_s')))} | {_fmt(_med(col(triv, 'wall_s')))} | "
                     f"{mm(triv)} | — |")
    print("\n".join(lines))
    print()
    if sj:
        r2a = _med(col(sj, "running_to_attached_s"))
        print(f"- SlurmJob RUNNING → attached median {r2a:.3f} s: "
              f"{'met' if r2a <= 0.5 else 'NOT met'} (target <= 0.5 s for {args.nodes} nodes); "
              f"per rep: {', '.join(f'{x:.3f}' for x in col(sj, 'running_to_attached_s'))}; "
              f"submit → RUNNING per rep: {', '.join(f'{x:.3f}' for x in col(sj, 'submit_to_running_s'))}; "
              f"RUNNING taken from: {sorted(set(col(sj, 'running_source')))}")
    for row in ROWS:
        if samples[row]:
            print(f"- {row} wall per rep (s): {', '.join(f'{x:.3f}' for x in col(samples[row], 'wall_s'))}")
    if triv:
        print(f"- submitit sbatch call (executor.submit) median {_med(col(triv, 'sbatch_s')):.3f} s")
    for row in ROWS:
        for e in errors[row]:
            print(f"- ERROR {row} {e}")
    print("- rotating order per rep: " + "; ".join(
        " → ".join(ROWS[r % 3:] + ROWS[:r % 3]) for r in range(args.reps)))
    print(f"- other jobs in squeue when a measurement started (after waiting up to "
          f"{args.wait_idle:g} s): {busy or 'none'}")
    print(f"- load average after each rep: {' | '.join(loads)}; wall {time.time() - t_run:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "errors": errors, "loads": loads}, f, indent=1,
                      default=str)
    _cleanup()
    return 0 if all(samples.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
