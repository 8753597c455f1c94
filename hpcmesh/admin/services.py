"""Where ``hpcmesh debug`` and ``hpcmesh top`` find a running job's service URLs.

The URLs carry the job's token, and the admin token grants a pdb prompt in the job's
processes: code execution as this user. So they come only from places no other user of
the host can read or could have written: the services file the job's client writes beside
its job state (0600, this user's), a file named with ``--url-file`` (held to the same
checks), standard input (``--url-file -``), or the environment (``/proc/<pid>/environ``
is private to its user). Never the command line: every user's is in ``ps``.
"""

from __future__ import annotations

import getpass
import json
import os
import stat
import sys
import time
from typing import Any, Mapping, TextIO

from ..errors import HpcmeshError
from ..private_files import open_file, write_file
from ..runtime.observe.introspect import ADMIN_URL_VARS

#: Where a controller writes its services' URLs (beside the job's cache).
SERVICES_FILE = "services.json"
#: Where the telemetry server's URL is exported (``telemetry/server.py``'s ``URL_VARS``).
TELEMETRY_URL_VAR = "HPCMESH_TELEMETRY_URL"
#: The most a URL file is read of.
MAX_FILE = 64 * 1024


class ServiceURLError(HpcmeshError):
    """No URL to be had, or one from a place that is not trusted: the message says why."""


def write_services_file(folder: str, fields: Mapping[str, Any]) -> str:
    """Record the URLs for ``hpcmesh top``/``debug`` in ``folder``, a folder of this user's
    that nobody else can write: a new file of mode 0600 (nothing that was there before gets
    the token), renamed into place (``private_files.write_file``)."""
    urls = {k: v for k, v in fields.items() if k.endswith("_url") and isinstance(v, str)}
    doc = json.dumps(dict(urls, pid=os.getpid(), written=time.time()))
    return write_file(os.path.join(folder, SERVICES_FILE), doc.encode(),
                      what="the services file")


def read_private_file(path: str, what: str = "the file with the job's URL") -> str:
    """The text of ``path``, a regular file of this user in folders nobody else can write
    (``private_files.open_file``: no link followed that is not ours), that no one else may
    read either; else an error saying which check failed."""
    path = os.path.abspath(path)
    with open_file(path, what=what) as f:
        st = os.fstat(f.fileno())
        if st.st_mode & 0o077:
            raise ServiceURLError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: it carries the job's token, "
                f"so it must be 0600 (yours alone); chmod 600 it, and as others could read "
                f"the token, restart the job's client for a new one")
        return f.read(MAX_FILE).decode("utf-8", "replace")


def parse_urls(text: str, source: str) -> dict[str, Any]:
    """The URLs in ``text``: a services file's JSON, or a URL on its first line."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ServiceURLError(f"{source}: not the JSON of a services file ({e})") from None
        if isinstance(doc, dict):
            return doc
        raise ServiceURLError(f"{source}: not the JSON of a services file (an object)")
    line = text.splitlines()[0].strip() if text else ""
    if not line.startswith(("http://", "https://")):
        raise ServiceURLError(f"{source}: no URL there (a line like "
                              f"http://127.0.0.1:PORT/?token=..., or a services.json)")
    return {"admin_url": line}


def read_services_file(folder: str) -> dict[str, Any]:
    """The URLs the job's client wrote in ``folder`` (checked as :func:`read_private_file`)."""
    path = os.path.join(folder, SERVICES_FILE)
    return parse_urls(read_private_file(path, "the services file"), path)


def read_url_input(url_file: str, stdin: TextIO | None = None) -> dict[str, Any]:
    """``--url-file``: a file's URLs, or with ``-`` a URL from standard input (one line;
    asked for without echo on a terminal, so it is not on the screen either)."""
    if url_file != "-":
        return parse_urls(read_private_file(url_file), url_file)
    stdin = stdin or sys.stdin
    if stdin.isatty():
        line = getpass.getpass("the job's URL (not shown): ")
    else:
        line = stdin.readline()
    return parse_urls(line, "standard input")


def find_urls(url_file: str | None, folder: str,
              environ: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """(admin URL, telemetry URL or None): from ``url_file`` if given, else the
    environment, else the services file in ``folder`` (the current context's)."""
    if url_file is not None:
        urls = read_url_input(url_file)
    elif any(environ.get(var) for var in ADMIN_URL_VARS):
        urls = {"admin_url": next(environ[v] for v in ADMIN_URL_VARS if environ.get(v))}
    else:
        try:
            urls = read_services_file(folder)
        except FileNotFoundError:
            urls = {}
    admin_url = urls.get("admin_url")
    if not isinstance(admin_url, str) or not admin_url:
        raise ServiceURLError(
            f"no admin URL: call job.enable_admin() in the job's client (it writes the URL "
            f"to {os.path.join(folder, SERVICES_FILE)}), or pass it with --url-file PATH "
            f"(a file of mode 0600), --url-file - (standard input) or $HPCMESH_ADMIN_URL")
    telemetry_url = urls.get("telemetry_url") or environ.get(TELEMETRY_URL_VAR) or None
    return admin_url, telemetry_url
