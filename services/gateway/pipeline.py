"""One job's render pipeline: audio -> mel windows -> lipsync (-> superres) -> paste -> H.264/AAC MP4.

The stages are chained as gRPC streams: mel windows go to the lipsync stream, generated faces go to
the superres stream as they arrive, and the compositor pastes and encodes each frame as soon as its
face is back. Memory stays flat, and bounded queues (gRPC flow control, the encoders' queues) push
back on faster stages.

Compositing and encoding (`services.gateway.encoding.ClipEncoder`) run in parallel over up to
`segments` consecutive parts of the clip, each with its own x264 encoder, joined at the end by a
stream copy. For that the frames are requested from the stages interleaved across the parts: when
there is more than one part, the mel windows of the whole clip are collected first (the audio stage
takes ~0.1 s per minute of audio) and sent part 1 frame 1, part 2 frame 1, ..., so that every
encoder works from the start.

Each render is timed per part (Job.stage_seconds): the wall time of each stage call from its start
to its last response, the compositor threads' summed time pasting and converting, and the encoder
threads' summed time (the join included). The parts overlap (that is the point of streaming), so
they do not add up to the total.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2, superres_pb2
from services.common.codec import image_from_proto, image_to_proto, pack_generate_items, unpack_faces
from services.common.tracing import outgoing_metadata
from services.gateway.avatars import Avatar
from services.gateway.encoding import MIN_SEGMENT_FRAMES, ClipEncoder, EncodeClock, interleave_key, segment_bounds
from services.gateway.stages import StageClients, stage_errors

_LOGGER = logging.getLogger(__name__)
CROPS_PER_MESSAGE = 32
ITEMS_PER_MESSAGE = 32


@dataclasses.dataclass
class RenderResult:
    frames: int
    models: list[common_pb2.ModelInfo]
    first_frame_seconds: float  # render start to the first frame handed to the encoder


@dataclasses.dataclass
class _Progress:
    """Shared between the stream tasks of one render."""

    total_frames: int = 0
    total_known: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    bounds: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # the clip's parts, once total is known
    models: list[common_pb2.ModelInfo] = dataclasses.field(default_factory=list)


async def render(
    clients: StageClients,
    avatar: Avatar,
    audio_bytes: bytes,
    audio_pcm: np.ndarray,
    audio_rate: int,
    output: Path,
    super_resolution: bool,
    crf: int,
    on_progress: Callable[[str, int, int], None],
    request_id: str = "",
    stage_seconds: dict[str, float] | None = None,
    preset: str = "veryfast",
    segments: int = 1,
    min_segment_frames: int = MIN_SEGMENT_FRAMES,
) -> RenderResult:
    """Render one job into `output`; raises grpc.aio.AioRpcError (from a stage) or a LiplineError.

    `stage_seconds` is filled in as the render goes, on the event loop,
    so a failed or cancelled job keeps what was measured: "audio", "lipsync", "superres" (each call's
    start to its last response), "composite" and "encode" (the threads' summed time),
    "first_frame" (render start to the first encoded frame) and, on success, "total" (render start
    to the MP4 under its final name). `segments` is the most parts encoded in parallel,
    each at least `min_segment_frames` long.
    """
    started = time.perf_counter()
    times = stage_seconds if stage_seconds is not None else {}
    clock = EncodeClock(started)
    progress = _Progress()
    metadata = outgoing_metadata(request_id)

    async def windows() -> AsyncIterator[common_pb2.MelWindow]:
        """Mel windows of the frames that have a face (others pass through without generation)."""
        call_started = time.perf_counter()
        async with stage_errors("audio"):
            async for response in clients.extract(audio_bytes, avatar.fps, request_id):
                times["audio"] = time.perf_counter() - call_started
                if response.total_frames:
                    progress.total_frames = response.total_frames
                    progress.bounds = segment_bounds(response.total_frames, segments, min_segment_frames)
                    progress.total_known.set()
                    on_progress("render", 0, progress.total_frames)
                for window in response.windows:
                    if avatar.boxes[avatar.frame_for(window.frame_index)] is not None:
                        yield window

    async def ordered_windows() -> AsyncIterator[common_pb2.MelWindow]:
        """The windows in the order the encoders want them: interleaved across the clip's parts.

        A clip of one part (short, or `segments` 1) streams straight through; the parts are known
        from the audio stage's first response, before its first window.
        """
        collected: list[common_pb2.MelWindow] = []
        async for window in windows():
            if len(progress.bounds) > 1:
                collected.append(window)
            else:
                yield window
        collected.sort(key=lambda window: interleave_key(window.frame_index, progress.bounds))
        for window in collected:
            yield window

    async def lipsync_requests() -> AsyncIterator[lipsync_pb2.GenerateRequest]:
        crop_ids = sorted(avatar.crops)
        for start in range(0, len(crop_ids), CROPS_PER_MESSAGE):
            yield lipsync_pb2.GenerateRequest(
                crops=[_reference_crop(avatar, i) for i in crop_ids[start : start + CROPS_PER_MESSAGE]],
                raw_size=super_resolution,
            )
        frames: list[int] = []
        mels: list[bytes] = []

        def message() -> lipsync_pb2.GenerateRequest:
            crops = [avatar.frame_for(i) for i in frames]
            return lipsync_pb2.GenerateRequest(items=pack_generate_items(frames, crops, mels), raw_size=super_resolution)

        async for window in ordered_windows():
            frames.append(window.frame_index)
            mels.append(window.data)
            if len(frames) == ITEMS_PER_MESSAGE:
                yield message()
                frames, mels = [], []
        if frames:
            yield message()

    async def generated() -> AsyncIterator[tuple[int, np.ndarray]]:
        call_started = time.perf_counter()
        async with stage_errors("lipsync"):
            async for response in clients.lipsync.Generate(lipsync_requests(), metadata=metadata):
                times["lipsync"] = time.perf_counter() - call_started
                if response.HasField("model"):
                    progress.models.append(response.model)
                for index, face in unpack_faces(response.faces):
                    yield index, face

    async def restored() -> AsyncIterator[tuple[int, np.ndarray]]:
        async def requests() -> AsyncIterator[superres_pb2.UpscaleRequest]:
            items: list[superres_pb2.UpscaleItem] = []
            async for index, face in generated():
                x1, y1, x2, y2 = avatar.boxes[avatar.frame_for(index)]  # type: ignore[misc]
                items.append(
                    superres_pb2.UpscaleItem(index=index, image=image_to_proto(face), out_width=x2 - x1, out_height=y2 - y1)
                )
                if len(items) == ITEMS_PER_MESSAGE:
                    yield superres_pb2.UpscaleRequest(items=items)
                    items = []
            if items:
                yield superres_pb2.UpscaleRequest(items=items)

        call_started = time.perf_counter()
        async with stage_errors("superres"):
            async for response in clients.superres.Upscale(requests(), metadata=metadata):
                times["superres"] = time.perf_counter() - call_started
                if response.HasField("model"):
                    progress.models.append(response.model)
                for item in response.items:
                    yield item.index, image_from_proto(item.image, "restored face")

    faces = restored() if super_resolution else generated()
    encoder: ClipEncoder | None = None

    async def clip_encoder() -> ClipEncoder:
        """The encoder, made once the clip's length (and so its parts) is known."""
        nonlocal encoder
        if encoder is None:
            await progress.total_known.wait()
            encoder = ClipEncoder(
                avatar, output, audio_pcm, audio_rate, progress.bounds, clock,
                lambda done, total: on_progress("render", done, total), crf=crf, preset=preset,
            )
            try:
                await encoder.start()
            except BaseException:
                await encoder.abort()
                encoder = None
                raise
        return encoder

    try:
        async for index, face in faces:
            await (await clip_encoder()).put(index, face)
        finished = await clip_encoder()
        on_progress("encode", progress.total_frames, progress.total_frames)
        await finished.finish()
        times["total"] = time.perf_counter() - started
    except BaseException:
        if encoder is not None:
            await encoder.abort()
        raise
    finally:
        # Normally the threads are idle by now (every frame awaited, or the abort queued after them);
        # on a cancel mid-abort these are just floats they may still add to.
        times["composite"], times["encode"] = clock.composite, clock.encode
        if clock.first_frame:
            times["first_frame"] = clock.first_frame
    return RenderResult(progress.total_frames, progress.models, clock.first_frame)


def _reference_crop(avatar: Avatar, frame: int) -> lipsync_pb2.ReferenceCrop:
    x1, y1, x2, y2 = avatar.boxes[frame]  # type: ignore[misc]
    return lipsync_pb2.ReferenceCrop(
        crop_index=frame, image=image_to_proto(avatar.crops[frame]), paste_width=x2 - x1, paste_height=y2 - y1
    )
