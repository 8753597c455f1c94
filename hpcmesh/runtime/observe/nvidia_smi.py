"""This host's GPUs as ``nvidia-smi`` reports them: the one query and parser, used by the
host agent's telemetry samples and by ``hpcmesh info``.

One home so the two always read the same fields the same way: a line that is not a GPU row
is skipped, and a field nvidia-smi cannot read ("[N/A]", "[Not Supported]") is None rather
than an error.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Any

from ...errors import HpcmeshError

#: The fields asked for, in the order ``parse`` reads them.
QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total"


class NvidiaSmiError(HpcmeshError):
    """nvidia-smi is installed but did not answer (failed, or ran past its timeout)."""


def parse(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits``."""
    def num(s: str) -> float | None:
        try:
            return float(s)
        except ValueError:
            return None
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        used, total = num(parts[4]), num(parts[5])
        out.append({"gpu": int(parts[0]), "uuid": parts[1], "name": parts[2],
                    "utilization_percent": num(parts[3]),
                    "memory_used_bytes": None if used is None else int(used * 2**20),
                    "memory_total_bytes": None if total is None else int(total * 2**20)})
    return out


@functools.lru_cache(maxsize=4)
def _find(path: str | None) -> str | None:
    # looked up once per PATH: telemetry asks about once a second
    return shutil.which("nvidia-smi", path=path)


def query_gpus(timeout: float) -> list[dict[str, Any]] | None:
    """This host's GPUs now; None where nvidia-smi is not installed. ``NvidiaSmiError`` with
    its first line of output where it fails or takes longer than ``timeout`` seconds."""
    smi = _find(os.environ.get("PATH"))
    if smi is None:
        return None
    try:
        res = subprocess.run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise NvidiaSmiError(f"{smi} did not answer within {timeout:g}s") from None
    except OSError as e:
        raise NvidiaSmiError(f"could not run {smi}: {e}") from None
    if res.returncode != 0:
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        raise NvidiaSmiError(f"{smi} exited with status {res.returncode}"
                             + (f": {said[0]}" if said else ""))
    return parse(res.stdout)
