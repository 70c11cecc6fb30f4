"""Synthesise encoded audio files in memory, for decode tests (unit and integration).

Tests make their own audio instead of storing binary fixtures: the bytes then always match the
FFmpeg build PyAV ships with, and any duration, rate or channel count is one call away.
"""

from __future__ import annotations

import io
import wave

import av
import numpy as np

# fmt -> (container format, encoder). The encoder must exist for writing (see `can_encode`).
FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("wav", "pcm_s16le"),
    "mp3": ("mp3", "libmp3lame"),
    "flac": ("flac", "flac"),
    "m4a": ("mp4", "aac"),
    "ogg": ("ogg", "libopus"),
}

_FRAME_SAMPLES = 1024


def can_encode(fmt: str) -> bool:
    """Whether this PyAV build has the encoder `encode_tone` needs for `fmt`."""
    try:
        av.codec.Codec(FORMATS[fmt][1], "w")
    except Exception:  # noqa: BLE001 - PyAV raises different errors for unknown codecs across versions
        return False
    return True


def tone(seconds: float, rate: int = 44100, channels: int = 2, freq: float = 440.0) -> np.ndarray:
    """A sine of amplitude 0.5, the same on every channel. Shape (channels, round(seconds * rate)), float32."""
    t = np.arange(round(seconds * rate)) / rate
    mono = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.repeat(mono[None, :], channels, axis=0)


def encode_tone(fmt: str, seconds: float, rate: int = 44100, channels: int = 2, freq: float = 440.0) -> bytes:
    """Encode a sine tone into a complete file of format `fmt` ("wav", "mp3", "flac", "m4a", "ogg").

    Returns:
        The file's bytes. Opus only runs at 48 kHz, so "ogg" ignores `rate` for the encoded stream
        (PyAV's encoder resamples the frames).
    """
    container_format, codec = FORMATS[fmt]
    samples = tone(seconds, rate, channels, freq)
    layout = {1: "mono", 2: "stereo"}[channels]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container_format) as out:
        stream = out.add_stream(codec, rate=48000 if codec == "libopus" else rate)
        stream.layout = layout
        # PyAV's encode() converts each frame to the codec's sample format and frame size, so
        # planar float frames work for every encoder above.
        for start in range(0, samples.shape[1], _FRAME_SAMPLES):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples[:, start : start + _FRAME_SAMPLES]), format="fltp", layout=layout
            )
            frame.sample_rate = rate
            frame.pts = start
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def pcm_wav(samples: np.ndarray, rate: int) -> bytes:
    """A 16-bit PCM WAV from float samples in [-1, 1] (clipped): (n,) mono or (n, channels), by the stdlib."""
    frames = samples.reshape(len(samples), -1)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(frames.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(frames, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def multichannel_wav(seconds: float, channels: int, rate: int = 16000, freq: float = 440.0) -> bytes:
    """A 16-bit PCM WAV with `channels` channels (the same tone on each), written by the stdlib.

    PyAV's encoder wants a named layout; a WAV from a multitrack recorder has any count (8 and 16
    channels once crashed the decoder), so this writes the header itself.
    """
    mono = tone(seconds, rate, 1, freq)[0]
    return pcm_wav(np.repeat(mono[:, None], channels, axis=1), rate)
