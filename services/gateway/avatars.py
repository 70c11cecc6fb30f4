"""CreateAvatar's work: decode the upload, find the faces (the lipsync stage's DetectFaces), cut the
96x96 reference crops, and write it all to the blob store, where every render worker finds it.

The frames are decoded one at a time, twice (once for the stage, once for the crops: the boxes are
smoothed over the whole clip, so none is known before the last frame is sent), and never held all
at once: a 1080p frame is 6 MB, a 1,500-frame avatar 9.3 GB (docs/performance.md, "Avatar memory").

`add_avatar` is CreateAvatar without the protos: the servicer decodes the upload stream into an
`AvatarUpload`, calls it, and turns the AvatarRecord it returns into the response."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from lipline.v1 import gateway_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.gateway.request_ids import request_key
from services.gateway.settings import GatewaySettings
from services.jobs.avatars import AvatarMeta, content_hash, new_avatar_id, prefix, save_avatar_files
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import AvatarRecord, JobStore, RequestKind, request_reused_message
from services.media.crops import IMG_SIZE, Box, crop_and_resize
from services.media.decode import AvatarFrames, open_avatar
from services.media.wire import image_to_proto
from services.serving.channels import StageFailed, stage_error_message
from services.serving.errors import InvalidMedia, InvalidRequest, NotReady
from services.serving.stages import DEFAULT_TIER
from services.serving.streams import stream_call
from services.serving.tracing import outgoing_metadata

_LOGGER = logging.getLogger(__name__)
FRAMES_PER_MESSAGE = 8
MESSAGE_BYTES = 16 * 1024 * 1024  # fewer frames per message above this (1080p: 2 frames, not 8)
DETECT_ATTEMPTS = 3  # a replica draining or a connection reaching its age ends the stream UNAVAILABLE

OpenFrames = Callable[[], AvatarFrames]
# create_avatar's signature: (blobs, lipsync, id, data, name, photo_fps, max_frames, max_pixels, request_id)
PrepareAvatar = Callable[..., Awaitable[AvatarRecord]]


def avatar_to_proto(avatar: AvatarRecord) -> gateway_pb2.Avatar:
    """The public view of an avatar's record."""
    created = Timestamp()
    created.FromNanoseconds(int(avatar.create_time * 1e9))
    return gateway_pb2.Avatar(
        id=avatar.id,
        name=avatar.name,
        frame_count=avatar.frame_count,
        fps=avatar.fps,
        width=avatar.width,
        height=avatar.height,
        faces_found=avatar.faces_found,
        create_time=created,
        labels=dict(avatar.labels),
        model=avatar.model,
    )


