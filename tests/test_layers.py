"""The layering of hpcmesh/ as code, not prose (pure: reads the sources with ``ast``).

docs/ARCHITECTURE.md draws the layers; this test is what keeps the drawing true. Every
import counts: top-level, function-local, under ``if TYPE_CHECKING:``, and
``importlib.import_module("...")`` with a literal name. A module may import its own layer
and the layers before it, never one after it, and no chain of imports may come back to
where it started.

The public faces (``hpcmesh``, ``hpcmesh.actor``, ``hpcmesh.job``: the packages' own
``__init__``) sit on top, as trio's ``__init__`` and Monarch's ``monarch.actor`` do: they may
hand out anything, lazily, and no module of hpcmesh imports a face; it imports the module
that defines the name.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hpcmesh"

#: Bottom to top. A module belongs to the first entry that is it or a package above it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("hpcmesh.errors", "hpcmesh.settings", "hpcmesh.shapes", "hpcmesh.yaml_lines",
              "hpcmesh.file_tree", "hpcmesh.private_files", "hpcmesh.log_tail",
              "hpcmesh.progress", "hpcmesh.token_http")),
    ("transport", ("hpcmesh.transport",)),
    ("runtime", ("hpcmesh.runtime",)),
    ("actor", ("hpcmesh.actor",)),
    ("extensions", ("hpcmesh.collectives", "hpcmesh.spmd", "hpcmesh.mpi", "hpcmesh.slurm",
                    "hpcmesh.config", "hpcmesh.hosts_file", "hpcmesh.admin",
                    "hpcmesh.telemetry", "hpcmesh.mounts")),
    ("job", ("hpcmesh.job", "hpcmesh.hosts")),
    ("cli", ("hpcmesh.cli", "hpcmesh.__main__")),
]
FACES = ("hpcmesh", "hpcmesh.actor", "hpcmesh.job")
FACE_LAYER = len(LAYERS)


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def absolute(importer: str, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` in module ``importer``."""
    if not level:
        return module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base.pop()
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str) -> list[tuple[str, int]]:
    """(imported hpcmesh module, line) for every import in ``name``'s source."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(name, node.level, node.module)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            modules = [s for s in subs if s in MODULES]
            # `from pkg import submodule` imports the submodule; `from pkg import name`
            # imports pkg itself (its __init__ runs either way, like any parent package's)
            targets = modules if len(modules) == len(subs) else [base, *modules]
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            targets = [str(node.args[0].value)]
        found += [(t, node.lineno) for t in targets if t in MODULES and t != name]
    return found


def layer_of(name: str) -> int:
    if name in FACES and _is_package(name):
        return FACE_LAYER
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__} "
                         f"and to the table in docs/ARCHITECTURE.md")


def where(name: str) -> str:
    """Module ``name``'s file, as messages show it."""
    path = MODULES[name]
    return str(path.relative_to(PACKAGE.parent)) if path.is_relative_to(PACKAGE.parent) \
        else str(path)


