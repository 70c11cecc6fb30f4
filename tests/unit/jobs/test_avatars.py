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
