"""services.media.musetalk_wire: the musetalk tier's messages packed and unpacked, every size checked."""

from __future__ import annotations

import numpy as np
import pytest

from lipline.v1 import lipsync_pb2
from services.media.musetalk_wire import (
    clip_windows,
    pack_items,
    pack_latents,
    pack_window,
    unpack_items,
    unpack_latents,
    unpack_window,
)
from services.media.whisper_mel import whisper_log_mel_segments
from services.serving.errors import InvalidMedia


def test_latents_round_trip_as_float16_and_bad_ones_are_named() -> None:
    latents = np.random.default_rng(0).normal(size=(3, 8, 32, 32)).astype(np.float32)
    indices, back = unpack_latents(pack_latents([4, 5, 9], latents))
    assert indices.tolist() == [4, 5, 9] and back.dtype == np.float16
    np.testing.assert_array_equal(back, latents.astype(np.float16))
    latents[1, 0, 0, 0] = np.nan
    with pytest.raises(InvalidMedia, match="latent 5 holds NaN"):
        unpack_latents(pack_latents([4, 5, 9], latents))
    with pytest.raises(ValueError):
        pack_latents([1], np.zeros((1, 4, 32, 32)))


def test_a_window_pads_the_columns_not_sent_and_is_checked() -> None:
    mel = np.random.default_rng(1).uniform(-1, 1, (80, 120)).astype(np.float32)
    window = unpack_window(pack_window(3, mel, -0.7, positions=60, continues=True))
    assert (window.index, window.positions, window.continues) == (3, 60, True)
    full = window.full_columns()
    assert full.shape == (80, 3000) and (full[:, 120:] == np.float32(-0.7)).all()
    np.testing.assert_array_equal(full[:, :120], mel.astype(np.float16).astype(np.float32))
    bad = lipsync_pb2.AudioWindow(window_index=2, columns=10, positions=0, log_mel=b"\0" * 1600)
    with pytest.raises(InvalidMedia, match="audio window 2: positions is 0; it must be in 1..1500"):
        unpack_window(bad)


def test_items_are_parallel_arrays_with_offsets_in_range() -> None:
    frames, latents, windows, offsets = unpack_items(pack_items([1, 2], [0, 0], [0, 1], [-4, 2998]))
    assert offsets.tolist() == [-4, 2998] and windows.tolist() == [0, 1]
    with pytest.raises(InvalidMedia, match="the offset of frame 2 is -3001"):
        unpack_items(pack_items([1, 2], [0, 0], [0, 0], [0, -3001]))


def test_a_clips_windows_leave_out_only_their_constant_tail_and_carry_upstreams_positions() -> None:
    rng = np.random.default_rng(3)
    samples = 35 * 16000 + 123  # two windows: the second 5 s of audio, then the extractor's padding
    log_mel = whisper_log_mel_segments(rng.normal(0, 0.1, samples).astype(np.float32)).astype(np.float16)
    first, second = clip_windows(log_mel, samples)
    assert (first.window_index, first.continues, first.positions, first.columns) == (0, False, 1500, 3000)
    assert (second.window_index, second.continues, second.positions) == (1, True, samples * 50 // 16000 - 1500)
    assert 500 < second.columns < 520  # 5 s of audio and the frames its last samples reach
    for window, expected in zip((first, second), log_mel):
        # what the stage fills back is what would have been sent, to the bit
        assert np.array_equal(unpack_window(window).full_columns(), expected.astype(np.float32))


def test_silence_is_one_column_and_its_pad_value() -> None:
    (window,) = clip_windows(whisper_log_mel_segments(np.zeros(16000, np.float32)).astype(np.float16), 16000)
    assert window.columns == 1 and window.pad_value == -1.5  # log10(1e-10) = -10: (-10 + 4) / 4
    assert window.positions == 50
