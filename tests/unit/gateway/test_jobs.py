"""Tests for services.gateway.jobs: the public view of a stored job, and how a clip is cut into segments."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from lipline.v1 import gateway_pb2
from services.gateway.jobs import job_to_proto, segment_bounds
from services.jobs.store.jobs import Job, JobState

OPTIONS = gateway_pb2.JobOptions(super_resolution=True, crf=23)
JOB = Job(
    id="j1",
    avatar_id="a1",
    owner="",
    state=JobState.QUEUED,
    stage="queued",
    options=OPTIONS.SerializeToString(),
    audio_seconds=10.0,
    fps=25.0,
    total_frames=250,
    frames_done=0,
    segments_total=5,
    segments_done=0,
    error="",
    error_code=0,
    models=[],
    stage_seconds={"audio": 0.1},
    create_time=1000.0,
    start_time=0.0,
    finish_time=0.0,
    output_key="",
    output_bytes=0,
    version=1,
)


def test_queued() -> None:
    p = job_to_proto(JOB, now=1002.0)
    assert (p.id, p.avatar_id, p.state, p.stage) == ("j1", "a1", gateway_pb2.JOB_STATE_QUEUED, "queued")
    assert p.options == OPTIONS
    assert (p.progress, p.eta_seconds, p.realtime_factor) == (0.0, 0.0, 0.0)
    assert p.elapsed_seconds == pytest.approx(2.0)
    assert p.create_time.seconds == 1000
    assert dict(p.stage_seconds) == {"audio": pytest.approx(0.1)}


def test_running_progress_and_eta() -> None:
    job = dataclasses.replace(JOB, state=JobState.RUNNING, stage="render", start_time=1001.0, frames_done=100)
    p = job_to_proto(job, now=1003.0)
    assert p.progress == pytest.approx(0.4)
    assert p.eta_seconds == pytest.approx(2.0 / 100 * 150)


def test_succeeded_has_total_and_realtime_factor() -> None:
    job = dataclasses.replace(
        JOB,
        state=JobState.SUCCEEDED,
        stage="done",
        start_time=1000.5,
        finish_time=1004.0,
        frames_done=250,
        output_bytes=1234,
        models=[{"name": "procedural", "backend": "cpu", "precision": "fp32"}],
    )
    p = job_to_proto(job, now=2000.0)
    assert p.progress == 1.0 and p.elapsed_seconds == pytest.approx(4.0)
    assert p.realtime_factor == pytest.approx(2.5)
    assert p.stage_seconds["total"] == pytest.approx(4.0)
    assert [(m.name, m.backend) for m in p.models] == [("procedural", "cpu")]
    assert p.output_bytes == 1234


def test_failed_carries_the_error() -> None:
    job = dataclasses.replace(
        JOB,
        state=JobState.FAILED,
        error="lipsync stage failed",
        error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
        finish_time=1001.0,
    )
    p = job_to_proto(job)
    assert p.state == gateway_pb2.JOB_STATE_FAILED and p.error == "lipsync stage failed"
    assert p.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


@pytest.mark.parametrize(
    ("total", "size", "bounds"),
    [
        (0, 50, []),
        (10, 50, [(0, 10)]),
        (100, 50, [(0, 50), (50, 100)]),
        (120, 50, [(0, 50), (50, 120)]),  # a 20-frame tail joins the segment before it
        (130, 50, [(0, 50), (50, 100), (100, 130)]),
    ],
)
def test_segment_bounds(total: int, size: int, bounds: list[tuple[int, int]]) -> None:
    assert segment_bounds(total, size) == bounds
    if bounds:
        assert bounds[0][0] == 0 and bounds[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"options": b"\xff\xff\xff"}, "its options are not a JobOptions"),
        ({"models": [{"name": "x", "colour": "red"}]}, "its models field"),
    ],
)
def test_a_stored_field_that_cannot_be_shown_is_data_loss_not_internal(fields: dict, words: str) -> None:
    from services.serving.errors import CorruptRecord

    with pytest.raises(CorruptRecord, match=words) as info:
        job_to_proto(dataclasses.replace(JOB, **fields))
    assert info.value.code == grpc.StatusCode.DATA_LOSS and "'j1'" in str(info.value)


def test_a_succeeded_job_shows_when_its_output_expires_and_once_it_has() -> None:
    done = dataclasses.replace(JOB, state=JobState.SUCCEEDED, stage="done", finish_time=2000.0)
    kept = job_to_proto(dataclasses.replace(done, output_expire_time=2600.0), now=2100.0, output_ttl_s=60.0)
    assert kept.output_expire_time.ToSeconds() == 2600 and not kept.output_expired
    unstamped = job_to_proto(done, now=2100.0, output_ttl_s=60.0)  # finished at 2000, kept 60 s
    assert unstamped.output_expire_time.ToSeconds() == 2060 and unstamped.output_expired
    forever = job_to_proto(done, now=2100.0)
    assert not forever.HasField("output_expire_time") and not forever.output_expired
    assert not job_to_proto(JOB, output_ttl_s=60.0).HasField("output_expire_time")  # no output yet
