"""services.media.mel against numbers recorded from Wav2Lip's own audio.py / inference.py."""

from __future__ import annotations

import warnings

import librosa
import numpy as np
import pytest
from scipy import signal as sps

from services.media.mel import (
    MelExtractor,
    frame_count,
    mel_basis,
    mel_chunks,
    mel_windows,
    melspectrogram,
    stft_magnitude,
)
from services.serving.errors import InvalidMedia


def test_melspectrogram_matches_wav2lip(mel_vector):
    mel = melspectrogram(mel_vector["signal"])
    assert mel.dtype == np.float32
    assert mel.shape == mel_vector["mel"].shape == (80, 105)
    np.testing.assert_allclose(mel, mel_vector["mel"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("length", [1, 2, 399, 400, 401, 799, 800, 801, 1400, 1401, 3599, 16000, 48123])
def test_stft_magnitude_is_librosa_to_the_bit(length: int) -> None:
    """The written-out STFT against the librosa call it replaces: same values, shape and layout, so the
    mel basis product (and every mel after it) is unchanged. Short signals take librosa's whole-pad
    branch, long ones its split head and tail."""
    rng = np.random.default_rng(length)
    emphasized = sps.lfilter([1.0, -0.97], [1.0], rng.standard_normal(length) * rng.uniform(0.01, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # librosa warns that n_fft is larger than a short signal
        stft = librosa.stft(
            emphasized,
            n_fft=800,
            hop_length=200,
            win_length=800,
            window="hann",
            center=True,
            pad_mode="reflect",
            dtype=np.complex64,
        )
    expected, magnitude = np.abs(stft), stft_magnitude(emphasized)
    assert magnitude.dtype == np.float32 and magnitude.flags.f_contiguous == expected.flags.f_contiguous
    np.testing.assert_array_equal(magnitude, expected)
    np.testing.assert_array_equal(mel_basis() @ magnitude, mel_basis() @ expected)


def test_mel_basis_matches_wav2lip(mel_vector):
    basis = mel_basis()
    assert basis.dtype == np.float32 and basis.shape == (80, 401)
    np.testing.assert_array_equal(basis, mel_vector["mel_basis"])
    assert mel_basis() is basis  # built once


def test_reflect_padding_not_librosa_defaults(mel_vector):
    """The trap: librosa >= 0.10 zero-pads by default, which changes the edge frames."""
    mel = melspectrogram(mel_vector["signal"]).astype(np.float64)
    modern = mel_vector["mel_modern_librosa_defaults"]
    assert not np.allclose(mel, modern, atol=1e-3)
    # Only the tail edge differs for this signal (its head is silence, so both paddings agree there).
    np.testing.assert_allclose(mel[:, :-2], modern[:, :-2], rtol=0, atol=1e-5)
    assert np.abs(mel[:, -2:] - modern[:, -2:]).max() > 0.1


def test_silence_is_minus_four():
    mel = melspectrogram(np.zeros(16000, dtype=np.float32))
    assert mel.shape == (80, 81)
    assert np.all(mel == -4.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_signal_raises(bad):
    signal = np.zeros(4000, dtype=np.float32)
    signal[100] = bad
    with pytest.raises(InvalidMedia, match="NaN or infinite"):
        melspectrogram(signal)


def test_empty_signal_raises():
    with pytest.raises(InvalidMedia):
        melspectrogram(np.zeros(0, dtype=np.float32))


def test_mel_chunks_match_wav2lip_exactly(mel_vector):
    mel = mel_vector["mel"]
    chunks = mel_chunks(mel, float(mel_vector["fps"]))
    assert chunks.dtype == np.float32
    np.testing.assert_array_equal(chunks, mel_vector["mel_chunks"])
    starts = mel_vector["mel_chunk_starts"]
    assert len(chunks) == len(starts) == 30
    for chunk, start in zip(chunks, starts):
        np.testing.assert_array_equal(chunk, mel[:, start : start + 16])
    # The tail chunk is the last 16 columns (here it repeats the previous regular chunk).
    assert mel_vector["mel_chunk_is_tail"][-1] and not mel_vector["mel_chunk_is_tail"][:-1].any()
    np.testing.assert_array_equal(chunks[-1], mel[:, -16:])
    assert starts[-1] == starts[-2] == 89


def test_mel_chunks_from_our_mel(mel_vector):
    chunks = mel_chunks(melspectrogram(mel_vector["signal"]), 25.0)
    np.testing.assert_allclose(chunks, mel_vector["mel_chunks"], rtol=0, atol=1e-5)


def test_mel_chunks_too_short():
    with pytest.raises(InvalidMedia, match="audio too short"):
        mel_chunks(np.zeros((80, 15), dtype=np.float32), 25.0)
    assert mel_chunks(np.zeros((80, 16), dtype=np.float32), 25.0).shape == (2, 80, 16)


def test_mel_windows_agree_with_mel_chunks(mel_vector):
    mel, fps = mel_vector["mel"], float(mel_vector["fps"])
    chunks = mel_chunks(mel, fps)
    windows = mel_windows(mel, fps, len(chunks))
    np.testing.assert_array_equal(windows[:-1], chunks[:-1])
    np.testing.assert_array_equal(windows[-1], mel[:, mel.shape[1] - 16 :])
    np.testing.assert_array_equal(windows, chunks)  # so in fact they agree entirely


@pytest.mark.parametrize("fps", [25.0, 30.0, 29.97, 24.0, 60.0])
def test_mel_windows_clamp_past_the_end(mel_vector, fps):
    mel = mel_vector["mel"]
    total = mel.shape[1]
    windows = mel_windows(mel, fps, 100)
    assert windows.shape == (100, 80, 16) and windows.dtype == np.float32
    for i, window in enumerate(windows):
        start = min(int(i * (80.0 / fps)), total - 16)
        np.testing.assert_array_equal(window, mel[:, start : start + 16])
    np.testing.assert_array_equal(windows[-1], mel[:, -16:])


def test_mel_windows_pad_short_mel_with_silence():
    mel = np.linspace(-1, 1, 80 * 5, dtype=np.float32).reshape(80, 5)
    windows = mel_windows(mel, 25.0, 3)
    assert windows.shape == (3, 80, 16)
    for window in windows:  # every window clamps to start 0 of the padded mel
        np.testing.assert_array_equal(window[:, :5], mel)
        assert np.all(window[:, 5:] == -4.0)


def test_mel_windows_zero_frames(mel_vector):
    assert mel_windows(mel_vector["mel"], 25.0, 0).shape == (0, 80, 16)


@pytest.mark.parametrize(
    ("num_samples", "sample_rate", "fps", "expected"),
    [
        (16000, 16000, 25.0, 25),
        (48000, 16000, 30.0, 90),
        (16000 * 2 + 100, 16000, 25.0, 50),  # 2.00625 s -> 50.16 frames
        (16000 * 2 + 400, 16000, 25.0, 51),  # 2.025 s -> 50.625 frames
        (160000, 16000, 29.97, 300),  # 299.7 frames
        (1, 16000, 25.0, 1),  # never zero frames
        (0, 16000, 25.0, 1),
    ],
)
def test_frame_count(num_samples, sample_rate, fps, expected):
    n = frame_count(num_samples, sample_rate, fps)
    assert n == expected
    if num_samples / sample_rate * fps >= 0.5:
        assert abs(n / fps - num_samples / sample_rate) <= 0.5 / fps


def test_mel_extractor_run(mel_vector):
    signal = mel_vector["signal"]
    windows = MelExtractor().run(signal, 25.0)
    n = frame_count(len(signal), 16000, 25.0)
    assert windows.shape == (n, 80, 16) and windows.dtype == np.float32
    np.testing.assert_array_equal(windows, mel_windows(melspectrogram(signal), 25.0, n))
    # First 30 frames are Wav2Lip's chunks; the extra frames repeat its tail.
    np.testing.assert_allclose(windows[:30], mel_vector["mel_chunks"], rtol=0, atol=1e-5)


def test_mel_extractor_short_audio():
    windows = MelExtractor().run(np.zeros(800, dtype=np.float32), 25.0)  # 0.05 s -> 1 frame, 5 columns
    assert windows.shape == (1, 80, 16)
    assert np.all(windows == -4.0)
