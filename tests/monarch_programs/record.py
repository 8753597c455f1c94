"""Record what each program here prints under real Monarch: the expected output that
tests/test_monarch_programs.py compares hpcmesh against.

    /work/peers/monarch/bin/python tests/monarch_programs/record.py [NAME ...]

(NAME: a program's file name without .py; none: every program).

Run it with a Python that has ``torchmonarch`` installed (0.7.0 recorded the files in
``expected/``). A program that fails under Monarch is reported and not recorded: every
program here must be a working Monarch program first.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def programs(names: list[str] | None = None) -> list[pathlib.Path]:
    found = sorted(p for p in HERE.glob("*.py") if p.name != "record.py")
    if names:
        unknown = set(names) - {p.stem for p in found}
        if unknown:
            raise SystemExit(f"no such program(s): {', '.join(sorted(unknown))}")
        found = [p for p in found if p.stem in names]
    return found


def main() -> int:
    try:
        from importlib.metadata import version
        monarch_version = version("torchmonarch")
    except Exception:  # noqa: BLE001 - reported below
        print(f"{sys.executable} has no torchmonarch: run this with Monarch's Python",
              file=sys.stderr)
        return 2
    failed = 0
    for prog in programs(sys.argv[1:]):
        run = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                             timeout=300, cwd=HERE)
        if run.returncode != 0:
            failed += 1
            print(f"{prog.name}: exit {run.returncode} under Monarch {monarch_version}:\n"
                  f"{run.stderr[-2000:]}", file=sys.stderr)
            continue
        (HERE / "expected" / f"{prog.stem}.txt").write_text(run.stdout)
        print(f"{prog.name}: recorded {len(run.stdout.splitlines())} lines "
              f"(torchmonarch {monarch_version})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
