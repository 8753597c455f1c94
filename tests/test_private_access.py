"""No module of hpcmesh/ reaches into another's private attributes (pure: reads the sources
with ``ast``).

test_layers.py keeps the imports honest; this keeps the attributes honest: a module that
needs another's ``_name`` is missing a named public seam (``ActorHost.hold()``,
``Node.pause_frame_handling()``, ``install_client_runtime()``, ``track_actor_mesh()``...),
and a reach-in ties the two modules together where neither says so.

``X._name`` (or ``getattr(X, "_name")``, ``setattr``, ``hasattr``, ``delattr``) is the
module's own business when ``X`` is ``self``/``cls``/``super()``, or when ``_name`` is an
attribute of a class of the module itself: defined in its body, assigned to ``self`` in its
methods, or inherited from an hpcmesh base class (another instance of the module's own
classes, as ``__eq__`` reads ``other._key``). Also counted: ``from x import _name`` of a
module outside hpcmesh (hpcmesh's own: test_layers.py), and ``sys.modules["hpcmesh..."]``
(one module finding another at run time, behind the import graph's back).

The rule reads names, not types: a module that owns a ``_state`` of its own is not caught
reading another class's ``_state``. What it cannot see is allowed below, each with why.

The tests are held to the same reading, with a budget instead of a ban: a test that reads
another object's ``_name`` is either missing a public seam (``ProcMesh.records``,
``Node.peers``...) or checks an internal on purpose (a white-box unit, a fake put in
place of a private hook). At most ``MAX_TEST_PRIVATE_READS`` lines of tests/*.py do, and
each says why in a ``# private: <why>`` comment on its line or the line above. Code in
strings (a script a test writes and runs) is not read.
"""

from __future__ import annotations

import ast
import io
import pathlib
import sys
import tokenize

import pytest

from test_layers import MODULES, absolute, where

#: (module, what) -> why it is allowed. ``what`` is ``name._attr`` for an attribute of a
#: module-level name (``os._exit``), ``*._attr`` for an attribute of anything, or
#: ``module._name`` for an import. Module ``*``: anywhere.
ALLOWED: dict[tuple[str, str], str] = {
    ("*", "os._exit"): "a documented function of os: end the process now, without cleanup",
    ("*", "sys._getframe"): "a documented function of sys: the caller's frame",
    ("hpcmesh.runtime.observe.introspect", "sys._current_frames"):
        "a documented function of sys: every thread's stack, for the admin view",
    **{("*", f"*.{name}"): "namedtuple's public API (urllib's SplitResult, ...): the "
                            "underscore only keeps it apart from the field names"
       for name in ("_replace", "_asdict", "_fields", "_make")},
    **{("hpcmesh.runtime.asyncio_internals", what):
       "the one adapter to asyncio's private loop and task internals (its docstring says "
       "what needs them; a new Python breaks that module alone)"
       for what in ("*._ready", "*._run_once", "*._stopping", "*._selector", "*._context",
                    "asyncio.tasks._enter_task", "asyncio.tasks._leave_task")},
    ("hpcmesh.mounts.fuse_process", "mfusepy._libfuse"):
        "mfusepy has no public handle on libfuse, which alone has fuse_invalidate_path; "
        "read in one place (libfuse())",
    ("hpcmesh.private_files.modules", "runpy._run_module_as_main"):
        "what `python -m` itself calls (runpy.run_module differs: no __main__ alias, "
        "sys.argv[0] left alone); read in one place (RUN_MODULE)",
    ("hpcmesh.job.submitit_job", "*._process"):
        "submitit's local Job has no public handle on the process that runs it; read in "
        "one place (_controller_process())",
}

_LOOKUPS = ("getattr", "setattr", "hasattr", "delattr")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_trees: dict[pathlib.Path, ast.Module] = {}


def _tree(name: str) -> ast.Module:
    path = MODULES[name]
    if path not in _trees:
        _trees[path] = ast.parse(path.read_text(), str(path))
    return _trees[path]


_bound: dict[pathlib.Path, dict[str, tuple[str, str | None]]] = {}


