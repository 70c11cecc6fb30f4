"""services.jobs.avatars: an avatar's blobs as the gateway writes and render workers read them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.jobs.avatars import (
    AvatarMeta,
    content_hash,
    is_avatar_id,
    load_crops,
    load_meta,
    new_avatar_id,
    save_avatar,
)
from services.jobs.store.folder import FolderBlobStore

META = AvatarMeta(
    "0123456789abcdef01234567", "me", 25.0, 25.0, 3, 64, 48, [(1, 2, 30, 40), None, (3, 4, 33, 44)], 1000.0
)


def test_content_hash_is_stable_hex_and_depends_on_bytes_and_photo_fps() -> None:
    a = content_hash(b"photo", 25.0)
    assert a == content_hash(b"photo", 25.0) and is_avatar_id(a)  # an old id is its content hash
    assert a != content_hash(b"photo", 30.0) and a != content_hash(b"photo2", 25.0)
    assert not is_avatar_id("../../etc") and not is_avatar_id("")


def test_new_avatar_ids_are_random_and_look_like_avatar_ids() -> None:
    ids = {new_avatar_id() for _ in range(100)}
    assert len(ids) == 100 and all(is_avatar_id(i) for i in ids)


def test_meta_json_round_trip_and_derived_fields() -> None:
    back = AvatarMeta.from_json(META.to_json())
    assert back == META
    assert back.crop_frames == [0, 2] and back.faces_found == 2


def test_save_then_load(tmp_path: Path) -> None:
    blobs = FolderBlobStore(str(tmp_path))
    crops = np.random.default_rng(0).integers(0, 256, (2, 96, 96, 3), dtype=np.uint8)
    save_avatar(blobs, META, b"source bytes", crops)
    assert load_meta(blobs, META.id) == META
    np.testing.assert_array_equal(load_crops(blobs, META.id), crops)
    assert blobs.get(f"avatars/{META.id}/source") == b"source bytes"


def test_a_musetalk_pack_round_trips_and_an_older_meta_is_wav2lips(tmp_path: Path) -> None:
    import json

    from services.jobs.avatars import load_musetalk_pack, save_musetalk_avatar_files

    meta = AvatarMeta(
        "0123456789abcdef01234568",
        "tier",
        25.0,
        25.0,
        2,
        64,
        48,
        [(1, 2, 30, 40), None],
        1000.0,
        model="musetalk",
        mask_boxes=[(-5, -3, 36, 45), None],
        prep={"box_source": "face-detector", "model": "face-detector+musetalk-standin+ellipse"},
    )
    assert AvatarMeta.from_json(meta.to_json()) == meta
    latents, masks = tmp_path / "latents.npy", tmp_path / "masks.npy"
    np.save(latents, np.full((1, 8, 32, 32), 0.5, np.float16))
    np.save(masks, np.full((1, 256, 256), 7, np.uint8))
    blobs = FolderBlobStore(str(tmp_path / "blobs"))
    save_musetalk_avatar_files(blobs, meta, b"src", latents, masks)
    assert load_meta(blobs, meta.id) == meta
    got_latents, got_masks = load_musetalk_pack(blobs, meta.id)
    assert got_latents.dtype == np.float16 and got_latents.shape == (1, 8, 32, 32) and (got_masks == 7).all()
    older = json.loads(META.to_json())
    for key in ("model", "mask_boxes", "prep"):
        del older[key]  # what a version before the tiers wrote
    back = AvatarMeta.from_json(json.dumps(older).encode())
    assert back.model == "wav2lip" and back.mask_boxes == [] and back == META
