"""Summarize a py-spy raw (collapsed) profile: per process/thread, top functions by
self and inclusive samples, optionally scaled to microseconds per operation.

    py-spy record --subprocesses --threads -r 1000 -f raw -o prof.txt -- python bench_hpcmesh.py --profile sync
    python benchmarks/pyspy_summary.py prof.txt --rate 1000 --ops 22000 --top 25
"""

from __future__ import annotations

import argparse
import collections
import re

_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    fn, path = m.groups()
    path = re.sub(r".*/site-packages/", "", path)
    path = re.sub(r".*/(hpcmesh|benchmarks)/", r"\1/", path)
    return f"{fn} ({path})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--rate", type=float, default=1000.0, help="py-spy sampling rate (Hz)")
    ap.add_argument("--ops", type=float, default=0, help="operations done, to print µs/op")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--min-share", type=float, default=0.02,
                    help="skip processes/threads with less than this share of samples")
    args = ap.parse_args()
    groups: dict = collections.defaultdict(lambda: [0, collections.Counter(), collections.Counter()])
    total = 0
    for line in open(args.raw):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, n = line.rpartition(" ")
        n = int(n)
        frames = stack.split(";")
        key = []
        while frames and (frames[0].startswith("process ") or frames[0].startswith("thread ")):
            key.append(frames.pop(0))
        g = groups[" / ".join(key)]
        g[0] += n
        total += n
        names = [short(f) for f in frames]
        if names:
            g[1][names[-1]] += n
        for name in set(names):
            g[2][name] += n
    unit = (1e6 / args.rate / args.ops) if args.ops else None
    for key, (n, selfc, incl) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if n < args.min_share * total:
            continue
        head = f"== {key}: {n} samples ({100 * n / total:.1f}%)"
        if unit:
            head += f" = {n * unit:.1f} µs/op"
        print(head)
        for title, c in (("self", selfc), ("inclusive", incl)):
            print(f"  -- top {title}")
            for name, k in c.most_common(args.top):
                extra = f"{k * unit:8.2f} µs/op" if unit else ""
                print(f"  {k:7d} {100 * k / n:5.1f}% {extra}  {name}")


if __name__ == "__main__":
    main()
