"""Numeric HPCMESH_* settings: defaults, and errors that name the variable."""

import os
import subprocess
import sys

import pytest

from hpcmesh.settings import env_number


def test_unset_or_empty_gives_the_default_and_numbers_parse():
    assert env_number("HPCMESH_X", 5, env={}) == 5.0
    assert env_number("HPCMESH_X", 5, env={"HPCMESH_X": "  "}) == 5.0
    assert env_number("HPCMESH_X", 5, env={"HPCMESH_X": "0.25"}) == 0.25
    assert env_number("HPCMESH_X", 5, env={"HPCMESH_X": "0"}) == 0.0
    assert env_number("HPCMESH_X", 5, env={"HPCMESH_X": "inf"}) == float("inf")


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "1,5"])
def test_bad_values_name_the_variable_the_unit_and_the_value(raw):
    with pytest.raises(ValueError) as e:
        env_number("HPCMESH_X", 5, unit="microseconds", note="0 turns it off",
                   env={"HPCMESH_X": raw})
    assert str(e.value) == (f"HPCMESH_X must be a number of microseconds >= 0 "
                            f"(0 turns it off), not {raw!r}")


def test_a_maximum_is_named_too():
    assert env_number("HPCMESH_X", 4, maximum=254, env={"HPCMESH_X": "254"}) == 254
    for raw in ("255", "inf"):
        with pytest.raises(ValueError, match=rf"HPCMESH_X must be a number of seconds from 0 "
                                             rf"to 254, not '{raw}'"):
            env_number("HPCMESH_X", 4, maximum=254, env={"HPCMESH_X": raw})


@pytest.mark.parametrize("var, module", [("HPCMESH_KEEPALIVE", "hpcmesh.transport.connection"),
                                         ("HPCMESH_LOST_PEER_WAIT", "hpcmesh.runtime.node")])
