"""A/B of the message path: two trees of hpcmesh, alternating, in one sitting.

This VM's speed drifts by more between two runs minutes apart than most changes cost, so
the two trees take turns (old, new, new, old, ...) and each figure is the median of its
rounds; the ratio new/old is read from those medians. Each round is one
``run.py --quick --only hpcmesh`` run under that tree (``PYTHONPATH=<tree>``), which covers
call_one (await and ``.get()``), call() over 4 and 8, pipelined calls, 64 MiB bulk and the
cold bring-up.

    git worktree add --detach /tmp/old <commit>
    .venv/bin/python benchmarks/ab.py --old /tmp/old --new . --rounds 4

The table goes to stdout (markdown, for RESULTS.md); per-run logs under ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

#: (label, path into run.py's results, unit, which way is better)
FIGURES = [
    ("call_one await, median", ("rt_await", "med_us"), "µs", "lower"),
    ("call_one .get(), median", ("rt_sync", "med_us"), "µs", "lower"),
    ("call() over 4, median", ("gather4", "med_us"), "µs", "lower"),
    ("call() over 8, median", ("gather8", "med_us"), "µs", "lower"),
    ("alternating blocks: call() over 4 / call_one", ("gather4_paired", "ratio"), "", "lower"),
    ("pipelined, sync .get()", ("pipelined_sync", "msgs_per_s_med"), "msg/s", "higher"),
    ("pipelined, await", ("pipelined_async", "msgs_per_s_med"), "msg/s", "higher"),
    ("64 MiB bytes round trip", ("bulk_bytes", "MBps_med"), "MB/s", "higher"),
    ("64 MiB tensor round trip", ("bulk_tensor", "MBps_med"), "MB/s", "higher"),
    ("cold bring-up 4 procs, 1st mesh", ("bringup_first_s",), "s", "lower"),
    ("cold bring-up 4 procs, 2nd mesh", ("bringup_second_s",), "s", "lower"),
    ("import hpcmesh", ("import_s",), "s", "lower"),
]


def one_run(tree: str, out: str, python: str) -> dict:
    """Run ``run.py --quick --only hpcmesh`` of ``tree`` and return hpcmesh's results."""
    os.makedirs(out, exist_ok=True)
    before = set(glob.glob(os.path.join(out, "results-*.json")))
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    subprocess.run([python, os.path.join(tree, "benchmarks", "run.py"), "--quick",
                    "--only", "hpcmesh", "--out", out], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    new = sorted(set(glob.glob(os.path.join(out, "results-*.json"))) - before)
    if not new:
        raise RuntimeError(f"run.py in {tree} wrote no results under {out}")
    with open(new[-1]) as f:
        return json.load(f)["systems"]["hpcmesh"]["results"]


def pick(results: dict, path: tuple) -> float | None:
    v = results
    for key in path:
        if not isinstance(v, dict) or key not in v:
            return None
        v = v[key]
    return float(v) if isinstance(v, (int, float)) else None


def tree_name(tree: str) -> str:
    try:
        sha = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--", "hpcmesh"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return tree
    return sha + (" (+ uncommitted)" if dirty else "")


def table(old: list[dict], new: list[dict], old_name: str, new_name: str) -> str:
    lines = [f"| figure | old `{old_name}` median | new `{new_name}` median | new/old | "
             f"better |", "|---|---|---|---|---|"]
    for label, path, unit, better in FIGURES:
        a = [x for x in (pick(r, path) for r in old) if x is not None]
        b = [x for x in (pick(r, path) for r in new) if x is not None]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = mb / ma if ma else float("nan")
        unit_s = f" ({unit})" if unit else ""
        lines.append(f"| {label}{unit_s} | {ma:.4g} | {mb:.4g} | {ratio:.3f} | {better} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the tree before (a worktree path)")
    ap.add_argument("--new", default=".", help="the tree after (default: this one)")
    ap.add_argument("--rounds", type=int, default=4, help="runs of each tree (default 4)")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "ab"))
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds takes a whole number of at least 1")
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    t0 = time.perf_counter()
    for i in range(args.rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for side in order:
            tree = args.old if side == "old" else args.new
            runs[side].append(one_run(tree, os.path.join(args.out, side), args.python))
            print(f"[ab] round {i + 1}/{args.rounds}: {side} done "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print(f"{args.rounds} alternating rounds of `run.py --quick --only hpcmesh` each "
          f"({time.perf_counter() - t0:.0f} s in all; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})\n")
    print(table(runs["old"], runs["new"], tree_name(args.old), tree_name(args.new)))


if __name__ == "__main__":
    main()
