"""CreateAvatar's work: decode the upload, find the faces (the lipsync stage's DetectFaces), cut the
96x96 reference crops, and write it all to the blob store, where every render worker finds it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np

from lipline.v1 import lipsync_pb2, lipsync_pb2_grpc
from services.common.avatars import AvatarMeta, save_avatar
from services.common.channels import StageFailed, stage_error_message
from services.common.codec import image_to_proto
from services.common.crops import Box, crop_and_resize
from services.common.errors import InvalidMedia, NotReady
from services.common.store.blobs import BlobStore
from services.common.store.jobs import AvatarRecord
from services.common.tracing import outgoing_metadata
from services.common.media import decode_avatar

FRAMES_PER_MESSAGE = 8
DETECT_ATTEMPTS = 3  # a replica draining or a connection reaching its age ends the stream UNAVAILABLE


async def detect_faces(lipsync: lipsync_pb2_grpc.LipSyncServiceStub, frames: np.ndarray, request_id: str = "") -> list[Box | None]:
    """Padded, smoothed face boxes for every frame of an avatar."""

    async def requests() -> AsyncIterator[lipsync_pb2.DetectFacesRequest]:
        for start in range(0, len(frames), FRAMES_PER_MESSAGE):
            yield lipsync_pb2.DetectFacesRequest(
                frames=[lipsync_pb2.IndexedFrame(index=i, image=image_to_proto(frames[i])) for i in range(start, min(start + FRAMES_PER_MESSAGE, len(frames)))]
            )

    for attempt in range(1, DETECT_ATTEMPTS + 1):
        boxes: list[Box | None] = [None] * len(frames)
        try:
            async for response in lipsync.DetectFaces(requests(), metadata=outgoing_metadata(request_id)):
                for face in response.faces:
                    if face.found and 0 <= face.index < len(frames):
                        boxes[face.index] = (face.box.x1, face.box.y1, face.box.x2, face.box.y2)
            return boxes
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < DETECT_ATTEMPTS:
                continue  # the channel balances the next call onto another (or a fresh) connection
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise StageFailed("lipsync", exc) from exc  # the avatar itself: keep the stage's status
            raise NotReady(stage_error_message("lipsync", exc)) from exc
    raise AssertionError("unreachable")


async def create_avatar(
    blobs: BlobStore,
    lipsync: lipsync_pb2_grpc.LipSyncServiceStub,
    aid: str,
    data: bytes,
    name: str,
    photo_fps: float,
    max_frames: int,
    max_pixels: int,
    request_id: str = "",
) -> AvatarRecord:
    """Decode, detect, crop and store one avatar; returns its summary (the caller records it)."""
    frames, fps = await asyncio.to_thread(decode_avatar, data, photo_fps=photo_fps, max_frames=max_frames, max_pixels=max_pixels)
    boxes = await detect_faces(lipsync, frames, request_id)
    if not any(b is not None for b in boxes):
        raise InvalidMedia("no face found in the avatar; use a photo or video with one frontal, well-lit face covering at least 10% of the picture")
    count, height, width = frames.shape[:3]
    meta = AvatarMeta(aid, name, fps, photo_fps, count, width, height, boxes, time.time())

    def cut_and_save() -> None:
        crops = np.stack([crop_and_resize(frames[i], boxes[i]) for i in meta.crop_frames])  # type: ignore[arg-type]
        save_avatar(blobs, meta, data, crops)

    await asyncio.to_thread(cut_and_save)
    return AvatarRecord(aid, name, fps, count, width, height, meta.faces_found, meta.create_time)
