"""DetectFaces over a stream (`FaceStream`) answers what the whole-clip `visible_boxes` answers, holding a window.

Real clips made from the sample face with the real Haar detector: a panning face (no frame covered),
the same with a hand over the mouth (the mouth check's second pass, which needs frames sent again),
gaps without a face, and a photo.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.lipsync.detect_stream import SETTLE_EVERY, SETTLE_LAG, FaceStream
from services.lipsync.faces import DEFAULT_PADS, HaarFaceDetector, prepare_boxes
from services.lipsync.occlusion import OcclusionConfig, visible_boxes
from tests.helpers.occluders import panning_clip

CHUNK = 8


@pytest.fixture(scope="module")
def detector() -> HaarFaceDetector:
    return HaarFaceDetector()


def streamed(
    detector: HaarFaceDetector, frames: list[np.ndarray], config: OcclusionConfig = OcclusionConfig()
) -> tuple[list, np.ndarray, bool, int]:
    stream = FaceStream(detector.detect, DEFAULT_PADS, True, config)
    most = 0
    for start in range(0, len(frames), CHUNK):
        stream.add(frames[start : start + CHUNK])
        most = max(most, stream.held_frames)
    again = stream.end()
    if again:
        for start in range(0, len(frames), CHUNK):
            stream.add_again(frames[start : start + CHUNK])
        stream.end_again()
    assert stream.result is not None
    return stream.result[0], stream.result[1], again, most


@pytest.mark.parametrize(
    ("count", "covered", "blank"),
    [
        (60, range(0), range(0)),
        (60, range(25, 32), range(0)),
        (64, range(20, 26), range(44, 48)),
        (1, range(0), range(0)),
        (20, range(0), range(5, 7)),
    ],
    ids=["panning", "hand", "hand-and-gap", "photo", "short-with-gap"],
)
def test_stream_answers_what_the_whole_clip_answers(
    detector: HaarFaceDetector, count: int, covered: range, blank: range
) -> None:
    frames = panning_clip(count, covered, left=60, blank=blank)
    expected_boxes, expected_covered = visible_boxes(frames, detector.detect(frames))
    boxes, flags, again, most = streamed(detector, frames)
    assert boxes == expected_boxes
    np.testing.assert_array_equal(flags, expected_covered)
    assert most <= SETTLE_LAG + SETTLE_EVERY + CHUNK  # a window, whatever the clip's length
    if covered:
        assert expected_covered.any() and again  # the second check read frames at other boxes


def test_settled_boxes_do_not_change_with_later_frames() -> None:
    # What FaceStream relies on: prepare_boxes of a prefix equals the whole track's more than
    # SETTLE_LAG frames before the prefix's end (random tracks with gaps and outliers).
    rng = random.Random(7)
    for _ in range(20):  # every prefix of 20 tracks: ~1,000 calls (60 took 108 s on a loaded 2-core machine)
        n = rng.randint(1, 100)
        raw: list = []
        x = 100.0
        for _ in range(n):
            r = rng.random()
            x += rng.gauss(0, 1.5)
            if r < 0.08:
                raw.append(None)
            elif r < 0.12:
                raw.append((int(x) + 80, 50, int(x) + 200, 190))  # a false positive
            else:
                raw.append((int(x), 50 + rng.randint(-2, 2), int(x) + 120 + rng.randint(-2, 2), 190))
        full = prepare_boxes(raw, 480, 640)
        for m in range(1, n):
            part = prepare_boxes(raw[:m], 480, 640)
            assert part[: max(0, m - SETTLE_LAG)] == full[: max(0, m - SETTLE_LAG)], (raw, m)
