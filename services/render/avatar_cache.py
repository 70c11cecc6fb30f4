"""A render worker's local copy of the avatars it renders: frames already in I420, memory-mapped.

The blob store holds each avatar as the user uploaded it (compressed); the first segment of an
avatar on a worker decodes it once, converts every frame to the encoder's pixel format (I420) and
keeps that on local disk (`<cache_dir>/avatars/<id>.i420.npy`), memory-mapped, so per output frame
only the face box is blended and patched in (DESIGN.md: "composite only what changes"). The most
recently used avatars stay open; the cache is safe to lose (a pod's emptyDir).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

import numpy as np

from services.common.avatars import AvatarMeta, load_crops, load_meta, prefix
from services.common.store.blobs import BlobStore
from services.common.media import decode_avatar
from services.render.composite import Compositor, I420Frames

_LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass
class LocalAvatar:
    meta: AvatarMeta
    crops: np.ndarray  # (K, 96, 96, 3) uint8, rows in meta.crop_frames order
    crop_row: dict[int, int]  # avatar frame index -> row of `crops`
    compositor: Compositor


class AvatarCache:
    def __init__(self, blobs: BlobStore, root: Path, max_open: int = 8) -> None:
        self._blobs = blobs
        self._root = Path(root) / "avatars"
        self._root.mkdir(parents=True, exist_ok=True)
        self._open: OrderedDict[str, LocalAvatar] = OrderedDict()
        self._max_open = max_open
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}

    def get(self, avatar_id: str) -> LocalAvatar:
        """The avatar, from memory, local disk, or (first use on this worker) the blob store.

        Raises NotFound when the avatar no longer exists in the blob store.
        """
        with self._lock:
            if avatar_id in self._open:
                self._open.move_to_end(avatar_id)
                return self._open[avatar_id]
            build_lock = self._building.setdefault(avatar_id, threading.Lock())
        with build_lock:  # one decode per avatar, however many segments ask at once
            with self._lock:
                if avatar_id in self._open:
                    return self._open[avatar_id]
            avatar = self._load(avatar_id)
            with self._lock:
                self._open[avatar_id] = avatar
                while len(self._open) > self._max_open:
                    self._open.popitem(last=False)
            return avatar

    def _load(self, avatar_id: str) -> LocalAvatar:
        meta = load_meta(self._blobs, avatar_id)
        crops = load_crops(self._blobs, avatar_id)
        path = self._root / f"{avatar_id}.i420.npy"
        if not path.exists():
            source = self._blobs.get(prefix(avatar_id) + "source")
            # The same decode as CreateAvatar's; the limits are the avatar's own (the source may be one
            # pixel wider and taller than the frames, which are cropped to even sizes).
            frames, _ = decode_avatar(source, photo_fps=meta.photo_fps, max_frames=max(meta.frame_count, 1), max_pixels=(meta.width + 1) * (meta.height + 1))
            if frames.shape[0] != meta.frame_count or frames.shape[1:3] != (meta.height, meta.width):
                raise RuntimeError(f"avatar {avatar_id}: the source decoded to {frames.shape[:3]}, its meta says {(meta.frame_count, meta.height, meta.width)}")
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp.npy")
            I420Frames.from_bgr(frames).save(tmp)
            del frames
            os.replace(tmp, path)
            _LOGGER.info("avatar cached", extra={"avatar_id": avatar_id, "frames": meta.frame_count})
        i420 = I420Frames.load(path, mmap=True)
        crop_row = {frame: row for row, frame in enumerate(meta.crop_frames)}
        return LocalAvatar(meta, crops, crop_row, Compositor(i420, meta.boxes))
