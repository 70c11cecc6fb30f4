"""The Slaney mel filter bank in numpy: one construction for both of lipline's mels (Wav2Lip's and
Whisper's), equal to `librosa.filters.mel(..., htk=False, norm="slaney")` to the bit.

Why not call librosa at run time: its utilities are numba-compiled on first use (about 20 CPU-seconds
per process) into a cache that numba only uses where it can write. In a pod (read-only image, a fresh
/tmp) that is every start, and without a writable HOME the first call fails outright ("cannot cache
function ... no locator available"). A filter bank is a few array operations, so the services build it
here and librosa stays what the tests compare against (tests/unit/media/test_mel_filters.py).

The arithmetic is librosa's, in its order, so the float32 bank rounds the same way: the Slaney scale
(200/3 Hz per mel up to 1 kHz, logarithmic above with a step of ln(6.4)/27 per mel), `n_mels + 2`
corners evenly spaced on it from `fmin` to `fmax`, triangles over the FFT bins' centre frequencies,
each rounded to `dtype`, then scaled by 2 / (its width in Hz) for equal area.
"""

from __future__ import annotations

import numpy as np

_HZ_PER_MEL = 200.0 / 3  # the linear part
_MIN_LOG_HZ = 1000.0  # where the logarithmic part begins
_MIN_LOG_MEL = _MIN_LOG_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0  # natural-log step per mel above 1 kHz


def hz_to_mel(freqs: np.ndarray) -> np.ndarray:
    """Frequencies in Hz on the Slaney mel scale (float64)."""
    freqs = np.asarray(freqs, dtype=np.float64)
    mels = freqs / _HZ_PER_MEL
    log_region = freqs >= _MIN_LOG_HZ
    mels[log_region] = _MIN_LOG_MEL + np.log(freqs[log_region] / _MIN_LOG_HZ) / _LOG_STEP
    return mels


def mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """The inverse of `hz_to_mel` (float64)."""
    mels = np.asarray(mels, dtype=np.float64)
    freqs = _HZ_PER_MEL * mels
    log_region = mels >= _MIN_LOG_MEL
    freqs[log_region] = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mels[log_region] - _MIN_LOG_MEL))
    return freqs


def slaney_mel_filters(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float, dtype: type = np.float32
) -> np.ndarray:
    """The filter bank, shape (n_mels, 1 + n_fft // 2), as `librosa.filters.mel(sr=sample_rate,
    n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, dtype=dtype)` returns it."""
    if not 0 <= fmin < fmax <= sample_rate / 2:
        raise ValueError(f"need 0 <= fmin < fmax <= {sample_rate / 2} Hz, got fmin={fmin}, fmax={fmax}")
    bin_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    corners = mel_to_hz(np.linspace(hz_to_mel(np.array([fmin]))[0], hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    widths = np.diff(corners)
    ramps = np.subtract.outer(corners, bin_freqs)
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    bank = np.maximum(0, np.minimum(rising, falling)).astype(dtype)
    area = 2.0 / (corners[2:] - corners[:-2])
    return (bank * area[:, None]).astype(dtype)
