"""The Slaney mel filter bank (services/media/mel_filters.py) against librosa, its reference, and the
mels' import chains, which must not load librosa (it stays a test tool)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import librosa
import numpy as np
import pytest

from services.media.mel_filters import hz_to_mel, mel_to_hz, slaney_mel_filters

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("sample_rate", "n_fft", "n_mels", "fmin", "fmax"),
    [
        (16000, 800, 80, 55, 7600),  # Wav2Lip's
        (16000, 400, 80, 0, 8000),  # Whisper's
        (22050, 2048, 128, 0, 11025),
        (44100, 1024, 40, 20, 16000),
        (8000, 256, 20, 300, 3400),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_bank_is_librosas_to_the_bit(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float, dtype: type
) -> None:
    expected = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, dtype=dtype)
    ours = slaney_mel_filters(sample_rate, n_fft, n_mels, fmin, fmax, dtype)
    assert ours.dtype == expected.dtype and ours.shape == expected.shape == (n_mels, 1 + n_fft // 2)
    np.testing.assert_array_equal(ours, expected)


def test_the_scale_is_librosas_slaney_scale_both_ways() -> None:
    freqs = np.concatenate([np.linspace(0.0, 999.0, 50), [1000.0], np.geomspace(1000.5, 24000.0, 50)])
    np.testing.assert_array_equal(hz_to_mel(freqs), librosa.hz_to_mel(freqs, htk=False))
    mels = hz_to_mel(freqs)
    np.testing.assert_array_equal(mel_to_hz(mels), librosa.mel_to_hz(mels, htk=False))
    np.testing.assert_allclose(mel_to_hz(mels), freqs, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize(("fmin", "fmax"), [(-1.0, 4000.0), (4000.0, 4000.0), (0.0, 8000.5)])
def test_a_band_outside_0_to_nyquist_is_refused(fmin: float, fmax: float) -> None:
    with pytest.raises(ValueError, match="fmin"):
        slaney_mel_filters(16000, 400, 80, fmin, fmax)


def test_the_mels_of_jobs_and_live_sessions_load_no_librosa() -> None:
    """What the audio stage's decoder and the live worker run, in a fresh interpreter: neither librosa
    nor numba may be loaded by it (their numba compile would run in every new pod)."""
    code = (
        "import sys, numpy as np\n"
        "from services.audio.extract import _warm\n"
        "from services.live.mel_stream import MelStream\n"
        "_warm()\n"
        "mel = MelStream(48000, 25.0)\n"
        "mel.push(np.zeros(24000))\n"
        "mel.finish()\n"
        "print(sorted(m for m in ('librosa', 'numba', 'sklearn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
