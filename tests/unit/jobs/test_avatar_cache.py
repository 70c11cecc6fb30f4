"""The render worker's avatar cache keeps its files within `avatar_cache_bytes` (issue 17, item 3).

Real avatars (small PNG photos saved the way CreateAvatar saves them) in a real folder blob store,
and a real cache folder. "Open" is the cache's own word: the avatars it holds mapped in memory (the
`max_open` most recently used); an avatar a caller got earlier may still be in use after the cache
closed it, and it must keep working even when its file goes (the mapping outlives the unlink).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from services.jobs.avatar_cache import AvatarCache
from services.jobs.avatars import AvatarMeta, new_avatar_id, save_avatar, save_musetalk_avatar_files
from services.jobs.store.folder import FolderBlobStore

WIDTH, HEIGHT = 128, 96
FRAME_BYTES = WIDTH * HEIGHT * 3 // 2  # one I420 frame: what a one-frame avatar's cache file holds
OVER_BUDGET = "avatar cache over its disk budget"


def photo(shade: int) -> np.ndarray:
    image = np.full((HEIGHT, WIDTH, 3), shade, np.uint8)
    image[20:76, 40:88] = (40, 90, 200)  # something in the face box
    return image


def make_avatar(blobs: FolderBlobStore, shade: int) -> tuple[str, np.ndarray]:
    """A one-frame avatar saved as CreateAvatar saves one (source, crops, meta); its id and its frame in I420."""
    image = photo(shade)
    ok, png = cv2.imencode(".png", image)
    assert ok
    aid = new_avatar_id()
    meta = AvatarMeta(aid, f"shade {shade}", 25.0, 25.0, 1, WIDTH, HEIGHT, [(40, 20, 88, 76)], time.time())
    crops = np.full((1, 96, 96, 3), shade, np.uint8)
    save_avatar(blobs, meta, png.tobytes(), crops)
    return aid, cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)


def cached(root: Path) -> set[str]:
    """The avatars with a cache file on disk (temporary files are not counted: none may be left)."""
    assert not [p for p in (root / "avatars").iterdir() if p.name.startswith(".")], "a temporary file was left"
    return {p.name.removesuffix(".i420.npy") for p in (root / "avatars").glob("*.i420.npy")}


def file_bytes(root: Path, aid: str) -> int:
    return (root / "avatars" / f"{aid}.i420.npy").stat().st_size


@pytest.fixture
def blobs(tmp_path: Path) -> FolderBlobStore:
    return FolderBlobStore(str(tmp_path / "blobs"))


def test_a_budget_of_one_evicts_the_least_recently_used_closed_avatar_never_an_open_one(
    blobs: FolderBlobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    (a, a_frame), (b, _), (c, c_frame) = (make_avatar(blobs, shade) for shade in (30, 120, 210))
    probe = AvatarCache(blobs, tmp_path / "probe")
    probe.get(a)
    one_file = file_bytes(tmp_path / "probe", a)
    assert one_file > FRAME_BYTES  # the frame and the .npy header
    cache = AvatarCache(blobs, root, max_open=1, max_bytes=one_file + one_file // 2)  # fits one, not two

    held_a = cache.get(a)  # a segment renders from it for a while
    assert cached(root) == {a}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="services.jobs.avatar_cache"):
        cache.get(b)
    # a was open while b's file was made: it stays, and the log says the budget is exceeded.
    assert cached(root) == {a, b}
    assert any(r.levelno == logging.WARNING and OVER_BUDGET in r.getMessage() for r in caplog.records), caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="services.jobs.avatar_cache"):
        got_c = cache.get(c)  # only b is open now (max_open=1): a, least recently used and closed, goes
    assert cached(root) == {b, c}
    assert any("avatar cache file evicted" in r.getMessage() and r.avatar_id == a for r in caplog.records), caplog.text
    np.testing.assert_array_equal(got_c.compositor.frames[0], c_frame)
    # The segment that still holds a keeps rendering from it: the mapping outlives the file.
    np.testing.assert_array_equal(held_a.compositor.frames[0], a_frame)
    np.testing.assert_array_equal(held_a.compositor.frame(0, None), a_frame)

    again = cache.get(a)  # used again: rebuilt from the blob store (b, closed now, makes room)
    np.testing.assert_array_equal(again.compositor.frames[0], a_frame)
    assert cached(root) == {c, a}


def test_open_avatars_keep_their_files_however_far_over_the_budget(
    blobs: FolderBlobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    avatars = [make_avatar(blobs, shade) for shade in (30, 120, 210)]
    cache = AvatarCache(blobs, root, max_open=8, max_bytes=FRAME_BYTES * 3 // 2)  # fits one
    with caplog.at_level(logging.WARNING, logger="services.jobs.avatar_cache"):
        got = [cache.get(aid) for aid, _ in avatars]
    assert cached(root) == {aid for aid, _ in avatars}  # all three open: none evicted
    assert sum(OVER_BUDGET in r.getMessage() for r in caplog.records) == 2  # for the second and the third
    for local, (_, frame) in zip(got, avatars, strict=True):
        np.testing.assert_array_equal(local.compositor.frames[0], frame)


def test_eviction_follows_last_use_not_the_age_of_the_file(blobs: FolderBlobStore, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    a, b, c, d = (make_avatar(blobs, shade)[0] for shade in (30, 90, 150, 210))
    cache = AvatarCache(blobs, root, max_open=1, max_bytes=FRAME_BYTES * 7 // 2)  # fits three
    for aid in (a, b, c, a, c):  # a's file is the oldest, b is the least recently used; c is open
        cache.get(aid)
    assert cached(root) == {a, b, c}
    cache.get(d)
    assert cached(root) == {a, c, d}


def test_an_avatar_larger_than_the_whole_budget_still_renders_with_a_warning(
    blobs: FolderBlobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    aid, frame = make_avatar(blobs, 77)
    cache = AvatarCache(blobs, root, max_bytes=FRAME_BYTES // 4)
    with caplog.at_level(logging.WARNING, logger="services.jobs.avatar_cache"):
        local = cache.get(aid)
    np.testing.assert_array_equal(local.compositor.frames[0], frame)
    assert cached(root) == {aid}
    warnings = [r for r in caplog.records if OVER_BUDGET in r.getMessage()]
    assert warnings and warnings[0].avatar_cache_bytes == FRAME_BYTES // 4 and warnings[0].bytes >= FRAME_BYTES
    assert cache.get(aid) is local  # and it stays open for the next segments


def make_musetalk_avatar(blobs: FolderBlobStore, tmp_path: Path) -> str:
    """A two-frame musetalk avatar (frame 1 has no face) saved as its CreateAvatar saves one."""
    frames = [photo(60), photo(90)]
    path = tmp_path / "two.mp4"
    from services.render.mp4 import Mp4Writer

    with Mp4Writer(path, WIDTH, HEIGHT, 25.0, None, 16_000, crf=10) as writer:
        for frame in frames:
            writer.write(frame)
    aid = new_avatar_id()
    box, square = (40, 20, 88, 76), (28, 12, 100, 84)
    meta = AvatarMeta(
        aid, "tier", 25.0, 0.0, 2, WIDTH, HEIGHT, [box, None], time.time(), model="musetalk", mask_boxes=[square, None]
    )
    latents, masks = tmp_path / "latents.npy", tmp_path / "masks.npy"
    np.save(latents, np.full((1, 8, 32, 32), 0.5, np.float16))
    mask = np.zeros((1, 256, 256), np.uint8)
    mask[0, 128:] = 255
    np.save(masks, mask)
    save_musetalk_avatar_files(blobs, meta, path.read_bytes(), latents, masks)
    return aid


def test_a_musetalk_avatar_is_cached_with_its_pack_memory_mapped_and_evicted_whole(
    blobs: FolderBlobStore, tmp_path: Path
) -> None:
    aid = make_musetalk_avatar(blobs, tmp_path)
    root = tmp_path / "cache"
    avatar = AvatarCache(blobs, root).get(aid)
    assert avatar.crops.shape == (0, 96, 96, 3) and avatar.crop_row == {0: 0}
    assert isinstance(avatar.latents, np.memmap) and avatar.latents.shape == (1, 8, 32, 32)
    assert avatar.compositor.alpha is not None
    names = sorted(p.name for p in (root / "avatars").iterdir())
    assert names == [f"{aid}.i420.npy", f"{aid}.latents.npy", f"{aid}.masks.npy"]
    # a 256x256 white face through the lower-half mask: the box's lower rows change, its upper rows do not
    frame = avatar.compositor.frame(0, np.full((256, 256, 3), 255, np.uint8))
    y = frame[:HEIGHT]
    assert y[60:72, 50:80].mean() > 200 and np.array_equal(y[20:40], avatar.compositor.frame(0, None)[20:40])
    # the budget counts the pack: another avatar's build evicts all three files
    other, _ = make_avatar(blobs, 30)
    small = AvatarCache(blobs, root, max_open=1, max_bytes=sum((root / "avatars" / n).stat().st_size for n in names))
    small.get(other)
    assert cached(root) == {other} and not list((root / "avatars").glob(f"{aid}.*"))
