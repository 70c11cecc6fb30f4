"""The frames of an avatar streamed to a lipsync stage (DetectFaces, PrepareAvatar), checked as they come.

Both stages take an avatar as `IndexedFrame` messages and answer per frame, so both need the same
edge: frames numbered 0, 1, 2... in the order sent (an answer names its frame by that number), all of
one size (one avatar), and at most the stage's limit per stream; anything else is INVALID_ARGUMENT or
RESOURCE_EXHAUSTED naming it, for that stream only.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from lipline.v1 import lipsync_pb2
from services.media.wire import image_from_proto
from services.serving.errors import InvalidRequest, TooLarge

__all__ = ["FrameSequence"]


class FrameSequence:
    """One stream's frames: `take` decodes and checks a message's, in order."""

    def __init__(self, rpc: str, limit: int) -> None:
        self.rpc, self.limit = rpc, limit
        self.position = 0  # the next frame's expected index
        self.shape: tuple[int, ...] | None = None  # the first frame's

    def take(self, items: Iterable[lipsync_pb2.IndexedFrame], limited: bool = True) -> list[np.ndarray]:
        """The decoded frames of one message; `limited` False for frames sent again (DetectFaces'
        second sending), which the limit already counted."""
        frames = []
        for item in items:
            if item.index != self.position:
                raise InvalidRequest(
                    f"frame index {item.index} where {self.position} was expected: frames are numbered 0, 1, 2... in the order sent"
                )
            if limited and self.position >= self.limit:
                raise TooLarge(f"more than {self.limit} frames in one {self.rpc} stream")
            frame = image_from_proto(item.image, f"frame {item.index}")
            self.shape = self.shape or frame.shape
            if frame.shape != self.shape:
                raise InvalidRequest(
                    f"all frames of one stream must have the same size, got {sorted({frame.shape, self.shape})}"
                )
            frames.append(frame)
            self.position += 1
        return frames

    def restart(self) -> None:
        """Number the frames from 0 again (the same frames sent a second time)."""
        self.position = 0
