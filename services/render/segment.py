"""Render one segment of a job: its frames through lipsync (and superres), composited and encoded.

A segment is a few seconds of one job, so every stage stream is short (no stream outlives a
connection age) and a failure costs only that segment. Per segment:

1. one Generate stream to lipsync: the reference crops of the avatar frames this segment uses,
   then the mel windows of the frames that have a face (frames without one pass through);
2. with super-resolution, the generated 96x96 faces go on to one Upscale stream as they arrive;
3. each face is blended into its cached I420 template frame (only the face box changes) and the
   frames are encoded in order by x264 on one thread, into a local MP4 of this segment only.

The stages cut their answers by bytes (a close-up face at paste size can be megabytes); the
requests themselves are small (mel windows, 96x96 crops), a fixed number of items each.

An avatar of the `musetalk` tier (docs/architecture.md section 12) goes to the lipsync-musetalk stage
instead (MuseTalkService.Generate): the latents of the avatar frames the segment uses once
(LatentBank), the job's whisper windows its frames read once (AudioWindow, as SubmitJob stored them),
then per frame an item naming its latent, window and offset (upstream's rule, services/media/
whisper_windows.py). Its 256x256 faces are blended through the avatar's alpha masks (resized to the
box by the compositor, or by superres); frames whose speech envelope is shut ask for no face and
show the template's own mouth, and the envelope fades the generated mouth in and out
(services.media.speech.gate_weights).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc, superres_pb2, superres_pb2_grpc
from services.jobs.avatar_cache import LocalAvatar
from services.jobs.avatars import AvatarMeta
from services.jobs.segment_audio import SegmentAudio
from services.media.crops import Box
from services.media.musetalk_wire import pack_items, pack_latents
from services.media.packed import PackedImages
from services.media.speech import gate_weights
from services.media.timeline import LOOP_PING_PONG, loop_frame
from services.media.whisper_windows import frame_items
from services.media.wire import image_from_proto, image_to_proto, pack_generate_items
from services.render.mp4 import Mp4Writer
from services.serving.channels import stage_errors
from services.serving.errors import CorruptRecord, NotReady
from services.serving.metrics import Metrics
from services.serving.stages import MUSETALK_TIER
from services.serving.streams import stream_call

# Small messages keep a segment's stages overlapped (lipsync of message k+1 while superres does k and
# x264 encodes k-1); a 2 s segment is 50 frames, so 10 per message gives 5 steps of that pipeline.
# The requests stay small whatever the face size (mel windows, 96x96 crops); the stages cut their
# answers by bytes, so paste-size faces of a close-up need no sizing here.
ITEMS_PER_MESSAGE = 10
LATENTS_PER_MESSAGE = 64  # a musetalk avatar's latents are 16 KB a frame: 1 MB per LatentBank message
MAX_PENDING_FRAMES = 16  # frames handed to the encoder thread and not yet written (back-pressure)


@dataclasses.dataclass
class SegmentResult:
    frames: int
    models: list[dict]
    stage_seconds: dict[str, float]


def _model_dict(info: common_pb2.ModelInfo) -> dict:
    return {"name": info.name, "backend": info.backend, "precision": info.precision}


class SegmentRenderer:
    """Renders segments for one worker process; owns its encoder thread."""

    def __init__(
        self,
        lipsync: Callable[[], lipsync_pb2_grpc.LipSyncServiceStub] | lipsync_pb2_grpc.LipSyncServiceStub,
        superres: Callable[[], superres_pb2_grpc.SuperResServiceStub] | superres_pb2_grpc.SuperResServiceStub,
        metrics: Metrics,
        preset: str,
        threads: int,
        nice: int = 0,
        musetalk: Callable[[], lipsync_pb2_grpc.MuseTalkServiceStub]
        | lipsync_pb2_grpc.MuseTalkServiceStub
        | None = None,
    ) -> None:
        # Stub providers, called once per segment: a stub is taken on the stage's current channel, so a
        # replica added to (or removed from) the address set gets (or stops getting) the next segment.
        # A plain stub is accepted too (always the same channel). `musetalk`: None where this
        # deployment runs no lipsync-musetalk stage.
        self._lipsync = _provider(lipsync)
        self._superres = _provider(superres)
        self._musetalk = _provider(musetalk) if musetalk is not None else None
        self._metrics = metrics
        self._preset = preset
        self._threads = threads
        self._encoder = ThreadPoolExecutor(
            1, thread_name_prefix="encode", initializer=_lower_priority, initargs=(nice,)
        )

    def close(self) -> None:
        self._encoder.shutdown(wait=True, cancel_futures=True)

    async def render(
        self,
        avatar: LocalAvatar,
        start: int,
        end: int,
        audio: SegmentAudio,
        super_resolution: bool,
        crf: int,
        output: Path,
        metadata: Sequence[tuple[str, str]] = (),
        template_loop: str = LOOP_PING_PONG,
        whisper: Sequence[lipsync_pb2.AudioWindow] = (),
        whisper_windows: int = 0,
    ) -> SegmentResult:
        """Frames [start, end) into `output` (an H.264 MP4 without audio, frame 0 = `start`).

        `audio`: one mel window and speech envelope value per frame. `template_loop`: how output
        frames map to template frames (`services.media.timeline.loop_frame`; the job's JobOptions.loop, the same
        for every segment). A `musetalk` avatar's: `whisper`, the job's whisper windows these frames
        read (services.media.whisper_windows.windows_read) of its `whisper_windows`. Raises
        StageFailed on a stage error; on any error or cancellation the partial file is removed.
        """
        meta = avatar.meta
        times: dict[str, float] = {"lipsync": 0.0, "composite": 0.0, "encode": 0.0}
        models: list[dict] = []
        gate: np.ndarray | None = None  # the musetalk tier's blend weight per frame of the segment
        if meta.model == MUSETALK_TIER:
            if audio.speech is None:
                raise CorruptRecord("a musetalk job's segment has no speech envelope (its noise gate)")
            gate = gate_weights(audio.speech)
        face_frames = [
            i
            for i in range(start, end)
            if meta.boxes[loop_frame(i, meta.frame_count, template_loop)] is not None
            and (gate is None or gate[i - start] > 0)
        ]
        loop = asyncio.get_running_loop()
        writer = await loop.run_in_executor(
            self._encoder,
            lambda: Mp4Writer(
                output,
                meta.width,
                meta.height,
                meta.fps,
                None,
                48000,
                crf=crf,
                preset=self._preset,
                threads=self._threads,
            ),
        )
        pending: list[asyncio.Future] = []
        next_frame = start

        def write(frame_index: int, face: np.ndarray | None) -> None:  # on the encoder thread, in order
            t0 = time.perf_counter()
            # Composed straight into the encoder's own frame: one copy of the cached frame, no other.
            weight = 1.0 if gate is None or face is None else float(gate[frame_index - start])
            avatar.compositor.frame_into(
                loop_frame(frame_index, meta.frame_count, template_loop), face, writer.i420_planes(), weight
            )
            t1 = time.perf_counter()
            writer.write_planes()
            t2 = time.perf_counter()
            times["composite"] += t1 - t0
            times["encode"] += t2 - t1
            self._metrics.render_composite_seconds.observe(t1 - t0)
            self._metrics.render_encode_seconds.observe(t2 - t1)

        async def emit(frame_index: int, face: np.ndarray | None) -> None:
            nonlocal next_frame
            while next_frame < frame_index:  # frames without a face before this one
                await submit(next_frame, None)
            await submit(frame_index, face)

        async def submit(frame_index: int, face: np.ndarray | None) -> None:
            nonlocal next_frame
            pending.append(loop.run_in_executor(self._encoder, write, frame_index, face))
            next_frame = frame_index + 1
            if len(pending) >= MAX_PENDING_FRAMES:
                await pending.pop(0)
                while pending and pending[0].done():
                    pending.pop(0).result()

        try:
            if meta.model == MUSETALK_TIER:
                faces = self._generated_musetalk(
                    avatar, face_frames, whisper, whisper_windows, times, models, metadata, template_loop
                )
            else:
                faces = self._generated(
                    avatar, face_frames, start, audio, super_resolution, times, models, metadata, template_loop
                )
            if super_resolution and face_frames:
                faces = self._restored(avatar, faces, times, models, metadata, template_loop)
            async for frame_index, face in faces:
                await emit(frame_index, face)
            while next_frame < end:
                await submit(next_frame, None)
            for future in pending:
                await future
            pending.clear()
            t0 = time.perf_counter()
            await loop.run_in_executor(self._encoder, writer.close)
            times["encode"] += time.perf_counter() - t0
        except BaseException:
            for future in pending:
                future.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.shield(loop.run_in_executor(self._encoder, writer.abort))
            raise
        self._metrics.render_frames.inc(end - start)
        return SegmentResult(end - start, models, times)

    async def _generated(
        self,
        avatar: LocalAvatar,
        face_frames: list[int],
        start: int,
        audio: SegmentAudio,
        raw_size: bool,
        times: dict[str, float],
        models: list[dict],
        metadata: Sequence[tuple[str, str]],
        template_loop: str = LOOP_PING_PONG,
    ) -> AsyncIterator[tuple[int, np.ndarray]]:
        """(frame index, face) from lipsync, in order: 96x96 with `raw_size`, else at paste size."""
        if not face_frames:
            return
        meta = avatar.meta
        if audio.mels is None:
            raise CorruptRecord("a wav2lip job's segment has no mel windows")
        mels = audio.mels
        used = sorted({loop_frame(i, meta.frame_count, template_loop) for i in face_frames})

        async def requests() -> AsyncIterator[lipsync_pb2.GenerateRequest]:
            for k in range(0, len(used), ITEMS_PER_MESSAGE):
                crops = []
                for f in used[k : k + ITEMS_PER_MESSAGE]:
                    x1, y1, x2, y2 = _face_box(meta, f)
                    crops.append(
                        lipsync_pb2.ReferenceCrop(
                            crop_index=f,
                            image=image_to_proto(avatar.crops[avatar.crop_row[f]]),
                            paste_width=x2 - x1,
                            paste_height=y2 - y1,
                        )
                    )
                yield lipsync_pb2.GenerateRequest(crops=crops, raw_size=raw_size)
            for k in range(0, len(face_frames), ITEMS_PER_MESSAGE):
                frames = face_frames[k : k + ITEMS_PER_MESSAGE]
                rows = [i - start for i in frames]
                yield lipsync_pb2.GenerateRequest(
                    items=pack_generate_items(
                        frames,
                        [loop_frame(i, meta.frame_count, template_loop) for i in frames],
                        [mels[r].tobytes() for r in rows],
                        None if audio.speech is None else audio.speech[rows].tolist(),
                    ),
                    raw_size=raw_size,
                )

        async for index, face in _faces("lipsync", self._lipsync().Generate, requests(), times, models, metadata):
            yield index, face

    async def _generated_musetalk(
        self,
        avatar: LocalAvatar,
        face_frames: list[int],
        whisper: Sequence[lipsync_pb2.AudioWindow],
        whisper_windows: int,
        times: dict[str, float],
        models: list[dict],
        metadata: Sequence[tuple[str, str]],
        template_loop: str = LOOP_PING_PONG,
    ) -> AsyncIterator[tuple[int, np.ndarray]]:
        """(frame index, 256x256 face) from lipsync-musetalk, in order (see the module docstring)."""
        if not face_frames:
            return
        if self._musetalk is None:
            raise NotReady(
                "this render worker has no lipsync-musetalk stage (its lipsync_musetalk_address is empty), "
                "so it cannot render jobs of musetalk avatars"
            )
        meta = avatar.meta
        latents = avatar.latents
        assert latents is not None
        used = sorted({loop_frame(i, meta.frame_count, template_loop) for i in face_frames})

        async def requests() -> AsyncIterator[lipsync_pb2.MuseTalkGenerateRequest]:
            for k in range(0, len(used), LATENTS_PER_MESSAGE):
                frames = used[k : k + LATENTS_PER_MESSAGE]
                rows = np.asarray([avatar.crop_row[f] for f in frames])
                yield lipsync_pb2.MuseTalkGenerateRequest(latents=pack_latents(frames, latents[rows]))
            for window in whisper:  # up to 480 KB each: one per message
                yield lipsync_pb2.MuseTalkGenerateRequest(windows=[window])
            for k in range(0, len(face_frames), ITEMS_PER_MESSAGE):
                frames = face_frames[k : k + ITEMS_PER_MESSAGE]
                audio = [frame_items(i, meta.fps, whisper_windows) for i in frames]
                items = pack_items(
                    frames,
                    [loop_frame(i, meta.frame_count, template_loop) for i in frames],
                    [window for window, _ in audio],
                    [offset for _, offset in audio],
                )
                yield lipsync_pb2.MuseTalkGenerateRequest(items=items)

        generate = self._musetalk().Generate
        async for index, face in _faces("lipsync-musetalk", generate, requests(), times, models, metadata):
            yield index, face

    async def _restored(
        self,
        avatar: LocalAvatar,
        faces: AsyncIterator[tuple[int, np.ndarray]],
        times: dict[str, float],
        models: list[dict],
        metadata: Sequence[tuple[str, str]],
        template_loop: str = LOOP_PING_PONG,
    ) -> AsyncIterator[tuple[int, np.ndarray]]:
        meta = avatar.meta

        async def requests() -> AsyncIterator[superres_pb2.UpscaleRequest]:
            items: list[superres_pb2.UpscaleItem] = []
            async for index, face in faces:
                x1, y1, x2, y2 = _face_box(meta, loop_frame(index, meta.frame_count, template_loop))
                items.append(
                    superres_pb2.UpscaleItem(
                        index=index, image=image_to_proto(face), out_width=x2 - x1, out_height=y2 - y1
                    )
                )
                if len(items) == ITEMS_PER_MESSAGE:
                    yield superres_pb2.UpscaleRequest(items=items)
                    items = []
            if items:
                yield superres_pb2.UpscaleRequest(items=items)

        t0 = time.perf_counter()
        async with stage_errors("superres"):  # `requests` read the lipsync stream: its failure is raised as itself
            async for response in stream_call(self._superres().Upscale, requests(), metadata=metadata):
                if response.HasField("model"):
                    models.append(_model_dict(response.model))
                for item in response.items:
                    yield item.index, image_from_proto(item.image, "restored face")
                times["superres"] = time.perf_counter() - t0


async def _faces(
    stage: str,
    generate: Callable[..., Any],
    requests: AsyncIterator[Any],
    times: dict[str, float],
    models: list[dict],
    metadata: Sequence[tuple[str, str]],
) -> AsyncIterator[tuple[int, np.ndarray]]:
    """(frame index, face) as a generator stage's Generate answers them (both tiers answer packed
    GeneratedFaces), in order; its model noted once, the time so far as "lipsync"."""
    t0 = time.perf_counter()
    async with stage_errors(stage):
        async for response in stream_call(generate, requests, metadata=metadata):
            if response.HasField("model"):
                models.append(_model_dict(response.model))
            for index, face in zip(response.faces.frame_indices, PackedImages.from_pb(response.faces).arrays()):
                yield index, face
            times["lipsync"] = time.perf_counter() - t0


def _face_box(meta: AvatarMeta, frame: int) -> Box:
    """The face box of an avatar frame that has one (the renderer sends only face frames to the stages)."""
    box = meta.boxes[frame]
    if box is None:
        raise ValueError(f"avatar frame {frame} has no face box")
    return box


def _provider(stub: object) -> Callable[[], Any]:
    """A zero-argument stub provider for `stub` (a provider already, or one stub to return every time)."""
    return stub if callable(stub) else (lambda: stub)


def _lower_priority(nice: int) -> None:
    """Runs on the encoder thread: Linux nice values are per thread and inherited by the threads
    libx264 starts from it, so this lowers exactly the encoding work of this process."""
    if nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # not Linux, or not allowed: encode at the normal priority
        pass
