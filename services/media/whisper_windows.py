"""Which whisper encoder positions drive which video frame: upstream MuseTalk's rule for a clip, in
the window form the lipsync-musetalk stage takes (protos/lipline/v1/lipsync.proto, AudioWindow and
MuseTalkItems).

Upstream (`AudioProcessor.get_whisper_chunk`) encodes a clip's 30 s log-mel windows, concatenates
their hidden states (50 positions per second), cuts them to floor(seconds x 50) positions, pads
2 x ceil(50 / fps) zero positions on the left and 6 x ceil(50 / fps) on the right, and gives frame i the
10 positions starting at floor(i x 50 / fps) of the padded sequence (upstream casts fps to an integer
first; the exact rate is used here, as in `whisper_chunks`). In the clip's own positions: ``first_position(i, fps)`` .. + 10, zeros outside
0 .. floor(seconds x 50). A job sends the clip's windows (window k = seconds 30k .. 30k + 30, marked as
continuing window k - 1) and names, per frame, the window holding its first position and the offset
in it (`frame_window`); positions past the window's end read on into the next, as upstream's run on
across its windows. Pure integer arithmetic: no numpy, torch or protos.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

SAMPLE_RATE = 16000  # whisper's audio rate
POSITIONS_PER_SECOND = 50  # encoder positions (20 ms each)
WINDOW_POSITIONS = 1500  # one 30 s window
ITEM_POSITIONS = 10  # positions per frame (x 5 hidden states = 50 tokens of 384)


def clip_positions(samples: int, sample_rate: int = SAMPLE_RATE) -> int:
    """The positions that carry a clip's audio: floor(seconds x 50), as upstream cuts its features."""
    return samples * POSITIONS_PER_SECOND // sample_rate


def window_count(positions: int) -> int:
    """The 30 s windows a clip of `positions` positions needs (at least one)."""
    return max(1, math.ceil(positions / WINDOW_POSITIONS))


def window_positions(window: int, positions: int) -> int:
    """How many of window `window`'s positions carry audio in a clip of `positions` (AudioWindow.positions)."""
    return max(1, min(WINDOW_POSITIONS, positions - window * WINDOW_POSITIONS))


def first_position(frame: int, fps: float) -> int:
    """The clip position of frame `frame`'s first of its 10 positions (negative near the start: zeros).

    Upstream truncates the frame rate to an integer first; like `whisper_chunks`
    (services/lipsync/musetalk/whisper.py) the exact rate is used here, which is the same for every
    integer rate and keeps 29.97 fps from running 3 % ahead of its audio."""
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    multiplier = POSITIONS_PER_SECOND / fps  # first, as upstream, so the products round alike
    return math.floor(frame * multiplier) - 2 * math.ceil(multiplier)


def frame_window(frame: int, fps: float) -> tuple[int, int]:
    """(window, offset): the window holding frame `frame`'s first position (window 0 before the clip's
    start) and the position in it (MuseTalkItems.window_indices and .offsets)."""
    position = first_position(frame, fps)
    if position < 0:
        return 0, position
    return position // WINDOW_POSITIONS, position % WINDOW_POSITIONS


def frame_items(frame: int, fps: float, windows: int) -> tuple[int, int]:
    """`frame_window` within a clip of `windows` windows: a frame past the last window's start (its
    positions read zeros there anyway) names the last window, its offset counted from that one."""
    window, offset = frame_window(frame, fps)
    last = max(0, windows - 1)
    if window > last:
        return last, offset + (window - last) * WINDOW_POSITIONS
    return window, offset


def windows_read(frames: Iterable[int], fps: float, windows: int) -> list[int]:
    """The windows of a clip of `windows` windows that the items of `frames` read (what a segment's
    Generate stream must send): each frame's own, and the next one where its 10 positions run on
    past its own window's end."""
    needed: set[int] = set()
    for frame in frames:
        window, offset = frame_items(frame, fps, windows)
        needed.add(window)
        if offset + ITEM_POSITIONS > WINDOW_POSITIONS and window + 1 < windows:
            needed.add(window + 1)
    return sorted(needed)
