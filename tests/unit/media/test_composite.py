"""services.media.composite: I420 compositing against a BGR reference path.

The reference is `paste_face`'s blend in BGR (services.render.reference), with the compositor's mask
(`blend_mask`: only the regenerated lower part of the box by default; the whole box, exactly
``to_yuv420(paste_face(bgr, face, box))``, with ``regenerated_from=0``), then ``to_yuv420``. Required:
bytes outside the pasted region expanded to even coordinates identical to ``to_yuv420(bgr)``;
inside, Y within 2 levels and U/V within 3. Measured with OpenCV 4.14 (top-left chroma siting) on
every case below: max |diff| Y = 1, U = 1, V = 1 (0 for the tiny unfeathered boxes).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import services.media.composite as composite
from services.media.composite import (
    Compositor,
    I420Frames,
    blend_mask,
    regenerated_start,
)
from services.media.probe import probe_media
from services.media.video_format import to_yuv420
from services.render.mp4 import Mp4Writer
from services.render.reference import paste_face

REPO_ROOT = Path(__file__).resolve().parents[3]
Y_TOL, UV_TOL = 2, 3


def _planes(frame: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = frame.reshape(-1)
    n = height * width
    return (
        flat[:n].reshape(height, width),
        flat[n : n + n // 4].reshape(height // 2, width // 2),
        flat[n + n // 4 :].reshape(height // 2, width // 2),
    )


def _reference(
    bgr: np.ndarray, face: np.ndarray, box: tuple[int, int, int, int], regenerated_from: float
) -> np.ndarray:
    """`paste_face` with the compositor's mask (the same arithmetic; equal to paste_face when regenerated_from=0)."""
    if regenerated_from == 0:
        return paste_face(bgr, face, box)
    x1, y1, x2, y2 = box
    mask = blend_mask(y2 - y1, x2 - x1, 0.15, regenerated_from)[:, :, None]
    region = bgr[y1:y2, x1:x2].astype(np.float32)
    out = bgr.copy()
    out[y1:y2, x1:x2] = (region + mask * (face.astype(np.float32) - region) + 0.5).astype(np.uint8)
    return out


def _maxdiff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) if a.size else 0


