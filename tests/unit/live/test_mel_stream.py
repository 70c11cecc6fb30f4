"""MelStream: speech in chunks gives the whole-clip mel windows (services.media.mel), frame by frame,
as soon as each frame's audio exists."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.signal import resample_poly

from services.live.mel_stream import (
    LOOKAHEAD_MS,
    LOOKAHEAD_SAMPLES,
    MelStream,
    lookahead_ms,
    pcm_samples,
    samples_needed,
)
from services.media.mel import frame_count, mel_windows, melspectrogram
from services.serving.errors import InvalidMedia

TOLERANCE = 1e-5  # the brief: the same windows as the whole clip to 1e-5 absolute


def whole_clip_windows(pcm: np.ndarray, rate: int, fps: float) -> np.ndarray:
    """The reference: the concatenated audio resampled to 16 kHz at once, then the job path's mel."""
    signal = pcm.astype(np.float64) / 32768.0
    if rate != 16000:
        g = math.gcd(rate, 16000)
        signal = resample_poly(signal, 16000 // g, rate // g)
    return mel_windows(melspectrogram(signal), fps, frame_count(len(signal), 16000, fps))


def stream(pcm: np.ndarray, rate: int, fps: float, chunk_ms: list[int]) -> tuple[np.ndarray, int]:
    """(every window, how many came out before finish), sent in chunks of the given lengths (cycled)."""
    mel = MelStream(rate, fps)
    windows, i, k = [], 0, 0
    while i < len(pcm):
        n = rate * chunk_ms[k % len(chunk_ms)] // 1000
        got = mel.push_pcm(pcm[i : i + n].tobytes())
        assert got.first == sum(len(w) for w in windows)  # in order, none skipped or repeated
        windows.append(got.windows)
        i, k = i + n, k + 1
    before_finish = sum(len(w) for w in windows)
    last = mel.finish()
    assert last.first == before_finish
    windows.append(last.windows)
    return np.concatenate(windows), before_finish


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunk_ms=st.lists(st.integers(10, 100), min_size=1, max_size=30), fps=st.sampled_from([25.0, 30.0, 30000 / 1001])
)
@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_streamed_windows_equal_the_whole_clip_mel(speech_pcm, rate: int, chunk_ms: list[int], fps: float) -> None:
    pcm = speech_pcm[rate]
    expected = whole_clip_windows(pcm, rate, fps)
    got, before_finish = stream(pcm, rate, fps, chunk_ms)
    assert got.shape == expected.shape and got.dtype == np.float32
    # Frames that came out while speech was still arriving: exact, as the brief asks.
    np.testing.assert_allclose(got[:before_finish], expected[:before_finish], rtol=0, atol=TOLERANCE)
    # The rest came out at finish; they see the clip's end as the whole clip does (within the last
    # 200 ms the brief allows a difference; this stream has none).
    assert (len(expected) - before_finish) / fps < LOOKAHEAD_MS / 1000 + 2 / fps
    np.testing.assert_allclose(got[before_finish:], expected[before_finish:], rtol=0, atol=TOLERANCE)
    assert np.abs(got).max() > 1.0  # speech, not silence: the comparison means something


def test_look_ahead_is_212_5_ms_after_the_frame_start() -> None:
    """The number: the last of 16 columns, 15 hops past the first, reaches half an 800-sample FFT past its centre."""
    assert LOOKAHEAD_SAMPLES == 15 * 200 + 400 == 3400
    assert LOOKAHEAD_MS == 212.5
    assert lookahead_ms(16000) == 212.5
    assert lookahead_ms(48000) == pytest.approx(212.5 + 33 / 48) and lookahead_ms(24000) == pytest.approx(
        212.5 + 17 / 24
    )
    # At 25 fps, every 5th frame starts on a hop and waits the whole look-ahead; none waits longer.
    waits = [samples_needed(k, 25.0) - k * 640 for k in range(1, 200)]
    assert max(waits) == LOOKAHEAD_SAMPLES and waits[4] == LOOKAHEAD_SAMPLES


