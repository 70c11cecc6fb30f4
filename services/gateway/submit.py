"""SubmitJob's work, done once per job before it is queued: check and decode the audio, make the mel
windows (the audio stage) and store them with the upload where the render workers read them (the
AAC track is the job's audio task, on a worker: services.common.jobkeys).

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
from services.common.audio_decode import audio_seconds
from services.common.channels import StageFailed
from services.common.codec import MEL_BANDS, MEL_BYTES, MEL_STEP
from services.common.errors import InvalidMedia
from services.common.jobkeys import AUDIO_TASK, mels_key, task_ranges, upload_key
from services.common.segment_audio import pack_segment_audio
from services.common.speech import speech_envelope
from services.common.store.blobs import BlobStore
from services.common.tracing import outgoing_metadata
from services.gateway.jobs import segment_bounds

_CHUNK = 1 << 20
_PUT_THREADS = 8  # mel blobs of a long job go up in parallel (S3 PUTs are latency-bound)


@dataclasses.dataclass(frozen=True)
class PreparedAudio:
    audio_seconds: float
    total_frames: int
    segments: list[tuple[int, int]]  # the job store's task ranges: the audio task, then the segments
    stage_seconds: dict[str, float]


async def extract_windows(audio: audio_pb2_grpc.AudioServiceStub, data: bytes, fps: float, request_id: str) -> np.ndarray:
    """All mel windows of the clip from the audio stage: (frames, 2560) bytes as uint8, float16 inside."""

    async def requests():  # type: ignore[no-untyped-def]
        yield audio_pb2.ExtractRequest(options=audio_pb2.ExtractOptions(fps=fps), data=data[:_CHUNK])
        for start in range(_CHUNK, len(data), _CHUNK):
            yield audio_pb2.ExtractRequest(data=data[start : start + _CHUNK])

    total = -1
    out: np.ndarray | None = None
    try:
        async for response in audio.Extract(requests(), metadata=outgoing_metadata(request_id)):
            if response.total_frames:
                total = response.total_frames
                out = np.zeros((total, MEL_BYTES), np.uint8)
            for window in response.windows:
                if out is None or not 0 <= window.frame_index < total or len(window.data) != MEL_BYTES:
                    raise InvalidMedia("the audio stage sent a malformed mel window")
                out[window.frame_index] = np.frombuffer(window.data, np.uint8)
    except grpc.aio.AioRpcError as exc:
        raise StageFailed("audio", exc) from exc
    if out is None or total <= 0:
        raise InvalidMedia("the audio is too short for one video frame")
    return out


async def prepare_audio(
    blobs: BlobStore, audio: audio_pb2_grpc.AudioServiceStub, job_id: str, data: bytes, fps: float,
    max_audio_seconds: float, segment_seconds: float, request_id: str = "",
) -> PreparedAudio:
    """Decode (the limits: a bad upload is refused before the job exists) and extract (mel windows) at
    once; store the upload and each segment's windows. The decode here only checks and measures
    (`audio_seconds`: no resampling, no samples kept); the audio task decodes for the AAC track."""
    t0 = time.perf_counter()
    windows_task = asyncio.create_task(extract_windows(audio, data, fps, request_id))
    try:
        seconds = await asyncio.to_thread(audio_seconds, data, max_audio_seconds)
    except BaseException:
        windows_task.cancel()
        await asyncio.gather(windows_task, return_exceptions=True)
        raise
    decoded = time.perf_counter() - t0

    windows = await windows_task
    extracted = time.perf_counter() - t0
    ranges = task_ranges(segment_bounds(len(windows), round(segment_seconds * fps)))

    def store() -> None:
        # The upload, for the audio task (which encodes the AAC track beside the segments), and each
        # segment's mel windows with their speech envelope (which needs the whole clip: see speech.py).
        speech = speech_envelope(windows.view("<f2").reshape(len(windows), MEL_BANDS, MEL_STEP), fps)
        puts = [(upload_key(job_id), data)] + [
            (mels_key(job_id, k), pack_segment_audio(windows[start:end], speech[start:end]))
            for k, (start, end) in enumerate(ranges) if k != AUDIO_TASK
        ]
        with ThreadPoolExecutor(min(_PUT_THREADS, len(puts))) as pool:
            list(pool.map(lambda item: blobs.put(*item), puts))

    await asyncio.to_thread(store)
    return PreparedAudio(
        seconds, len(windows), ranges,
        {"audio_decode": decoded, "audio": extracted, "submit": time.perf_counter() - t0},
    )
