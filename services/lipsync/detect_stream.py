"""DetectFaces over a stream of frames, holding a window of frames instead of the whole avatar.

`visible_boxes` (the whole-clip function) needs every frame because the mouth check compares each
frame's lower face with the avatar's usual one. What it reads of a frame, though, is only
`lower_face_features` at the frame's box (~9 KB), and a frame's first-pass box (`prepare_boxes`:
outlier drop over 7 frames, a 21-frame centred fit, rounding that runs forward) is final once
`SETTLE_LAG` more frames are detected. So a frame is kept only until its box settles; then its
features are kept and the frame is dropped. At the end the same steps as `visible_boxes` run on the
features, with one exception: when the first check flags frames, the second check judges some frames
at other boxes, and those need the pixels again. The stream then asks its client to send the frames
once more (`needs_frames_again`); the client (the gateway) decodes its upload again, which costs a
decode instead of holding the avatar. The answers are identical to `visible_boxes` on the same
frames (tests/unit/lipsync/test_detect_stream.py checks both passes on real clips).

Memory: at most ``SETTLE_LAG + SETTLE_EVERY`` frames plus what one request message carries, and
~9 KB per frame with a face.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from services.lipsync.faces import prepare_boxes
from services.lipsync.occlusion import (
    OcclusionConfig,
    covered_from_features,
    final_boxes,
    lower_face_features,
    second_pass_boxes,
)
from services.media.crops import Box

__all__ = ["SETTLE_EVERY", "SETTLE_LAG", "FaceStream"]

#: Frames detected after a frame before its `prepare_boxes` box is final: the outlier check reads 3
#: frames on each side, the fit 10 (and, near a run's start, the run's first 21 frames), so a box
#: depends on at most 23 frames after it. tests/unit/lipsync/test_detect_stream.py checks it on
#: random tracks with gaps and outliers.
SETTLE_LAG = 24
#: Settle boxes every this many frames: each settling recomputes `prepare_boxes` over the raw boxes
#: so far (~0.04 ms per frame), so settling at every message would cost O(N^2) for long avatars.
SETTLE_EVERY = 16

Detect = Callable[[Sequence[np.ndarray]], list[Box | None]]


class FaceStream:
    """One DetectFaces stream's state: raw detections, settled features, and the frames not settled yet.

    Not thread-safe; the service calls it from one worker thread at a time, in stream order.
    """

    def __init__(self, detect: Detect, pads: Sequence[int], smooth: bool, config: OcclusionConfig) -> None:
        self._detect = detect
        self._pads = tuple(pads)
        self._smooth = smooth
        self._config = config
        self.raw: list[Box | None] = []
        self._features: list[np.ndarray | None] = []  # per settled frame, at its first-pass box
        self._pending: deque[np.ndarray] = deque()  # frames detected but not settled, in order
        self._shape: tuple[int, ...] | None = None
        self._boxes: list[Box | None] = []  # first-pass boxes, once the frames ended
        self._second: list[Box | None] = []
        self._again: dict[int, np.ndarray | None] = {}  # frame -> features at its second-pass box
        self._seen_again = 0
        self.result: tuple[list[Box | None], np.ndarray] | None = None

    @property
    def frame_count(self) -> int:
        return len(self.raw)

    @property
    def held_frames(self) -> int:
        """Frames held right now (what bounds the stream's memory)."""
        return len(self._pending)

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the frames (all the same: the service checks)."""
        assert self._shape is not None
        return self._shape[0], self._shape[1]

    def add(self, frames: Sequence[np.ndarray]) -> None:
        """Detects faces in the next frames (same size as the first) and settles what it can."""
        if not frames:
            return
        if self._shape is None:
            self._shape = frames[0].shape
        self.raw.extend(self._detect(frames))
        self._pending.extend(frames)
        if len(self._pending) >= SETTLE_LAG + SETTLE_EVERY:
            self._settle(len(self.raw) - SETTLE_LAG)

    def _settle(self, upto: int) -> None:
        """Keeps the features of frames [settled, upto) at their (final) first-pass boxes and drops them."""
        if upto <= len(self._features):
            return
        height, width = self.size
        boxes = prepare_boxes(self.raw, height, width, self._pads, self._smooth)
        while len(self._features) < upto:
            frame = self._pending.popleft()
            box = boxes[len(self._features)]
            self._features.append(None if box is None else lower_face_features(frame, box))

    def end(self) -> bool:
        """The frames have ended: computes the answer, or returns True when the frames are needed again."""
        self._settle(len(self.raw))
        height, width = self.size
        boxes = prepare_boxes(self.raw, height, width, self._pads, self._smooth)
        self._boxes = boxes
        covered = covered_from_features(self._features, self._config)
        if not covered.any():
            self.result = (boxes, covered)
            return False
        self._second = second_pass_boxes(self.raw, boxes, covered, height, width, self._pads, self._smooth)
        # Only the frames judged at another box than the first pass's need their pixels again.
        self._again = {i: None for i, (b, k) in enumerate(zip(boxes, self._second)) if k is not None and k != b}
        if not self._again:
            self._finish()
            return False
        return True

    @property
    def needs_frames_again(self) -> bool:
        return self.result is None and bool(self._again)

    def add_again(self, frames: Sequence[np.ndarray]) -> None:
        """The next frames of the second sending (the same frames, in the same order)."""
        for frame in frames:
            i = self._seen_again
            if i >= len(self.raw):
                raise ValueError(f"the frames were sent again with more than the {len(self.raw)} of the first sending")
            if frame.shape != self._shape:
                raise ValueError(
                    f"frame {i} sent again is {frame.shape[1]}x{frame.shape[0]}, the first sending's was {self.size[1]}x{self.size[0]}"
                )
            if i in self._again:
                box = self._second[i]
                assert box is not None
                self._again[i] = lower_face_features(frame, box)
            self._seen_again += 1

    def end_again(self) -> None:
        """The second sending has ended: computes the answer."""
        if self._seen_again != len(self.raw):
            raise ValueError(f"{self._seen_again} frames were sent again, the first sending had {len(self.raw)}")
        self._finish()

    def _finish(self) -> None:
        features = [
            self._again[i] if i in self._again else f if self._second[i] is not None else None
            for i, f in enumerate(self._features)
        ]
        covered = covered_from_features(features, self._config)  # None exactly where a box is
        height, width = self.size
        self.result = final_boxes(self.raw, self._boxes, covered, height, width, self._pads, self._smooth)
        self._again = {}
