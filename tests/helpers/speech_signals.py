"""The speech clips issue 10 measures the weight-free mouth on: the bundled sample speech three times
with 2-3 s pauses, clean, under -40 dBFS pink noise, and 20 dB quieter; and which frames hold speech.

Frame i covers samples [i * rate / fps, (i + 1) * rate / fps): the same 40 ms a mel window's first
columns cover. A speech frame is one whose clean 40 ms energy is within 30 dB of the loudest frame's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.media.audio import decode_audio

RATE = 16000
FPS = 25.0
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "speech.wav"


def pink_noise(n: int, dbfs: float, seed: int = 0) -> np.ndarray:
    """Pink (1/f power) noise with RMS at `dbfs`, by shaping white noise's spectrum."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1]
    noise = np.fft.irfft(spectrum / np.sqrt(freqs), n)
    return (noise / np.sqrt(np.mean(noise**2)) * 10 ** (dbfs / 20)).astype(np.float32)


def clean_speech() -> np.ndarray:
    """The sample speech three times, with 2 s and 3 s of digital silence between."""
    speech = decode_audio(SAMPLE.read_bytes(), RATE)
    gap2, gap3 = np.zeros(2 * RATE, np.float32), np.zeros(3 * RATE, np.float32)
    return np.concatenate([speech, gap2, speech, gap3, speech]).astype(np.float32)


def variants() -> dict[str, np.ndarray]:
    clean = clean_speech()
    return {
        "clean": clean,
        "pink -40 dBFS": clean + pink_noise(len(clean), -40.0),
        "20 dB quieter": clean * 0.1,
    }


def speech_frames(clean: np.ndarray, frames: int) -> np.ndarray:
    """(frames,) bool: the frame's clean 40 ms is within 30 dB of the loudest frame."""
    step = RATE / FPS
    energy = np.array([np.mean(clean[int(i * step) : int((i + 1) * step)] ** 2) + 1e-20 for i in range(frames)])
    db = 10 * np.log10(energy)
    return db > db.max() - 30.0


def far_from(mask: np.ndarray, distance: int) -> np.ndarray:
    """Frames at least `distance` frames from every True frame of `mask`."""
    near = np.zeros_like(mask)
    for shift in range(-distance + 1, distance):
        near |= np.roll(mask, shift) if shift else mask
    return ~near
