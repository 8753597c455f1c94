"""Folding alike log lines of many processes into one line (``aggregate_window_sec``).

256 processes printing ``step 10 loss 0.31`` should give the console one line, not 256:
``[256 similar log lines, hosts=0..31,gpus=0..7] step 10 loss 0.31``. This module is the
folding alone, without I/O: a ``LogFolder`` is fed lines with the time and the ranks that
printed them, and is asked what to emit once its window has closed. The host agent folds
its processes' lines with one (so a host sends one line where its 8 processes printed 8),
and the client folds what the hosts sent with another (so 32 hosts give one line).

**Alike** (``alike_key``): two lines of the same stream are alike when they are equal once
every number in them (digits with an optional sign, decimal part and exponent, or a hex
number such as ``0x7f3a``) is replaced by one placeholder. ``step 10 loss 0.31`` and
``step 10 loss 0.29`` are alike (``step # loss #``); ``step 10 loss nan`` is not. The line
shown is the first of the window. Monarch instead compares every new line with every line
of the window by edit distance (alike below 0.15 of the length); a key is one dict lookup
per line however many lines the window holds, and a user can tell which lines fold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

from ...shapes import Point

#: A number as alike_key sees it: hex, or decimal with optional sign, fraction, exponent.
_NUMBER = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")
#: A window holding this many different lines closes at once (a process printing a stream
#: of distinct lines must not grow the folder without bound, nor wait a window to be seen).
MAX_GROUPS = 1000
#: A rank list longer than this many blocks is cut short ("; +N more").
MAX_BLOCKS = 8


def alike_key(text: str) -> str:
    """What makes lines alike: ``text`` with every number replaced by ``#``."""
    return _NUMBER.sub("#", text)


@dataclass
class Fold:
    """Alike lines of one window: the first one's text, how many, and who printed them
    (rank ids in the order first seen; a dict used as an ordered set)."""
    stream: str
    text: str
    count: int = 0
    ranks: dict = field(default_factory=dict)


class LogFolder:
    """Alike lines of one window folded into one ``Fold`` each.

    A window opens at the first line after the last ``take`` and closes ``window`` seconds
    later (or at once when it holds ``max_groups`` different lines); ``take(now)`` then
    returns its folds in the order their first line came, and the next line opens a new
    window. Times are any monotonic clock's seconds; rank ids are any hashable values."""

    def __init__(self, window: float, max_groups: int = MAX_GROUPS):
        if window < 0:
            raise ValueError(f"window must be seconds >= 0, got {window!r}")
        self.window = window
        self.max_groups = max_groups
        self._groups: dict[tuple[str, str], Fold] = {}
        self._opened: float | None = None

    def add(self, now: float, stream: str, text: str, ranks: Iterable[Hashable],
            count: int = 1) -> None:
        """``count`` lines alike ``text`` on ``stream`` from ``ranks`` (a host's fold that
        reaches the client is added as one call)."""
        if self._opened is None:
            self._opened = now
        key = (stream, alike_key(text))
        f = self._groups.get(key)
        if f is None:
            f = self._groups[key] = Fold(stream, text)
        f.count += count
        for r in ranks:
            f.ranks[r] = None

    def __len__(self) -> int:
        """How many folds the open window holds (0: no window is open)."""
        return len(self._groups)

    @property
    def deadline(self) -> float | None:
        """When the open window closes (None: none is open); in the past once it is full."""
        if self._opened is None:
            return None
        if len(self._groups) >= self.max_groups:
            return self._opened
        return self._opened + self.window

    def take(self, now: float, force: bool = False) -> list[Fold]:
        """The folds of the window if it has closed by ``now`` (or ``force``: a process
        ended, the client stops), else nothing."""
        deadline = self.deadline
        if deadline is None or (now < deadline and not force):
            return []
        out = list(self._groups.values())
        self._groups = {}
        self._opened = None
        return out


