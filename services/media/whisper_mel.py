"""Whisper's log-mel features in numpy: the MuseTalk tier's audio input, torch-free.

MuseTalk feeds whisper-tiny's encoder with the numbers of Hugging Face's `WhisperFeatureExtractor`
(openai/whisper-tiny preprocessor): 16 kHz audio padded with zeros or cut to 30 s, a centred STFT
(n_fft 400, hop 160, periodic Hann window, reflect padding), the power spectrum through 80 Slaney mel
filters (0-8000 Hz, Slaney area normalisation), log10 with a 1e-10 floor, the last STFT frame dropped,
everything below the window's maximum minus 8 raised to it, then `(x + 4) / 4`: [80, 3000] per 30 s.
The audio stage (jobs) and the live worker run no torch, so this is numpy only; the tests check it
against the extractor itself (both its numpy and its torch path) to 1e-5.

The steps are split so that a live session can compute the spectral part incrementally: `log10_mel`
with `center=False` turns any run of samples into the frames whose 400-sample windows it holds (frame
j covers samples [160 j, 160 j + 400)), and `normalize_log_mel` applies the clamp and the scaling over
whatever window a caller chooses. Offline (`whisper_log_mel`) the window is the whole 30 s segment,
as upstream; a live approximation is the caller's documented choice, not this module's.
"""

from __future__ import annotations

import functools

import numpy as np

from services.media.mel_filters import slaney_mel_filters
from services.serving.errors import InvalidMedia

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 80
SEGMENT_SECONDS = 30
SEGMENT_SAMPLES = SEGMENT_SECONDS * SAMPLE_RATE  # 480,000: one encoder window
SEGMENT_FRAMES = SEGMENT_SAMPLES // HOP_LENGTH  # 3,000 log-mel frames (100 per second)
MEL_FLOOR = 1e-10  # power floor before log10
DYNAMIC_RANGE = 8.0  # log10 units kept below the window's maximum (80 dB)

__all__ = [
    "HOP_LENGTH",
    "N_FFT",
    "N_MELS",
    "SAMPLE_RATE",
    "SEGMENT_FRAMES",
    "SEGMENT_SAMPLES",
    "log10_mel",
    "mel_filters",
    "normalize_log_mel",
    "pad_or_cut",
    "whisper_log_mel",
    "whisper_log_mel_segments",
]


@functools.lru_cache(maxsize=1)
def mel_filters() -> np.ndarray:
    """The 80 Slaney mel filters over the 201 STFT bins, shape (201, 80), float64, built once.

    Triangles with corners at 82 points evenly spaced on the mel scale between 0 and 8000 Hz, each
    scaled by 2 / (its width in Hz) (`services.media.mel_filters`): the filter bank Hugging Face's
    `mel_filter_bank(201, 80, 0, 8000, 16000, norm="slaney", mel_scale="slaney")` builds for Whisper,
    to the last bits of its float64 arithmetic.
    """
    bank = slaney_mel_filters(SAMPLE_RATE, N_FFT, N_MELS, 0.0, SAMPLE_RATE / 2, np.float64).T
    bank.setflags(write=False)  # shared by every caller through the cache
    return bank


@functools.lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    """The periodic Hann window of 400 samples (float64), as `window_function(400, "hann")`."""
    window = np.hanning(N_FFT + 1)[:-1]
    window.setflags(write=False)
    return window


def _mono(samples: np.ndarray) -> np.ndarray:
    """`samples` as a finite 1-D float32 array (the extractor converts to float32 first)."""
    signal = np.asarray(samples)
    if signal.ndim != 1:
        raise InvalidMedia(f"audio must be a mono signal, got shape {signal.shape}")
    signal = signal.astype(np.float32, copy=False)
    if not np.isfinite(signal).all():
        raise InvalidMedia("audio contains NaN or infinite samples")
    return signal


