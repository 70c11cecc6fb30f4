"""Face boxes for Wav2Lip: detection, padding and jitter-free smoothing.

Upstream Wav2Lip runs S3FD on every frame, pads each box ([0, 10, 0, 0] = top, bottom, left, right),
then smooths the boxes over a 5-frame window (see tests/data/reference/inference_facts.json). The
detector is behind a small protocol so an S3FD/other implementation can replace the bundled OpenCV
Haar cascade without touching the rest of the pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import cv2
import numpy as np

from services.media.crops import Box  # (x1, y1, x2, y2), x2/y2 exclusive; re-exported

__all__ = [
    "Box",
    "FaceDetector",
    "HaarFaceDetector",
    "DEFAULT_PADS",
    "pad_box",
    "smooth_boxes",
    "steady_boxes",
    "drop_outlier_boxes",
    "prepare_boxes",
]


DEFAULT_PADS: tuple[int, int, int, int] = (0, 10, 0, 0)  # top, bottom, left, right (upstream --pads)
SMOOTH_T = 5  # upstream get_smoothened_boxes window
# `steady_boxes`: a centred local quadratic fit (Savitzky-Golay) over 2 * STEADY_HALF + 1 frames (0.84 s
# at 25 fps) of each box coordinate, then integer rounding with hysteresis: a coordinate moves to a new
# integer only once the smooth track is more than 0.5 + STEADY_HYSTERESIS px away from the current one,
# so the residual sub-pixel noise does not flip the box back and forth between two integers.
STEADY_HALF = 10
STEADY_ORDER = 2
STEADY_HYSTERESIS = 0.25

# The Haar frontal-face box is tighter than S3FD's: it is roughly square, starts mid-forehead and
# ends around the lower lip, cutting off the chin. Wav2Lip was trained on S3FD crops (which include
# the chin) and regenerates the lower half of the crop, so the chin must be inside the box. These
# factors (fractions of the Haar box size) make the box resemble an S3FD box; the +10 px bottom pad
# of `pad_box` is applied afterwards, as upstream does on top of S3FD.
HAAR_EXTEND_TOP = 0.0
HAAR_EXTEND_BOTTOM = 0.10
HAAR_EXTEND_SIDES = 0.0
# `drop_outlier_boxes`: a box whose centre or size is further than OUTLIER_FRACTION of the local box size
# from the median of its 2 * OUTLIER_HALF + 1 neighbours (detected frames only) is a detector error (a
# false positive on a hand or a microphone for a frame or two); it is dropped rather than smoothed into
# the 2 * STEADY_HALF frames around it. The centred median follows steady motion exactly.
OUTLIER_HALF = 3
OUTLIER_FRACTION = 0.3
# A detection counts as a face candidate when it has at least this fraction of the best one's votes.
STRONG_VOTE_FRACTION = 0.5


class FaceDetector(Protocol):
    """Finds one face per frame."""

    def detect(self, frames: Sequence[np.ndarray]) -> list[Box | None]:
        """One box per BGR uint8 frame (None where no face was found)."""
        ...


class HaarFaceDetector:
    """OpenCV Haar cascade face detector: CPU-only, no weights to download, good for frontal faces.

    Thread-safe: a CascadeClassifier is not, so each thread that calls `detect` gets its own (the
    lipsync service runs concurrent DetectFaces calls on a thread pool).
    """

    def __init__(
        self, max_side: int = 640, scale_factor: float = 1.1, min_neighbors: int = 5, min_size_frac: float = 0.08
    ) -> None:
        """
        Args:
            max_side: frames are downscaled so their longest side is at most this (speed; faces in
                talking-head video are large, so nothing is lost).
            scale_factor, min_neighbors: `detectMultiScale` parameters.
            min_size_frac: smallest face to accept, as a fraction of the (downscaled) shorter side;
                rejects small false positives in the background.
        """
        self._path = cv2.data.haarcascades + "haarcascade_frontalface_default.xml"  # type: ignore[attr-defined]  # cv2.data is missing from OpenCV's stubs
        self._local = threading.local()
        self._classifier()  # fail at start-up, not at the first request
        self.max_side = max_side
        self.scale_factor = scale_factor
        self.min_neighbors = min_neighbors
        self.min_size_frac = min_size_frac

    def _classifier(self) -> cv2.CascadeClassifier:
        cascade = getattr(self._local, "cascade", None)
        if cascade is None:
            cascade = cv2.CascadeClassifier(self._path)
            if cascade.empty():
                raise RuntimeError(f"could not load Haar cascade {self._path}")
            self._local.cascade = cascade
        return cascade

    def detect(self, frames: Sequence[np.ndarray]) -> list[Box | None]:
        return [self._detect_one(frame) for frame in frames]

    def _detect_one(self, frame: np.ndarray) -> Box | None:
        height, width = frame.shape[:2]
        gray = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY) if frame.ndim == 3 else frame
        scale = min(1.0, self.max_side / max(height, width))
        if scale < 1.0:
            gray = cv2.resize(gray, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
        # Equalising makes the cascade robust to dim or low-contrast footage.
        gray = cv2.equalizeHist(gray)
        min_side = max(24, int(self.min_size_frac * min(gray.shape[:2])))
        found, votes = self._classifier().detectMultiScale2(
            gray, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors, minSize=(min_side, min_side)
        )
        if len(found) == 0:
            return None
        # The speaker is the largest face (upstream likewise keeps one face per frame), but only
        # among confident detections: Haar false positives are often large with few votes (a real
        # face typically gets 30+ merged neighbours, clutter single digits).
        strong = [r for r, v in zip(found, votes) if v >= STRONG_VOTE_FRACTION * max(votes)]
        x, y, w, h = (float(v) / scale for v in max(strong, key=lambda r: int(r[2]) * int(r[3])))
        x1 = x - HAAR_EXTEND_SIDES * w
        x2 = x + w + HAAR_EXTEND_SIDES * w
        y1 = y - HAAR_EXTEND_TOP * h
        y2 = y + h + HAAR_EXTEND_BOTTOM * h
        box = (max(0, int(x1)), max(0, int(y1)), min(width, int(x2)), min(height, int(y2)))
        return box if box[2] > box[0] and box[3] > box[1] else None


def pad_box(box: Box, pads: Sequence[int] = DEFAULT_PADS, *, height: int, width: int) -> Box:
    """Upstream padding: pads are (top, bottom, left, right); the result is clamped to the frame."""
    top, bottom, left, right = pads
    x1, y1, x2, y2 = box
    return (max(0, x1 - left), max(0, y1 - top), min(width, x2 + right), min(height, y2 + bottom))


def smooth_boxes(boxes: np.ndarray, T: int = SMOOTH_T) -> np.ndarray:
    """Upstream `get_smoothened_boxes`, quirks included, on a copy of `boxes` ((N, 4) int64).

    Sequential and in place on the copy, so later windows see already-smoothed rows; the float
    mean is truncated by the int64 assignment; near the end (and for N < T, through the negative
    slice start) the window is `boxes[N - T:]`.
    """
    out = np.array(boxes, dtype=np.int64, copy=True)
    n = len(out)
    for i in range(n):
        window = out[n - T :] if i + T > n else out[i : i + T]
        out[i] = np.mean(window, axis=0)
    return out


def _local_poly(x: np.ndarray, half: int, order: int) -> np.ndarray:
    """Centred least-squares polynomial fit of `order` over 2*half+1 samples, evaluated at each sample.

    Symmetric weights, so no lag; near the ends the first/last full window's fit is evaluated at the
    edge samples (like scipy's savgol_filter mode="interp"). Short runs shrink the window.
    """
    n = len(x)
    h = min(half, (n - 1) // 2)
    if h < 1:
        return x.astype(np.float64, copy=True)
    w = 2 * h + 1
    p = min(order, w - 1)
    t = np.arange(-h, h + 1, dtype=np.float64)
    coef = np.linalg.pinv(np.vander(t, p + 1, increasing=True))  # (p+1, w): samples -> polynomial
    out = np.empty(n, dtype=np.float64)
    out[h : n - h] = np.convolve(x, coef[0][::-1], mode="valid")
    for idx, start in ((np.arange(h), 0), (np.arange(n - h, n), n - w)):
        c = coef @ x[start : start + w]
        tt = (idx - start - h).astype(np.float64)
        out[idx] = np.polyval(c[::-1], tt)
    return out


def _hysteresis_round(x: np.ndarray, margin: float) -> np.ndarray:
    """Integers that follow `x` but move only once it is more than 0.5 + margin away, and then by the
    fewest whole pixels that bring it back within that band. Jumping to round(x) instead makes a
    track on a half-pixel offset alternate steps of 2 and 0 (a 1 px/frame pan gave 0.72 px RMS
    of second differences); whole-pixel catch-up steps by 1 every frame."""
    band = 0.5 + margin
    out = np.empty(len(x), dtype=np.int64)
    current = int(np.round(x[0])) if len(x) else 0
    for i, v in enumerate(x):
        excess = abs(v - current) - band
        if excess > 0:
            current += int(np.sign(v - current)) * int(np.ceil(excess))
        out[i] = current
    return out


def steady_boxes(
    boxes: np.ndarray,
    height: int,
    width: int,
    half: int = STEADY_HALF,
    order: int = STEADY_ORDER,
    hysteresis: float = STEADY_HYSTERESIS,
) -> np.ndarray:
    """Detector jitter removed without lag: (N, 4) int boxes -> (N, 4) int64 boxes inside the frame.

    The whole run of boxes is known when an avatar is created, so the fit is centred (non-causal):
    real head motion is followed without delay while ~1 px detector noise is averaged out. Each
    coordinate is smoothed, rounded with hysteresis, then clamped to the frame (x2 > x1, y2 > y1).
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(b) == 0:
        return np.zeros((0, 4), dtype=np.int64)
    out = np.stack([_hysteresis_round(_local_poly(b[:, k], half, order), hysteresis) for k in range(4)], axis=1)
    out[:, 0] = np.clip(out[:, 0], 0, width - 1)
    out[:, 1] = np.clip(out[:, 1], 0, height - 1)
    out[:, 2] = np.clip(np.maximum(out[:, 2], out[:, 0] + 1), 1, width)
    out[:, 3] = np.clip(np.maximum(out[:, 3], out[:, 1] + 1), 1, height)
    return out


def drop_outlier_boxes(
    boxes: Sequence[Box | None], half: int = OUTLIER_HALF, fraction: float = OUTLIER_FRACTION
) -> list[Box | None]:
    """`boxes` with the isolated detector errors set to None (see OUTLIER_FRACTION).

    Judged against the detected boxes among the `half` frames on each side; with fewer than
    `half` + 1 of them (short runs, photos) nothing is dropped.
    """
    out = list(boxes)
    for i, box in enumerate(boxes):
        if box is None:
            continue
        near = [b for b in boxes[max(0, i - half) : i + half + 1] if b is not None]
        if len(near) < half + 1:
            continue
        b = np.array(near, dtype=np.float64)
        centre = np.median((b[:, :2] + b[:, 2:]) / 2, axis=0)
        size = np.median(b[:, 2:] - b[:, :2], axis=0)
        own = np.array(box, dtype=np.float64)
        tolerance = fraction * float(size.mean())
        if (
            np.abs((own[:2] + own[2:]) / 2 - centre).max() > tolerance
            or np.abs((own[2:] - own[:2]) - size).max() > tolerance
        ):
            out[i] = None
    return out


def prepare_boxes(
    raw: Sequence[Box | None], height: int, width: int, pads: Sequence[int] = DEFAULT_PADS, smooth: bool = True
) -> list[Box | None]:
    """Pad every detected box, then smooth within each contiguous run of frames that have a face.

    The smoothing is `steady_boxes` (centred local polynomial fit, no lag), not upstream's 5-frame
    running mean (`smooth_boxes`, kept for reference), which leaves ~1 px of detector jitter.

    Deviation from upstream, which raises on the first frame without a face: such frames stay None
    (the caller passes them through unchanged) so one bad frame never fails a whole job, and the
    smoothing never averages across a gap, where the face may have moved. Before smoothing, isolated
    detector errors are dropped (`drop_outlier_boxes`), so one wrong box does not drag its neighbours.
    """
    padded = [None if b is None else pad_box(b, pads, height=height, width=width) for b in raw]
    if not smooth:
        return padded
    padded = drop_outlier_boxes(padded)
    out: list[Box | None] = list(padded)
    i = 0
    while i < len(padded):
        if padded[i] is None:
            i += 1
            continue
        j = i
        while j < len(padded) and padded[j] is not None:
            j += 1
        run = steady_boxes(np.array(padded[i:j], dtype=np.int64), height, width)
        out[i:j] = [(int(x1), int(y1), int(x2), int(y2)) for x1, y1, x2, y2 in run]
        i = j
    return out
