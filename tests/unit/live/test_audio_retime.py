"""Re-timing the input audio to frames (exact, integer, no drift) and the speech queue with clear()."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from services.live.audio_retime import SpeechQueue, frame_sample_range, frame_start_sample, frames_for_samples
from services.serving.errors import TooLarge

NTSC = Fraction(30000, 1001)
RATES_AND_FPS = [
    (16000, Fraction(25)),
    (24000, Fraction(30)),
    (48000, NTSC),
    (16000, NTSC),
    (24000, Fraction(24000, 1001)),
]


@pytest.mark.parametrize(("rate", "fps"), RATES_AND_FPS)
def test_frame_k_carries_the_samples_of_its_time_slot(rate: int, fps: Fraction) -> None:
    """Sample n belongs to frame k exactly when k / fps <= n / rate < (k + 1) / fps (checked in rationals)."""
    for k in [0, 1, 2, 7, 1000, 89_999, 107_891]:
        start, stop = frame_sample_range(k, rate, fps)
        assert Fraction(start, rate) >= k / fps > Fraction(start - 1, rate)
        assert Fraction(stop, rate) >= (k + 1) / fps > Fraction(stop - 1, rate)


@pytest.mark.parametrize(("rate", "fps"), RATES_AND_FPS)
def test_no_drift_over_an_hour(rate: int, fps: Fraction) -> None:
    frames = math.floor(3600 * fps)
    starts = [frame_start_sample(k, rate, fps) for k in range(frames + 1)]
    sizes = np.diff(starts)
    per_frame = Fraction(rate) / fps
    assert set(sizes.tolist()) <= {math.floor(per_frame), math.ceil(per_frame)}  # 1601 or 1602 at 48 kHz, 29.97 fps
    assert starts[-1] == math.ceil(frames * per_frame)  # an hour's worth exactly: nothing gained or lost
    assert (rate, fps) != (48000, NTSC) or starts[-1] == 172_799_828  # 107,892 frames * 1601.6 samples, rounded up


@pytest.mark.parametrize(("rate", "fps"), RATES_AND_FPS)
def test_frames_for_samples_counts_the_frames_that_start_before_the_end(rate: int, fps: Fraction) -> None:
    for n in [0, 1, 639, 640, 641, 1601, 1602, 1603, 48_000, 123_457]:
        expected = sum(1 for k in range(n + 1) if frame_start_sample(k, rate, fps) < n)
        assert frames_for_samples(n, rate, fps) == expected


def play_all(queue: SpeechQueue) -> list:
    out = []
    while (frame := queue.take()) is not None:
        out.append(frame)
    return out


def test_the_re_timed_audio_is_the_input_audio() -> None:
    """Chunks of odd sizes in, frame slices out: concatenated they are the input; the last frame is short."""
    rate, fps = 48000, NTSC
    queue = SpeechQueue(rate, fps, max_samples=10 * rate)
    audio = np.random.default_rng(0).integers(-32768, 32767, 2 * rate + 333, dtype=np.int16)
    frames, i = [], 0
    for size in [480, 4800, 17, 960, 2400] * 100:
        if i >= len(audio):
            break
        queue.push(audio[i : i + size])
        i += size
        frames += play_all(queue)
    assert queue.end_utterance() == 0
    frames += play_all(queue)
    assert [f.index for f in frames] == list(range(frames_for_samples(len(audio), rate, fps)))
    np.testing.assert_array_equal(np.concatenate([f.samples for f in frames]), audio)
    for f in frames[:-1]:
        assert len(f.samples) == np.subtract(*reversed(frame_sample_range(f.index, rate, fps)))
    assert frames[0].first and not frames[0].last and frames[-1].last and not any(f.last for f in frames[:-1])
    assert queue.empty and queue.queued_samples == 0


def test_a_frame_waits_for_all_its_samples_until_the_utterance_ends() -> None:
    queue = SpeechQueue(16000, Fraction(25), max_samples=16000)
    queue.push(np.ones(639, np.int16))
    assert queue.peek() is None and queue.take() is None  # 640 per frame: one sample short
    queue.push(np.ones(1, np.int16))
    assert queue.peek() == (0, 0)
    assert len(queue.take().samples) == 640
    queue.push(np.ones(100, np.int16))
    assert queue.take() is None
    queue.end_utterance()
    assert queue.frames_of(0) == 2
    last = queue.take()
    assert (last.index, len(last.samples), last.last) == (1, 100, True)


def test_utterances_play_in_order_with_their_own_frame_numbers() -> None:
    queue = SpeechQueue(16000, Fraction(25), max_samples=16000)
    assert queue.push(np.full(1280, 1, np.int16)) == 0
    queue.end_utterance()
    assert queue.push(np.full(700, 2, np.int16)) == 1
    queue.end_utterance()
    frames = play_all(queue)
    assert [(f.utterance, f.index, f.first, f.last) for f in frames] == [
        (0, 0, True, False),
        (0, 1, False, True),
        (1, 0, True, False),
        (1, 1, False, True),
    ]
    assert queue.end_utterance() is None  # nothing open
    queue.push(np.zeros(0, np.int16))
    assert queue.end_utterance() == 2 and queue.empty  # an empty utterance plays nothing


def test_clear_empties_the_queue_and_says_how_far_it_played() -> None:
    queue = SpeechQueue(16000, Fraction(25), max_samples=10 * 16000)
    queue.push(np.ones(16000, np.int16))  # 1 s, still open
    for _ in range(10):
        queue.take()
    queue.end_utterance()
    queue.push(np.ones(3200, np.int16))  # a second utterance behind it
    result = queue.clear()
    assert (result.utterance, result.started, result.played_samples, result.played_ms) == (0, True, 6400, 400.0)
    assert result.interrupted and result.dropped_samples == 16000 - 6400 + 3200
    assert queue.empty and queue.queued_samples == 0 and queue.take() is None
    assert queue.clear() == type(result)(None, False, 0, 0.0, False, 0)  # nothing to clear
    assert queue.push(np.ones(640, np.int16)) == 2  # the queue goes on with a new utterance


def test_clear_before_the_first_frame_played() -> None:
    queue = SpeechQueue(16000, Fraction(25), max_samples=16000)
    queue.push(np.ones(320, np.int16))
    result = queue.clear()
    assert (result.utterance, result.started, result.played_samples, result.interrupted) == (0, False, 0, True)


def test_a_client_faster_than_real_time_is_refused_at_the_bound() -> None:
    queue = SpeechQueue(16000, Fraction(25), max_samples=8000)
    queue.push(np.ones(8000, np.int16))
    with pytest.raises(TooLarge, match="send audio in real time") as refused:
        queue.push(np.ones(1, np.int16))
    # RESOURCE_EXHAUSTED with a back-off hint, as every refusal: when the queue has played enough for it
    assert refused.value.trailing_metadata() == (("retry-after-ms", "1"),)
    with pytest.raises(TooLarge) as refused:
        queue.push(np.ones(1600, np.int16))
    assert refused.value.trailing_metadata() == (("retry-after-ms", "100"),)  # 1,600 samples at 16 kHz
    assert queue.queued_samples == 8000  # the refused chunks left nothing behind
    queue.take()
    queue.push(np.ones(640, np.int16))  # playing made room
    assert queue.queued_samples == 8000
