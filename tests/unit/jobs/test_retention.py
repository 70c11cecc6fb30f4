"""Tests for services.jobs.retention: when an output expires, for a stamped job, one that succeeded
before expiry was stamped, one the janitor deleted, and jobs that have no output."""

from __future__ import annotations

import dataclasses

import pytest

from services.jobs.retention import expired_message, output_expire_time, output_expired, url_expire_time, utc_text
from services.jobs.store.jobs import JobState
from tests.unit.gateway.test_jobs import JOB

DONE = dataclasses.replace(JOB, state=JobState.SUCCEEDED, stage="done", finish_time=2000.0, output_key="outputs/j1.mp4")


def test_a_stamped_expiry_wins_over_the_ttl() -> None:
    job = dataclasses.replace(DONE, output_expire_time=2500.0)
    assert output_expire_time(job, ttl_s=10.0) == 2500.0
    assert not output_expired(job, 10.0, now=2499.0) and output_expired(job, 10.0, now=2500.0)


def test_an_unstamped_job_expires_its_ttl_after_it_finished_and_ttl_0_keeps_it() -> None:
    assert output_expire_time(DONE, ttl_s=100.0) == 2100.0
    assert output_expired(DONE, 100.0, now=2100.0) and not output_expired(DONE, 100.0, now=2099.0)
    assert output_expire_time(DONE, ttl_s=0.0) == 0.0 and not output_expired(DONE, 0.0, now=1e12)


def test_a_deleted_output_is_expired_whatever_the_clock_says() -> None:
    job = dataclasses.replace(DONE, output_purge_time=2050.0)
    assert output_expired(job, 0.0, now=0.0) and output_expire_time(job, 0.0) == 2050.0


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING, JobState.FAILED, JobState.CANCELLED])
def test_jobs_without_an_output_never_expire(state: JobState) -> None:
    job = dataclasses.replace(DONE, state=state, output_expire_time=1.0)
    assert output_expire_time(job, 10.0) == 0.0 and not output_expired(job, 10.0, now=1e12)


def test_the_message_names_the_time_in_utc_and_what_to_do() -> None:
    job = dataclasses.replace(DONE, output_expire_time=1796234400.0)
    assert utc_text(1796234400.0) == "2026-12-02T18:00:00Z"
    message = expired_message(job, 0.0)
    assert message.startswith("output expired at 2026-12-02T18:00:00Z") and "submit the job again" in message


def test_a_download_url_never_outlives_the_output() -> None:
    job = dataclasses.replace(DONE, output_expire_time=2500.0)
    assert url_expire_time(job, 0.0, url_ttl_s=3600.0, now=2400.0) == 2500.0  # capped at the expiry
    assert url_expire_time(job, 0.0, url_ttl_s=60.0, now=2400.0) == 2460.0
    assert url_expire_time(DONE, 0.0, url_ttl_s=3600.0, now=2400.0) == 6000.0  # kept forever: the URL's own
