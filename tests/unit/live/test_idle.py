"""The idle loop: the template's own frames, ping-pong, one mapping for speech and idle."""

from __future__ import annotations

import numpy as np
import pytest

from services.live.idle import IdleLoop
from services.media.composite import I420Frames
from services.media.timeline import LOOP_WRAP


def numbered_frames(count: int) -> I420Frames:
    """Frames whose every byte is the frame's number: which frame was shown is visible in its pixels."""
    return I420Frames(np.stack([np.full((12, 8), i, np.uint8) for i in range(count)]))


def test_idle_plays_the_template_forward_and_back() -> None:
    idle = IdleLoop(numbered_frames(4))
    shown = [int(idle.frame(k)[0, 0]) for k in range(14)]
    assert shown == [0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1]  # no cut where the loop turns
    assert [idle.template_frame(k) for k in range(14)] == shown


def test_idle_frames_are_the_cached_frames_themselves() -> None:
    frames = numbered_frames(3)
    idle = IdleLoop(frames)
    frame = idle.frame(4)
    assert np.shares_memory(frame, frames.data) and not frame.flags.writeable
    np.testing.assert_array_equal(frame, frames[0])


def test_a_photo_and_the_wrap_mode() -> None:
    assert [IdleLoop(numbered_frames(1)).template_frame(k) for k in range(3)] == [0, 0, 0]
    assert [IdleLoop(numbered_frames(3), LOOP_WRAP).template_frame(k) for k in range(5)] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="loop mode"):
        IdleLoop(numbered_frames(3), "bounce")
