"""A worker's local copy of the avatars it composites (render workers and live workers): frames
already in I420, memory-mapped.

The blob store holds each avatar as the user uploaded it (compressed); the first use of an
avatar on a worker decodes it once, converts every frame to the encoder's pixel format (I420) and
keeps that on local disk (`<cache_dir>/avatars/<id>.i420.npy`), memory-mapped, so per output frame
only the face box is blended and patched in (docs/architecture.md section 1: only the face box changes). The most
recently used avatars stay open; the cache is safe to lose (a pod's emptyDir).

A `musetalk` avatar (docs/architecture.md section 12) has no 96x96 crops; its pack's latents and alpha
masks are downloaded beside its frames (`<id>.latents.npy`, `<id>.masks.npy`) and memory-mapped too
(16 KB and 64 KB a frame), and its compositor blends through the masks (services.media.composite.AlphaMasks).

Memory: the file is written one frame at a time (decode, convert, write), so building it holds one
BGR and one I420 frame, not the avatar (a 1,500-frame 1080p avatar is 9.3 GB in BGR, 4.7 GB in
I420); rendering maps it and pages in the frames it uses. Disk: the files together stay within a
budget (the worker's `avatar_cache_bytes` setting): before a new file is written, the least recently used
files of avatars not open are deleted (an open one's mapping stays valid if it goes: Linux frees an
unlinked file's pages only when the last map of it ends).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

import cv2
import numpy as np

from services.jobs.avatars import MUSETALK_LATENTS, MUSETALK_MASKS, AvatarMeta, load_crops, load_meta, prefix
from services.jobs.store.blobs import BlobStore
from services.media.composite import AlphaMasks, Compositor, I420Frames
from services.media.decode import open_avatar
from services.serving.stages import MUSETALK_TIER

_LOGGER = logging.getLogger(__name__)


#: the cache's files of one avatar: its frames in I420 and, for a musetalk avatar, its pack
SUFFIXES = (".i420.npy", ".latents.npy", ".masks.npy")
_NO_CROPS = np.zeros((0, 96, 96, 3), np.uint8)


@dataclasses.dataclass
class LocalAvatar:
    meta: AvatarMeta
    crops: np.ndarray  # (K, 96, 96, 3) uint8, rows in meta.crop_frames order (none for a musetalk avatar)
    crop_row: dict[int, int]  # avatar frame index -> row of `crops` (and of `latents`)
    compositor: Compositor
    latents: np.ndarray | None = None  # musetalk: (K, 8, 32, 32) float16, memory-mapped, rows as `crops`'


class AvatarCache:
    def __init__(self, blobs: BlobStore, root: Path, max_open: int = 8, max_bytes: int = 8 * 1024**3) -> None:
        self._blobs = blobs
        self._max_bytes = max_bytes
        self._used: dict[str, float] = {}  # avatar id -> last use (monotonic), this process's
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
            self._used[avatar_id] = time.monotonic()
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
                self._building.pop(avatar_id, None)  # later callers find it open; waiters hold the lock itself
                self._open[avatar_id] = avatar
                while len(self._open) > self._max_open:
                    self._open.popitem(last=False)
            return avatar

    def release(self, avatar_id: str) -> None:
        """Closes an open avatar: its crops, compositor and memory map go once nobody holds them. A live
        worker calls it when the last session of the avatar ends, so that it keeps no memory for
        sessions that closed; the local file stays, and the next `get` maps it again."""
        with self._lock:
            self._open.pop(avatar_id, None)

    @property
    def open_ids(self) -> list[str]:
        """The avatars open now (least recently used first)."""
        with self._lock:
            return list(self._open)

    def _load(self, avatar_id: str) -> LocalAvatar:
        meta = load_meta(self._blobs, avatar_id)
        musetalk = meta.model == MUSETALK_TIER
        crops = _NO_CROPS if musetalk else load_crops(self._blobs, avatar_id)
        path = self._root / f"{avatar_id}.i420.npy"
        if not path.exists():
            faces = meta.faces_found if musetalk else 0  # the pack: 16 KB of latents and 64 KB of mask a face
            self._make_room(meta.frame_count * meta.height * 3 // 2 * meta.width + faces * 81920, keep=avatar_id)
            self._build(avatar_id, meta, path)
        i420 = I420Frames.load(path, mmap=True)
        crop_row = {frame: row for row, frame in enumerate(meta.crop_frames)}
        if not musetalk:
            return LocalAvatar(meta, crops, crop_row, Compositor(i420, meta.boxes))
        latents, masks = (self._pack_file(avatar_id, key) for key in (MUSETALK_LATENTS, MUSETALK_MASKS))
        alpha = AlphaMasks(masks, meta.mask_boxes, crop_row)
        return LocalAvatar(meta, crops, crop_row, Compositor(i420, meta.boxes, alpha=alpha), latents)

    def _pack_file(self, avatar_id: str, key: str) -> np.ndarray:
        """One .npy of a musetalk avatar's pack, downloaded once beside its frames, memory-mapped."""
        path = self._root / f"{avatar_id}.{Path(key).name}"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            try:
                self._blobs.get_file(prefix(avatar_id) + key, tmp)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        return np.load(path, mmap_mode="r", allow_pickle=False)

    def _build(self, avatar_id: str, meta: AvatarMeta, path: Path) -> None:
        """Decodes the source and writes its frames in I420 to ``path``, one frame at a time."""
        source = self._blobs.get(prefix(avatar_id) + "source")
        # The same decode as CreateAvatar's; the limits are the avatar's own (the source may be one
        # pixel wider and taller than the frames, which are cropped to even sizes).
        frames = open_avatar(
            source,
            photo_fps=meta.photo_fps,
            max_frames=max(meta.frame_count, 1),
            max_pixels=(meta.width + 1) * (meta.height + 1),
        )
        del source
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp.npy")
        try:
            with I420Writer(tmp, meta.frame_count, meta.height, meta.width) as writer, frames:
                for frame in frames:
                    if frame.shape[:2] != (meta.height, meta.width) or writer.count >= meta.frame_count:
                        raise RuntimeError(
                            f"avatar {avatar_id}: the source decoded to frame {writer.count} of {frame.shape[1]}x{frame.shape[0]}, "
                            f"its meta says {meta.frame_count} frames of {meta.width}x{meta.height}"
                        )
                    writer.write(frame)
                if writer.count != meta.frame_count:
                    raise RuntimeError(
                        f"avatar {avatar_id}: the source decoded to {writer.count} frames, its meta says {meta.frame_count}"
                    )
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _LOGGER.info(
            "avatar cached", extra={"avatar_id": avatar_id, "frames": meta.frame_count, "bytes": path.stat().st_size}
        )

    def _make_room(self, needed: int, keep: str) -> None:
        """Deletes the cache files of the least recently used avatars not open (all of an avatar's
        files together) until ``needed`` more bytes fit the budget."""
        avatars: dict[str, list[tuple[Path, int, float]]] = {}
        for path in self._root.glob("*.npy"):
            if path.name.startswith(".") or not path.name.endswith(SUFFIXES):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            avatars.setdefault(_avatar_of(path), []).append((path, stat.st_size, stat.st_mtime))
        total = sum(size for files in avatars.values() for _, size, _ in files)
        if total + needed <= self._max_bytes:
            return
        with self._lock:
            open_ids = set(self._open)
            used = dict(self._used)
        now_wall, now_mono = time.time(), time.monotonic()

        def last_use(aid: str) -> float:
            # This process's last use where it has one, else its files' age (files from before a restart).
            return now_wall - (now_mono - used[aid]) if aid in used else max(m for _, _, m in avatars[aid])

        for aid in sorted(avatars, key=last_use):
            if total + needed <= self._max_bytes:
                break
            if aid in open_ids or aid == keep:
                continue
            size = 0
            for path, file_size, _ in avatars[aid]:
                path.unlink(missing_ok=True)
                size += file_size
            with self._lock:
                self._used.pop(aid, None)  # the record of uses stays as small as the cache
            total -= size
            _LOGGER.info("avatar cache file evicted", extra={"avatar_id": aid, "bytes": size})
        if total + needed > self._max_bytes:
            _LOGGER.warning(
                "avatar cache over its disk budget: the avatars open now, and the one being built, need it",
                extra={"bytes": total + needed, "avatar_cache_bytes": self._max_bytes},
            )


def _avatar_of(path: Path) -> str:
    """The avatar id of one of the cache's files (its name less the SUFFIXES)."""
    return path.name.split(".", 1)[0]


class I420Writer:
    """Writes a ``(count, height * 3 / 2, width)`` uint8 .npy (the layout `I420Frames.load` maps) frame by frame.

    Plain sequential writes, not a writable memory map: pages written through a map count in the
    process's RSS until written back, pages written with write(2) only in the page cache.
    """

    def __init__(self, path: Path, count: int, height: int, width: int) -> None:
        self.count = 0
        self._expected = count
        self._height, self._width = height, width
        self._file = open(path, "wb")
        header = {
            "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
            "fortran_order": False,
            "shape": (count, height * 3 // 2, width),
        }
        np.lib.format.write_array_header_1_0(self._file, header)
        self._i420 = np.empty((height * 3 // 2, width), np.uint8)

    def write(self, frame_bgr: np.ndarray) -> None:
        converted = cv2.cvtColor(np.ascontiguousarray(frame_bgr), cv2.COLOR_BGR2YUV_I420, dst=self._i420)
        self._file.write(np.ascontiguousarray(converted).data.cast("B"))
        self.count += 1

    def __enter__(self) -> I420Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()
