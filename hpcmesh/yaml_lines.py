"""YAML with line numbers, for the hosts config and for job specs.

Both files are written by hand and both report problems as
``file:line: problem; allowed: a, b (did you mean 'b'?)``, so both need the line
of every key (a dotted path such as ``job.nodes`` or ``setup[1]``), duplicate
keys refused, and the same wording. Pure: no I/O beyond the text given.
"""

from __future__ import annotations

from typing import Mapping

import yaml

from .errors import HpcmeshError, allowed_suffix

__all__ = ["DuplicateKey", "allowed_suffix", "describe_yaml_error", "index_lines",
           "nearest_line"]


class DuplicateKey(HpcmeshError):
    """A mapping repeats a key; the caller raises its own error type from it."""

    def __init__(self, path: str, line: int, first_line: int):
        super().__init__(f"duplicate key {path!r} (first given on line {first_line})")
        self.path, self.line, self.first_line = path, line, first_line


def describe_yaml_error(exc: yaml.YAMLError, text: str = "") -> tuple[str, int | None]:
    """``("invalid YAML: ...", 1-based line or None)`` for a parse error (``text``: the
    document, for the line of a character the reader refuses)."""
    if isinstance(exc, yaml.reader.ReaderError):
        # a NUL byte, a control character: YAML refuses it before parsing anything
        line = text.count("\n", 0, exc.position) + 1 if text else None
        return (f"invalid YAML: unacceptable character #x{exc.character:04x} "
                f"({exc.reason})"), line
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc)
        if exc.context:
            problem = f"{exc.context}, {problem}"
        return f"invalid YAML: {problem}", (mark.line + 1 if mark is not None else None)
    return f"invalid YAML: {exc}", None


def index_lines(loader: yaml.SafeLoader, root: yaml.Node, lines: dict[str, int],
                raw: dict[str, str] | None = None) -> None:
    """Record the line of every key and sequence item below ``root`` into ``lines`` and,
    when ``raw`` is given, the text as written of plain (unquoted) scalars: YAML 1.1 reads
    ``time: 01:30:00`` as 5400 and ``account: 0123`` as octal. Resolves ``<<:`` merges;
    raises DuplicateKey."""
    _index(loader, root, "", lines, raw, set())


def _index(loader, node, prefix: str, lines, raw, seen: set[int]) -> None:
    if id(node) in seen:  # aliases can make cycles
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if raw is not None and node.style is None and prefix:
            raw[prefix] = node.value
    elif isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        first: dict[str, int] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                continue
            key, line = knode.value, knode.start_mark.line + 1
            path = f"{prefix}.{key}" if prefix else str(key)
            if key in first:
                raise DuplicateKey(path, line, first[key])
            first[key] = line
            lines.setdefault(path, line)
            _index(loader, vnode, path, lines, raw, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}[{i}]"
            lines.setdefault(path, item.start_mark.line + 1)
            _index(loader, item, path, lines, raw, seen)


def nearest_line(lines: Mapping[str, int], key: str) -> int | None:
    """Line of ``key``, or of its nearest recorded parent (``a.b[2].c`` -> ``a.b[2]`` ...)."""
    while key:
        if key in lines:
            return lines[key]
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    return None
