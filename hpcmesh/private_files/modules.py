"""Modules of the current folder, found the way ``python -m`` finds them, but only last.

``hpcmesh apply mypkg.jobs.trainers`` names a module in the folder the user runs it from.
Putting that folder first on ``sys.path`` (what ``python -m`` does) lets anybody who can
write there (a shared project folder, /tmp) plant ``sysconfig.py`` and run code as the
user when anything imports ``sysconfig``. So the folder is never put on ``sys.path``: a
finder at the *end* of ``sys.meta_path`` is asked only for a top-level name nothing else
(the standard library, site-packages, ``PYTHONPATH``) has, and hands out a module or
package of that folder only when the folder, and the file or package folder found there,
pass the ``PASS`` rule of :mod:`.walk`: root's or this user's and writable by nobody else
(the folder itself may be sticky, as /tmp is: others may add names to it, not replace
ours). Anything else is an ``ImportError`` that names the path, its owner and mode: code
that tries an optional module falls back, the job spec's own import says why it failed.

Bytecode is neither read nor written for what this finder loads: a ``__pycache__`` in a
shared folder is another user's to plant. The submodules of a package come from its own
folder (which nobody else can write) through the usual machinery.

The Pythons hpcmesh starts (actor processes, the fork server, host agents, filesystems,
``exec_python``'s modules) get the same rule: :func:`python_module` starts them with ``-P``,
which keeps their current folder off ``sys.path``, and those that run the user's code
(:func:`current_folder_last`, :data:`RUN_MODULE`) put this finder in its place.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import stat
import sys

from .walk import PASS, Opened, UntrustedPathError, check, explain, walk


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles the source each time: no ``__pycache__`` of a shared folder is trusted."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class FolderModules(importlib.abc.MetaPathFinder):
    """The top-level modules of ``folder`` that nothing before it on ``sys.meta_path``
    found, each checked before it is loaded (see the module's docstring)."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:
            return None                 # a submodule: its package's own folder has it
        try:
            fd = os.open(self.folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            found = [entry for entry in (name, name + ".py") if _exists(entry, fd)]
            if not found:
                return None
            shown = os.path.join(self.folder, found[0])
            try:
                folder = Opened(fd, os.fstat(fd), self.folder)
                check(folder.st, PASS, what=f"refusing to import {name!r} from {shown}",
                      named=shown, where=self.folder, kind="folder", last=False)
                return self._spec(name, found, folder)
            except OSError as e:        # refused, or a dangling link, a loop...
                text = str(e) if isinstance(e, UntrustedPathError) else \
                    explain(e, f"cannot import {name!r} from {shown}")
                raise ImportError(text, name=name, path=shown) from None
        finally:
            os.close(fd)

    def _spec(self, name: str, found: list[str], folder: Opened):
        """A package (a folder, with or without ``__init__.py``) before a module, as
        Python's own finder orders them."""
        if name in found:
            with _walk(name, folder) as entry:
                if stat.S_ISDIR(entry.st.st_mode):
                    if _exists("__init__.py", entry.fd):
                        with _walk("__init__.py", entry) as init:
                            return _file_spec(name, init.path, package=entry.path)
                    if name + ".py" not in found:
                        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
                        spec.submodule_search_locations = [entry.path]  # a namespace package
                        return spec
        if name + ".py" in found:
            with _walk(name + ".py", folder) as module:
                return _file_spec(name, module.path)
        return None


def _walk(entry: str, folder: Opened) -> Opened:
    """``entry`` of ``folder``, held to ``PASS``: root's or ours, writable by nobody else."""
    shown = os.path.join(folder.path, entry)
    return walk(entry, what=f"refusing to import {shown}", start=folder, named=shown,
                way=PASS, last=PASS)


def _exists(entry: str, dir_fd: int) -> bool:
    try:
        os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _file_spec(name: str, path: str, package: str | None = None):
    return importlib.util.spec_from_file_location(
        name, path, loader=_SourceOnlyLoader(name, path),
        submodule_search_locations=[package] if package else None)


def import_from_folder(folder: str) -> FolderModules:
    """Let ``import`` find the modules of ``folder`` after everything else, checked (once
    per folder; returns its finder)."""
    folder = os.path.abspath(folder)
    for finder in sys.meta_path:
        if isinstance(finder, FolderModules) and finder.folder == folder:
            return finder
    finder = FolderModules(folder)
    sys.meta_path.append(finder)
    return finder


#: The options of every Python hpcmesh starts. ``-P`` (Python 3.11) leaves the current
#: folder, or a ``-c`` program's, off ``sys.path``: started by root in /tmp or in a group's
#: project folder, the child would otherwise import another user's ``sysconfig.py`` there
#: before the standard library's, or their ``hpcmesh/`` before ours.
PYTHON_FLAGS = ("-P",)


def python_module(module: str, python: str | None = None) -> list[str]:
    """argv that runs ``module`` as hpcmesh runs its own: ``python -P -m module`` (with
    ``python``, default this interpreter)."""
    return [python or sys.executable, *PYTHON_FLAGS, "-m", module]


def current_folder_last() -> FolderModules | None:
    """In a Python hpcmesh started to run the user's code (an actor process): the current
    folder's modules, found after everything else and checked, where ``python -m`` would
    have put them first. Also takes that folder off ``sys.path`` when a command of the
    user's own started us without ``-P``. None when there is no current folder (removed)."""
    try:
        here = os.getcwd()
    except OSError:
        here = None
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", here):
        del sys.path[0]
    return import_from_folder(here) if here is not None else None


#: ``python -P -c RUN_MODULE module arg...`` is ``python -m module arg...`` with the current
#: folder's modules found last and checked (:func:`run_module`); it binds no name in
#: ``__main__``, which becomes the module's namespace.
RUN_MODULE = '__import__("hpcmesh.private_files.modules", fromlist=[""]).run_module()'


def run_module() -> None:
    """The body of :data:`RUN_MODULE`: ``sys.argv`` is ``['-c', module, arg...]``."""
    import runpy
    del sys.argv[0]
    current_folder_last()
    # what Python's own -m calls: the module runs in the real __main__, argv[0] becomes
    # its file, and a module that is not there exits 1 naming it (no traceback)
    runpy._run_module_as_main(sys.argv[0])


def run_module_argv(module: str, args=(), python: str | None = None) -> list[str]:
    """argv that runs the user's ``module`` as ``python -m`` would (see :data:`RUN_MODULE`)."""
    return [python or sys.executable, *PYTHON_FLAGS, "-c", RUN_MODULE, module, *map(str, args)]
