"""Tests skip for a missing prerequisite only outside CI.

On a developer's machine a test that needs the Slurm test cluster, MPI, sshd, bash,
openssl or torch skips with the reason and the fix. Where ``CI`` is set, ``.ci/run`` has
installed all of them, so a missing one is a broken setup: the test fails with the same
reason instead of passing silently as a skip.
"""

from __future__ import annotations

import functools
import importlib
import os

import pytest

IN_CI = bool(os.environ.get("CI"))


def skip_or_fail(reason: str) -> None:
    """Skip the calling test (or module) outside CI; fail it in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (required when CI is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_skip(name: str):
    """``pytest.importorskip`` that fails in CI instead of skipping."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_or_fail(f"needs {name} ({e})")


def requires(missing: str | None):
    """Decorate a test with what is missing to run it (None: nothing is missing)."""
    def deco(fn):
        if missing is None:
            return fn
        if IN_CI:
            @functools.wraps(fn)
            def fail(*args, **kwargs):
                pytest.fail(f"{missing} (required when CI is set)", pytrace=False)
            return fail
        return pytest.mark.skip(reason=missing)(fn)
    return deco