def test_a_mistyped_setting_stops_the_import_with_its_name(var, module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"],
                         env=dict(os.environ, **{var: "5s"}), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert f"{var} must be a number of seconds " in out.stderr and "'5s'" in out.stderr


def test_a_whole_number_setting_refuses_fractions():
    assert env_number("HPCMESH_X", 1, integer=True, env={"HPCMESH_X": "3"}) == 3
    for raw in ("2.5", "two", "inf", "1e400"):
        with pytest.raises(ValueError, match=rf"HPCMESH_X must be a whole number of arenas >= 0, "
                                             rf"not '{raw}'"):
            env_number("HPCMESH_X", 1, unit="arenas", integer=True, env={"HPCMESH_X": raw})


@pytest.mark.parametrize("var, raw, says", [
    ("HPCMESH_MALLOC_ARENAS", "lots", "HPCMESH_MALLOC_ARENAS must be a whole number of malloc arenas"),
    # read at each stop (configure(stop_grace=) holds), checked when the client starts
    ("HPCMESH_STOP_GRACE", "5s", "HPCMESH_STOP_GRACE must be a number of seconds"),
    # read by every member when its collectives start: checked here, before any process
    ("HPCMESH_COLLECTIVE_TIMEOUT", "abc", "HPCMESH_COLLECTIVE_TIMEOUT must be a number of "
                                          "seconds > 0 and at most 31536000, not 'abc'")])
def test_a_setting_read_later_is_checked_where_the_client_starts(var, raw, says):
    out = subprocess.run([sys.executable, "-c",
                          "from hpcmesh.runtime.client import client_runtime; client_runtime()"],
                         env=dict(os.environ, **{var: raw}), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert says in out.stderr


def test_flags_take_the_usual_spellings_and_refuse_the_rest():
    from hpcmesh.settings import env_flag
    for raw, want in (("1", True), ("on", True), ("TRUE", True), ("yes", True), ("0", False),
                      ("off", False), ("False", False), ("no", False), ("", True)):
        assert env_flag("HPCMESH_X", True, env={"HPCMESH_X": raw}) is want, raw
    for raw in ("maybe", "2", "enabled"):
        with pytest.raises(ValueError, match=rf"HPCMESH_X must be 1 or 0 \(or true/false, "
                                             rf"yes/no, on/off\), not '{raw}'"):
            env_flag("HPCMESH_X", True, env={"HPCMESH_X": raw})


def test_a_choice_names_what_it_accepts():
    from hpcmesh.settings import log_level
    assert log_level({}) == "WARNING" and log_level({"HPCMESH_LOG_LEVEL": "debug"}) == "DEBUG"
    with pytest.raises(ValueError, match="HPCMESH_LOG_LEVEL must be one of DEBUG, INFO, "
                                         "WARNING, ERROR, CRITICAL, not 'LOUD'"):
        log_level({"HPCMESH_LOG_LEVEL": "LOUD"})


def test_inf_is_refused_where_never_means_nothing():
    with pytest.raises(ValueError, match=r"HPCMESH_LEASE_GRACE must be a number of seconds "
                                         r">= 0 and finite, not 'inf'"):
        env_number("HPCMESH_LEASE_GRACE", 10, finite=True, env={"HPCMESH_LEASE_GRACE": "inf"})
    assert env_number("HPCMESH_X", 1, finite=True, env={"HPCMESH_X": "1e9"}) == 1e9


@pytest.mark.parametrize("var, raw, says", [
    ("HPCMESH_LOG_LEVEL", "LOUD", "HPCMESH_LOG_LEVEL must be one of DEBUG"),
    ("HPCMESH_ZYGOTE", "maybe", "HPCMESH_ZYGOTE must be 1 or 0"),
    ("HPCMESH_UVLOOP", "yes please", "HPCMESH_UVLOOP must be 1 or 0"),
    ("HPCMESH_LEASE_GRACE", "inf", "HPCMESH_LEASE_GRACE must be a number of seconds >= 0 and "
                                   "finite"),
])
def test_a_bad_process_setting_fails_the_controller_with_its_name(var, raw, says):
    # before: every process the controller started failed (LOG_LEVEL), or the value was
    # taken as "on" (flags) or as "never" (inf)
    code = ("from hpcmesh.actor import this_host\n"
            "procs = this_host().spawn_procs(per_host={'gpus': 1})\n"
            "print('spawned', procs.initialized.get(timeout=30))\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **{var: raw}),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "spawned" not in out.stdout, out.stdout + out.stderr
    assert says in out.stderr and f"'{raw}'" in out.stderr


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "0", "inf", "1e400", "31536001", "10s"])
def test_the_collective_timeout_is_checked_with_the_other_settings(raw):
    """Before the issue-28 fix only a collective read it: each member failed, not the start."""
    from hpcmesh.settings import check_process_settings, collective_timeout
    env = {"HPCMESH_COLLECTIVE_TIMEOUT": raw}
    with pytest.raises(ValueError) as e:
        check_process_settings(env)
    assert str(e.value) == ("HPCMESH_COLLECTIVE_TIMEOUT must be a number of seconds > 0 and at "
                            f"most 31536000, not {raw!r}")
    assert collective_timeout({}) == 60.0
    assert collective_timeout({"HPCMESH_COLLECTIVE_TIMEOUT": "0.5"}) == 0.5
    assert collective_timeout({"HPCMESH_COLLECTIVE_TIMEOUT": "31536000"}) == 31536000.0


def test_the_collective_timeout_is_checked_without_torch():
    code = ("import sys\nfrom hpcmesh.settings import check_process_settings as check\n"
            "try:\n    check({'HPCMESH_COLLECTIVE_TIMEOUT': '-1'})\n"
            "except ValueError as e:\n    print(e)\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["HPCMESH_COLLECTIVE_TIMEOUT must be a number of seconds "
                                       "> 0 and at most 31536000, not '-1'", "False"]
