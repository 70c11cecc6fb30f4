"""The idle loop of a live session: with no speech queued, the template's own frames play, ping-pong.

Why it needs no GPU and no per-frame work beyond the encode: an idle frame is the avatar's cached I420
frame itself (`services.media.composite.I420Frames`, converted once per worker), mouth as recorded.
Why one mapping for speech and idle alike: a session's frame k always shows template frame
``loop_frame(k)`` (`services.media.timeline`, the render jobs' loop policy: forward and back, so the
loop turns without a cut); speech frames paste the generated mouth onto that same frame. So going
from speech to idle and back never jumps in the template: the head keeps moving as recorded, only
the mouth changes.
"""

from __future__ import annotations

import numpy as np

from services.media.composite import I420Frames
from services.media.timeline import LOOP_MODES, LOOP_PING_PONG, loop_frame


class IdleLoop:
    """Which template frame a session frame shows, and the idle frame itself.

    Args:
        frames: the avatar's frames in I420 (read-only, shared by every session of the avatar).
        loop: `LOOP_PING_PONG` (default) or `LOOP_WRAP`, as the render jobs' option.
    """

    def __init__(self, frames: I420Frames, loop: str = LOOP_PING_PONG) -> None:
        if loop not in LOOP_MODES:
            raise ValueError(f"unknown loop mode {loop!r}; one of {', '.join(LOOP_MODES)}")
        if frames.count < 1:
            raise ValueError("an avatar has at least one frame")
        self.frames = frames
        self.loop = loop

    def template_frame(self, session_frame: int) -> int:
        """The template frame session frame ``session_frame`` shows (speech or idle)."""
        return loop_frame(session_frame, self.frames.count, self.loop)

    def frame(self, session_frame: int) -> np.ndarray:
        """The idle frame: the template's own I420 frame, a read-only view (no copy, nothing computed)."""
        return self.frames[self.template_frame(session_frame)]
