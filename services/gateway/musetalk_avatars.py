"""CreateAvatar for the `musetalk` tier: the upload's frames through the lipsync-musetalk stage's
PrepareAvatar, its answers into the avatar's pack (docs/architecture.md section 12).

The frames are decoded and sent a message at a time (gRPC's flow control paces the decoder) and each
answer (the frame's box, the latents of its 256x256 crop, the alpha mask over the 1.5x square) is
written to local .npy files as it comes, so memory is flat in the avatar's length as for Wav2Lip
avatars (services.gateway.avatars). The pack's layout is services/jobs/avatars.py's. A frame with no
face passes through (no latents, no mask); so does a frame whose mouth is covered (the stage's last
answer names them, after every frame's: their rows are left out when the .npy files are written); an
avatar with no face at all, or only covered ones, is INVALID_ARGUMENT (as the Wav2Lip tier's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import grpc
import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2, lipsync_pb2_grpc
from services.gateway.avatars import DETECT_ATTEMPTS, OpenFrames, PrepareAvatar, _chunks
from services.jobs.avatars import AvatarMeta, prefix, save_musetalk_avatar_files
from services.jobs.store.blobs import BlobStore
from services.jobs.store.jobs import AvatarRecord
from services.media.crops import Box
from services.media.decode import AvatarFrames, open_avatar
from services.media.musetalk_wire import LATENT_BYTES, LATENT_SHAPE, MASK_BYTES, MASK_SHAPE
from services.media.wire import image_to_proto
from services.serving.channels import StageFailed, stage_error_message
from services.serving.errors import InvalidMedia, NotReady
from services.serving.streams import stream_call
from services.serving.tracing import outgoing_metadata

_LOGGER = logging.getLogger(__name__)
STAGE = "lipsync-musetalk"


def musetalk_preparer(stub: lipsync_pb2_grpc.MuseTalkServiceStub) -> PrepareAvatar:
    """`create_musetalk_avatar` on this stub, in `services.gateway.avatars.add_avatar`'s `prepare` form."""
    return functools.partial(create_musetalk_avatar, stub=stub)


def _box(box: common_pb2.Box) -> Box:
    return (box.x1, box.y1, box.x2, box.y2)


#: rows copied at a time from a raw file into its .npy (4 MiB of masks): memory stays flat in the avatar
COPY_ROWS = 64


