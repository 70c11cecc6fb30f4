"""SubmitJob's work, done once per job before it is queued: check and decode the audio, make the mel
windows (the audio stage) and the AAC track, and store them where the render workers read them.

The job exists in the job store only once all of this is stored, so a worker never sees half a job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from lipline.v1 import audio_pb2, audio_pb2_grpc
from services.common.audio_decode import decode_audio
from services.common.channels import StageFailed
from services.common.codec import MEL_BANDS, MEL_STEP
from services.common.errors import InvalidMedia
from services.common.jobkeys import audio_key, mels_key
from services.common.store.blobs import BlobStore
from services.common.tracing import outgoing_metadata
from services.gateway.jobs import segment_bounds
from services.gateway.media import encode_aac

MUX_AUDIO_RATE = 48_000  # AAC in the output; the original audio resampled, mono
_MEL_BYTES = MEL_BANDS * MEL_STEP * 2
_CHUNK = 1 << 20
_PUT_THREADS = 8  # mel blobs of a long job go up in parallel (S3 PUTs are latency-bound)


@dataclasses.dataclass(frozen=True)
class PreparedAudio:
    audio_seconds: float
    total_frames: int
    segments: list[tuple[int, int]]
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
                out = np.zeros((total, _MEL_BYTES), np.uint8)
            for window in response.windows:
                if out is None or not 0 <= window.frame_index < total or len(window.data) != _MEL_BYTES:
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
    """Decode (limits and the AAC track) and extract (mel windows) at once; store both per segment."""
    t0 = time.perf_counter()
    windows_task = asyncio.create_task(extract_windows(audio, data, fps, request_id))
    try:
        pcm = await asyncio.to_thread(decode_audio, data, MUX_AUDIO_RATE, max_audio_seconds)
    except BaseException:
        windows_task.cancel()
        await asyncio.gather(windows_task, return_exceptions=True)
        raise
    decoded = time.perf_counter() - t0

    timings: dict[str, float] = {}

    def store_aac() -> None:  # the slowest part for long clips (~6 ms per second of audio): in parallel
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="lipline-aac-") as folder:
            path = Path(folder) / "audio.m4a"
            encode_aac(pcm, MUX_AUDIO_RATE, path)
            blobs.put_file(audio_key(job_id), path)
        timings["store_aac"] = time.perf_counter() - started

    aac_task = asyncio.create_task(asyncio.to_thread(store_aac))
    try:
        windows = await windows_task
        extracted = time.perf_counter() - t0
        segments = segment_bounds(len(windows), round(segment_seconds * fps))

        def store_mels() -> None:
            started = time.perf_counter()
            with ThreadPoolExecutor(min(_PUT_THREADS, len(segments))) as pool:
                list(pool.map(lambda k: blobs.put(mels_key(job_id, k), windows[segments[k][0] : segments[k][1]].tobytes()),
                              range(len(segments))))
            timings["store_mels"] = time.perf_counter() - started

        await asyncio.to_thread(store_mels)
    finally:
        await asyncio.gather(aac_task, return_exceptions=True)  # never leave the thread writing behind us
    aac_task.result()
    return PreparedAudio(
        len(pcm) / MUX_AUDIO_RATE, len(windows), segments,
        {"audio_decode": decoded, "audio": extracted, **timings, "submit": time.perf_counter() - t0},
    )
