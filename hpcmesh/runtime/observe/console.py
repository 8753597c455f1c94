"""The console of a process that owns meshes (the controller, or an actor that spawned
processes): the lines its processes print, as their host agents forward them, each
prefixed with the process's rank (``[hosts=0,gpus=1] ...``), and the alike lines the hosts
folded folded again across hosts (``logging_option``'s ``aggregate_window_sec``). The
telemetry gets each line as an event too.

Knows a process only by its record in the runtime's table (``ClientRuntime.procs``: its
``name``, ``label``, ``mesh_name``, ``point``, ``forward_logs``), which it reads, never
writes.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Mapping

from ...shapes import Point
from . import telemetry_recorder
from .log_fold import Fold, TimedFolders, describe_ranks, fold_prefix


class Console:
    """Prints what the processes of ``procs`` (process name -> record) say; on ``loop``'s
    thread."""

    def __init__(self, loop, procs: Mapping[str, Any]):
        self._procs = procs
        self._lock = threading.Lock()
        # (mesh name, window) -> what hosts folded, folded across hosts
        self._folds = TimedFolders(loop, self._print_folds)

    def print_lines(self, name: str, stream: str, lines: list[str]) -> None:
        """Lines process ``name`` printed on ``stream``, prefixed with its rank (unless its
        mesh's ``logging_option`` keeps them to its files)."""
        rec = self._procs.get(name)
        if rec is not None and not rec.forward_logs:
            return
        prefix = f"[{rec.label}] " if rec is not None else f"[{name}] "
        if (tel := telemetry_recorder.RECORDER) is not None:
            source = rec.name if rec is not None else name
            for ln in lines:
                tel.event(stream, source, ln)
        self._write(stream, "".join(f"{prefix}{ln}\n" for ln in lines))

    def _write(self, stream: str, text: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        with self._lock:
            out.write(text)
            out.flush()

    def fold(self, window: float, folds: list) -> None:
        """Alike lines a host folded for one window: folded again with the other hosts'
        over ``window`` here (the host already left out the ranks the console filters)."""
        for stream, text, count, names in folds:
            rec = self._procs.get(names[0]) if names else None
            key = (rec.mesh_name if rec is not None else "", window)
            self._folds.add(key, window, stream, text, names, count)

    def folding(self) -> bool:
        """Whether folded lines wait here for their window to close."""
        return bool(self._folds)

    def flush(self, mesh_name: str | None = None) -> None:
        """Print the folded lines still in a window, of one mesh or all."""
        for key in self._folds.keys():
            if mesh_name is None or key[0] == mesh_name:
                self._folds.flush(key)

    def _print_folds(self, _key: tuple[str, float], folds: list[Fold]) -> None:
        """A window closed (or its mesh stopped or lost a process, or the runtime ends):
        one line per fold, its count and ranks in front."""
        tel = telemetry_recorder.RECORDER
        out: dict[str, list[str]] = {}
        for f in folds:
            line = f"{fold_prefix(f.count, self._who(f))}{f.text}"
            out.setdefault(f.stream, []).append(line + "\n")
            if tel is not None:
                tel.event(f.stream, next(iter(f.ranks)), line if f.count > 1 else f.text)
        for stream, lines in out.items():
            self._write(stream, "".join(lines))

    def _who(self, f: Fold) -> str:
        """The ranks that printed ``f``'s lines, as a prefix shows them."""
        recs = [self._procs.get(n) for n in f.ranks]
        if len(recs) == 1:
            return recs[0].label if recs[0] is not None else next(iter(f.ranks))
        if all(r is not None and isinstance(r.point, Point) for r in recs):
            return describe_ranks([r.point for r in recs])
        return " ".join(r.label if r is not None else n for r, n in zip(recs, f.ranks))
