"""Face boxes: upstream and steady smoothing, padding, gap handling, the Haar detector."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from services.lipsync.faces import (
    HaarFaceDetector,
    drop_outlier_boxes,
    pad_box,
    prepare_boxes,
    smooth_boxes,
    steady_boxes,
)

ROOT = Path(__file__).resolve().parents[3]
FACTS = json.loads((ROOT / "tests" / "data" / "reference" / "inference_facts.json").read_text())
AVATAR = ROOT / "samples" / "avatar.jpg"


@pytest.mark.parametrize("case", FACTS["box_smoothing"]["test_cases"], ids=lambda c: f"n{len(c['output'])}")
def test_smoothing_matches_upstream(case: dict) -> None:
    boxes = np.array(case["input_boxes_x1y1x2y2"], dtype=np.int64)
    before = boxes.copy()
    out = smooth_boxes(boxes, T=case["T"])
    assert out.dtype == np.int64
    assert out.tolist() == case["output"]
    assert np.array_equal(boxes, before)  # the caller's array is untouched


def test_pad_box() -> None:
    assert pad_box((10, 20, 50, 60), height=100, width=100) == (10, 20, 50, 70)
    assert pad_box((10, 20, 50, 95), height=100, width=100) == (10, 20, 50, 100)
    assert pad_box((3, 4, 97, 60), (5, 0, 5, 5), height=100, width=100) == (0, 0, 100, 60)


def test_prepare_boxes_keeps_gaps_and_smooths_runs() -> None:
    case = FACTS["box_smoothing"]["test_cases"][0]
    raw = [tuple(b) for b in case["input_boxes_x1y1x2y2"]]
    h, w = 1000, 1000
    out = prepare_boxes([None] + raw[:3] + [None, None] + raw[3:], h, w, pads=(0, 0, 0, 0))
    assert out[0] is None and out[4] is None and out[5] is None
    assert out[1:4] == [tuple(b) for b in steady_boxes(np.array(raw[:3]), h, w).tolist()]
    assert out[6:] == [tuple(b) for b in steady_boxes(np.array(raw[3:]), h, w).tolist()]
    assert all(isinstance(v, int) for b in out if b is not None for v in b)


def test_prepare_boxes_pads_before_smoothing_and_no_smooth() -> None:
    raw = [(10, 10, 50, 50), (12, 10, 52, 56)]
    assert prepare_boxes(raw, 55, 100, smooth=False) == [(10, 10, 50, 55), (12, 10, 52, 55)]
    # Padded: (10,10,50,60), (12,10,52,66); two boxes are too few to fit a window, so they stay as padded.
    assert prepare_boxes(raw, 100, 100) == [(10, 10, 50, 60), (12, 10, 52, 66)]
    assert prepare_boxes([None, None], 100, 100) == [None, None]


def _moving_track(kind: str, n: int = 250) -> np.ndarray:
    """True float boxes (x1, y1, x2, y2): a slow pan/zoom/sway, or a fast side-to-side head motion."""
    t = np.arange(n, dtype=np.float64)
    if kind == "slow":
        cx, cy, size = 300 + 0.02 * t, 200 + 1.5 * np.sin(2 * np.pi * t / n), 120 + 0.01 * t
    else:
        cx, cy, size = 300 + 30 * np.sin(2 * np.pi * t / 60), np.full(n, 200.0), np.full(n, 120.0)
    return np.stack([cx - size / 2, cy - size / 2, cx + size / 2, cy + 0.6 * size], axis=1)


def _centres(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    boxes = np.asarray(boxes, dtype=np.float64)
    return (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2


def _jitter(boxes: np.ndarray) -> float:
    """RMS of the box centre's second difference, px."""
    cx, cy = _centres(boxes)
    return float(np.sqrt(np.mean(np.concatenate([np.diff(cx, 2), np.diff(cy, 2)]) ** 2)))


def _detected(true: np.ndarray, seed: int = 0) -> np.ndarray:
    """The true track plus ~1 px of detector noise, as integer boxes."""
    return np.round(true + np.random.default_rng(seed).normal(0.0, 1.0, true.shape)).astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steady_boxes_remove_jitter(seed: int) -> None:
    true = _moving_track("slow")
    raw = _detected(true, seed)
    out = steady_boxes(raw, 720, 1280)
    assert out.dtype == np.int64 and out.shape == raw.shape
    assert _jitter(raw) > 1.0 and _jitter(smooth_boxes(raw)) > 0.35  # the detector and upstream's T=5 mean
    assert _jitter(out) < 0.3
    error = float(np.abs(out - true).mean())
    assert error < float(np.abs(raw - true).mean())
    assert error < 0.5


