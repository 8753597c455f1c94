"""The one walk to a path that another local user cannot redirect, and its two rules.

A path handed to the kernel as a string is looked up again at each use, so a folder another
user may write can be swapped for a symlink between a check and the use. Here a path is
walked one name at a time, each opened ``O_PATH|O_NOFOLLOW`` relative to the folder before
it (Python 3.11 has no ``openat2``) and checked on that descriptor; what the walk opened is
what the caller uses, whatever anybody renames meanwhile.

A name on the way is held to one of two rules:

- ``PASS``, a folder we may pass through: root's or this user's, and writable by nobody
  else; a sticky folder (/tmp) too, except as the last name: others may add names to it,
  never replace ours. A symlink is followed only when root or this user made it.
- ``TRUST``, a folder we trust (hpcmesh keeps its files in it): this user's, writable by
  nobody else (``private``: 0700), never a symlink.

Or to none: inside a folder already known to be ours (our own FUSE mount) nothing is
checked, but a symlink that leads out goes on from ``/`` under ``PASS``.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from typing import NamedTuple

from ..errors import HpcmeshError

#: a folder we may pass through (the way to a mount point, a mounted interpreter)
PASS = "pass"
#: a folder we trust (one hpcmesh keeps its own files in)
TRUST = "trust"
#: symlinks one walk follows before it fails with ELOOP (Linux's own bound)
MAX_LINKS = 40
#: mode bits that let somebody else change a folder's entries or a file's content
OTHERS_WRITE = 0o022
#: mode bits of any access by somebody else (a private folder has none)
OTHERS_ANY = 0o077
#: a name opened as it is: a symlink stays a symlink; usable with fstat and as a dir_fd
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPathError(HpcmeshError, PermissionError):
    """A path hpcmesh would use that another user could have made, changed or redirected:
    owned by somebody else, writable by others, or a symlink that may not be followed. The
    message names the path, what was found there (kind, owner, mode) and what is required."""


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid without an account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def describe(st: os.stat_result, target: str | None = None) -> str:
    """What an ``lstat`` result is, for an error: kind, owner, and mode or link target."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return f"a symlink owned by {user_name(st.st_uid)}" + (f", to {target}" if target else "")
    kind = "a folder" if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode) \
        else "a special file"
    return f"{kind} owned by {user_name(st.st_uid)}, mode {stat.S_IMODE(mode):04o}"


def requirement(kind: str, private: bool = False) -> str:
    """What ``TRUST`` asks of a ``kind`` (folder, file); a private folder is 0700, a private
    file (a secret) 0600."""
    me = user_name(os.geteuid())
    if private:
        return (f"a {kind} owned by this user, {me}, with mode "
                f"{'0700' if kind == 'folder' else '0600'}")
    return f"a {kind} owned by this user, {me}, that group and others cannot write"


def _passable(kind: str | None) -> str:
    """What ``PASS`` asks: on the way (``kind`` None), or of the last name."""
    me = os.geteuid()
    owners = "root" if me == 0 else f"root or by this user, {user_name(me)},"
    if kind is None:
        return (f"folders and symlinks on the way owned by {owners} that nobody else can "
                f"write, or sticky ones such as /tmp")
    return f"a {kind} owned by {owners} that nobody else can write"


def refusal(what: str, named: str, where: str, st: os.stat_result, required: str, *,
            why: str = "", fix: str = "", via: str = "",
            target: str | None = None) -> UntrustedPathError:
    """The error for ``where`` (``st``), met on the way to ``named``; ``what`` starts it."""
    at = "it" if where == named else where
    why = why or (f"others could have changed it; if none did, `{fix}` makes it trusted"
                  if fix else "another user could have put it there")
    return UntrustedPathError(f"{what}: {at} is {describe(st, target)}{via}; hpcmesh trusts "
                              f"only {required} ({why})")


