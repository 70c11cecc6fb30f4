"""SubmitJob's work, done once per job before it is queued: the audio stage decodes the upload (its
checks and limits, in a child process) and makes the mel windows; they are stored with the upload
where the render workers read them (the AAC track is the job's audio task, on a worker:
services.jobs.layout).

The gateway does not decode the upload itself: FFmpeg runs in the audio stage's child processes,
where a decoder crash costs one child, not the gateway and every stream it holds; and in a process
with a busy event loop FFmpeg's per-packet GIL hand-offs made a burst of uploads wait on each other
(docs/decisions.md).

The job exists in the job store only once all of this is stored, so a worker never sees half a job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from lipline.v1 import audio_pb2, audio_pb2_grpc
from services.serving.channels import StageFailed
from services.media.wire import MEL_BANDS, MEL_BYTES, MEL_STEP
from services.serving.errors import InvalidMedia, TooLarge
from services.jobs.layout import mels_key, segment_indices, upload_key
from services.jobs.segment_audio import pack_segment_audio
from services.media.speech import speech_envelope
from services.jobs.store.blobs import BlobStore
from services.serving.tracing import outgoing_metadata
from services.gateway.jobs import segment_bounds

_CHUNK = 1 << 20
_PUT_THREADS = 8  # mel blobs of a long job go up in parallel (S3 PUTs are latency-bound)


@dataclasses.dataclass(frozen=True)
class PreparedAudio:
    audio_seconds: float
    total_frames: int
    segments: list[tuple[int, int]]  # the segments' [start, end) frame ranges (the job also has an audio task)
    stage_seconds: dict[str, float]


async def extract_windows(
    audio: audio_pb2_grpc.AudioServiceStub,
    data: bytes,
    fps: float,
    max_seconds: float,
    request_id: str,
) -> tuple[np.ndarray, float]:
    """All mel windows of the clip from the audio stage, (frames, 2560) bytes as uint8 (float16
    inside), and the clip's decoded length in seconds. The stage refuses audio over `max_seconds`."""

    async def requests():  # type: ignore[no-untyped-def]
        options = audio_pb2.ExtractOptions(fps=fps, max_seconds=max_seconds)
        yield audio_pb2.ExtractRequest(options=options, data=data[:_CHUNK])
        for start in range(_CHUNK, len(data), _CHUNK):
            yield audio_pb2.ExtractRequest(data=data[start : start + _CHUNK])

    total, seconds = -1, 0.0
    out: np.ndarray | None = None
    try:
        async for response in audio.Extract(requests(), metadata=outgoing_metadata(request_id)):
            if response.total_frames:
                total, seconds = response.total_frames, response.duration_seconds
                out = np.zeros((total, MEL_BYTES), np.uint8)
            for window in response.windows:
                if out is None or not 0 <= window.frame_index < total or len(window.data) != MEL_BYTES:
                    raise InvalidMedia("the audio stage sent a malformed mel window")
                out[window.frame_index] = np.frombuffer(window.data, np.uint8)
    except grpc.aio.AioRpcError as exc:
        raise StageFailed("audio", exc) from exc
    if out is None or total <= 0:
        raise InvalidMedia("the audio is too short for one video frame")
    return out, seconds


async def prepare_audio(
    blobs: BlobStore,
    audio: audio_pb2_grpc.AudioServiceStub,
    job_id: str,
    data: bytes,
    fps: float,
    max_audio_seconds: float,
    segment_seconds: float,
    request_id: str = "",
) -> PreparedAudio:
    """The audio stage's checks and mel windows (a bad upload is refused before the job exists), then
    the upload and each segment's windows stored."""
    t0 = time.perf_counter()
    windows, seconds = await extract_windows(audio, data, fps, max_audio_seconds, request_id)
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
            (mels_key(job_id, k), pack_segment_audio(windows[start:end], speech[start:end]))
            for k, (start, end) in zip(segment_indices(len(segments)), segments, strict=True)
        ]
        with ThreadPoolExecutor(min(_PUT_THREADS, len(puts))) as pool:
            list(pool.map(lambda item: blobs.put(*item), puts))

    await asyncio.to_thread(store)
    return PreparedAudio(
        seconds,
        len(windows),
        segments,
        {"audio": extracted, "submit": time.perf_counter() - t0},
    )
