"""services.media.whisper_windows: upstream MuseTalk's positions per frame, in the window form."""

from __future__ import annotations

import pytest

from services.media.whisper_windows import (
    clip_positions,
    first_position,
    frame_items,
    frame_window,
    window_count,
    window_positions,
    windows_read,
)


def test_frame_i_at_25_fps_hears_positions_2i_minus_4_onwards() -> None:
    assert [first_position(i, 25) for i in (0, 1, 2, 10)] == [-4, -2, 0, 16]
    assert frame_window(0, 25) == (0, -4) and frame_window(752, 25) == (1, 0)
    assert frame_window(751, 25) == (0, 1498) and frame_window(753, 25) == (1, 2)
    assert first_position(3, 30) == 5 - 4 and first_position(3, 24) == 6 - 6  # ceil(50 / 24) = 3: 6 left


def test_a_clips_windows_and_the_positions_that_carry_audio() -> None:
    samples = int(41.3 * 16000)
    positions = clip_positions(samples)
    assert positions == 2065 and window_count(positions) == 2 and window_count(0) == 1
    assert [window_positions(k, positions) for k in range(2)] == [1500, 565]
    with pytest.raises(ValueError, match="fps must be positive"):
        first_position(1, 0)


def test_a_segment_reads_its_frames_windows_and_the_next_one_where_positions_run_on() -> None:
    windows = 3  # a 75 s clip
    assert windows_read(range(0, 50), 25.0, windows) == [0]
    # frame 747's positions are 1490..1499, frame 748's run on into window 1
    assert first_position(748, 25.0) == 1492
    assert windows_read(range(700, 748), 25.0, windows) == [0]
    assert windows_read(range(700, 749), 25.0, windows) == [0, 1]
    assert windows_read(range(1600, 1700), 25.0, windows) == [2]
    assert frame_items(1875, 25.0, windows) == (2, 746)
    # a frame past the clip's last window names the last one (its positions read zeros there)
    assert frame_items(3000, 25.0, 1) == (0, 5996)
