"""Jobs as the public API shows them: a job store record -> lipline.v1.Job."""

from __future__ import annotations

import time

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import common_pb2, gateway_pb2
from services.jobs.retention import output_expire_time, output_expired
from services.jobs.store.jobs import Job, JobState
from services.serving.errors import CorruptRecord


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def job_to_proto(job: Job, now: float | None = None, output_ttl_s: float = 0.0) -> gateway_pb2.Job:
    """The public view; CorruptRecord (DATA_LOSS, naming the field) when a stored field cannot be
    shown (options that are not a JobOptions, models of an unknown shape), never INTERNAL.
    `output_ttl_s`: the deployment's retention, for a job whose expiry the janitor has not stamped
    yet (services.jobs.retention)."""
    try:
        options = gateway_pb2.JobOptions.FromString(job.options)
    except DecodeError as exc:
        raise CorruptRecord(
            f"job {job.id!r} has a record this lipline cannot read (its options are not a JobOptions: {exc})"
        ) from exc
    try:
        models = [common_pb2.ModelInfo(**m) for m in job.models]
    except (TypeError, ValueError) as exc:
        raise CorruptRecord(f"job {job.id!r} has a record this lipline cannot read (its models field: {exc})") from exc
    now = time.time() if now is None else now
    elapsed = ((job.finish_time or now) - job.create_time) if job.create_time else 0.0
    progress = job.frames_done / job.total_frames if job.total_frames else 0.0
    if job.state == JobState.SUCCEEDED:
        progress = 1.0
    eta = 0.0
    if job.state == JobState.RUNNING and job.frames_done and job.start_time:
        eta = (now - job.start_time) / job.frames_done * (job.total_frames - job.frames_done)
    stage_seconds = dict(job.stage_seconds)
    if job.state == JobState.SUCCEEDED:
        stage_seconds["total"] = elapsed
    expires = output_expire_time(job, output_ttl_s)
    return gateway_pb2.Job(
        id=job.id,
        avatar_id=job.avatar_id,
        state=int(job.state),  # type: ignore[arg-type]  # protoc's .pyi types an enum field as the enum; it takes the int
        progress=progress,
        frames_done=job.frames_done,
        total_frames=job.total_frames,
        stage=job.stage,
        error=job.error,
        error_code=job.error_code,
        audio_seconds=job.audio_seconds,
        elapsed_seconds=max(0.0, elapsed),
        eta_seconds=eta,
        realtime_factor=job.audio_seconds / elapsed if job.state == JobState.SUCCEEDED and elapsed > 0 else 0.0,
        output_bytes=job.output_bytes,
        output_sha256=job.output_sha256,
        models=models,
        options=options,
        create_time=_timestamp(job.create_time),
        stage_seconds=stage_seconds,
        labels=dict(job.labels),
        output_expire_time=_timestamp(expires) if expires > 0 else None,
        output_expired=output_expired(job, output_ttl_s, now),
        model=job.model,
    )


def segment_bounds(total_frames: int, segment_frames: int) -> list[tuple[int, int]]:
    """[start, end) ranges of `segment_frames` (the last one shorter, but never below half a segment:
    a short tail is merged into the one before it, as it would cost a keyframe for little work)."""
    if total_frames <= 0:
        return []
    segment_frames = max(1, segment_frames)
    edges = list(range(0, total_frames, segment_frames)) + [total_frames]
    if len(edges) > 2 and edges[-1] - edges[-2] < segment_frames // 2:
        del edges[-2]
    return list(zip(edges[:-1], edges[1:]))
