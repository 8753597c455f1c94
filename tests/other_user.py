"""A second local user, for tests of what another account on a shared login node can do.

The test suite runs as root in CI. A test that asks for the ``other_user`` fixture gets a
fresh account (``useradd``), runs the attacker's steps as that account (real uid/gid, no
supplementary groups), and the account is removed afterwards with its home and every
process it left. Outside CI a machine where we are not root skips these tests; in CI
that is a broken setup and the test fails (``ci_gate``).

The attacker runs Debian's ``/usr/bin/python3`` (the project's venv lives under root's
home, which another user cannot read): its steps are plain file and socket operations.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from ci_gate import skip_or_fail

SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int
    home: str

    def run(self, argv: list[str], *, timeout: float = 30, check: bool = False,
            cwd: str | None = None, input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` as this user with a clean environment."""
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[],
                              env=self.env(), cwd=cwd or self.home, input=input,
                              capture_output=True, text=True, timeout=timeout, check=check)

    def python(self, code: str, *args: str, timeout: float = 30,
               check: bool = True) -> subprocess.CompletedProcess:
        """Run Python ``code`` as this user (``sys.argv[1:]`` is ``args``)."""
        return self.run([SYSTEM_PYTHON, "-c", code, *args], timeout=timeout, check=check)

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` as this user in the background (killed with the account)."""
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[],
                                env=self.env(), cwd=self.home, **kw)

    def env(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name,
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

    def own(self, path: str) -> None:
        """Give ``path`` (made by the test as root) to this user, as if they had made it."""
        os.lchown(path, self.uid, self.gid)


def _kill_all(uid: int) -> None:
    for _ in range(20):
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        pids.append(int(entry))
                except OSError:
                    pass
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def create_other_user() -> OtherUser:
    """A new local account; the caller must ``remove_other_user`` it."""
    if os.geteuid() != 0:
        skip_or_fail("needs root to create a second local user (useradd)")
    if shutil.which("useradd") is None and not os.path.exists("/usr/sbin/useradd"):
        skip_or_fail("needs useradd (Debian's passwd package)")
    name = f"hpcmo{secrets.token_hex(4)}"
    subprocess.run(["/usr/sbin/useradd", "--create-home", "--shell", "/bin/sh",
                    "--user-group", name], check=True, capture_output=True, text=True)
    pw = pwd.getpwnam(name)
    os.chmod(pw.pw_dir, 0o755)
    return OtherUser(name=name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir)


def remove_other_user(user: OtherUser) -> None:
    _kill_all(user.uid)
    subprocess.run(["/usr/sbin/userdel", "--remove", "--force", user.name],
                   capture_output=True, text=True)
