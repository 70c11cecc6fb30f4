"""Tests for services.gateway.avatars: ids, the on-disk/in-memory AvatarStore, frame looping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.common.errors import NotFound
from services.gateway.avatars import Avatar, AvatarStore, avatar_id, build_avatar
from services.lipsync.prep import crop_and_resize

BOXES = [(4, 6, 36, 40), None, (8, 8, 40, 44), None, (0, 0, 48, 48)]


def _frames(count: int = 5, height: int = 48, width: int = 48) -> np.ndarray:
    rng = np.random.default_rng(count)
    return rng.integers(0, 256, size=(count, height, width, 3), dtype=np.uint8)


def _avatar(data: bytes = b"video bytes", fps: float = 25.0, name: str = "anna") -> Avatar:
    return build_avatar(avatar_id(data, fps), name, _frames(), fps, list(BOXES))


def _assert_same(got: Avatar, want: Avatar) -> None:
    assert got.id == want.id
    assert got.name == want.name
    assert got.fps == want.fps
    assert got.create_time == pytest.approx(want.create_time)
    np.testing.assert_array_equal(np.asarray(got.frames), want.frames)
    assert got.boxes == want.boxes
    assert sorted(got.crops) == sorted(want.crops)
    for i in want.crops:
        np.testing.assert_array_equal(got.crops[i], want.crops[i])


def test_avatar_id_is_stable_hex_and_depends_on_bytes_and_photo_fps() -> None:
    a = avatar_id(b"photo", 25.0)
    assert a == avatar_id(b"photo", 25.0)
    assert len(a) == 24 and all(c in "0123456789abcdef" for c in a)
    assert a != avatar_id(b"photo", 30.0)
    assert a != avatar_id(b"photo2", 25.0)
    assert avatar_id(b"photo", 25) == a  # int and float fps are the same avatar


def test_build_avatar_makes_crops_for_face_frames_only() -> None:
    avatar = _avatar()
    assert sorted(avatar.crops) == [0, 2, 4]
    for i in (0, 2, 4):
        crop = avatar.crops[i]
        assert crop.shape == (96, 96, 3) and crop.dtype == np.uint8
        np.testing.assert_array_equal(crop, crop_and_resize(avatar.frames[i], BOXES[i]))
    assert avatar.frame_count == 5
    assert avatar.faces_found == 3


def test_frame_for_wraps_around_the_template() -> None:
    avatar = _avatar()
    assert [avatar.frame_for(i) for i in range(12)] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    photo = build_avatar("ab", "photo", _frames(1), 25.0, [(0, 0, 10, 10)])
    assert {photo.frame_for(i) for i in range(50)} == {0}


def test_save_get_round_trip(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    avatar = _avatar()
    assert not store.exists(avatar.id)
    store.save(avatar)
    assert store.exists(avatar.id)
    assert (tmp_path / "avatars" / avatar.id / "meta.json").is_file()
    _assert_same(store.get(avatar.id), avatar)


def test_get_from_disk_in_a_fresh_store(tmp_path: Path) -> None:
    avatar = _avatar()
    AvatarStore(tmp_path).save(avatar)
    fresh = AvatarStore(tmp_path)  # nothing in memory: everything comes from disk
    got = fresh.get(avatar.id)
    assert got is not avatar
    _assert_same(got, avatar)
    assert got.boxes[1] is None and got.boxes[3] is None
    assert isinstance(got.boxes[0], tuple)
    assert fresh.get(avatar.id) is got  # now remembered


def test_list_returns_every_saved_avatar(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    a, b = _avatar(b"a"), _avatar(b"b", name="bob")
    store.save(a)
    store.save(b)
    assert {x.id for x in store.list()} == {a.id, b.id}
    assert {x.id for x in AvatarStore(tmp_path).list()} == {a.id, b.id}
    assert AvatarStore(tmp_path / "empty").list() == []


def test_list_ignores_leftovers_of_an_interrupted_save(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    avatar = _avatar()
    store.save(avatar)
    leftover = store.root / f"{avatar_id(b'other', 25.0)}.tmp12345"  # crash between write and rename
    leftover.mkdir()
    (leftover / "meta.json").write_text("{}")
    (store.root / "README").write_text("not an avatar")
    assert [x.id for x in AvatarStore(tmp_path).list()] == [avatar.id]


def test_saving_the_same_avatar_twice_is_harmless(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    avatar = _avatar()
    store.save(avatar)
    store.save(avatar)
    assert [p.name for p in store.root.iterdir()] == [avatar.id]  # no temp folder left behind
    _assert_same(AvatarStore(tmp_path).get(avatar.id), avatar)


def test_delete(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    avatar = _avatar()
    store.save(avatar)
    store.delete(avatar.id)
    assert not store.exists(avatar.id)
    assert not (store.root / avatar.id).exists()
    with pytest.raises(NotFound):
        store.get(avatar.id)  # not served from memory either
    with pytest.raises(NotFound):
        store.delete(avatar.id)
    assert store.list() == []


@pytest.mark.parametrize("bad", ["", "../x", "..", "/etc/passwd", "abc/../def", "ABCDEF", "xyz", "abc.tmp1", "a b"])
def test_malformed_ids_are_not_found(tmp_path: Path, bad: str) -> None:
    store = AvatarStore(tmp_path)
    with pytest.raises(NotFound):
        store.get(bad)
    with pytest.raises(NotFound):
        store.delete(bad)
    assert store.exists(bad) is False


def test_path_traversal_cannot_delete_outside_the_store(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path / "data")
    victim = tmp_path / "data" / "x"
    victim.mkdir()
    with pytest.raises(NotFound):
        store.delete("../x")
    assert victim.is_dir()


def test_unknown_well_formed_id_is_not_found(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path)
    unknown = avatar_id(b"never uploaded", 25.0)
    with pytest.raises(NotFound, match="does not exist"):
        store.get(unknown)
    with pytest.raises(NotFound):
        store.delete(unknown)


def test_memory_keeps_only_the_most_recent_avatars(tmp_path: Path) -> None:
    store = AvatarStore(tmp_path, memory_slots=1)
    a, b = _avatar(b"a"), _avatar(b"b")
    store.save(a)
    assert store.get(a.id) is a  # from memory
    store.save(b)
    again = store.get(a.id)  # evicted: loaded from disk
    assert again is not a
    _assert_same(again, a)
