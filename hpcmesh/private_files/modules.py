"""Modules of the current folder, found the way ``python -m`` finds them, but only last.

``hpcmesh apply mypkg.jobs.trainers`` names a module in the folder the user runs it from.
Putting that folder first on ``sys.path`` (what ``python -m`` does) lets anybody who can
write there (a shared project folder, /tmp) plant ``sysconfig.py`` and run code as the
user when anything imports ``sysconfig``. So the folder is never put on ``sys.path``: a
finder at the *end* of ``sys.meta_path`` is asked only for a top-level name nothing else
(the standard library, site-packages, ``PYTHONPATH``) has, and hands out a module or
package of that folder only when every folder from ``/`` down to it, and the file or
package folder found there, pass the ``PASS`` rule of :mod:`.walk`: root's or this user's
and writable by nobody else (the folder itself may be sticky, as /tmp is: others may add
names to it, not replace ours; a folder above that another user owns could be renamed
away and replaced by theirs). Anything else is an ``ImportError`` that names the path, its
owner and mode: code that tries an optional module falls back, the job spec's own import
says why it failed.

The source is read from the descriptor that was checked and compiled from those bytes;
bytecode is neither read nor written (a ``__pycache__`` in a shared folder is another
user's to plant). A package's submodules are found by :class:`_Packages`, which stands
before Python's path finder and answers for every package folder this finder vouched for,
checking each folder and file inside the same way: Python's path finder would look them up
again by path, and take bytecode.

The Pythons hpcmesh starts (actor processes, the fork server, host agents, filesystems,
``exec_python``'s modules) get the same rule: :func:`python_module` starts them with ``-P``,
which keeps their current folder off ``sys.path``, and those that run the user's code
(:func:`current_folder_last`, :data:`RUN_MODULE`) put this finder in its place.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import importlib.util
import os
import stat
import sys

from .walk import PASS, Opened, UntrustedPathError, check, describe, explain, walk


class _CheckedSource(importlib.abc.InspectLoader):
    """The source read, when the finder found it, from the descriptor it checked: nothing
    is looked up by path again (a path string is resolved anew at each use, and the file
    could be another by then), and no bytecode is read or written (a ``__pycache__`` in a
    shared folder is another user's to plant)."""

    def __init__(self, name: str, path: str, source: bytes, package: bool):
        self.name, self.path, self.source, self.package = name, path, source, package

    def get_source(self, fullname):
        return importlib.util.decode_source(self.source)

    def get_code(self, fullname):
        return compile(self.source, self.path, "exec", dont_inherit=True)

    def is_package(self, fullname):
        return self.package

    def get_filename(self, fullname):
        return self.path


class _Folder(importlib.abc.InspectLoader):
    """A package folder without ``__init__.py`` (a namespace package of one folder):
    empty code, its submodules come from :class:`_Packages`."""

    def get_source(self, fullname):
        return ""

    def is_package(self, fullname):
        return True


#: the package folders a finder vouched for (their ``__path__``): :class:`_Packages` finds
#: their submodules, so Python's path finder never searches them
_vouched: set[str] = set()


class FolderModules(importlib.abc.MetaPathFinder):
    """The top-level modules of ``folder`` that nothing before it on ``sys.meta_path``
    found, each checked before it is loaded (see the module's docstring)."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:
            return None                 # a submodule: _Packages, or not ours
        try:
            fd = os.open(self.folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:                            # a first look: a name that is not there is no error
            found = [entry for entry in (name, name + ".py") if _exists(entry, fd)]
        finally:
            os.close(fd)
        if not found:
            return None
        shown = os.path.join(self.folder, found[0])
        what = f"refusing to import {name!r} from {shown}"
        try:
            # from / on: a folder above that somebody else may change could be renamed away
            # and replaced by theirs between this walk and the next import
            with walk(self.folder, what=what, named=shown, way=PASS, last=None) as folder:
                check(folder.st, PASS, what=what, named=shown, where=self.folder,
                      kind="folder", last=False)
                return _spec(name, name, folder)
        except OSError as e:            # refused, or a dangling link, a loop...
            raise _import_error(e, f"cannot import {name!r} from {shown}", name, shown)


class _Packages(importlib.abc.MetaPathFinder):
    """The submodules of a package :class:`FolderModules` vouched for. It stands before
    Python's path finder, so a package's ``__path__`` is only searched here: each time from
    ``/``, the package folder and what is found in it held to ``PASS`` (a subpackage is
    vouched for in turn). A name that is not there is ``ModuleNotFoundError`` here, not
    left for the path finder to look up again by path."""

    def find_spec(self, name, path=None, target=None):
        if not path:
            return None
        entries = list(path)
        ours = [entry for entry in entries if entry in _vouched]
        if not ours:
            return None
        last = name.rpartition(".")[2]
        for entry in ours:
            shown = os.path.join(entry, last)
            what = f"refusing to import {name!r} from {shown}"
            try:
                with walk(entry, what=what, named=shown, way=PASS, last=PASS) as folder:
                    spec = _spec(name, last, folder)
            except OSError as e:
                raise _import_error(e, f"cannot import {name!r} from {shown}", name, shown)
            if spec is not None:
                return spec
        if len(ours) < len(entries):
            return None                 # a __path__ its package extended: those are its own
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _import_error(e: OSError, what: str, name: str, shown: str) -> ImportError:
    text = str(e) if isinstance(e, UntrustedPathError) else explain(e, what)
    return ImportError(text, name=name, path=shown)


def _spec(fullname: str, name: str, folder: Opened):
    """``name`` in ``folder`` as Python's own finder orders them: a folder with
    ``__init__.py``, then ``name.py``, then a folder without (a namespace package). Only
    the one chosen is checked (and read): an empty folder somebody else made beside our
    ``name.py`` in a sticky folder is passed over, as Python passes over it."""
    package = _is_dir(name, folder.fd)
    if package and _exists(os.path.join(name, "__init__.py"), folder.fd):
        with _walk(name, folder) as entry:
            if not stat.S_ISDIR(entry.st.st_mode):
                return None         # replaced meanwhile (by root or us)
            return _file_spec(fullname, "__init__.py", entry, package=entry.path)
    if _exists(name + ".py", folder.fd):
        return _file_spec(fullname, name + ".py", folder)
    if package:
        with _walk(name, folder) as entry:
            if not stat.S_ISDIR(entry.st.st_mode):
                return None
            _vouched.add(entry.path)
            spec = importlib.machinery.ModuleSpec(fullname, _Folder(), origin=None,
                                                  is_package=True)
            spec.submodule_search_locations = [entry.path]
            return spec
    return None


def _is_dir(entry: str, dir_fd: int) -> bool:
    """A first look, as Python's finder takes it (through links): the entry chosen is
    then walked and checked."""
    try:
        return stat.S_ISDIR(os.stat(entry, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


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


def _file_spec(fullname: str, entry: str, folder: Opened, package: str | None = None):
    """The spec of the source file ``entry`` of ``folder``: checked on the descriptor that
    is then read (re-opened through ``/proc/self/fd``: the same file, whatever its name
    leads to by now)."""
    with _walk(entry, folder) as found:
        shown = found.path
        fd = os.open(f"/proc/self/fd/{found.fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or \
                    (st.st_dev, st.st_ino) != (found.st.st_dev, found.st.st_ino):
                raise OSError(errno.EINVAL, f"refusing to import {shown}: it is "
                                            f"{describe(st)}, not a source file", shown)
            source = f.read()
    if package is not None:
        _vouched.add(package)
    spec = importlib.machinery.ModuleSpec(
        fullname, _CheckedSource(fullname, shown, source, package is not None),
        origin=shown, is_package=package is not None)
    spec.has_location = True
    if package is not None:
        spec.submodule_search_locations = [package]
    return spec


def _install_packages() -> None:
    """:class:`_Packages` just before Python's path finder (once)."""
    if any(isinstance(finder, _Packages) for finder in sys.meta_path):
        return
    at = next((i for i, finder in enumerate(sys.meta_path)
               if finder is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, _Packages())


def import_from_folder(folder: str) -> FolderModules:
    """Let ``import`` find the modules of ``folder`` after everything else, checked (once
    per folder; returns its finder)."""
    folder = os.path.abspath(folder)
    for finder in sys.meta_path:
        if isinstance(finder, FolderModules) and finder.folder == folder:
            return finder
    _install_packages()
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


#: ``python -P -c RUN_SCRIPT script arg...`` is ``python script arg...`` with the script's
#: folder's modules found last and checked (:func:`run_script`), where plain Python puts
#: that folder first on ``sys.path`` (another user's ``json.py`` beside a script in /tmp).
#: After ``-c CODE`` a script named ``-x.py`` is never taken for an option.
RUN_SCRIPT = '__import__("hpcmesh.private_files.modules", fromlist=[""]).run_script()'


def run_script() -> None:
    """The body of :data:`RUN_SCRIPT`: ``sys.argv`` is ``['-c', script, arg...]``. The
    script runs in the real ``__main__``, named by ``__file__`` and ``sys.argv[0]`` as
    given; one that cannot be opened exits 2 naming it, as Python does."""
    del sys.argv[0]
    path = sys.argv[0]
    import_from_folder(os.path.dirname(os.path.abspath(path)))
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        print(f"{sys.executable}: can't open file {os.path.abspath(path)!r}: [Errno "
              f"{e.errno}] {e.strerror}", file=sys.stderr)
        sys.exit(2)
    main = sys.modules["__main__"]
    main.__file__ = path
    exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)


def run_script_argv(script: str, args=(), python: str | None = None) -> list[str]:
    """argv that runs the user's ``script`` as ``python script`` would (see
    :data:`RUN_SCRIPT`)."""
    return [python or sys.executable, *PYTHON_FLAGS, "-c", RUN_SCRIPT, script, *map(str, args)]
