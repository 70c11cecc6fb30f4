"""Speech audio as a live session takes it: PCM s16le mono at the session's rate, in chunks of 20-40 ms.

A voice agent's TTS hands over audio in pieces of any length (a few ms to seconds) and at its own rate
(8-48 kHz). `PcmChunker` cuts the stream into whole chunks of `chunk_ms` as the audio comes (a
shorter rest waits for the next piece) and, at the end of an utterance, sends the rest padded with
silence to the 10 ms a chunk needs at least (so an utterance's re-timed audio is its input, then at
most 10 ms of silence). `StreamResampler` converts another rate to the session's with python-soxr
(a streaming resampler: its filter state carries over between pieces, so the pieces join without
clicks); it is imported only when the rates differ, so a TTS at 16, 24 or 48 kHz needs no numpy.
"""

from __future__ import annotations

from typing import Any

#: the rates a live session takes (session.proto's AudioFormat)
SESSION_RATES = (16000, 24000, 48000)
MIN_CHUNK_MS = 10  # the worker refuses a chunk under 10 ms (or over 100 ms)


def session_rate(rate: int) -> int:
    """The session rate for audio at `rate`: the same where a session takes it (no resampling), else
    the lowest supported rate above it (no speech band lost), else the highest."""
    if rate <= 0:
        raise ValueError(f"a sample rate is a positive number of Hz, got {rate}")
    return next((r for r in SESSION_RATES if r >= rate), SESSION_RATES[-1])


def to_mono(pcm: bytes, channels: int) -> bytes:
    """Interleaved s16le of `channels` channels, averaged to one (a live session is mono)."""
    if channels == 1:
        return pcm
    import numpy as np

    samples = np.frombuffer(pcm, dtype="<i2")
    samples = samples[: len(samples) // channels * channels].reshape(-1, channels)
    return samples.mean(axis=1).round().astype("<i2").tobytes()


class PcmChunker:
    """Cuts PCM s16le mono at `rate` into chunks of `chunk_ms` (20-40 ms; see the module's doc)."""

    def __init__(self, rate: int, chunk_ms: int = 20) -> None:
        if not 20 <= chunk_ms <= 40:
            raise ValueError(f"chunk_ms is 20-40 ms, got {chunk_ms}")
        self.rate = rate
        self.chunk_bytes = rate * chunk_ms // 1000 * 2
        self.min_bytes = rate * MIN_CHUNK_MS // 1000 * 2
        self._rest = bytearray()

    def feed(self, pcm: bytes) -> list[bytes]:
        """The whole chunks `pcm` completes (an odd trailing byte waits, as a part of a sample)."""
        self._rest += pcm
        step = self.chunk_bytes
        whole = len(self._rest) // step * step
        chunks = [bytes(self._rest[i : i + step]) for i in range(0, whole, step)]
        del self._rest[:whole]
        return chunks

    def flush(self) -> bytes | None:
        """The rest at an utterance's end, padded with silence to at least 10 ms (None when empty)."""
        rest = bytes(self._rest[: len(self._rest) // 2 * 2])
        self._rest.clear()
        if not rest:
            return None
        return rest + bytes(max(0, self.min_bytes - len(rest)))

    def reset(self) -> None:
        self._rest.clear()

    @property
    def pending_bytes(self) -> int:
        return len(self._rest)


class StreamResampler:
    """PCM s16le mono from `source` Hz to `target` Hz, piece by piece (python-soxr's ResampleStream).

    The filter holds back a few ms of output until more input comes; `flush()` at an utterance's end
    gives the rest and starts a fresh stream for the next utterance.
    """

    def __init__(self, source: int, target: int) -> None:
        import soxr  # the `agents` extra: only a TTS at a rate a session does not take needs it

        self.source, self.target = source, target
        self._soxr: Any = soxr
        self._stream = self._new()

    def _new(self) -> Any:
        return self._soxr.ResampleStream(self.source, self.target, 1, dtype="int16")

    def resample(self, pcm: bytes) -> bytes:
        import numpy as np

        samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2")
        return self._stream.resample_chunk(samples, last=False).astype("<i2").tobytes()

    def flush(self) -> bytes:
        import numpy as np

        tail = self._stream.resample_chunk(np.zeros(0, dtype="<i2"), last=True).astype("<i2").tobytes()
        self._stream = self._new()
        return tail

    def reset(self) -> None:
        self._stream = self._new()