def test_steady_boxes_follow_motion_without_lag() -> None:
    true = _moving_track("fast")
    out = steady_boxes(_detected(true), 720, 1280)
    velocity, true_velocity = np.diff(_centres(out)[0]), np.diff(_centres(true)[0])
    lags = list(range(-5, 6))
    xcorr = [
        float(
            np.dot(
                velocity[max(0, k) : len(velocity) + min(0, k)],
                true_velocity[max(0, -k) : len(true_velocity) - max(0, k)],
            )
        )
        for k in lags
    ]
    assert lags[int(np.argmax(xcorr))] == 0
    assert float(np.abs(out - true).mean()) < 0.6  # follows a 30 px swing, not just its average


def test_steady_boxes_stay_in_frame_and_integer() -> None:
    raw = np.array([[0, 0, 50, 60], [-3, -2, 48, 61], [2, 1, 52, 64], [5, 3, 640, 482], [6, 4, 641, 485]])
    out = steady_boxes(raw, 480, 640)
    assert out.dtype == np.int64
    assert (out[:, 0] >= 0).all() and (out[:, 1] >= 0).all()
    assert (out[:, 2] <= 640).all() and (out[:, 3] <= 480).all()
    assert (out[:, 2] > out[:, 0]).all() and (out[:, 3] > out[:, 1]).all()
    assert steady_boxes(np.zeros((0, 4), dtype=np.int64), 10, 10).shape == (0, 4)
    assert steady_boxes(np.array([[1, 2, 30, 40]]), 100, 100).tolist() == [[1, 2, 30, 40]]


def test_haar_finds_face_in_photo() -> None:
    if not AVATAR.is_file():
        pytest.skip("samples/avatar.jpg missing (run scripts/make_samples.py)")
    photo = cv2.imread(str(AVATAR))
    # Also a larger frame than max_side, to exercise the downscale and box rescale.
    big = cv2.resize(photo, (photo.shape[1] * 2, photo.shape[0] * 2))
    small_box, big_box = HaarFaceDetector().detect([photo, big])
    assert small_box is not None and big_box is not None
    x1, y1, x2, y2 = small_box
    assert 0 <= x1 < x2 <= photo.shape[1] and 0 <= y1 < y2 <= photo.shape[0]
    assert (x2 - x1) >= 40 and (y2 - y1) > (x2 - x1)  # extended downward past the Haar square
    assert np.allclose(np.array(big_box) / 2, small_box, atol=8)


def test_haar_returns_none_without_face() -> None:
    grey = np.full((480, 640, 3), 128, dtype=np.uint8)
    assert HaarFaceDetector().detect([grey, grey]) == [None, None]
    assert HaarFaceDetector().detect([]) == []


def test_haar_detector_gives_each_thread_its_own_classifier() -> None:
    import threading

    import cv2

    from services.lipsync.faces import HaarFaceDetector

    detector = HaarFaceDetector()
    face = cv2.imread(str(__import__("pathlib").Path(__file__).resolve().parents[3] / "samples" / "avatar.jpg"))
    expected = detector.detect([face])
    seen: dict[int, object] = {}
    results: list[list] = []

    def run() -> None:
        results.append(detector.detect([face] * 3))
        seen[threading.get_ident()] = detector._classifier()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected * 3 for r in results)
    assert len({id(c) for c in seen.values()}) == 4  # one classifier per thread


def test_drop_outlier_boxes_drops_a_false_detection_and_follows_motion() -> None:
    moving = [(100 + 3 * i, 50, 200 + 3 * i, 160) for i in range(20)]
    assert drop_outlier_boxes(moving) == moving  # steady motion: nothing dropped
    boxes: list = list(moving)
    boxes[8] = (300, 120, 420, 260)  # the cascade found something else for one frame
    boxes[3] = None
    out = drop_outlier_boxes(boxes)
    assert out[8] is None and out[3] is None
    assert [b for i, b in enumerate(out) if i not in (3, 8)] == [b for i, b in enumerate(moving) if i not in (3, 8)]
    assert drop_outlier_boxes([boxes[8]]) == [boxes[8]]  # too few neighbours to judge: kept
    smoothed = prepare_boxes(boxes, 480, 640)
    assert smoothed[8] is None and abs(smoothed[9][0] - (moving[9][0])) <= 1  # no drag from the outlier