def _runs(values: Sequence[int]) -> str:
    """Sorted ints as ranges: [0,1,2,3] -> "0..3"; [0,1] -> "0..1"; [0,1,2,5,6] ->
    "{0..2,5,6}"; [4] -> "4"."""
    if values[-1] - values[0] == len(values) - 1:
        return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"
    parts = []
    start = prev = values[0]
    for v in list(values[1:]) + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else
                     f"{start},{prev}" if prev == start + 1 else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return "{" + ",".join(parts) + "}"


def _blocks(labels: Sequence[str], coords: list[tuple[int, ...]]) -> list[str]:
    """Distinct coordinate tuples as few products as this finds: a full product is one
    block (``hosts=0..31,gpus=0..7``); otherwise the leading dimension's values whose
    remainders are the same set share a block."""
    if not labels:
        return [""]
    per_dim = [sorted({c[i] for c in coords}) for i in range(len(labels))]
    total = 1
    for vals in per_dim:
        total *= len(vals)
    if total == len(coords):
        return [",".join(f"{d}={_runs(v)}" for d, v in zip(labels, per_dim))]
    rest: dict[int, set] = {}
    for c in coords:
        rest.setdefault(c[0], set()).add(c[1:])
    same: dict[frozenset, list[int]] = {}
    for v in sorted(rest):
        same.setdefault(frozenset(rest[v]), []).append(v)
    out = []
    for remainder, values in same.items():
        head = f"{labels[0]}={_runs(values)}"
        for tail in _blocks(labels[1:], sorted(remainder)):
            out.append(f"{head},{tail}" if tail else head)
    return out


def describe_ranks(points: Sequence[Point]) -> str:
    """The members of one mesh as short as this finds: ``gpus=3``, ``hosts=0..31,gpus=0..7``,
    ``hosts={0..2,4..31},gpus=0..7; hosts=3,gpus={0..4,6,7}`` (at most MAX_BLOCKS blocks,
    then ``; +N more``)."""
    if not points:
        return ""
    labels = list(points[0].extent.labels)
    coords = sorted({tuple(p[d] for d in labels) for p in points})
    blocks = _blocks(labels, coords) if labels else ["0"]
    if len(blocks) > MAX_BLOCKS:
        blocks = blocks[:MAX_BLOCKS] + [f"+{len(blocks) - MAX_BLOCKS} more"]
    return "; ".join(blocks)


def fold_prefix(count: int, who: str) -> str:
    """What a folded line starts with: ``[who] `` for one line (as unfolded lines are
    prefixed), ``[N similar log lines, who] `` for more."""
    return f"[{who}] " if count == 1 else f"[{count} similar log lines, {who}] "


class TimedFolders:
    """Folders by key (a mesh and its window, say), each handed to ``emit(key, folds)`` when
    its window closes: the glue between ``LogFolder`` and an event loop, shared by the host
    agent and the client. ``loop`` needs only ``time()`` and ``call_at()`` (an asyncio loop);
    use it on the loop's thread."""

    def __init__(self, loop, emit):
        self._loop = loop
        self._emit = emit
        self._folders: dict[Hashable, LogFolder] = {}
        self._timers: dict[Hashable, object] = {}

    def __bool__(self) -> bool:
        """Whether a window is open (lines not emitted yet)."""
        return bool(self._folders)

    def keys(self) -> list:
        return list(self._folders)

    def add(self, key: Hashable, window: float, stream: str, text: str,
            ranks: Iterable[Hashable], count: int = 1) -> None:
        folder = self._folders.get(key)
        if folder is None:
            folder = self._folders[key] = LogFolder(window)
        folder.add(self._loop.time(), stream, text, ranks, count)
        deadline = folder.deadline
        timer = self._timers.get(key)
        if timer is not None and timer.when() <= deadline:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = self._loop.call_at(deadline, self.flush, key)

    def flush(self, key: Hashable) -> None:
        """Emit the window of ``key`` now (it closed, or whoever printed it is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        folder = self._folders.pop(key, None)
        if folder is not None:
            self._emit(key, folder.take(self._loop.time(), force=True))

    def flush_all(self) -> None:
        for key in self.keys():
            self.flush(key)
