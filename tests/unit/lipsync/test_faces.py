"""Face boxes: upstream smoothing and padding, gap handling, the Haar detector."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from services.lipsync.faces import HaarFaceDetector, pad_box, prepare_boxes, smooth_boxes

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
    assert out[1:4] == [tuple(b) for b in smooth_boxes(np.array(raw[:3])).tolist()]
    assert out[6:] == [tuple(b) for b in smooth_boxes(np.array(raw[3:])).tolist()]
    assert all(isinstance(v, int) for b in out if b is not None for v in b)


def test_prepare_boxes_pads_before_smoothing_and_no_smooth() -> None:
    raw = [(10, 10, 50, 50), (12, 10, 52, 56)]
    assert prepare_boxes(raw, 55, 100, smooth=False) == [(10, 10, 50, 55), (12, 10, 52, 55)]
    # Padded: (10,10,50,60), (12,10,52,66). N=2 < T: every window is all rows, and row 1 is
    # averaged with the already-smoothed row 0 (in-place quirk), then truncated.
    assert prepare_boxes(raw, 100, 100) == [(11, 10, 51, 63), (11, 10, 51, 64)]
    assert prepare_boxes([None, None], 100, 100) == [None, None]


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
