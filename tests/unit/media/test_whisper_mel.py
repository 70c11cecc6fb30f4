"""services/media/whisper_mel.py against transformers' WhisperFeatureExtractor (a dev dependency).

The extractor has two implementations: numpy (float64 STFT, what `__call__` runs where torch is absent)
and torch (float32 `torch.stft`, what it runs where torch is installed, so what MuseTalk ran). They
differ from each other by up to ~6e-5 on real speech: the float32 STFT's rounding in bands far below
their frame's peak. Ours is the numpy one's arithmetic; it equals it to 1e-5 (in fact ~1e-7), and the
torch path's difference is shown to be its float32 rounding: the same torch code in float64 agrees too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.whisper import feature_extraction_whisper

from services.media import whisper_mel
from services.media.audio import decode_audio
from services.media.whisper_mel import (
    SEGMENT_SAMPLES,
    log10_mel,
    mel_filters,
    normalize_log_mel,
    whisper_log_mel,
    whisper_log_mel_segments,
)
from services.serving.errors import InvalidMedia
from tests.helpers.speech_signals import SAMPLE

RATE = 16000


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    """openai/whisper-tiny's preprocessor_config.json is the class defaults (80 bins, n_fft 400, hop 160,
    30 s chunks, no dither, no normalisation); spelled out so a changed default fails here."""
    return WhisperFeatureExtractor(
        feature_size=80, sampling_rate=RATE, hop_length=160, chunk_length=30, n_fft=400, padding_value=0.0
    )


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return decode_audio(SAMPLE.read_bytes(), RATE)


def _numpy_path(extractor: WhisperFeatureExtractor, samples: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The extractor's own `__call__` (padding, cutting, dtype handling) on its numpy implementation."""
    with monkeypatch.context() as patch:
        patch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)
        return extractor(samples, sampling_rate=RATE, return_tensors="np").input_features[0]


def _torch_path(extractor: WhisperFeatureExtractor, samples: np.ndarray) -> np.ndarray:
    return extractor(samples, sampling_rate=RATE, return_tensors="np").input_features[0]


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)

    def chirp(n: int) -> np.ndarray:
        t = np.arange(n) / RATE
        return (0.3 * np.sin(2 * np.pi * 220 * t * (1 + t / 4)) + 0.03 * rng.standard_normal(n)).astype(np.float32)

    return {
        "3 s": chirp(3 * RATE + 77),
        "exactly 30 s": chirp(SEGMENT_SAMPLES),
        "31 s (cut)": chirp(SEGMENT_SAMPLES + RATE),
        "a quarter second of float64": chirp(4000).astype(np.float64),
        "250 samples": chirp(250),
        "digital silence": np.zeros(RATE, np.float32),
    }


def test_the_mel_filters_are_the_extractors(extractor: WhisperFeatureExtractor) -> None:
    ours = mel_filters()
    assert ours.shape == (201, 80)
    np.testing.assert_allclose(ours, extractor.mel_filters, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(_signals()))
def test_log_mel_equals_the_extractor(
    name: str, extractor: WhisperFeatureExtractor, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = _signals()[name]
    ours = whisper_log_mel(samples)
    assert ours.shape == (80, 3000) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, _numpy_path(extractor, samples, monkeypatch), rtol=0, atol=1e-5)
    _assert_near_the_float32_stft(ours, _torch_path(extractor, samples))


def _assert_near_the_float32_stft(ours: np.ndarray, torch_path: np.ndarray) -> None:
    """The torch path's float32 STFT rounding: a few values off by up to ~1e-4, the rest far below."""
    difference = np.abs(ours - torch_path)
    assert difference.max() < 5e-4 and difference.mean() < 1e-6, (difference.max(), difference.mean())


def test_log_mel_of_real_speech(
    extractor: WhisperFeatureExtractor, speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = whisper_log_mel(speech)
    np.testing.assert_allclose(ours, _numpy_path(extractor, speech, monkeypatch), rtol=0, atol=1e-5)
    _assert_near_the_float32_stft(ours, _torch_path(extractor, speech))


def test_the_torch_paths_difference_is_its_float32_stft(extractor: WhisperFeatureExtractor, speech: np.ndarray) -> None:
    """transformers' `_torch_extract_fbank_features`, step for step, in float64: equal to ours."""
    waveform = torch.from_numpy(whisper_mel.pad_or_cut(speech)).double()
    stft = torch.stft(waveform, 400, 160, window=torch.hann_window(400, dtype=torch.float64), return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_spec = torch.from_numpy(extractor.mel_filters).T @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = (torch.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0
    np.testing.assert_allclose(whisper_log_mel(speech), log_spec.numpy(), rtol=0, atol=1e-6)


def test_frames_can_be_computed_piece_by_piece(speech: np.ndarray) -> None:
    """center=False over a run that starts 200 samples before frame j's centre gives frames j, j+1, ...
    as the whole window's computation does: the primitive an incremental (live) computation needs."""
    signal = whisper_mel.pad_or_cut(speech)
    offline = log10_mel(signal)
    for first in (2, 137, 800):
        piece = signal[first * 160 - 200 : first * 160 - 200 + 400 + 24 * 160]
        frames = log10_mel(piece, center=False)
        assert frames.shape == (80, 25)
        np.testing.assert_allclose(frames, offline[:, first : first + 25], rtol=1e-12, atol=1e-12)
    assert log10_mel(signal[:399], center=False).shape == (80, 0)


def test_normalisation_hangs_from_the_given_ceiling() -> None:
    log_spec = np.array([[-10.0, -3.0, 1.0]])
    np.testing.assert_allclose(normalize_log_mel(log_spec), [[(-7 + 4) / 4, (-3 + 4) / 4, (1 + 4) / 4]])
    np.testing.assert_allclose(normalize_log_mel(log_spec, ceiling=-2.0), [[(-10 + 4) / 4, (-3 + 4) / 4, (1 + 4) / 4]])


def test_segments_are_upstreams_30_second_cuts() -> None:
    rng = np.random.default_rng(3)
    samples = (0.1 * rng.standard_normal(2 * SEGMENT_SAMPLES + 5 * RATE)).astype(np.float32)
    segments = whisper_log_mel_segments(samples)
    assert segments.shape == (3, 80, 3000)
    for i in range(3):
        np.testing.assert_array_equal(
            segments[i], whisper_log_mel(samples[i * SEGMENT_SAMPLES : (i + 1) * SEGMENT_SAMPLES])
        )
    # The last segment is 5 s of audio and 25 s of padding: its padded frames sit at the floor.
    assert (segments[2][:, 600:] == segments[2].min()).all() and segments[2][:, :400].max() > segments[2].min()
    assert whisper_log_mel_segments(np.zeros(0, np.float32)).shape == (0, 80, 3000)


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 100), np.float32), np.array([0.0, np.nan], np.float32), np.array([np.inf] * 500)]
)
def test_unusable_audio_is_invalid_media(bad: np.ndarray) -> None:
    with pytest.raises(InvalidMedia):
        whisper_log_mel(bad)
