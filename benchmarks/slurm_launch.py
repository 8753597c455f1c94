"""Launch latency on Slurm: a trivial submitit function vs hpcmesh jobs reaching "attached".

    python benchmarks/slurm_launch.py                  # test cluster: partition debug, 3 reps
    python benchmarks/slurm_launch.py --nodes 1 2 --reps 5 --partition debug

Rows (seconds, wall clock on the login node):

* ``submitit f() -> 1``: ``executor.submit(f)`` until ``job.result()`` returns 1 (one task:
  sbatch, the node starts Python, unpickles f, writes the result pickle, we read it);
* ``SubmititJob attached``: ``SubmititJob.apply()`` until every host agent dialed back;
* ``SlurmJob attached``: ``SlurmJob.apply()`` (sbatch of the rendered script) until every
  agent dialed back.

Each measurement is followed by a kill/cancel that is not timed (reported separately for the
hpcmesh jobs). Functions are importable for the benchmarks driver: ``time_submitit_trivial``,
``time_submititjob_attach``, ``time_slurmjob_attach``, ``run``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def _one() -> int:
    return 1


def time_submitit_trivial(partition: str | None = "debug", folder: str | None = None,
                          cluster: str = "slurm") -> float:
    """Seconds from ``submit`` to the result of a function returning 1 (one node, one task)."""
    import submitit
    folder = folder or tempfile.mkdtemp(prefix="bench-submitit-", dir=_shared_tmp())
    ex = submitit.AutoExecutor(folder=os.path.join(folder, "%j"), cluster=cluster)
    params = {"nodes": 1, "tasks_per_node": 1, "timeout_min": 10}
    if partition and cluster == "slurm":
        params["slurm_partition"] = partition
    ex.update_parameters(**params)
    t0 = time.perf_counter()
    job = ex.submit(_one)
    # job.result() polls the result file first (sacct only as a fallback, and clusters
    # without accounting make that fallback back off); poll the file as fast as we can
    while not job.paths.result_pickle.exists():
        time.sleep(0.01)
    value = job.result()
    dt = time.perf_counter() - t0
    assert value == 1, value
    return dt


def time_submititjob_attach(nodes: int = 1, partition: str | None = "debug",
                            folder: str | None = None,
                            cluster: str = "slurm") -> tuple[float, float]:
    """(seconds until every agent attached, seconds to kill) for a SubmititJob."""
    from hpcmesh.job import SubmititJob
    folder = folder or tempfile.mkdtemp(prefix="bench-sjob-", dir=_shared_tmp())
    params = {"slurm_partition": partition} if partition and cluster == "slurm" else {}
    job = SubmititJob(meshes={"workers": nodes}, folder=folder, cluster=cluster, grace=30,
                      progress=False, timeout_min=10, **params)
    t0 = time.perf_counter()
    job.apply()
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    job.kill()
    return dt, time.perf_counter() - t1


def time_slurmjob_attach(nodes: int = 1, partition: str | None = "debug",
                         folder: str | None = None) -> tuple[float, float]:
    """(seconds until every agent attached, seconds to kill) for a SlurmJob."""
    from hpcmesh.job import SlurmJob
    folder = folder or tempfile.mkdtemp(prefix="bench-slurmjob-", dir=_shared_tmp())
    kwargs = {"partition": partition} if partition else {}
    job = SlurmJob(meshes={"hosts": nodes}, log_dir=folder, job_name="bench", grace=30,
                   progress=False, exclusive=False, **kwargs)
    t0 = time.perf_counter()
    job.apply()
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    job.kill()
    return dt, time.perf_counter() - t1


def _shared_tmp() -> str:
    """A folder the nodes can read: $HPCMESH_BENCH_DIR, else ./.hpcmesh/bench (cwd is
    normally on the shared filesystem on a login node)."""
    d = os.environ.get("HPCMESH_BENCH_DIR") or os.path.abspath(os.path.join(".hpcmesh", "bench"))
    os.makedirs(d, exist_ok=True)
    return d


def run(nodes: list[int] = (1, 2), reps: int = 3, partition: str | None = "debug",
        cluster: str = "slurm") -> list[dict]:
    """Measure every row ``reps`` times; one dict per (what, nodes) with the samples."""
    rows = []

    def measure(what: str, n: int, fn) -> None:
        samples, kills, error = [], [], None
        for _ in range(reps):
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - report, keep going
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                break
            if isinstance(out, tuple):
                samples.append(out[0])
                kills.append(out[1])
            else:
                samples.append(out)
        rows.append({"what": what, "nodes": n, "samples": samples, "kill": kills,
                     "error": error})
        print(f"  {what} (nodes={n}): {['%.2f' % s for s in samples]}"
              + (f" error: {error}" if error else ""), file=sys.stderr, flush=True)

    measure("submitit f() -> 1", 1, lambda: time_submitit_trivial(partition, cluster=cluster))
    for n in nodes:
        measure("SubmititJob attached", n,
                lambda n=n: time_submititjob_attach(n, partition, cluster=cluster))
        if cluster == "slurm":
            measure("SlurmJob attached", n, lambda n=n: time_slurmjob_attach(n, partition))
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'what':<24} {'nodes':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'kill s':>7}  n"
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["samples"]
        if not s:
            lines.append(f"{r['what']:<24} {r['nodes']:>5}  n/a: {r['error']}")
            continue
        kill = f"{statistics.median(r['kill']):7.2f}" if r["kill"] else f"{'-':>7}"
        lines.append(f"{r['what']:<24} {r['nodes']:>5} {statistics.median(s):9.2f} "
                     f"{min(s):7.2f} {max(s):7.2f} {kill}  {len(s)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Slurm launch latency: submitit vs hpcmesh jobs")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--cluster", default="slurm", choices=["slurm", "local"],
                    help="local: submitit's local executor (no SlurmJob row)")
    args = ap.parse_args(argv)
    if args.cluster == "slurm" and not shutil.which("sbatch"):
        print("sbatch not found: run on a Slurm login node (or --cluster local)",
              file=sys.stderr)
        return 2
    rows = run(args.nodes, args.reps, args.partition or None, args.cluster)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
