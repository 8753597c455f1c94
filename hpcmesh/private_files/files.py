"""Files and folders this user can trust on a shared machine, and the runtime folder.

A login node is shared (SPEC §7). A file another user made, or can change, may be a pickle
that runs their code when we load it, or a symlink that makes us write where they point.
What hpcmesh keeps for itself (the job cache, secrets, logs, the runtime folder of sockets
and stack dumps) is reached through here, and trusted only when it and every folder on its
way down from a *top* folder pass the ``TRUST`` rule of :mod:`.walk`: owned by this user and
not writable by group or others, checked on the descriptor that is then used.

Folders above the top are the user's choice (a project under a group's scratch space, a
symlinked home) and are taken as the kernel finds them: the descriptor is used at once, and
nobody else can put a folder of ours at the top. A symlink at the end (the context link
``.hpcmesh/job_state.pkl``) is followed when it is this user's, and its target is checked
in the same way. Folders are made 0700; files are made 0600 with ``O_CREAT|O_EXCL|
O_NOFOLLOW`` and replaced atomically (a temporary name, fsync, rename). Logs are appended
to with ``O_NOFOLLOW`` (a symlink there is refused, never followed); a secret (the job's
key) is written only into a 0700 folder and read only from a file nobody else can read.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import stat
import tempfile
import threading
import uuid

from .walk import (MAX_LINKS, TRUST, Opened, UntrustedPathError, check, refusal, remove_hint,
                   requirement, user_name, walk)


def _chain(top: str, folders: list[str], what: str, path: str, *, create: bool,
           private: bool, via: str = "") -> Opened:
    """The folder ``top``/``folders``, each folder from the top down held to ``TRUST``
    (``private``: the last one 0700). ``top`` itself may be a symlink of ours."""
    parent, name = os.path.split(top)
    if not name:
        raise ValueError(f"the top of a trusted folder chain cannot be {top}")
    if create:
        make_dirs(parent)       # above the top: the user's, made as usual (never g/o-writable)
    above = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return walk(os.path.join(name, *folders), what=f"refusing {what} {path}", named=path,
                    start=Opened(above, os.fstat(above), parent), way=TRUST, last=TRUST,
                    private=private, create=create, top_link=True, via=via)
    finally:
        os.close(above)


def _check_file(fd: int, what: str, path: str, where: str, private: bool) -> None:
    check(os.fstat(fd), TRUST, what=f"refusing {what} {path}", named=path, where=where,
          kind="file", private=private)


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _split(path: str, top: str) -> list[str]:
    """The names from ``top`` down to ``path`` (both absolute and normalized)."""
    if path == top or not _inside(path, top):
        raise ValueError(f"{path} is not inside the folder {top}")
    return os.path.relpath(path, top).split(os.sep)


def _locate(path: str, top: str | None, what: str, *, create: bool, follow: bool = True,
            private: bool = False) -> tuple[int, str, str]:
    """(fd of the checked folder that holds the file, its name there, its full path) for
    ``path``, following (``follow``) this user's own symlinks at the end: into folders
    checked from ``top`` when the target is below it, else from the target's own folder.
    ``private``: the folder that holds the file must be 0700 (made so if missing)."""
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top is not None else os.path.dirname(path)
    shown, via = path, ""
    for _ in range(MAX_LINKS + 1):
        *folders, name = _split(path, top)
        dfd = _chain(top, folders, what, shown, create=create, private=private, via=via).fd
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return dfd, name, path
        if not follow or not stat.S_ISLNK(st.st_mode):
            return dfd, name, path
        try:
            target = os.readlink(name, dir_fd=dfd)
            if st.st_uid != os.geteuid():
                raise refusal(f"refusing {what} {shown}", shown, path, st, "symlinks of this "
                              f"user, {user_name(os.geteuid())}, into folders of this user",
                              via=via, target=target, why=remove_hint(path))
        finally:
            os.close(dfd)
        via = f", reached by the link {path} -> {target}"
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if not _inside(path, top):
            top = os.path.dirname(path)
    raise OSError(errno.ELOOP, f"over {MAX_LINKS} symlinks on the way to {what}", shown)


def private_dir(path: str, *, what: str = "folder", top: str | None = None,
                create: bool = True, private: bool = True) -> str:
    """Make (0700, with the folders between ``top`` and it) or check the folder ``path``
    and every folder from ``top`` (default: ``path`` itself) down to it; returns ``path``.
    ``private``: ``path`` must be 0700 (a group- or world-readable one of ours is
    tightened), else only not writable by others."""
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top is not None else path
    folders = [] if top == path else _split(path, top)
    with _chain(top, folders, what, path, create=create, private=private):
        return path


def make_dirs(path: str) -> str:
    """``os.makedirs(path, exist_ok=True)`` whose new folders group and others cannot
    write (0755 less the umask): under a umask of 002 plain ``makedirs`` of a log folder
    would make ``.hpcmesh`` group-writable, and so untrusted for the job cache."""
    head = os.path.dirname(path)
    if head and head != path and not os.path.isdir(head):
        make_dirs(head)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    return path


def open_file(path: str, *, top: str | None = None, what: str = "file",
              secret: bool = False):
    """``path`` opened for reading (binary): a file of ours that nobody else can write, in
    folders checked from ``top`` (default: its own folder). ``secret``: nobody else may
    read it either (mode 0600). ``FileNotFoundError`` when it is not there."""
    dfd, name, real = _locate(path, top, what, create=False)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    finally:
        os.close(dfd)
    f = os.fdopen(fd, "rb")
    try:
        _check_file(fd, what, os.path.abspath(path), real, secret)
    except BaseException:
        f.close()
        raise
    return f


def read_file(path: str, *, top: str | None = None, what: str = "file") -> bytes:
    """The content of ``path``, checked as :func:`open_file` does."""
    with open_file(path, top=top, what=what) as f:
        return f.read()


def write_file(path: str, data: bytes, *, top: str | None = None, what: str = "file") -> str:
    """Replace ``path`` with ``data`` atomically, mode 0600: written to a new temporary
    name beside it, fsynced, renamed over it. Missing folders from ``top`` (default: its
    own folder) down are made 0700. Returns the path written (after our own symlinks)."""
    dfd, name, real = _locate(path, top, what, create=True)
    try:
        tmp = f".{name}.{uuid.uuid4().hex[:12]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        folder = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
        try:
            os.fsync(folder)            # the rename itself survives a crash
        finally:
            os.close(folder)
    finally:
        os.close(dfd)
    return real


def create_file(path: str, *, top: str | None = None, what: str = "file",
                replace: bool = False, flags: int = os.O_WRONLY, secret: bool = False) -> int:
    """A new file at ``path`` (mode 0600, ``O_CREAT|O_EXCL|O_NOFOLLOW``), open with
    ``flags``; its folders checked from ``top`` (default: its own folder) and made if
    missing. ``replace``: whatever has that name is removed first (a stale file, or link,
    of a process that had the same pid), else ``FileExistsError``. ``secret``: the folder
    that holds it must be 0700 too (one of ours others may only read is tightened)."""
    dfd, name, _real = _locate(path, top, what, create=True, follow=False, private=secret)
    try:
        if replace:
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
        return os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                       dir_fd=dfd)
    finally:
        os.close(dfd)


def append_file(path: str, *, top: str | None = None, what: str = "file",
                mode: int = 0o600):
    """``path`` opened to append to (an unbuffered binary file; ``name`` is the path): a
    log. Made (``mode``, less the umask) if missing, with its folders from ``top``
    (default: its own folder); one already there must be a file of ours that nobody else
    can write (the log of an earlier run). A symlink there is refused, never followed,
    whoever made it: a log line must not land in a file somebody chose."""
    path = os.path.abspath(path)
    dfd, name, real = _locate(path, top, what, create=True, follow=False)
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, mode,
                         dir_fd=dfd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            raise refusal(f"refusing {what} {path}", path, real, st, requirement("file"),
                          target=os.readlink(name, dir_fd=dfd),
                          why=remove_hint(real) if st.st_uid != os.geteuid() else
                          f"hpcmesh writes no log through a symlink; `rm {real}` if it should "
                          f"not be there") from None
    finally:
        os.close(dfd)
    f = open(fd, "ab", buffering=0)
    try:
        _check_file(fd, what, path, real, False)
    except BaseException:
        f.close()
        raise
    f.name = path
    return f


def remove_file(path: str, *, top: str | None = None, what: str = "file") -> None:
    """Remove the file ``path`` leads to (through our own symlinks; the links stay), in
    folders checked from ``top``. Nothing there is not an error."""
    try:
        dfd, name, _real = _locate(path, top, what, create=False)
    except FileNotFoundError:
        return
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def write_link(path: str, target: str, *, top: str | None = None,
               what: str = "symlink") -> None:
    """Make ``path`` a symlink to ``target`` (replacing what is there, atomically), in
    folders checked from ``top`` and made if missing."""
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top is not None else os.path.dirname(path)
    *folders, name = _split(path, top)
    dfd = _chain(top, folders, what, path, create=True, private=False).fd
    try:
        try:
            if os.readlink(name, dir_fd=dfd) == target:
                return
        except OSError:
            pass                        # nothing there, or not a link: replaced below
        tmp = f".{name}.{uuid.uuid4().hex[:12]}.tmp"
        os.symlink(target, tmp, dir_fd=dfd)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


# -- the per-user runtime folder ------------------------------------------------------------
#: the runtime folder this process chose, for the processes it starts (agents, workers)
RUNTIME_VAR = "HPCMESH_RUNTIME_DIR"
_fresh_lock = threading.Lock()
_log = logging.getLogger("hpcmesh.private_files")


def runtime_dir() -> str:
    """This user's folder of Unix sockets and stack dumps, made 0700; one that another user
    owns or can write is never used: they could delete the sockets or point a stack dump
    somewhere else. In order:

    - ``$HPCMESH_RUNTIME_DIR``: what a parent process chose (or the user); it must be a
      folder of this user's, 0700 (made if missing), else it is refused; except a fresh
      folder as below that a parent chose, which sbatch/srun carry to other hosts: missing
      or not ours here, another fresh one is taken beside it (one warning);
    - ``$XDG_RUNTIME_DIR/hpcmesh`` when the session has one (that folder must be ours too);
    - ``hpcmesh-<uid>`` in the temporary folder (``$TMPDIR``, /tmp). Anybody can make that
      name first; then a fresh folder ``hpcmesh-<uid>-XXXXXXXX`` beside it is used instead
      (one warning names the one taken), and exported as ``$HPCMESH_RUNTIME_DIR`` so the
      processes this one starts use it too. The process that made it removes it at exit
      if it is empty.

    Keep it short: a socket path has 107 bytes."""
    chosen = os.environ.get(RUNTIME_VAR)
    if chosen:
        return _chosen_runtime_dir(chosen)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            return private_dir(os.path.join(xdg, "hpcmesh"), top=xdg,
                               what="the runtime folder")
        except UntrustedPathError as e:
            raise UntrustedPathError(f"{e}. Or set XDG_RUNTIME_DIR to a folder of this "
                                     f"user's") from None
    fixed = os.path.join(tempfile.gettempdir(), f"hpcmesh-{os.geteuid()}")
    try:
        return private_dir(fixed, what="the runtime folder")
    except (UntrustedPathError, NotADirectoryError) as e:
        return _fresh_runtime_dir(e)


def _chosen_runtime_dir(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(f"{RUNTIME_VAR}={path!r} is not an absolute path; it names the "
                         f"runtime folder: an absolute path to a 0700 folder of this user's")
    # a fresh folder a process made (below) is carried by sbatch/srun to other hosts, where
    # it is missing or anybody may have made that known name first: there it is a hint
    fallback = os.path.basename(path).startswith(f"hpcmesh-{os.geteuid()}-")
    if fallback and not os.path.lexists(path):
        return _fresh_runtime_dir(None, stale=path)
    try:
        return private_dir(path, what=f"the runtime folder (${RUNTIME_VAR})")
    except (UntrustedPathError, NotADirectoryError) as e:
        if fallback:
            return _fresh_runtime_dir(e, stale=path)
        raise type(e)(f"{e.strerror or e}. Or unset {RUNTIME_VAR}, or point it at a 0700 "
                      f"folder of this user's") from None


def _fresh_runtime_dir(taken: OSError | None, stale: str | None = None) -> str:
    """A new 0700 folder of ours in the temporary folder, for this process and its
    children, when the fixed name is somebody else's (``taken`` says whose), or when the
    fresh folder a parent chose (``stale``, inherited) is missing here (``taken`` None) or
    not ours. Beside ``stale`` when its folder is here. Removed at exit if left empty."""
    with _fresh_lock:
        chosen = os.environ.get(RUNTIME_VAR)      # another thread made one meanwhile
        if chosen and chosen != stale:
            return _chosen_runtime_dir(chosen)
        prefix = f"hpcmesh-{os.geteuid()}-"
        try:
            path = tempfile.mkdtemp(prefix=prefix, dir=os.path.dirname(stale) if stale
                                    else None)                          # 0700, O_EXCL
        except OSError:
            path = tempfile.mkdtemp(prefix=prefix)
        private_dir(path, what="the runtime folder")
        os.environ[RUNTIME_VAR] = path
        atexit.register(_remove_if_empty, path, os.getpid())
    reason = (taken.strerror or str(taken)).rstrip(".") if taken is not None else \
        f"the runtime folder {stale} (${RUNTIME_VAR}, chosen on another host?) is not here"
    _log.warning("%s; using %s instead (exported as %s to the processes this one starts)",
                 reason, path, RUNTIME_VAR)
    return path


def _remove_if_empty(path: str, pid: int) -> None:
    """At exit of the process that made the fresh runtime folder ``path`` (not of a child
    forked from it): removed when nothing is left in it."""
    if os.getpid() == pid:
        try:
            os.rmdir(path)
        except OSError:
            pass
