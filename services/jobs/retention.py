"""When a job's output expires, in one place: the gateway answers by it and the render workers'
janitor deletes by it (docs/architecture.md section 2, "Retention").

A SUCCEEDED job's output expires at the `output_expire_time` its join stamped (the join's time plus
the render worker's `output_ttl_s`). A job that succeeded before expiry existed has none until the
janitor stamps it; meanwhile the same rule (its finish time plus the TTL) is applied by whoever
reads it, so GetJob says the same before and after the stamp. An output counts as expired from that
time on, whether or not the janitor has deleted it yet, so the answer never depends on when the
janitor last ran. `output_ttl_s` 0 keeps outputs forever.
"""

from __future__ import annotations

import datetime

from services.jobs.store.jobs import Job, JobState


def output_expire_time(job: Job, ttl_s: float) -> float:
    """When the job's output expires (Unix seconds); 0 when it has none (not SUCCEEDED, or kept forever)."""
    if job.state != JobState.SUCCEEDED:
        return 0.0
    if job.output_expire_time > 0:
        return job.output_expire_time
    if job.output_purge_time > 0:  # deleted with no expiry recorded: it expired when it was deleted
        return job.output_purge_time
    return job.finish_time + ttl_s if ttl_s > 0 and job.finish_time > 0 else 0.0


def output_expired(job: Job, ttl_s: float, now: float) -> bool:
    """Whether the job's output is gone for callers: deleted by the janitor, or past its expiry."""
    if job.state != JobState.SUCCEEDED:
        return False
    expires = output_expire_time(job, ttl_s)
    return job.output_purge_time > 0 or 0 < expires <= now


def url_expire_time(job: Job, ttl_s: float, url_ttl_s: float, now: float) -> float:
    """When a download URL of the output issued at `now` stops working: `url_ttl_s` from now, but
    never past the output's expiry (a URL to a deleted object would only fail later, less clearly)."""
    expires = now + url_ttl_s
    output_expires = output_expire_time(job, ttl_s)
    return min(expires, output_expires) if output_expires > 0 else expires


def utc_text(seconds: float) -> str:
    """A time as people and logs read it: 2026-12-02T18:04:05Z."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expired_message(job: Job, ttl_s: float) -> str:
    """FAILED_PRECONDITION's text for DownloadOutput and GetOutputUrl of an expired output."""
    return (
        f"output expired at {utc_text(output_expire_time(job, ttl_s))}: job {job.id}'s output was kept for the "
        "deployment's output_ttl_s after it succeeded and is deleted; submit the job again to render it anew"
    )