def _bindings(name: str) -> dict[str, tuple[str, str | None]]:
    """What the module's imports bind: local name -> (module, name in it; None: the module
    itself)."""
    out = _bound.get(MODULES[name])
    if out is not None:
        return out
    out = _bound[MODULES[name]] = {}
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                out[local] = (alias.name if alias.asname else local, None)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(name, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out[alias.asname or alias.name] = (sub, None) if sub in MODULES \
                    else (base, alias.name)
    return out


def _class_node(module: str, cls: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """Where hpcmesh class ``cls`` as ``module`` sees it is defined, through re-exports."""
    if module not in MODULES or depth > 8:
        return None
    for node in _tree(module).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return module, node
    bound = _bindings(module).get(cls)
    if bound is None or bound[1] is None:
        return None
    return _class_node(bound[0], bound[1], depth + 1)


def _base_class(module: str, base: ast.expr) -> tuple[str, ast.ClassDef] | None:
    if isinstance(base, ast.Subscript):         # Generic[T], MeshView[T]
        base = base.value
    if isinstance(base, ast.Name):
        return _class_node(module, base.id)
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        bound = _bindings(module).get(base.value.id)
        if bound is not None and bound[1] is None:
            return _class_node(bound[0], base.attr)
    return None


def _defined_by(cls: ast.ClassDef) -> set[str]:
    """The attributes class ``cls`` defines itself."""
    names: set[str] = set()
    for st in cls.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(st.name)
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            names.add(st.target.id)
        elif isinstance(st, ast.Assign):
            for target in st.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__slots__" and isinstance(st.value, (ast.Tuple, ast.List)):
                        names |= {e.value for e in st.value.elts if isinstance(e, ast.Constant)}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    return names


def _attributes_of(module: str, cls: ast.ClassDef, seen: set) -> set[str]:
    """What ``cls`` defines and inherits from hpcmesh classes."""
    if (module, cls.name) in seen:
        return set()
    seen.add((module, cls.name))
    names = _defined_by(cls)
    for base in cls.bases:
        found = _base_class(module, base)
        if found is not None:
            names |= _attributes_of(*found, seen)
    return names


_owned: dict[pathlib.Path, set[str]] = {}


def owned(name: str) -> set[str]:
    """The attributes of the module's own classes: its to use on any of their instances."""
    out = _owned.get(MODULES[name])
    if out is not None:
        return out
    out = _owned[MODULES[name]] = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ClassDef):
            out |= _attributes_of(name, node, set())
    return out


def _is_self(obj: ast.expr) -> bool:
    if isinstance(obj, ast.Name):
        return obj.id in ("self", "cls")
    return isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and (
        obj.func.id == "super" or (obj.func.id == "type" and len(obj.args) == 1
                                   and _is_self(obj.args[0])))


def _allowance(module: str, whats: list[str]) -> tuple[str, str] | None:
    for what in whats:
        for key in ((module, what), ("*", what)):
            if key in ALLOWED:
                return key
    return None


def _is_hpcmesh_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and node.value.split(".")[0] == "hpcmesh"


def reach_ins(name: str, used: set | None = None) -> list[str]:
    """``path:line: what`` for each reach-in of module ``name``; the allowances it used go
    into ``used``."""
    own = owned(name)
    found = []

    def check(node: ast.AST, obj: ast.expr, attr: str) -> None:
        if not is_private(attr) or _is_self(obj) or attr in own:
            return
        whats = [f"{obj.id}.{attr}"] if isinstance(obj, ast.Name) else []
        key = _allowance(name, whats + [f"*.{attr}"])
        if key is not None:
            if used is not None:
                used.add(key)
            return
        found.append(f"{where(name)}:{node.lineno}: {ast.unparse(node)}")

    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Attribute):
            check(node, node.value, node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _LOOKUPS and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            check(node, node.args[0], node.args[1].value)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(name, node.level, node.module)
            if base.split(".")[0] == "hpcmesh":
                continue        # test_layers.py: no private name is imported across modules
            for alias in node.names:
                if not is_private(alias.name):
                    continue
                key = _allowance(name, [f"{base}.{alias.name}"])
                if key is None:
                    found.append(f"{where(name)}:{node.lineno}: from {base} import {alias.name}")
                elif used is not None:
                    used.add(key)
        elif (isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules"
              and _is_hpcmesh_name(node.slice)) or (
                isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.modules.get"
                and node.args and _is_hpcmesh_name(node.args[0])):
            found.append(f"{where(name)}:{node.lineno}: {ast.unparse(node)} (looks up a module "
                         f"of hpcmesh at run time: import it, or register a seam)")
    return found


def test_no_module_reaches_into_another_modules_private_attributes():
    found = [line for name in sorted(MODULES) for line in reach_ins(name)]
    assert not found, (
        "private attributes of another module's classes (or of another module) used; give "
        "the owner a named public method for what is needed, or, for a library's internals "
        "with no public way, read them in one place and add it to ALLOWED with why:\n"
        + "\n".join(found))


def test_every_allowance_is_still_needed():
    used: set = set()
    for name in sorted(MODULES):
        reach_ins(name, used)
    stale = [f"{module}: {what}" for module, what in ALLOWED
             if module != "*" and (module, what) not in used]
    assert not stale, "allowed in ALLOWED but used no more (remove them):\n" + "\n".join(stale)


# -- the tests' own private reads ----------------------------------------------------------

TESTS = pathlib.Path(__file__).resolve().parent
#: Lines of tests/*.py that may read (or write, or monkeypatch) a private attribute of an
#: object that is not the test's own: each one a seam hpcmesh does not offer, on purpose.
MAX_TEST_PRIVATE_READS = 20
_WHY = "# private:"
_PATCHES = ("setattr", "delattr")       # monkeypatch.setattr(obj, "_name", ...)


def _test_helpers() -> set[str]:
    """What the tests import from each other (conftest, proc_helpers, test_mounts...)."""
    return {p.stem for p in TESTS.glob("*.py")} | {p.name for p in TESTS.iterdir() if p.is_dir()}


def _gives_why(comment: str) -> bool:
    return _WHY in comment and comment.split(_WHY, 1)[1].strip() != ""


def _comments(source: str) -> dict[int, str]:
    """Line -> its comment."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def private_reads_of_test(path: pathlib.Path) -> list[tuple[int, str, bool]]:
    """(line, what, whether it says why) for each private attribute of another object that
    test file ``path`` uses: ``X._name`` (X not ``self``/``cls``/``super()``, ``_name`` not
    an attribute of a class the file defines), ``getattr``/``setattr``/``hasattr``/
    ``delattr``/``monkeypatch.setattr`` of ``"_name"`` (or of ``"pkg.mod._name"``), and
    ``from x import _name`` of a module that is not one of the tests' own."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    lines = source.splitlines()
    comments = _comments(source)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            own |= _defined_by(node)
    helpers = _test_helpers()

    def says_why(node: ast.AST) -> bool:
        first, last = node.lineno, node.end_lineno or node.lineno
        if any(_gives_why(comments.get(n, "")) for n in range(first, last + 1)):
            return True
        above = first - 1           # or in the block of comment lines right above
        while above >= 1 and lines[above - 1].lstrip().startswith("#"):
            if _gives_why(lines[above - 1]):
                return True
            above -= 1
        return False

    found = []

    def check(node: ast.AST, obj: ast.expr | None, attr: str) -> None:
        if not is_private(attr) or (obj is not None and _is_self(obj)) or attr in own:
            return
        whats = [f"{obj.id}.{attr}"] if isinstance(obj, ast.Name) else []
        if _allowance("*", whats + [f"*.{attr}"]) is not None:
            return
        found.append((node.lineno, ast.unparse(node)[:100], says_why(node)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            check(node, node.value, node.attr)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and (
                (isinstance(node.func, ast.Name) and node.func.id in _LOOKUPS) or
                (isinstance(node.func, ast.Attribute) and node.func.attr in _PATCHES)):
            target = node.args[1]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                check(node, node.args[0], target.value)
            elif isinstance(node.func, ast.Attribute):       # monkeypatch.setattr("a.b._c", v)
                dotted = node.args[0]
                if isinstance(dotted, ast.Constant) and isinstance(dotted.value, str) \
                        and "." in dotted.value:
                    check(node, None, dotted.value.rsplit(".", 1)[1])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and node.module.split(".")[0] not in helpers:
            for alias in node.names:
                if is_private(alias.name) and \
                        _allowance("*", [f"{node.module}.{alias.name}"]) is None:
                    found.append((node.lineno, f"from {node.module} import {alias.name}",
                                  says_why(node)))
    return sorted(found)


def private_read_sites() -> dict[str, list[tuple[str, bool]]]:
    """``tests/file.py:line`` -> what it reads there and whether it says why."""
    sites: dict[str, list] = {}
    for path in sorted(TESTS.glob("*.py")):
        for line, what, why in private_reads_of_test(path):
            sites.setdefault(f"tests/{path.name}:{line}", []).append((what, why))
    return sites


def test_tests_read_few_private_attributes_and_each_says_why():
    sites = private_read_sites()
    unexplained = [f"{site}: {what}" for site, reads in sites.items()
                   for what, why in reads if not why]
    assert not unexplained, (
        f"a test reads a private attribute of another object without a '{_WHY} <why>' "
        f"comment on its line (or the line above); use the public API (ProcMesh.records, "
        f"Node.peers, ...), give hpcmesh a small named seam, or observe the behaviour "
        f"instead; if the internal is the point of the test, say so:\n" + "\n".join(unexplained))
    assert len(sites) <= MAX_TEST_PRIVATE_READS, (
        f"{len(sites)} lines of tests/*.py read private attributes of other objects, at most "
        f"{MAX_TEST_PRIVATE_READS}; each is a missing seam:\n" + "\n".join(sites))


# -- the checker itself: a rule that cannot fail proves nothing ------------------------------


def _with_source(tmp_path, monkeypatch, name: str, source: str) -> None:
    fake = tmp_path / f"{name.rsplit('.', 1)[-1]}.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, name, fake)


def test_the_debugger_reaching_into_node_again_fails_the_check(tmp_path, monkeypatch):
    name = "hpcmesh.runtime.observe.debugger"
    source = MODULES[name].read_text() + (
        "\n\ndef _again(node, loop):\n"
        "    while node._replied:\n"
        "        node._replied.pop().flush_now()\n"
        "    getattr(node, '_handling_frames')\n"
        "    loop._ready.clear()\n"
        "    from asyncio.tasks import _enter_task\n"
        "    return sys.modules.get('hpcmesh.actor')\n")
    _with_source(tmp_path, monkeypatch, name, source)
    found = [line.split(": ", 1)[1] for line in reach_ins(name)]
    assert found.count("node._replied") == 2
    assert {"getattr(node, '_handling_frames')", "loop._ready",
            "from asyncio.tasks import _enter_task"} <= set(found)
    assert any(f.startswith("sys.modules.get('hpcmesh.actor')") for f in found)
    with pytest.raises(AssertionError, match=r"debugger.py:\d+: node._replied"):
        test_no_module_reaches_into_another_modules_private_attributes()


def test_own_classes_and_what_they_inherit_are_the_modules_own(tmp_path, monkeypatch):
    name = "hpcmesh.actor.probe"
    _with_source(tmp_path, monkeypatch, name, (
        "from .mesh_view import MeshView\n"
        "class Key:\n"
        "    __slots__ = ('_k',)\n"
        "    def __eq__(self, other):\n"
        "        return self._k == other._k\n"
        "class View(MeshView):\n"
        "    def same(self, other):\n"
        "        return other._state is self._state and super()._shape is not None\n"
        "def first(view, proc_mesh):\n"
        "    return view._shape, hasattr(view, '_state'), proc_mesh._state.records\n"))
    assert reach_ins(name) == []
    # the same reads from a module whose classes have no such attributes are reach-ins
    other = "hpcmesh.actor.probe2"
    _with_source(tmp_path, monkeypatch, other,
                 "def first(view, key):\n    return view._shape, key._k\n")
    assert [line.split(": ", 1)[1] for line in reach_ins(other)] == ["view._shape", "key._k"]


def test_an_allowance_holds_only_where_it_is_given(tmp_path, monkeypatch):
    name = "hpcmesh.runtime.probe"
    _with_source(tmp_path, monkeypatch, name, (
        "import os, sys, mfusepy\n"
        "def f(loop, parts):\n"
        "    parts._replace(query='')\n"
        "    sys._getframe(1)\n"
        "    os._exit(1)\n"
        "    return mfusepy._libfuse, loop._ready\n"))
    assert [line.split(": ", 1)[1] for line in reach_ins(name)] == ["mfusepy._libfuse",
                                                                    "loop._ready"]


def test_the_tests_checker_sees_each_kind_of_private_read_and_each_why(tmp_path):
    fake = tmp_path / "test_fake.py"
    fake.write_text(
        "import os\n"
        "from hpcmesh.transport.connection import _take\n"
        "from proc_helpers import _helper\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "def test_x(monkeypatch, procs, node, other):\n"
        "    procs._state.records\n"
        "    other._mine, super()._y\n"
        "    getattr(node, '_peers')\n"
        "    monkeypatch.setattr(node, '_polling', True)   # private: a reason\n"
        "    # private: a reason above\n"
        "    monkeypatch.setattr('hpcmesh.runtime.node._yield_core', print)\n"
        "    node._x  # private:\n"
        "    os._exit(0)\n")
    assert private_reads_of_test(fake) == [
        (2, "from hpcmesh.transport.connection import _take", False),
        (8, "procs._state", False),
        (10, "getattr(node, '_peers')", False),
        (11, "monkeypatch.setattr(node, '_polling', True)", True),
        (13, "monkeypatch.setattr('hpcmesh.runtime.node._yield_core', print)", True),
        (14, "node._x", False)]        # (a comment that gives no reason is no why)


def test_the_tests_checker_fails_past_its_budget(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "MAX_TEST_PRIVATE_READS",
                        len(private_read_sites()) - 1)
    with pytest.raises(AssertionError, match=r"lines of tests/\*\.py read private attributes"):
        test_tests_read_few_private_attributes_and_each_says_why()

