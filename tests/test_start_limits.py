"""Queue wait vs bring-up (hpcmesh.job.start_limits), pure: the clock is passed in."""

from __future__ import annotations

import math

import pytest

from hpcmesh.job.start_limits import StartLimits, check_seconds


def test_queue_wait_alone_never_expires_by_default():
    limits = StartLimits(bring_up=5, job_start=None, submitted_at=100.0)
    # a day in the queue: no limit has passed, the bring-up has not begun
    assert limits.expired(100.0 + 86400) is None
    limits.mark_running(100.0 + 86400)
    assert limits.expired(100.0 + 86400 + 4.9) is None
    assert limits.expired(100.0 + 86400 + 5.0) == "bring-up"


def test_bring_up_counts_from_the_first_time_running_was_seen():
    limits = StartLimits(bring_up=5, job_start=None, submitted_at=0.0)
    limits.mark_running(10.0)
    limits.mark_running(14.0)          # later sightings do not move the start
    assert limits.running_at == 10.0
    assert limits.expired(14.9) is None
    assert limits.expired(15.0) == "bring-up"


def test_job_start_timeout_bounds_queue_and_bring_up_together():
    limits = StartLimits(bring_up=300, job_start=30, submitted_at=0.0)
    assert limits.expired(29.9) is None
    assert limits.expired(30.0) == "job_start_timeout"
    limits.mark_running(20.0)
    assert limits.expired(30.0) == "job_start_timeout"   # still the earlier of the two


def test_describe_names_the_argument_that_ran_out():
    limits = StartLimits(bring_up=5, job_start=30, submitted_at=0.0)
    assert "timeout=5" in limits.describe("bring-up") and "RUNNING" in limits.describe(
        "bring-up")
    assert "job_start_timeout=30" in limits.describe("job_start_timeout")
    assert "queue wait" in limits.describe("job_start_timeout")


@pytest.mark.parametrize("value, expected", [(5, 5.0), (0.5, 0.5), (math.inf, math.inf)])
def test_check_seconds_accepts_positive_numbers(value, expected):
    assert check_seconds("SlurmJob", "timeout", value) == expected


def test_check_seconds_none_only_where_it_means_something():
    assert check_seconds("SlurmJob", "job_start_timeout", None, none_means="no limit") is None
    with pytest.raises(TypeError, match=r"SlurmJob\(timeout=None\): timeout takes a positive "
                                        r"number of seconds; it bounds"):
        check_seconds("SlurmJob", "timeout", None, hint="it bounds the bring-up")


@pytest.mark.parametrize("value, error, words", [
    (-1, ValueError, "timeout=-1"), (0, ValueError, "timeout=0"),
    (math.nan, ValueError, "timeout=nan"), ("5", TypeError, "not str"),
    (True, TypeError, "not bool"), ([5], TypeError, "not list"),
])
def test_check_seconds_refuses_with_the_argument_named(value, error, words):
    with pytest.raises(error) as ei:
        check_seconds("SlurmJob", "timeout", value)
    assert words in str(ei.value) and "positive number of seconds" in str(ei.value)


def test_job_classes_check_their_timeouts():
    from hpcmesh.job import SlurmAllocation, SlurmJob, SubmititJob
    with pytest.raises(TypeError, match=r"SlurmJob\(timeout=None\).*job_start_timeout"):
        SlurmJob(meshes={"hosts": 1}, timeout=None)
    with pytest.raises(ValueError, match=r"SlurmJob\(job_start_timeout=-3\)"):
        SlurmJob(meshes={"hosts": 1}, job_start_timeout=-3)
    with pytest.raises(TypeError, match=r"SubmititJob\(job_start_timeout='1h'\)"):
        SubmititJob({"w": 1}, job_start_timeout="1h")
    with pytest.raises(ValueError, match=r"SubmititJob\(attach_timeout=0\)"):
        SubmititJob({"w": 1}, attach_timeout=0)
    with pytest.raises(TypeError, match=r"SlurmAllocation\(timeout=None\)"):
        SlurmAllocation(timeout=None)
    job = SlurmJob(meshes={"hosts": 1}, timeout=7)
    assert job.timeout == 7.0 and job.job_start_timeout is None
