"""The bundled speech at the live sessions' input rates, as s16le PCM (what a client sends)."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import resample_poly

SPEECH = Path(__file__).resolve().parents[3] / "samples" / "speech.wav"


@pytest.fixture(scope="session")
def speech_pcm() -> dict[int, np.ndarray]:
    """rate -> int16 samples of samples/speech.wav (22.05 kHz) resampled to 16, 24 and 48 kHz."""
    with wave.open(str(SPEECH)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        source_rate = wav.getframerate()
        source = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float64)
    out = {}
    for rate in (16000, 24000, 48000):
        g = math.gcd(rate, source_rate)
        out[rate] = np.round(resample_poly(source, rate // g, source_rate // g)).clip(-32768, 32767).astype("<i2")
    return out
