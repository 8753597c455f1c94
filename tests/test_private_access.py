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
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from test_layers import MODULES, absolute, where

#: (module, what) -> why it is allowed. ``what`` is ``name._attr`` for an attribute of a
#: module-level name (``os._exit``), ``*._attr`` for an attribute of anything, or
#: ``module._name`` for an import. Module ``*``: anywhere.
ALLOWED: dict[tuple[str, str], str] = {
    ("*", "os._exit"): "a documented function of os: end the process now, without cleanup",
    ("*", "sys._getframe"): "a documented function of sys: the caller's frame",
    ("hpcmesh.runtime.introspect", "sys._current_frames"):
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


# -- the checker itself: a rule that cannot fail proves nothing ------------------------------


def _with_source(tmp_path, monkeypatch, name: str, source: str) -> None:
    fake = tmp_path / f"{name.rsplit('.', 1)[-1]}.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, name, fake)


def test_the_debugger_reaching_into_node_again_fails_the_check(tmp_path, monkeypatch):
    name = "hpcmesh.runtime.debugger"
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