@pytest.mark.parametrize("fps", [25.0, 30.0])
def test_a_frame_comes_out_exactly_when_its_look_ahead_has_arrived(speech_pcm, fps: float) -> None:
    """One sample short of `samples_needed(k)`: frame k is not out; with it: out, and already the whole clip's window."""
    pcm = speech_pcm[16000]
    expected = whole_clip_windows(pcm, 16000, fps)
    mel = MelStream(16000, fps)
    pushed = 0
    for k in range(0, 40):
        need = samples_needed(k, fps)
        got = mel.push_pcm(pcm[pushed : need - 1].tobytes())
        pushed = need - 1
        assert got.first + len(got.windows) == k, f"frame {k} needs {need} samples; it came out with {pushed}"
        got = mel.push_pcm(pcm[pushed:need].tobytes())
        pushed = need
        assert (got.first, len(got.windows)) == (k, 1)
        np.testing.assert_allclose(got.windows[0], expected[k], rtol=0, atol=TOLERANCE)
        assert need <= math.ceil(k * 16000 / fps) + LOOKAHEAD_SAMPLES


@pytest.mark.filterwarnings("ignore:n_fft=800 is too large")  # librosa's, on the whole clip and the stream alike
@pytest.mark.parametrize("seconds", [0.01, 0.05, 0.1, 0.19])
def test_an_utterance_shorter_than_a_window_is_padded_like_the_whole_clip(speech_pcm, seconds: float) -> None:
    pcm = speech_pcm[16000][8000 : 8000 + int(16000 * seconds)]
    got, before_finish = stream(pcm, 16000, 25.0, [10])
    assert before_finish == 0
    np.testing.assert_allclose(got, whole_clip_windows(pcm, 16000, 25.0), rtol=0, atol=TOLERANCE)


def test_finish_can_be_asked_for_the_sessions_frame_count(speech_pcm) -> None:
    pcm = speech_pcm[16000][:32000]  # 2 s: 50 frames at 25 fps by the whole-clip rule
    mel = MelStream(16000, 25.0)
    streamed = len(mel.push_pcm(pcm.tobytes()).windows)
    tail = mel.finish(n_frames=52)  # the session's re-timing may give frames the whole-clip rule rounds off
    assert tail.first == streamed and streamed + len(tail.windows) == 52
    expected = mel_windows(melspectrogram(pcm / 32768.0), 25.0, 52)
    np.testing.assert_allclose(tail.windows, expected[streamed:], rtol=0, atol=TOLERANCE)


def test_memory_stays_bounded_over_a_long_utterance() -> None:
    """An hour-long stream keeps only what the next frames need (checked on the buffers themselves)."""
    mel = MelStream(48000, 25.0)
    rng = np.random.default_rng(0)
    chunk = (rng.uniform(-0.3, 0.3, 960) * 32768).astype("<i2").tobytes()  # 20 ms
    frames = 0
    for _ in range(3000):  # 60 s
        frames += len(mel.push_pcm(chunk).windows)
        assert mel._signal.size <= 3200 and mel._columns.shape[1] <= 16  # the bound is the behaviour
    assert frames == samples_needed_frames(60 * 16000, 25.0)


def samples_needed_frames(samples_16k: int, fps: float) -> int:
    """Frames whose look-ahead fits in the given audio."""
    k = 0
    while samples_needed(k, fps) <= samples_16k:
        k += 1
    return k


def test_bad_input_is_refused_with_a_message() -> None:
    with pytest.raises(InvalidMedia, match="even byte count"):
        pcm_samples(b"\x00\x01\x02")
    with pytest.raises(InvalidMedia, match="16000, 24000, 48000"):
        MelStream(44100, 25.0)
    mel = MelStream(16000, 25.0)
    mel.finish()
    with pytest.raises(RuntimeError):
        mel.push(np.zeros(10))
