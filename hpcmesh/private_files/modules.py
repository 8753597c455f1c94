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
