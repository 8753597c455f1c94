"""Paths another user of the node cannot redirect (issue 28): a mount point, the interpreter
inside a mount, and every lookup under a gathered folder.

A path handed to the kernel as a string is resolved again at each use, so a folder another
user may write can be swapped for a symlink between a check and the use. Here a path is
walked one name at a time, each opened with ``O_NOFOLLOW`` relative to the folder before it
(Python 3.11 has no ``openat2``), and what the walk opened is what the caller uses:

- ``resolve``: an absolute path through folders only root or this user can change (others
  may only add names to a sticky folder such as /tmp, never replace ours); symlinks are
  followed only when root or this user made them. With ``beneath``, the walk starts inside
  a folder already known to be ours (our own FUSE mount) and trusts what is in it, until a
  symlink leads out: from there every name is checked again.
- ``own_dir``: a folder that is this user's own, never a symlink (a mount point).
- ``beneath``: a name under a root that follows no symlink at all and never climbs out
  (``RESOLVE_BENEATH`` with ``RESOLVE_NO_SYMLINKS``): what a gathered folder serves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Iterator, NamedTuple

from ..errors import HpcmeshError

#: an opened name: usable with fstat, as a dir_fd, or re-opened as "." to read a folder
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
#: symlinks one resolution may follow before it fails with ELOOP (Linux's own bound)
MAX_LINKS = 40


class UntrustedPath(HpcmeshError, PermissionError):
    """A path another user could redirect or fill; the message names the path, what was
    found there (a symlink and its owner, a folder's owner or mode) and what is accepted."""

    def __init__(self, message: str):
        super().__init__(errno.EACCES, message)

    def __str__(self) -> str:
        return self.strerror


def explain(e: OSError, what: str) -> str:
    """An error of a walk as one line that starts with ``what``: the walk's own errors
    already do; the kernel's get ``what`` and the name it failed on."""
    text = e.strerror or str(e)
    if text.startswith(what):
        return text
    return f"{what}: {text}" + (f" ({e.filename})" if e.filename else "")


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    return "a folder" if stat.S_ISDIR(st.st_mode) else "a file"


def untrusted_because(st: os.stat_result, shown: str) -> str | None:
    """Why another user could change what ``shown`` (whose lstat is ``st``) is or holds, or
    None: it must be root's or this user's, and writable by nobody else (a sticky folder
    is fine: others can add names to it, not replace ours)."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return f"{shown} is {_kind(st)} owned by uid {st.st_uid}"
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022 and not sticky_dir:
        writers = "others" if st.st_mode & 0o002 else "its group"
        return (f"{shown} is {_kind(st)} that {writers} may write "
                f"(mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def _refuse(problem: str, what: str) -> UntrustedPath:
    me = os.geteuid()
    owners = "root" if me == 0 else f"root or uid {me}"
    return UntrustedPath(f"{what}: {problem}; accepted on the way are folders and symlinks of "
                         f"{owners} that no one else may write (or sticky folders, like "
                         f"/tmp)")


class Resolved(NamedTuple):
    fd: int                 # O_PATH, the caller's to close
    st: os.stat_result
    path: str               # where the walk ended, as an absolute path


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


@contextlib.contextmanager
def resolve(path: str, *, what: str, beneath: Resolved | None = None, follow_last: bool = True,
            trust_last: bool = True, create: bool = False) -> Iterator[Resolved]:
    """Open the absolute ``path`` (relative to ``beneath``, when given) through trusted
    folders only; UntrustedPath naming the first name another user could have changed.

    ``what`` starts each error (the API and host). ``follow_last=False``: a symlink as the
    last name is refused; ``trust_last=False``: the last name may be anybody's (only the way
    to it must be ours: a folder read with ``beneath`` needs no more). ``create``: missing
    names are made folders, 0700. ``beneath``: a folder of ours whose contents need no
    check (a mount we made), ``path`` being relative to it; ``..`` above it or an absolute
    symlink inside it goes on outside, checked again."""
    stack: list[int] = []
    try:
        if beneath is None:
            if not os.path.isabs(path):
                raise ValueError(f"{what}: {path!r} is not an absolute path")
            stack.append(_root(what))
            shown, inside = "/", False
        else:
            stack.append(os.dup(beneath.fd))
            shown, inside = beneath.path, True
        pending = _parts(path)[::-1]
        links, via = 0, ""          # via: the last link that led elsewhere, for errors
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    shown = os.path.dirname(shown)
                elif inside:            # climbing out of the mount: from its parent on
                    pending.extend(_parts(os.path.dirname(shown))[::-1])
                    _close_all(stack)
                    stack.append(_root(what))
                    shown, inside = "/", False
                continue
            here = os.path.join(shown, name)
            fd = _open_name(name, stack[-1], create, here)
            st = os.fstat(fd)
            checked = not inside and (pending or trust_last)
            if not stat.S_ISLNK(st.st_mode):
                if checked and (problem := untrusted_because(st, here)):
                    os.close(fd)
                    raise _refuse(problem + via, what)
                if pending and not stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, f"{what}: {here} is not a folder")
                stack.append(fd)
                shown = here
                continue
            try:
                target = os.readlink(name, dir_fd=stack[-1])
            finally:
                os.close(fd)
            if not inside and (problem := untrusted_because(st, here)):   # any link we follow
                raise _refuse(f"{problem} (to {target}){via}", what)
            if not pending and not follow_last:
                raise _a_symlink(here, target, st, what)
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, f"{what}: more than {MAX_LINKS} symlinks", path)
            pending.extend(_parts(target)[::-1])
            if target.startswith("/"):
                via = f", reached by the link {here} -> {target}"
                _close_all(stack)
                stack.append(_root(what))
                shown, inside = "/", False
        fd = stack.pop()
        try:
            yield Resolved(fd, os.fstat(fd), shown)
        finally:
            os.close(fd)
    finally:
        _close_all(stack)


def _a_symlink(path: str, target: str, st: os.stat_result, what: str) -> UntrustedPath:
    return UntrustedPath(f"{what}: {path} is a symlink (to {target}) owned by uid "
                         f"{st.st_uid}; it must be a folder itself, never a symlink")


def _root(what: str) -> int:
    fd = os.open("/", _PATH | os.O_DIRECTORY)
    problem = untrusted_because(os.fstat(fd), "/")
    if problem:
        os.close(fd)
        raise _refuse(problem, what)
    return fd


def _open_name(name: str, dir_fd: int, create: bool, shown: str) -> int:
    """``name`` in ``dir_fd`` opened without following it (made a 0700 folder first with
    ``create`` when missing); an error names ``shown``, the whole path."""
    try:
        try:
            return os.open(name, _PATH, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
        with contextlib.suppress(FileExistsError):     # made by someone since: checked next
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        return os.open(name, _PATH, dir_fd=dir_fd)
    except OSError as e:
        raise type(e)(e.errno, e.strerror, shown) from None


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


@contextlib.contextmanager
def own_dir(path: str, *, what: str, create: bool = False) -> Iterator[Resolved]:
    """The folder ``path``, reached through trusted folders, which must be this user's own
    and writable by no one else: never a symlink, whoever made it (a mount point). With
    ``create``, it and the folders missing on the way are made 0700."""
    parent, name = os.path.split(os.path.normpath(path))
    with resolve(parent, what=what, create=create) as up:
        fd = _open_name(name, up.fd, create, path)
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise _a_symlink(path, os.readlink(name, dir_fd=up.fd), st, what)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, f"{what}: {path} is a file, not a "
                                                        f"folder")
            me = os.geteuid()
            if st.st_uid != me or st.st_mode & 0o022:
                raise UntrustedPath(
                    f"{what}: {path} is a folder owned by uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):04o}; it must be uid {me}'s own, writable by "
                    f"no one else (give a new path and it is made 0700)")
            yield Resolved(fd, st, os.path.join(up.path, name))
        finally:
            os.close(fd)


@contextlib.contextmanager
def beneath(root_fd: int, relpath: str) -> Iterator[tuple[int, str]]:
    """(folder fd, name) of ``relpath`` under the open folder ``root_fd``, every folder on
    the way opened with ``O_NOFOLLOW``: a symlink there fails with ENOTDIR, ``..`` with
    EACCES, so nothing outside the root is reached. The caller acts on the last name with
    ``dir_fd`` and without following it; the root itself is ``(root_fd, ".")``."""
    parts = [p for p in relpath.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise PermissionError(errno.EACCES, f"{relpath!r} climbs out of the folder")
    opened: list[int] = []
    try:
        cur = root_fd
        for name in parts[:-1]:
            cur = os.open(name, _PATH | os.O_DIRECTORY, dir_fd=cur)
            opened.append(cur)
        yield cur, (parts[-1] if parts else ".")
    finally:
        _close_all(opened)
