"""The schema kit of hpcmesh's hand-written YAML: the hosts file and job specs.

Both files are written by hand and both report problems as
``file:line: problem; allowed: a, b (did you mean 'b'?)``, so both read YAML the same
way (:func:`load_yaml`: the data, the line of every key and item as a dotted path such
as ``job.nodes`` or ``setup[1]``, duplicate keys refused) and check it with the same
tools: :class:`Where` (where a value came from, and the error located there),
:func:`describe` (what was given), :func:`check_keys` and :func:`count`. Their errors
are one family, :class:`SchemaError`. Pure: no I/O beyond the text given.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import yaml

from .errors import HpcmeshError, allowed_suffix, excerpt

__all__ = ["SchemaError", "Invalid", "DuplicateKey", "Where", "load_yaml", "describe",
           "check_keys", "count", "allowed_suffix", "describe_yaml_error", "index_lines",
           "nearest_line"]


class SchemaError(HpcmeshError, ValueError):
    """A bad hand-written file or value: ``source:line: problem; allowed: ... (did you
    mean ...)``. The pieces stay attributes for tools: ``source``, ``line`` (1-based or
    None), ``key`` (dotted path), ``value``, ``allowed``, ``problem`` (the message alone).

    ``suggest``: a string is the guess to match against ``allowed``; True (the default)
    guesses ``value`` when it is a string; False suggests nothing.
    """

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 key: str | None = None, value: Any = None, allowed: Sequence[str] = (),
                 suggest: bool | str = True) -> None:
        self.source, self.line, self.key, self.value = source, line, key, value
        self.allowed = tuple(allowed)
        self.problem = message
        self.guess = suggest if isinstance(suggest, str) else \
            value if suggest and isinstance(value, str) else None
        text = message + allowed_suffix(self.allowed, self.guess)
        if source is not None:
            text = f"{source}:{line}: {text}" if line is not None else f"{source}: {text}"
        super().__init__(text)

    def recast(self, kind: type["SchemaError"]) -> "SchemaError":
        """The same error, every piece kept, as another kind of the family (a job spec
        inside a hosts file fails as the hosts file does)."""
        return kind(self.problem, source=self.source, line=self.line, key=self.key,
                    value=self.value, allowed=self.allowed,
                    suggest=self.guess if self.guess is not None else False)


class Invalid(HpcmeshError, ValueError):
    """A value checker's complaint; the caller says where (``Where.error``)."""


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
    """Line of ``key``, or of its nearest recorded parent (``a.b[2].c`` -> ``a.b[2]`` ...),
    or of the document (``""``, which :func:`load_yaml` records)."""
    while key:
        if key in lines:
            return lines[key]
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    return lines.get("")


def load_yaml(text: str, source: str = "<string>", kind: type[SchemaError] = SchemaError
              ) -> tuple[Any, dict[str, int], dict[str, str]]:
    """``(data, lines, raw)`` of one YAML document: the data as SafeLoader builds it, the
    line of every key and item by dotted path (``""``: the document's first line), and
    the text as written of plain scalars (:func:`index_lines`). Errors are ``kind``,
    located: bad YAML, a duplicate key, a number of more than 4300 digits."""
    try:
        loader = yaml.SafeLoader(text)           # refuses a NUL byte here already
    except yaml.YAMLError as exc:
        message, line = describe_yaml_error(exc, text)
        raise kind(message, source=source, line=line) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as exc:
            message, line = describe_yaml_error(exc, text)
            raise kind(message, source=source, line=line) from None
        if root is None:
            return None, {}, {}
        lines: dict[str, int] = {"": root.start_mark.line + 1}
        raw: dict[str, str] = {}
        try:
            index_lines(loader, root, lines, raw)
        except DuplicateKey as e:
            raise kind(str(e), source=source, line=e.line, key=e.path) from None
        try:
            data = loader.construct_document(root)
        except ValueError:  # int() refuses a number of more than 4300 digits
            path = next((p for p, t in raw.items() if len(t) > 4300), None)
            raise kind(f"{path or 'a value'}: a number of more than 4300 digits; no value "
                       "here needs one", source=source,
                       line=lines.get(path) if path else None, key=path) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise kind(f"invalid YAML value: {exc.problem}", source=source,
                       line=mark.line + 1 if mark else None) from None
        return data, lines, raw
    finally:
        loader.dispose()


