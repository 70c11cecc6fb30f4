"""The avatar cache: frames, smoothed face boxes and 96x96 reference crops, keyed by content hash.

Preparing an avatar (decode + face detection + smoothing) is done once at CreateAvatar; every job of
that avatar then only needs audio. Avatars live on disk under `<data_dir>/avatars/<id>/` (so they
survive a restart) and the most recently used ones stay in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from services.common.errors import NotFound
from services.lipsync.faces import Box
from services.lipsync.prep import crop_and_resize


@dataclasses.dataclass
class Avatar:
    id: str
    name: str
    fps: float
    frames: np.ndarray               # (F, H, W, 3) uint8 BGR
    boxes: list[Box | None]          # per frame; None = no face (frame passes through)
    crops: dict[int, np.ndarray]     # frame index -> (96, 96, 3) reference crop
    create_time: float

    @property
    def frame_count(self) -> int:
        return len(self.frames)

    @property
    def faces_found(self) -> int:
        return sum(b is not None for b in self.boxes)

    def frame_for(self, output_index: int) -> int:
        """Avatar frame used for output frame i: the template loops (Wav2Lip's `i % len(frames)`)."""
        return output_index % len(self.frames)


def avatar_id(data: bytes, photo_fps: float) -> str:
    return hashlib.sha256(data + f"|{photo_fps:.6f}".encode()).hexdigest()[:24]


def build_avatar(avatar_id: str, name: str, frames: np.ndarray, fps: float, boxes: list[Box | None]) -> Avatar:
    crops = {i: crop_and_resize(frames[i], box) for i, box in enumerate(boxes) if box is not None}
    return Avatar(avatar_id, name, fps, frames, boxes, crops, time.time())


class AvatarStore:
    def __init__(self, root: Path, memory_slots: int = 8) -> None:
        self.root = root / "avatars"
        self.root.mkdir(parents=True, exist_ok=True)
        self._memory: OrderedDict[str, Avatar] = OrderedDict()
        self._slots = memory_slots
        self._lock = threading.Lock()

    def _dir(self, avatar_id: str) -> Path:
        if not avatar_id or not all(c in "0123456789abcdef" for c in avatar_id):
            raise NotFound(f"avatar {avatar_id!r} does not exist")
        return self.root / avatar_id

    def exists(self, avatar_id: str) -> bool:
        try:
            return (self._dir(avatar_id) / "meta.json").is_file()
        except NotFound:
            return False

    def save(self, avatar: Avatar) -> None:
        """Write to a temp folder and rename, so a crash never leaves half an avatar behind."""
        final = self._dir(avatar.id)
        tmp = final.with_name(final.name + f".tmp{threading.get_ident()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.save(tmp / "frames.npy", avatar.frames)
        meta = {
            "id": avatar.id, "name": avatar.name, "fps": avatar.fps, "create_time": avatar.create_time,
            "boxes": [list(b) if b is not None else None for b in avatar.boxes],
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(final)
        self._remember(avatar)

    def get(self, avatar_id: str) -> Avatar:
        with self._lock:
            if avatar_id in self._memory:
                self._memory.move_to_end(avatar_id)
                return self._memory[avatar_id]
        folder = self._dir(avatar_id)
        if not (folder / "meta.json").is_file():
            raise NotFound(f"avatar {avatar_id!r} does not exist; create it with CreateAvatar")
        meta = json.loads((folder / "meta.json").read_text())
        frames = np.load(folder / "frames.npy", mmap_mode="r")
        boxes = [tuple(b) if b is not None else None for b in meta["boxes"]]
        avatar = build_avatar(meta["id"], meta["name"], frames, meta["fps"], boxes)  # type: ignore[arg-type]
        avatar.create_time = meta["create_time"]
        self._remember(avatar)
        return avatar

    def list(self) -> list[Avatar]:
        # exists() also skips `<id>.tmp<n>` folders a crash during save() may leave behind.
        return [self.get(p.name) for p in sorted(self.root.iterdir()) if self.exists(p.name)]

    def delete(self, avatar_id: str) -> None:
        folder = self._dir(avatar_id)
        if not folder.is_dir():
            raise NotFound(f"avatar {avatar_id!r} does not exist")
        with self._lock:
            self._memory.pop(avatar_id, None)
        shutil.rmtree(folder)

    def _remember(self, avatar: Avatar) -> None:
        with self._lock:
            self._memory[avatar.id] = avatar
            self._memory.move_to_end(avatar.id)
            while len(self._memory) > self._slots:
                self._memory.popitem(last=False)
