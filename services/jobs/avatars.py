"""An avatar in the blob store: what CreateAvatar writes (gateway) and render workers read.

Layout under `avatars/<id>/`:
- `source`: the upload's own bytes (a photo or the template video, compressed as the user sent it;
  workers decode it once into their local cache, so the shared store never holds raw frames);
- `crops.npy`: the 96x96 BGR reference crop of every frame with a face, (K, 96, 96, 3) uint8, in
  the order of `AvatarMeta.crop_frames`;
- `meta.json`: `AvatarMeta`, written last: an avatar exists once its meta exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import secrets
from pathlib import Path

import numpy as np

from services.jobs.store.blobs import BlobStore
from services.media.crops import Box


def new_avatar_id() -> str:
    """A random id (96 bits, the 24-hex shape `is_avatar_id` checks): nobody can derive another
    tenant's avatar id from a photo, as they could when ids were content hashes."""
    return secrets.token_hex(12)


def content_hash(data: bytes, photo_fps: float) -> str:
    """What makes two uploads the same avatar within one tenant (the store's per-tenant content
    index): the bytes and the photo frame rate. The formula of the ids before tenants, so an avatar
    made then (its id is this hash) is found again by the same upload."""
    return hashlib.sha256(data + f"|{photo_fps:.6f}".encode()).hexdigest()[:24]


def is_avatar_id(text: str) -> bool:
    return len(text) == 24 and all(c in "0123456789abcdef" for c in text)


def prefix(aid: str) -> str:
    return f"avatars/{aid}/"


@dataclasses.dataclass(frozen=True)
class AvatarMeta:
    id: str
    name: str
    fps: float
    photo_fps: float  # how the source is decoded again (a photo becomes one frame)
    frame_count: int
    width: int  # of the decoded frames (even)
    height: int
    boxes: list[Box | None]  # per frame, padded and smoothed; None = no face (frame passes through)
    create_time: float

    @property
    def crop_frames(self) -> list[int]:
        return [i for i, b in enumerate(self.boxes) if b is not None]

    @property
    def faces_found(self) -> int:
        return sum(b is not None for b in self.boxes)

    def to_json(self) -> bytes:
        d = dataclasses.asdict(self)
        d["boxes"] = [list(b) if b is not None else None for b in self.boxes]
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes) -> AvatarMeta:
        d = json.loads(data)
        d["boxes"] = [tuple(b) if b is not None else None for b in d["boxes"]]
        return cls(**d)


def save_avatar(blobs: BlobStore, meta: AvatarMeta, source: bytes, crops: np.ndarray) -> None:
    """Write the avatar's blobs; the meta last, so a reader never sees half an avatar."""
    p = prefix(meta.id)
    blobs.put(p + "source", source)
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(crops, dtype=np.uint8))
    blobs.put(p + "crops.npy", buf.getvalue())
    blobs.put(p + "meta.json", meta.to_json())


def save_avatar_files(blobs: BlobStore, meta: AvatarMeta, source: bytes, crops_npy: Path) -> None:
    """`save_avatar` with the crops already in a .npy file (written frame by frame, never all in memory)."""
    p = prefix(meta.id)
    blobs.put(p + "source", source)
    blobs.put_file(p + "crops.npy", crops_npy)
    blobs.put(p + "meta.json", meta.to_json())


def load_meta(blobs: BlobStore, aid: str) -> AvatarMeta:
    return AvatarMeta.from_json(blobs.get(prefix(aid) + "meta.json"))


def load_crops(blobs: BlobStore, aid: str) -> np.ndarray:
    return np.load(io.BytesIO(blobs.get(prefix(aid) + "crops.npy")))