class _Pack:
    """The answers of one PrepareAvatar stream, written as they come: raw latents and masks in two
    local files, the boxes in memory (a few numbers per frame)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.boxes: list[Box | None] = []
        self.mask_boxes: list[Box | None] = []
        self.model = common_pb2.ModelInfo()
        self.box_source = ""
        self.frame_size = (0, 0)  # (height, width) of the frames as decoded
        self.mouth_covered = 0  # frames found with a face whose mouth is covered (they pass through)
        self._rows = 0  # rows written to the raw files (one per frame found, in frame order)
        self._dropped: list[int] = []  # rows of the covered frames, ascending: left out of the .npy files
        self._latents: BinaryIO = open(folder / "latents.raw", "wb")
        self._masks: BinaryIO = open(folder / "masks.raw", "wb")

    @property
    def faces(self) -> int:
        return sum(b is not None for b in self.boxes)

    def add(self, response: lipsync_pb2.PrepareAvatarResponse) -> None:
        """One answer: its frames must follow the ones before (the stage answers in order)."""
        if response.HasField("model"):
            self.model.CopyFrom(response.model)
            self.box_source = response.box_source
        if response.mouth_covered:
            self._cover(list(response.mouth_covered))
        for frame in response.frames:
            if self.mouth_covered:
                raise RuntimeError(f"{STAGE} answered frame {frame.index} after the covered mouths")
            if frame.index != len(self.boxes):
                raise RuntimeError(f"{STAGE} answered frame {frame.index} where {len(self.boxes)} was next")
            if not frame.found:
                self.boxes.append(None)
                self.mask_boxes.append(None)
                continue
            latents, mask = frame.latents, frame.mask  # a bytes field is copied on each read: once
            if len(latents) != LATENT_BYTES or len(mask) != MASK_BYTES:
                raise RuntimeError(
                    f"{STAGE} answered frame {frame.index} with {len(latents)} bytes of latents and {len(mask)} of mask"
                )
            self._latents.write(latents)
            self._masks.write(mask)
            self._rows += 1
            self.boxes.append(_box(frame.box))
            self.mask_boxes.append(_box(frame.mask_box))

    def _cover(self, frames: list[int]) -> None:
        """The stage's last answer: these frames' mouths are covered; they pass through (no box, no row)."""
        if self.mouth_covered:
            raise RuntimeError(f"{STAGE} named the covered mouths twice")
        if frames != sorted(set(frames)) or any(i >= len(self.boxes) or self.boxes[i] is None for i in frames):
            raise RuntimeError(f"{STAGE} named covered mouths {frames[:5]} that are not frames answered with a face")
        covered = set(frames)
        row = 0
        for i, box in enumerate(self.boxes):
            if box is None:
                continue
            if i in covered:
                self._dropped.append(row)
                self.boxes[i] = self.mask_boxes[i] = None
            row += 1
        self.mouth_covered = len(frames)

    def finish(self) -> tuple[Path, Path]:
        """The two .npy files of the pack: the raw files' rows less the covered frames', copied a few rows
        at a time through memory maps (flat in the avatar's length)."""
        self._latents.close()
        self._masks.close()
        out = []
        for name, dtype, shape in (
            ("latents", np.dtype("<f2"), LATENT_SHAPE),
            ("masks", np.dtype(np.uint8), MASK_SHAPE),
        ):
            raw, path = self.folder / f"{name}.raw", self.folder / f"{name}.npy"
            kept = np.lib.format.open_memmap(
                path, mode="w+", dtype=dtype, shape=(self._rows - len(self._dropped), *shape)
            )
            if self._rows:
                rows = np.memmap(raw, dtype=dtype, mode="r", shape=(self._rows, *shape))
                at = 0
                for start, stop in _runs(self._rows, self._dropped):
                    for first in range(start, stop, COPY_ROWS):
                        last = min(stop, first + COPY_ROWS)
                        kept[at : at + last - first] = rows[first:last]
                        at += last - first
                del rows
            kept.flush()
            del kept
            raw.unlink()
            out.append(path)
        return out[0], out[1]

    def close(self) -> None:
        self._latents.close()
        self._masks.close()


def _runs(rows: int, dropped: list[int]) -> list[tuple[int, int]]:
    """The [start, stop) runs of rows 0..rows-1 left once the (ascending) `dropped` rows are taken out."""
    runs, start = [], 0
    for row in [*dropped, rows]:
        if row > start:
            runs.append((start, row))
        start = row + 1
    return runs


async def prepare_frames(
    stub: lipsync_pb2_grpc.MuseTalkServiceStub, open_frames: OpenFrames, folder: Path, request_id: str = ""
) -> _Pack:
    """Every frame of the avatar through PrepareAvatar, decoded as it is sent; the answers in `folder`.

    A replica that goes away (UNAVAILABLE: draining, a connection past its age) is tried again from
    the first frame, up to DETECT_ATTEMPTS times, as DetectFaces is."""
    for attempt in range(1, DETECT_ATTEMPTS + 1):
        pack = _Pack(folder)
        sent = 0

        async def requests() -> AsyncIterator[lipsync_pb2.PrepareAvatarRequest]:
            nonlocal sent
            async for chunk in _chunks(open_frames):
                pack.frame_size = chunk[0].shape[:2]
                items = [lipsync_pb2.IndexedFrame(index=sent + i, image=image_to_proto(f)) for i, f in enumerate(chunk)]
                sent += len(chunk)
                yield lipsync_pb2.PrepareAvatarRequest(frames=items)

        try:
            call = stream_call(stub.PrepareAvatar, requests(), metadata=outgoing_metadata(request_id))
            async for response in call:
                pack.add(response)
        except grpc.aio.AioRpcError as exc:
            pack.close()
            if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < DETECT_ATTEMPTS:
                continue
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise StageFailed(STAGE, exc) from exc  # the avatar itself: keep the stage's status
            raise NotReady(stage_error_message(STAGE, exc)) from exc
        except BaseException:
            pack.close()
            raise
        if len(pack.boxes) != sent:
            pack.close()
            raise RuntimeError(f"{STAGE} answered {len(pack.boxes)} of the {sent} frames sent")
        return pack
    raise AssertionError("unreachable")


async def create_musetalk_avatar(
    blobs: BlobStore,
    lipsync: object,  # add_avatar's Wav2Lip stage: not used by this tier
    aid: str,
    data: bytes,
    name: str,
    photo_fps: float,
    max_frames: int,
    max_pixels: int,
    request_id: str = "",
    *,
    stub: lipsync_pb2_grpc.MuseTalkServiceStub,
) -> AvatarRecord:
    """Decode, prepare (PrepareAvatar) and store one `musetalk` avatar; its summary (the caller
    records it). On any failure nothing of the avatar is left in the blob store."""

    def open_frames() -> AvatarFrames:
        return open_avatar(data, photo_fps=photo_fps, max_frames=max_frames, max_pixels=max_pixels)

    opened = await asyncio.to_thread(open_frames)  # the upload's own errors before any stage call
    fps = opened.fps
    opened.close()
    with tempfile.TemporaryDirectory(prefix="lipline-musetalk-avatar-") as folder:
        pack = await prepare_frames(stub, open_frames, Path(folder), request_id)
        height, width = pack.frame_size
        if not pack.faces:  # covered mouths only: no face to sync, as the Wav2Lip tier's (services.gateway.avatars)
            raise InvalidMedia(
                "no face found in the avatar; use a photo or video with one frontal, well-lit face covering at least 10% of the picture"
            )
        prep: dict[str, str | int] = {
            "box_source": pack.box_source,
            "model": pack.model.name,
            "backend": pack.model.backend,
            "mouth_covered": pack.mouth_covered,
        }
        meta = AvatarMeta(
            aid,
            name,
            fps,
            photo_fps,
            len(pack.boxes),
            width,
            height,
            pack.boxes,
            time.time(),
            model="musetalk",
            mask_boxes=pack.mask_boxes,
            prep=prep,
        )

        def save() -> None:
            latents, masks = pack.finish()
            save_musetalk_avatar_files(blobs, meta, data, latents, masks)

        try:
            await asyncio.to_thread(save)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(blobs.delete_prefix, prefix(aid))
            raise
    _LOGGER.info(
        "musetalk avatar prepared",
        extra={"avatar_id": aid, "frames": meta.frame_count, "faces": meta.faces_found, **prep},
    )
    return AvatarRecord(
        aid, name, fps, meta.frame_count, meta.width, meta.height, meta.faces_found, meta.create_time, model="musetalk"
    )