def _check(
    bgr: np.ndarray,
    box: tuple[int, int, int, int],
    face: np.ndarray,
    compositor: Compositor | None = None,
    index: int = 0,
) -> tuple[int, int, int]:
    """Compares Compositor.frame with the reference; asserts the outside is exact; returns the max diffs (Y, U, V)."""
    height, width = bgr.shape[:2]
    if compositor is None:
        compositor = Compositor(I420Frames.from_bgr(bgr[None]), [box])
    got = compositor.frame(index, face)
    ref = to_yuv420(_reference(bgr, face, box, compositor.regenerated_from))
    plain = to_yuv420(bgr)
    assert got.shape == (height * 3 // 2, width) and got.dtype == np.uint8 and got.flags.c_contiguous

    x1, y1, x2, y2 = box
    if compositor.regenerated_from > 0:
        y1 += regenerated_start(y2 - y1, compositor.regenerated_from)  # above: the template's bytes
    ex1, ey1, ex2, ey2 = x1 // 2 * 2, y1 // 2 * 2, (x2 + 1) // 2 * 2, (y2 + 1) // 2 * 2
    inside_y = np.zeros((height, width), bool)
    inside_y[ey1:ey2, ex1:ex2] = True
    inside_c = np.zeros((height // 2, width // 2), bool)
    inside_c[ey1 // 2 : ey2 // 2, ex1 // 2 : ex2 // 2] = True
    gy, gu, gv = _planes(got, height, width)
    py, pu, pv = _planes(plain, height, width)
    ry, ru, rv = _planes(ref, height, width)
    assert np.array_equal(gy[~inside_y], py[~inside_y])
    assert np.array_equal(gu[~inside_c], pu[~inside_c])
    assert np.array_equal(gv[~inside_c], pv[~inside_c])
    diffs = (_maxdiff(gy, ry), _maxdiff(gu, ru), _maxdiff(gv, rv))
    assert diffs[0] <= Y_TOL and diffs[1] <= UV_TOL and diffs[2] <= UV_TOL, (box, diffs)
    return diffs


@pytest.fixture(scope="module")
def avatar() -> np.ndarray:
    image = cv2.imread(str(REPO_ROOT / "samples" / "avatar.jpg"), cv2.IMREAD_COLOR)
    assert image is not None
    h, w = image.shape[:2]
    return np.ascontiguousarray(image[: h - h % 2, : w - w % 2])


@pytest.fixture(scope="module")
def random_frame() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (240, 320, 3), np.uint8)


def _boxes(width: int, height: int) -> list[tuple[int, int, int, int]]:
    cx, cy = width // 2, height // 2
    return [
        (cx - 100, cy - 110, cx + 100, cy + 110),  # even coordinates, even size
        (cx - 99, cy - 107, cx + 101, cy + 111),  # odd x1/y1, odd x2/y2 (even size)
        (cx - 99, cy - 100, cx + 100, cy + 111),  # odd width and height
        (0, 0, 151, 133),  # touching the top-left corner
        (width - 151, height - 133, width, height),  # touching the bottom-right corner
        (0, 31, width, 150),  # full width
        (0, 0, width, height),  # the whole frame
        (7, 9, 12, 14),  # tiny: no feathering (mask 1 over the box)
        (5, 5, 6, 6),  # 1 pixel
        (10, 11, 13, 200),  # thin and tall: feathered in y only
    ]


@pytest.mark.parametrize("case", range(10))
def test_random_face_matches_reference(random_frame: np.ndarray, case: int) -> None:
    height, width = random_frame.shape[:2]
    box = _boxes(width, height)[case]
    x1, y1, x2, y2 = box
    face = np.random.default_rng(case).integers(0, 256, (y2 - y1, x2 - x1, 3), np.uint8)
    _check(random_frame, box, face)


@pytest.mark.parametrize("case", range(10))
def test_whole_box_matches_paste_face(random_frame: np.ndarray, case: int) -> None:
    """regenerated_from=0: the whole box, as the gateway's to_yuv420(paste_face(...))."""
    height, width = random_frame.shape[:2]
    box = _boxes(width, height)[case]
    x1, y1, x2, y2 = box
    face = np.random.default_rng(case).integers(0, 256, (y2 - y1, x2 - x1, 3), np.uint8)
    _check(random_frame, box, face, Compositor(I420Frames.from_bgr(random_frame[None]), [box], regenerated_from=0))


@pytest.mark.parametrize("case", range(10))
def test_real_image_matches_reference(avatar: np.ndarray, case: int) -> None:
    height, width = avatar.shape[:2]
    box = _boxes(width, height)[case]
    x1, y1, x2, y2 = box
    # A plausible generated face: the template region shifted by a few pixels and blurred.
    shifted = np.roll(avatar, (7, -5), axis=(0, 1))[y1:y2, x1:x2]
    face = np.ascontiguousarray(cv2.GaussianBlur(shifted, (9, 9), 3))
    _check(avatar, box, face)


def test_non_contiguous_face(avatar: np.ndarray) -> None:
    box = (101, 81, 301, 333)
    face = np.ascontiguousarray(avatar[81:333, 101:301, ::-1])[:, :, ::-1]  # a negative-stride view
    assert not face.flags.c_contiguous
    _check(avatar, box, face)


def test_frame_into_strided_planes_equals_frame(avatar: np.ndarray) -> None:
    # What the render worker does: compose straight into the encoder's frame, whose rows are padded
    # (a plane's line size is wider than the picture). Stale bytes in the planes must not survive.
    bgr = np.stack([avatar, np.roll(avatar, 5, axis=0)])
    boxes = [(101, 81, 459, 479), None]
    compositor = Compositor(I420Frames.from_bgr(bgr), boxes)
    height, width = bgr.shape[1:3]
    y = np.full((height, width + 48), 7, np.uint8)[:, :width]
    u = np.full((height // 2, width // 2 + 24), 7, np.uint8)[:, : width // 2]
    v = np.full((height // 2, width // 2 + 24), 7, np.uint8)[:, : width // 2]
    face = np.random.default_rng(5).integers(0, 256, (479 - 81, 459 - 101, 3), np.uint8)
    for index, given in ((0, face), (1, None)):
        compositor.frame_into(index, given, (y, u, v))
        expected = compositor.frame(index, given)
        assert np.array_equal(np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]), expected.reshape(-1))


def test_several_frames_with_their_own_boxes(avatar: np.ndarray) -> None:
    rng = np.random.default_rng(3)
    bgr = np.stack([avatar, np.roll(avatar, 3, axis=1), cv2.GaussianBlur(avatar, (5, 5), 2)])
    boxes = [(100, 80, 460, 480), None, (131, 97, 450, 421)]
    compositor = Compositor(I420Frames.from_bgr(bgr), boxes)
    for index, box in enumerate(boxes):
        if box is None:
            assert np.array_equal(compositor.frame(index, None), to_yuv420(bgr[index]))
            continue
        x1, y1, x2, y2 = box
        _check(bgr[index], box, rng.integers(0, 256, (y2 - y1, x2 - x1, 3), np.uint8), compositor, index)


def test_i420_frames_from_bgr(random_frame: np.ndarray) -> None:
    bgr = np.stack([random_frame, random_frame[::-1].copy()])
    frames = I420Frames.from_bgr(bgr)
    assert (frames.count, frames.width, frames.height) == (2, 320, 240)
    assert frames.data.shape == (2, 360, 320) and not frames.data.flags.writeable
    for i in range(2):
        assert np.array_equal(frames[i], to_yuv420(bgr[i]))
    assert np.array_equal(I420Frames.from_bgr(list(bgr)).data, frames.data)  # a list of frames too


def test_i420_frames_reject_odd_sizes() -> None:
    with pytest.raises(ValueError):
        I420Frames.from_bgr(np.zeros((1, 11, 16, 3), np.uint8))
    with pytest.raises(ValueError):
        I420Frames.from_bgr(np.zeros((1, 12, 15, 3), np.uint8))
    with pytest.raises(ValueError):
        I420Frames(np.zeros((1, 10, 16), np.uint8))  # 10 rows is not height * 3 / 2


def test_face_of_wrong_size_raises(random_frame: np.ndarray) -> None:
    compositor = Compositor(I420Frames.from_bgr(random_frame[None]), [(10, 20, 110, 140)])
    with pytest.raises(ValueError):
        compositor.frame(0, np.zeros((120, 101, 3), np.uint8))
    with pytest.raises(ValueError):
        compositor.frame(0, np.zeros((119, 100, 3), np.uint8))
    with pytest.raises(ValueError):
        compositor.frame(0, np.zeros((120, 100), np.uint8))
    with pytest.raises(ValueError):
        compositor.frame(0, np.zeros((120, 100, 3), np.float32))
    compositor.frame(0, np.zeros((120, 100, 3), np.uint8))  # the right size works


def test_bad_boxes_and_indices(random_frame: np.ndarray) -> None:
    frames = I420Frames.from_bgr(random_frame[None])
    with pytest.raises(ValueError):
        Compositor(frames, [])  # one box per frame
    with pytest.raises(ValueError):
        Compositor(frames, [(0, 0, 321, 100)])  # outside
    with pytest.raises(ValueError):
        Compositor(frames, [(10, 10, 10, 20)])  # empty
    compositor = Compositor(frames, [None])
    with pytest.raises(ValueError):
        compositor.frame(0, np.zeros((10, 10, 3), np.uint8))  # a face for a frame without a box
    with pytest.raises(IndexError):
        compositor.frame(1, None)


def test_no_face_frames_equal_the_cache(random_frame: np.ndarray) -> None:
    frames = I420Frames.from_bgr(random_frame[None])
    compositor = Compositor(frames, [(10, 20, 110, 140)])
    copied = compositor.frame(0, None)
    assert np.array_equal(copied, frames[0]) and np.array_equal(copied, to_yuv420(random_frame))
    assert copied.flags.writeable and copied.flags.c_contiguous and not np.shares_memory(copied, frames.data)
    shared = compositor.frame(0, None, copy=False)
    assert np.array_equal(shared, frames[0]) and np.shares_memory(shared, frames.data)
    assert not shared.flags.writeable
    with pytest.raises(ValueError):
        shared[0, 0] = 1


def test_returned_frames_are_new_arrays(random_frame: np.ndarray) -> None:
    frames = I420Frames.from_bgr(random_frame[None])
    before = frames.data.copy()
    compositor = Compositor(frames, [(10, 20, 110, 140)])
    face = np.full((120, 100, 3), 200, np.uint8)
    first = compositor.frame(0, face)
    second = compositor.frame(0, face)
    assert first is not second and not np.shares_memory(first, second)
    assert not np.shares_memory(first, frames.data)
    expected = first.copy()
    first[:] = 0
    second[:] = 255
    assert np.array_equal(frames.data, before)
    assert np.array_equal(compositor.frame(0, face), expected)
    none_frame = compositor.frame(0, None)
    none_frame[:] = 0
    assert np.array_equal(frames.data, before)


def test_save_load_round_trip_with_mmap(tmp_path: Path, avatar: np.ndarray) -> None:
    bgr = np.stack([avatar, np.roll(avatar, 5, axis=0)])
    frames = I420Frames.from_bgr(bgr)
    path = frames.save(tmp_path / "avatar.i420")  # the name is kept as given (no .npy appended)
    assert path == tmp_path / "avatar.i420" and path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["avatar.i420"]  # no temporary left behind
    mapped = I420Frames.load(path)
    assert isinstance(mapped.data, np.memmap) and not mapped.data.flags.writeable
    assert (mapped.count, mapped.width, mapped.height) == (frames.count, frames.width, frames.height)
    assert np.array_equal(mapped.data, frames.data)
    loaded = I420Frames.load(path, mmap=False)
    assert not isinstance(loaded.data, np.memmap) and np.array_equal(loaded.data, frames.data)

    box = (101, 81, 460, 480)
    face = np.random.default_rng(0).integers(0, 256, (box[3] - box[1], box[2] - box[0], 3), np.uint8)
    from_memory = Compositor(frames, [box, None])
    from_map = Compositor(mapped, [box, None])
    out = from_map.frame(0, face)
    assert type(out) is np.ndarray and out.flags.writeable
    assert np.array_equal(out, from_memory.frame(0, face))
    assert np.array_equal(from_map.frame(1, None), to_yuv420(bgr[1]))
    _check(avatar, box, face, from_map, 0)


def test_average_chroma_siting_fallback(avatar: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenCV that averages 2x2 blocks gets an averaged mask; pasting the template's own pixels stays a no-op."""
    monkeypatch.setattr(composite, "chroma_siting", lambda: "average")
    box = (101, 81, 460, 480)
    compositor = Compositor(I420Frames.from_bgr(avatar[None]), [box])
    same = np.ascontiguousarray(avatar[81:480, 101:460])
    assert _maxdiff(compositor.frame(0, same), to_yuv420(avatar)) <= 1


def test_frames_feed_the_writer(tmp_path: Path, random_frame: np.ndarray) -> None:
    compositor = Compositor(I420Frames.from_bgr(random_frame[None]), [(31, 41, 190, 200)])
    face = np.full((159, 159, 3), 90, np.uint8)
    path = tmp_path / "out.mp4"
    with Mp4Writer(path, 320, 240, 25.0, None, 16000) as writer:
        for i in range(5):
            writer.write_yuv420(compositor.frame(0, face if i % 2 else None))
    info = probe_media(path)
    assert (info["frames"], info["width"], info["height"]) == (5, 320, 240)


def test_feather_mask_is_the_product_of_its_profiles() -> None:
    """The compositor builds its weights from feather_mask's 1-D profiles: this must stay true of feather_mask."""
    from services.media.composite import feather_mask

    for height, width in [(400, 360), (601, 519), (7, 5), (1, 1), (13, 200)]:
        ry, rx = composite._profiles(height, width, 0.15)
        assert np.allclose(np.multiply.outer(ry, rx), feather_mask(height, width)[:, :, 0], rtol=0, atol=1e-6)
        assert np.allclose(blend_mask(height, width, 0.15, 0), feather_mask(height, width)[:, :, 0], rtol=0, atol=1e-6)


def test_many_box_sizes_reuse_the_weight_slots(avatar: np.ndarray) -> None:
    """More geometries than a thread's weight slots, twice round: recycled buffers give the same frames."""
    boxes = [(101 + k % 2, 81 + k, 301 + 3 * k, 333 + 2 * k) for k in range(composite._SLOTS_PER_THREAD + 5)]
    boxes += [(40, 40, 240, 300)]  # smaller than all the others: reuses a bigger evicted buffer
    frames = I420Frames.from_bgr(avatar[None])
    rng = np.random.default_rng(5)
    faces = [rng.integers(0, 256, (b[3] - b[1], b[2] - b[0], 3), np.uint8) for b in boxes]
    first = [Compositor(frames, [b]).frame(0, f) for b, f in zip(boxes, faces)]
    for box, face, expected in zip(boxes, faces, first):
        assert np.array_equal(Compositor(frames, [box]).frame(0, face), expected)
        _check(avatar, box, face)


def test_threads_composite_concurrently(avatar: np.ndarray) -> None:
    from concurrent.futures import ThreadPoolExecutor

    boxes = [(101 + k, 81 + 2 * k, 301 + 5 * k, 333 + 3 * k) for k in range(12)]
    frames = I420Frames.from_bgr(avatar[None])
    rng = np.random.default_rng(9)
    faces = [rng.integers(0, 256, (b[3] - b[1], b[2] - b[0], 3), np.uint8) for b in boxes]
    compositors = [Compositor(frames, [b]) for b in boxes]
    expected = [c.frame(0, f) for c, f in zip(compositors, faces)]
    jobs = [k % len(boxes) for k in range(240)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: compositors[k].frame(0, faces[k]), jobs))
    for k, result in zip(jobs, results):
        assert np.array_equal(result, expected[k])


# --------------------------------------------------------------------------------------------------
# Alpha masks (the musetalk tier): upstream MuseTalk's get_image_blending, then to_yuv420
# --------------------------------------------------------------------------------------------------


def _musetalk_reference(
    bgr: np.ndarray,
    face256: np.ndarray,
    box: tuple[int, int, int, int],
    square: tuple[int, int, int, int],
    mask256: np.ndarray,
    weight: float,
) -> np.ndarray:
    """Upstream's blend in BGR: the face resized to the box pasted into a copy of the 1.5x square, the
    mask resized over the square, `cv2.blendLinear` there (pixels of the square outside the frame are
    not pasted); the mask scaled by `weight`."""
    x1, y1, x2, y2 = box
    sx1, sy1, sx2, sy2 = square
    face = cv2.resize(face256, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)
    mask = cv2.resize(mask256, (sx2 - sx1, sy2 - sy1), interpolation=cv2.INTER_LINEAR) * np.float32(weight / 255.0)
    h, w = bgr.shape[:2]
    fx1, fy1, fx2, fy2 = max(0, sx1), max(0, sy1), min(w, sx2), min(h, sy2)
    body = bgr[fy1:fy2, fx1:fx2].copy()
    large = body.copy()
    large[y1 - fy1 : y2 - fy1, x1 - fx1 : x2 - fx1] = face
    m = np.ascontiguousarray(mask[fy1 - sy1 : fy2 - sy1, fx1 - sx1 : fx2 - sx1])
    out = bgr.copy()
    out[fy1:fy2, fx1:fx2] = cv2.blendLinear(large, body, m, 1.0 - m)
    return out


@pytest.mark.parametrize("box", [(100, 60, 230, 220), (31, 41, 190, 200), (0, 3, 161, 203)])
@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_an_alpha_mask_blends_as_upstream_and_keeps_the_upper_face(
    random_frame: np.ndarray, box: tuple[int, int, int, int], weight: float
) -> None:
    from services.lipsync.musetalk.masks import ellipse_mask, finish_mask, mask_box

    rng = np.random.default_rng(5)
    square = mask_box(box)
    alpha = finish_mask(ellipse_mask(box, square), box, square)  # the stand-in's mask, full size
    mask256 = cv2.resize(alpha, (256, 256), interpolation=cv2.INTER_AREA)  # as the pack stores it
    face = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    compositor = Compositor(
        I420Frames.from_bgr(random_frame[None]), [box], alpha=composite.AlphaMasks(mask256[None], [square], {0: 0})
    )
    got = compositor.frame(0, face, weight=weight)
    ref = to_yuv420(_musetalk_reference(random_frame, face, box, square, mask256, weight))
    plain = to_yuv420(random_frame)
    height, width = random_frame.shape[:2]
    for g, r, p, tol in zip(
        _planes(got, height, width), _planes(ref, height, width), _planes(plain, height, width), (Y_TOL, UV_TOL, UV_TOL)
    ):
        assert _maxdiff(g, r) <= tol
    # Above the mask's first row in the box (the square's middle row, less the blur): the template's bytes.
    x1, y1, x2, y2 = box
    got_y, plain_y = _planes(got, height, width)[0], _planes(plain, height, width)[0]
    mid = (square[1] + square[3]) // 2 - int(0.1 * (square[2] - square[0]) // 2 * 2)
    assert np.array_equal(got_y[: max(y1, mid) - 1], plain_y[: max(y1, mid) - 1])
    assert _maxdiff(got_y[y1:y2, x1:x2], plain_y[y1:y2, x1:x2]) > 50  # the face is pasted


def test_an_alpha_mask_weighted_zero_passes_the_frame_and_a_face_needs_its_mask(random_frame: np.ndarray) -> None:
    box = (100, 60, 230, 220)
    square = (45, 20, 285, 260)
    mask = np.full((1, 256, 256), 255, np.uint8)
    frames = I420Frames.from_bgr(random_frame[None])
    compositor = Compositor(frames, [box], alpha=composite.AlphaMasks(mask, [square], {0: 0}))
    face = np.zeros((256, 256, 3), np.uint8)
    assert np.array_equal(compositor.frame(0, face, weight=0.0), frames[0])
    with pytest.raises(ValueError, match="no alpha mask"):
        Compositor(frames, [box], alpha=composite.AlphaMasks(mask, [square], {})).frame(0, face)
    with pytest.raises(ValueError, match="weight"):
        compositor.frame(0, face, weight=1.5)
