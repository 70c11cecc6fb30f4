"""SubmitJob's work, done once per job before it is queued: the audio stage decodes the upload (its
checks and limits, in a child process) and makes the mel windows (for an avatar of the `musetalk`
tier also the clip's whisper log-mel windows); they are stored with the upload where the render
workers read them (the AAC track is the job's audio task, on a worker: services.jobs.layout).

The gateway does not decode the upload itself: FFmpeg runs in the audio stage's child processes,
where a decoder crash costs one child, not the gateway and every stream it holds; and in a process
with a busy event loop FFmpeg's per-packet GIL hand-offs made a burst of uploads wait on each other
(docs/decisions.md).

The job exists in the job store only once all of this is stored, so a worker never sees half a job.

`submit_job` is SubmitJob without the protos: the servicer decodes the request into a `JobRequest`,
calls it, and turns the Job it returns into the response.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from lipline.v1 import audio_pb2, audio_pb2_grpc, lipsync_pb2
from services.gateway.jobs import segment_bounds
from services.gateway.request_ids import request_key
from services.gateway.settings import GatewaySettings
from services.jobs.layout import job_prefix, mels_key, segment_indices, upload_key, whisper_key
from services.jobs.segment_audio import pack_segment_audio
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import Job, JobStore, NewJob, RequestKey, RequestKind, request_reused_message
from services.media.speech import speech_envelope
from services.media.wire import MEL_BANDS, MEL_BYTES, MEL_STEP
from services.serving.channels import StageFailed
from services.serving.errors import InvalidMedia, InvalidRequest, NoCapacity, NotReady, TooLarge
from services.serving.stages import MUSETALK_TIER
from services.serving.streams import stream_call
from services.serving.tracing import outgoing_metadata

_LOGGER = logging.getLogger(__name__)
_CHUNK = 1 << 20
_PUT_THREADS = 8  # mel blobs of a long job go up in parallel (S3 PUTs are latency-bound)


@dataclasses.dataclass(frozen=True)
class PreparedAudio:
    audio_seconds: float
    total_frames: int
    segments: list[tuple[int, int]]  # the segments' [start, end) frame ranges (the job also has an audio task)
    stage_seconds: dict[str, float]


@dataclasses.dataclass(frozen=True)
class ClipFeatures:
    """What the audio stage made of one clip."""

    windows: np.ndarray  # (frames, 2560) uint8: the mel windows' bytes (float16 inside)
    seconds: float  # the decoded length
    whisper: list[lipsync_pb2.AudioWindow]  # the whisper log-mel windows (asked for: the musetalk tier)


async def extract_windows(
    audio: audio_pb2_grpc.AudioServiceStub,
    data: bytes,
    fps: float,
    max_seconds: float,
    request_id: str,
    whisper: bool = False,
) -> ClipFeatures:
    """All mel windows of the clip from the audio stage, its decoded length, and with `whisper` its
    whisper log-mel windows. The stage refuses audio over `max_seconds`."""

    async def requests() -> AsyncIterator[audio_pb2.ExtractRequest]:
        options = audio_pb2.ExtractOptions(fps=fps, max_seconds=max_seconds, whisper=whisper)
        yield audio_pb2.ExtractRequest(options=options, data=data[:_CHUNK])
        for start in range(_CHUNK, len(data), _CHUNK):
            yield audio_pb2.ExtractRequest(data=data[start : start + _CHUNK])

    total, seconds = -1, 0.0
    out: np.ndarray | None = None
    log_mel: list[lipsync_pb2.AudioWindow] = []
    try:
        async for response in stream_call(audio.Extract, requests(), metadata=outgoing_metadata(request_id)):
            if response.total_frames:
                total, seconds = response.total_frames, response.duration_seconds
                out = np.zeros((total, MEL_BYTES), np.uint8)
            for window in response.windows:
                if out is None or not 0 <= window.frame_index < total or len(window.data) != MEL_BYTES:
                    raise InvalidMedia("the audio stage sent a malformed mel window")
                out[window.frame_index] = np.frombuffer(window.data, np.uint8)
            for whisper_window in response.whisper_windows:
                if whisper_window.window_index != len(log_mel):
                    raise InvalidMedia("the audio stage sent its whisper windows out of order")
                log_mel.append(whisper_window)
    except grpc.aio.AioRpcError as exc:
        raise StageFailed("audio", exc) from exc
    if out is None or total <= 0:
        raise InvalidMedia("the audio is too short for one video frame")
    if whisper and not log_mel:  # an audio stage older than ExtractOptions.whisper
        raise NotReady("the audio stage did not send the whisper features the musetalk tier needs: update it")
    return ClipFeatures(out, seconds, log_mel)


async def prepare_audio(
    blobs: BlobStore,
    audio: audio_pb2_grpc.AudioServiceStub,
    job_id: str,
    data: bytes,
    fps: float,
    max_audio_seconds: float,
    segment_seconds: float,
    request_id: str = "",
    whisper: bool = False,
) -> PreparedAudio:
    """The audio stage's checks and mel windows (a bad upload is refused before the job exists), then
    the upload and each segment's windows stored. With `whisper` (a `musetalk` job): the clip's whisper
    windows stored once each, and per segment its speech envelope alone (the tier's noise gate)."""
    t0 = time.perf_counter()
    features = await extract_windows(audio, data, fps, max_audio_seconds, request_id, whisper)
    windows, seconds = features.windows, features.seconds
    # An audio stage older than ExtractOptions.max_seconds applies only its own limit (1 ms of slack:
    # its length is counted after resampling).
    if seconds > max_audio_seconds + 1e-3:
        raise TooLarge(f"audio is {seconds:.1f} s long; the limit is {max_audio_seconds:g} s")
    extracted = time.perf_counter() - t0
    segments = segment_bounds(len(windows), round(segment_seconds * fps))

    def store() -> None:
        # The upload, for the audio task (which encodes the AAC track beside the segments), and each
        # segment's mel windows with their speech envelope (which needs the whole clip: see speech.py).
        speech = speech_envelope(windows.view("<f2").reshape(len(windows), MEL_BANDS, MEL_STEP), fps)
        puts = [(upload_key(job_id), data)] + [
            (mels_key(job_id, k), pack_segment_audio(None if whisper else windows[start:end], speech[start:end]))
            for k, (start, end) in zip(segment_indices(len(segments)), segments, strict=True)
        ]
        puts += [(whisper_key(job_id, w.window_index), w.SerializeToString()) for w in features.whisper]
        with ThreadPoolExecutor(min(_PUT_THREADS, len(puts))) as pool:
            list(pool.map(lambda item: blobs.put(*item), puts))

    await asyncio.to_thread(store)
    return PreparedAudio(
        seconds,
        len(windows),
        segments,
        {"audio": extracted, "submit": time.perf_counter() - t0},
    )


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """A SubmitJob request, decoded and checked for shape (sizes, ranges, the avatar id's form)."""

    avatar_id: str
    audio: bytes  # the uploaded bytes; b"" when audio_uri names them
    options: bytes  # a serialized lipline.v1.JobOptions holding only the fields this lipline knows
    request_id: str = ""  # a checked UUID (services.gateway.request_ids), or "" for none
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # checked (services.gateway.labels)
    callback_url: str = ""  # checked (services.gateway.webhooks); also in `options`, so in the digest
    audio_uri: str = ""  # as the client sent it (checked by services.gateway.audio_uri); fetched after the id lookup

    def key(self, window_s: float) -> RequestKey | None:
        """The idempotency key: the request id and a digest of the request as sent (uploaded audio by
        its sha256, an audio_uri by its text, not by what it held: a retry whose file changed in
        between is the same request); None without a request id."""
        if not self.request_id:
            return None
        source = (
            {"audio_uri": self.audio_uri}
            if self.audio_uri
            else {"audio_sha256": hashlib.sha256(self.audio).hexdigest()}
        )
        fields = {"avatar_id": self.avatar_id, **source, "options": self.options.hex(), "labels": dict(self.labels)}
        return request_key(self.request_id, fields, window_s)


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who submits: the tenant the job belongs to, the client its per-client limits count, and the
    ids that tie its work to the request (logs, traces)."""

    tenant: str
    client_id: str
    request_id: str = ""
    trace_context: str = ""  # the request's trace context (JSON of W3C headers), kept with the job


async def submit_job(
    jobs: JobStore,
    blobs: BlobStore,
    audio: audio_pb2_grpc.AudioServiceStub,
    settings: GatewaySettings,
    request: JobRequest,
    caller: Caller,
    fetch_audio: Callable[[], Awaitable[bytes]] | None = None,
) -> Job:
    """Queue a job: the caller's avatar (NotFound unless it is the tenant's and not deleted), the
    limits on active jobs (TooLarge), the audio (the upload, or `fetch_audio`'s bytes for an
    audio_uri), the audio stage's checks and mel windows, then the job and its tasks in one
    transaction. On any failure nothing of the job is left in the blob store.

    With a request id: a repeat within the window returns the first one's job before any work, an
    audio_uri's fetch included (and a concurrent duplicate that got past that check finds it in
    create_job, which drops this one's blobs); the same id with another request is InvalidRequest."""
    s = settings
    key = await asyncio.to_thread(request.key, s.request_id_window_s)  # hashes up to 50 MB: off the loop
    if key is not None:
        earlier = await asyncio.to_thread(
            jobs.find_request, caller.tenant, RequestKind.JOB, key.request_id, key.window_s
        )
        if earlier is not None:
            if earlier.digest != key.digest:
                raise InvalidRequest(request_reused_message(RequestKind.JOB, key.request_id))
            return await asyncio.to_thread(jobs.get_job, earlier.target_id, caller.tenant)
    avatar = await asyncio.to_thread(jobs.get_avatar, request.avatar_id, caller.tenant)
    stats = await asyncio.to_thread(jobs.queue_stats)
    if stats.active_jobs >= s.max_active_jobs:  # cheap early refusal; create_job enforces it atomically
        raise NoCapacity(
            f"{stats.active_jobs} jobs are queued or running (limit {s.max_active_jobs}); retry later",
            s.queue_retry_after_ms,
        )
    data = request.audio
    if fetch_audio is not None:
        data = await fetch_audio()
        _LOGGER.info("audio_uri fetched", extra={"audio_uri": request.audio_uri[:200], "bytes": len(data)})
    job_id = uuid.uuid4().hex[:20]
    try:
        prepared = await prepare_audio(
            blobs,
            audio,
            job_id,
            data,
            avatar.fps,
            s.max_audio_seconds,
            s.segment_seconds,
            caller.request_id,
            whisper=avatar.model == MUSETALK_TIER,
        )
        new = NewJob(
            job_id,
            avatar.id,
            caller.client_id,
            request.options,
            prepared.audio_seconds,
            avatar.fps,
            prepared.total_frames,
            prepared.segments,
            prepared.stage_seconds,
            trace_context=caller.trace_context,
            tenant=caller.tenant,
            audio_task=True,  # the AAC track is encoded by a worker, beside the segments
            labels=request.labels,
            callback_url=request.callback_url,
            model=avatar.model,
        )
        # check_avatar: still this tenant's and not deleted, in the job's own transaction
        try:
            job = await asyncio.to_thread(
                jobs.create_job, new, s.max_active_jobs, s.max_active_jobs_per_client, True, key
            )
        except NoCapacity as exc:  # the store's atomic check: the same refusal, with this gateway's hint
            raise NoCapacity(str(exc), s.queue_retry_after_ms) from None
    except BaseException:
        await asyncio.shield(asyncio.to_thread(blobs.delete_prefix, job_prefix(job_id)))
        raise
    if job.id != job_id:  # a concurrent duplicate of this request made the job first
        await asyncio.to_thread(blobs.delete_prefix, job_prefix(job_id))
        _LOGGER.info("job request repeated", extra={"job_id": job.id})
        return job
    _LOGGER.info(
        "job submitted",
        extra={
            "job_id": job.id,
            "avatar_id": avatar.id,
            "audio_s": round(job.audio_seconds, 3),
            "segments": job.segments_total,
        },
    )
    return job
