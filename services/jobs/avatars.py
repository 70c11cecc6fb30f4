"""An avatar in the blob store: what CreateAvatar writes (gateway) and render workers read.

Layout under `avatars/<id>/`:
- `source`: the upload's own bytes (a photo or the template video, compressed as the user sent it;
  workers decode it once into their local cache, so the shared store never holds raw frames);
- `crops.npy`: the 96x96 BGR reference crop of every frame with a face, (K, 96, 96, 3) uint8, in
  the order of `AvatarMeta.crop_frames`;
- `meta.json`: `AvatarMeta`, written last: an avatar exists once its meta exists.

A `musetalk` avatar (its meta's `model`; docs/architecture.md section 12) has no `crops.npy`; its
pack is what the lipsync-musetalk stage's PrepareAvatar answered, in the order of `crop_frames`:
- `musetalk/latents.npy`: (K, 8, 32, 32) float16, per frame with a face the VAE latents of its
  256x256 crop (masked lower half | whole) x 0.18215: what a Generate stream's LatentBank sends;
- `musetalk/masks.npy`: (K, 256, 256) uint8, per frame the blurred alpha over its `mask_boxes` square
  (resized to 256x256): 255 = the generated face;
and the meta's `boxes` are the MuseTalk boxes (where a generated 256x256 face is pasted), its
`mask_boxes` the squares the masks cover, its `prep` how they were made (`box_source`: "dwpose" or
"face-detector"; `model`: the stage's ModelInfo name, e.g. a weight-free stand-in's).
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
from services.serving.stages import DEFAULT_TIER

MUSETALK_LATENTS = "musetalk/latents.npy"
MUSETALK_MASKS = "musetalk/masks.npy"


def new_avatar_id() -> str:
    """A random id (96 bits, the 24-hex shape `is_avatar_id` checks): nobody can derive another
    tenant's avatar id from a photo, as they could when ids were content hashes."""
    return secrets.token_hex(12)


def content_hash(data: bytes, photo_fps: float, model: str = DEFAULT_TIER) -> str:
    """What makes two uploads the same avatar within one tenant (the store's per-tenant content
    index): the bytes, the photo frame rate and the generator tier (another tier's preparation is
    another avatar). The formula of the ids before tenants for Wav2Lip's, so an avatar made then (its
    id is this hash) is found again by the same upload."""
    tier = "" if model == DEFAULT_TIER else f"|{model}"
    return hashlib.sha256(data + f"|{photo_fps:.6f}{tier}".encode()).hexdigest()[:24]


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
    model: str = DEFAULT_TIER  # the generator tier: "wav2lip" (crops.npy) or "musetalk" (musetalk/*)
    mask_boxes: list[Box | None] = dataclasses.field(default_factory=list)  # musetalk: per frame, the mask's square
    # musetalk: how it was prepared (box_source, model, backend; mouth_covered: frames passed through for it)
    prep: dict[str, str | int] = dataclasses.field(default_factory=dict)

    @property
    def crop_frames(self) -> list[int]:
        return [i for i, b in enumerate(self.boxes) if b is not None]

    @property
    def faces_found(self) -> int:
        return sum(b is not None for b in self.boxes)

    def to_json(self) -> bytes:
        d = dataclasses.asdict(self)
        for key in ("boxes", "mask_boxes"):
            d[key] = [list(b) if b is not None else None for b in d[key]]
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes) -> AvatarMeta:
        d = json.loads(data)  # a meta written before the tiers has no model, mask_boxes or prep
        for key in ("boxes", "mask_boxes"):
            d[key] = [tuple(b) if b is not None else None for b in d.get(key, [])]
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


def save_musetalk_avatar_files(
    blobs: BlobStore, meta: AvatarMeta, source: bytes, latents_npy: Path, masks_npy: Path
) -> None:
    """A `musetalk` avatar's blobs (the module docstring's layout), from .npy files written frame by
    frame; the meta last."""
    p = prefix(meta.id)
    blobs.put(p + "source", source)
    blobs.put_file(p + MUSETALK_LATENTS, latents_npy)
    blobs.put_file(p + MUSETALK_MASKS, masks_npy)
    blobs.put(p + "meta.json", meta.to_json())


def load_musetalk_pack(blobs: BlobStore, aid: str) -> tuple[np.ndarray, np.ndarray]:
    """A `musetalk` avatar's (latents (K, 8, 32, 32) float16, masks (K, 256, 256) uint8)."""
    p = prefix(aid)
    return np.load(io.BytesIO(blobs.get(p + MUSETALK_LATENTS))), np.load(io.BytesIO(blobs.get(p + MUSETALK_MASKS)))


def load_meta(blobs: BlobStore, aid: str) -> AvatarMeta:
    return AvatarMeta.from_json(blobs.get(prefix(aid) + "meta.json"))


def load_crops(blobs: BlobStore, aid: str) -> np.ndarray:
    return np.load(io.BytesIO(blobs.get(prefix(aid) + "crops.npy")))