async def _chunks(open_frames: OpenFrames) -> AsyncIterator[list[np.ndarray]]:
    """The avatar's frames decoded in a worker thread, a message's worth at a time (copies: a
    decoded frame is only valid until the next)."""
    frames = await asyncio.to_thread(open_frames)
    it = iter(frames)

    def take() -> list[np.ndarray]:
        chunk: list[np.ndarray] = []
        for frame in it:
            chunk.append(np.array(frame))
            if len(chunk) >= max(1, min(FRAMES_PER_MESSAGE, MESSAGE_BYTES // max(frame.nbytes, 1))):
                break
        return chunk

    try:
        while chunk := await asyncio.to_thread(take):
            yield chunk
    finally:
        frames.close()


async def detect_faces(
    lipsync: lipsync_pb2_grpc.LipSyncServiceStub, open_frames: OpenFrames, request_id: str = ""
) -> list[Box | None]:
    """Padded, smoothed face boxes for every frame of an avatar, decoding it as it is sent.

    The frames are decoded and sent a message at a time (gRPC's flow control paces the decoder), so
    only the frames in flight are held; the stage may ask for them a second time (`send_again`), and
    they are decoded again then.
    """
    for attempt in range(1, DETECT_ATTEMPTS + 1):
        boxes: list[Box | None] = []
        decided: asyncio.Queue[bool] = asyncio.Queue()  # True: send the frames again

        async def requests() -> AsyncIterator[lipsync_pb2.DetectFacesRequest]:
            yield lipsync_pb2.DetectFacesRequest(options=lipsync_pb2.DetectFacesOptions(resends=True))
            while True:
                index = 0
                async for chunk in _chunks(open_frames):
                    items = [
                        lipsync_pb2.IndexedFrame(index=index + i, image=image_to_proto(f)) for i, f in enumerate(chunk)
                    ]
                    yield lipsync_pb2.DetectFacesRequest(frames=items)
                    index += len(chunk)
                yield lipsync_pb2.DetectFacesRequest(end_of_frames=True)
                if not await decided.get():
                    return

        try:
            # A limit met while decoding (services.media.decode) is raised by `requests`, and so here.
            call = stream_call(lipsync.DetectFaces, requests(), metadata=outgoing_metadata(request_id))
            async for response in call:
                if response.send_again:
                    decided.put_nowait(True)
                    continue
                for face in response.faces:
                    if face.index >= len(boxes):
                        boxes.extend([None] * (face.index + 1 - len(boxes)))
                    if face.found:
                        boxes[face.index] = (face.box.x1, face.box.y1, face.box.x2, face.box.y2)
            return boxes
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < DETECT_ATTEMPTS:
                continue  # the channel balances the next call onto another (or a fresh) connection
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise StageFailed("lipsync", exc) from exc  # the avatar itself: keep the stage's status
            raise NotReady(stage_error_message("lipsync", exc)) from exc
        finally:
            decided.put_nowait(False)  # the generator, if still waiting, ends
    raise AssertionError("unreachable")


def _write_crops(open_frames: OpenFrames, boxes: list[Box | None], path: Path) -> tuple[int, int, int]:
    """Decodes the avatar again and writes the crop of every frame with a face into a .npy at ``path``,
    frame by frame; returns (frames, height, width) as decoded."""
    rows = sum(b is not None for b in boxes)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, IMG_SIZE, IMG_SIZE, 3))
    row = 0
    with open_frames() as frames:
        for i, frame in enumerate(frames):
            box = boxes[i] if i < len(boxes) else None
            if box is not None:
                out[row] = crop_and_resize(frame, box)
                row += 1
        count, height, width = frames.count, frames.height, frames.width
    out.flush()
    del out
    if count != len(boxes) or row != rows:
        raise RuntimeError(f"the avatar decoded to {count} frames the second time, {len(boxes)} the first")
    return count, height, width


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
    """Decode, detect, crop and store one avatar; returns its summary (the caller records it).

    Memory is bounded by the frames in flight, not the avatar's length: the upload is decoded frame by
    frame for the stage (`detect_faces`), then once more to cut the crops, which go to a local file
    and from there to the blob store. On any failure nothing of the avatar is left in the blob store.
    """

    def open_frames() -> AvatarFrames:
        return open_avatar(data, photo_fps=photo_fps, max_frames=max_frames, max_pixels=max_pixels)

    fps = (await asyncio.to_thread(open_frames)).fps  # the upload's own errors before any stage call
    boxes = await detect_faces(lipsync, open_frames, request_id)
    if not any(b is not None for b in boxes):
        raise InvalidMedia(
            "no face found in the avatar; use a photo or video with one frontal, well-lit face covering at least 10% of the picture"
        )

    def cut_and_save() -> AvatarMeta:
        with tempfile.TemporaryDirectory(prefix="lipline-avatar-") as folder:
            crops = Path(folder) / "crops.npy"
            count, height, width = _write_crops(open_frames, boxes, crops)
            meta = AvatarMeta(aid, name, fps, photo_fps, count, width, height, boxes, time.time())
            save_avatar_files(blobs, meta, data, crops)
            return meta

    try:
        meta = await asyncio.to_thread(cut_and_save)
    except BaseException:
        await asyncio.to_thread(blobs.delete_prefix, prefix(aid))
        raise
    return AvatarRecord(aid, name, fps, meta.frame_count, meta.width, meta.height, meta.faces_found, meta.create_time)