def _layer_name(index: int) -> str:
    return "the public faces" if index == FACE_LAYER else LAYERS[index][0]


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_module_imports_a_layer_above_its_own_or_a_face():
    wrong = []
    for name in sorted(MODULES):
        mine = layer_of(name)
        for target, line in imports_of(name):
            theirs = layer_of(target)
            if theirs > mine or (theirs == FACE_LAYER and mine != FACE_LAYER):
                wrong.append(f"{where(name)}:{line}: {name} "
                             f"({_layer_name(mine)}) imports {target} ({_layer_name(theirs)})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {name: sorted({t for t, _ in imports_of(name)}) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return out


def test_no_import_cycle():
    cycles = _cycles()
    detail = []
    for component in cycles:
        edges = [f"  {a} -> {t} (line {line})" for a in component
                 for t, line in imports_of(a) if t in component]
        detail.append(", ".join(component) + ":\n" + "\n".join(edges))
    assert not cycles, "import cycles:\n" + "\n".join(detail)


#: Inside a layer, (package, what it must not import).
APART: list[tuple[str, tuple[str, ...]]] = [
    # the runtime's two halves: the process half (agents, fork server, the actor process
    # main) runs the message path and records through the observing half (telemetry
    # buffers, spans, introspection, debugger); what a process records of itself never
    # depends on how processes are started
    ("hpcmesh.runtime.observe", ("hpcmesh.runtime.process",)),
    # the token-guarded HTTP server both serve on is below both (token_http.py, base);
    # `hpcmesh top` (admin) reads telemetry, never the other way
    ("hpcmesh.telemetry", ("hpcmesh.admin",)),
]


def test_packages_kept_apart_inside_a_layer_do_not_import_each_other():
    wrong = []
    for package, banned in APART:
        for name in sorted(MODULES):
            if name != package and not name.startswith(package + "."):
                continue
            wrong += [f"{where(name)}:{line}: {name} imports {target}"
                      for target, line in imports_of(name)
                      if any(target == b or target.startswith(b + ".") for b in banned)]
    assert not wrong, "imports between packages kept apart (APART):\n" + "\n".join(wrong)

# -- the checker itself: a rule that cannot fail proves nothing ------------------------------


@pytest.mark.parametrize("source, expected", [
    ("from .node import Node", ["hpcmesh.runtime.node"]),
    ("def f():\n    from ..actor.host_mesh import HostMesh", ["hpcmesh.actor.host_mesh"]),
    ("import importlib\nimportlib.import_module('hpcmesh.job.slurm')", ["hpcmesh.job.slurm"]),
    ("from .. import collectives", ["hpcmesh.collectives"]),
    ("from ..actor import Actor", ["hpcmesh.actor"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..cli import main",
     ["hpcmesh.cli"]),
])
def test_the_checker_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    fake = tmp_path / "probe.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "hpcmesh.runtime.probe", fake)
    assert [t for t, _ in imports_of("hpcmesh.runtime.probe")] == expected


def test_the_checker_reports_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    up = tmp_path / "up.py"
    up.write_text("def f():\n    from ..job.slurm import SlurmJob\n")
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from . import b\n")
    b.write_text("def f():\n    from . import a\n")
    monkeypatch.setitem(MODULES, "hpcmesh.runtime.up", up)
    monkeypatch.setitem(MODULES, "hpcmesh.transport.a", a)
    monkeypatch.setitem(MODULES, "hpcmesh.transport.b", b)
    with pytest.raises(AssertionError, match=r"hpcmesh.runtime.up \(runtime\) imports "
                                             r"hpcmesh.job.slurm \(job\)"):
        test_no_module_imports_a_layer_above_its_own_or_a_face()
    assert ["hpcmesh.transport.a", "hpcmesh.transport.b"] in _cycles()


def test_the_checker_reports_packages_kept_apart_importing_each_other(tmp_path, monkeypatch):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..process.bootstrap import PROC_MODULE\n")
    monkeypatch.setitem(MODULES, "hpcmesh.runtime.observe.probe", probe)
    tie = tmp_path / "tie.py"
    tie.write_text("from ..admin.config import MeshAdminConfig\n")
    monkeypatch.setitem(MODULES, "hpcmesh.telemetry.tie", tie)
    with pytest.raises(AssertionError, match=r"(?s)hpcmesh.runtime.observe.probe imports "
                                             r"hpcmesh.runtime.process.bootstrap.*"
                                             r"hpcmesh.telemetry.tie imports hpcmesh.admin"):
        test_packages_kept_apart_inside_a_layer_do_not_import_each_other()

def test_no_private_name_is_imported_from_another_module():
    # a `_name` another module needs is a missing public seam: name it, then import it
    found = []
    for name in sorted(MODULES):
        tree = ast.parse(MODULES[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = absolute(name, node.level, node.module)
                if target.split(".")[0] != "hpcmesh":
                    continue
                found += [f"{where(name)}:{node.lineno}: {alias.name} from {target}"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)