class Where:
    """Where values came from (``source``, the lines and raw text of :func:`load_yaml`,
    a ``prefix`` when they sit inside another file), and errors of ``kind`` located there.
    Plain data (no lines) works too: its errors name the source alone."""

    def __init__(self, source: str, lines: Mapping[str, int] | None = None,
                 raw: Mapping[str, str] | None = None, prefix: str = "",
                 kind: type[SchemaError] = SchemaError) -> None:
        self.source, self.prefix, self.kind = source, prefix, kind
        self.lines = lines or {}
        self.raw = raw or {}

    def path(self, *parts: str | int) -> str:
        """The dotted path of ``parts`` under the prefix (ints are list indexes)."""
        out = self.prefix
        for p in parts:
            if isinstance(p, int):
                out += f"[{p}]"
            else:
                out = f"{out}.{p}" if out else p
        return out

    def line(self, path: str) -> int | None:
        return nearest_line(self.lines, path)

    def error(self, path: str, message: str, *, key: str | None = None, **kw: Any
              ) -> SchemaError:
        """``kind`` at the line of ``path``, about ``key`` (default: ``path``; a missing
        key is named at its parent's line). ``kw``: ``value``, ``allowed``, ``suggest``."""
        return self.kind(message, source=self.source, line=self.line(path),
                         key=path if key is None else key, **kw)

    def text(self, path: str, value: Any) -> Any:
        """The scalar as written, for values that are strings (YAML 1.1 reads
        ``01:30:00`` as 5400 and ``0123`` as octal)."""
        if isinstance(value, str) or value is None or isinstance(value, (list, dict)):
            return value
        return self.raw.get(path, value)


def describe(value: Any, kind: bool = True) -> str:
    """What was given, for "got ...": its kind and, bounded, its value (``integer 5400``
    says that YAML read ``01:30:00`` as a number); ``kind=False``: the value alone
    (``'gpu'``, ``4``, ``true``), for "differ in time ('1:00' vs '2:00')"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        text, word = str(value).lower(), "boolean"
    elif isinstance(value, int):
        if abs(value) >= 10**60:                   # str() of 5000 digits raises
            return f"an integer of about {round(value.bit_length() * 0.30103)} digits"
        text, word = str(value), "integer"
    elif isinstance(value, float):
        text, word = str(value), "number"
    elif isinstance(value, str):
        text, word = excerpt(value), "string"
    elif isinstance(value, Mapping):
        return "a mapping"
    elif isinstance(value, (list, tuple)):
        return "a list"
    else:
        return type(value).__name__
    return f"{word} {text}" if kind else text


def check_keys(where: Where, d: Mapping[Any, Any], allowed: Sequence[str] | None, what: str,
               base: tuple[str | int, ...] = ()) -> None:
    """Refuse keys of ``d`` (found at ``base``) that are not strings or (unless ``allowed``
    is None) not ``allowed``, suggesting the nearest allowed one."""
    for key in d:
        if not isinstance(key, str):
            raise where.error(where.path(*base, str(key)), f"keys of {what} must be strings, "
                              f"got {describe(key)}", value=key)
        if allowed is not None and key not in allowed:
            raise where.error(where.path(*base, key), f"unknown key {key!r} in {what}",
                              value=key, allowed=allowed)


def count(name: str, value: Any, *, maximum: int | None = None, why: str = "",
          minimum: int = 1, optional: bool = False) -> int | None:
    """``value`` as a whole number from ``minimum`` (1 or 0) to ``maximum`` (``why``: whose
    limit that is); None when ``optional`` and null. Raises Invalid."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise Invalid(f"{name} must be {what}{' or null' if optional else ''}, got "
                      f"{describe(value)}")
    if maximum is not None and value > maximum:
        raise Invalid(f"{name} must be at most {maximum}{f' ({why})' if why else ''}, got "
                      f"{describe(value)}")
    return value