@dataclasses.dataclass(frozen=True)
class AvatarUpload:
    """A CreateAvatar stream, decoded and checked for shape (size, name, photo_fps in range)."""

    data: bytes
    name: str
    photo_fps: float
    request_id: str = ""  # a checked UUID (services.gateway.request_ids), or "" for none
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # checked (services.gateway.labels)
    model: str = DEFAULT_TIER  # the generator tier, checked (services.gateway.tiers)


async def add_avatar(
    jobs: JobStore,
    blobs: BlobStore,
    lipsync: lipsync_pb2_grpc.LipSyncServiceStub,
    settings: GatewaySettings,
    upload: AvatarUpload,
    tenant: str,
    request_id: str = "",
    prepare: PrepareAvatar | None = None,
) -> AvatarRecord:
    """The tenant's avatar for this upload (`prepare` makes a new one: `create_avatar`, Wav2Lip's, by
    default; the servicer passes the upload's tier's, services.gateway.musetalk_avatars): the one it already has for the same bytes (the content
    index; another tenant's is never found), else a new one prepared (`create_avatar`) and recorded.
    On any failure nothing is left under the new id; a concurrent upload of the same bytes by the
    same tenant that was recorded first wins, and this one's blobs are deleted.

    With a request id: a repeat within the window returns the avatar the first made (InvalidRequest
    when the same id comes with other bytes, name or labels); the id is recorded with the avatar."""
    digest = await asyncio.to_thread(
        content_hash, upload.data, upload.photo_fps, upload.model
    )  # up to 200 MB: off the event loop
    fields = {"content_hash": digest, "name": upload.name, "labels": dict(upload.labels)}  # the tier is in the hash
    key = request_key(upload.request_id, fields, settings.request_id_window_s)
    if key is not None:
        earlier = await asyncio.to_thread(jobs.find_request, tenant, RequestKind.AVATAR, key.request_id, key.window_s)
        if earlier is not None:
            if earlier.digest != key.digest:
                raise InvalidRequest(request_reused_message(RequestKind.AVATAR, key.request_id))
            return await asyncio.to_thread(jobs.get_avatar, earlier.target_id, tenant)
    known = await asyncio.to_thread(jobs.find_avatar, tenant, digest)
    if known is not None:  # with a request id, recorded for the known avatar
        return known if key is None else await asyncio.to_thread(jobs.put_avatar, known, key)
    aid = new_avatar_id()
    recording = False
    try:
        record = await (prepare or create_avatar)(
            blobs,
            lipsync,
            aid,
            upload.data,
            upload.name,
            upload.photo_fps,
            settings.max_avatar_frames,
            settings.max_avatar_pixels,
            request_id,
        )
        recording = True
        stored = await asyncio.to_thread(
            jobs.put_avatar,
            dataclasses.replace(record, tenant=tenant, content_hash=digest, labels=dict(upload.labels)),
            key,
        )
    except BaseException as exc:  # a random id is never written again: leave nothing under it...
        # ...unless cancelled while put_avatar may still commit in its thread: deleting the blobs
        # then could leave a recorded avatar without data, so they stay (at worst unreferenced).
        if not (recording and isinstance(exc, asyncio.CancelledError)):
            await asyncio.shield(asyncio.to_thread(blobs.delete_prefix, prefix(aid)))
        raise
    if stored.id != aid:  # a concurrent upload of the same bytes by the same tenant was first
        await asyncio.to_thread(blobs.delete_prefix, prefix(aid))
        return stored
    _LOGGER.info("avatar created", extra={"avatar_id": aid, "frames": record.frame_count, "faces": record.faces_found})
    return stored