def pad_or_cut(samples: np.ndarray, length: int = SEGMENT_SAMPLES) -> np.ndarray:
    """`samples` zero-padded on the right or cut to `length` (the extractor's padding to 30 s)."""
    signal = _mono(samples)
    if len(signal) >= length:
        return signal[:length]
    return np.pad(signal, (0, length - len(signal)))


def log10_mel(samples: np.ndarray, *, center: bool = True) -> np.ndarray:
    """log10 of the mel power spectrogram, shape (80, frames), float64: the spectral part alone.

    Args:
        samples: mono 16 kHz samples.
        center: True (the extractor's): the signal is reflect-padded by 200 samples at both ends and
            frame j is centred on sample 160 j, giving 1 + n // 160 frames (the last of which
            `whisper_log_mel` drops, as the extractor does). False: no padding; frame j covers
            samples [160 j, 160 j + 400), giving 1 + (n - 400) // 160 frames (none below 400
            samples), so a stream can be turned into frames piece by piece: the frames of a run of
            samples that starts 200 samples before an offline frame's centre are that frame and the
            ones after it, bit for bit, away from the reflect-padded ends.
    """
    signal = _mono(samples)
    if center:
        if len(signal) <= N_FFT // 2:
            raise InvalidMedia(f"a centred STFT needs more than {N_FFT // 2} samples, got {len(signal)}")
        signal = np.pad(signal, N_FFT // 2, mode="reflect")
    if len(signal) < N_FFT:
        return np.zeros((N_MELS, 0), dtype=np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(signal, N_FFT)[::HOP_LENGTH]
    # float64 windowing and FFT, the spectrum rounded to complex64 as the extractor stores it.
    spectrum = np.fft.rfft(frames * _hann_window(), axis=-1).astype(np.complex64)
    power = np.abs(spectrum, dtype=np.float64) ** 2
    mel = mel_filters().T @ power.T
    return np.log10(np.maximum(mel, MEL_FLOOR))


def normalize_log_mel(log_spec: np.ndarray, ceiling: float | None = None) -> np.ndarray:
    """Whisper's scaling: values below `ceiling` - 8 raised to it, then (x + 4) / 4; float32.

    Args:
        log_spec: log10 mel frames (`log10_mel`).
        ceiling: the maximum the 80 dB range hangs from; None: `log_spec`'s own maximum (offline:
            the whole 30 s window's, as upstream).
    """
    top = float(log_spec.max()) if ceiling is None else ceiling
    return ((np.maximum(log_spec, top - DYNAMIC_RANGE) + 4.0) / 4.0).astype(np.float32)


def whisper_log_mel(samples_16k: np.ndarray) -> np.ndarray:
    """The extractor's input features for one 30 s window: shape (80, 3000), float32.

    Args:
        samples_16k: mono samples at 16 kHz (any float dtype; converted to float32 first); longer
            than 30 s is cut, shorter is zero-padded, as the extractor does.

    Raises:
        InvalidMedia: not 1-D, or NaN/infinite samples.
    """
    log_spec = log10_mel(pad_or_cut(samples_16k))[:, :SEGMENT_FRAMES]
    return normalize_log_mel(log_spec)


def whisper_log_mel_segments(samples_16k: np.ndarray) -> np.ndarray:
    """Upstream's job path: the audio cut into consecutive 30 s segments, each through
    `whisper_log_mel` (each normalised by its own maximum): shape (segments, 80, 3000), float32,
    ceil(n / 480,000) segments (none for no samples). The encoder's states of the segments,
    concatenated in time, are the clip's features.
    """
    signal = _mono(samples_16k)
    starts = range(0, len(signal), SEGMENT_SAMPLES)
    out = np.empty((len(starts), N_MELS, SEGMENT_FRAMES), dtype=np.float32)
    for i, start in enumerate(starts):
        out[i] = whisper_log_mel(signal[start : start + SEGMENT_SAMPLES])
    return out