def check(st: os.stat_result, rule: str, *, what: str, named: str, where: str,
          kind: str | None = None, last: bool = True, private: bool = False,
          via: str = "", fd: int | None = None) -> None:
    """Raise unless ``where`` (``st``; ``fd`` open on it) may be there under ``rule``:
    UntrustedPathError for an owner or mode another user could use, ``NotADirectoryError``
    or ``IsADirectoryError`` when it is not the ``kind`` needed. ``private`` (``TRUST``):
    nothing for others; a folder of ours that others may only read is made 0700 (nobody
    else can have written in it), a file (a secret) others can read is refused (tightening
    it would hide that it leaked)."""
    me, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    is_dir = stat.S_ISDIR(st.st_mode)
    trust = rule == TRUST
    private = private and trust
    shown_kind = kind or ("folder" if is_dir else "file")
    required = requirement(shown_kind, private) if trust else \
        _passable(None if not last else shown_kind)

    def refuse(**kw) -> UntrustedPathError:
        return refusal(what, named, where, st, required, via=via, **kw)

    if st.st_uid not in ((me,) if trust else (0, me)):
        # hpcmesh's own (trust) or the thing named (last): nothing of ours, so remove it;
        # a folder on the way is somebody's place to pass through, not ours to remove
        raise refuse(why=remove_hint(where, is_dir) if trust or last else "")
    if kind == "folder" and not is_dir:
        raise NotADirectoryError(errno.ENOTDIR, f"{what}: {where} is {describe(st)}, not a "
                                                f"folder", where)
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        raise (IsADirectoryError if is_dir else OSError)(
            errno.EISDIR if is_dir else errno.EINVAL,
            f"{what}: {where} is {describe(st)}, not a regular file", where)
    if mode & OTHERS_WRITE:
        if is_dir and mode & stat.S_ISVTX:
            if not trust and not last:
                return              # others may add names to it, not replace ours
            raise refuse(why="a folder every user may add to; keep hpcmesh's files in a "
                             "folder of this user's")
        if st.st_uid != me:
            raise refuse(why=f"others could have changed it; its owner can `chmod "
                             f"{'-R ' if is_dir else ''}go-w {where}`")
        raise refuse(fix=_chmod(where, is_dir, private))
    if private and mode & OTHERS_ANY:
        if not is_dir:
            raise refuse(why="others could have read it; `chmod 600` it and start the job "
                             "again for a new one")
        if fd is None:
            raise refuse(why=f"others may read it; `{_chmod(where, True, True)}` makes it "
                             f"private")
        rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            os.fchmod(rfd, mode & ~OTHERS_ANY)
        finally:
            os.close(rfd)


def _chmod(where: str, is_dir: bool, private: bool) -> str:
    """The command that makes ``where`` of ours trusted: what is inside a folder too (a
    checkout made with umask 0 has every folder below group-writable)."""
    if is_dir:
        return f"chmod -R {'go-rwx' if private else 'go-w'} {where}"
    return f"chmod {'600' if private else 'go-w'} {where}"


def remove_hint(where: str, is_dir: bool = False) -> str:
    """Why another user's thing is refused, and the way out."""
    return (f"another user could have put it there; `rm {'-r ' if is_dir else ''}{where}`, "
            f"as its owner or root, removes it")


class Opened(NamedTuple):
    """What a walk opened: ``fd`` (``O_PATH``: fstat it, use it as a ``dir_fd``, re-open
    ``"."`` in it), its ``st``, and ``path``, where the walk ended. ``with`` closes it."""
    fd: int
    st: os.stat_result
    path: str

    def __enter__(self) -> "Opened":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def explain(e: OSError, what: str) -> str:
    """An error of a walk as one line that starts with ``what``: the walk's own errors
    already do; the kernel's get ``what`` and the name it failed on."""
    text = e.strerror or str(e)
    if text.startswith(what):
        return text
    return f"{what}: {text}" + (f" ({e.filename})" if e.filename else "")


