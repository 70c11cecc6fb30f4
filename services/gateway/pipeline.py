"""One job's render pipeline: audio -> mel windows -> lipsync (-> superres) -> paste -> H.264/AAC MP4.

The stages are chained as gRPC streams: mel windows go to the lipsync stream as the audio stage
produces them, generated faces go to the superres stream as they arrive, and the compositor pastes
and encodes each frame as soon as its face is back. Nothing waits for the whole clip, memory stays
flat, and bounded queues (gRPC flow control, the writer's pending list) push back on faster stages.

The compositor is two steps: a small pool of threads pastes each face into its template frame and
converts the frame to I420 (OpenCV, GIL released, frames are independent), and one encoder thread
feeds x264 (itself frame-threaded over all cores) in frame order. On an H200 host the single writer
thread that did both measured 5.1 ms per 720p frame, 77% of a 60 s clip's render time.

Each render is timed per part (Job.stage_seconds): the wall time of each stage call from its start to
its last response, the compositor threads' summed time pasting and converting, and the encoder
thread's summed time. The parts overlap (that is the point of streaming), so they do not add up to
the total.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2, superres_pb2
from services.common.codec import image_from_proto, image_to_proto, pack_generate_items, unpack_faces
from services.common.tracing import outgoing_metadata
from services.gateway.avatars import Avatar
from services.gateway.media import Mp4Writer, paste_face, to_yuv420
from services.gateway.stages import StageClients, stage_errors

_LOGGER = logging.getLogger(__name__)
CROPS_PER_MESSAGE = 32
ITEMS_PER_MESSAGE = 32
MAX_PENDING_WRITES = 32  # frames composited ahead of the encoder (each ~1.4 MB at 720p)
COMPOSITE_THREADS = 4


@dataclasses.dataclass
class RenderResult:
    frames: int
    models: list[common_pb2.ModelInfo]
    first_frame_seconds: float  # render start to the first frame handed to the encoder
    stage_seconds: dict[str, float]  # see render()


@dataclasses.dataclass
class _WriterClock:
    """Seconds the compositor and encoder threads spend, summed; `add_composite` takes a lock (a pool adds)."""

    started: float  # perf_counter() at the start of the render
    composite: float = 0.0  # paste_face + I420 conversion, summed over the compositor threads
    encode: float = 0.0  # Mp4Writer.write_yuv420 + close (x264 + AAC + mux), summed; encoder thread only
    first_frame: float = 0.0  # render start to the first frame's write returning
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add_composite(self, seconds: float) -> None:
        with self._lock:
            self.composite += seconds


@dataclasses.dataclass
class _Progress:
    """Shared between the stream tasks of one render."""

    total_frames: int = 0
    total_known: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
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
) -> RenderResult:
    """Render one job into `output`; raises grpc.aio.AioRpcError (from a stage) or a LiplineError.

    `stage_seconds` (also returned in the result) is filled in as the render goes, on the event loop,
    so a failed or cancelled job keeps what was measured: "audio", "lipsync", "superres" (each call's
    start to its last response), "composite" and "encode" (the writer thread's summed time),
    "first_frame" (render start to the first encoded frame) and, on success, "total" (render start
    to the MP4 under its final name).
    """
    started = time.perf_counter()
    times = stage_seconds if stage_seconds is not None else {}
    clock = _WriterClock(started)
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
                    progress.total_known.set()
                    on_progress("render", 0, progress.total_frames)
                for window in response.windows:
                    if avatar.boxes[avatar.frame_for(window.frame_index)] is not None:
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

        async for window in windows():
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
    height, width = avatar.frames.shape[1:3]
    loop = asyncio.get_running_loop()
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as encoder,
        ThreadPoolExecutor(max_workers=COMPOSITE_THREADS, thread_name_prefix="composite") as compositors,
    ):
        writer = await loop.run_in_executor(
            encoder, lambda: Mp4Writer(output, width, height, avatar.fps, audio_pcm, audio_rate, crf=crf, preset=preset)
        )
        # Composited frames (futures, in frame order) waiting for the encoder; bounded: back-pressure.
        composited: asyncio.Queue[asyncio.Future | None] = asyncio.Queue(MAX_PENDING_WRITES)
        next_frame = 0

        async def encode_in_order() -> None:
            while (frame := await composited.get()) is not None:
                await loop.run_in_executor(encoder, _encode_frame, writer, await frame, clock)

        encoding = asyncio.ensure_future(encode_in_order())

        async def enqueue(frame: asyncio.Future | None) -> None:
            """Queue a frame (None: the end) for the encoder; raises the encoder's error if it stopped."""
            if encoding.done():  # the encoder stopped early, so it failed
                await encoding
            if not composited.full():
                composited.put_nowait(frame)
                return
            # Wait for room, or for the encoder to fail (then nothing would ever make room).
            put = asyncio.ensure_future(composited.put(frame))
            await asyncio.wait({put, encoding}, return_when=asyncio.FIRST_COMPLETED)
            if not put.done():
                put.cancel()
                if frame is not None:
                    frame.cancel()
                await encoding

        async def emit(index: int, face: np.ndarray | None) -> None:
            await enqueue(loop.run_in_executor(compositors, _composite_frame, avatar, index, face, clock))
            if index % 25 == 0:
                on_progress("render", index, progress.total_frames)

        try:
            async for index, face in faces:
                while next_frame < index:  # frames without a face before this one
                    await emit(next_frame, None)
                    next_frame += 1
                await emit(index, face)
                next_frame = index + 1
            await progress.total_known.wait()
            while next_frame < progress.total_frames:
                await emit(next_frame, None)
                next_frame += 1
            await enqueue(None)
            await encoding
            on_progress("encode", progress.total_frames, progress.total_frames)
            await loop.run_in_executor(encoder, _close, writer, clock)
            times["total"] = time.perf_counter() - started
        except BaseException:
            encoding.cancel()
            while not composited.empty():
                frame = composited.get_nowait()
                if frame is not None:
                    frame.cancel()
            await asyncio.gather(encoding, return_exceptions=True)
            await loop.run_in_executor(encoder, writer.abort)
            raise
        finally:
            # Normally the threads are idle by now (every frame awaited, or the abort queued after
            # them); on a cancel mid-abort these are just floats they may still add to.
            times["composite"], times["encode"] = clock.composite, clock.encode
            if clock.first_frame:
                times["first_frame"] = clock.first_frame
    return RenderResult(progress.total_frames, progress.models, clock.first_frame, times)


def _reference_crop(avatar: Avatar, frame: int) -> lipsync_pb2.ReferenceCrop:
    x1, y1, x2, y2 = avatar.boxes[frame]  # type: ignore[misc]
    return lipsync_pb2.ReferenceCrop(
        crop_index=frame, image=image_to_proto(avatar.crops[frame]), paste_width=x2 - x1, paste_height=y2 - y1
    )


def _composite_frame(avatar: Avatar, index: int, face: np.ndarray | None, clock: _WriterClock) -> np.ndarray:
    """Runs on a compositor thread: paste the face (if any) into its template frame, convert to I420."""
    t0 = time.perf_counter()
    frame_index = avatar.frame_for(index)
    frame = np.asarray(avatar.frames[frame_index])
    if face is not None:
        frame = paste_face(frame, face, avatar.boxes[frame_index])  # type: ignore[arg-type]
    i420 = to_yuv420(frame)
    clock.add_composite(time.perf_counter() - t0)
    return i420


def _encode_frame(writer: Mp4Writer, frame_i420: np.ndarray, clock: _WriterClock) -> None:
    """Runs on the encoder thread, in frame order."""
    t0 = time.perf_counter()
    writer.write_yuv420(frame_i420)
    t1 = time.perf_counter()
    clock.encode += t1 - t0
    if not clock.first_frame:
        clock.first_frame = t1 - clock.started


def _close(writer: Mp4Writer, clock: _WriterClock) -> None:
    """Runs on the writer thread: the rest of the audio, the encoders' flush, the rename."""
    t0 = time.perf_counter()
    writer.close()
    clock.encode += time.perf_counter() - t0