def walk(path: str, *, what: str, named: str | None = None, start: Opened | None = None,
         way: str | None = PASS, last: str | None = PASS, private: bool = False,
         create: bool = False, follow: bool = True, top_link: bool = False,
         via: str = "") -> Opened:
    """Open ``path`` one name at a time: from ``/`` (an absolute path), or from ``start``,
    which the caller opened and vouches for. Each name on the way is held to ``way`` and
    the last to ``last`` (``None``: not checked; a symlink there must still be root's or
    ours to be followed). ``way=None`` with ``start``: what is inside ``start`` is not
    checked and its symlinks are followed; ``..`` above it or an absolute link goes on from
    ``/`` under ``PASS``. ``follow=False``: no symlink is followed at all (ENOTDIR).

    ``what`` starts each error, ``named`` (default ``path``) is the path it names: "it" there.
    ``private``: the last folder must be 0700. ``create``: missing names are made folders,
    0700. ``top_link``: the first name may be this user's own symlink (a project's
    ``.hpcmesh`` kept elsewhere), whose target the kernel finds and the rule then checks.
    ``via``: how the walk got here, for errors (a link followed before it)."""
    named = named if named is not None else path
    me = os.geteuid()
    stack: list[int] = []
    try:
        if start is None:
            if not os.path.isabs(path):
                raise ValueError(f"{what}: {path!r} is not an absolute path")
            stack.append(_root(what, named, via))
            shown, inside = "/", False
        else:
            stack.append(os.dup(start.fd))
            shown, inside = start.path, way is None
        pending = _parts(path)[::-1]
        first, links = True, 0
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    shown = os.path.dirname(shown)
                elif inside and follow:         # out of start: from its parent on, checked
                    pending.extend(_parts(os.path.dirname(shown))[::-1])
                    _close_all(stack)
                    stack.append(_root(what, named, via))
                    shown, inside, way = "/", False, PASS
                elif shown != "/":
                    raise PermissionError(errno.EACCES, f"{what}: {path!r} climbs out of "
                                                        f"{shown}")
                continue
            here = os.path.join(shown, name)
            is_last = not pending
            rule = None if inside else (last if is_last else way)
            fd = _open(name, stack[-1], create, here)
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    target = os.readlink("", dir_fd=fd)
                    if not follow:
                        raise NotADirectoryError(errno.ENOTDIR, f"{what}: {here} is a symlink"
                                                                f" (to {target}), not followed",
                                                 here)
                    if rule == TRUST:
                        if not (top_link and first and st.st_uid == me):
                            raise refusal(what, named, here, st,
                                          requirement("folder", private and is_last),
                                          via=via, target=target,
                                          why=remove_hint(here) if st.st_uid != me else
                                          "hpcmesh follows no symlink there; name the "
                                          "folder it leads to")
                        top = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                                      dir_fd=stack[-1])     # our own pointer to the top
                        os.close(fd)
                        fd, st = top, os.fstat(top)
                    else:
                        if not inside and st.st_uid not in (0, me):
                            raise refusal(what, named, here, st, _passable(None), via=via,
                                          target=target,
                                          why=remove_hint(here) if is_last else "")
                        links += 1
                        if links > MAX_LINKS:
                            raise OSError(errno.ELOOP, f"{what}: more than {MAX_LINKS} "
                                                       f"symlinks", named)
                        pending.extend(_parts(target)[::-1])
                        if target.startswith("/"):
                            via = f", reached by the link {here} -> {target}"
                            _close_all(stack)
                            stack.append(_root(what, named, via))
                            shown, inside = "/", False
                            way = PASS if way is None else way
                        first = False
                        os.close(fd)
                        continue
                if rule is not None:
                    check(st, rule, what=what, named=named, where=here, last=is_last,
                          kind="folder" if rule == TRUST or not is_last else None,
                          private=private and is_last, via=via, fd=fd)
            except BaseException:
                os.close(fd)
                raise
            stack.append(fd)
            shown, first = here, False
        fd = stack.pop()
        return Opened(fd, os.fstat(fd), shown)
    finally:
        _close_all(stack)


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _root(what: str, named: str, via: str) -> int:
    fd = os.open("/", _PATH | os.O_DIRECTORY)
    try:
        check(os.fstat(fd), PASS, what=what, named=named, where="/", kind="folder",
              last=False, via=via)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open(name: str, dir_fd: int, create: bool, shown: str) -> int:
    """``name`` in ``dir_fd`` opened as it is (made a 0700 folder first with ``create``
    when missing); an error names ``shown``, the whole path."""
    try:
        try:
            return os.open(name, _PATH, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass                    # made by someone meanwhile: checked like any other
        return os.open(name, _PATH, dir_fd=dir_fd)
    except OSError as e:
        raise type(e)(e.errno, e.strerror, shown) from None


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())
